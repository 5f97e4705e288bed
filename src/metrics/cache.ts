/**
 * A value that is loaded at most once per time-to-live, however many callers ask: callers
 * within the TTL get the last value, and callers while a load runs share that load. So several
 * Prometheus servers scraping at once cost one collection.
 */

/** Options of a {@linkcode SharedCache}. */
export interface SharedCacheOptions {
  /** How long a loaded value is served, counted from the start of its load, in ms. */
  readonly ttlMs: number;
  /** A clock in ms that never jumps (default `performance.now()`); replaceable in tests. */
  readonly now?: () => number;
}

/** See the module doc. A failed load is not kept: the next caller loads again. */
export class SharedCache<T> {
  readonly #load: () => Promise<T>;
  readonly #ttlMs: number;
  readonly #now: () => number;
  #value: { readonly value: T; readonly at: number } | undefined;
  #inflight: Promise<T> | undefined;

  constructor(load: () => Promise<T>, options: SharedCacheOptions) {
    if (!(options.ttlMs >= 0)) throw new RangeError(`Invalid TTL ${options.ttlMs}`);
    this.#load = load;
    this.#ttlMs = options.ttlMs;
    this.#now = options.now ?? (() => performance.now());
  }

  /** The cached value while fresh, else the running load's, else a new load's. */
  get(): Promise<T> {
    const cached = this.#value;
    if (cached && this.#now() - cached.at < this.#ttlMs) return Promise.resolve(cached.value);
    if (this.#inflight) return this.#inflight;
    const at = this.#now();
    // Started on a later tick, so the bookkeeping below is in place before the load can end.
    const run: Promise<T> = Promise.resolve()
      .then(() => this.#load())
      .then((value) => {
        this.#value = { value, at };
        return value;
      })
      .finally(() => {
        if (this.#inflight === run) this.#inflight = undefined;
      });
    this.#inflight = run;
    return run;
  }
}
