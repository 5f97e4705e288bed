/**
 * Nomad as the simulated nodes see it (/work/shared/guide/nomad.md): each volume is used by one
 * job whose allocation runs on one node at a time. An allocation starts with NodeStage (skipped
 * when its staging path is mounted already, as Nomad's client checks) and NodePublish, then its
 * task writes to its target path; it stops with NodeUnpublish, then NodeUnstage. A failed stage
 * fails the allocation, and Nomad places it again after a delay; a failed NodeUnpublish or
 * NodeUnstage is tried again. Nomad before 1.11 overlaps one allocation's stop with the next
 * one's start on the same node ("replace"). When Nomad loses contact with a node, it places the
 * node's allocations elsewhere while they keep running there; when contact comes back, it stops
 * them.
 */

import { CsiError } from "../../src/errors.ts";
import type { VirtualTime } from "./clock.ts";
import type { Invariants } from "./invariants.ts";
import { CSI_BASE, type SimNode } from "./sim_node.ts";

/** How long Nomad waits before placing a failed allocation again. */
const RESCHEDULE_MS = 30_000;
/** How often a stage is tried for one placement, at most. */
const STAGE_ATTEMPTS = 8;
/** How long before a failed NodeUnpublish or NodeUnstage is sent again, and how often. */
const RETRY_STOP_MS = 15_000;
const STOP_ATTEMPTS = 10;
/** The capability every call carries (file system, single node writer). */
const CAPABILITY = {
  mount: { fs_type: "", mount_flags: [], volume_mount_group: "" },
  access_mode: { mode: "SINGLE_NODE_WRITER" },
  access_type: "mount",
};

/** One allocation of a volume's job. */
export interface Alloc {
  readonly id: string;
  readonly volume: string;
  readonly node: SimNode;
  state: "starting" | "running" | "stopping" | "done";
  /** Replaced elsewhere after Nomad lost its node; it runs on until told to stop. */
  orphan: boolean;
  readonly target: string;
}

/** How Nomad reaches a node's plugin. */
export interface NodeCaller {
  /**
   * Calls a NodeService method on `node`'s plugin; rejects UNAVAILABLE when the plugin is down
   * or dies during the call.
   */
  call(node: SimNode, method: NodeMethod, req: Record<string, unknown>): Promise<unknown>;
}

/** The node RPCs Nomad sends. */
export type NodeMethod =
  | "NodeStageVolume"
  | "NodePublishVolume"
  | "NodeUnpublishVolume"
  | "NodeUnstageVolume";

/** Nomad's side; see the module doc. */
export class Nomad {
  readonly #clock: VirtualTime;
  readonly #caller: NodeCaller;
  readonly #inv: Invariants;
  readonly allocs: Alloc[] = [];
  #nextAlloc = 1;
  #nextWrite = 1;
  /** The placement in force per volume: retries of an older one stop. */
  readonly #placement = new Map<string, number>();
  /** How many losses of contact with each node are in force. */
  readonly #lost = new Map<SimNode, number>();
  /** Set by shutdown: nothing new starts. */
  #closed = false;
  /** What Nomad did, for the trace of a failing seed. */
  readonly trace: string[] = [];

  constructor(clock: VirtualTime, caller: NodeCaller, inv: Invariants) {
    this.#clock = clock;
    this.#caller = caller;
    this.#inv = inv;
  }

  /** The allocation of `volume` Nomad manages (not an orphan), if any is live. */
  current(volume: string): Alloc | undefined {
    return this.allocs.find((a) => a.volume === volume && !a.orphan && a.state !== "done");
  }

  /** Places the job of `volume` on `node`, unless an allocation of it is live. */
  place(volume: string, node: SimNode): void {
    if (this.current(volume)) return;
    this.#start(volume, node, this.#newPlacement(volume), 1);
  }

  /** Stops the job of `volume`. */
  stop(volume: string): void {
    const a = this.current(volume);
    if (a?.state === "running") void this.#stop(a);
  }

  /** The run's end: no more placements, and every running allocation is stopped. */
  shutdown(): void {
    this.#closed = true;
    for (const a of this.allocs) if (a.state === "running") void this.#stop(a);
  }

  /** Moves the job of `volume` to `node` (a drain): stop, then start there. */
  move(volume: string, node: SimNode): void {
    const a = this.current(volume);
    if (!a) return this.place(volume, node);
    if (a.state !== "running") return;
    const placement = this.#newPlacement(volume);
    void this.#stop(a).then(() => {
      if (this.#placement.get(volume) === placement) this.#start(volume, node, placement, 1);
    });
  }

  /**
   * Replaces the allocation of `volume` on its node with a new one there, the new one's start
   * `gapMs` after the old one's stop begins (before it when negative), as Nomad before 1.11
   * overlaps them.
   */
  replace(volume: string, gapMs: number): void {
    const a = this.current(volume);
    if (a?.state !== "running") return;
    const placement = this.#newPlacement(volume);
    const startNew = () => {
      if (this.#placement.get(volume) === placement) this.#start(volume, a.node, placement, 1);
    };
    const stopOld = () => void this.#stop(a);
    // The new allocation is not "current" until the old one is done: mark the old one first.
    a.orphan = true;
    if (gapMs <= 0) {
      startNew();
      this.#clock.setTimeout(stopOld, -gapMs);
    } else {
      stopOld();
      this.#clock.setTimeout(startNew, gapMs);
    }
  }

  /**
   * Nomad loses contact with `node` for `ms`: its allocations run on there as orphans and are
   * placed again on `to`; when contact is back, the orphans are stopped.
   */
  lose(node: SimNode, ms: number, to: SimNode): void {
    const lost = this.allocs.filter((a) => a.node === node && !a.orphan && a.state !== "done");
    this.#lost.set(node, (this.#lost.get(node) ?? 0) + 1);
    for (const a of lost) {
      a.orphan = true;
      this.trace.push(`${this.#t()} nomad lost ${node.name}: ${a.id} of ${a.volume} replaced`);
      this.#start(a.volume, to, this.#newPlacement(a.volume), 1);
    }
    this.#clock.setTimeout(() => {
      this.#lost.set(node, (this.#lost.get(node) ?? 1) - 1);
      for (const a of lost) if (a.state === "running") void this.#stop(a);
    }, ms);
  }

  /** Whether Nomad has lost contact with `node` now (an operator would call it down). */
  isLost(node: SimNode): boolean {
    return (this.#lost.get(node) ?? 0) > 0;
  }

  /** The task of every running allocation of `volume` writes once (a paused node's cannot). */
  write(volume: string): void {
    for (const a of this.allocs) {
      if (a.volume !== volume || a.state !== "running" || a.node.paused) continue;
      const id = `w${this.#nextWrite++}`;
      const w = a.node.pool.write(a.target, id);
      if (w.ok) this.#inv.acked(volume, a.node.name, id, w.object);
    }
  }

  #newPlacement(volume: string): number {
    const n = (this.#placement.get(volume) ?? 0) + 1;
    this.#placement.set(volume, n);
    return n;
  }

  #t(): string {
    return `t=${this.#clock.monotonic}ms`;
  }

  #start(volume: string, node: SimNode, placement: number, attempt: number): void {
    if (this.#closed) return;
    const a: Alloc = {
      id: `a${this.#nextAlloc++}`,
      volume,
      node,
      state: "starting",
      orphan: false,
      target: `${CSI_BASE}/per-alloc/a${
        this.#nextAlloc - 1
      }/${volume}/rw-file-system-single-node-writer`,
    };
    this.allocs.push(a);
    void this.#run(a, placement, attempt);
  }

  async #run(a: Alloc, placement: number, attempt: number): Promise<void> {
    const { node, volume } = a;
    const staging = stagingPath(volume);
    node.pool.fs.mkdirp(staging);
    node.pool.fs.mkdirp(a.target.slice(0, a.target.lastIndexOf("/")));
    const ids = { volume_id: `${volume}@*`, volume_context: {}, volume_capability: CAPABILITY };
    try {
      if (!node.pool.fs.top(staging)) {
        await this.#call(a, "NodeStageVolume", { ...ids, staging_target_path: staging });
      }
      if (!node.pool.fs.top(a.target)) {
        await this.#call(a, "NodePublishVolume", {
          ...ids,
          staging_target_path: staging,
          target_path: a.target,
          readonly: false,
        });
      }
    } catch {
      a.state = "done";
      // A staged volume is unstaged when its allocation fails (Nomad's postrun hook).
      if (node.pool.fs.top(staging)) void this.#stopCalls(a);
      if (attempt < STAGE_ATTEMPTS) {
        this.#clock.setTimeout(() => {
          if (this.#placement.get(volume) === placement && !this.current(volume)) {
            this.#start(volume, node, placement, attempt + 1);
          }
        }, RESCHEDULE_MS);
      }
      return;
    }
    if (a.state === "starting") a.state = "running";
  }

  async #stop(a: Alloc): Promise<void> {
    a.state = "stopping";
    await this.#stopCalls(a);
    a.state = "done";
  }

  async #stopCalls(a: Alloc): Promise<void> {
    const ids = { volume_id: `${a.volume}@*` };
    for (
      const [method, req] of [
        ["NodeUnpublishVolume", { ...ids, target_path: a.target }],
        ["NodeUnstageVolume", { ...ids, staging_target_path: stagingPath(a.volume) }],
      ] as const
    ) {
      for (let attempt = 1;; attempt++) {
        try {
          await this.#call(a, method, req);
          if (method === "NodeUnstageVolume") this.#inv.unstaged(a.volume, a.node);
          break;
        } catch {
          if (attempt >= STOP_ATTEMPTS) return;
          await this.#clock.sleep(RETRY_STOP_MS);
        }
      }
    }
  }

  async #call(a: Alloc, method: NodeMethod, req: Record<string, unknown>): Promise<void> {
    try {
      await this.#caller.call(a.node, method, req);
      this.trace.push(`${this.#t()} ${a.node.name} ${method} ${a.volume} (${a.id}): OK`);
    } catch (err) {
      const what = err instanceof CsiError ? `${err.code} ${err.message}` : String(err);
      this.trace.push(`${this.#t()} ${a.node.name} ${method} ${a.volume} (${a.id}): ${what}`);
      throw err;
    }
  }
}

/** Nomad's staging path of a volume on any node. */
export function stagingPath(volume: string): string {
  return `${CSI_BASE}/staging/default/${volume}/rw-file-system-single-node-writer`;
}
