/**
 * A run of the fault-schedule test is a {@linkcode Scenario}: the world's settings and a list of
 * steps, each `dt` ms of virtual time after the one before. A seed makes one with
 * {@linkcode generate} (mulberry32, tests/support/prng.ts); a failing one is printed as JSON
 * and replayed as it is, so a scenario is also a fixed test.
 *
 * Steps name volumes and nodes by index. `node: -1` means the node where the volume's job runs
 * at that moment (the first node when it runs nowhere): chosen as the run goes, the same way
 * every time, since runs are deterministic.
 */

import { Prng } from "../support/prng.ts";
import type { Flavour } from "./pool_model.ts";
import type { FaultKind, FaultTarget } from "./store_faults.ts";

/** One step of a schedule. */
export type Step =
  /** Nomad places the volume's job on a node (when it runs nowhere). */
  | { dt: number; op: "place"; vol: number; node: number }
  /** Nomad stops the volume's job. */
  | { dt: number; op: "stop"; vol: number }
  /** Nomad moves the volume's job to a node (stop, then start there). */
  | { dt: number; op: "move"; vol: number; node: number }
  /** A new allocation replaces the job's on the same node, overlapping by `gap` ms. */
  | { dt: number; op: "replace"; vol: number; gap: number }
  /** Nomad loses contact with a node for `ms`, and places its jobs on node `to`. */
  | { dt: number; op: "lose"; node: number; vol: number; ms: number; to: number }
  /** The volume's running jobs write. */
  | { dt: number; op: "write"; vol: number }
  /** A scheduled backup of the volume's copy on a node. */
  | { dt: number; op: "backup"; vol: number; node: number }
  /** The node is frozen for `ms` (a paused VM). */
  | { dt: number; op: "pause"; node: number; vol: number; ms: number }
  /** The node's plugin is killed, and started again `ms` later. */
  | { dt: number; op: "kill"; node: number; vol: number; ms: number }
  /** The node's wall clock is set `offsetMs` from true time (a skew or a step). */
  | { dt: number; op: "clock"; node: number; offsetMs: number }
  /** The node's next `count` store requests to `target` fail as `kind` says. */
  | {
    dt: number;
    op: "fault";
    node: number;
    vol: number;
    target: FaultTarget;
    kind: FaultKind;
    count: number;
    slowMs: number;
  }
  /** Every store request the node starts in the next `ms` fails. */
  | { dt: number; op: "outage"; node: number; vol: number; ms: number; kind: "503" | "timeout" }
  /** An operator runs `zfs-csi takeover` for the volume. */
  | { dt: number; op: "takeover"; vol: number };

/** A whole run: settings and steps. */
export interface Scenario {
  readonly seed: number;
  readonly flavour: Flavour;
  readonly nodes: number;
  /** Each volume's keep policy (its `backup_keep`). */
  readonly keeps: readonly string[];
  readonly ttlSeconds: number;
  readonly takeoverAfterSeconds: number;
  readonly maxChainLength: number;
  readonly steps: readonly Step[];
}

const KEEPS = ["last=1", "last=2", "hourly=1", "hourly=2", "last=1,hourly=1", "last=3,daily=1"];

/** How many steps a generated scenario has by default. */
export const DEFAULT_STEPS = 60;

/** The scenario of a seed. */
export function generate(seed: number, steps = DEFAULT_STEPS): Scenario {
  const r = new Prng(seed);
  const nodes = r.int(2, 3);
  const volumes = r.int(1, 2);
  const out: Step[] = [];
  const g = new Gen(r, nodes, volumes, out);
  // Every run starts with the jobs placed.
  for (let v = 0; v < volumes; v++) {
    out.push({ dt: r.int(0, 500), op: "place", vol: v, node: r.int(0, nodes - 1) });
  }
  while (out.length < steps) g.motif();
  return {
    seed,
    flavour: r.chance(0.5) ? "openzfs" : "zfs-fuse",
    nodes,
    keeps: Array.from({ length: volumes }, () => r.pick(KEEPS)),
    ttlSeconds: 30,
    takeoverAfterSeconds: r.pick([30, 60]),
    maxChainLength: r.pick([2, 2, 3, 4, 5]),
    steps: out.slice(0, steps),
  };
}

/** Emits steps, alone or as the short sequences that make the known races likely. */
class Gen {
  readonly #r: Prng;
  readonly #nodes: number;
  readonly #volumes: number;
  readonly #out: Step[];

  constructor(r: Prng, nodes: number, volumes: number, out: Step[]) {
    this.#r = r;
    this.#nodes = nodes;
    this.#volumes = volumes;
    this.#out = out;
  }

  #vol(): number {
    return this.#r.int(0, this.#volumes - 1);
  }

  #node(): number {
    return this.#r.int(0, this.#nodes - 1);
  }

  /** A node by index, or (-1) the one running the volume's job when the step comes. */
  #someNode(): number {
    return this.#r.chance(0.6) ? -1 : this.#node();
  }

  /** A short gap, a pause between operations, or a long wait (a lease running out). */
  #dt(): number {
    const x = this.#r.next();
    if (x < 0.4) return this.#r.int(0, 400);
    if (x < 0.9) return this.#r.int(500, 15_000);
    return this.#r.int(20_000, 150_000);
  }

  #push(...steps: Step[]): void {
    this.#out.push(...steps);
  }

  #fault(
    dt: number,
    node: number,
    vol: number,
    target: FaultTarget,
    kind: FaultKind,
    count = this.#r.int(1, 3),
  ): Step {
    return {
      dt,
      op: "fault",
      node,
      vol,
      target,
      kind,
      count,
      slowMs: this.#r.int(20_000, 400_000),
    };
  }

  #outage(dt: number, node: number, vol: number, ms: number): Step {
    return { dt, op: "outage", node, vol, ms, kind: this.#r.chance(0.5) ? "503" : "timeout" };
  }

  /** One motif: a single step, or a short sequence. */
  motif(): void {
    const r = this.#r;
    const x = r.next();
    const v = this.#vol();
    if (x < 0.2) {
      this.#push({ dt: this.#dt(), op: "write", vol: v });
    } else if (x < 0.3) {
      this.#push({ dt: this.#dt(), op: "backup", vol: v, node: -1 });
    } else if (x < 0.37) {
      this.#push({ dt: this.#dt(), op: "move", vol: v, node: this.#node() });
    } else if (x < 0.41) {
      this.#push(
        r.chance(0.5)
          ? { dt: this.#dt(), op: "stop", vol: v }
          : { dt: this.#dt(), op: "place", vol: v, node: this.#node() },
      );
    } else if (x < 0.48) {
      // A quick succession of writes, releases and backups (names taken within one second).
      for (let i = r.int(2, 5); i > 0; i--) {
        this.#push({ dt: r.int(0, 300), op: "write", vol: v });
        this.#push(
          r.chance(0.5)
            ? { dt: r.int(0, 400), op: "replace", vol: v, gap: r.int(-200, 200) }
            : { dt: r.int(0, 400), op: "backup", vol: v, node: -1 },
        );
      }
    } else if (x < 0.53) {
      this.#push({ dt: this.#dt(), op: "replace", vol: v, gap: r.int(-300, 300) });
    } else if (x < 0.58) {
      // A node's clock: minutes off, or stepped back or forward a little.
      const offsetMs = r.chance(0.5) ? r.int(-600_000, 600_000) : r.int(-3_000, 3_000);
      this.#push({ dt: this.#dt(), op: "clock", node: this.#node(), offsetMs });
    } else if (x < 0.65) {
      const target = r.pick(["owner", "manifest", "stream", "any"] as const);
      const kind = r.pick(["503", "timeout", "lost", "slow"] as const);
      this.#push(this.#fault(this.#dt(), this.#someNode(), v, target, kind));
    } else if (x < 0.68) {
      this.#push(this.#outage(this.#dt(), this.#someNode(), v, r.int(5_000, 200_000)));
    } else if (x < 0.74) {
      this.#stallsMidBackup(v);
    } else if (x < 0.8) {
      this.#stageStalls(v);
    } else if (x < 0.84) {
      this.#push({
        dt: this.#dt(),
        op: "kill",
        node: this.#someNode(),
        vol: v,
        ms: r.int(500, 60_000),
      });
    } else if (x < 0.9) {
      this.#releaseStalls(v);
    } else if (x < 0.94) {
      const ms = r.int(10_000, 300_000);
      this.#push({ dt: this.#dt(), op: "lose", node: -1, vol: v, ms, to: this.#node() });
    } else if (x < 0.96) {
      this.#push({ dt: this.#dt(), op: "takeover", vol: v });
    } else if (x < 0.98) {
      const ms = r.int(20_000, 200_000);
      this.#push({ dt: this.#dt(), op: "pause", node: this.#someNode(), vol: v, ms });
    } else {
      this.#push({ dt: r.int(30_000, 200_000), op: "write", vol: v });
    }
  }

  /**
   * The holder stops mid-backup (paused, or its upload crawls while its store requests fail)
   * and Nomad places its job elsewhere; the new holder writes and backs up before the old one
   * goes on with its backup.
   */
  #stallsMidBackup(v: number): void {
    const r = this.#r;
    if (r.chance(0.5)) {
      // A backup whose head does not move (its owner read fails): its snapshot is stored,
      // off the head's chain, and the next backup's chain is one longer than the head's.
      this.#push({ dt: this.#dt(), op: "write", vol: v });
      this.#push(this.#fault(r.int(0, 300), -1, v, "owner", "503", 1));
      this.#push({ dt: 0, op: "backup", vol: v, node: -1 });
    }
    const paused = r.chance(0.5);
    if (!paused) this.#push(this.#fault(this.#dt(), -1, v, "stream", "slow"));
    this.#push({ dt: paused ? this.#dt() : r.int(0, 300), op: "backup", vol: v, node: -1 });
    const ms = r.int(100_000, 300_000);
    this.#push(
      paused
        ? { dt: r.int(0, 300), op: "pause", node: -1, vol: v, ms }
        : this.#outage(r.int(0, 300), -1, v, ms),
    );
    this.#push({ dt: r.int(0, 10_000), op: "lose", node: -1, vol: v, ms, to: this.#node() });
    this.#push({ dt: r.int(60_000, 150_000), op: "write", vol: v });
    this.#push({ dt: r.int(0, 20_000), op: "backup", vol: v, node: -1 });
  }

  /**
   * A stage receives for a long time (its download crawls) while its lease renewals fail (a
   * store outage, or a pause and then failing renewals), and Nomad places the job elsewhere.
   */
  #stageStalls(v: number): void {
    const r = this.#r;
    const to = this.#node();
    this.#push(this.#fault(this.#dt(), to, v, "stream", "slow"));
    this.#push({ dt: r.int(0, 1_000), op: "move", vol: v, node: to });
    const ms = r.int(60_000, 300_000);
    if (r.chance(0.5)) {
      this.#push(this.#outage(r.int(300, 3_000), -1, v, ms));
    } else {
      this.#push({ dt: r.int(300, 3_000), op: "pause", node: -1, vol: v, ms });
      this.#push(this.#fault(0, -1, v, "owner", r.pick(["503", "timeout"] as const)));
    }
    this.#push({ dt: r.int(0, 5_000), op: "lose", node: -1, vol: v, ms, to: this.#node() });
  }

  /**
   * A release (or any upload) crawls while Nomad loses the node: the leases of the volume
   * released and of the node's other volumes must still be renewed.
   */
  #releaseStalls(v: number): void {
    const r = this.#r;
    this.#push(this.#fault(this.#dt(), -1, v, "stream", "slow"));
    const w = this.#vol();
    this.#push(
      r.chance(0.5)
        ? { dt: r.int(0, 2_000), op: "move", vol: w, node: this.#node() }
        : { dt: r.int(0, 2_000), op: "stop", vol: w },
    );
    if (r.chance(0.3)) this.#push(this.#outage(r.int(0, 3_000), -1, w, r.int(60_000, 300_000)));
    const ms = r.int(60_000, 400_000);
    this.#push({
      dt: r.int(0, 10_000),
      op: "lose",
      node: -1,
      vol: this.#vol(),
      ms,
      to: this.#node(),
    });
  }
}

/**
 * Reads a scenario given as JSON (a failing seed's print-out).
 * @throws {SyntaxError} naming what is wrong
 */
export function parseScenario(text: string): Scenario {
  const v = JSON.parse(text) as Partial<Scenario>;
  const need = (ok: boolean, what: string) => {
    if (!ok) throw new SyntaxError(`Scenario: ${what}`);
  };
  need(typeof v === "object" && v !== null, "not a JSON object");
  need(v.flavour === "openzfs" || v.flavour === "zfs-fuse", `flavour "openzfs" or "zfs-fuse"`);
  need(Number.isInteger(v.nodes) && v.nodes! >= 1 && v.nodes! <= 5, "nodes 1 to 5");
  need(Array.isArray(v.keeps) && v.keeps.length >= 1, "keeps, one per volume");
  need(Array.isArray(v.steps), "steps, a list");
  for (const k of ["seed", "ttlSeconds", "takeoverAfterSeconds", "maxChainLength"] as const) {
    need(Number.isInteger(v[k]), `${k} a whole number`);
  }
  for (const [i, s] of v.steps!.entries()) {
    need(typeof s === "object" && s !== null && typeof s.op === "string", `step ${i}: an op`);
    need(Number.isFinite(s.dt) && s.dt >= 0, `step ${i}: dt >= 0`);
  }
  return v as Scenario;
}
