/**
 * Builds the plugin from a resolved config: one command runner, zfs, mounter, health checker,
 * the CSI services, and the gRPC server that serves them.
 */

import { dirname } from "node:path";
import type { Config } from "./config.ts";
import { BlockTools } from "./block/tools.ts";
import { Datasets } from "./volume/datasets.ts";
import { HealthChecker } from "./csi/health.ts";
import { IdentityService } from "./csi/identity.ts";
import { NodeService } from "./csi/node.ts";
import { ControllerService } from "./csi/controller.ts";
import { Trash } from "./volume/trash.ts";
import { type RunningServer, type ServiceHandlers, startServer } from "./grpc/server.ts";
import { KeyedLock } from "./lock.ts";
import type { Logger } from "./log.ts";
import type { Metrics } from "./metrics/metrics.ts";
import { grantMessage, programRefusal, serviceGrants } from "./permissions.ts";
import { type CommandRunner, DenoCommandRunner, ObservedRunner } from "./run.ts";
import { DEFAULT_SWEEP_INTERVAL_SECONDS, DeletedCopySweep } from "./follow/sweep.ts";
import { mounterFor, zfsFor } from "./system_tools.ts";
import type { StoreParts } from "./store_parts.ts";

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
  for (const grant of serviceGrants(config)) {
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
  // The metrics modules load only with --metrics-listen and the store's only with --store, so a
  // plugin without them does not load them at start (bench/startup.ts).
  const meters = config.metricsListen
    ? {
      Activity: (await import("./metrics/activity.ts")).Activity,
      startMetrics: (await import("./metrics/start.ts")).startMetrics,
      followFenceSource: (await import("./metrics/follow.ts")).followFenceSource,
    }
    : undefined;
  const activity = meters ? new meters.Activity() : undefined;
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
  const parts = config.store
    ? (await import("./store_parts.ts")).storeParts(config, {
      zfs,
      locks,
      trash,
      log,
      ...(activity ? { activity } : {}),
    })
    : undefined;
  // Whether an S3 server enforces conditional writes, which follow volumes need: probed in the
  // background (readiness does not wait), its verdict there for the handlers when it comes.
  if (parts && config.store?.kind === "s3") void reportConditionalWrites(parts, log);
  // Copies of follow volumes deleted elsewhere (warm and standby ones) live on this node's pool.
  const sweep = parts && serveNode
    ? new DeletedCopySweep({
      zfs,
      store: parts.follow.store,
      locks,
      trash,
      log: log.child({ part: "follow-sweep" }),
      parentDataset: config.parentDataset,
      gate: parts.follow.gate,
      inUse: async (dataset) =>
        (await mounter.table()).some((e) => mounter.judge().isMountOf(e, dataset)),
      intervalSeconds: config.follow?.standbyIntervalSeconds ?? DEFAULT_SWEEP_INTERVAL_SECONDS,
    })
    : undefined;
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
      // The same runner as zfs and mount, so their processes are counted alike.
      blockTools: new BlockTools(runner, { timeoutMs: config.commandTimeoutMs, log }),
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
            conditionalWrites: parts.conditionalWrites,
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
  const metered = config.metricsListen && activity && meters
    ? meters.startMetrics(config.metricsListen, {
      config,
      activity,
      zfs,
      mounter,
      runner,
      log,
      // The store's reachability, and every served method's counter at 0 from the start.
      ...(parts ? { store: parts.follow.store } : {}),
      methods: Object.values(handlers).flatMap((h) => Object.keys(h ?? {})),
    })
    : undefined;
  // Whether this node's held copies of follow volumes are suspended (src/follow/selffence.ts).
  if (metered && meters && parts && serveNode) {
    const follow = parts.follow;
    metered.metrics.addSource(meters.followFenceSource(() => follow.fenceState()));
  }
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
  // The leases of follow volumes held here, at once: a restarted plugin's copies stay writable
  // only if a renewal lands soon (src/follow/mover.ts start), so they wait for nothing else.
  if (serveNode) parts?.follow.start();
  // Housekeeping (purge, backups, pruning, standby copies, sweep) waits for the first
  // health check and the first Probe answered, so the Probe an orchestrator waits on at start is
  // not answered behind the processes it starts; with no Probe, HOUSEKEEPING_WAIT_MS after the
  // check.
  let stopped = false;
  let scratch: { stop(): void } | undefined;
  void health.refresh()
    .then(() => orAfter(identity.firstProbeAnswered, HOUSEKEEPING_WAIT_MS))
    .then(() => {
      if (stopped) return;
      if (serveController) trash.startPeriodic();
      parts?.scheduler.start();
      parts?.pruner.startPeriodic();
      // Standby copies live on this node's pool: only a node keeps them.
      if (serveNode) parts?.standby?.start();
      sweep?.start();
      // Scratch datasets of `zfs-csi verify` runs that died (src/cli/scratch.ts): loaded only now.
      void import("./cli/scratch.ts").then(({ ScratchSweep }) => {
        if (stopped) return;
        const found = new ScratchSweep({ zfs, parentDataset: config.parentDataset, log });
        found.start();
        scratch = found;
      });
    });
  return {
    server,
    health,
    ...(metered ? { metrics: metered.metrics } : {}),
    async stopBackground() {
      stopped = true;
      parts?.pruner.stop();
      parts?.follow.stop();
      parts?.standby?.stop();
      sweep?.stop();
      scratch?.stop();
      await Promise.all([parts?.scheduler.stop(), metered?.endpoint.stop()]);
    },
  };
}

/** Runs the store's conditional-write probe and logs its verdict. Never throws. */
async function reportConditionalWrites(
  parts: Pick<StoreParts, "conditionalWrites" | "follow">,
  log: Logger,
): Promise<void> {
  const store = parts.follow.store.description;
  const v = await parts.conditionalWrites.verdict();
  if (v.kind === "enforced") {
    log.info("the store enforces conditional writes", { store });
  } else if (v.kind === "not_enforced") {
    log.error(
      "the store does not enforce conditional writes: volumes that follow their job are " +
        "refused on it (ordinary backups go on)",
      { store, answer: v.detail },
    );
  } else {
    log.warn(
      "could not check that the store enforces conditional writes; checked again when a " +
        "volume that follows its job needs them",
      { store, error: v.error },
    );
  }
}

/**
 * How long after the first health check housekeeping waits for a first Probe at most: Nomad
 * looks for the socket and probes every 5 s until ready (its plugin_supervisor_hook.go).
 */
const HOUSEKEEPING_WAIT_MS = 5_000;

/** Resolves when `event` does or after `ms`, whichever comes first, and leaves no timer. */
async function orAfter(event: Promise<void>, ms: number): Promise<void> {
  let timer: ReturnType<typeof setTimeout> | undefined;
  const elapsed = new Promise<void>((resolve) => timer = setTimeout(resolve, ms));
  try {
    await Promise.race([event, elapsed]);
  } finally {
    clearTimeout(timer);
  }
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
