/**
 * Self-fencing: a holder that promised it in the owner object (`selfFence`, written by a node
 * that runs with `--takeover-after`) makes its writable copy read-only by itself when no
 * conditional write of the owner object (renewal, proof, head move) has landed for three
 * quarters of its TTL, counted from the moment the last one that landed was SENT, on this
 * node's monotonic clock. The copy is then "suspended": still held here (nothing is written to
 * the store), read-only (OpenZFS remounts a mounted filesystem read-only at once, and the job
 * gets EROFS; zfs-fuse cannot remount, so there the job's writes go on), and marked so
 * ({@linkcode FOLLOW_SUSPENDED_PROPERTY}) for a restarted plugin. A later write that lands under
 * the same generation makes it writable again right after, within half the TTL of that write's
 * send (lease.ts proofMarginMs, the rule of a stage's proof); a write refused because another
 * node took the volume over fences it instead (mover.ts).
 *
 * Why three quarters. A taker acquires only after seeing one etag unchanged for the holder's
 * TTL plus `--takeover-after` on its own monotonic clock (rule.ts), from a first look that
 * cannot come before the write that made the etag, which was sent at S. The holder's copy is
 * read-only by S + 3/4 TTL on the holder's clock; the last quarter absorbs two clocks running
 * at slightly different rates and the time `zfs set` takes. A `zfs set` that ends later than
 * S + TTL did not keep that promise: it is logged as an error, and later suspensions on this
 * node start as much earlier as that set took (never earlier than half the TTL after S), so a
 * slow pool eats into the renewals' slack, not into the takeover's margin. A plugin that is not
 * running fences nothing: a killed plugin's copies are unguarded until it starts again (then
 * mover.ts adopts them first).
 */

import { ZfsError } from "../errors.ts";
import type { Logger } from "../log.ts";
import type { PropertyList } from "../zfs/args.ts";
import type { Zfs } from "../zfs/zfs.ts";
import { type FollowTimers, proofMarginMs } from "./lease.ts";

/** "on" while this node's copy is suspended (read-only by self-fencing); "off" after. */
export const FOLLOW_SUSPENDED_PROPERTY = "org.zfs-csi:follow-suspended";

/** How long after a landed write's send a promising holder's copy becomes read-only: 3/4 TTL. */
export function suspendAfterMs(ttlSeconds: number): number {
  return ttlSeconds * 750;
}

/**
 * How long a copy a previous run of the plugin left writable stays so without a write of this
 * run landing: a quarter of the TTL (see {@linkcode SelfFence.adopt}).
 */
export function adoptGraceMs(ttlSeconds: number): number {
  return ttlSeconds * 250;
}

/** How soon a `zfs set` that failed to suspend a copy is tried again. */
const RETRY_MS = 1_000;

/** What SelfFence works with. */
export interface SelfFenceDeps {
  readonly zfs: Pick<Zfs, "setProperties">;
  readonly log: Logger;
  /** Monotonic ms. */
  readonly monotonic: () => number;
  readonly timers: FollowTimers;
  /** The TTL this node writes in the owner object. */
  readonly ttlSeconds: number;
}

/** A copy of a follow volume this node holds. */
export interface HeldCopy {
  /** The CSI volume name. */
  readonly volume: string;
  /** The generation it is writable under. */
  readonly generation: number;
}

/** A watched copy as metrics and logs show it. */
export interface FenceState {
  readonly volume: string;
  readonly dataset: string;
  readonly suspended: boolean;
  /** Whether its holding promises self-fencing (else it is never suspended). */
  readonly promised: boolean;
  /** Ms since the last write that landed was sent; undefined: none since this plugin started. */
  readonly sinceWriteMs: number | undefined;
}

interface Entry extends HeldCopy {
  /** Send time of the newest conditional write that landed; undefined: none by this process. */
  provedAt: number | undefined;
  /** Until a write lands: when an adopted copy is due (monotonic ms). */
  readonly graceUntil: number | undefined;
  promised: boolean;
  suspended: boolean;
  cancel: (() => void) | undefined;
}

/** The self-fencing of this node's writable copies; see the module doc. */
export class SelfFence {
  readonly #d: SelfFenceDeps;
  readonly #entries = new Map<string, Entry>();
  /** Datasets this process opened, adopted or forgot: a restart's leftovers are the others. */
  readonly #known = new Set<string>();
  /** The tail of each dataset's changes (suspend, resume, open, forget): one at a time. */
  readonly #turns = new Map<string, Promise<void>>();
  /** How much earlier suspensions start, learnt from slow `zfs set`s (at most 1/4 TTL). */
  #leadMs = 0;

  constructor(deps: SelfFenceDeps) {
    this.#d = deps;
  }

  /** Whether this process has opened, adopted or forgotten `dataset`. */
  known(dataset: string): boolean {
    return this.#known.has(dataset);
  }

  /** Whether `dataset` is watched and suspended now. */
  suspended(dataset: string): boolean {
    return this.#entries.get(dataset)?.suspended ?? false;
  }

  /**
   * Makes a copy writable (`props`, e.g. readonly=off) in its turn, and watches it from then on,
   * as proved by a write sent at `sentAt`.
   * @throws {ZfsError} when `zfs set` fails (the copy is then watched as it was before, if at all)
   */
  open(
    dataset: string,
    copy: HeldCopy,
    proof: { readonly sentAt: number; readonly promised: boolean },
    props: PropertyList,
  ): Promise<void> {
    return this.#turn(dataset, async () => {
      const before = this.#entries.get(dataset);
      await this.#d.zfs.setProperties(dataset, [
        ...props,
        ...(before?.suspended ? [[FOLLOW_SUSPENDED_PROPERTY, "off"] as const] : []),
      ]);
      before?.cancel?.();
      const entry: Entry = {
        ...copy,
        provedAt: proof.sentAt,
        graceUntil: undefined,
        promised: proof.promised,
        suspended: false,
        cancel: undefined,
      };
      this.#entries.set(dataset, entry);
      this.#known.add(dataset);
      this.#schedule(dataset, entry);
    });
  }

  /**
   * Watches a copy a previous run of the plugin left held here (writable, or suspended as its
   * marker says), unless this process handled it already, before this process's first write
   * for it is sent. When was the old process's last write sent? Unknown here: it kept its
   * promise until it stopped, and a promise to be read-only by S + 3/4 TTL may be due already.
   * So a promising copy stays writable only for {@linkcode adoptGraceMs} unless a write of this
   * process lands meanwhile ({@linkcode proved}); then it is suspended. A restart that takes
   * longer than about the last quarter of the TTL plus `--takeover-after` (minus the renewal's
   * slack) leaves a window in which another node may take the volume over while the job
   * still writes here: a plugin that does not run fences nothing.
   * @returns whether it was adopted
   */
  adopt(
    dataset: string,
    copy: HeldCopy,
    state: { readonly promised: boolean; readonly suspended: boolean },
  ): boolean {
    if (this.#known.has(dataset)) return false;
    const entry: Entry = {
      ...copy,
      provedAt: undefined,
      graceUntil: this.#d.monotonic() + adoptGraceMs(this.#d.ttlSeconds),
      promised: state.promised,
      suspended: state.suspended,
      cancel: undefined,
    };
    this.#entries.set(dataset, entry);
    this.#known.add(dataset);
    if (entry.suspended) {
      // The marker says so; `readonly` is set again in case the old process stopped between
      // its two sets (zfs-fuse sets one property per call).
      void this.#turn(dataset, () => this.#setSuspended(dataset)).catch((err) =>
        this.#d.log.error("could not make a suspended copy read-only again", {
          dataset,
          error: err,
        })
      );
    }
    this.#schedule(dataset, entry);
    return true;
  }

  /**
   * What the owner object says of an adopted copy's promise, read before any write of this
   * process landed (the promise in force is the one last written).
   */
  promised(dataset: string, generation: number, promised: boolean): void {
    const entry = this.#entries.get(dataset);
    if (!entry || entry.generation !== generation || entry.provedAt !== undefined) return;
    entry.promised = promised;
    this.#schedule(dataset, entry);
  }

  /** Whether the copy is watched and its holding promises self-fencing. */
  promises(dataset: string): boolean {
    return this.#entries.get(dataset)?.promised ?? false;
  }

  /**
   * A conditional write of the owner object under `generation` landed; it was sent at `sentAt`,
   * writing `promised`. A suspended copy is made writable again when `resume` allows it (not
   * while a stage prepares it: its own proof opens it) and the write is fresh enough.
   */
  proved(
    dataset: string,
    generation: number,
    write: { readonly sentAt: number; readonly promised: boolean; readonly resume: boolean },
  ): void {
    const entry = this.#entries.get(dataset);
    if (!entry || entry.generation !== generation) return;
    if (entry.provedAt === undefined || write.sentAt > entry.provedAt) {
      entry.provedAt = write.sentAt;
    }
    entry.promised = write.promised;
    if (entry.suspended) {
      if (write.resume) this.#resumeIfFresh(dataset, entry);
    } else {
      this.#schedule(dataset, entry);
    }
  }

  /**
   * Stops watching `dataset` (it is released, fenced or made read-only for another reason),
   * after any change of it under way; a suspended copy's marker is cleared (it stays read-only).
   */
  forget(dataset: string): Promise<void> {
    const entry = this.#entries.get(dataset);
    entry?.cancel?.();
    this.#entries.delete(dataset);
    this.#known.add(dataset);
    return this.#turn(dataset, async () => {
      if (!entry?.suspended) return;
      await this.#d.zfs.setProperties(dataset, [[FOLLOW_SUSPENDED_PROPERTY, "off"]]).catch((err) =>
        this.#d.log.warn("could not clear the suspended marker of a copy no longer watched", {
          dataset,
          error: err,
        })
      );
    });
  }

  /** Every watched copy. */
  state(): FenceState[] {
    const now = this.#d.monotonic();
    return [...this.#entries].map(([dataset, e]) => ({
      volume: e.volume,
      dataset,
      suspended: e.suspended,
      promised: e.promised,
      sinceWriteMs: e.provedAt === undefined ? undefined : now - e.provedAt,
    }));
  }

  /** When a promising writable copy must be read-only, relative to its last landed write. */
  get #dueAfterMs(): number {
    return suspendAfterMs(this.#d.ttlSeconds) - this.#leadMs;
  }

  /** Sets (or clears) the timer that suspends `entry` when its last write grows too old. */
  #schedule(dataset: string, entry: Entry): void {
    entry.cancel?.();
    entry.cancel = undefined;
    if (!entry.promised || entry.suspended) return;
    const due = entry.provedAt !== undefined
      ? entry.provedAt + this.#dueAfterMs
      : entry.graceUntil ?? -Infinity;
    const wait = due - this.#d.monotonic();
    // Overdue (a restarted plugin's copy, a write whose answer came late): at once.
    if (wait <= 0) void this.#suspend(dataset, entry);
    else entry.cancel = this.#d.timers.after(() => void this.#suspend(dataset, entry), wait);
  }

  #suspend(dataset: string, entry: Entry): Promise<void> {
    return this.#turn(dataset, async () => {
      if (this.#entries.get(dataset) !== entry || entry.suspended || !entry.promised) return;
      const { log, monotonic, ttlSeconds } = this.#d;
      const started = monotonic();
      const since = entry.provedAt === undefined ? undefined : started - entry.provedAt;
      if (
        since === undefined ? started < (entry.graceUntil ?? -Infinity) : since < this.#dueAfterMs
      ) {
        // A write landed while this waited for its turn.
        this.#schedule(dataset, entry);
        return;
      }
      log.error(
        "follow volume's lease was not renewed in time: this node makes its copy read-only " +
          "(suspended) until a write to the store proves it still holds the volume; if another " +
          "node took it over meanwhile, the copy is fenced instead",
        {
          volume: entry.volume,
          dataset,
          generation: entry.generation,
          msSinceLastWrite: since ?? "none since this plugin started",
          ttlSeconds,
        },
      );
      try {
        await this.#setSuspended(dataset);
      } catch (err) {
        if (err instanceof ZfsError && err.kind === "not_found") {
          this.#entries.delete(dataset);
          return;
        }
        log.error("could not make the copy read-only; trying again", { dataset, error: err });
        entry.cancel = this.#d.timers.after(() => void this.#suspend(dataset, entry), RETRY_MS);
        return;
      }
      const ended = monotonic();
      entry.suspended = true;
      this.#leadMs = Math.max(this.#leadMs, Math.min(ended - started, ttlSeconds * 250));
      if (entry.provedAt !== undefined && ended - entry.provedAt > ttlSeconds * 1000) {
        log.error(
          "the copy became read-only later than the lease allows: another node may have taken " +
            "the volume over while this copy was still writable (what was written here since " +
            "is then not the volume's); later suspensions on this node start earlier",
          {
            volume: entry.volume,
            dataset,
            msSinceLastWrite: ended - entry.provedAt,
            zfsSetMs: ended - started,
            leadMs: this.#leadMs,
          },
        );
      }
    });
  }

  /** Read-only, and marked so (readonly first: the marker never claims what is not so). */
  #setSuspended(dataset: string): Promise<void> {
    return this.#d.zfs.setProperties(dataset, [
      ["readonly", "on"],
      [FOLLOW_SUSPENDED_PROPERTY, "on"],
    ]);
  }

  /** Makes a suspended copy writable again if its last write is within the proof's margin. */
  #resumeIfFresh(dataset: string, entry: Entry): void {
    void this.#turn(dataset, async () => {
      if (this.#entries.get(dataset) !== entry || !entry.suspended) return;
      const { provedAt } = entry;
      const age = provedAt === undefined ? Infinity : this.#d.monotonic() - provedAt;
      if (age > proofMarginMs(this.#d.ttlSeconds)) return;
      try {
        await this.#d.zfs.setProperties(dataset, [
          ["readonly", "off"],
          [FOLLOW_SUSPENDED_PROPERTY, "off"],
        ]);
      } catch (err) {
        this.#d.log.warn(
          "could not make the suspended copy writable again; the next renewal tries",
          {
            dataset,
            error: err,
          },
        );
        return;
      }
      entry.suspended = false;
      this.#d.log.info("follow volume's lease renewed again: its copy is writable again", {
        volume: entry.volume,
        dataset,
        generation: entry.generation,
      });
      this.#schedule(dataset, entry);
    });
  }

  /** Runs `fn` after every earlier change of `dataset`, whatever their outcome. */
  #turn(dataset: string, fn: () => Promise<void>): Promise<void> {
    const run = (this.#turns.get(dataset) ?? Promise.resolve()).then(fn);
    const tail = run.catch(() => {});
    this.#turns.set(dataset, tail);
    void tail.then(() => {
      if (this.#turns.get(dataset) === tail) this.#turns.delete(dataset);
    });
    return run;
  }
}
