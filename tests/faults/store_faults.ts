/**
 * The store as each simulated node sees it: one shared {@linkcode MemoryStore} (the bucket, with
 * its conditional writes), reached through a {@linkcode FaultyStore} per node that adds virtual
 * latency and the faults a schedule asks for. A fault is what the plugin's S3 client finally
 * reports after its own retries:
 * - "503": answered without effect (StoreError unavailable);
 * - "timeout": no answer for {@linkcode TIMEOUT_MS}, and the write did not land;
 * - "lost": the write landed, but its answer was lost (unavailable after the time-out; the S3
 *   store's read-back could not tell it landed);
 * - "slow": it works, after `slowMs` more (an upload or download crawling).
 * Faults queue per node and apply to that node's next matching requests; an outage makes
 * every request the node starts in a window fail. A transfer already under way when a fault
 * or an outage comes carries on: faults hit requests as they start.
 *
 * Requests wait on the clock as the calling actor, so a paused node's requests freeze and a
 * killed node's never land nor answer. A write lands between its two waits (on the way there,
 * on the way back), so a kill can come after it landed and before its answer.
 */

import { MemoryStore } from "../support/memory_store.ts";
import {
  type ObjectBytes,
  type PutResult,
  type Store,
  type StoredObject,
  StoreError,
  type TransferOptions,
  type WriteCondition,
} from "../../src/store/store.ts";
import type { VirtualTime } from "./clock.ts";

/** How long a request that gets no answer takes to fail. */
export const TIMEOUT_MS = 30_000;

/** What a fault does (module doc). */
export type FaultKind = "503" | "timeout" | "lost" | "slow";

/** Which requests a fault applies to. */
export type FaultTarget = "owner" | "manifest" | "stream" | "any";

/** A fault waiting for its requests. */
export interface QueuedFault {
  readonly target: FaultTarget;
  readonly kind: FaultKind;
  /** For "slow": the extra time. */
  readonly slowMs: number;
  /** Requests it still applies to. */
  left: number;
}

/** What the world learns from the store's traffic (for the invariants). */
export interface StoreWatcher {
  /** A request of `node` on the owner object of `volumeKey` was faulted. */
  ownerFaulted(node: string, volumeKey: string): void;
  /** A write of `node` to the owner object of `volumeKey` landed. */
  ownerWritten(node: string, volumeKey: string): void;
  /** A delete of `node` landed (for the hints of a report). */
  deleted(node: string, key: string): void;
}

/** The faults of every node: queued ones and outages. */
export class StoreFaults {
  readonly #queues = new Map<string, QueuedFault[]>();
  readonly #outages = new Map<string, { until: number; kind: "503" | "timeout" }>();

  /** Queues `fault` for `node`'s next matching requests. */
  queue(node: string, fault: QueuedFault): void {
    const q = this.#queues.get(node) ?? [];
    q.push(fault);
    this.#queues.set(node, q);
  }

  /** Every request `node` starts before `until` fails with `kind`. */
  outage(node: string, until: number, kind: "503" | "timeout"): void {
    this.#outages.set(node, { until, kind });
  }

  /** Ends every outage and drops every queued fault (a run's last phase). */
  clear(): void {
    this.#queues.clear();
    this.#outages.clear();
  }

  /** The fault for a request starting now, if any (a queued one is used up). */
  take(node: string, key: string, now: number): QueuedFault | undefined {
    const out = this.#outages.get(node);
    if (out && now < out.until) return { target: "any", kind: out.kind, slowMs: 0, left: 1 };
    const q = this.#queues.get(node);
    const i = q?.findIndex((f) => matches(f.target, key)) ?? -1;
    if (!q || i < 0) return undefined;
    const f = q[i]!;
    if (--f.left <= 0) q.splice(i, 1);
    return f;
  }
}

function matches(target: FaultTarget, key: string): boolean {
  switch (target) {
    case "any":
      return true;
    case "owner":
      return key.endsWith("/owner.json");
    case "manifest":
      return key.includes("/snapshots/") && key.endsWith(".json");
    case "stream":
      return key.endsWith(".zfs");
  }
}

/** The owner key's volume, or undefined for any other key. */
function ownerVolume(key: string): string | undefined {
  const m = /^v1\/volumes\/([^/]+)\/owner\.json$/.exec(key);
  return m?.[1];
}

/** One node's view of the store; see the module doc. */
export class FaultyStore implements Store {
  readonly description = "simulated S3 store";
  readonly #bucket: MemoryStore;
  readonly #node: string;
  readonly #faults: StoreFaults;
  readonly #clock: VirtualTime;
  readonly #latency: () => number;
  readonly #watch: StoreWatcher;

  constructor(opts: {
    bucket: MemoryStore;
    node: string;
    faults: StoreFaults;
    clock: VirtualTime;
    latency: () => number;
    watch: StoreWatcher;
  }) {
    this.#bucket = opts.bucket;
    this.#node = opts.node;
    this.#faults = opts.faults;
    this.#clock = opts.clock;
    this.#latency = opts.latency;
    this.#watch = opts.watch;
  }

  /**
   * One request: waits its way there, fails as its fault says, or lands (`effect`) and waits
   * its way back. `bodyMs` is the time its body takes to travel; a signal stops the waits.
   */
  async #request<T>(
    key: string,
    effect: () => Promise<T>,
    opts: { write: boolean; bodyMs?: number; signal?: AbortSignal; fault?: QueuedFault | null },
  ): Promise<T> {
    const fault = opts.fault === undefined
      ? this.#faults.take(this.#node, key, this.#clock.now)
      : opts.fault ?? undefined;
    const volume = ownerVolume(key);
    if (fault && volume !== undefined) this.#watch.ownerFaulted(this.#node, volume);
    const fail = (what: string) =>
      new StoreError("unavailable", `${what} "${key}" in ${this.description} failed`);
    const sleep = (ms: number) => this.#clock.sleep(ms, opts.signal);
    const slow = fault?.kind === "slow" ? fault.slowMs : 0;
    if (!opts.write && !fault) {
      // A read that works: one wait for the way there and back (nothing lands).
      await sleep(2 * this.#latency() + (opts.bodyMs ?? 0));
      return await effect();
    }
    await sleep(this.#latency() + (opts.bodyMs ?? 0) + slow);
    if (fault?.kind === "503") throw fail("503 Service Unavailable: the request on");
    if (fault?.kind === "timeout" || (fault?.kind === "lost" && !opts.write)) {
      await sleep(TIMEOUT_MS);
      throw fail("a request that timed out, on");
    }
    const result = await effect();
    if (fault?.kind === "lost") {
      await sleep(TIMEOUT_MS);
      throw fail("the answer to a write that landed was lost: the write of");
    }
    await sleep(this.#latency());
    return result;
  }

  async putStream(
    key: string,
    body: ReadableStream<Uint8Array>,
    options: TransferOptions = {},
  ): Promise<PutResult> {
    // The body is read as the upload goes; what it takes to travel is its size at 1 MB/s.
    const chunks: Uint8Array[] = [];
    const reader = body.getReader();
    try {
      for (;;) {
        options.signal?.throwIfAborted();
        const { done, value } = await reader.read();
        if (done) break;
        chunks.push(value);
      }
    } catch (err) {
      await reader.cancel(err).catch(() => {});
      if (err instanceof StoreError) throw err;
      throw new StoreError("unavailable", `Upload of "${key}" failed`, { cause: err });
    }
    const size = chunks.reduce((n, c) => n + c.length, 0);
    return await this.#request(
      key,
      () => this.#bucket.putStream(key, ReadableStream.from(chunks), options),
      { write: true, bodyMs: Math.ceil(size / 1000), ...options },
    );
  }

  async putBytes(key: string, bytes: Uint8Array, condition?: WriteCondition): Promise<PutResult> {
    return await this.#request(key, async () => {
      const put = await this.#bucket.putBytes(key, bytes, condition);
      const volume = ownerVolume(key);
      if (volume !== undefined) this.#watch.ownerWritten(this.#node, volume);
      return put;
    }, { write: true });
  }

  async getStream(
    key: string,
    options: TransferOptions = {},
  ): Promise<ReadableStream<Uint8Array>> {
    // A slow download crawls: each of its chunks comes that much later.
    const fault = this.#faults.take(this.#node, key, this.#clock.now);
    const slowMs = fault?.kind === "slow" ? Math.ceil(fault.slowMs / 4) : 0;
    const source = await this.#request(key, () => this.#bucket.getStream(key, options), {
      write: false,
      fault: fault?.kind === "slow" ? null : fault ?? null,
      ...options,
    });
    const reader = source.getReader();
    const clock = this.#clock;
    const latency = this.#latency;
    return new ReadableStream<Uint8Array>({
      async pull(controller) {
        await clock.sleep(Math.ceil(latency() / 4) + slowMs, options.signal);
        const { done, value } = await reader.read();
        if (done) controller.close();
        else controller.enqueue(value);
      },
      cancel(reason) {
        return reader.cancel(reason);
      },
    }, { highWaterMark: 0 });
  }

  async getBytes(key: string): Promise<ObjectBytes | undefined> {
    return await this.#request(key, () => this.#bucket.getBytes(key), { write: false });
  }

  async list(prefix: string): Promise<StoredObject[]> {
    return await this.#request(prefix, () => this.#bucket.list(prefix), { write: false });
  }

  async delete(key: string): Promise<void> {
    await this.#request(key, async () => {
      await this.#bucket.delete(key);
      this.#watch.deleted(this.#node, key);
    }, { write: true });
  }
}
