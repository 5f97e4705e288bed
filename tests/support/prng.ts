/**
 * A small seeded pseudo-random generator (mulberry32) for tests that pick random cases: the
 * same seed gives the same cases, so a failure found with one seed can be run again.
 */

/** Deterministic random numbers from a 32-bit seed. */
export class Prng {
  #state: number;

  constructor(seed: number) {
    if (!Number.isInteger(seed) || seed < 0 || seed > 0xffff_ffff) {
      throw new RangeError(`Seed must be an integer in [0, 2^32), got ${seed}`);
    }
    this.#state = seed;
  }

  /** A number in [0, 1). */
  next(): number {
    this.#state = (this.#state + 0x6d2b79f5) >>> 0;
    let t = this.#state;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 0x1_0000_0000;
  }

  /** An integer in [min, max]. */
  int(min: number, max: number): number {
    return min + Math.floor(this.next() * (max - min + 1));
  }

  /** True with probability `p`. */
  chance(p: number): boolean {
    return this.next() < p;
  }

  /** One element of a non-empty array. */
  pick<T>(items: readonly T[]): T {
    if (items.length === 0) throw new RangeError("Cannot pick from an empty array");
    return items[this.int(0, items.length - 1)]!;
  }

  /** `n` pseudo-random bytes. */
  bytes(n: number): Uint8Array {
    const out = new Uint8Array(n);
    for (let i = 0; i < n; i++) out[i] = Math.floor(this.next() * 256);
    return out;
  }
}

/**
 * The seed named by an environment variable's value: a decimal integer, "random" for a fresh
 * one, or `fallback` when unset.
 * @throws {RangeError} for anything else
 */
export function seedFrom(value: string | undefined, fallback: number): number {
  if (value === undefined || value === "") return fallback;
  if (value === "random") return crypto.getRandomValues(new Uint32Array(1))[0]!;
  if (!/^\d+$/.test(value) || Number(value) > 0xffff_ffff) {
    throw new RangeError(`Seed must be a decimal integer below 2^32 or "random", got "${value}"`);
  }
  return Number(value);
}
