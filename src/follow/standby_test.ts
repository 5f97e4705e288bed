/**
 * StandbyFollower on a fake pool and the in-memory store: it follows only the owner object's
 * head chain, receives increments onto a clean copy and keeps it clean (release marker on the
 * newest snapshot, read-only), skips volumes this node holds or no longer stands by for, and
 * keeps a failure per volume. Real receives run in tests/integration/follow_standby_test.ts.
 */

import assert from "node:assert/strict";
import { createHash } from "node:crypto";
import type { FakePool } from "../../tests/support/fake_pool.ts";
import { gate } from "../../tests/support/fake_runner.ts";
import {
  createFollowOwner,
  DATASET as DS,
  FaultyStore,
  followHarness,
  followManifest,
  holdAs,
  PARENT,
  settle,
  settleUntil,
  storeManifests,
} from "../../tests/support/follow_harness.ts";
import type { MemoryStore } from "../../tests/support/memory_store.ts";
import { KeyedLock } from "../lock.ts";
import type { Store, TransferOptions } from "../store/store.ts";
import { manifestKey, ownerKey, type SnapshotManifest } from "../store/layout.ts";
import { FOLLOW_GENERATION_PROPERTY, FOLLOW_RELEASED_PROPERTY } from "./copy.ts";
import { writeMarkers } from "./markers.ts";
import { FollowVolumes, type SetAside } from "./mover.ts";
import { type FollowSettings, type Holding, moveHead, release } from "./owner.ts";
import { StandbyFollower } from "./standby.ts";

function bytesOf(guid: string): Uint8Array {
  return new TextEncoder().encode(`stream of ${guid}`.repeat(Number(guid)));
}

/** A stored snapshot whose stream is {@linkcode bytesOf} its guid. */
function manifest(guid: string, baseGuid: string | null, volume = "pg"): SnapshotManifest {
  const bytes = bytesOf(guid);
  return followManifest(guid, baseGuid, {
    volume,
    size: bytes.length,
    sha256: createHash("sha256").update(bytes).digest("hex"),
  });
}

/** Stores each manifest and its stream. */
async function put(store: Store, ...manifests: SnapshotManifest[]): Promise<void> {
  await storeManifests(store, manifests, { stream: (m) => bytesOf(m.guid) });
}

/** A store whose downloads never send a byte: they end only when aborted. */
function hangingDownloads(store: Store): Store {
  return {
    description: store.description,
    putStream: (key, body, options) => store.putStream(key, body, options),
    putBytes: (key, bytes, condition) => store.putBytes(key, bytes, condition),
    getStream: (_key: string, options?: TransferOptions) =>
      Promise.resolve(
        new ReadableStream<Uint8Array>({
          start(c) {
            options?.signal?.addEventListener("abort", () => c.error(options.signal!.reason));
          },
        }),
      ),
    getBytes: (key) => store.getBytes(key),
    list: (prefix) => store.list(prefix),
    delete: (key) => store.delete(key),
  };
}

/** Node "n2" stands by for "pg", which node "n1" holds; the store has snapshots 1 ← 2 ← 3. */
async function setup(
  opts: {
    standbys?: string[];
    hang?: boolean;
    settings?: FollowSettings;
    onReceive?: (target: string, pool: FakePool) => void;
    /** The store the standby reads, made from the test's (default: that store). */
    standbyStore?: (store: MemoryStore) => Store;
    /** The trash the standby sets copies aside with (default: one that refuses). */
    trash?: SetAside;
  } = {},
) {
  const pending: SnapshotManifest[] = [];
  let txg = 100;
  const h = followHarness({
    node: "n2",
    // zfs receive -u <dataset>: the stream's snapshot appears with the manifest's guid.
    receive: (argv, pool) => {
      const target = argv.at(-1)!;
      opts.onReceive?.(target, pool);
      const m = pending.shift();
      // A full stream makes its filesystem.
      if (m && !pool.has(target)) pool.add(target, {});
      if (m) pool.add(`${target}@${m.snapshot}`, { guid: m.guid, createtxg: String(++txg) });
      return {};
    },
    receiveStore: opts.hang ? hangingDownloads : undefined,
  });
  const { pool, store, streams } = h;
  // Each its own locks, as in these tests they always were.
  const follow = new FollowVolumes(h.deps);
  const standby = new StandbyFollower({
    ...h.copyDeps,
    store: opts.standbyStore?.(store) ?? store,
    ...(opts.trash ? { trash: opts.trash } : {}),
    locks: new KeyedLock(),
    copies: follow,
    intervalSeconds: 60,
  });
  await createFollowOwner(store, {
    settings: opts.settings ?? { capacityBytes: 0, properties: { compression: "lz4" } },
    standbys: opts.standbys ?? ["n2", "n3"],
  });
  await writeMarkers(store, "pg", "pg", ["n2"]);
  const manifests = [manifest("1", null), manifest("2", "1"), manifest("3", "2")];
  await put(store, ...manifests);
  const holding = await holdAs(store, "n1");
  return { pool, store, streams, standby, follow, pending, holding, manifests };
}

/** This node's copy, released here earlier at snapshot `guid` (clean). */
function cleanCopy(pool: FakePool, guid: string): void {
  pool.add(DS, {
    "org.zfs-csi:managed": "yes",
    [FOLLOW_GENERATION_PROPERTY]: "0",
    [FOLLOW_RELEASED_PROPERTY]: guid,
    readonly: "on",
    mounted: "no",
  });
  pool.add(`${DS}@.backup-${guid}`, { guid, createtxg: "50" });
}

async function head(store: MemoryStore, holding: Holding, guid: string): Promise<Holding> {
  return await moveHead(store, "pg", holding, { guid, createdAt: "2026-01-01T00:00:00Z" }, 0);
}

Deno.test("tick receives the increments from a clean copy up to the head and keeps it clean", async () => {
  const s = await setup();
  cleanCopy(s.pool, "1");
  await head(s.store, s.holding, "3");
  s.pending.push(s.manifests[1]!, s.manifests[2]!);
  const report = await s.standby.tick();
  assert.deepEqual(report.checked, ["pg"]);
  assert.deepEqual(report.received, {
    name: "pg",
    kind: "increment",
    bytes: s.manifests[1]!.size + s.manifests[2]!.size,
  });
  assert.deepEqual(
    s.streams.processes.map((p) => p.argv),
    [["zfs", "receive", "-u", DS], ["zfs", "receive", "-u", DS]],
  );
  assert.deepEqual(s.streams.processes[1]!.stdinBytes, bytesOf("3"), "snapshot 3's stream");
  assert.equal(s.pool.value(DS, FOLLOW_RELEASED_PROPERTY), "3", "marker on the newest");
  assert.equal(s.pool.value(DS, "readonly"), "on");
  assert.equal(s.standby.state("pg")?.current, true);
  assert.equal(s.standby.state("pg")?.guid, "3");
  // The copy is the head now: nothing more to receive, and no manifest is read to know it.
  for (const m of s.manifests) await s.store.delete(manifestKey("pg", m.guid));
  const again = await s.standby.tick();
  assert.equal(again.received, undefined);
  assert.equal(s.streams.processes.length, 2);
  assert.equal(s.standby.state("pg")?.current, true);
  assert.equal(s.standby.state("pg")?.error, undefined);
});

Deno.test("tick receives the head's chain in full where this node has no copy, marked as a clean standby copy", async () => {
  const s = await setup();
  await head(s.store, s.holding, "2");
  s.pending.push(s.manifests[0]!, s.manifests[1]!);
  const report = await s.standby.tick();
  assert.deepEqual(report.received, {
    name: "pg",
    kind: "full",
    bytes: s.manifests[0]!.size + s.manifests[1]!.size,
  });
  const targets = s.streams.processes.map((p) => p.argv.at(-1));
  assert.equal(targets.length, 2, "two streams: the full one and its increment");
  assert.equal(new Set(targets).size, 1, "both into the same dataset");
  assert.match(
    s.streams.processes[0]!.argv.at(-1)!,
    /^tank\/nomad\/\.restore-/,
    "a hidden dataset",
  );
  assert.ok(s.pool.has(DS), "renamed to the volume once whole");
  assert.ok(s.pool.has(`${DS}@.backup-2`));
  const marks: [string, string][] = [
    [FOLLOW_RELEASED_PROPERTY, "2"],
    [FOLLOW_GENERATION_PROPERTY, "0"],
    ["org.zfs-csi:backup-interval", "0"],
    ["readonly", "on"],
    ["canmount", "noauto"],
    ["compression", "lz4"],
    ["org.zfs-csi:managed", "yes"],
  ];
  for (const [prop, want] of marks) assert.equal(s.pool.value(DS, prop), want, prop);
  // And the stage's rule finds it clean at the head.
  const copy = await s.follow.readCopy(DS);
  assert.equal(copy?.releasedAt, "2");
  assert.equal(copy?.newestGuid, "2");
  assert.equal(copy?.readonly, true);
});

Deno.test("tick never receives a stream off the head's chain (a fenced holder's late upload)", async () => {
  const s = await setup();
  cleanCopy(s.pool, "2");
  await head(s.store, s.holding, "2");
  // Uploaded after snapshot 2 but never made the head.
  await put(s.store, manifest("4", "2"));
  const report = await s.standby.tick();
  assert.equal(report.received, undefined);
  assert.equal(s.streams.processes.length, 0);
  assert.equal(s.standby.state("pg")?.current, true);
});

Deno.test("tick leaves a volume this node holds, or no longer stands by for, alone", async () => {
  const s = await setup();
  cleanCopy(s.pool, "1");
  const h = await head(s.store, s.holding, "3");
  await release(s.store, "pg", h, undefined, 0);
  await holdAs(s.store, "n2");
  await s.standby.tick();
  assert.equal(s.streams.processes.length, 0);
  assert.equal(s.standby.state("pg")?.note, "held by this node");

  const t = await setup({ standbys: ["n3"] });
  cleanCopy(t.pool, "1");
  await head(t.store, t.holding, "3");
  await t.standby.tick();
  assert.equal(t.streams.processes.length, 0);
  assert.match(t.standby.state("pg")?.note ?? "", /does not name this node/);
});

Deno.test("tick shows, and does not touch, a diverged copy that is still mounted", async () => {
  const s = await setup();
  cleanCopy(s.pool, "1");
  // Written after its release: not clean.
  s.pool.setValue(DS, "readonly", "off");
  s.pool.setValue(DS, "mounted", "yes");
  await head(s.store, s.holding, "3");
  const report = await s.standby.tick();
  assert.equal(report.received, undefined);
  assert.equal(s.streams.processes.length, 0);
  const state = s.standby.state("pg");
  assert.equal(state?.current, false);
  assert.match(state?.error ?? "", /diverged.*changed after it was released.*still mounted/);
  assert.ok(s.pool.has(DS), "the copy stays");
});

Deno.test("tick skips a volume a stage on this node is working on, and a stage stops a receive", async () => {
  const s = await setup();
  cleanCopy(s.pool, "1");
  await head(s.store, s.holding, "3");
  let release!: () => void;
  const staged = s.follow.gate.exclusive(DS, () => new Promise<void>((r) => release = r));
  await s.standby.tick();
  assert.equal(s.streams.processes.length, 0);
  assert.match(s.standby.state("pg")?.note ?? "", /being staged/);
  release();
  await staged;

  // A download that hangs until stopped: the stage aborts it and goes on.
  const t = await setup({ hang: true });
  cleanCopy(t.pool, "1");
  await head(t.store, t.holding, "3");
  const ticking = t.standby.tick();
  while (t.streams.processes.length === 0) await new Promise((r) => setTimeout(r, 5));
  let ran = false;
  await t.follow.gate.exclusive(DS, () => {
    ran = true;
    return Promise.resolve();
  });
  assert.ok(ran, "the stage ran once the receive stopped");
  const report = await ticking;
  assert.equal(report.received, undefined);
  assert.match(t.standby.state("pg")?.note ?? "", /stage on this node stopped/);
  assert.equal(t.pool.value(DS, FOLLOW_RELEASED_PROPERTY), "1", "the copy stays clean at 1");
});

Deno.test("NodeStage's prepareStage stops a standby receive of the volume before it acquires", async () => {
  const s = await setup({ hang: true });
  cleanCopy(s.pool, "1");
  await head(s.store, s.holding, "3");
  const ticking = s.standby.tick();
  while (s.streams.processes.length === 0) await new Promise((r) => setTimeout(r, 5));
  // Node n1 holds the volume, so this stage is refused; it gets that far only once the
  // standby receive stopped.
  await assert.rejects(
    s.follow.prepareStage({ name: "pg", dataset: DS }),
    /held by node "n1"/,
  );
  // Stopped by the stage, not by its own end (a download that hangs never ends alone).
  let timer: ReturnType<typeof setTimeout> | undefined;
  const report = await Promise.race([
    ticking,
    new Promise<never>((_, reject) =>
      timer = setTimeout(() => reject(new Error("the standby receive was not stopped")), 5000)
    ),
  ]).finally(() => clearTimeout(timer));
  assert.equal(report.received, undefined);
  assert.match(s.standby.state("pg")?.note ?? "", /stage on this node stopped/);
  assert.ok(s.streams.processes[0]!.ended, "zfs receive ended");
});

Deno.test("tick receives into one volume at most; the next tick starts after it", async () => {
  const s = await setup();
  await head(s.store, s.holding, "2");
  // A second volume "qa" that n2 stands by for, with one stored snapshot.
  await createFollowOwner(s.store, { name: "qa", standbys: ["n2"] });
  await writeMarkers(s.store, "qa", "qa", ["n2"]);
  const qa = manifest("7", null, "qa");
  await put(s.store, qa);
  const held = await holdAs(s.store, "n1", { name: "qa" });
  await moveHead(s.store, "qa", held, { guid: "7", createdAt: qa.createdAt }, 0);

  s.pending.push(s.manifests[0]!, s.manifests[1]!);
  const first = await s.standby.tick();
  assert.deepEqual(first.checked, ["pg"], "the tick ended after its first receive");
  assert.equal(first.received?.name, "pg");
  assert.equal(s.standby.state("qa"), undefined, "qa not looked at yet");

  s.pending.push(qa);
  const second = await s.standby.tick();
  assert.deepEqual(second.checked, ["qa"]);
  assert.equal(second.received?.name, "qa");
  assert.ok(s.pool.has(`${PARENT}/qa@.backup-7`));

  // Both current now: a tick looks at both and receives nothing.
  const third = await s.standby.tick();
  assert.deepEqual(third.checked, ["pg", "qa"]);
  assert.equal(third.received, undefined);
});

Deno.test("tick grows a standby copy to the recorded size before it receives increments", async () => {
  const MiB = 1024 * 1024;
  let quotaAtReceive: string | undefined;
  const s = await setup({
    // The volume was grown to 128 MiB after this node's copy was made at 64 MiB.
    settings: { capacityBytes: 128 * MiB, properties: { refquota: String(128 * MiB) } },
    onReceive: (target, pool) => quotaAtReceive ??= pool.value(target, "refquota"),
  });
  cleanCopy(s.pool, "1");
  s.pool.setValue(DS, "refquota", String(64 * MiB));
  await head(s.store, s.holding, "2");
  s.pending.push(s.manifests[1]!);
  const report = await s.standby.tick();
  assert.equal(report.received?.kind, "increment");
  assert.equal(quotaAtReceive, String(128 * MiB), "grown before the first increment");
  assert.equal(s.pool.value(DS, "refquota"), String(128 * MiB));
});

// ---------------------------------------------------------------------------------------------
// Issue 21, item 10: the standby decides on facts read inside the gate, and never sets aside
// a copy this node holds.

/** A trash that records the datasets it is asked about and sets nothing aside. */
function recordingTrash(asked: string[]): SetAside {
  return {
    inspect: (dataset) => {
      asked.push(dataset);
      return Promise.resolve(undefined);
    },
    removeVolume: (dataset) => {
      asked.push(dataset);
      return Promise.resolve();
    },
  };
}

Deno.test("tick acts on the owner object as read in the gate: a copy a stage here made writable after its first look is left alone", async () => {
  const asked: string[] = [];
  let faulty!: FaultyStore;
  const s = await setup({
    standbyStore: (store) => faulty = new FaultyStore(store),
    trash: recordingTrash(asked),
  });
  cleanCopy(s.pool, "1");
  const h = await head(s.store, s.holding, "3");
  // The standby's read of the owner object (held by n1) answers late.
  const late = gate();
  faulty.inject(
    (c) => c.op === "getBytes" && c.key === ownerKey("pg"),
    { kind: "late", until: late.promise },
    1,
  );
  const ticking = s.standby.tick();
  await settleUntil(
    "the standby read the owner object",
    () => faulty.calls.some((c) => c.key === ownerKey("pg")),
  );
  // Meanwhile n1 lets go, and a stage here takes the volume and makes its copy writable (or,
  // with the read inside the gate, waits for the standby's look to end first).
  await release(s.store, "pg", h, undefined, 0);
  s.pending.push(s.manifests[1]!, s.manifests[2]!);
  const staging = s.follow.prepareStage({ name: "pg", dataset: DS });
  await settle();
  late.open();
  await staging;
  const report = await ticking;
  assert.equal(s.pool.value(DS, "readonly"), "off", "the stage made the copy writable");
  assert.equal(report.received, undefined);
  assert.deepEqual(asked, [], "nothing was set aside");
  assert.equal(s.pool.value(DS, FOLLOW_RELEASED_PROPERTY), "none", "the copy is this node's");
  assert.equal(s.pool.value(DS, FOLLOW_GENERATION_PROPERTY), "2");
  assert.match(s.standby.state("pg")?.note ?? "", /stage on this node|held by this node/);
  // The next look finds it held here.
  await s.standby.tick();
  assert.equal(s.standby.state("pg")?.note, "held by this node");
  assert.deepEqual(asked, []);
});

Deno.test("tick never sets aside or receives into a copy this node marks held, whatever the owner object says", async () => {
  const asked: string[] = [];
  const s = await setup({ trash: recordingTrash(asked) });
  // This node held the volume and has not learnt yet that n1 took it over: its renewal will
  // mark the copy fenced; until then the copy is the holder side's, not the standby's.
  cleanCopy(s.pool, "1");
  s.pool.setValue(DS, FOLLOW_GENERATION_PROPERTY, "1");
  s.pool.setValue(DS, FOLLOW_RELEASED_PROPERTY, "none");
  s.pool.setValue(DS, "readonly", "off");
  await head(s.store, s.holding, "3");
  await s.standby.tick();
  assert.deepEqual(asked, [], "nothing was set aside");
  assert.equal(s.streams.processes.length, 0, "nothing received into it");
  assert.equal(s.pool.value(DS, "readonly"), "off");
  assert.match(s.standby.state("pg")?.note ?? "", /this node holds|held by this node/);
});
