/**
 * One simulated node: its pool and mounts (which outlive the plugin), its wall clock (skewed or
 * stepped as the schedule says), and the plugin running on it, built as src/store_parts.ts and
 * src/plugin.ts build it: the real NodeService with SizedFollowVolumes, backupVolume with the
 * keep policy and the head's chain protection, receive and restore, the trash, one KeyedLock.
 * A kill drops the running plugin (its work in flight never ends, as after SIGKILL); a restart
 * builds a new one on the same pool, as a new process.
 */

import { parseConfig } from "../../src/config.ts";
import { Datasets } from "../../src/csi/datasets.ts";
import { HealthChecker } from "../../src/csi/health.ts";
import { NodeService } from "../../src/csi/node.ts";
import { Trash } from "../../src/csi/trash.ts";
import { headGuard } from "../../src/follow/head.ts";
import type { FollowVolumes } from "../../src/follow/mover.ts";
import { SizedFollowVolumes } from "../../src/follow/resize.ts";
import { KeyedLock } from "../../src/lock.ts";
import { Logger } from "../../src/log.ts";
import { type BackupDeps, backupVolume } from "../../src/replicate/backup.ts";
import type { ReceiveDeps } from "../../src/replicate/receive.ts";
import { sendToStore } from "../../src/replicate/send.ts";
import { fakeTools } from "../support/fake_runner.ts";
import type { VirtualTime } from "./clock.ts";
import type { PoolModel } from "./pool_model.ts";
import type { FaultyStore } from "./store_faults.ts";

/** The plugin's parent dataset on every node. */
export const PARENT = "tank/nomad";
/** The base directory of staging and target paths (Nomad's stage_publish_base_dir). */
export const CSI_BASE = "/csi";

/** What every node's plugin is configured with. */
export interface PluginSettings {
  readonly ttlSeconds: number;
  readonly takeoverAfterMs: number;
  readonly maxChainLength: number;
}

/** A running plugin on a node. */
export interface Plugin {
  /** The clock's actor of this incarnation (`<node>#<n>`). */
  readonly actor: string;
  readonly node: NodeService;
  readonly follow: FollowVolumes;
  readonly backup: BackupDeps;
}

/** What a node is built from. */
export interface SimNodeOptions {
  readonly name: string;
  readonly pool: PoolModel;
  readonly clock: VirtualTime;
  readonly settings: PluginSettings;
  /** A store view of this node (faults and latency applied). */
  readonly store: () => FaultyStore;
  /** Deterministic random hex (stream keys, store uids). */
  readonly randomHex: (bytes: number) => string;
  /** Where every plugin's log lines go, and from which level. */
  readonly log: (line: string) => void;
  readonly logLevel?: "info" | "warn";
}

/** One simulated node; see the module doc. */
export class SimNode {
  readonly name: string;
  readonly pool: PoolModel;
  readonly #o: SimNodeOptions;
  /** The wall clock's offset from true (virtual) time, in ms. */
  offsetMs = 0;
  #incarnation = 0;
  #plugin: Plugin | undefined;
  /** Virtual times the node was paused from and to (to: undefined while paused). */
  readonly pauses: { from: number; to: number | undefined }[] = [];
  /** Virtual times its plugin was down from and to. */
  readonly downs: { from: number; to: number | undefined }[] = [];

  constructor(opts: SimNodeOptions) {
    this.name = opts.name;
    this.pool = opts.pool;
    this.#o = opts;
  }

  /** The node's wall clock, in ms since the epoch. */
  wallMs(): number {
    return this.#o.clock.now + this.offsetMs;
  }

  /** The plugin running now, if any. */
  get plugin(): Plugin | undefined {
    return this.#plugin;
  }

  get paused(): boolean {
    return this.pauses.at(-1)?.to === undefined && this.pauses.length > 0;
  }

  /** Starts a new plugin process on the node (the first, or after a kill). */
  start(): void {
    const { clock, settings } = this.#o;
    const actor = `${this.name}#${++this.#incarnation}`;
    this.#plugin = clock.runAs(actor, () => this.#build(actor, settings));
    const down = this.downs.at(-1);
    if (down && down.to === undefined) down.to = clock.now;
    if (this.paused) clock.setState(actor, "paused");
  }

  /** SIGKILL: the plugin's work in flight is lost; mounts and the pool stay. */
  kill(): void {
    if (!this.#plugin) return;
    this.#o.clock.setState(this.#plugin.actor, "dead");
    this.#plugin = undefined;
    this.downs.push({ from: this.#o.clock.now, to: undefined });
  }

  /** Freezes the whole node (a paused VM): its plugin's timers, requests and commands wait. */
  pause(): void {
    if (this.paused) return;
    this.pauses.push({ from: this.#o.clock.now, to: undefined });
    if (this.#plugin) this.#o.clock.setState(this.#plugin.actor, "paused");
  }

  resume(): void {
    const p = this.pauses.at(-1);
    if (!p || p.to !== undefined) return;
    p.to = this.#o.clock.now;
    if (this.#plugin) this.#o.clock.setState(this.#plugin.actor, "running");
  }

  /** Whether the node was paused or its plugin down at some time in [from, to]. */
  outOfActionIn(from: number, to: number): boolean {
    return [...this.pauses, ...this.downs].some((p) => p.from <= to && (p.to ?? Infinity) >= from);
  }

  /** How many ms of [from, to] the node spent paused or with its plugin down. */
  outOfActionMs(from: number, to: number): number {
    let ms = 0;
    for (const p of [...this.pauses, ...this.downs]) {
      ms += Math.max(0, Math.min(to, p.to ?? to) - Math.max(from, p.from));
    }
    return ms;
  }

  #build(actor: string, settings: PluginSettings): Plugin {
    const parsed = parseConfig([
      "--parent-dataset",
      PARENT,
      "--node-id",
      this.name,
      "--stage-publish-base-dir",
      CSI_BASE,
      "--store",
      "file:///var/lib/zfs-csi-store",
    ], {});
    if (parsed.kind !== "run") throw new Error("parseConfig did not return a run config");
    const log = new Logger(this.#o.logLevel ?? "info", { node: this.name }, this.#o.log);
    const { zfs, mounter } = fakeTools(this.pool.runner, log, 60_000);
    const store = this.#o.store();
    const locks = new KeyedLock();
    const wallMs = () => this.wallMs();
    const monotonic = () => this.#o.clock.monotonic;
    const trash = new Trash({
      zfs,
      parentDataset: PARENT,
      retentionSeconds: 86_400,
      locks,
      log,
      now: () => Math.floor(wallMs() / 1000),
      monotonic: () => monotonic() / 1000,
    });
    const streams = this.pool.streams;
    const receive: ReceiveDeps = { streams, zfsPath: "zfs", zfs, store, log, stopWaitMs: 5_000 };
    const backup: BackupDeps = {
      zfs,
      store,
      send: (spec) => sendToStore({ streams, zfsPath: "zfs", store, log }, spec),
      locks,
      log,
      parentDataset: PARENT,
      node: this.name,
      maxChainLength: settings.maxChainLength,
      cache: new Map(),
      protect: (volumeKey, manifests) => headGuard(store, this.name, volumeKey, manifests),
      now: wallMs,
      randomHex: this.#o.randomHex,
    };
    const follow = new SizedFollowVolumes({
      zfs,
      store,
      locks,
      trash,
      log: log.child({ part: "follow" }),
      parentDataset: PARENT,
      node: this.name,
      receive,
      backup: (dataset, options) => backupVolume(backup, dataset, options),
      ttlSeconds: settings.ttlSeconds,
      takeoverAfterMs: settings.takeoverAfterMs,
      now: wallMs,
      monotonic,
    });
    const node = new NodeService({
      config: parsed.config,
      zfs,
      mounter,
      datasets: new Datasets(zfs, mounter),
      health: new HealthChecker({ zfs, mounter, parentDataset: PARENT, log }),
      locks,
      log,
      follow,
    });
    follow.start();
    return { actor, node, follow, backup };
  }
}
