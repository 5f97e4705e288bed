/**
 * Builds the plugin from a resolved config: one command runner, zfs, mounter, health checker,
 * the CSI services, and the gRPC server that serves them.
 */

import type { Config } from "./config.ts";
import { Datasets } from "./csi/datasets.ts";
import { HealthChecker } from "./csi/health.ts";
import { IdentityService } from "./csi/identity.ts";
import { NodeService } from "./csi/node.ts";
import { type RunningServer, startServer } from "./grpc/server.ts";
import { KeyedLock } from "./lock.ts";
import type { Logger } from "./log.ts";
import { Mounter } from "./mount/mounter.ts";
import { type CommandRunner, DenoCommandRunner } from "./run.ts";
import { Zfs } from "./zfs/zfs.ts";

/** A started plugin. */
export interface Plugin {
  readonly server: RunningServer;
  readonly health: HealthChecker;
}

/** Starts serving; the first health check starts at once, in the background. */
export async function startPlugin(
  config: Config,
  log: Logger,
  runner: CommandRunner = new DenoCommandRunner(config.commandTimeoutMs),
): Promise<Plugin> {
  const zfs = new Zfs(runner, {
    zfsPath: config.zfsPath,
    zpoolPath: config.zpoolPath,
    timeoutMs: config.commandTimeoutMs,
    log,
  });
  const mounter = new Mounter(runner, {
    mountPath: config.mountPath,
    umountPath: config.umountPath,
    timeoutMs: config.commandTimeoutMs,
    log,
  });
  const health = new HealthChecker({ zfs, mounter, parentDataset: config.parentDataset, log });
  const identity = new IdentityService(health, { controller: false });
  const node = new NodeService({
    config,
    zfs,
    mounter,
    datasets: new Datasets(zfs, mounter),
    health,
    locks: new KeyedLock(),
    log,
  });
  void health.refresh();
  const server = await startServer(config.socketPath, {
    Identity: bindAll(identity, ["GetPluginInfo", "GetPluginCapabilities", "Probe"]),
    Node: bindAll(node, [
      "NodeGetInfo",
      "NodeGetCapabilities",
      "NodeStageVolume",
      "NodeUnstageVolume",
      "NodePublishVolume",
      "NodeUnpublishVolume",
      "NodeGetVolumeStats",
      "NodeExpandVolume",
    ]),
  }, log);
  return { server, health };
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
