/**
 * Writes a stream to one S3 object in bounded memory: a body smaller than one part is a single
 * PutObject; anything larger is a multipart upload (CreateMultipartUpload, UploadPart per part,
 * CompleteMultipartUpload) that is aborted (AbortMultipartUpload) on any failure, so nothing
 * becomes visible. Up to {@linkcode DEFAULT_PARTS_IN_FLIGHT} parts upload at once while the next
 * is read; their buffers are reused, and a byte stream (zfs send's stdout) is read through one
 * reused 1 MiB buffer into them, so a stream of any size allocates a few parts' worth of memory
 * and nothing per chunk.
 */

import { answerError, badAnswerError, S3StoreError } from "./s3_errors.ts";
import type { S3Client } from "./s3_client.ts";
import {
  completeMultipartUploadXml,
  type CompleteResult,
  parseCompleteMultipartUpload,
  parseInitiateMultipartUpload,
  unquoteEtag,
} from "./s3_xml.ts";
import type { PutResult } from "./store.ts";

/** S3's limits: parts of 5 MiB to 5 GiB (the last may be smaller), at most 10,000 of them. */
export const MIN_PART_BYTES = 5 * 1024 * 1024;
const MAX_PART_BYTES = 5 * 1024 ** 3;
const MAX_PARTS = 10_000;
/** Parts per size step: the part size doubles after each 1,000 parts. */
const PARTS_PER_STEP = 1000;

/**
 * The size of part `n` (1-based): `base` for the first 1,000 parts, then doubled every 1,000,
 * so a stream of unknown length fits in 10,000 parts: with 8 MiB, 7.8 GiB at constant memory,
 * and more than S3's 5 TiB object limit by the last part.
 */
export function partSizeFor(base: number, n: number): number {
  return Math.min(MAX_PART_BYTES, base * 2 ** Math.floor((n - 1) / PARTS_PER_STEP));
}

/**
 * Bytes of one read from a byte stream (zfs send's stdout): it is read into one buffer of this
 * size, used again for every read, and copied into the part. Reading straight into an 8 MiB part
 * cost more: each layer of streams between zfs send and the upload (send.ts's count, the store
 * wait's watch) hands the reader's buffer over and back on every read, at a cost that grows with
 * the buffer. 256 MiB through a pipe into an 8 MiB buffer in place took 0.43-0.58 main-thread
 * CPU-seconds; into a 1 MiB buffer copied into the part, 0.22 (with the plugin's V8 flags).
 */
const READ_BYTES = 1024 * 1024;

/** Reads a stream into caller-given buffers, whole buffers until the stream ends. */
class PartReader {
  /** A byte stream (a command's stdout): read into {@linkcode #readBuffer}, then copied. */
  readonly #byob: ReadableStreamBYOBReader | undefined;
  /** Any other stream: its chunks are copied. */
  readonly #chunks: ReadableStreamDefaultReader<Uint8Array> | undefined;
  #readBuffer: Uint8Array<ArrayBuffer> | undefined;
  /** What the last read brought and a buffer had no room for. */
  #carry: Uint8Array | undefined;
  #ended = false;

  constructor(body: ReadableStream<Uint8Array>) {
    try {
      this.#byob = body.getReader({ mode: "byob" });
    } catch {
      this.#chunks = body.getReader();
    }
  }

  /**
   * Fills `buffer` from the start.
   * @returns the bytes filled, fewer than its length only at the end
   */
  async fill(buffer: Uint8Array): Promise<number> {
    let at = 0;
    while (at < buffer.length) {
      const chunk = this.#carry ?? await this.#next();
      this.#carry = undefined;
      if (chunk === undefined) break;
      const n = Math.min(chunk.length, buffer.length - at);
      buffer.set(chunk.subarray(0, n), at);
      at += n;
      if (n < chunk.length) this.#carry = chunk.subarray(n);
    }
    return at;
  }

  cancel(reason: unknown): Promise<void> {
    return (this.#byob ?? this.#chunks)!.cancel(reason);
  }

  /**
   * The next bytes, or undefined at the end. From a byte stream they live in the read buffer,
   * which the read after this one fills again: the caller copies them out (or carries them)
   * before reading again.
   */
  async #next(): Promise<Uint8Array | undefined> {
    if (this.#ended) return undefined;
    if (this.#chunks) {
      const r = await this.#chunks.read();
      if (r.done) this.#ended = true;
      return r.done ? undefined : r.value;
    }
    const r = await this.#byob!.read(this.#readBuffer ?? new Uint8Array(READ_BYTES));
    // A cancelled stream gives no view back; it is at its end all the same.
    if (r.value === undefined) throw new TypeError("The body was cancelled while being read");
    // The read hands the buffer's memory over and back: keep what came back.
    this.#readBuffer = new Uint8Array(r.value.buffer);
    if (r.done) this.#ended = true;
    return r.value.length > 0 ? r.value : r.done ? undefined : r.value;
  }
}

/** Buffers of finished parts, given out again: a stream of any length allocates only a few. */
class BufferPool {
  readonly #free: Uint8Array<ArrayBuffer>[] = [];

  /** A buffer of `size` bytes (its content is stale). */
  take(size: number): Uint8Array<ArrayBuffer> {
    const i = this.#free.findIndex((b) => b.length === size);
    return i >= 0 ? this.#free.splice(i, 1)[0]! : new Uint8Array(size);
  }

  give(buffer: Uint8Array<ArrayBuffer>): void {
    this.#free.push(buffer);
  }
}

/**
 * Parts uploading at once by default. Against versitygw on 2 cores, with zfs send read through
 * a pipe, 8 MiB parts 2 at a time were the fastest of 8 or 16 MiB by 2 or 3, and 32 MiB by 2
 * (512 MiB: 1.68 s against 1.77 to 3.77 s); the HTTP/1.1 client keeps no copy of a part.
 */
export const DEFAULT_PARTS_IN_FLIGHT = 2;

/** Where to write and how. */
export interface UploadTarget {
  readonly client: S3Client;
  /** The whole S3 key. */
  readonly key: string;
  /** For messages: `Writing "k" to <store>`. */
  readonly what: string;
  readonly partSizeBytes: number;
  /**
   * Parts uploading at once (default {@linkcode DEFAULT_PARTS_IN_FLIGHT}); one more is being
   * read, so memory holds at most `(partsInFlight + 1) × partSizeBytes` of the stream.
   */
  readonly partsInFlight?: number;
  readonly signal?: AbortSignal | undefined;
  /** Told whenever bytes go out or an answer comes (see TransferOptions.onProgress). */
  readonly onProgress?: (() => void) | undefined;
}

/**
 * Writes `body` to the target's key. On failure or abort the source is cancelled and the
 * multipart upload aborted (best effort: a bucket lifecycle rule should clean up what a
 * crash leaves).
 * @throws {StoreError} as the client classifies it; the signal's reason on abort
 */
export async function uploadStream(
  target: UploadTarget,
  body: ReadableStream<Uint8Array>,
): Promise<PutResult> {
  target.signal?.throwIfAborted();
  // Stops the requests in flight once anything fails, before the upload is aborted.
  const stop = new AbortController();
  const signal = target.signal ? AbortSignal.any([target.signal, stop.signal]) : stop.signal;
  const parts = new PartReader(body);
  // An abort also ends a read waiting on a slow source.
  const onAbort = () => void parts.cancel(signal.reason).catch(() => {});
  signal.addEventListener("abort", onAbort, { once: true });
  const t = { ...target, signal };
  const upload = new MultipartUpload(t);
  const inFlight = new Set<Promise<void>>();
  const maxInFlight = Math.max(1, target.partsInFlight ?? DEFAULT_PARTS_IN_FLIGHT);
  const pool = new BufferPool();
  // One connection per part in flight, used again for the next parts.
  using _connections = target.client.hold();
  try {
    let buffer = pool.take(partSizeFor(t.partSizeBytes, 1));
    let length = await parts.fill(buffer);
    signal.throwIfAborted();
    if (length < buffer.length) return await putObject(t, buffer.subarray(0, length));
    await upload.create();
    let size = 0;
    for (let n = 1;; n++) {
      if (n > MAX_PARTS) throw new RangeError("The stream needs more than 10,000 parts");
      const part = buffer;
      const uploading: Promise<void> = upload.part(n, part.subarray(0, length)).then(() => {
        inFlight.delete(uploading);
        pool.give(part);
      });
      // A failed part stops the others and ends the read of the next one at once.
      uploading.catch((e) => stop.abort(e));
      inFlight.add(uploading);
      size += length;
      // The next part is read while up to the limit upload; it starts once one of them ended.
      buffer = pool.take(partSizeFor(t.partSizeBytes, n + 1));
      length = await parts.fill(buffer);
      signal.throwIfAborted();
      if (length === 0) {
        pool.give(buffer);
        break;
      }
      while (inFlight.size >= maxInFlight) await Promise.race(inFlight);
    }
    await Promise.all(inFlight);
    return { etag: await upload.complete(size), size };
  } catch (e) {
    stop.abort(e);
    await Promise.allSettled(inFlight);
    await parts.cancel(e).catch(() => {});
    await upload.abort();
    throw e;
  } finally {
    signal.removeEventListener("abort", onAbort);
  }
}

async function putObject(target: UploadTarget, bytes: Uint8Array<ArrayBuffer>): Promise<PutResult> {
  const { response } = await target.client.send({
    method: "PUT",
    key: target.key,
    body: bytes,
    unsignedPayload: true,
    what: target.what,
    // Unconditional, the same bytes to a key only this writer uses: safe to send again.
    idempotent: true,
    signal: target.signal,
    onProgress: target.onProgress,
  });
  return { etag: unquoteEtag(response.headers.get("etag") ?? ""), size: bytes.length };
}

function completeResult(what: string, body: Uint8Array): CompleteResult {
  try {
    return parseCompleteMultipartUpload(new TextDecoder().decode(body));
  } catch (e) {
    throw badAnswerError(what, e);
  }
}

/** One multipart upload's requests. */
class MultipartUpload {
  readonly #t: UploadTarget;
  #uploadId: string | undefined;
  readonly #etags: string[] = [];

  constructor(target: UploadTarget) {
    this.#t = target;
  }

  async create(): Promise<void> {
    const { body } = await this.#t.client.send({
      method: "POST",
      key: this.#t.key,
      query: [["uploads", ""]],
      what: this.#t.what,
      // A retried create may leave an unused upload behind; aborted by lifecycle rules only.
      idempotent: true,
      signal: this.#t.signal,
      onProgress: this.#t.onProgress,
    });
    try {
      this.#uploadId = parseInitiateMultipartUpload(new TextDecoder().decode(body));
    } catch (e) {
      throw badAnswerError(this.#t.what, e);
    }
  }

  async part(n: number, bytes: Uint8Array<ArrayBuffer>): Promise<void> {
    const { response } = await this.#t.client.send({
      method: "PUT",
      key: this.#t.key,
      query: [["partNumber", String(n)], ["uploadId", this.#id()]],
      body: bytes,
      unsignedPayload: true,
      what: `${this.#t.what} (part ${n})`,
      idempotent: true,
      signal: this.#t.signal,
      onProgress: this.#t.onProgress,
    });
    const etag = response.headers.get("etag");
    if (!etag) throw badAnswerError(this.#t.what, new SyntaxError(`part ${n} has no ETag`));
    this.#etags[n - 1] = unquoteEtag(etag);
  }

  /**
   * Joins the parts. A try that got no answer may have completed the upload: when the next
   * try finds the upload gone, the object's size tells whether it was this one.
   */
  async complete(size: number): Promise<string> {
    const client = this.#t.client;
    const xml = new TextEncoder().encode(completeMultipartUploadXml(this.#etags));
    let ambiguous = false;
    for (let n = 1;; n++) {
      try {
        const { body } = await client.send({
          method: "POST",
          key: this.#t.key,
          query: [["uploadId", this.#id()]],
          body: xml,
          what: this.#t.what,
          idempotent: false,
          signal: this.#t.signal,
          onProgress: this.#t.onProgress,
          // S3 may take minutes to join many parts (it answers 200 at once and sends the
          // result when done).
          timeoutMs: 300_000,
        });
        const result = completeResult(this.#t.what, body);
        if (result.error) throw answerError(this.#t.what, 200, result.error);
        this.#uploadId = undefined;
        return result.etag;
      } catch (e) {
        if (!(e instanceof S3StoreError)) throw e;
        if (ambiguous && e.code === "NoSuchUpload") {
          const etag = await this.#landed(size);
          if (etag !== undefined) {
            this.#uploadId = undefined;
            return etag;
          }
        }
        if (!e.retryable || n >= client.tries) throw e;
        // No answer, or a server error: the upload may have been completed all the same.
        ambiguous = true;
      }
      await client.backoff(n, this.#t.signal);
    }
  }

  /** The object's etag if it is there with `size` bytes (HeadObject). */
  async #landed(size: number): Promise<string | undefined> {
    let response: Response;
    try {
      ({ response } = await this.#t.client.send({
        method: "HEAD",
        key: this.#t.key,
        what: this.#t.what,
        idempotent: true,
        signal: this.#t.signal,
        onProgress: this.#t.onProgress,
      }));
    } catch (e) {
      if (e instanceof S3StoreError && e.kind === "not_found") return undefined;
      throw e;
    }
    if (Number(response.headers.get("content-length")) !== size) return undefined;
    return unquoteEtag(response.headers.get("etag") ?? "");
  }

  /** Best effort: the parts are dropped, the key never shows the object. */
  async abort(): Promise<void> {
    const uploadId = this.#uploadId;
    if (uploadId === undefined) return;
    this.#uploadId = undefined;
    try {
      await this.#t.client.send({
        method: "DELETE",
        key: this.#t.key,
        query: [["uploadId", uploadId]],
        what: `${this.#t.what} (abort)`,
        idempotent: true,
        // Not the caller's signal: an aborted write still cleans up.
        timeoutMs: 30_000,
      });
    } catch {
      // The parts stay until a lifecycle rule removes them; they are never visible.
    }
  }

  #id(): string {
    if (this.#uploadId === undefined) throw new TypeError("No multipart upload is open");
    return this.#uploadId;
  }
}
