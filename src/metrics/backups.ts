/**
 * Backup metrics, taken where plugin.ts hands the store's work its functions: every stream
 * stored (scheduled backups and snapshots a user asked to store) adds its bytes, and every
 * scheduled backup counts as stored or failed.
 */

import type { BackupOptions, BackupOutcome } from "../replicate/backup.ts";
import type { SendToStoreSpec, SentStream } from "../replicate/send.ts";
import { volumeForDataset } from "../zfs/names.ts";
import type { Activity } from "./activity.ts";

/** The volume label of a dataset or snapshot below `parent`: the volume's name, else the name. */
export function volumeLabel(parent: string, name: string): string {
  const dataset = name.split("@")[0]!;
  return volumeForDataset(parent, dataset) ?? dataset;
}

/** `send`, adding each stored stream's size to `zfs_csi_backup_sent_bytes_total`. */
export function meteredSend(
  send: (spec: SendToStoreSpec) => Promise<SentStream>,
  activity: Activity,
  parent: string,
): (spec: SendToStoreSpec) => Promise<SentStream> {
  return async (spec) => {
    const sent = await send(spec);
    activity.observeSent(volumeLabel(parent, spec.snapshot), sent.size);
    return sent;
  };
}

/** `backup`, counting each scheduled backup that ends in `zfs_csi_backups_total`. */
export function meteredBackup(
  backup: (dataset: string, options: BackupOptions) => Promise<BackupOutcome>,
  activity: Activity,
  parent: string,
): (dataset: string, options: BackupOptions) => Promise<BackupOutcome> {
  return async (dataset, options) => {
    const volume = volumeLabel(parent, dataset);
    try {
      const outcome = await backup(dataset, options);
      if (outcome.status === "stored") activity.observeBackup(volume, "stored");
      return outcome;
    } catch (err) {
      // Stopping the plugin aborts a backup: that is not the volume's failure.
      if (!options.signal?.aborted) activity.observeBackup(volume, "failed");
      throw err;
    }
  };
}
