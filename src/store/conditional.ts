/**
 * Whether the store enforces conditional writes, known once (src/store/check.ts's probe), and a
 * {@linkcode Store} for volumes that follow their job that refuses every conditional write
 * while it is not known to: their owner object decides who holds a volume by `If-None-Match`
 * and `If-Match` (src/follow/owner.ts), so on a server that ignores them two nodes could
 * acquire one volume. Ordinary backups do not depend on it and never go through the guard.
 *
 * For an S3 store the plugin runs the probe in the background at start-up (readiness does not
 * wait for it); a conditional write that comes before the verdict waits for it (within its
 * call's store wait), and one after a failed probe (the store did not answer) runs it again. A
 * verdict, either way, is kept until the plugin restarts. The directory store's conditional
 * writes are link(2) and locks of its own: enforced by construction, no probe.
 */

import { checkConditionalWrites, type CheckOptions, type ConditionalVerdict } from "./check.ts";
import {
  type ObjectBytes,
  type PutResult,
  type RequestOptions,
  type Store,
  type StoredObject,
  StoreError,
  type TransferOptions,
  type WriteCondition,
} from "./store.ts";

/** Waits for `fn` as a store wait of the current call, if any (src/store/wait.ts). */
export type WaitAs = <T>(what: string, fn: () => Promise<T>) => Promise<T>;

/** Options of {@linkcode ConditionalWrites}. */
export interface ConditionalWritesOptions {
  /** The store the probe writes to: the plugin's, without any call's budget. */
  readonly store: Store;
  /** The probe's key and steps (this node's id; an S3 store checks its bucket). */
  readonly probe: Omit<CheckOptions, "onStep">;
  /** A store known to enforce them (the directory store): no probe. */
  readonly enforced?: boolean;
  /** How a call waits for a probe that runs (default: as it is). */
  readonly waitAs?: WaitAs;
  /** Runs the probe (default: checkConditionalWrites); replaceable in tests. */
  readonly check?: (store: Store, options: Omit<CheckOptions, "onStep">) => Promise<
    ConditionalVerdict
  >;
}

/** Whether the store enforces conditional writes; see the module doc. */
export class ConditionalWrites {
  readonly #o: ConditionalWritesOptions;
  #verdict: ConditionalVerdict | undefined;
  #running: Promise<ConditionalVerdict> | undefined;

  constructor(options: ConditionalWritesOptions) {
    this.#o = options;
    if (options.enforced) this.#verdict = { kind: "enforced" };
  }

  /** The verdict, once a probe got one. */
  get known(): ConditionalVerdict | undefined {
    return this.#verdict;
  }

  /**
   * The verdict: the one known, or a probe's (one at a time; a probe that could not finish
   * answers "unknown" and is run again by the next caller).
   */
  verdict(): Promise<ConditionalVerdict> {
    if (this.#verdict) return Promise.resolve(this.#verdict);
    this.#running ??= (async () => {
      try {
        const check = this.#o.check ?? checkConditionalWrites;
        const v = await check(this.#o.store, this.#o.probe);
        if (v.kind !== "unknown") this.#verdict = v;
        return v;
      } catch (error) {
        return { kind: "unknown", error } as const;
      } finally {
        this.#running = undefined;
      }
    })();
    return this.#running;
  }

  /**
   * Resolves when the store enforces conditional writes.
   * @throws {StoreError} misconfigured naming the store and its answer when it does not; the
   *   probe's error (unavailable, denied, …) when it could not tell
   */
  async require(): Promise<void> {
    const what = `Checking that ${this.#o.store.description} enforces conditional writes`;
    const v = this.#verdict ??
      await (this.#o.waitAs ?? ((_what, fn) => fn()))(what, () => this.verdict());
    if (v.kind === "enforced") return;
    if (v.kind === "not_enforced") {
      throw new StoreError(
        "misconfigured",
        `Volumes that follow their job need a store that enforces conditional writes, and ` +
          `${this.#o.store.description} does not: ${v.detail}. They are refused on it ` +
          `(ordinary backups go on); use an S3 server that enforces If-None-Match and ` +
          `If-Match (zfs-csi store check shows what it does)`,
      );
    }
    if (v.error instanceof StoreError) throw v.error;
    throw new StoreError(
      "unavailable",
      `${what} failed: ${v.error instanceof Error ? v.error.message : String(v.error)}`,
      { cause: v.error },
    );
  }
}

/**
 * The store as volumes that follow their job use it: every conditional write first requires
 * {@linkcode ConditionalWrites}; everything else passes through as it is.
 */
export class ConditionalGuardStore implements Store {
  readonly #inner: Store;
  readonly #writes: ConditionalWrites;
  readonly putWritten?: NonNullable<Store["putWritten"]>;
  readonly openFile?: NonNullable<Store["openFile"]>;

  constructor(inner: Store, writes: ConditionalWrites) {
    this.#inner = inner;
    this.#writes = writes;
    if (inner.putWritten) this.putWritten = inner.putWritten.bind(inner);
    if (inner.openFile) this.openFile = inner.openFile.bind(inner);
  }

  get description(): string {
    return this.#inner.description;
  }

  /** Whether the store enforces conditional writes. */
  get conditionalWrites(): ConditionalWrites {
    return this.#writes;
  }

  async putBytes(
    key: string,
    bytes: Uint8Array,
    condition?: WriteCondition,
    options?: RequestOptions,
  ): Promise<PutResult> {
    if (condition !== undefined) await this.#writes.require();
    return await this.#inner.putBytes(key, bytes, condition, options);
  }

  putStream(
    key: string,
    body: ReadableStream<Uint8Array>,
    options?: TransferOptions,
  ): Promise<PutResult> {
    return this.#inner.putStream(key, body, options);
  }

  getStream(key: string, options?: TransferOptions): Promise<ReadableStream<Uint8Array>> {
    return this.#inner.getStream(key, options);
  }

  getBytes(key: string, options?: RequestOptions): Promise<ObjectBytes | undefined> {
    return this.#inner.getBytes(key, options);
  }

  list(prefix: string, options?: RequestOptions): Promise<StoredObject[]> {
    return this.#inner.list(prefix, options);
  }

  delete(key: string, options?: RequestOptions): Promise<void> {
    return this.#inner.delete(key, options);
  }
}
