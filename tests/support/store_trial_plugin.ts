/**
 * The plugin under test of the store's crash and fault trials (tests/integration/
 * store_crash_test.ts and store_faults_test.ts): started on a test pool with a store under test,
 * and stopped with a volume made due for a backup, so that the next start backs it up.
 */

import { PluginProcess } from "./plugin_process.ts";
import type { StoreUnderTest } from "./store_trials.ts";
import { sh, type TestPool } from "./zfs_pool.ts";

/** The property where the plugin keeps when a volume was last backed up. */
export const BACKUP_LAST = "org.zfs-csi:backup-last";

/**
 * Starts the plugin on `pool`'s parent dataset with `sut`'s store, its flags, permission scope
 * and environment; a deleted volume is destroyed at once (`--deleted-retention 0`), so that a
 * trial can check that nothing is left.
 */
export function startWithStore(
  pool: TestPool,
  sut: StoreUnderTest,
  nodeId: string,
): Promise<PluginProcess> {
  return PluginProcess.start({
    parentDataset: pool.parent,
    dir: pool.dir,
    nodeId,
    extraArgs: [...sut.plugin.extraArgs ?? [], "--deleted-retention", "0"],
    ...(sut.plugin.scope ? { scope: sut.plugin.scope } : {}),
    ...(sut.plugin.env ? { env: sut.plugin.env } : {}),
  });
}

/**
 * Stops `plugin` (SIGTERM) and makes `dataset` due for a backup by hand (backup-last=0): the
 * scheduler's first tick after the next start backs it up, whether or not a tick of the stopped
 * plugin backed it up already.
 */
export async function stopWithBackupDue(plugin: PluginProcess, dataset: string): Promise<void> {
  await plugin.stop("SIGTERM");
  await sh("zfs", "set", `${BACKUP_LAST}=0`, dataset);
}
