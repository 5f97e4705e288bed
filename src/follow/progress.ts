/**
 * Progress of a long receive, for the log: a {@linkcode Store} that passes every call through
 * and counts the bytes of every download, logging the bytes so far, the rate and an estimate of
 * the time left at least every `everyMs` (10 s). NodeStage may receive for a long time (Nomad
 * sends it with no deadline): the log is how an operator sees it move.
 */

import type { Logger } from "../log.ts";
import { transferRate } from "../transfer_rate.ts";
import type {
  ObjectBytes,
  PutResult,
  Store,
  StoredObject,
  TransferOptions,
  WriteCondition,
} from "../store/store.ts";

/** Options of {@linkcode ProgressStore}. */
export interface ProgressOptions {
  /** Bytes the whole receive downloads (the chain's stream sizes). */
  readonly totalBytes: number;
  /** Longest gap between two progress lines (default 10 s). */
  readonly everyMs?: number;
  /** Monotonic ms; replaceable in tests. */
  readonly monotonic?: () => number;
}

/** A store that logs the progress of its downloads; see the module doc. */
export class ProgressStore implements Store {
  readonly #inner: Store;
  readonly #log: Logger;
  readonly #total: number;
  readonly #every: number;
  readonly #mono: () => number;
  readonly #started: number;
  #bytes = 0;
  #lastLog: number;
  #timer: ReturnType<typeof setInterval> | undefined;

  constructor(inner: Store, log: Logger, opts: ProgressOptions) {
    this.#inner = inner;
    this.#log = log;
    this.#total = opts.totalBytes;
    this.#every = opts.everyMs ?? 10_000;
    this.#mono = opts.monotonic ?? (() => performance.now());
    this.#started = this.#mono();
    this.#lastLog = this.#started;
  }

  get description(): string {
    return this.#inner.description;
  }

  /** Bytes downloaded so far. */
  get bytes(): number {
    return this.#bytes;
  }

  /** Logs one progress line now. */
  report(): void {
    const now = this.#mono();
    this.#lastLog = now;
    const { bytesPerSecond, secondsLeft } = transferRate(
      this.#bytes,
      this.#total,
      now - this.#started,
    );
    this.#log.info("receiving from the store", {
      bytes: this.#bytes,
      totalBytes: this.#total,
      bytesPerSecond: Math.round(bytesPerSecond),
      ...(secondsLeft === undefined ? {} : { etaSeconds: Math.round(secondsLeft) }),
    });
  }

  /** Also logs every `everyMs` while nothing arrives (a stalled download shows as stalled). */
  start(): void {
    this.#timer ??= setInterval(() => {
      if (this.#mono() - this.#lastLog >= this.#every) this.report();
    }, this.#every);
    Deno.unrefTimer(this.#timer);
  }

  /** Stops the timer. */
  stop(): void {
    if (this.#timer !== undefined) clearInterval(this.#timer);
    this.#timer = undefined;
  }

  async getStream(key: string, options?: TransferOptions): Promise<ReadableStream<Uint8Array>> {
    const stream = await this.#inner.getStream(key, options);
    return stream.pipeThrough(
      new TransformStream<Uint8Array, Uint8Array>({
        transform: (chunk, controller) => {
          this.#bytes += chunk.length;
          if (this.#mono() - this.#lastLog >= this.#every) this.report();
          controller.enqueue(chunk);
        },
      }),
    );
  }

  putStream(
    key: string,
    body: ReadableStream<Uint8Array>,
    options?: TransferOptions,
  ): Promise<PutResult> {
    return this.#inner.putStream(key, body, options);
  }

  putBytes(key: string, bytes: Uint8Array, condition?: WriteCondition): Promise<PutResult> {
    return this.#inner.putBytes(key, bytes, condition);
  }

  getBytes(key: string): Promise<ObjectBytes | undefined> {
    return this.#inner.getBytes(key);
  }

  list(prefix: string): Promise<StoredObject[]> {
    return this.#inner.list(prefix);
  }

  delete(key: string): Promise<void> {
    return this.#inner.delete(key);
  }
}
