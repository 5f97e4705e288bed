/**
 * Virtual time for the fault-schedule test (tests/faults/): while installed, `setTimeout`,
 * `setInterval`, their clears, `Date.now`, `performance.now`, `AbortSignal.timeout` and
 * `Deno.unrefTimer` are this clock's (`new Date()` without an argument is not: the plugin uses
 * it only for log stamps), so the real src/follow and src/replicate code runs on time that moves only when the
 * test says so. Time advances only once every promise has settled (one real macrotask turn
 * drains the microtask queue, and nothing in the simulation waits on real I/O), so a run is a
 * pure function of its schedule.
 *
 * Every timer belongs to the actor that set it: a node's plugin incarnation (tracked through
 * AsyncLocalStorage, which follows awaits), or none (the test itself). A paused actor's timers
 * do not fire until it resumes (then the overdue ones fire first, in order); a dead actor's
 * timers never fire. Since every store request and zfs command of the simulation waits on such
 * a timer, pausing an actor freezes all its work in flight, and killing it drops that work.
 */

import { AsyncLocalStorage } from "node:async_hooks";
import { setImmediate as realImmediate } from "node:timers";

/** Whether an actor's timers may fire. */
export type ActorState = "running" | "paused" | "dead";

interface Timer {
  readonly id: number;
  at: number;
  seq: number;
  readonly fn: () => void;
  readonly every: number | undefined;
  readonly actor: string | undefined;
}

/** An error thrown by a timer callback (in a real process: an uncaught exception). */
export interface TimerFault {
  readonly actor: string | undefined;
  readonly error: unknown;
}

/** The simulation's clock and timers; see the module doc. */
export class VirtualTime {
  #now: number;
  readonly #origin: number;
  #seq = 0;
  #nextId = 1;
  readonly #timers = new Map<number, Timer>();
  readonly #actors = new AsyncLocalStorage<string>();
  readonly #states = new Map<string, ActorState>();
  /** Timer callbacks that threw, oldest first. */
  readonly faults: TimerFault[] = [];
  /** How many timers fired (a measure of a run's work). */
  fired = 0;

  /** @param startMs the virtual wall clock at the start, ms since the epoch */
  constructor(startMs: number) {
    this.#now = startMs;
    this.#origin = startMs;
  }

  /** Virtual ms since the epoch (the true time, which no node's own clock need agree with). */
  get now(): number {
    return this.#now;
  }

  /** Virtual ms since the clock was made: what a monotonic clock reads. */
  get monotonic(): number {
    return this.#now - this.#origin;
  }

  /** The actor the running code belongs to, if any. */
  get actor(): string | undefined {
    return this.#actors.getStore();
  }

  /** Runs `fn` (and everything it awaits or schedules) as `actor`. */
  runAs<T>(actor: string, fn: () => T): T {
    return this.#actors.run(actor, fn);
  }

  /** Pauses, resumes or kills an actor; a dead actor's timers are dropped. */
  setState(actor: string, state: ActorState): void {
    this.#states.set(actor, state);
    if (state !== "dead") return;
    for (const [id, t] of this.#timers) if (t.actor === actor) this.#timers.delete(id);
  }

  stateOf(actor: string): ActorState {
    return this.#states.get(actor) ?? "running";
  }

  setTimeout(fn: () => void, ms = 0): number {
    return this.#add(fn, ms, undefined);
  }

  setInterval(fn: () => void, ms = 0): number {
    return this.#add(fn, ms, Math.max(1, ms));
  }

  clear(id: number | undefined): void {
    if (id !== undefined) this.#timers.delete(id);
  }

  /**
   * Resolves after `ms` of virtual time, as the current actor (a pause delays it); rejects with
   * the signal's reason as soon as it aborts.
   */
  sleep(ms: number, signal?: AbortSignal): Promise<void> {
    if (!signal) return new Promise((resolve) => this.#add(resolve, ms, undefined));
    return new Promise((resolve, reject) => {
      if (signal.aborted) return reject(signal.reason);
      const onAbort = () => {
        this.clear(id);
        reject(signal.reason);
      };
      const id = this.#add(
        () => {
          signal.removeEventListener("abort", onAbort);
          resolve();
        },
        ms,
        undefined,
      );
      signal.addEventListener("abort", onAbort, { once: true });
    });
  }

  #add(fn: () => void, ms: number, every: number | undefined): number {
    const actor = this.actor;
    // A dead actor's new timers never fire (its code may still be running a last microtask).
    const id = this.#nextId++;
    if (actor !== undefined && this.stateOf(actor) === "dead") return id;
    const delay = Number.isFinite(ms) && ms > 0 ? ms : 0;
    this.#timers.set(id, { id, at: this.#now + delay, seq: this.#seq++, fn, every, actor });
    return id;
  }

  /**
   * Replaces the global timers and clocks with this clock's until the returned function is
   * called. Deno.unrefTimer becomes a no-op (no virtual timer keeps a process alive).
   */
  install(): () => void {
    const g = globalThis as unknown as Record<string, unknown>;
    const saved = {
      setTimeout: g.setTimeout,
      setInterval: g.setInterval,
      clearTimeout: g.clearTimeout,
      clearInterval: g.clearInterval,
      dateNow: Date.now,
      perfNow: performance.now,
      unref: Deno.unrefTimer,
      abortTimeout: AbortSignal.timeout,
    };
    const call = (fn: unknown, args: unknown[]) => () => {
      if (typeof fn === "function") fn(...args);
    };
    g.setTimeout = (fn: unknown, ms?: number, ...args: unknown[]) =>
      this.setTimeout(call(fn, args), ms);
    g.setInterval = (fn: unknown, ms?: number, ...args: unknown[]) =>
      this.setInterval(call(fn, args), ms);
    g.clearTimeout = (id?: number) => this.clear(id);
    g.clearInterval = (id?: number) => this.clear(id);
    Date.now = () => this.#now;
    performance.now = () => this.monotonic;
    Deno.unrefTimer = () => {};
    // AbortSignal.timeout runs on a timer of its own: give it this clock's.
    AbortSignal.timeout = (ms: number) => {
      const c = new AbortController();
      this.setTimeout(() => c.abort(new DOMException("The signal timed out", "TimeoutError")), ms);
      return c.signal;
    };
    return () => {
      Object.assign(g, {
        setTimeout: saved.setTimeout,
        setInterval: saved.setInterval,
        clearTimeout: saved.clearTimeout,
        clearInterval: saved.clearInterval,
      });
      Date.now = saved.dateNow;
      performance.now = saved.perfNow;
      Deno.unrefTimer = saved.unref;
      AbortSignal.timeout = saved.abortTimeout;
    };
  }

  /** Lets every promise that can settle without time passing settle (one real macrotask). */
  settle(): Promise<void> {
    return new Promise((resolve) => realImmediate(resolve));
  }

  /** Moves time to `target`, firing every timer due on the way (each after a settle). */
  async advanceTo(target: number): Promise<void> {
    for (;;) {
      await this.settle();
      const next = this.#due(target);
      if (!next) break;
      this.#fire(next);
    }
    if (target > this.#now) this.#now = target;
    await this.settle();
  }

  /** The timer that fires next by `target`: the earliest of those whose actor runs. */
  #due(target: number): Timer | undefined {
    let best: Timer | undefined;
    for (const t of this.#timers.values()) {
      if (t.at > target) continue;
      if (t.actor !== undefined && this.stateOf(t.actor) !== "running") continue;
      if (!best || t.at < best.at || (t.at === best.at && t.seq < best.seq)) best = t;
    }
    return best;
  }

  #fire(t: Timer): void {
    if (t.at > this.#now) this.#now = t.at;
    if (t.every === undefined) {
      this.#timers.delete(t.id);
    } else {
      t.at = this.#now + t.every;
      t.seq = this.#seq++;
    }
    this.fired++;
    const run = () => {
      try {
        t.fn();
      } catch (error) {
        this.faults.push({ actor: t.actor, error });
      }
    };
    if (t.actor === undefined) run();
    else this.#actors.run(t.actor, run);
  }

  /** The timers still pending (for a run's end: what a killed actor left is gone already). */
  get pending(): number {
    return this.#timers.size;
  }
}
