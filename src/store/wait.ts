/**
 * How long one CSI call may wait for the store (`--store-wait`, 30 s by default): a store that
 * accepts connections and never answers must not hold a NodeStage for minutes (Nomad gives node
 * calls no deadline), and the answer says how long it waited.
 *
 * A {@linkcode StoreWait} is one call's budget, shared by every store request the call makes:
 * the time during which at least one of them waits for the store is taken from it, and once it
 * is spent every request still waiting is aborted (the S3 client closes its socket) and every
 * later one fails at once, with UNAVAILABLE naming the store and the time waited. Requests that
 * run side by side take the time once, not once each.
 *
 * Transfers are different: a download or upload that moves data may take as long as it takes
 * (a stage that must receive a large volume logs its progress and finishes or fails, never cut
 * short by a deadline). While one runs, the call's budget does not run down; instead the
 * transfer fails once no byte has moved for the budget's whole length (a stalled transfer).
 * Time a transfer waits for its other side (zfs send filling an upload, zfs receive taking the
 * download) is not the store's and is never counted.
 *
 * {@linkcode BoundedStore} applies the budget to a {@linkcode Store}: each call it serves finds
 * its budget by itself, from the gRPC call it runs for (src/call_context.ts), unless the code
 * it runs in chose one with {@linkcode withStoreWait}, a fresh one with
 * {@linkcode withOwnStoreWait} (clean-up after a spent budget), or none with
 * {@linkcode outsideStoreWait}. Work that runs outside any call (scheduled backups, lease
 * renewals, standby copies, pruning) has no budget: the S3 client's own time limits apply.
 */

import { AsyncLocalStorage } from "node:async_hooks";
import { type CallContext, currentCall } from "../call_context.ts";
import {
  type ObjectBytes,
  type PutResult,
  type RequestOptions,
  type Store,
  type StoredFile,
  type StoredObject,
  StoreError,
  type TransferOptions,
  type WriteCondition,
  type WrittenFile,
} from "./store.ts";
import { relayStream } from "./relay.ts";

/** Default of `--store-wait`. */
export const DEFAULT_STORE_WAIT_SECONDS = 30;

/** "30.0 s". */
function seconds(ms: number): string {
  return `${(ms / 1000).toFixed(1)} s`;
}

/**
 * The error of a request given up when its call's store wait ran out, or of a transfer that
 * moved no byte for that long: "unavailable" (UNAVAILABLE), with the time waited.
 */
export class StoreWaitError extends StoreError {
  /** How long the call waited for the store (or the transfer for a byte). */
  readonly waitedMs: number;
  /** The budget: `--store-wait`. */
  readonly limitMs: number;

  constructor(message: string, waitedMs: number, limitMs: number, options?: ErrorOptions) {
    super("unavailable", message, options);
    this.name = "StoreWaitError";
    this.waitedMs = waitedMs;
    this.limitMs = limitMs;
  }
}

/** Monotonic milliseconds. */
type Clock = () => number;

/** One call's budget of store wait; see the module doc. */
export class StoreWait {
  readonly limitMs: number;
  readonly #now: Clock;
  readonly #controller = new AbortController();
  /** Time taken before the current stretch. */
  #spentMs = 0;
  /** Requests waiting now, and transfers running now. */
  #requests = 0;
  #transfers = 0;
  /** Start of the current stretch of waiting (monotonic), when the budget runs down. */
  #since: number | undefined;
  #timer: ReturnType<typeof setTimeout> | undefined;

  /** @throws {RangeError} for a limit that is not a positive number of ms */
  constructor(limitMs: number, now: Clock = () => performance.now()) {
    if (!(limitMs > 0) || !Number.isFinite(limitMs)) {
      throw new RangeError(`A store wait of ${limitMs} ms is not a positive time`);
    }
    this.limitMs = limitMs;
    this.#now = now;
  }

  /** Time taken from the budget so far. */
  get waitedMs(): number {
    return this.#spentMs + (this.#since === undefined ? 0 : this.#now() - this.#since);
  }

  /** Whether the budget is spent. */
  get spent(): boolean {
    return this.#controller.signal.aborted;
  }

  /**
   * Runs one request of the call (`what`: `Reading "k" from <store>`), its wait taken from the
   * budget. `fn` gets a signal that aborts once the budget is spent; if `fn` does not stop then
   * (a file-system call stuck in the kernel), it is no longer waited for.
   * @throws {StoreWaitError} when the budget is or gets spent; what `fn` throws
   */
  async request<T>(what: string, fn: (signal: AbortSignal) => Promise<T>): Promise<T> {
    const signal = this.#controller.signal;
    if (signal.aborted) throw this.#error(what);
    this.#change(+1, 0);
    try {
      return await untilAborted(fn(signal), signal);
    } catch (err) {
      if (signal.aborted) throw this.#error(what, err);
      throw err;
    } finally {
      this.#change(-1, 0);
    }
  }

  /**
   * A transfer (`what`: `Reading "k" from <store>`): once begun, the budget does not run down
   * until it ends, and it fails once no byte moved for the budget's length.
   * @throws {StoreWaitError} when the budget is already spent
   */
  transfer(what: string): Transfer {
    if (this.spent) throw this.#error(what);
    return new Transfer(what, this.limitMs, (n) => this.#change(0, n));
  }

  #error(what: string, cause?: unknown): StoreWaitError {
    const waited = this.limitMs;
    return new StoreWaitError(
      `${what} failed: the store did not answer; this call waited ${
        seconds(waited)
      } for the store in all, as long as --store-wait allows`,
      waited,
      this.limitMs,
      cause === undefined ? undefined : { cause },
    );
  }

  /** Counts requests and transfers in and out; the budget runs down while only requests wait. */
  #change(requests: number, transfers: number): void {
    this.#requests += requests;
    this.#transfers += transfers;
    const running = this.#requests > 0 && this.#transfers === 0 && !this.spent;
    if (running && this.#since === undefined) {
      this.#since = this.#now();
      this.#timer = setTimeout(() => this.#runOut(), this.limitMs - this.#spentMs);
    } else if (!running && this.#since !== undefined) {
      this.#spentMs += this.#now() - this.#since;
      this.#since = undefined;
      clearTimeout(this.#timer);
      this.#timer = undefined;
    }
  }

  #runOut(): void {
    this.#timer = undefined;
    // Spent: the whole budget (a timer that fired late is the event loop's, not the store's).
    this.#spentMs = this.limitMs;
    this.#since = undefined;
    this.#controller.abort(new DOMException("The call's store wait is spent", "TimeoutError"));
  }
}

/**
 * One transfer of a call: its signal aborts once no byte moved for the limit, counting only
 * while it waits for the store ({@linkcode Transfer.waiting}), not for its other side.
 */
export class Transfer {
  readonly #what: string;
  readonly #limitMs: number;
  readonly #count: (n: 1 | -1) => void;
  readonly #controller = new AbortController();
  #timer: ReturnType<typeof setTimeout> | undefined;
  #begun = false;
  #done = false;

  constructor(what: string, limitMs: number, count: (n: 1 | -1) => void) {
    this.#what = what;
    this.#limitMs = limitMs;
    this.#count = count;
  }

  /** From now on the call's budget does not run down, until {@linkcode end}. Idempotent. */
  begin(): void {
    if (this.#begun || this.#done) return;
    this.#begun = true;
    this.#count(1);
  }

  /** Aborts, with a {@linkcode StoreWaitError}, once the transfer stalled for the limit. */
  get signal(): AbortSignal {
    return this.#controller.signal;
  }

  /** From now on it waits for the store: the stall clock runs (again from zero). */
  waiting(): void {
    if (this.#done || this.signal.aborted) return;
    clearTimeout(this.#timer);
    this.#timer = setTimeout(() => this.#stalled(), this.#limitMs);
  }

  /** Bytes moved (or it now waits for its other side): the stall clock stops. */
  moved(): void {
    clearTimeout(this.#timer);
    this.#timer = undefined;
  }

  /** Bytes moved and it goes on waiting for the store: the stall clock starts again. */
  progressed(): void {
    if (this.#timer !== undefined) this.waiting();
  }

  /** Ends it: the call's budget runs down again. Idempotent. */
  end(): void {
    if (this.#done) return;
    this.#done = true;
    this.moved();
    if (this.#begun) this.#count(-1);
  }

  /** The error the signal aborts with, for a caller that saw it abort. */
  get error(): StoreWaitError | undefined {
    const reason = this.signal.reason;
    return reason instanceof StoreWaitError ? reason : undefined;
  }

  #stalled(): void {
    this.#timer = undefined;
    this.#controller.abort(
      new StoreWaitError(
        `${this.#what} failed: the transfer stalled; it waited ${
          seconds(this.#limitMs)
        } without a byte moving, as long as --store-wait allows`,
        this.#limitMs,
        this.#limitMs,
      ),
    );
  }
}

/** `promise`, or the signal's reason as soon as it aborts (the promise is then dropped). */
function untilAborted<T>(promise: Promise<T>, signal: AbortSignal): Promise<T> {
  if (signal.aborted) {
    promise.catch(() => {});
    return Promise.reject(signal.reason);
  }
  return new Promise<T>((resolve, reject) => {
    const onAbort = () => {
      promise.catch(() => {});
      reject(signal.reason);
    };
    signal.addEventListener("abort", onAbort, { once: true });
    promise.then(resolve, reject).finally(() => signal.removeEventListener("abort", onAbort));
  });
}

/** The budget code chose for itself: a StoreWait, or null for none. */
/** A budget of its own, made by the store at its first request (see withOwnStoreWait). */
class OwnWait {
  wait: StoreWait | undefined;
}

const chosen = new AsyncLocalStorage<StoreWait | OwnWait | null>();

/** Runs `fn`, and everything it awaits, with `wait` as its store wait (not its call's). */
export function withStoreWait<T>(wait: StoreWait, fn: () => T): T {
  return chosen.run(wait, fn);
}

/**
 * Runs `fn`, and everything it awaits, with no store wait at all, though it runs for a call:
 * for work a call starts that is not the call's waiting (a lease kept alive meanwhile).
 */
export function outsideStoreWait<T>(fn: () => T): T {
  return chosen.run(null, fn);
}

/**
 * Runs `fn`, and everything it awaits, with a store wait of its own, as long as a call's: for
 * clean-up a call owes after its own budget was spent (handing back a volume it acquired).
 */
export function withOwnStoreWait<T>(fn: () => T): T {
  return chosen.run(new OwnWait(), fn);
}

/** Options of a {@linkcode BoundedStore}. */
export interface BoundedStoreOptions {
  /** Each call's budget (`--store-wait`), in ms. */
  readonly limitMs: number;
  /** Monotonic ms; replaceable in tests. */
  readonly now?: Clock;
  /** The call code runs for (default: src/call_context.ts's); replaceable in tests. */
  readonly call?: () => CallContext | undefined;
}

/** A store whose every request waits at most what its call's budget allows; see the module doc. */
export class BoundedStore implements Store {
  readonly #inner: Store;
  readonly #limitMs: number;
  readonly #now: Clock | undefined;
  readonly #call: () => CallContext | undefined;
  /** Each call's budget, made at its first store request. */
  readonly #waits = new WeakMap<CallContext, StoreWait>();
  readonly putWritten?: NonNullable<Store["putWritten"]>;
  readonly openFile?: NonNullable<Store["openFile"]>;

  constructor(inner: Store, options: BoundedStoreOptions) {
    this.#inner = inner;
    this.#limitMs = options.limitMs;
    this.#now = options.now;
    this.#call = options.call ?? currentCall;
    new StoreWait(options.limitMs); // refuses a bad limit now, not at the first call
    if (inner.putWritten) {
      const putWritten = inner.putWritten.bind(inner);
      this.putWritten = (key, write, options) => this.#putWritten(putWritten, key, write, options);
    }
    if (inner.openFile) {
      const openFile = inner.openFile.bind(inner);
      this.openFile = (key, options) => this.#openFile(openFile, key, options);
    }
  }

  get description(): string {
    return this.#inner.description;
  }

  /** The store it bounds. */
  get inner(): Store {
    return this.#inner;
  }

  /** The budget of the code running now, if any. */
  current(): StoreWait | undefined {
    const own = chosen.getStore();
    if (own instanceof OwnWait) return own.wait ??= new StoreWait(this.#limitMs, this.#now);
    if (own !== undefined) return own ?? undefined;
    const call = this.#call();
    if (call === undefined) return undefined;
    let wait = this.#waits.get(call);
    if (!wait) {
      wait = new StoreWait(this.#limitMs, this.#now);
      this.#waits.set(call, wait);
    }
    return wait;
  }

  #what(verb: "Reading" | "Writing" | "Listing" | "Deleting", key: string): string {
    const at = verb === "Writing" ? "to" : verb === "Listing" ? "in" : "from";
    return `${verb} "${key}" ${at} ${this.description}`;
  }

  async #request<T>(
    what: string,
    options: RequestOptions | undefined,
    fn: (options: RequestOptions) => Promise<T>,
  ): Promise<T> {
    const wait = this.current();
    if (!wait) return await fn(options ?? {});
    return await wait.request(what, (signal) => fn({ signal: joined(signal, options?.signal) }));
  }

  putBytes(
    key: string,
    bytes: Uint8Array,
    condition?: WriteCondition,
    options?: RequestOptions,
  ): Promise<PutResult> {
    return this.#request(
      this.#what("Writing", key),
      options,
      (o) => this.#inner.putBytes(key, bytes, condition, o),
    );
  }

  getBytes(key: string, options?: RequestOptions): Promise<ObjectBytes | undefined> {
    return this.#request(this.#what("Reading", key), options, (o) => this.#inner.getBytes(key, o));
  }

  list(prefix: string, options?: RequestOptions): Promise<StoredObject[]> {
    return this.#request(
      this.#what("Listing", prefix),
      options,
      (o) => this.#inner.list(prefix, o),
    );
  }

  delete(key: string, options?: RequestOptions): Promise<void> {
    return this.#request(this.#what("Deleting", key), options, (o) => this.#inner.delete(key, o));
  }

  async getStream(key: string, options?: TransferOptions): Promise<ReadableStream<Uint8Array>> {
    const wait = this.current();
    if (!wait) return await this.#inner.getStream(key, options);
    const what = this.#what("Reading", key);
    const transfer = wait.transfer(what);
    const signal = joined(transfer.signal, options?.signal);
    let inner: ReadableStream<Uint8Array>;
    try {
      // Until its answer starts, a download is a request of the call: its wait is the budget's.
      inner = await wait.request(
        what,
        (budget) => this.#inner.getStream(key, { ...options, signal: joined(budget, signal) }),
      );
    } catch (err) {
      transfer.end();
      throw err;
    }
    transfer.begin();
    return watchedDownload(inner, transfer);
  }

  async putStream(
    key: string,
    body: ReadableStream<Uint8Array>,
    options?: TransferOptions,
  ): Promise<PutResult> {
    const wait = this.current();
    if (!wait) return await this.#inner.putStream(key, body, options);
    const transfer = wait.transfer(this.#what("Writing", key));
    transfer.begin();
    try {
      transfer.waiting();
      const signal = joined(transfer.signal, options?.signal);
      const onProgress = () => {
        transfer.progressed();
        options?.onProgress?.();
      };
      const watched = watchedSource(body, transfer);
      return await untilAborted(
        this.#inner.putStream(key, watched, { ...options, signal, onProgress }),
        transfer.signal,
      );
    } catch (err) {
      throw transfer.error ?? err;
    } finally {
      transfer.end();
    }
  }

  /**
   * The directory store's write by another program: its steps are local file-system calls, and
   * the time `write` takes is the program's (zfs send), so only the budget's state is checked:
   * a call whose budget is spent does not start one.
   */
  async #putWritten<T>(
    putWritten: NonNullable<Store["putWritten"]>,
    key: string,
    write: (file: WrittenFile) => Promise<T>,
    options?: TransferOptions,
  ): Promise<PutResult & { readonly value: T }> {
    const wait = this.current();
    if (!wait) return await putWritten(key, write, options);
    const transfer = wait.transfer(this.#what("Writing", key));
    transfer.begin();
    try {
      return await putWritten(key, write, options);
    } finally {
      transfer.end();
    }
  }

  /**
   * Opens a stored file: the opening is a request; its reads are a transfer (each read fails
   * once it waited the budget's length), until it is closed.
   */
  async #openFile(
    openFile: NonNullable<Store["openFile"]>,
    key: string,
    options?: RequestOptions,
  ): Promise<StoredFile> {
    const wait = this.current();
    if (!wait) return await openFile(key, options);
    const what = this.#what("Reading", key);
    const file = await wait.request(
      what,
      (signal) => openFile(key, { signal: joined(signal, options?.signal) }),
    );
    let transfer: Transfer;
    try {
      transfer = wait.transfer(what);
    } catch (err) {
      await file.close();
      throw err;
    }
    transfer.begin();
    return {
      fd: file.fd,
      read: async (buffer, position) => {
        transfer.waiting();
        try {
          return await untilAborted(file.read(buffer, position), transfer.signal);
        } finally {
          transfer.moved();
        }
      },
      close: async () => {
        transfer.end();
        await file.close();
      },
    };
  }
}

/** One signal for both, or the one given. */
function joined(a: AbortSignal, b: AbortSignal | undefined): AbortSignal {
  return b === undefined ? a : AbortSignal.any([a, b]);
}

/**
 * The download as its reader sees it: the stall clock runs only while a read waits; a stall
 * cancels the store's stream (the S3 client closes its socket) and fails the read. A byte
 * stream (the S3 client's body) stays one (relay.ts).
 */
function watchedDownload(
  inner: ReadableStream<Uint8Array>,
  transfer: Transfer,
): ReadableStream<Uint8Array> {
  return relayStream(inner, (cancel) => {
    const onStall = () => cancel(transfer.signal.reason);
    transfer.signal.addEventListener("abort", onStall, { once: true });
    return {
      read: async (read) => {
        transfer.waiting();
        try {
          const r = await untilAborted(read(), transfer.signal);
          transfer.moved();
          return r;
        } catch (err) {
          throw transfer.error ?? err;
        }
      },
      end: () => {
        transfer.signal.removeEventListener("abort", onStall);
        transfer.end();
      },
    };
  });
}

/**
 * An upload's source as the store reads it: while the store waits for a chunk (zfs send is
 * slow), the stall clock stops; once it has the chunk, the clock runs until the next read. A
 * byte stream (a command's stdout) stays one, so the S3 upload still reads it straight into its
 * part buffers (s3_upload.ts).
 */
function watchedSource(
  body: ReadableStream<Uint8Array>,
  transfer: Transfer,
): ReadableStream<Uint8Array> {
  return relayStream(body, () => ({
    read: async (read) => {
      transfer.moved();
      try {
        return await read();
      } finally {
        if (!transfer.signal.aborted) transfer.waiting();
      }
    },
  }), READ_BYTES);
}

/** Bytes per read of a byte-stream source read by a default reader. */
const READ_BYTES = 256 * 1024;
