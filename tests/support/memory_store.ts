/**
 * An in-memory {@linkcode Store} for unit tests, faithful to the interface: keys are checked,
 * a streamed write becomes visible only once its body ended without error (an erroring or
 * aborted body leaves nothing, an earlier object stays), conditional writes hold, listings are
 * sorted and never show a write in progress, and a download comes in small chunks.
 */

import {
  checkKey,
  checkPrefix,
  MAX_OBJECT_BYTES,
  type ObjectBytes,
  type PutResult,
  type RequestOptions,
  type Store,
  type StoredObject,
  StoreError,
  tooLargeError,
  type TransferOptions,
  type WriteCondition,
} from "../../src/store/store.ts";

interface Stored {
  readonly bytes: Uint8Array;
  readonly etag: string;
  /** The store clock when it was written, if the store has one. */
  readonly modifiedMs: number | undefined;
}

/** Options of a {@linkcode MemoryStore}. */
export interface MemoryStoreOptions {
  /** Size of the chunks a download is cut into (default 4096). */
  readonly chunkSize?: number;
  /** See {@linkcode MemoryStore.clock}. */
  readonly clock?: () => number;
}

/** A store held in a Map; see the module doc. */
export class MemoryStore implements Store {
  readonly description = "memory store";
  readonly #objects = new Map<string, Stored>();
  readonly #chunkSize: number;
  #version = 0;
  /** Streamed writes still reading their body. */
  pendingWrites = 0;
  /** Keys of every streamed write that succeeded, oldest first (deleted or not). */
  readonly streamed: string[] = [];
  /**
   * The store's own clock (ms), stamping each write's `lastModifiedMs` as S3 and a file system
   * do: the test's to set, apart from any node's clock. Without one, listings carry no times,
   * as a store that does not give them.
   */
  clock: (() => number) | undefined;

  constructor(options: MemoryStoreOptions = {}) {
    this.#chunkSize = options.chunkSize ?? 4096;
    this.clock = options.clock;
  }

  /** Every visible key, sorted (for tests). */
  keys(): string[] {
    return [...this.#objects.keys()].sort();
  }

  /** An object's bytes, or undefined (for tests). */
  peek(key: string): Uint8Array | undefined {
    return this.#objects.get(key)?.bytes;
  }

  /** Replaces an object's bytes unconditionally, as a damaged or tampered store would. */
  poke(key: string, bytes: Uint8Array): void {
    this.#objects.set(key, this.#stored(bytes));
  }

  /** A new version of an object, with a fresh etag and the store clock's time. */
  #stored(bytes: Uint8Array): Stored {
    return { bytes, etag: this.#etag(), modifiedMs: this.clock?.() };
  }

  #etag(): string {
    return `"m${++this.#version}"`;
  }

  async putStream(
    key: string,
    body: ReadableStream<Uint8Array>,
    options: TransferOptions = {},
  ): Promise<PutResult> {
    checkKey(key);
    const chunks: Uint8Array[] = [];
    let size = 0;
    this.pendingWrites++;
    const reader = body.getReader();
    const onAbort = () => reader.cancel(options.signal?.reason).catch(() => {});
    options.signal?.addEventListener("abort", onAbort, { once: true });
    try {
      options.signal?.throwIfAborted();
      for (;;) {
        const { done, value } = await reader.read();
        options.signal?.throwIfAborted();
        if (done) break;
        chunks.push(value.slice());
        size += value.length;
      }
    } catch (err) {
      await reader.cancel(err).catch(() => {});
      if (err instanceof StoreError) throw err;
      throw new StoreError("unavailable", `Upload of "${key}" to ${this.description} failed`, {
        cause: err,
      });
    } finally {
      options.signal?.removeEventListener("abort", onAbort);
      this.pendingWrites--;
    }
    const bytes = new Uint8Array(size);
    let at = 0;
    for (const c of chunks) {
      bytes.set(c, at);
      at += c.length;
    }
    const stored = this.#stored(bytes);
    this.#objects.set(key, stored);
    this.streamed.push(key);
    return { etag: stored.etag, size };
  }

  // deno-lint-ignore require-await
  async putBytes(
    key: string,
    bytes: Uint8Array,
    condition?: WriteCondition,
    options: RequestOptions = {},
  ): Promise<PutResult> {
    checkKey(key);
    options.signal?.throwIfAborted();
    const current = this.#objects.get(key);
    if (condition !== undefined) {
      const holds = "ifNoneMatch" in condition
        ? current === undefined
        : current?.etag === condition.ifMatch;
      if (!holds) {
        throw new StoreError("precondition_failed", `"${key}" in ${this.description} changed`);
      }
    }
    const stored = this.#stored(bytes.slice());
    this.#objects.set(key, stored);
    return { etag: stored.etag, size: bytes.length };
  }

  // deno-lint-ignore require-await
  async getStream(
    key: string,
    options: TransferOptions = {},
  ): Promise<ReadableStream<Uint8Array>> {
    checkKey(key);
    const found = this.#objects.get(key);
    if (found === undefined) {
      throw new StoreError("not_found", `"${key}" is not in ${this.description}`);
    }
    const { bytes } = found;
    const size = this.#chunkSize;
    let at = 0;
    return new ReadableStream<Uint8Array>({
      pull(controller) {
        if (options.signal?.aborted) {
          controller.error(options.signal.reason);
        } else if (at >= bytes.length) {
          controller.close();
        } else {
          controller.enqueue(bytes.slice(at, at + size));
          at += size;
        }
      },
    }, { highWaterMark: 0 });
  }

  // deno-lint-ignore require-await
  async getBytes(key: string, options: RequestOptions = {}): Promise<ObjectBytes | undefined> {
    checkKey(key);
    options.signal?.throwIfAborted();
    const found = this.#objects.get(key);
    if (found && found.bytes.length > MAX_OBJECT_BYTES) {
      throw tooLargeError(`Reading "${key}" from ${this.description}`, MAX_OBJECT_BYTES);
    }
    return found && { bytes: found.bytes.slice(), etag: found.etag };
  }

  // deno-lint-ignore require-await
  async list(prefix: string, options: RequestOptions = {}): Promise<StoredObject[]> {
    checkPrefix(prefix);
    options.signal?.throwIfAborted();
    return this.keys().filter((k) => k.startsWith(prefix)).map((key) => {
      const o = this.#objects.get(key)!;
      const time = o.modifiedMs === undefined ? {} : { lastModifiedMs: o.modifiedMs };
      return { key, size: o.bytes.length, etag: o.etag, ...time };
    });
  }

  // deno-lint-ignore require-await
  async delete(key: string, options: RequestOptions = {}): Promise<void> {
    checkKey(key);
    options.signal?.throwIfAborted();
    this.#objects.delete(key);
  }
}
