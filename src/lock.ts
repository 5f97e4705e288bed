/**
 * Per-key locks with a bounded, fair wait. A call for a busy volume waits its turn instead of
 * failing: Nomad's client treats any NodeStage/NodePublish error, ABORTED included, as fatal for
 * the allocation, and clients before 1.11 send overlapping calls for one volume (two allocations
 * sharing it, or a new one publishing while the previous one unpublishes).
 *
 * Several keys are taken all at once or not at all, and each key serves its waiters in arrival
 * order: a waiter takes its keys only when every one is free and it is first in line for each.
 * Arrival order is one order across all keys, so the earliest waiter can always proceed once the
 * holders finish: no deadlock, and no stream of later calls can pass a waiter forever.
 */

import { currentCall } from "./call_context.ts";
import { Code, CsiError } from "./errors.ts";

/** A held lock; releasing twice is harmless. */
export interface Held extends Disposable {
  release(): void;
}

/** How long a call waits for busy keys by default: well inside Nomad's 2-minute RPC timeout. */
export const DEFAULT_WAIT_MS = 60_000;

/** Options of {@linkcode KeyedLock.acquire}. */
export interface AcquireOptions {
  /** How long to wait for the keys, in milliseconds; the lock's default if unset. */
  readonly timeoutMs?: number;
  /** Stops the wait when aborted (e.g. the client cancelled the call). */
  readonly signal?: AbortSignal | undefined;
  /** What the caller is about to do, shown to those who then wait for it in vain. */
  readonly label?: string | undefined;
}

/** Who holds a key, and since when (`performance.now()` milliseconds). */
export interface Holder {
  readonly label: string;
  readonly since: number;
}

/** A wait for keys that ran out of time; {@linkcode withLock} turns it into UNAVAILABLE. */
export class LockTimeoutError extends Error {
  /** The keys waited for. */
  readonly keys: readonly string[];
  /** How long the caller waited, in milliseconds. */
  readonly waitedMs: number;
  /** The holders of those keys that were still busy, by key. */
  readonly holders: ReadonlyMap<string, Holder>;

  constructor(keys: readonly string[], waitedMs: number, holders: ReadonlyMap<string, Holder>) {
    super(`Timed out after ${waitedMs} ms waiting for ${quoted(keys)}`);
    this.name = "LockTimeoutError";
    this.keys = keys;
    this.waitedMs = waitedMs;
    this.holders = holders;
  }
}

interface Waiter {
  readonly keys: readonly string[];
  /** Takes the keys and settles the wait; called once, when the waiter's turn comes. */
  readonly grant: () => void;
}

/** A set of named locks: a synchronous test-and-set, and a fair, bounded wait. */
export class KeyedLock {
  readonly #held = new Map<string, Holder>();
  /** Waiters per key, in arrival order; a key with no waiters has no entry. */
  readonly #queues = new Map<string, Waiter[]>();
  readonly #waitMs: number;

  /**
   * @param options.waitMs how long {@linkcode acquire} waits by default (60 s)
   * @throws {RangeError} when waitMs is negative or not a number
   */
  constructor(options: { waitMs?: number } = {}) {
    const waitMs = options.waitMs ?? DEFAULT_WAIT_MS;
    if (!(waitMs >= 0)) throw new RangeError(`Cannot use wait time ${waitMs}: must be >= 0`);
    this.#waitMs = waitMs;
  }

  /**
   * Takes every key or none, in one synchronous step (no await between check and set). Never
   * waits: returns undefined when a key is held or earlier callers are waiting for one.
   */
  tryAcquire(keys: readonly string[], label = "an operation"): Held | undefined {
    const unique = [...new Set(keys)];
    if (!unique.every((k) => !this.#held.has(k) && !this.#queues.has(k))) return undefined;
    return this.#take(unique, label);
  }

  /**
   * Takes every key, waiting in line for busy ones; all at once, never some of them.
   * @throws {LockTimeoutError} when the keys are not free within the timeout
   * @throws the signal's reason when it is aborted first
   */
  acquire(keys: readonly string[], options: AcquireOptions = {}): Promise<Held> {
    const unique = [...new Set(keys)];
    const label = options.label ?? "an operation";
    const now = this.tryAcquire(unique, label);
    if (now) return Promise.resolve(now);
    const { signal } = options;
    if (signal?.aborted) return Promise.reject(signal.reason);
    const timeoutMs = options.timeoutMs ?? this.#waitMs;
    const started = performance.now();
    return new Promise<Held>((resolve, reject) => {
      const stop = () => {
        clearTimeout(timer);
        signal?.removeEventListener("abort", onAbort);
      };
      const waiter: Waiter = {
        keys: unique,
        grant: () => {
          stop();
          resolve(this.#take(unique, label));
        },
      };
      const giveUp = (err: unknown) => {
        stop();
        this.#leave(waiter);
        reject(err);
      };
      const onAbort = () => giveUp(signal?.reason);
      const timer = setTimeout(() => {
        const busy = new Map<string, Holder>();
        for (const k of unique) {
          const h = this.#held.get(k);
          if (h) busy.set(k, h);
        }
        giveUp(new LockTimeoutError(unique, Math.round(performance.now() - started), busy));
      }, timeoutMs);
      signal?.addEventListener("abort", onAbort, { once: true });
      for (const k of unique) {
        const queue = this.#queues.get(k);
        if (queue) queue.push(waiter);
        else this.#queues.set(k, [waiter]);
      }
    });
  }

  /** Whether `key` is held now. */
  isHeld(key: string): boolean {
    return this.#held.has(key);
  }

  /** Who holds `key` now, if anyone. */
  holder(key: string): Holder | undefined {
    return this.#held.get(key);
  }

  /** How many callers wait for `key` now. */
  waiting(key: string): number {
    return this.#queues.get(key)?.length ?? 0;
  }

  #take(keys: readonly string[], label: string): Held {
    const holder: Holder = { label, since: performance.now() };
    for (const k of keys) this.#held.set(k, holder);
    let released = false;
    const release = () => {
      if (released) return;
      released = true;
      for (const k of keys) {
        if (this.#held.get(k) === holder) this.#held.delete(k);
      }
      this.#wake(keys);
    };
    return { release, [Symbol.dispose]: release };
  }

  /** Removes a waiter that gave up; those behind it may now be first in line. */
  #leave(waiter: Waiter): void {
    for (const k of waiter.keys) {
      const queue = this.#queues.get(k);
      if (!queue) continue;
      const at = queue.indexOf(waiter);
      if (at >= 0) queue.splice(at, 1);
      if (queue.length === 0) this.#queues.delete(k);
    }
    this.#wake(waiter.keys);
  }

  /**
   * Grants the waiters that can go now. Only the first in line for one of `keys` can have become
   * able to (going needs being first for every key); granting takes keys, so one pass is enough.
   */
  #wake(keys: readonly string[]): void {
    for (const k of keys) {
      const first = this.#queues.get(k)?.[0];
      if (!first || !first.keys.every((j) => this.#isTurnOf(first, j))) continue;
      for (const j of first.keys) {
        const queue = this.#queues.get(j)!;
        queue.shift();
        if (queue.length === 0) this.#queues.delete(j);
      }
      first.grant();
    }
  }

  #isTurnOf(waiter: Waiter, key: string): boolean {
    return !this.#held.has(key) && this.#queues.get(key)?.[0] === waiter;
  }
}

/**
 * Runs `fn` holding `keys`, after waiting in line for them if another call holds one. The
 * label (what holds the keys) and the abort signal default to the RPC being served
 * ({@linkcode currentCall}).
 * @throws {CsiError} UNAVAILABLE when the keys stay busy for the whole wait, naming the keys,
 *   the wait and the holder; CANCELLED when the client cancelled the call while it waited
 */
export async function withLock<T>(
  locks: KeyedLock,
  keys: readonly string[],
  fn: () => Promise<T>,
  options: AcquireOptions = {},
): Promise<T> {
  const call = currentCall();
  const signal = options.signal ?? call?.signal;
  const label = options.label ?? call?.operation;
  let held = locks.tryAcquire(keys, label);
  if (!held) {
    const started = performance.now();
    try {
      held = await locks.acquire(keys, { ...options, label, signal });
    } catch (err) {
      if (err instanceof LockTimeoutError) throw busyError(err);
      if (signal?.aborted && err === signal.reason) {
        throw new CsiError(
          Code.CANCELLED,
          `Call cancelled while waiting for ${quoted(keys)}`,
          { cause: err },
        );
      }
      throw err;
    } finally {
      call?.waited?.(performance.now() - started);
    }
  }
  try {
    return await fn();
  } finally {
    held.release();
  }
}

function busyError(err: LockTimeoutError): CsiError {
  const now = performance.now();
  const holders = [...err.holders].map(([key, h]) =>
    `"${key}" is held by ${h.label} (for ${seconds(now - h.since)})`
  );
  const why = holders.length > 0
    ? holders.join(", ")
    : "earlier calls for the same keys were still waiting";
  return new CsiError(
    Code.UNAVAILABLE,
    `Volume busy: waited ${seconds(err.waitedMs)} for ${quoted(err.keys)}; ${why}. ` +
      "Retry later; if it stays busy, the plugin log shows what that call waits for",
    { cause: err },
  );
}

function seconds(ms: number): string {
  return ms >= 10_000 ? `${Math.round(ms / 1000)} s` : `${(ms / 1000).toFixed(1)} s`;
}

function quoted(keys: readonly string[]): string {
  return keys.map((k) => `"${k}"`).join(", ");
}
