/**
 * Copies of follow volumes that are zvols, in src/follow/ (copy_kind.ts and its users): the
 * owner object's zvol settings, the plan for a copy of the other kind, a chain that does not fit,
 * the record's growth in whole volsize steps and a copy given its volsize, the standby's receives
 * into a zvol (no unmount, no dataset-only property, its reservation and format record), and no
 * scheduled backup while a stage runs (the sweep of a deleted follow zvol's copy: sweep_test.ts). On a model
 * pool that refuses filesystem-only properties and `zfs unmount` on a zvol, as OpenZFS does; the
 * node's side is src/csi/node_follow_zvol_test.ts, real zvols tests/integration/block_follow_test.ts.
 */

import assert from "node:assert/strict";
import { createHash } from "node:crypto";
import { assertThrowsCsi } from "../../tests/support/assert_errors.ts";
import type { FakePool } from "../../tests/support/fake_pool.ts";
import { FILESYSTEM_ONLY } from "../../tests/support/fake_pool.ts";
import {
  createFollowOwner,
  DATASET as DS,
  followHarness,
  followManifest,
  holdAs,
  storeManifests,
} from "../../tests/support/follow_harness.ts";
import { Code } from "../errors.ts";
import { KeyedLock } from "../lock.ts";
import type { SnapshotManifest, StoredZvol } from "../store/layout.ts";
import type { PropertyMap } from "../zfs/parse.ts";
import { FOLLOW_GENERATION_PROPERTY, FOLLOW_RELEASED_PROPERTY, planCopy } from "./copy.ts";
import { checkChainFits } from "./copy_kind.ts";
import { writeMarkers } from "./markers.ts";
import { FollowVolumes } from "./mover.ts";
import {
  encodeOwner,
  type FollowSettings,
  moveHead,
  parseOwner,
  readOwner,
  release,
} from "./owner.ts";
import {
  recordedSizeChanges,
  resizedSettings,
  resizeFollowVolume,
  SizedFollowVolumes,
} from "./resize.ts";
import { StandbyFollower } from "./standby.ts";

const GiB = 1024 * 1024 * 1024;
const STEP = 128 * 1024;

const zvolSettings = (capacityBytes = GiB, sparse = false): FollowSettings => ({
  capacityBytes,
  properties: { "org.zfs-csi:managed": "yes", "org.zfs-csi:fs-type": "ext4" },
  zvol: { content: "ext4", sparse },
});

function bytesOf(guid: string): Uint8Array {
  return new TextEncoder().encode(`zvol stream ${guid}`);
}

function manifest(guid: string, baseGuid: string | null, zvol?: StoredZvol): SnapshotManifest {
  const bytes = bytesOf(guid);
  return followManifest(guid, baseGuid, {
    ...(zvol ? { zvol } : {}),
    capacityBytes: GiB,
    size: bytes.length,
    sha256: createHash("sha256").update(bytes).digest("hex"),
  });
}

const EXT4: StoredZvol = { content: "ext4", volblocksize: 16384, formatted: true };

function props(values: Record<string, string>): PropertyMap {
  return new Map(Object.entries(values).map(([k, v]) => [k, { value: v, source: "local" }]));
}

/** Makes `dataset` a zvol on the model pool (type, no mountpoint), with `values`. */
function addZvol(pool: FakePool, dataset: string, values: Record<string, string>): void {
  pool.add(dataset, values);
  pool.setValue(dataset, "type", "volume");
  pool.setValue(dataset, "mountpoint", ["-", "-"]);
}

/** Fails if any zfs command names a filesystem-only property, or unmounts. */
function assertNoDatasetOnly(argvs: readonly (readonly string[])[]): void {
  for (const argv of argvs) {
    if (argv[0] !== "zfs") continue;
    assert.notEqual(argv[1], "unmount", argv.join(" "));
    if (argv[1] !== "set" && argv[1] !== "create" && argv[1] !== "receive") continue;
    const named = argv.filter((a) => a.includes("=")).map((a) => a.slice(0, a.indexOf("=")));
    assert.deepEqual(named.filter((p) => FILESYSTEM_ONLY.has(p)), [], argv.join(" "));
  }
}

Deno.test("parseOwner reads a follow zvol's settings and refuses a wrong one", () => {
  const record = {
    format: 1,
    volume: "pg",
    uid: "b".repeat(32),
    holder: null,
    generation: 0,
    state: "released",
    head: null,
    headAt: null,
    renewedAt: "2026-01-01T00:00:00.000Z",
    ttlSeconds: 30,
    settings: { ...zvolSettings(), zvol: { content: "ext4", volblocksize: 16384, sparse: true } },
  } as const;
  assert.deepEqual(parseOwner(encodeOwner(record)).settings.zvol, {
    content: "ext4",
    volblocksize: 16384,
    sparse: true,
  });
  const bad = (zvol: unknown, capacityBytes = GiB) =>
    JSON.stringify({ ...record, settings: { ...record.settings, capacityBytes, zvol } });
  assert.throws(() => parseOwner(bad({ content: "btrfs", sparse: false })), /zvol.content/);
  assert.throws(() => parseOwner(bad({ content: "block" })), /zvol.sparse/);
  assert.throws(
    () => parseOwner(bad({ content: "block", sparse: false, volblocksize: 3000 })),
    /zvol.volblocksize/,
  );
  assert.throws(() => parseOwner(bad({ content: "block", sparse: false }, 0)), /positive/);
});

Deno.test("planCopy sets aside a copy of the other kind; checkChainFits refuses a chain of another kind or content", () => {
  const clean = { releasedAt: "1", newestGuid: "1", readonly: true, written: 0 };
  const owner = { generation: 2, heldBefore: false, chain: ["1", "2"] };
  assert.deepEqual(planCopy({ ...clean, kind: "volume" }, { ...owner, kind: "volume" }), {
    kind: "increment",
    from: "1",
  });
  const plan = planCopy({ ...clean, kind: "filesystem" }, { ...owner, kind: "volume" });
  assert.equal(plan.kind, "full");
  assert.match("why" in plan ? plan.why : "", /a ZFS dataset, and the volume is a zvol/);
  assert.equal("setAside" in plan && plan.setAside, true);
  checkChainFits("pg", zvolSettings(), [manifest("1", null, EXT4)]);
  assertThrowsCsi(
    () => checkChainFits("pg", zvolSettings(), [manifest("1", null)]),
    Code.DATA_LOSS,
    /is of a ZFS dataset, and the volume is a zvol holding ext4/,
  );
  assertThrowsCsi(
    () => checkChainFits("pg", { capacityBytes: 0, properties: {} }, [manifest("1", null, EXT4)]),
    Code.DATA_LOSS,
    /a zvol holding ext4, and the volume is a ZFS dataset/,
  );
  assertThrowsCsi(
    () =>
      checkChainFits("pg", zvolSettings(), [
        manifest("1", null, EXT4),
        manifest("2", "1", { ...EXT4, content: "xfs" }),
      ]),
    Code.DATA_LOSS,
    /zvol holding xfs/,
  );
});

Deno.test("resizedSettings of a follow zvol grows its volsize in whole steps and never sets a dataset size; recordedSizeChanges sets volsize only", () => {
  const before = zvolSettings();
  const after = resizedSettings("pg@*", before, { requiredBytes: GiB + 1, limitBytes: 0 });
  assert.deepEqual(after, { ...before, capacityBytes: GiB + STEP });
  assert.equal(resizedSettings("pg@*", after, { requiredBytes: GiB, limitBytes: 0 }), after);
  assertThrowsCsi(
    () => resizedSettings("pg@*", after, { requiredBytes: 0, limitBytes: GiB }),
    Code.OUT_OF_RANGE,
    /never shrunk/,
  );
  assert.deepEqual(recordedSizeChanges(props({ volsize: String(GiB) }), after), [
    ["volsize", String(GiB + STEP)],
  ]);
  // A copy grown further (by hand) keeps its size.
  assert.deepEqual(recordedSizeChanges(props({ volsize: String(2 * GiB) }), after), []);
});

Deno.test("SizedFollowVolumes gives a warm zvol copy made before an expansion its volsize once writable, nothing else", async () => {
  const h = followHarness();
  h.pool.serveCreates(h.runner, { version: "zfs-2.2.2-1" });
  const follow = new SizedFollowVolumes(h.deps);
  await createFollowOwner(h.store, { settings: zvolSettings() });
  await storeManifests(h.store, [manifest("1", null, EXT4)]);
  const n0 = await holdAs(h.store, "n0");
  await release(h.store, "pg", n0, { guid: "1", createdAt: "2026-01-01T00:00:01Z" }, 0);
  addZvol(h.pool, DS, {
    "org.zfs-csi:managed": "yes",
    "org.zfs-csi:fs-type": "ext4",
    [FOLLOW_GENERATION_PROPERTY]: "1",
    [FOLLOW_RELEASED_PROPERTY]: "1",
    readonly: "on",
    volsize: String(GiB),
  });
  h.pool.add(`${DS}@.backup-1`, { guid: "1", createtxg: "20" });
  await resizeFollowVolume(h.store, "pg", "pg@*", { requiredBytes: 2 * GiB, limitBytes: 0 });
  await follow.prepareStage({ name: "pg", dataset: DS, asZvol: { content: "ext4" } });
  assert.equal(h.pool.value(DS, "volsize"), String(2 * GiB));
  assert.equal(h.pool.value(DS, "readonly"), "off");
  // Set after the copy was made writable: zfs refuses the volsize of a read-only zvol.
  const sets = h.runner.argvs.filter((a) => a[1] === "set").map((a) => a.slice(2, -1).join(" "));
  assert.ok(
    sets.findIndex((a) => a.includes("readonly=off")) <
      sets.findIndex((a) => a.includes("volsize=")),
    sets.join(" | "),
  );
  assertNoDatasetOnly(h.runner.argvs);
  // What was read of the zvol: no size property of a dataset.
  const gets = h.runner.argvs.filter((a) => a[1] === "get").map((a) => a.at(-2)!).join(",");
  assert.doesNotMatch(gets, /refquota|quota|mountpoint|canmount|mounted/);
});

/**
 * Node "n2" stands by for the follow zvol "pg", which "n1" holds with the head at 2 (1 ← 2 in
 * the store): `zfs receive` makes each stream's snapshot, and a full one its zvol.
 */
async function standbySetup(servesZvols = true) {
  const pending: SnapshotManifest[] = [];
  let txg = 100;
  const h = followHarness({
    node: "n2",
    receive: (argv, pool) => {
      const target = argv.at(-1)!;
      const m = pending.shift();
      if (!m) return { code: 1, stderr: "no receive expected" };
      if (!pool.has(target)) {
        addZvol(pool, target, {});
        pool.setValue(target, "volsize", [String(m.capacityBytes), "received"]);
      }
      pool.add(`${target}@${m.snapshot}`, { guid: m.guid, createtxg: String(++txg) });
      return {};
    },
  });
  const follow = new FollowVolumes(h.deps);
  const standby = new StandbyFollower({
    ...h.copyDeps,
    locks: new KeyedLock(),
    copies: follow,
    intervalSeconds: 60,
    servesZvols: () => Promise.resolve(servesZvols),
  });
  await createFollowOwner(h.store, { settings: zvolSettings(2 * GiB), standbys: ["n2"] });
  await writeMarkers(h.store, "pg", "pg", ["n2"]);
  const chain = [manifest("1", null, EXT4), manifest("2", "1", EXT4)];
  await storeManifests(h.store, chain, { stream: (m) => bytesOf(m.guid) });
  const held = await holdAs(h.store, "n1");
  await moveHead(h.store, "pg", held, { guid: "2", createdAt: chain[1]!.createdAt }, 0);
  return { ...h, standby, pending, chain };
}

Deno.test("a standby receives a follow zvol in full with its reservation and format record, and its increments with no unmount and no volsize set on the read-only copy", async () => {
  const s = await standbySetup();
  s.pending.push(...s.chain);
  assert.equal((await s.standby.tick()).received?.kind, "full");
  assert.equal(s.pool.value(DS, "type"), "volume");
  assert.equal(s.pool.value(DS, "readonly"), "on");
  assert.equal(s.pool.value(DS, "refreservation"), "auto");
  assert.equal(s.pool.value(DS, "org.zfs-csi:format"), "done", "the head says formatted");
  assert.equal(s.pool.value(DS, FOLLOW_RELEASED_PROPERTY), "2");
  assert.equal(s.pool.value(DS, "canmount"), undefined);
  // The holder stores 3 (the volume was grown meanwhile): the increment brings its volsize;
  // zfs would refuse to set one on the read-only copy, and the standby sets none.
  const m3 = manifest("3", "2", EXT4);
  await storeManifests(s.store, [m3], { stream: (m) => bytesOf(m.guid) });
  const owner = (await readOwner(s.store, "pg"))!;
  await moveHead(s.store, "pg", owner, { guid: "3", createdAt: m3.createdAt }, 0);
  s.pool.setValue(DS, "volsize", [String(GiB), "received"]);
  s.pending.push(m3);
  assert.equal((await s.standby.tick()).received?.kind, "increment");
  assert.equal(s.pool.value(DS, FOLLOW_RELEASED_PROPERTY), "3");
  assert.equal(s.pool.value(DS, "readonly"), "on");
  assert.deepEqual(
    s.runner.argvs.filter((a) => a[1] === "set" && a.some((kv) => kv.startsWith("volsize="))),
    [],
  );
  assertNoDatasetOnly(s.runner.argvs);
});

Deno.test("a standby that serves no zvols (zfs-fuse, no --block-volumes) keeps no copy of a follow zvol", async () => {
  const s = await standbySetup(false);
  s.pending.push(...s.chain);
  assert.equal((await s.standby.tick()).received, undefined);
  assert.match(s.standby.state("pg")?.note ?? "", /serves no zvols/);
  assert.equal(s.pool.has(DS), false);
  assert.equal(s.pending.length, 2, "nothing received");
});

Deno.test("a standby leaves a diverged zvol copy alone while a stage here marks it attached", async () => {
  const s = await standbySetup();
  addZvol(s.pool, DS, {
    "org.zfs-csi:managed": "yes",
    [FOLLOW_GENERATION_PROPERTY]: "1",
    [FOLLOW_RELEASED_PROPERTY]: "fenced",
    "org.zfs-csi:attached": "n2",
    readonly: "on",
  });
  assert.equal((await s.standby.tick()).received, undefined);
  assert.match(s.standby.state("pg")?.error ?? "", /diverged.*still staged here/);
  assert.ok(s.pool.has(DS));
  assertNoDatasetOnly(s.runner.argvs);
});

Deno.test("no scheduled backup of a follow copy while a NodeStage of it runs here, up to its mount", async () => {
  const h = followHarness();
  h.pool.serveCreates(h.runner, { version: "zfs-2.2.2-1" });
  const follow = new FollowVolumes(h.deps);
  await createFollowOwner(h.store, { settings: zvolSettings() });
  let ran = 0;
  const backup = () =>
    follow.scheduledBackup(DS, { skipIfBusy: true }, () => {
      ran++;
      return Promise.resolve({ status: "busy" });
    });
  let during: unknown;
  await follow.stage({ name: "pg", dataset: DS, asZvol: { content: "ext4" } }, async () => {
    // The zvol's filesystem is made here (node_zvol.ts): a snapshot now would be unformatted.
    during = await backup();
  });
  assert.deepEqual(during, { status: "busy" });
  assert.equal(ran, 0);
  await backup();
  assert.equal(ran, 1, "backed up once the stage is done");
  assertNoDatasetOnly(h.runner.argvs);
});
