/**
 * The plugin's metrics: its activity (counted as it happens) and the state of its volumes and
 * pool (collected when scraped, from a cache a few seconds old at most).
 */

import type { Activity } from "./activity.ts";
import { SharedCache } from "./cache.ts";
import type { MetricSource, StateCollector } from "./collector.ts";
import { gauge, type MetricFamily, render } from "./exposition.ts";

/** How long a collection of ZFS state answers scrapes: several Prometheus servers share it. */
export const STATE_TTL_MS = 5_000;

/** What the plugin is, for `zfs_csi_info`. */
export interface PluginInfo {
  readonly version: string;
  readonly node: string;
  readonly mode: string;
  readonly parentDataset: string;
}

/** Options of {@linkcode Metrics}. */
export interface MetricsOptions {
  /** Where the gRPC handler, the command runner and the backups report to. */
  readonly activity: Activity;
  readonly info: PluginInfo;
  readonly collector: StateCollector;
  /** Default {@linkcode STATE_TTL_MS}. */
  readonly ttlMs?: number;
}

/** Everything the endpoint shows. */
export class Metrics {
  readonly #activity: Activity;
  readonly #collector: StateCollector;
  readonly #state: SharedCache<MetricFamily[]>;
  readonly #info: MetricFamily;

  constructor(options: MetricsOptions) {
    this.#activity = options.activity;
    this.#collector = options.collector;
    this.#state = new SharedCache(() => options.collector.collect(), {
      ttlMs: options.ttlMs ?? STATE_TTL_MS,
    });
    const i = options.info;
    this.#info = gauge("zfs_csi_info", "The plugin's version, node id, mode and parent dataset.", [
      {
        labels: { version: i.version, node: i.node, mode: i.mode, parent_dataset: i.parentDataset },
        value: 1,
      },
    ]);
  }

  /**
   * Adds a part to the state collection (the seam for follow-the-job: lease holder and
   * generation, replication lag). See {@linkcode StateCollector.addSource}.
   */
  addSource(source: MetricSource): void {
    this.#collector.addSource(source);
  }

  /** The text exposition of one scrape. */
  async scrape(): Promise<string> {
    const state = await this.#state.get();
    // The volumes this collection saw have their backup counters from now on, at 0 until used.
    const volumes = state.find((f) => f.name === "zfs_csi_volume_referenced_bytes");
    if (volumes && volumes.type === "gauge") {
      this.#activity.declareVolumes(volumes.samples.map((s) => s.labels.volume ?? ""));
    }
    return render([this.#info, ...this.#activity.families(), ...state]);
  }
}
