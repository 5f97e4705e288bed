import assert from "node:assert/strict";
import { backupHarness, PARENT } from "../../tests/support/backup_harness.ts";
import { FakeStreamRunner } from "../../tests/support/fake_stream_runner.ts";
import { BackupScheduler } from "../replicate/scheduler.ts";
import { encodeJson, parseManifest } from "../store/chain.ts";
import { StoredSnapshots, type StoredSnapshotsDeps } from "./stored_snapshots.ts";
import { Trash } from "./trash.ts";

/** StoredSnapshots over the backup harness; every `.stored-*` snapshot refers to `referenced`. */
function stored(referenced: string) {
  const h = backupHarness();
  const { zfs, store, locks, log } = h.deps;
  h.pool.hook = (argv) => {
    for (const name of argv) {
      if (name.includes("@.stored-") && h.pool.has(name)) {
        h.pool.setValue(name, "referenced", referenced);
      }
    }
    return undefined;
  };
  const scheduler = new BackupScheduler({
    zfs,
    parentDataset: PARENT,
    log,
    backup: () => Promise.reject(new Error("no scheduled backups here")),
  });
  const deps: StoredSnapshotsDeps = {
    zfs,
    store,
    parentDataset: PARENT,
    nodeId: "node-1",
    locks,
    trash: new Trash({ zfs, parentDataset: PARENT, retentionSeconds: 0, locks, log }),
    scheduler,
    backup: h.deps,
    receive: {
      streams: new FakeStreamRunner(() => ({ code: 1, stderr: "no receives here" })),
      zfsPath: "zfs",
      zfs,
      store,
      log,
    },
    log,
  };
  return { h, snapshots: new StoredSnapshots(deps), deps };
}

Deno.test("CreateSnapshot to the store answers the volume's size at the snapshot, not the stream's", async () => {
  const { h, snapshots } = stored("314572800");
  const dataset = h.volume("pg");
  const first = await snapshots.create(dataset, "pg", "monday", "monday");
  assert.equal(first.ready, true);
  assert.equal(first.sizeBytes, 314572800);
  const second = await snapshots.create(dataset, "pg", "tuesday", "tuesday");
  assert.equal(second.ready, true);
  const stream = h.sends.at(-1)!;
  assert.ok(stream.base !== undefined, "the second is an increment");
  assert.equal(second.sizeBytes, 314572800, "not the increment's bytes");
  // Asked again: the same answer, from the store.
  assert.equal((await snapshots.create(dataset, "pg", "tuesday", "tuesday")).sizeBytes, 314572800);
});

Deno.test("ListSnapshots answers a stored snapshot's size at the snapshot, recorded in its manifest", async () => {
  const { h, snapshots, deps } = stored("314572800");
  const dataset = h.volume("pg");
  await snapshots.create(dataset, "pg", "monday", "monday");
  await snapshots.create(dataset, "pg", "tuesday", "tuesday");
  const listed = await snapshots.list("pg");
  assert.equal(listed.length, 2);
  assert.deepEqual(listed.map((e) => e.sizeBytes), [314572800, 314572800], "not the streams'");
  // A plugin that knows only the store (restarted, another node) answers the same.
  h.pool.hook = undefined;
  for (const name of h.pool.names()) {
    if (name.includes("@")) h.pool.setValue(name, "referenced", "1");
  }
  const restarted = new StoredSnapshots(deps);
  assert.deepEqual((await restarted.list("pg")).map((e) => e.sizeBytes), [314572800, 314572800]);
});

Deno.test("ListSnapshots of a manifest written before sizes were recorded: its chain's streams, at most the capacity", async () => {
  const { h, snapshots } = stored("314572800");
  const dataset = h.volume("pg", { refquota: "1000" });
  await snapshots.create(dataset, "pg", "monday", "monday");
  await snapshots.create(dataset, "pg", "tuesday", "tuesday");
  const manifests = h.store.keys().filter((k) => /\/snapshots\/[0-9a-f]{16}\.json$/.test(k));
  let full = 0;
  let increment = 0;
  for (const key of manifests) {
    const { referencedBytes: _, ...older } = parseManifest(h.store.peek(key)!);
    if (older.baseGuid === null) full = older.size;
    else increment = older.size;
    await h.store.putBytes(key, encodeJson(older));
  }
  assert.ok(full > 0 && increment > 0, "one full stream, one increment");
  const sizes = (await snapshots.list("pg")).map((e) => e.sizeBytes).sort((a, b) => a - b);
  assert.deepEqual(sizes, [full, full + increment]);
  // The volume's refquota at the snapshot bounds it.
  for (const key of manifests) {
    const m = parseManifest(h.store.peek(key)!);
    await h.store.putBytes(key, encodeJson({ ...m, capacityBytes: 30 }));
  }
  assert.deepEqual((await snapshots.list("pg")).map((e) => e.sizeBytes), [30, 30]);
});
