import assert from "node:assert/strict";
import { backupHarness, PARENT } from "../../tests/support/backup_harness.ts";
import { FakeStreamRunner } from "../../tests/support/fake_stream_runner.ts";
import { BackupScheduler } from "../replicate/scheduler.ts";
import { StoredSnapshots } from "./stored_snapshots.ts";
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
  const snapshots = new StoredSnapshots({
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
  });
  return { h, snapshots };
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
