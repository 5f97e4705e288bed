/**
 * Keeping a follow volume's lease, and proving it before acting on it.
 *
 * The lease is the owner object's etag changing (owner.ts): the holder writes it again at least
 * every third of its TTL, and a taker may act only once it has seen the same etag for the TTL
 * plus `--takeover-after`, counted on its own monotonic clock from its first look (rule.ts).
 *
 * A proof is one such conditional write (If-Match on the holder's last write, or on a record
 * read again that still names this node and generation): when it lands, no node has acquired
 * the volume since this node did. What a node may do on the strength of a proof, and for how
 * long, is {@linkcode proofMarginMs}.
 */

import type { Logger } from "../log.ts";
import type { Store } from "../store/store.ts";
import { FencedError, type Holding, renew } from "./owner.ts";

/** One-shot timers; replaceable in tests and in the fault-schedule simulator. */
export interface FollowTimers {
  /**
   * Calls `fn` once after `ms`, unless the returned function is called first; must not keep
   * the process alive.
   */
  after(fn: () => void, ms: number): () => void;
}

/** `setTimeout`, unref'd: a lease alone never keeps the plugin running. */
export const REAL_TIMERS: FollowTimers = {
  after(fn, ms) {
    const id = setTimeout(fn, ms);
    Deno.unrefTimer(id);
    return () => clearTimeout(id);
  },
};

/** The clocks a lease is kept and proved by. */
export interface LeaseClocks {
  /** Wall clock (ms since the epoch): only for `renewedAt`, which people read. */
  readonly now: () => number;
  /** Monotonic ms: for every decision. */
  readonly monotonic: () => number;
}

/** How often a holder writes its lease: every third of the TTL, at least every second. */
export function renewEveryMs(ttlSeconds: number): number {
  return Math.max(1, ttlSeconds / 3) * 1000;
}

/**
 * How long after a proving write was SENT (this node's monotonic clock) a step that needs the
 * holding (making a copy writable) may still complete on its strength: half the TTL.
 *
 * Why that is safe. The proof gave the owner object a new etag at some instant after it was
 * sent. No node can have seen that etag before it existed, and the takeover rule lets a node
 * acquire only after seeing one etag unchanged for the TTL plus `--takeover-after` (>= 0) on its
 * own monotonic clock; an acquire based on an older etag fails its If-Match. So no node
 * acquires the volume earlier than one TTL after the proof was sent, measured on the taker's
 * clock, and the taker makes its own copy writable later still (after its own proof). A step
 * that ends within half the TTL of the send, on this node's clock, therefore ends before any
 * taker could have acquired; the other half absorbs the two monotonic clocks running at
 * slightly different rates (ppm in practice) and the time the proof's answer took to arrive is
 * inside the window already (it is counted from the send). Wall clocks are never compared. An
 * explicit takeover (`zfs-csi takeover`) is an operator's decision that the holder is gone and
 * is outside this rule. A step that ends later is not trusted: another proof decides (if it
 * lands under the same generation, no node acquired in between, whenever the step took
 * effect).
 */
export function proofMarginMs(ttlSeconds: number): number {
  return ttlSeconds * 500;
}

/** A conditional write that proved this node holds the volume. */
export interface Proof {
  /** The holding as the proof wrote it. */
  readonly holding: Holding;
  /** Monotonic ms just before the proof was sent. */
  readonly sentAt: number;
}

/**
 * Writes the lease once, conditionally, as proof that this node holds `held`'s generation now.
 * @throws {FencedError} when another node acquired it, or it was released or deleted
 * @throws {StoreError} when the store fails (nothing is proved then)
 */
export async function proveHolding(
  store: Store,
  volumeKey: string,
  held: Holding,
  clocks: LeaseClocks,
): Promise<Proof> {
  const sentAt = clocks.monotonic();
  const holding = await renew(store, volumeKey, held, clocks.now());
  return { holding, sentAt };
}

/**
 * Renews one holding every {@linkcode renewEveryMs} until stopped, while a stage receives
 * (its copy is not marked held yet, so the node's own renewals do not see it). A renewal that
 * fails is logged and tried again at the next turn; one refused because the volume was taken
 * over stops the renewals. Whatever it saw, the stage proves the holding again before it makes
 * the copy writable ({@linkcode proveHolding}): a renewal that failed with a 503 or a timeout
 * proves nothing either way.
 */
export class LeaseKeeper {
  readonly #timers: FollowTimers;
  #holding: Holding;
  #fenced: FencedError | undefined;
  #failures = 0;
  #inFlight: Promise<void> | undefined;
  #cancel: (() => void) | undefined;
  #stopped = false;

  constructor(
    store: Store,
    volumeKey: string,
    holding: Holding,
    opts: { ttlSeconds: number; clocks: LeaseClocks; timers: FollowTimers; log: Logger },
  ) {
    this.#timers = opts.timers;
    this.#holding = holding;
    const every = renewEveryMs(opts.ttlSeconds);
    const renewOnce = async () => {
      try {
        this.#holding = await renew(store, volumeKey, this.#holding, opts.clocks.now());
        this.#failures = 0;
      } catch (err) {
        if (err instanceof FencedError) {
          this.#fenced = err;
          return;
        }
        this.#failures++;
        opts.log.warn("lease renewal during a receive failed; retrying", {
          error: err,
          failuresInARow: this.#failures,
        });
      } finally {
        this.#inFlight = undefined;
      }
    };
    const tick = () => {
      if (this.#stopped || this.#fenced) return;
      this.#cancel = this.#timers.after(tick, every);
      // A renewal still waiting for the store is not doubled.
      this.#inFlight ??= renewOnce();
    };
    this.#cancel = this.#timers.after(tick, every);
  }

  /** The holding as last written. */
  get holding(): Holding {
    return this.#holding;
  }

  /**
   * Stops renewing, after the renewal under way.
   * @returns the holding as last written
   * @throws {FencedError} when a renewal found the volume taken over
   */
  async stop(): Promise<Holding> {
    this.#stopped = true;
    this.#cancel?.();
    this.#cancel = undefined;
    await this.#inFlight;
    if (this.#fenced) throw this.#fenced;
    return this.#holding;
  }
}
