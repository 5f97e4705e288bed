/**
 * DeletedCopySweep on a fake pool, the real trash and the in-memory store: a released copy of a
 * deleted follow volume is set aside (renamed `.deleted-…` and marked, never destroyed with a
 * retention); copies of volumes not deleted, of another uid, mounted, held here, being staged,
 * or whose owner cannot be read stay as they are; one owner read per local follow copy.
 * tests/integration/follow_sweep_test.ts does it with real zfs and two plugins.
 */

import assert from "node:assert/strict";
import { FakePool } from "../../tests/support/fake_pool.ts";
import { FakeRunner, fakeTools } from "../../tests/support/fake_runner.ts";
import { MemoryStore } from "../../tests/support/memory_store.ts";
import { Trash } from "../volume/trash.ts";
import { KeyedLock } from "../lock.ts";
import { STORE_UID_PROPERTY } from "../replicate/backup.ts";
import { type Store, StoreError } from "../store/store.ts";
import { ownerKey } from "../store/layout.ts";
import { DELETED_NAME_PROPERTY } from "../zfs/names.ts";
import { FOLLOW_GENERATION_PROPERTY, FOLLOW_RELEASED_PROPERTY } from "./copy.ts";
import { CopyGate } from "./gate.ts";
import { createOwner, markDeleted } from "./owner.ts";
import { DeletedCopySweep } from "./sweep.ts";

const PARENT = "tank/nomad";
const UID = "a".repeat(32);

/** A store that counts reads, and fails them all while `down` is set. */
class CountingStore extends MemoryStore {
  reads: string[] = [];
  down = false;

  override getBytes(key: string) {
    this.reads.push(key);
    if (this.down) return Promise.reject(new StoreError("unavailable", "store is down"));
    return super.getBytes(key);
  }
}

function setup() {
  const runner = new FakeRunner();
  const pool = new FakePool(runner);
  const { zfs, mounter, log } = fakeTools(runner);
  const store = new CountingStore();
  const locks = new KeyedLock();
  const trash = new Trash({ zfs, parentDataset: PARENT, retentionSeconds: 3600, locks, log });
  const gate = new CopyGate();
  pool.add(PARENT, { "org.zfs-csi:managed": ["yes", "local"] });
  const sweep = new DeletedCopySweep({
    zfs,
    store,
    locks,
    trash,
    log,
    parentDataset: PARENT,
    gate,
    inUse: async (dataset) => (await mounter.table()).some((e) => e.source === dataset),
    intervalSeconds: 60,
  });
  return { pool, store, sweep, gate };
}

/** A follow volume in the store, deleted unless `deleted` is false. */
async function volume(store: Store, name: string, opts: { deleted?: boolean; uid?: string } = {}) {
  await createOwner(store, name, {
    volume: name,
    uid: opts.uid ?? UID,
    ttlSeconds: 30,
    settings: { capacityBytes: 0, properties: {} },
    nowMs: 0,
  });
  if (opts.deleted !== false) await markDeleted(store, name, 1000);
}

/** A released warm copy on this node (or a held one with `released = "none"`). */
function copy(pool: FakePool, name: string, released = "7", uid = UID): string {
  const dataset = `${PARENT}/${name}`;
  pool.add(dataset, {
    "org.zfs-csi:managed": "yes",
    [FOLLOW_GENERATION_PROPERTY]: "2",
    [FOLLOW_RELEASED_PROPERTY]: released,
    [STORE_UID_PROPERTY]: uid,
    readonly: "on",
  });
  pool.add(`${dataset}@.backup-7`, { guid: "7", createtxg: "10" });
  return dataset;
}

function setAsideNames(pool: FakePool): string[] {
  return pool.names().filter((n) => n.startsWith(`${PARENT}/.deleted-`) && !n.includes("@"));
}

Deno.test("sweep sets a released copy of a deleted follow volume aside, with its snapshots", async () => {
  const s = await setup();
  await volume(s.store, "pg");
  const ds = copy(s.pool, "pg");
  s.store.reads = [];
  const report = await s.sweep.sweep();
  assert.deepEqual(report, { checked: ["pg"], setAside: ["pg"], kept: [] });
  assert.equal(s.pool.has(ds), false, "the copy is no longer under its volume's name");
  const aside = setAsideNames(s.pool);
  assert.equal(aside.length, 1);
  assert.equal(s.pool.value(aside[0]!, DELETED_NAME_PROPERTY), ds, "undo recipe: its old name");
  assert.ok(s.pool.has(`${aside[0]}@.backup-7`), "nothing destroyed: its snapshot went along");
  assert.deepEqual(s.store.reads, [ownerKey("pg")], "one owner read for one copy");
});

Deno.test("sweep leaves copies of volumes that are not deleted, and reads nothing for other datasets", async () => {
  const s = await setup();
  await volume(s.store, "live", { deleted: false });
  const live = copy(s.pool, "live");
  // A node-local volume (no follow generation), and a dataset that is not the plugin's.
  s.pool.add(`${PARENT}/local`, { "org.zfs-csi:managed": "yes" });
  s.pool.add(`${PARENT}/foreign`, { [FOLLOW_GENERATION_PROPERTY]: "2" });
  s.store.reads = [];
  const report = await s.sweep.sweep();
  assert.deepEqual(report, { checked: ["live"], setAside: [], kept: [] });
  assert.ok(s.pool.has(live));
  assert.ok(s.pool.has(`${PARENT}/local`) && s.pool.has(`${PARENT}/foreign`));
  assert.deepEqual(s.store.reads, [ownerKey("live")]);
  assert.deepEqual(setAsideNames(s.pool), []);
});

Deno.test("sweep never touches a copy held here, and does not even read its owner", async () => {
  const s = await setup();
  await volume(s.store, "pg");
  const ds = copy(s.pool, "pg", "none");
  s.store.reads = [];
  const report = await s.sweep.sweep();
  assert.deepEqual(report, { checked: [], setAside: [], kept: [] });
  assert.ok(s.pool.has(ds));
  assert.deepEqual(s.store.reads, []);
});

Deno.test("sweep leaves a mounted copy of a deleted volume alone, and sets it aside once unmounted", async () => {
  const s = await setup();
  await volume(s.store, "pg");
  const ds = copy(s.pool, "pg", "fenced");
  s.pool.mounts = [[ds, "/srv/staging/pg"]];
  const first = await s.sweep.sweep();
  assert.deepEqual(first.setAside, []);
  assert.deepEqual(first.kept, [{ name: "pg", why: "it is mounted on this node" }]);
  assert.ok(s.pool.has(ds));
  s.pool.mounts = [];
  const second = await s.sweep.sweep();
  assert.deepEqual(second.setAside, ["pg"]);
  assert.equal(s.pool.has(ds), false);
});

Deno.test("sweep changes nothing when the store cannot be read, or has no owner object", async () => {
  const s = await setup();
  await volume(s.store, "pg");
  const ds = copy(s.pool, "pg");
  const orphan = copy(s.pool, "orphan");
  s.store.down = true;
  const report = await s.sweep.sweep();
  assert.deepEqual(report.setAside, []);
  assert.deepEqual(report.kept.map((k) => k.name), ["orphan", "pg"].sort());
  assert.ok(s.pool.has(ds) && s.pool.has(orphan));
  s.store.down = false;
  const again = await s.sweep.sweep();
  assert.deepEqual(again.setAside, ["pg"], "only the one whose owner says deleted");
  assert.ok(s.pool.has(orphan), "no owner object: not clearly deleted, left alone");
});

Deno.test("sweep leaves a copy made from another volume of the same name (another uid)", async () => {
  const s = await setup();
  await volume(s.store, "pg", { uid: "b".repeat(32) });
  const ds = copy(s.pool, "pg");
  const report = await s.sweep.sweep();
  assert.deepEqual(report.setAside, []);
  assert.equal(report.kept.length, 1);
  assert.match(report.kept[0]!.why, /uid a{32}.*uid b{32}/);
  assert.ok(s.pool.has(ds));
});

Deno.test("sweep waits for its turn: a copy being staged or released here stays this time", async () => {
  const s = await setup();
  await volume(s.store, "pg");
  const ds = copy(s.pool, "pg");
  let during: Awaited<ReturnType<DeletedCopySweep["sweep"]>> | undefined;
  await s.gate.exclusive(ds, async () => {
    during = await s.sweep.sweep();
  });
  assert.deepEqual(during?.kept, [{
    name: "pg",
    why: "a stage or release of it runs on this node",
  }]);
  assert.ok(s.pool.has(ds));
  assert.deepEqual((await s.sweep.sweep()).setAside, ["pg"]);
});

Deno.test("sweep sets a deleted follow zvol's copy aside as a dataset's, and leaves one a stage here marks attached", async () => {
  const s = await setup();
  for (const name of ["pg", "db"]) {
    await volume(s.store, name);
    const ds = copy(s.pool, name, "fenced");
    s.pool.setValue(ds, "type", "volume");
    s.pool.setValue(ds, "mountpoint", ["-", "-"]);
  }
  // A zvol's filesystem or bound device shows in no mount table as the dataset: the mark does.
  s.pool.setValue(`${PARENT}/db`, "org.zfs-csi:attached", "n1");
  const report = await s.sweep.sweep();
  assert.deepEqual(report.setAside, ["pg"]);
  assert.deepEqual(report.kept, [{
    name: "db",
    why: 'it is staged on this node (attached to "n1")',
  }]);
  assert.equal(s.pool.has(`${PARENT}/pg`), false);
  assert.equal(setAsideNames(s.pool).length, 1);
  assert.ok(s.pool.has(`${PARENT}/db`));
});
