/**
 * Per-key locks for the directory store, shared by every process (and every NFS client) that
 * uses the same directory: a lock is a directory `<dir>/<name>` made with mkdir, which exactly
 * one caller can create (also over NFS, where the server decides).
 *
 * A lock is told apart from a later one of the same name by a random token its holder writes
 * into it (`<name>/holder`), not by inode and timestamps: a removed lock's inode can come back
 * to the next mkdir within the same coarse-clock tick, and a slow holder's release would then
 * remove the new holder's lock. A lock without a token yet (being made, or its maker died in
 * between) is told by inode and timestamps.
 *
 * A holder that dies leaves its lock behind. A waiter breaks a lock only after seeing it
 * unchanged (same token) for `staleMs` (30 s) of its OWN monotonic clock, so clocks of
 * different machines are never compared. Breaking happens under a second lock
 * (`<name>.break`) and re-checks the lock is still the one seen, so two waiters never break a
 * fresh lock. A holder refuses to commit once it has held its lock for `holdMs` (10 s), well
 * before anyone may call it stale: a slow holder (a stalled NFS server) fails with
 * "unavailable" instead of writing after its lock was broken. What is not covered: a breaker
 * that dies inside the (microseconds long) break leaves `<name>.break`, which is itself broken
 * the same way after `staleMs`; two waiters doing that at the same instant could remove each
 * other's guard.
 */

import { errorCode } from "./file_errors.ts";
import { StoreError } from "./store.ts";

/** Timing of {@linkcode FileLocks}, in milliseconds. */
export interface FileLockOptions {
  /** A lock seen unchanged this long was left by a dead holder and is broken (30 s). */
  readonly staleMs?: number;
  /**
   * Longest wait for a lock before failing with "unavailable" (90 s: room to see a lock and
   * then its break guard go stale, one after the other).
   */
  readonly waitMs?: number;
  /** Longest a holder may take before it refuses to commit (10 s). */
  readonly holdMs?: number;
}

/** Locks as directories below one directory; see the module doc. */
export class FileLocks {
  readonly #dir: string;
  readonly #staleMs: number;
  readonly #waitMs: number;
  readonly #holdMs: number;

  /** @param dir where the lock directories live (made on first use; its parent must exist) */
  constructor(dir: string, options: FileLockOptions = {}) {
    this.#dir = dir;
    this.#staleMs = options.staleMs ?? 30_000;
    this.#waitMs = options.waitMs ?? 90_000;
    this.#holdMs = options.holdMs ?? 10_000;
    if (this.#holdMs >= this.#staleMs) {
      throw new RangeError(`Lock hold time ${this.#holdMs} ms must be below ${this.#staleMs} ms`);
    }
  }

  /**
   * Waits for the lock `name` (a file name) and takes it.
   * @param what the locked thing, for the timeout message
   * @param signal stops the wait (a call whose store wait ran out, src/store/wait.ts)
   * @throws {StoreError} unavailable when the lock stays taken for `waitMs`; errors of the
   * file-system calls as they are; the signal's reason when it aborts
   */
  async acquire(name: string, what: string, signal?: AbortSignal): Promise<FileLock> {
    const path = `${this.#dir}/${name}`;
    const start = performance.now();
    const watch = new StaleWatch(this.#staleMs);
    for (let attempt = 0;; attempt++) {
      signal?.throwIfAborted();
      if (await this.#tryMake(path)) {
        return new FileLock(path, await writeToken(path), this.#holdMs, what);
      }
      if (await watch.isStale(path) && await this.#breakStale(path, watch)) continue;
      if (performance.now() - start > this.#waitMs) {
        throw new StoreError(
          "unavailable",
          `Timed out after ${Math.round(this.#waitMs / 1000)} s waiting for the lock on ${what}: ` +
            `another writer holds ${path}; if none is running, remove that directory`,
        );
      }
      await sleep(Math.min(2 ** attempt, 50) * (0.5 + Math.random()), signal);
    }
  }

  async #tryMake(path: string): Promise<boolean> {
    try {
      await Deno.mkdir(path, { mode: 0o700 });
      return true;
    } catch (err) {
      if (errorCode(err) === "EEXIST") return false;
      if (errorCode(err) !== "ENOENT") throw err;
    }
    // Not recursive: the lock directory's parent (the store) must exist, never be made here.
    try {
      await Deno.mkdir(this.#dir, { mode: 0o700 });
    } catch (err) {
      if (errorCode(err) !== "EEXIST") throw err;
    }
    return false;
  }

  /**
   * Removes `path` if it is still the lock `watch` saw go stale, under `<path>.break`.
   * @returns whether it removed the lock
   */
  async #breakStale(path: string, watch: StaleWatch): Promise<boolean> {
    const guard = `${path}.break`;
    if (!await this.#tryMake(guard)) {
      // Another waiter is breaking it, or one died doing so: its guard goes stale in turn.
      if (await watch.isStale(guard)) await removeDir(guard);
      return false;
    }
    try {
      if (!await watch.isStale(path)) return false;
      await removeLock(path);
      return true;
    } finally {
      await removeDir(guard);
    }
  }
}

/** A taken lock; release it with `await using` or {@linkcode FileLock.release}. */
export class FileLock implements AsyncDisposable {
  readonly #path: string;
  readonly #identity: string;
  readonly #holdMs: number;
  readonly #what: string;
  readonly #takenAt = performance.now();
  #released = false;

  constructor(path: string, id: string, holdMs: number, what: string) {
    this.#path = path;
    this.#identity = id;
    this.#holdMs = holdMs;
    this.#what = what;
  }

  /**
   * Call right before the write the lock protects.
   * @throws {StoreError} unavailable when the lock was held too long to still be trusted
   */
  checkHeld(): void {
    const held = performance.now() - this.#takenAt;
    if (held > this.#holdMs) {
      throw new StoreError(
        "unavailable",
        `Gave up writing ${this.#what}: the store took ${Math.round(held)} ms under its lock ` +
          `(at most ${this.#holdMs} ms); try again`,
      );
    }
  }

  /** Removes the lock directory, unless it is no longer this lock (it was broken). */
  async release(): Promise<void> {
    if (this.#released) return;
    this.#released = true;
    try {
      if (await identity(this.#path) === this.#identity) await removeLock(this.#path);
    } catch (err) {
      if (errorCode(err) !== "ENOENT") throw err;
    }
  }

  [Symbol.asyncDispose](): Promise<void> {
    return this.release();
  }
}

/** Tracks, per path, how long the same lock directory has been seen. */
class StaleWatch {
  readonly #staleMs: number;
  readonly #seen = new Map<string, { id: string; since: number }>();

  constructor(staleMs: number) {
    this.#staleMs = staleMs;
  }

  /** Looks at `path` now: true when it is the same directory as `staleMs` ago. */
  async isStale(path: string): Promise<boolean> {
    let id: string;
    try {
      id = await identity(path);
    } catch (err) {
      if (errorCode(err) === "ENOENT") return false;
      throw err;
    }
    const now = performance.now();
    const seen = this.#seen.get(path);
    if (seen === undefined || seen.id !== id) {
      this.#seen.set(path, { id, since: now });
      return false;
    }
    return now - seen.since >= this.#staleMs;
  }
}

const TOKEN_FILE = "holder";

/**
 * Writes a fresh token into the lock directory just made; on failure removes the directory.
 * @returns the lock's identity
 */
async function writeToken(path: string): Promise<string> {
  const token = crypto.randomUUID();
  try {
    await Deno.writeTextFile(`${path}/${TOKEN_FILE}`, token, { createNew: true, mode: 0o600 });
  } catch (err) {
    await removeLock(path);
    throw err;
  }
  return `token:${token}`;
}

/**
 * The identity of the lock at `path`: its holder's token, or, before it has one, its inode and
 * timestamps. Throws ENOENT when there is no lock.
 */
async function identity(path: string): Promise<string> {
  try {
    return `token:${await Deno.readTextFile(`${path}/${TOKEN_FILE}`)}`;
  } catch (err) {
    if (errorCode(err) !== "ENOENT") throw err;
  }
  const info = await Deno.lstat(path);
  return `dir:${info.ino}:${info.mtime?.getTime()}:${info.birthtime?.getTime()}`;
}

/** Removes a lock directory with its token, if any. */
async function removeLock(path: string): Promise<void> {
  try {
    await Deno.remove(`${path}/${TOKEN_FILE}`);
  } catch (err) {
    const code = errorCode(err);
    if (code !== "ENOENT" && code !== "ENOTDIR") throw err;
  }
  await removeDir(path);
}

async function removeDir(path: string): Promise<void> {
  try {
    await Deno.remove(path);
  } catch (err) {
    if (errorCode(err) !== "ENOENT") throw err;
  }
}

/** Pauses `ms`, or rejects with the signal's reason once it aborts. */
function sleep(ms: number, signal?: AbortSignal): Promise<void> {
  return new Promise((resolve, reject) => {
    if (signal?.aborted) return reject(signal.reason);
    const onAbort = () => {
      clearTimeout(timer);
      reject(signal?.reason);
    };
    const timer = setTimeout(() => {
      signal?.removeEventListener("abort", onAbort);
      resolve();
    }, ms);
    signal?.addEventListener("abort", onAbort, { once: true });
  });
}
