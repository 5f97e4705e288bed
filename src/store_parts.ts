/**
 * The plugin's store side, with `--store`: backups and their schedule, pruning, stored
 * snapshots, volumes that follow their job and standby copies. src/plugin.ts loads this module
 * only when a store is configured, so a plugin without one does not load these modules at start.
 */

import type { Config } from "./config.ts";
import { StoredSnapshots } from "./csi/stored_snapshots.ts";
import type { Trash } from "./volume/trash.ts";
import { headGuard } from "./follow/head.ts";
import type { FollowVolumes } from "./follow/mover.ts";
import { SizedFollowVolumes } from "./follow/resize.ts";
import { StandbyFollower } from "./follow/standby.ts";
import type { KeyedLock } from "./lock.ts";
import type { Logger } from "./log.ts";
import type { Activity } from "./metrics/activity.ts";
import { meteredBackup, meteredSend } from "./metrics/backups.ts";
import { openStore } from "./store/open.ts";
import { type BackupDeps, backupVolume } from "./replicate/backup.ts";
import { StorePruner } from "./replicate/prune.ts";
import type { ReceiveDeps } from "./replicate/receive.ts";
import { BackupScheduler, type SchedulerDeps } from "./replicate/scheduler.ts";
import { sendToStore } from "./replicate/send.ts";
import { DenoStreamRunner, ObservedStreamRunner, type StreamRunner } from "./run.ts";
import { FileStore } from "./store/file_store.ts";
import { ConditionalGuardStore, ConditionalWrites } from "./store/conditional.ts";
import { BoundedStore } from "./store/wait.ts";
import type { Zfs } from "./zfs/zfs.ts";

/** The store's background work and its CSI side, with `--store`. */
export interface StoreParts {
  readonly stored: StoredSnapshots;
  readonly scheduler: BackupScheduler;
  readonly pruner: StorePruner;
  /** Volumes that follow their job: their moves, head and lease (src/follow/). */
  readonly follow: FollowVolumes;
  /** Warm copies of the follow volumes naming this node a standby; absent when off. */
  readonly standby?: StandbyFollower;
  /**
   * Whether the store enforces conditional writes, which follow volumes need: their store
   * refuses every conditional write until it is known to (src/store/conditional.ts).
   */
  readonly conditionalWrites: ConditionalWrites;
}

/** The store's parts for the plugin, or undefined without `--store`. */
export function storeParts(
  config: Config,
  deps: { zfs: Zfs; locks: KeyedLock; trash: Trash; log: Logger; activity?: Activity },
): StoreParts | undefined {
  if (!config.store) return undefined;
  const opened = openStore(config.store);
  // Every CSI call waits for the store at most --store-wait in all (src/store/wait.ts).
  const store = new BoundedStore(opened, { limitMs: config.store.waitSeconds * 1000 });
  // Volumes that follow their job need conditional writes the server enforces: an S3 server is
  // probed (src/plugin.ts starts it), the directory store enforces them by construction. A call
  // that waits for the probe takes the wait from its own budget.
  const conditionalWrites = new ConditionalWrites({
    store: opened,
    probe: { node: config.nodeId, bucket: config.store.kind === "s3" },
    enforced: opened instanceof FileStore,
    waitAs: (what, fn) => store.current()?.request(what, fn) ?? fn(),
  });
  const followStore = new ConditionalGuardStore(store, conditionalWrites);
  const log = deps.log.child({ store: store.description });
  const activity = deps.activity;
  const parent = config.parentDataset;
  const streams: StreamRunner = activity
    ? new ObservedStreamRunner(new DenoStreamRunner(), (e) => activity.observeCommand(e))
    : new DenoStreamRunner();
  const send: BackupDeps["send"] = (spec) =>
    sendToStore({ streams, zfsPath: config.zfsPath, store, log, zfs: deps.zfs }, spec);
  const backup: BackupDeps = {
    zfs: deps.zfs,
    store,
    send: activity ? meteredSend(send, activity, parent) : send,
    locks: deps.locks,
    log,
    parentDataset: config.parentDataset,
    node: config.nodeId,
    defaultKeep: config.store.defaultBackupKeep,
    cache: new Map(),
    // A volume that follows its job is pruned only by its holder, never its head's chain.
    protect: (volumeKey, manifests) => headGuard(store, config.nodeId, volumeKey, manifests),
  };
  const receive: ReceiveDeps = { streams, zfsPath: config.zfsPath, zfs: deps.zfs, store, log };
  // Each stage also gives the copy the size the store records (expanded since it was made).
  const follow = new SizedFollowVolumes({
    zfs: deps.zfs,
    store: followStore,
    locks: deps.locks,
    trash: deps.trash,
    log: log.child({ part: "follow" }),
    parentDataset: config.parentDataset,
    node: config.nodeId,
    receive,
    backup: (dataset, options) => backupVolume(backup, dataset, options),
    ...(config.follow
      ? {
        ttlSeconds: config.follow.leaseTtlSeconds,
        ...(config.follow.takeoverAfterSeconds === undefined
          ? {}
          : { takeoverAfterMs: config.follow.takeoverAfterSeconds * 1000 }),
      }
      : {}),
  });
  const standbyInterval = config.follow?.standbyIntervalSeconds;
  const standby = standbyInterval === undefined ? undefined : new StandbyFollower({
    zfs: deps.zfs,
    store: followStore,
    locks: deps.locks,
    trash: deps.trash,
    log: log.child({ part: "standby" }),
    parentDataset: config.parentDataset,
    node: config.nodeId,
    receive,
    copies: follow,
    intervalSeconds: standbyInterval,
    servesZvols: async () => config.blockVolumes && await deps.zfs.canMakeZvols(),
  });
  // A volume that follows its job is backed up in turn with its stage and release, and the
  // stored snapshot becomes its head (src/follow/mover.ts).
  const scheduled: SchedulerDeps["backup"] = (dataset, options) =>
    follow.scheduledBackup(dataset, options, (o) => backupVolume(backup, dataset, o));
  const scheduler = new BackupScheduler({
    zfs: deps.zfs,
    parentDataset: config.parentDataset,
    log,
    backup: activity ? meteredBackup(scheduled, activity, parent) : scheduled,
    // Volumes that chose no interval, made before --backup-interval was set or after.
    defaultIntervalSeconds: config.store.defaultBackupIntervalSeconds,
  });
  const pruner = new StorePruner({
    store,
    log,
    node: config.nodeId,
    deletedRetentionMs: config.store.deletedRetentionSeconds * 1000,
    // Parts of uploads a crash cut short (S3 aborts them by the bucket's lifecycle rule).
    ...(opened instanceof FileStore ? { cleanTemp: () => opened.cleanTemp() } : {}),
  });
  const stored = new StoredSnapshots({
    zfs: deps.zfs,
    store,
    parentDataset: config.parentDataset,
    nodeId: config.nodeId,
    locks: deps.locks,
    trash: deps.trash,
    scheduler,
    backup,
    receive,
    log,
  });
  return {
    stored,
    scheduler,
    pruner,
    follow,
    ...(standby ? { standby } : {}),
    conditionalWrites,
  };
}
