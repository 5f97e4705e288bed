import assert from "node:assert/strict";
import { createHash } from "node:crypto";
import { Code } from "../errors.ts";
import { chainTo, parseManifest, parseVolumeRecord } from "../store/chain.ts";
import { manifestsPrefix, type SnapshotManifest, volumeRecordKey } from "../store/layout.ts";
import { StoreError } from "../store/store.ts";
import { assertRejectsCsi } from "../../tests/support/assert_errors.ts";
import {
  FakeStreamRunner,
  joinChunks,
  patternChunks,
} from "../../tests/support/fake_stream_runner.ts";
import { sendToStore, type SendToStoreSpec } from "./send.ts";
import { PLAIN_FORM } from "../zfs/stream_form.ts";
import { releaseStored } from "./records.ts";
import {
  type BackupHarness,
  backupHarness,
  PARENT,
  T0,
  UID_PROPERTY,
} from "../../tests/support/backup_harness.ts";
import {
  BACKUP_INTERVAL_PROPERTY,
  BACKUP_KEEP_PROPERTY,
  BACKUP_LAST_PROPERTY,
  type BackupOutcome,
  backupSnapshot,
  backupVolume,
  type PruneGuard,
} from "./backup.ts";

const HOUR = 3_600_000;
const RECORD = {
  format: 1,
  name: "pg",
  uid: "0".repeat(32),
  createdAt: "2024-01-01T00:00:00.000Z",
  capacityBytes: 0,
  parameters: {},
  node: "node-9",
};
const decoder = new TextDecoder();

/** Every manifest of volume `key` in the store, oldest guid first. */
function manifests(h: BackupHarness, key = "pg"): SnapshotManifest[] {
  return h.store.keys().filter((k) => k.startsWith(manifestsPrefix(key)))
    .map((k) => parseManifest(h.store.peek(k)!));
}

function stored(outcome: BackupOutcome) {
  assert.equal(outcome.status, "stored");
  return outcome as Extract<BackupOutcome, { status: "stored" }>;
}

/** Snapshot components of `dataset`, in name order. */
function snapshotsOf(h: BackupHarness, dataset: string): string[] {
  return h.pool.names().filter((n) => n.startsWith(`${dataset}@`))
    .map((n) => n.slice(dataset.length + 1));
}

Deno.test("backupVolume stores a full stream first, records the volume, sets backup-last", async () => {
  const h = backupHarness();
  const ds = h.volume("pg", {
    [BACKUP_INTERVAL_PROPERTY]: "900",
    [BACKUP_KEEP_PROPERTY]: "last=4,daily=7",
    "org.zfs-csi:parameters": '{"compression":"lz4"}',
  });
  // The uid goes on the dataset before the record is written (see storeUid).
  const order: string[] = [];
  h.pool.hook = (argv) => {
    if (argv[1] === "set" && argv[2]!.startsWith(UID_PROPERTY)) {
      order.push(`uid set; record ${h.store.keys().length > 0 ? "written" : "absent"}`);
    }
    return undefined;
  };
  const out = stored(await backupVolume(h.deps, ds));
  assert.deepEqual(order, ["uid set; record absent"]);
  const uid = h.pool.value(ds, UID_PROPERTY)!;
  assert.match(uid, /^[0-9a-f]{32}$/);
  const record = parseVolumeRecord(h.store.peek(volumeRecordKey("pg"))!);
  assert.equal(record.uid, uid);
  assert.equal(record.name, "pg");
  assert.equal(record.node, "node-1");
  assert.equal(record.capacityBytes, 1 << 30);
  assert.deepEqual(record.parameters, { compression: "lz4" });
  assert.deepEqual(record.schedule, {
    intervalSeconds: 900,
    keep: { last: 4, hourly: 0, daily: 7, weekly: 0 },
  });
  const [m] = manifests(h);
  assert.deepEqual(out.manifest, m);
  assert.equal(m!.baseGuid, null);
  assert.equal(m!.kind, "scheduled");
  assert.equal(m!.volumeUid, uid);
  // Named by its second and its sequence number, the first of the volume.
  assert.equal(m!.snapshot, `.backup-${T0 / 1000}-1`);
  assert.equal(m!.sequence, 1);
  assert.equal(m!.guid, h.pool.value(`${ds}@.backup-${T0 / 1000}-1`, "guid"));
  assert.equal(m!.createdAt, new Date(T0).toISOString());
  assert.equal(decoder.decode(h.store.peek(m!.stream)), `full > ${ds}@.backup-${T0 / 1000}-1`);
  assert.equal(h.sends[0]?.base, undefined);
  assert.equal(h.pool.value(ds, BACKUP_LAST_PROPERTY), String(T0 / 1000));
  h.runner.assertNoUnexpected();
});

Deno.test("backupVolume sends incrementally from the last stored backup, then destroys it", async () => {
  const h = backupHarness();
  const ds = h.volume("pg");
  const first = stored(await backupVolume(h.deps, ds));
  h.clock.ms += HOUR;
  const second = stored(await backupVolume(h.deps, ds));
  assert.equal(second.manifest.baseGuid, first.manifest.guid);
  assert.equal(second.manifest.sequence, 2);
  assert.equal(h.sends[1]?.base, `${ds}@.backup-${T0 / 1000}-1`);
  assert.deepEqual(second.destroyed, [`${ds}@.backup-${T0 / 1000}-1`]);
  assert.deepEqual(snapshotsOf(h, ds), [`.backup-${(T0 + HOUR) / 1000}-2`]);
  // No keep policy: nothing pruned from the store.
  assert.equal(manifests(h).length, 2);
  h.runner.assertNoUnexpected();
});

Deno.test("backupVolume bases on a newer CSI snapshot the store holds, not on one it lacks", async () => {
  const h = backupHarness();
  const ds = h.volume("pg");
  await backupVolume(h.deps, ds);
  h.clock.ms += HOUR;
  const csi = h.snapshot(ds, "nightly");
  const requested = stored(
    await backupSnapshot(h.deps, { dataset: ds, snapshot: csi, csiName: "nightly" }),
  );
  assert.equal(requested.manifest.kind, "requested");
  assert.equal(requested.manifest.csiName, "nightly");
  assert.equal(requested.manifest.sequence, 2);
  assert.equal(h.sends[1]?.base, `${ds}@.backup-${T0 / 1000}-1`);
  // Newer still, but not in the store: never a base. Neither are hidden snapshots of others.
  h.snapshot(ds, "not-stored");
  h.snapshot(ds, ".clone-0123456789abcdef-1");
  h.clock.ms += HOUR;
  const next = stored(await backupVolume(h.deps, ds));
  assert.equal(h.sends[2]?.base, csi);
  assert.equal(next.manifest.baseGuid, requested.manifest.guid);
  // The user's snapshots stay; the older backup snapshot goes.
  assert.deepEqual(snapshotsOf(h, ds), [
    `.backup-${(T0 + 2 * HOUR) / 1000}-3`,
    ".clone-0123456789abcdef-1",
    "nightly",
    "not-stored",
  ]);
});

Deno.test("backupSnapshot of a snapshot already stored sends nothing", async () => {
  const h = backupHarness();
  const ds = h.volume("pg");
  const csi = h.snapshot(ds, "nightly");
  const first = stored(await backupSnapshot(h.deps, { dataset: ds, snapshot: csi, csiName: "n" }));
  const again = stored(await backupSnapshot(h.deps, { dataset: ds, snapshot: csi, csiName: "n" }));
  assert.equal(again.sent, false);
  assert.deepEqual(again.manifest, first.manifest);
  assert.equal(h.sends.length, 1);
  await assertRejectsCsi(
    backupSnapshot(h.deps, { dataset: ds, snapshot: `${ds}@gone`, csiName: "gone" }),
    Code.NOT_FOUND,
    /gone/,
  );
});

Deno.test("backupVolume starts a new full stream when the chain is long or old", async () => {
  const h = backupHarness({ maxChainLength: 3, maxChainAgeMs: 10 * HOUR });
  const ds = h.volume("pg");
  const bases: (string | undefined)[] = [];
  for (let i = 0; i < 5; i++) {
    stored(await backupVolume(h.deps, ds));
    bases.push(h.sends.at(-1)!.base?.replace(/.*@\.backup-/, ""));
    h.clock.ms += HOUR;
  }
  const s = (hours: number) => `${(T0 + hours * HOUR) / 1000}-${hours + 1}`;
  assert.deepEqual(bases, [undefined, s(0), s(1), undefined, s(3)]);
  // Old: a full stream again once the chain's full stream is 10 hours old.
  h.clock.ms += 10 * HOUR;
  await backupVolume(h.deps, ds);
  assert.equal(h.sends.at(-1)!.base, undefined);
});

Deno.test("backupVolume refuses a store record of another uid, before taking a snapshot", async () => {
  const h = backupHarness();
  const ds = h.volume("pg");
  // Another volume once wrote under this name.
  const record = { ...RECORD, uid: "f".repeat(32), deletedAt: "2024-01-01T00:00:00.000Z" };
  h.store.poke(volumeRecordKey("pg"), new TextEncoder().encode(JSON.stringify(record)));
  const sends = h.sends.length;
  await assertRejectsCsi(
    backupVolume(h.deps, ds),
    Code.FAILED_PRECONDITION,
    /belongs to another volume of this name \(uid f{32}, deleted at 2024-01-01T00:00:00.000Z; this volume's uid is [0-9a-f]{32}\)/,
  );
  assert.equal(h.sends.length, sends);
  assert.deepEqual(snapshotsOf(h, ds), []);
});

Deno.test("backupVolume clears deletedAt of its own record", async () => {
  const h = backupHarness();
  const ds = h.volume("pg");
  await backupVolume(h.deps, ds);
  const key = volumeRecordKey("pg");
  const text = decoder.decode(h.store.peek(key));
  const deleted = { ...JSON.parse(text), deletedAt: "2024-01-01T00:30:00.000Z" };
  h.store.poke(key, new TextEncoder().encode(JSON.stringify(deleted)));
  h.clock.ms += HOUR;
  await backupVolume(h.deps, ds);
  assert.equal(parseVolumeRecord(h.store.peek(key)!).deletedAt, undefined);
});

Deno.test("a failed upload leaves no manifest; the next backup drops its snapshot", async () => {
  const h = backupHarness();
  const ds = h.volume("pg");
  const first = stored(await backupVolume(h.deps, ds));
  h.clock.ms += HOUR;
  h.failSend = new StoreError("unavailable", "store down");
  await assert.rejects(backupVolume(h.deps, ds), /store down/);
  assert.equal(manifests(h).length, 1);
  assert.equal(h.pool.value(ds, BACKUP_LAST_PROPERTY), String(T0 / 1000));
  h.clock.ms += HOUR;
  await assert.rejects(backupVolume(h.deps, ds), /store down/);
  // Only the stored one and the last failed one: a long outage leaves no pile of snapshots.
  assert.deepEqual(snapshotsOf(h, ds), [
    `.backup-${T0 / 1000}-1`,
    `.backup-${(T0 + 2 * HOUR) / 1000}-3`,
  ]);
  h.failSend = undefined;
  h.clock.ms += HOUR;
  const next = stored(await backupVolume(h.deps, ds));
  assert.equal(next.manifest.baseGuid, first.manifest.guid);
  // Above the failed ones' numbers too: a name once taken is never taken again.
  assert.deepEqual(snapshotsOf(h, ds), [`.backup-${(T0 + 3 * HOUR) / 1000}-4`]);
  assert.equal(next.manifest.sequence, 4);
});

Deno.test("backupVolume destroys only .backup-* snapshots of that very dataset", async () => {
  const h = backupHarness();
  const ds = h.volume("pg");
  const neighbour = h.volume("pg2");
  await backupVolume(h.deps, ds);
  const untouchable = [
    h.snapshot(ds, "csi-snap"),
    h.snapshot(ds, ".backup-x1"),
    h.snapshot(ds, ".backupx-1"),
    h.snapshot(ds, ".backup-1-x"),
    h.snapshot(ds, ".backup-1-2-3"),
    h.snapshot(ds, ".deleted-1700000000-.backup-1"),
    h.snapshot(neighbour, ".backup-1"),
  ];
  h.pool.add(`${ds}/child`);
  h.pool.add(`${ds}/child@.backup-1`);
  h.clock.ms += HOUR;
  const out = stored(await backupVolume(h.deps, ds));
  assert.deepEqual(out.destroyed, [`${ds}@.backup-${T0 / 1000}-1`]);
  for (const name of [...untouchable, `${ds}/child@.backup-1`]) assert.ok(h.pool.has(name), name);
  const destroyed = h.runner.argvs.filter((a) => a[1] === "destroy");
  assert.deepEqual(destroyed, [["zfs", "destroy", `${ds}@.backup-${T0 / 1000}-1`]]);
});

Deno.test("backupVolume holds the volume's lock around zfs steps, never during the upload", async () => {
  const h = backupHarness();
  const ds = h.volume("pg");
  let heldDuringSend: boolean | undefined;
  h.onSend = () => {
    heldDuringSend = h.locks.isHeld(ds);
  };
  const held: boolean[] = [];
  h.pool.hook = (argv) => {
    if (argv[1] !== "get") held.push(h.locks.isHeld(ds));
    return undefined;
  };
  await backupVolume(h.deps, ds);
  assert.equal(heldDuringSend, false);
  // uid set, snapshot, backup-last set: each under the lock.
  assert.ok(held.length >= 2 && held.every((x) => x), JSON.stringify(held));
  // With skipIfBusy, a held lock means no backup at all.
  const lock = h.locks.tryAcquire([ds])!;
  const sends = h.sends.length;
  assert.deepEqual(await backupVolume(h.deps, ds, { skipIfBusy: true }), { status: "busy" });
  assert.equal(h.sends.length, sends);
  lock.release();
});

Deno.test("backupVolume prunes the store by the keep policy, manifests before streams", async () => {
  const h = backupHarness({ maxChainLength: 2 });
  const ds = h.volume("pg", { [BACKUP_KEEP_PROPERTY]: "last=2" });
  const deletes: string[] = [];
  const del = h.store.delete.bind(h.store);
  h.store.delete = (key: string) => {
    deletes.push(key.replace(/^v1\/volumes\/pg\//, "").replace(/-[0-9a-f]+\.zfs$/, ".zfs"));
    return del(key);
  };
  const guids: string[] = [];
  for (let i = 0; i < 5; i++) {
    guids.push(stored(await backupVolume(h.deps, ds)).manifest.guid);
    h.clock.ms += HOUR;
  }
  // Chains [1 2] [3 4] [5]: last=2 keeps 4 and 5, and 3 as 4's base.
  const hex = (g: string) => BigInt(g).toString(16).padStart(16, "0");
  assert.deepEqual(manifests(h).map((m) => m.guid).sort(), guids.slice(2).sort());
  // Every manifest first, leaves first; each stream only once nothing listed needs it.
  assert.deepEqual(deletes, [
    `snapshots/${hex(guids[1]!)}.json`,
    `snapshots/${hex(guids[0]!)}.json`,
    `streams/${hex(guids[1]!)}.zfs`,
    `streams/${hex(guids[0]!)}.zfs`,
  ]);
});

Deno.test("backupVolume refuses what is not a volume of the plugin", async () => {
  const h = backupHarness();
  h.pool.add(`${PARENT}/foreign`);
  await assertRejectsCsi(
    backupVolume(h.deps, `${PARENT}/foreign`),
    Code.FAILED_PRECONDITION,
    /not a volume of zfs-csi/,
  );
  await assertRejectsCsi(backupVolume(h.deps, `${PARENT}/gone`), Code.NOT_FOUND, /gone/);
  await assertRejectsCsi(
    backupVolume(h.deps, `${PARENT}/.deleted-1-pg`),
    Code.INVALID_ARGUMENT,
    /not a volume below/,
  );
  assert.deepEqual(h.sends, []);
});

Deno.test("backupVolume stops when the dataset was replaced while the store was read", async () => {
  const h = backupHarness();
  const ds = h.volume("pg");
  await backupVolume(h.deps, ds);
  const list = h.store.list.bind(h.store);
  h.store.list = (prefix: string) => {
    // A delete and a create of the same name meanwhile: a dataset without the uid.
    h.pool.setValue(ds, UID_PROPERTY, ["-", "-"]);
    return list(prefix);
  };
  h.clock.ms += HOUR;
  await assertRejectsCsi(backupVolume(h.deps, ds), Code.ABORTED, /was replaced/);
  assert.equal(h.sends.length, 1);
  assert.deepEqual(snapshotsOf(h, ds), [`.backup-${T0 / 1000}-1`]);
});

Deno.test("backupVolume sends an encrypted dataset raw, and reads zfs without encryption", async () => {
  const h = backupHarness();
  const ds = h.volume("pg", { encryption: "aes-256-gcm" });
  const out = stored(await backupVolume(h.deps, ds));
  assert.equal(h.sends[0]?.raw, true);
  assert.equal(out.manifest.raw, true);
  // zfs-fuse: "encryption" is refused; asked once, then left out.
  const z = backupHarness();
  const plain = z.volume("pg");
  z.pool.hook = (argv) =>
    argv[1] === "get" && argv.some((a) => a.split(",").includes("encryption"))
      ? { code: 2, stderr: "bad property list: invalid property 'encryption'\n" }
      : undefined;
  stored(await backupVolume(z.deps, plain));
  z.clock.ms += HOUR;
  stored(await backupVolume(z.deps, plain));
  assert.equal(z.sends[0]?.raw, false);
  const refused = z.runner.argvs.filter((a) =>
    a[1] === "get" && a.join(" ").includes("encryption")
  );
  // The first volume read and unknownProperties' question, then never again.
  assert.equal(refused.length, 2);
});

Deno.test("backupVolume drives the real sendToStore: zfs send -i <base>, the bytes as sent", async () => {
  const chunks = patternChunks(50_000, 4096);
  const streams = new FakeStreamRunner(() => ({ stdout: chunks }));
  const h = backupHarness();
  const deps = {
    ...h.deps,
    send: (spec: Parameters<typeof sendToStore>[1]) =>
      sendToStore({ streams, zfsPath: "zfs", store: h.store, log: h.deps.log }, spec),
  };
  const ds = h.volume("pg");
  await backupVolume(deps, ds);
  h.clock.ms += HOUR;
  const out = stored(await backupVolume(deps, ds));
  const [t0, t1] = [T0 / 1000, T0 / 1000 + 3600];
  assert.deepEqual(streams.processes.map((p) => p.argv), [
    ["zfs", "send", `${ds}@.backup-${t0}-1`],
    ["zfs", "send", "-i", `${ds}@.backup-${t0}-1`, `${ds}@.backup-${t1}-2`],
  ]);
  assert.deepEqual(h.store.peek(out.manifest.stream), joinChunks(chunks));
  assert.equal(out.manifest.size, 50_000);
  const digest = createHash("sha256").update(joinChunks(chunks)).digest("hex");
  assert.equal(out.manifest.sha256, digest);
});

Deno.test("backupVolume records each stream's form and hands an incremental its base's form", async () => {
  const compressed = {
    compressed: true,
    largeBlocks: true,
    embedded: true,
    features: ["compressed", "lz4"],
  };
  const h = backupHarness();
  const deps = {
    ...h.deps,
    send: async (spec: SendToStoreSpec) => ({ ...await h.deps.send(spec), form: compressed }),
  };
  const ds = h.volume("pg");
  const full = stored(await backupVolume(deps, ds));
  assert.deepEqual(full.manifest.form, compressed);
  assert.equal(h.sends[0]?.baseForm, undefined, "a full stream has no base form");
  h.clock.ms += HOUR;
  await backupVolume(deps, ds);
  assert.deepEqual(h.sends[1]?.baseForm, compressed);
  // A send that says no form (an older send) leaves the field out: the stream is plain.
  h.clock.ms += HOUR;
  const plain = stored(await backupVolume(h.deps, ds));
  assert.equal(plain.manifest.form, undefined);
  h.clock.ms += HOUR;
  await backupVolume(h.deps, ds);
  assert.deepEqual(h.sends[3]?.baseForm, PLAIN_FORM, "a base without a form is plain");
});

Deno.test("backupVolume bases on a snapshot stored by CreateSnapshot (.stored-*), as after a restore", async () => {
  const h = backupHarness();
  const ds = h.volume("pg");
  const kept = h.snapshot(ds, ".stored-nightly");
  const requested = stored(
    await backupSnapshot(h.deps, { dataset: ds, snapshot: kept, csiName: "nightly" }),
  );
  assert.equal(requested.manifest.baseGuid, null);
  h.clock.ms += HOUR;
  const next = stored(await backupVolume(h.deps, ds));
  assert.equal(h.sends[1]?.base, kept);
  assert.equal(next.manifest.baseGuid, requested.manifest.guid);
  // A look-alike is no base: its name does not decode.
  h.clock.ms += HOUR;
  h.snapshot(ds, ".stored-.x");
  await backupVolume(h.deps, ds);
  assert.equal(h.sends[2]?.base, `${ds}@.backup-${(T0 + HOUR) / 1000}-2`);
});

Deno.test("backups within one second get names of their own, and old names stay the plugin's", async () => {
  const h = backupHarness();
  const ds = h.volume("pg", { [BACKUP_KEEP_PROPERTY]: "last=10" });
  // A snapshot an earlier version took and stored (no sequence number in name or manifest).
  const old = h.snapshot(ds, `.backup-${T0 / 1000 - 60}`);
  const legacy = stored(await backupSnapshot(h.deps, { dataset: ds, snapshot: old, csiName: "x" }));
  const { csiName: _, sequence: __, ...plain } = legacy.manifest;
  h.store.poke(
    manifestsPrefix("pg") + `${BigInt(legacy.manifest.guid).toString(16).padStart(16, "0")}.json`,
    new TextEncoder().encode(JSON.stringify({ ...plain, kind: "scheduled" })),
  );
  // Six backups in the same second, each pruning the one before on the node.
  const names: string[] = [];
  for (let i = 0; i < 6; i++) {
    const out = stored(await backupVolume(h.deps, ds));
    names.push(out.manifest.snapshot);
  }
  assert.equal(h.sends[1]?.base, old, "the old snapshot is the first base");
  assert.ok(!h.pool.has(old), "and it went with the local prune, as the plugin's own");
  const s = T0 / 1000;
  assert.deepEqual(names, [1, 2, 3, 4, 5, 6].map((n) => `.backup-${s}-${n}`));
  // One chain, one name per snapshot: a full receive into one dataset finds no name twice.
  const all = manifests(h);
  const chain = chainTo(all, all.find((m) => m.snapshot === names.at(-1))!.guid);
  assert.deepEqual(chain.map((m) => m.snapshot), [`.backup-${s - 60}`, ...names]);
  const logged = h.logs.filter((l) => l.msg === "backup stored").map((l) => l.snapshot);
  assert.deepEqual(logged.slice(1), names.map((n) => `${ds}@${n}`));
});

Deno.test("a prune whose guard lacks the head lists again once, then waits", async () => {
  const answers: PruneGuard[] = [];
  const listings: number[] = [];
  const h = backupHarness({
    maxChainLength: 1,
    protect: (_key, manifests) => {
      listings.push(manifests.length);
      return Promise.resolve(answers.shift() ?? { keep: new Set() });
    },
  });
  const ds = h.volume("pg", { [BACKUP_KEEP_PROPERTY]: "last=1" });
  stored(await backupVolume(h.deps, ds));
  h.clock.ms += HOUR;
  // The listing lacks the head twice: nothing is pruned, and the log says why.
  const lacks: PruneGuard = { skip: "the head is not in the listing", listAgain: true };
  answers.push(lacks, lacks);
  listings.length = 0;
  const second = stored(await backupVolume(h.deps, ds));
  assert.deepEqual(second.pruned, []);
  assert.equal(listings.length, 2);
  assert.ok(h.logs.some((l) => l.msg === "store not pruned" && /head/.test(String(l.reason))));
  // Once, then a listing that holds it: pruned from the second listing.
  h.clock.ms += HOUR;
  answers.push(lacks);
  listings.length = 0;
  const third = stored(await backupVolume(h.deps, ds));
  assert.equal(listings.length, 2);
  assert.equal(third.pruned.length, 2);
  // A guard that says "not you" is not asked again.
  h.clock.ms += HOUR;
  answers.push({ skip: "another node holds it", listAgain: false });
  listings.length = 0;
  assert.deepEqual(stored(await backupVolume(h.deps, ds)).pruned, []);
  assert.equal(listings.length, 1);
});

Deno.test("a snapshot name used again (CreateSnapshot after DeleteSnapshot) never joins a chain that holds it", async () => {
  const h = backupHarness();
  const ds = h.volume("pg");
  stored(await backupVolume(h.deps, ds));
  h.clock.ms += HOUR;
  const first = h.snapshot(ds, ".stored-x");
  const x1 = stored(await backupSnapshot(h.deps, { dataset: ds, snapshot: first, csiName: "x" }));
  h.clock.ms += HOUR;
  // The next backup builds on it, so DeleteSnapshot only releases it: it stays in the chain.
  stored(await backupVolume(h.deps, ds));
  assert.equal(await releaseStored(h.store, "pg", x1.manifest.guid, h.deps.log), "released");
  await h.deps.zfs.destroy(first);
  h.clock.ms += HOUR;
  // The same CSI name again: a new snapshot of the same name.
  const again = h.snapshot(ds, ".stored-x");
  const x2 = stored(await backupSnapshot(h.deps, { dataset: ds, snapshot: again, csiName: "x" }));
  const names = chainTo(manifests(h), x2.manifest.guid).map((m) => m.snapshot);
  assert.equal(new Set(names).size, names.length, `one name per snapshot: ${names.join(", ")}`);
});

Deno.test("a chain an earlier version wrote with one name twice is not extended", async () => {
  const h = backupHarness();
  const ds = h.volume("pg");
  stored(await backupVolume(h.deps, ds));
  const uid = h.pool.value(ds, UID_PROPERTY)!;
  // What an earlier version left: .backup-100 <- .backup-101 <- .backup-100 (a new snapshot of
  // the freed name), stored without sequence numbers.
  const store = async (name: string, base: string | undefined) => {
    const guid = h.pool.value(name, "guid")!;
    const key = `v1/volumes/pg/streams/${BigInt(guid).toString(16).padStart(16, "0")}-00ff00ff.zfs`;
    const sent = await h.deps.send({ snapshot: name, ...(base ? { base } : {}), raw: false, key });
    const m = {
      format: 1,
      volume: "pg",
      volumeUid: uid,
      guid,
      baseGuid: base ? h.pool.value(base, "guid")! : null,
      snapshot: name.slice(ds.length + 1),
      kind: "scheduled",
      createdAt: new Date(h.clock.ms).toISOString(),
      stream: key,
      size: sent.size,
      sha256: sent.sha256,
      raw: false,
      node: "node-0",
      capacityBytes: 0,
    };
    h.store.poke(
      manifestsPrefix("pg") + `${BigInt(guid).toString(16).padStart(16, "0")}.json`,
      new TextEncoder().encode(JSON.stringify(m)),
    );
  };
  h.clock.ms += HOUR;
  const s1 = h.snapshot(ds, ".backup-100");
  await store(s1, undefined);
  const s2 = h.snapshot(ds, ".backup-101");
  await store(s2, s1);
  await h.deps.zfs.destroy(s1);
  const s3 = h.snapshot(ds, ".backup-100");
  await store(s3, s2);
  h.clock.ms += HOUR;
  const next = stored(await backupVolume(h.deps, ds));
  assert.equal(h.sends.at(-1)?.base, s2, "based where the chain's names are still unique");
  const names = chainTo(manifests(h), next.manifest.guid).map((m) => m.snapshot);
  assert.equal(new Set(names).size, names.length, names.join(", "));
});
