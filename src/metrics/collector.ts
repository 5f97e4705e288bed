/**
 * What a scrape reads from the system, at a cost that does not grow with the number of
 * volumes: one `zfs get -r` of the parent dataset, one `zpool list` of its pool and, on a node,
 * one read of the mount table, run side by side. A part that fails is reported by
 * `zfs_csi_metrics_source_up{source=...} 0` and left out; the rest is still answered.
 *
 * More parts plug in as {@linkcode MetricSource}s (follow-the-job's lease holder, generation
 * and replication lag): they run in the same collection, share its cache and get their own
 * `source_up` series.
 */

import type { Logger } from "../log.ts";
import type { Mounter } from "../mount/mounter.ts";
import type { CommandRunner } from "../run.ts";
import { poolOf } from "../zfs/names.ts";
import type { PropertyMap } from "../zfs/parse.ts";
import type { Zfs } from "../zfs/zfs.ts";
import { gauge, type MetricFamily } from "./exposition.ts";
import {
  parsePoolList,
  poolFamilies,
  poolListArgs,
  type PoolState,
  refusesParsable,
} from "./pool.ts";
import { type MountView, TREE_DEPTH, VOLUME_PROPERTIES, volumeFamilies } from "./volumes.ts";

/** A part of the collection with a name of its own (lowercase, e.g. "lease"). */
export interface MetricSource {
  readonly name: string;
  /** Its families; a throw marks the source down for this collection. */
  collect(): Promise<readonly MetricFamily[]>;
}

/** What the collector reads with. */
export interface CollectorDeps {
  readonly zfs: Zfs;
  /** Runs `zpool list` (the plugin's one command runner). */
  readonly runner: CommandRunner;
  readonly zpoolPath: string;
  readonly parentDataset: string;
  readonly timeoutMs: number;
  /** On a node: its mounter and base dirs, for the staged and published gauges. */
  readonly mounts?: { readonly mounter: Mounter; readonly dirs: readonly string[] };
  readonly log: Logger;
}

/** Reads the system's state for one scrape; see the module doc. */
export class StateCollector {
  readonly #d: CollectorDeps;
  readonly #sources: MetricSource[] = [];
  /** Whether zpool takes `-p`; undefined until first tried. */
  #parsable: boolean | undefined;
  /** Sources down at the last collection, so a lasting failure is logged once. */
  readonly #down = new Set<string>();

  constructor(deps: CollectorDeps) {
    this.#d = deps;
  }

  /**
   * Adds a part to every later collection.
   * @throws {TypeError} for a name that is not lowercase letters and "_", or is taken
   */
  addSource(source: MetricSource): void {
    const taken = ["zfs", "zpool", "mount", ...this.#sources.map((s) => s.name)];
    if (!/^[a-z][a-z_]*$/.test(source.name) || taken.includes(source.name)) {
      throw new TypeError(`Metric source name "${source.name}" is invalid or taken`);
    }
    this.#sources.push(source);
  }

  /** One collection: every family, and whether each source answered. */
  async collect(): Promise<MetricFamily[]> {
    const started = performance.now();
    const parent = this.#d.parentDataset;
    const [tree, table, pools, ...extra] = await Promise.allSettled([
      this.#d.zfs.getTree(parent, TREE_DEPTH, VOLUME_PROPERTIES),
      this.#d.mounts ? this.#d.mounts.mounter.table() : Promise.resolve(undefined),
      this.#pools(),
      // A source that throws at once counts as down too, like one whose promise rejects.
      ...this.#sources.map((s) => Promise.resolve().then(() => s.collect())),
    ]);
    const up: [string, PromiseSettledResult<unknown>][] = [
      ["zfs", tree],
      ["zpool", pools],
      ...(this.#d.mounts ? [["mount", table] as [string, PromiseSettledResult<unknown>]] : []),
      ...this.#sources.map((s, i) =>
        [s.name, extra[i]!] as [string, PromiseSettledResult<unknown>]
      ),
    ];
    const families: MetricFamily[] = [];
    if (tree.status === "fulfilled") {
      const mounts = this.#d.mounts;
      const view: MountView | undefined = mounts && table.status === "fulfilled" && table.value
        ? { table: table.value, judge: mounts.mounter.judge(), dirs: mounts.dirs }
        : undefined;
      families.push(...volumeFamilies(parent, tree.value ?? new Map<string, PropertyMap>(), view));
    }
    if (pools.status === "fulfilled") families.push(...poolFamilies(pools.value));
    for (const r of extra) if (r.status === "fulfilled") families.push(...r.value);
    for (const [name, r] of up) this.#noteDown(name, r);
    families.push(
      gauge(
        "zfs_csi_metrics_source_up",
        "1 when the source answered at the last collection, else 0 (its metrics are left out).",
        up.map(([source, r]) => ({ labels: { source }, value: r.status === "fulfilled" ? 1 : 0 })),
      ),
      gauge(
        "zfs_csi_metrics_collection_duration_seconds",
        "How long the last collection of ZFS, pool and mount state took.",
        [{ labels: {}, value: (performance.now() - started) / 1000 }],
      ),
    );
    return families;
  }

  #noteDown(source: string, r: PromiseSettledResult<unknown>): void {
    if (r.status === "fulfilled") {
      if (this.#down.delete(source)) this.#d.log.info("metrics source answers again", { source });
      return;
    }
    if (this.#down.has(source)) return;
    this.#down.add(source);
    this.#d.log.warn("metrics source failed; its metrics are left out", {
      source,
      error: r.reason,
    });
  }

  /** The parent's pool, with `-p` where zpool takes it. */
  async #pools(): Promise<PoolState[]> {
    const pool = poolOf(this.#d.parentDataset);
    const list = (parsable: boolean) =>
      this.#d.runner.run([this.#d.zpoolPath, ...poolListArgs(pool, parsable)], {
        timeoutMs: this.#d.timeoutMs,
      });
    let res = await list(this.#parsable ?? true);
    if (this.#parsable === undefined && res.code !== 0 && refusesParsable(res.stderr)) {
      this.#parsable = false;
      res = await list(false);
    } else if (res.code === 0 && this.#parsable === undefined) {
      this.#parsable = true;
    }
    if (res.timedOut) throw new Error(`zpool list ${pool} timed out`);
    if (res.code !== 0) {
      throw new Error(`zpool list ${pool} failed (exit ${res.code}): ${res.stderr.trim()}`);
    }
    return parsePoolList(res.stdout);
  }
}
