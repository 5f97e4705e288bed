/**
 * Host volumes' backups to the store (the config's `--store`), as CSI volumes have them. The
 * host volume plugin runs once per call and schedules nothing: create records the schedule on
 * the dataset exactly as CreateVolume does, and the zfs-csi server on the node (same parent
 * dataset, same store) backs the volume up with its CSI volumes (src/replicate/scheduler.ts),
 * under the host volume's own store key (names.ts hostStoreName). Delete marks the volume's
 * store record deleted, as DeleteVolume does, so its backups stay for the deleted retention.
 */

import type { Config } from "../config.ts";
import { Code, CsiError } from "../errors.ts";
import type { Logger } from "../log.ts";
import { BACKUP_PARAMETERS, type VolumeParameters } from "../csi/parameters.ts";
import {
  BACKUP_INTERVAL_PROPERTY,
  BACKUP_KEEP_PROPERTY,
  STORE_UID_PROPERTY,
} from "../replicate/local.ts";
import { updateRecord } from "../replicate/records.ts";
import { parseVolumeRecord } from "../store/chain.ts";
import { volumeRecordKey } from "../store/layout.ts";
import { formatKeepPolicy } from "../store/policy.ts";
import { type Store, StoreError } from "../store/store.ts";
import { encodeComponent } from "../zfs/names.ts";
import type { Zfs } from "../zfs/zfs.ts";
import { hostStoreName } from "./names.ts";

/**
 * The backup properties a new host volume's dataset gets: its `backup_interval` (an explicit 0
 * too) and `backup_keep`, as CreateVolume records them; never the config's defaults, which the
 * node plugin's scheduler applies to every volume without its own (written here, they would
 * stay the volume's own when the defaults change). None without a store.
 * @throws {CsiError} INVALID_ARGUMENT for backup parameters without a store, or a volume whose
 *   name cannot be a store key
 */
export function hostBackupProperties(
  config: Config,
  dataset: string,
  params: VolumeParameters,
): Record<string, string> {
  const store = config.store;
  if (!store) {
    if (!params.backup) return {};
    throw new CsiError(
      Code.INVALID_ARGUMENT,
      `Parameters ${BACKUP_PARAMETERS.interval} and ${BACKUP_PARAMETERS.keep} need a store, ` +
        `and the host volume plugin's config has none (add --store to zfs-csi.conf, the same ` +
        `as the zfs-csi node plugin's on this node)`,
    );
  }
  const interval = params.backup?.intervalSeconds;
  // Refused now rather than by every scheduled backup later.
  if ((interval ?? store.defaultBackupIntervalSeconds) > 0) {
    hostStoreName(config.parentDataset, dataset);
  }
  const props: Record<string, string> = {};
  if (interval !== undefined) props[BACKUP_INTERVAL_PROPERTY] = String(interval);
  if (params.backup?.keep) props[BACKUP_KEEP_PROPERTY] = formatKeepPolicy(params.backup.keep);
  return props;
}

/** What {@linkcode keepHostBackups} works with. */
export interface KeepBackupsDeps {
  readonly zfs: Zfs;
  readonly parentDataset: string;
  /** Opens the config's store (only when the volume has backups). */
  readonly openStore: () => Promise<Store>;
  readonly log: Logger;
  /** Milliseconds since the epoch; replaceable in tests. */
  readonly now?: () => number;
}

/**
 * Before a host volume goes: marks its store record deleted (`deletedAt`), so its backups stay
 * for the store's deleted retention, then go with the pruner. Only the record of the dataset's
 * own uid; a dataset never backed up has none. A store that cannot be reached does not stop the
 * delete (the backups then stay until an operator removes them); the log says so.
 * @returns whether the record was marked
 * @throws {ZfsError} when zfs fails
 */
export async function keepHostBackups(deps: KeepBackupsDeps, dataset: string): Promise<boolean> {
  const props = await deps.zfs.getProperties(dataset, [STORE_UID_PROPERTY]);
  const uid = props?.get(STORE_UID_PROPERTY);
  if (!uid || uid.source !== "local") return false;
  const name = hostStoreName(deps.parentDataset, dataset);
  const key = volumeRecordKey(encodeComponent("Volume name", name));
  const deletedAt = new Date((deps.now ?? Date.now)()).toISOString();
  let store: Store | undefined;
  try {
    store = await deps.openStore();
    const marked = await updateRecord(store, key, "while a backup wrote it; try again", (bytes) => {
      if (!bytes) return { result: false };
      const { deletedAt: was, ...record } = parseVolumeRecord(bytes);
      if (record.uid !== uid.value || was !== undefined) return { result: false };
      return { write: { ...record, deletedAt }, result: true };
    });
    if (marked) {
      deps.log.info("host volume's backups kept in the store for its deleted retention", {
        dataset,
        record: key,
        store: store.description,
      });
    }
    return marked;
  } catch (err) {
    if (!(err instanceof StoreError || err instanceof SyntaxError)) throw err;
    deps.log.warn("could not mark the host volume's backups deleted; they stay in the store", {
      dataset,
      record: key,
      ...(store ? { store: store.description } : {}),
      error: err,
    });
    return false;
  }
}
