/**
 * Backup snapshot names on real ZFS (zfs-fuse on the test machines): six backups of one volume
 * within one second (the plugin's clock held still), each pruning the store by the keep policy
 * and the node's older `.backup-*` snapshots, leave a chain whose snapshot names all differ, and
 * a node without a copy (another pool) receives that chain in full, with the last backup's data.
 *
 * Before the names carried a sequence number, `.backup-<seconds>` was free again once the local
 * prune had destroyed it, so a later backup of the same second took it again, the chain held
 * two snapshots of one name, and the full receive failed with zfs's "destination ... exists".
 * OpenZFS behaves the same here (a receive never renames a snapshot it brings).
 */

import assert from "node:assert/strict";
import { KeyedLock } from "../../src/lock.ts";
import { Logger } from "../../src/log.ts";
import { type BackupDeps, backupVolume } from "../../src/replicate/backup.ts";
import { readManifests } from "../../src/replicate/records.ts";
import { restoreVolume } from "../../src/replicate/restore.ts";
import { sendToStore } from "../../src/replicate/send.ts";
import { DenoCommandRunner, DenoStreamRunner } from "../../src/run.ts";
import { chainTo, latest } from "../../src/store/chain.ts";
import { FileStore } from "../../src/store/file_store.ts";
import { Zfs } from "../../src/zfs/zfs.ts";
import { sh, TestPool, tryRun } from "../support/zfs_pool.ts";

const log = new Logger("error", {}, () => {});
/** The one second every backup of the test is taken in (2026-03-01T12:00:00Z). */
const NOW_MS = Date.UTC(2026, 2, 1, 12);

Deno.test("backups within one second leave a chain that a node without a copy receives in full", async () => {
  await using src = await TestPool.create();
  await using dst = await TestPool.create();
  await Deno.mkdir(`${src.dir}/store`);
  const store = new FileStore(`${src.dir}/store`);
  const zfs = new Zfs(new DenoCommandRunner(), {
    zfsPath: "zfs",
    zpoolPath: "zpool",
    timeoutMs: 60_000,
    log,
  });
  const streams = new DenoStreamRunner();
  const dataset = `${src.parent}/pg`;
  await sh(
    "zfs",
    "create",
    "-o",
    "org.zfs-csi:managed=yes",
    "-o",
    "org.zfs-csi:backup-keep=last=1",
    dataset,
  );
  const deps: BackupDeps = {
    zfs,
    store,
    send: (spec) => sendToStore({ streams, zfsPath: "zfs", store, log }, spec),
    locks: new KeyedLock(),
    log,
    parentDataset: src.parent,
    node: "node-a",
    // Chains of three: the second chain's backups prune the first from the store.
    maxChainLength: 3,
    now: () => NOW_MS,
    cache: new Map(),
  };
  const file = `${src.mountRoot}/nomad/pg/counter`;
  const taken: string[] = [];
  let pruned = 0;
  for (let i = 1; i <= 6; i++) {
    await Deno.writeTextFile(file, `write ${i}\n`);
    const out = await backupVolume(deps, dataset);
    assert.equal(out.status, "stored");
    if (out.status !== "stored") return;
    taken.push(out.manifest.snapshot);
    pruned += out.pruned.length;
  }
  assert.equal(new Set(taken).size, 6, `six names: ${taken.join(", ")}`);
  assert.ok(pruned > 0, "the keep policy pruned the first chain");
  const { manifests } = await readManifests(store, "pg", log);
  const chain = chainTo(manifests, latest(manifests)!.guid);
  assert.ok(chain.length >= 2, `a chain of ${chain.length}`);
  const names = chain.map((m) => m.snapshot);
  assert.equal(new Set(names).size, names.length, `one name per snapshot: ${names.join(", ")}`);

  const target = `${dst.parent}/pg`;
  await restoreVolume(
    { streams, zfsPath: "zfs", zfs, store, log },
    { parentDataset: dst.parent, chain, target, properties: [] },
  );
  const received = (await sh("zfs", "list", "-H", "-t", "snapshot", "-o", "name", "-r", target))
    .split("\n").filter((l) => l !== "").map((l) => l.slice(target.length + 1));
  assert.deepEqual(received, names, "every snapshot of the chain, in one dataset");
  await sh("zfs", "mount", target);
  try {
    const mountpoint = (await sh("zfs", "get", "-H", "-o", "value", "mountpoint", target)).trim();
    assert.equal(await Deno.readTextFile(`${mountpoint}/counter`), "write 6\n");
  } finally {
    await tryRun("zfs", "unmount", target);
  }
});
