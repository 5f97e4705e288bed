/**
 * One run of the fault-schedule test: a few nodes (sim_node.ts) on their model pools
 * (pool_model.ts), one store bucket reached through per-node faulty views (store_faults.ts),
 * Nomad driving the node calls (nomad.ts), all on virtual time (clock.ts), the invariants
 * (invariants.ts) checked at every change of a pool and after every step. A run is a function
 * of its scenario: the same scenario gives the same run, step for step.
 *
 * While a run goes, the globals the plugin's code reaches for are the simulation's: timers and
 * clocks, Deno.lstat/realPath/mkdir (the node's model file system, chosen by the running
 * actor), and crypto.getRandomValues (seeded). They are put back when the run ends.
 */

import { Code, CsiError } from "../../src/errors.ts";
import { forceRelease } from "../../src/follow/owner.ts";
import { createFollowVolume } from "../../src/follow/volume.ts";
import type { NodeService } from "../../src/csi/node.ts";
import {
  BACKUP_INTERVAL_PROPERTY,
  BACKUP_KEEP_PROPERTY,
  backupVolume,
} from "../../src/replicate/backup.ts";
import { MANAGED_PROPERTY, MANAGED_VALUE } from "../../src/zfs/names.ts";
import { MemoryStore } from "../support/memory_store.ts";
import { Prng } from "../support/prng.ts";
import { VirtualTime } from "./clock.ts";
import { Invariants, type Violation } from "./invariants.ts";
import { type NodeCaller, type NodeMethod, Nomad } from "./nomad.ts";
import { PoolModel } from "./pool_model.ts";
import type { Scenario, Step } from "./schedule.ts";
import { CSI_BASE, PARENT, SimNode } from "./sim_node.ts";
import { FaultyStore, StoreFaults } from "./store_faults.ts";

/** The volumes' names, by index. */
export const VOLUME_NAMES = ["pg", "db", "mq"] as const;
/** When every run starts (virtual): 2026-03-01T00:00:00Z. */
const START_MS = Date.UTC(2026, 2, 1);
/** How many log lines of the plugins a run keeps for its report. */
const LOG_LINES = 400;

/** What a run found. */
export interface RunResult {
  readonly scenario: Scenario;
  /** The first invariant that broke, if any. */
  readonly violation: Violation | undefined;
  /** Steps run (all of them, or up to the one that broke an invariant). */
  readonly stepsRun: number;
  readonly virtualMs: number;
  readonly timersFired: number;
  /** The plugins' last log lines and Nomad's calls, for a report. */
  readonly log: readonly string[];
  readonly trace: readonly string[];
  /** What the invariant checks noticed on the way that may explain a failure. */
  readonly hints: readonly string[];
}

/** How a run is made. */
export interface RunOptions {
  /**
   * The plugins' log level: "info" (the default) for a run to read, "warn" for many runs
   * (formatting every line costs time; a failing seed is run again to be read).
   */
  readonly logLevel?: "info" | "warn";
}

/** Runs a scenario; see the module doc. */
export async function runScenario(
  scenario: Scenario,
  options: RunOptions = {},
): Promise<RunResult> {
  const world = new World(scenario, options);
  return await world.run();
}

class World implements NodeCaller {
  readonly #s: Scenario;
  readonly #clock = new VirtualTime(START_MS);
  readonly #rng: Prng;
  readonly #bucket = new MemoryStore({ chunkSize: 65_536 });
  readonly #faults = new StoreFaults();
  readonly nodes: SimNode[] = [];
  readonly #volumes: string[];
  readonly #inv: Invariants;
  readonly #nomad: Nomad;
  readonly #log: string[] = [];
  /** Rejecters of the calls in flight to each plugin incarnation (a kill fails them). */
  readonly #inFlight = new Map<string, Set<(err: unknown) => void>>();
  #guid = 0;
  /** Which pause or kill of a node is the latest (an older one's end does nothing). */
  readonly #latest = new Map<string, number>();
  #token = 0;

  readonly #logLevel: "info" | "warn";

  constructor(s: Scenario, options: RunOptions) {
    this.#s = s;
    this.#logLevel = options.logLevel ?? "info";
    this.#rng = new Prng((s.seed ^ 0x5bd1e995) >>> 0);
    this.#volumes = s.keeps.map((_, i) => VOLUME_NAMES[i]!);
    this.#inv = new Invariants({
      clock: this.#clock,
      nodes: this.nodes,
      bucket: this.#bucket,
      volumes: this.#volumes,
    });
    this.#nomad = new Nomad(this.#clock, this, this.#inv);
  }

  async run(): Promise<RunResult> {
    const restore = [this.#clock.install(), this.#installFs(), this.#installRandom()];
    const crashes = (e: PromiseRejectionEvent) => {
      e.preventDefault();
      this.#inv.fail("crash", `unhandled promise rejection: ${describeError(e.reason)}`);
    };
    globalThis.addEventListener("unhandledrejection", crashes);
    let stepsRun = 0;
    try {
      await this.#setUp();
      for (const [i, step] of this.#s.steps.entries()) {
        await this.#clock.advanceTo(this.#clock.now + step.dt);
        if (this.#broken()) break;
        this.#apply(step);
        this.#inv.step = i;
        stepsRun = i + 1;
        await this.#clock.settle();
        this.#inv.afterStep();
        if (this.#broken()) break;
      }
      if (!this.#broken()) await this.#drain();
    } finally {
      globalThis.removeEventListener("unhandledrejection", crashes);
      for (const r of restore.reverse()) r();
    }
    return {
      scenario: this.#s,
      violation: this.#inv.violations[0],
      stepsRun,
      virtualMs: this.#clock.now - START_MS,
      timersFired: this.#clock.fired,
      log: this.#log.slice(-LOG_LINES),
      trace: this.#nomad.trace,
      hints: this.#inv.hints,
    };
  }

  /** Whether an invariant broke, a timer threw or the model met a command it does not know. */
  #broken(): boolean {
    for (const f of this.#clock.faults.splice(0)) {
      this.#inv.fail("crash", `a timer callback threw: ${describeError(f.error)}`, [
        f.actor ?? "test",
      ]);
    }
    for (const n of this.nodes) {
      const u = n.pool.runner.unexpected[0];
      if (u) this.#inv.fail("sim", `the model pool does not know a command: ${u.message}`);
    }
    return this.#inv.violations.length > 0;
  }

  async #setUp(): Promise<void> {
    const s = this.#s;
    for (let i = 0; i < s.nodes; i++) {
      const name = `n${i + 1}`;
      const pool: PoolModel = new PoolModel({
        flavour: s.flavour,
        parent: PARENT,
        wallSeconds: () => Math.floor(node.wallMs() / 1000),
        nextGuid: () => this.#nextGuid(),
        latency: () => this.#rng.int(1, 25),
        sleep: (ms) => this.#clock.sleep(ms),
        onChange: () => this.#inv.poolChanged(),
        onWritable: (dataset) => this.#inv.madeWritable(node, dataset),
        onReadOnly: (dataset) => this.#inv.madeReadOnly(node, dataset),
        onTouch: (what, argv) => this.#inv.touched(name, what, argv),
      });
      const node: SimNode = new SimNode({
        name,
        pool,
        clock: this.#clock,
        settings: {
          ttlSeconds: s.ttlSeconds,
          takeoverAfterMs: s.takeoverAfterSeconds * 1000,
          maxChainLength: s.maxChainLength,
        },
        store: () => this.#storeFor(name),
        randomHex: (bytes) => this.#hex(bytes),
        log: (line) => this.#logLine(line),
        logLevel: this.#logLevel,
      });
      pool.addFilesystem("tank");
      pool.addFilesystem(PARENT);
      // Neighbours the plugin must never touch, one with a name that starts like the parent's.
      pool.addFilesystem("tank/other", { "org.zfs-csi:managed": "yes" });
      pool.addFilesystem(`${PARENT}x`);
      pool.fs.mkdirp(`${CSI_BASE}/staging`);
      pool.fs.mkdirp(`${CSI_BASE}/per-alloc`);
      this.nodes.push(node);
    }
    for (const [i, name] of this.#volumes.entries()) {
      await createFollowVolume(this.#bucket, {
        name,
        settings: {
          capacityBytes: 0,
          properties: {
            [BACKUP_INTERVAL_PROPERTY]: "60",
            [BACKUP_KEEP_PROPERTY]: s.keeps[i]!,
            [MANAGED_PROPERTY]: MANAGED_VALUE,
          },
        },
        parameters: { follow: "true" },
        ttlSeconds: s.ttlSeconds,
        node: "n1",
        nowMs: this.#clock.now,
      });
      this.#inv.created(name);
    }
    for (const node of this.nodes) node.start();
    await this.#clock.settle();
  }

  #storeFor(node: string): FaultyStore {
    return new FaultyStore({
      bucket: this.#bucket,
      node,
      faults: this.#faults,
      clock: this.#clock,
      latency: () => this.#rng.int(2, 40),
      watch: {
        ownerFaulted: (n, volume) => this.#inv.ownerFaulted(n, volume),
        ownerWritten: (n, volume) => this.#inv.ownerWritten(n, volume),
        deleted: (n, key) => this.#inv.deleted(n, key),
      },
    });
  }

  #nextGuid(): string {
    // Unique across the world's pools, as ZFS's random 64-bit guids are in practice.
    this.#guid++;
    return String(1_000_000_000_000 + this.#guid * 7_919 + this.#rng.int(0, 7_000));
  }

  #hex(bytes: number): string {
    return [...this.#rng.bytes(bytes)].map((b) => b.toString(16).padStart(2, "0")).join("");
  }

  #logLine(line: string): void {
    this.#log.push(`+${this.#clock.monotonic}ms ${line}`);
    if (this.#log.length > 2 * LOG_LINES) this.#log.splice(0, LOG_LINES);
  }

  #volume(step: { vol: number }): string {
    return this.#volumes[step.vol % this.#volumes.length]!;
  }

  /** A step's node: by index, or (-1) where the volume's job runs now. */
  #node(step: { node: number; vol?: number }): SimNode {
    if (step.node >= 0) return this.nodes[step.node % this.nodes.length]!;
    const v = step.vol === undefined ? undefined : this.#volume({ vol: step.vol });
    return (v === undefined ? undefined : this.#nomad.current(v)?.node) ?? this.nodes[0]!;
  }

  #apply(step: Step): void {
    const nomad = this.#nomad;
    switch (step.op) {
      case "place":
        return nomad.place(this.#volume(step), this.#node(step));
      case "stop":
        return nomad.stop(this.#volume(step));
      case "move":
        return nomad.move(this.#volume(step), this.#node(step));
      case "replace":
        return nomad.replace(this.#volume(step), step.gap);
      case "lose": {
        // Nomad places the lost node's jobs on another node.
        const lost = this.#node(step);
        let to = this.#node({ node: step.to });
        if (to === lost) to = this.nodes[(this.nodes.indexOf(lost) + 1) % this.nodes.length]!;
        return nomad.lose(lost, step.ms, to);
      }
      case "write":
        return nomad.write(this.#volume(step));
      case "backup":
        return this.#backup(this.#node(step), this.#volume(step));
      case "pause":
        return this.#pause(this.#node(step), step.ms);
      case "kill":
        return this.#kill(this.#node(step), step.ms);
      case "clock":
        this.#node(step).offsetMs = step.offsetMs;
        return;
      case "fault":
        this.#faults.queue(this.#node(step).name, {
          target: step.target,
          kind: step.kind,
          slowMs: step.slowMs,
          left: step.count,
        });
        return;
      case "outage":
        this.#faults.outage(this.#node(step).name, this.#clock.now + step.ms, step.kind);
        return;
      case "takeover":
        return this.#takeover(this.#volume(step));
    }
  }

  /**
   * An operator's `zfs-csi takeover`, run as the README says: only when the holder is lost
   * (Nomad has lost contact with its node, or the node is paused, or its plugin is down).
   */
  #takeover(volume: string): void {
    const holder = this.#inv.owner(volume)?.holder;
    const node = this.nodes.find((n) => n.name === holder);
    if (!node || !(this.#nomad.isLost(node) || node.paused || !node.plugin)) return;
    void forceRelease(this.#storeFor("operator"), volume, {
      by: `zfs-csi takeover on node "operator"`,
      nowMs: this.#clock.now,
    }).catch((err) => this.#logLine(`operator takeover failed: ${describeError(err)}`));
  }

  /** A scheduled backup of the volume's copy on `node`, as its scheduler would run it. */
  #backup(node: SimNode, volume: string): void {
    const plugin = node.plugin;
    if (!plugin || node.paused) return;
    const dataset = `${PARENT}/${volume}`;
    void this.#clock.runAs(plugin.actor, () =>
      plugin.follow.scheduledBackup(
        dataset,
        { skipIfBusy: true },
        (o) => backupVolume(plugin.backup, dataset, o),
      )).catch((err) =>
        this.#logLine(`${node.name}: scheduled backup failed: ${describeError(err)}`)
      );
  }

  #pause(node: SimNode, ms: number): void {
    if (node.paused) return;
    const token = ++this.#token;
    this.#latest.set(node.name, token);
    node.pause();
    this.#clock.setTimeout(() => {
      if (this.#latest.get(node.name) === token) node.resume();
    }, ms);
  }

  #kill(node: SimNode, ms: number): void {
    const plugin = node.plugin;
    if (!plugin) return;
    node.kill();
    for (const reject of this.#inFlight.get(plugin.actor) ?? []) {
      reject(new CsiError(Code.UNAVAILABLE, "the plugin's socket closed (killed)"));
    }
    this.#inFlight.delete(plugin.actor);
    this.#clock.setTimeout(() => {
      if (!node.plugin) node.start();
    }, ms);
  }

  call(node: SimNode, method: NodeMethod, req: Record<string, unknown>): Promise<unknown> {
    const plugin = node.plugin;
    if (!plugin) {
      return Promise.reject(new CsiError(Code.UNAVAILABLE, "connection refused (plugin down)"));
    }
    const pending = this.#inFlight.get(plugin.actor) ?? new Set();
    this.#inFlight.set(plugin.actor, pending);
    return new Promise((resolve, reject) => {
      pending.add(reject);
      const service: Pick<NodeService, NodeMethod> = plugin.node;
      // The gRPC boundary: requests arrive as plain objects, checked by the handler.
      const handler = service[method].bind(plugin.node) as (r: unknown) => Promise<unknown>;
      this.#clock.runAs(plugin.actor, () => handler(req))
        .then(resolve, reject)
        .finally(() => pending.delete(reject));
    });
  }

  /**
   * After the last step: every node back, the store healthy, every job stopped, and time for
   * the stops (and their retries) to end; then a last check.
   */
  async #drain(): Promise<void> {
    this.#inv.step = this.#s.steps.length;
    this.#faults.clear();
    for (const node of this.nodes) {
      this.#latest.delete(node.name);
      node.resume();
      if (!node.plugin) node.start();
    }
    await this.#clock.advanceTo(this.#clock.now + 60_000);
    if (this.#broken()) return;
    for (let waited = 0; waited < 15 * 60_000; waited += 10_000) {
      // Stages still running, or started by a retry, end up stopped too.
      this.#nomad.shutdown();
      await this.#clock.advanceTo(this.#clock.now + 10_000);
      if (this.#broken()) return;
      if (this.#nomad.allocs.every((a) => a.state === "done")) break;
    }
    this.#inv.afterStep();
  }

  /** Deno.lstat, realPath and mkdir answer from the running node's model file system. */
  #installFs(): () => void {
    const saved = { lstat: Deno.lstat, realPath: Deno.realPath, mkdir: Deno.mkdir };
    const fsHere = () => {
      const actor = this.#clock.actor;
      const node = actor && this.nodes.find((n) => actor.startsWith(`${n.name}#`));
      if (!node) throw new Error("file system access outside a simulated node");
      return node.pool.fs;
    };
    Deno.lstat = (path) => Promise.resolve().then(() => fsHere().lstat(String(path)));
    Deno.realPath = (path) => Promise.resolve().then(() => fsHere().realPath(String(path)));
    Deno.mkdir = (path, options) =>
      Promise.resolve().then(() => fsHere().mkdir(String(path), options?.recursive === true));
    return () => Object.assign(Deno, saved);
  }

  /** crypto.getRandomValues from the seed (uids, upload ids): runs repeat exactly. */
  #installRandom(): () => void {
    const saved = crypto.getRandomValues;
    const rng = new Prng((this.#s.seed ^ 0x2545f491) >>> 0);
    const fill = <T extends ArrayBufferView | null>(array: T): T => {
      if (array) {
        const bytes = new Uint8Array(array.buffer, array.byteOffset, array.byteLength);
        bytes.set(rng.bytes(bytes.length));
      }
      return array;
    };
    crypto.getRandomValues = fill;
    return () => {
      crypto.getRandomValues = saved;
    };
  }
}

function describeError(err: unknown): string {
  if (err instanceof Error) return `${err.name}: ${err.message}`;
  return String(err);
}
