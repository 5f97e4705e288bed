/**
 * Per-key locks that never wait: a busy key is reported at once, so the caller can answer
 * ABORTED as the CSI spec asks for an operation already pending on a volume.
 */

/** A held lock; releasing twice is harmless. */
export interface Held extends Disposable {
  release(): void;
}

/** A set of named locks with a synchronous test-and-set. */
export class KeyedLock {
  #held = new Set<string>();

  /**
   * Takes every key or none, in one synchronous step (no await between check and set).
   * Returns undefined when any key is already held.
   */
  tryAcquire(keys: readonly string[]): Held | undefined {
    const unique = [...new Set(keys)];
    if (unique.some((k) => this.#held.has(k))) return undefined;
    for (const k of unique) this.#held.add(k);
    let released = false;
    const release = () => {
      if (released) return;
      released = true;
      for (const k of unique) this.#held.delete(k);
    };
    return { release, [Symbol.dispose]: release };
  }

  /** Whether `key` is held now. */
  isHeld(key: string): boolean {
    return this.#held.has(key);
  }
}

import { Code, CsiError } from "./errors.ts";

/**
 * Runs `fn` holding `keys`; a key already held answers ABORTED at once (the CSI way of saying
 * "an operation is pending for this volume"), so the CO retries later.
 * @throws {CsiError} ABORTED when a key is busy
 */
export async function withLock<T>(
  locks: KeyedLock,
  keys: readonly string[],
  fn: () => Promise<T>,
): Promise<T> {
  const held = locks.tryAcquire(keys);
  if (!held) {
    throw new CsiError(
      Code.ABORTED,
      `An operation is already in progress for ${
        keys.map((k) => `"${k}"`).join(", ")
      }; retry later`,
    );
  }
  try {
    return await fn();
  } finally {
    held.release();
  }
}
