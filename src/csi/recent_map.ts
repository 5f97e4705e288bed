/**
 * A map that keeps only its most recently set entries: for caches whose keys keep coming (a
 * new allocation's directories, a new volume's dataset) and whose old keys are never told to
 * go away. Setting an entry makes it the newest; past `max` entries the oldest are dropped.
 */
export class RecentMap<K, V> {
  readonly #max: number;
  readonly #entries = new Map<K, V>();

  /** @param max how many entries to keep at most (a positive integer) */
  constructor(max: number) {
    if (!Number.isInteger(max) || max < 1) throw new RangeError(`max must be >= 1, not ${max}`);
    this.#max = max;
  }

  get size(): number {
    return this.#entries.size;
  }

  get(key: K): V | undefined {
    return this.#entries.get(key);
  }

  /** Sets `key` as the newest entry, dropping the oldest ones past the limit. */
  set(key: K, value: V): this {
    this.#entries.delete(key);
    this.#entries.set(key, value);
    for (const oldest of this.#entries.keys()) {
      if (this.#entries.size <= this.#max) break;
      this.#entries.delete(oldest);
    }
    return this;
  }

  delete(key: K): boolean {
    return this.#entries.delete(key);
  }
}
