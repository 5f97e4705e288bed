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
import { Mounter } from "./mount/mounter.ts";
import { grantMessage, storeGrants } from "./permissions.ts";
import { type CommandRunner, DenoCommandRunner, DenoStreamRunner } from "./run.ts";
import type { StoreConfig } from "./config.ts";
import { StoredSnapshots } from "./csi/stored_snapshots.ts";
import { type BackupDeps, backupVolume } from "./replicate/backup.ts";
import { StorePruner } from "./replicate/prune.ts";
import type { ReceiveDeps } from "./replicate/receive.ts";
import { BackupScheduler } from "./replicate/scheduler.ts";
import { sendToStore } from "./replicate/send.ts";
import { FileStore } from "./store/file_store.ts";
import { S3Store } from "./store/s3_store.ts";
import type { Store } from "./store/store.ts";
import { Zfs } from "./zfs/zfs.ts";

/** A started plugin. */
export interface Plugin {
  readonly server: RunningServer;
  readonly health: HealthChecker;
  /** Stops the store's background work (backups, pruning); the upload running is aborted. */
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
}

function storeParts(
  config: Config,
  deps: { zfs: Zfs; locks: KeyedLock; trash: Trash; log: Logger },
): StoreParts | undefined {
  if (!config.store) return undefined;
  const store = openStore(config.store);
  const log = deps.log.child({ store: store.description });
  const streams = new DenoStreamRunner();
  const backup: BackupDeps = {
    zfs: deps.zfs,
    store,
    send: (spec) => sendToStore({ streams, zfsPath: config.zfsPath, store, log }, spec),
    locks: deps.locks,
    log,
    parentDataset: config.parentDataset,
    node: config.nodeId,
    defaultKeep: config.store.defaultBackupKeep,
    cache: new Map(),
  };
  const receive: ReceiveDeps = { streams, zfsPath: config.zfsPath, zfs: deps.zfs, store, log };
  const scheduler = new BackupScheduler({
    zfs: deps.zfs,
    parentDataset: config.parentDataset,
    log,
    backup: (dataset, options) => backupVolume(backup, dataset, options),
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
  return { stored, scheduler, pruner };
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
    if (Deno.permissions.querySync({ name: "run", command }).state !== "granted") {
      throw new Error(
        `this build may not run "${command}": it runs zfs, zpool, mount and umount as found on ` +
          `PATH when it starts; put them on PATH instead of naming another path`,
      );
    }
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
  // The store's directory, or its host:port and credentials file (src/permissions.ts).
  for (const grant of config.store ? storeGrants(config.store) : []) {
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
  const zfs = new Zfs(runner, {
    zfsPath: config.zfsPath,
    zpoolPath: config.zpoolPath,
    timeoutMs: config.commandTimeoutMs,
    log,
    // "Does not exist" below the parent counts only while the parent is visible.
    anchor: config.parentDataset,
  });
  const mounter = new Mounter(runner, {
    mountPath: config.mountPath,
    umountPath: config.umountPath,
    timeoutMs: config.commandTimeoutMs,
    log,
  });
  const health = new HealthChecker({ zfs, mounter, parentDataset: config.parentDataset, log });
  const serveNode = config.mode !== "controller";
  const serveController = config.mode !== "node";
  const identity = new IdentityService(health, { controller: serveController });
  // One set of locks: in a monolith a delete and a stage of one volume never overlap.
  const locks = new KeyedLock();
  const handlers: ServiceHandlers = {
    Identity: bindAll(identity, ["GetPluginInfo", "GetPluginCapabilities", "Probe"]),
  };
  if (serveNode) {
    const node = new NodeService({
      config,
      zfs,
      mounter,
      datasets: new Datasets(zfs, mounter),
      health,
      locks,
      log,
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
  // The trash serves DeleteVolume and the store's DeleteSnapshot; only a controller purges it.
  const trash = new Trash({
    zfs,
    parentDataset: config.parentDataset,
    retentionSeconds: config.deletedRetentionSeconds,
    locks,
    log,
  });
  const parts = storeParts(config, { zfs, locks, trash, log });
  if (serveController) {
    const controller = new ControllerService({
      config,
      zfs,
      mounter,
      health,
      locks,
      trash,
      log,
      ...(parts ? { stored: parts.stored, scheduler: parts.scheduler } : {}),
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
  health.startPeriodic();
  const server = await startServer(config.socketPath, handlers, log);
  // The first purge and backups wait for the first health check, so they do not slow the first
  // ready Probe.
  void health.refresh().finally(() => {
    if (serveController) trash.startPeriodic();
    parts?.scheduler.start();
    parts?.pruner.startPeriodic();
  });
  return {
    server,
    health,
    async stopBackground() {
      parts?.pruner.stop();
      await parts?.scheduler.stop();
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
