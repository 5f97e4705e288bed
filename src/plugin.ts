/**
 * Builds the plugin from a resolved config: one command runner, zfs, mounter, health checker,
 * the CSI services, and the gRPC server that serves them.
 */

import { dirname } from "node:path";
import type { Config } from "./config.ts";
import { Datasets } from "./csi/datasets.ts";
import { HealthChecker } from "./csi/health.ts";
import { IdentityService } from "./csi/identity.ts";
import { NodeService } from "./csi/node.ts";
import { ControllerService } from "./csi/controller.ts";
import { Trash } from "./csi/trash.ts";
import { type RunningServer, type ServiceHandlers, startServer } from "./grpc/server.ts";
import { KeyedLock } from "./lock.ts";
import type { Logger } from "./log.ts";
import { Activity } from "./metrics/activity.ts";
import { meteredBackup, meteredSend } from "./metrics/backups.ts";
import type { Metrics } from "./metrics/metrics.ts";
import { startMetrics } from "./metrics/start.ts";
import { grantMessage, metricsGrant, programRefusal, storeGrants } from "./permissions.ts";
import {
  type CommandRunner,
  DenoCommandRunner,
  DenoStreamRunner,
  ObservedRunner,
  ObservedStreamRunner,
  type StreamRunner,
} from "./run.ts";
import type { StoreConfig } from "./config.ts";
import { StoredSnapshots } from "./csi/stored_snapshots.ts";
import { type BackupDeps, backupVolume } from "./replicate/backup.ts";
import { StorePruner } from "./replicate/prune.ts";
import type { ReceiveDeps } from "./replicate/receive.ts";
import { BackupScheduler, type SchedulerDeps } from "./replicate/scheduler.ts";
import { headChain } from "./follow/head.ts";
import { FollowVolumes } from "./follow/mover.ts";
import { StandbyFollower } from "./follow/standby.ts";
import { sendToStore } from "./replicate/send.ts";
import { FileStore } from "./store/file_store.ts";
import { S3Store } from "./store/s3_store.ts";
import type { Store } from "./store/store.ts";
import { mounterFor, zfsFor } from "./system_tools.ts";
import type { Zfs } from "./zfs/zfs.ts";

/** A started plugin. */
export interface Plugin {
  readonly server: RunningServer;
  readonly health: HealthChecker;
  /** With --metrics-listen: the metrics, where more sources can be added (addSource). */
  readonly metrics?: Metrics;
  /**
   * Stops the store's background work (backups, pruning; the upload running is aborted) and
   * the metrics endpoint.
   */
  stopBackground(): Promise<void>;
}

/** The store a config names. */
export function openStore(config: StoreConfig): Store {
  if (config.kind === "file") return new FileStore(config.dir);
  const c = config.credentials;
  const token = c.sessionToken;
  return new S3Store({
    endpoint: new URL(config.endpoint),
    region: config.region,
    bucket: config.bucket,
    prefix: config.prefix,
    pathStyle: config.pathStyle,
    credentials: {
      accessKeyId: c.accessKeyId,
      secretAccessKey: c.secretAccessKey,
      ...(token === undefined ? {} : { sessionToken: token }),
    },
  });
}

/** The store's background work and its CSI side, with `--store`. */
interface StoreParts {
  readonly stored: StoredSnapshots;
  readonly scheduler: BackupScheduler;
  readonly pruner: StorePruner;
  /** Volumes that follow their job: their moves, head and lease (src/follow/). */
  readonly follow: FollowVolumes;
  /** Warm copies of the follow volumes naming this node a standby; absent when off. */
  readonly standby?: StandbyFollower;
}

function storeParts(
  config: Config,
  deps: { zfs: Zfs; locks: KeyedLock; trash: Trash; log: Logger; activity?: Activity },
): StoreParts | undefined {
  if (!config.store) return undefined;
  const store = openStore(config.store);
  const log = deps.log.child({ store: store.description });
  const activity = deps.activity;
  const parent = config.parentDataset;
  const streams: StreamRunner = activity
    ? new ObservedStreamRunner(new DenoStreamRunner(), (e) => activity.observeCommand(e))
    : new DenoStreamRunner();
  const send: BackupDeps["send"] = (spec) =>
    sendToStore({ streams, zfsPath: config.zfsPath, store, log }, spec);
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
    // A volume that follows its job keeps its head's chain, whatever the keep policy says.
    protect: (volumeKey, manifests) => headChain(store, volumeKey, manifests),
  };
  const receive: ReceiveDeps = { streams, zfsPath: config.zfsPath, zfs: deps.zfs, store, log };
  const follow = new FollowVolumes({
    zfs: deps.zfs,
    store,
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
    store,
    locks: deps.locks,
    trash: deps.trash,
    log: log.child({ part: "standby" }),
    parentDataset: config.parentDataset,
    node: config.nodeId,
    receive,
    copies: follow,
    intervalSeconds: standbyInterval,
  });
  const scheduled: SchedulerDeps["backup"] = async (dataset, options) => {
    const outcome = await backupVolume(backup, dataset, options);
    // A volume that follows its job: the stored snapshot becomes its head (src/follow/).
    await follow.afterBackup(dataset, outcome);
    return outcome;
  };
  const scheduler = new BackupScheduler({
    zfs: deps.zfs,
    parentDataset: config.parentDataset,
    log,
    backup: activity ? meteredBackup(scheduled, activity, parent) : scheduled,
  });
  const pruner = new StorePruner({
    store,
    log,
    deletedRetentionMs: config.store.deletedRetentionSeconds * 1000,
    // Parts of uploads a crash cut short (S3 aborts them by the bucket's lifecycle rule).
    ...(store instanceof FileStore ? { cleanTemp: () => store.cleanTemp() } : {}),
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
  return { stored, scheduler, pruner, follow, ...(standby ? { standby } : {}) };
}

/**
 * Refuses to start when the permissions baked into this build do not cover the directories
 * and programs the config names: better one clear line at start than a permission error on
 * the first mount.
 * @throws {Error} naming the directory or program and what to do about it
 */
export function checkPermissions(config: Config): void {
  const programs = [config.zfsPath, config.zpoolPath, config.mountPath, config.umountPath];
  for (const command of programs) {
    const refused = programRefusal(command);
    if (refused !== undefined) throw new Error(refused);
  }
  const dirs = [dirname(config.socketPath), ...config.stagePublishDirs];
  for (const path of dirs) {
    if (Deno.permissions.querySync({ name: "write", path }).state !== "granted") {
      throw new Error(
        `this build may not write to "${path}"; use a directory below those it was built for, ` +
          `or rebuild with ZFS_CSI_EXTRA_DIRS=${path} deno task compile`,
      );
    }
  }
  // The store's directory, or its host:port and credentials file, and the metrics address
  // (src/permissions.ts).
  const grants = [
    ...(config.store ? storeGrants(config.store) : []),
    ...(config.metricsListen ? [metricsGrant(config.metricsListen)] : []),
  ];
  for (const grant of grants) {
    if (grant.descriptors.some((d) => Deno.permissions.querySync(d).state !== "granted")) {
      throw new Error(grantMessage(grant));
    }
  }
}

/** Starts serving; the first health check starts at once, in the background. */
export async function startPlugin(
  config: Config,
  log: Logger,
  runner: CommandRunner = new DenoCommandRunner(config.commandTimeoutMs),
): Promise<Plugin> {
  checkPermissions(config);
  // Opt-in metrics: every process the one runner starts and every call answered report to it.
  const activity = config.metricsListen ? new Activity() : undefined;
  if (activity) runner = new ObservedRunner(runner, (e) => activity.observeCommand(e));
  const zfs = zfsFor(config, runner, log);
  const mounter = mounterFor(config, runner, log);
  const health = new HealthChecker({ zfs, mounter, parentDataset: config.parentDataset, log });
  const serveNode = config.mode !== "controller";
  const serveController = config.mode !== "node";
  const identity = new IdentityService(health, { controller: serveController });
  // One set of locks: in a monolith a delete and a stage of one volume never overlap.
  const locks = new KeyedLock();
  const handlers: ServiceHandlers = {
    Identity: bindAll(identity, ["GetPluginInfo", "GetPluginCapabilities", "Probe"]),
  };
  // The trash serves DeleteVolume and the store's DeleteSnapshot; only a controller purges it.
  const trash = new Trash({
    zfs,
    parentDataset: config.parentDataset,
    retentionSeconds: config.deletedRetentionSeconds,
    locks,
    log,
  });
  const parts = storeParts(config, { zfs, locks, trash, log, ...(activity ? { activity } : {}) });
  if (serveNode) {
    const node = new NodeService({
      config,
      zfs,
      mounter,
      datasets: new Datasets(zfs, mounter),
      health,
      locks,
      log,
      ...(parts ? { follow: parts.follow } : {}),
    });
    handlers.Node = bindAll(node, [
      "NodeGetInfo",
      "NodeGetCapabilities",
      "NodeStageVolume",
      "NodeUnstageVolume",
      "NodePublishVolume",
      "NodeUnpublishVolume",
      "NodeGetVolumeStats",
      "NodeExpandVolume",
    ]);
  }
  if (serveController) {
    const controller = new ControllerService({
      config,
      zfs,
      mounter,
      health,
      locks,
      trash,
      log,
      ...(parts
        ? {
          stored: parts.stored,
          scheduler: parts.scheduler,
          follow: {
            store: parts.follow.store,
            ttlSeconds: parts.follow.ttlSeconds,
            ...(parts.standby ? { standby: parts.standby } : {}),
          },
        }
        : {}),
    });
    handlers.Controller = bindAll(controller, [
      "ControllerGetCapabilities",
      "CreateVolume",
      "DeleteVolume",
      "ValidateVolumeCapabilities",
      "ListVolumes",
      "ControllerGetVolume",
      "GetCapacity",
      "ControllerExpandVolume",
      "CreateSnapshot",
      "DeleteSnapshot",
      "ListSnapshots",
    ]);
  }
  // Listening before serving: a taken port stops the start before Nomad sees a socket.
  const metered = config.metricsListen && activity
    ? startMetrics(config.metricsListen, { config, activity, zfs, mounter, runner, log })
    : undefined;
  health.startPeriodic();
  let server: RunningServer;
  try {
    server = await startServer(
      config.socketPath,
      handlers,
      log,
      activity ? (method, code, seconds) => activity.observeCall(method, code, seconds) : undefined,
    );
  } catch (err) {
    await metered?.endpoint.stop();
    throw err;
  }
  // The first purge and backups wait for the first health check, so they do not slow the first
  // ready Probe.
  void health.refresh().finally(() => {
    if (serveController) trash.startPeriodic();
    parts?.scheduler.start();
    parts?.pruner.startPeriodic();
    // The holder renews the leases of the follow volumes staged here.
    if (serveNode) parts?.follow.start();
    // Standby copies live on this node's pool: only a node keeps them.
    if (serveNode) parts?.standby?.start();
  });
  return {
    server,
    health,
    ...(metered ? { metrics: metered.metrics } : {}),
    async stopBackground() {
      parts?.pruner.stop();
      parts?.follow.stop();
      parts?.standby?.stop();
      await Promise.all([parts?.scheduler.stop(), metered?.endpoint.stop()]);
    },
  };
}

function bindAll<T extends object>(
  target: T,
  methods: readonly (keyof T & string)[],
): Record<string, (req: never) => Promise<unknown>> {
  const out: Record<string, (req: never) => Promise<unknown>> = {};
  for (const m of methods) {
    const fn = target[m];
    if (typeof fn !== "function") throw new TypeError(`No handler ${m}`);
    out[m] = (fn as (req: never) => Promise<unknown>).bind(target);
  }
  return out;
}
