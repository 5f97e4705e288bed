/** Starts the metrics endpoint of a plugin built by src/plugin.ts. */

import type { Config } from "../config.ts";
import type { Logger } from "../log.ts";
import type { Mounter } from "../mount/mounter.ts";
import type { CommandRunner } from "../run.ts";
import { PLUGIN_VERSION } from "../version.ts";
import type { Store } from "../store/store.ts";
import type { Zfs } from "../zfs/zfs.ts";
import type { Activity } from "./activity.ts";
import { StateCollector } from "./collector.ts";
import { type MetricsEndpoint, startMetricsEndpoint } from "./endpoint.ts";
import type { ListenAddress } from "./listen.ts";
import { Metrics } from "./metrics.ts";
import { storeSource } from "./store.ts";

/** What the endpoint reads with: the plugin's own zfs, mounter and runner. */
export interface MetricsDeps {
  readonly config: Config;
  readonly activity: Activity;
  readonly zfs: Zfs;
  readonly mounter: Mounter;
  readonly runner: CommandRunner;
  readonly log: Logger;
  /** With --store: the store, whose reachability is a gauge. */
  readonly store?: Store;
  /** The CSI methods served: their OK counters exist at 0 from the start. */
  readonly methods?: readonly string[];
}

/**
 * Builds the metrics and listens on `listen`.
 * @throws {Deno.errors.AddrInUse} when the port is taken
 */
export function startMetrics(
  listen: ListenAddress,
  deps: MetricsDeps,
): { metrics: Metrics; endpoint: MetricsEndpoint } {
  const { config, log } = deps;
  const collector = new StateCollector({
    zfs: deps.zfs,
    runner: deps.runner,
    zpoolPath: config.zpoolPath,
    parentDataset: config.parentDataset,
    timeoutMs: config.commandTimeoutMs,
    // Only a node stages and publishes.
    ...(config.mode !== "controller"
      ? { mounts: { mounter: deps.mounter, dirs: config.stagePublishDirs } }
      : {}),
    log,
  });
  const metrics = new Metrics({
    activity: deps.activity,
    collector,
    info: {
      version: PLUGIN_VERSION,
      node: config.nodeId,
      mode: config.mode,
      parentDataset: config.parentDataset,
    },
  });
  if (deps.store) {
    metrics.addSource(storeSource(deps.store, { timeoutMs: config.commandTimeoutMs, log }));
  }
  deps.activity.declareMethods(deps.methods ?? []);
  const endpoint = startMetricsEndpoint(listen, () => metrics.scrape(), log);
  return { metrics, endpoint };
}
