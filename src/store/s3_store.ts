/**
 * The {@linkcode Store} in an S3-compatible bucket (AWS S3, MinIO, Ceph RGW, versitygw, …),
 * spoken directly with SigV4 (src/store/sigv4.ts) over a small HTTP/1.1 client
 * (src/store/http1.ts): no SDK, and not fetch, which copied each part and sent it slower.
 *
 * S3 requests relied on, and nothing else (an S3 server must support these):
 * - PutObject: small objects, with `If-None-Match: *` or `If-Match: "<etag>"` for conditional
 *   writes (412 PreconditionFailed, or 409 ConditionalRequestConflict, when the condition lost);
 *   also a stream smaller than one part.
 * - GetObject: reads, streamed as they download.
 * - HeadObject: only after a CompleteMultipartUpload that got no answer, to see if it landed.
 * - DeleteObject: a missing object is fine.
 * - ListObjectsV2: with `prefix` and `continuation-token` paging.
 * - CreateMultipartUpload, UploadPart, CompleteMultipartUpload (a 200 answer carrying an
 *   `<Error>` is a failure), AbortMultipartUpload: streams of one part or more.
 *
 * Retries: requests that are safe to repeat (reads, listings, deletes, parts, unconditional
 * writes of the same bytes to a key) are sent again after a network error, a timeout, a 5xx,
 * 429 or SlowDown, up to 4 tries with doubling pauses. A conditional PutObject is never resent
 * blindly: after a try that got no answer (or a 5xx) the object is read back; if it holds the
 * same bytes the write landed and succeeds, if the condition no longer holds it fails with
 * precondition_failed, and only otherwise is it sent again. Every request has a time limit
 * (60 s by default; for a download, per wait for more bytes), joined with the caller's signal.
 *
 * Keys are `<prefix>/<key>` in the bucket (just `<key>` with an empty prefix).
 */

import { Http1Client } from "./http1.ts";
import {
  DEFAULT_RETRY,
  type FetchLike,
  fetchTransport,
  type RetryPolicy,
  S3Client,
} from "./s3_client.ts";
import { badAnswerError, S3StoreError } from "./s3_errors.ts";
import { MIN_PART_BYTES, uploadStream } from "./s3_upload.ts";
import { parseListObjectsV2, unquoteEtag } from "./s3_xml.ts";
import type { Credentials } from "./sigv4.ts";
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
  type TransferOptions,
  type WriteCondition,
} from "./store.ts";

/**
 * The most of one ListObjectsV2 page read: a page holds at most 1,000 objects, each entry well
 * under 2 KiB even with S3's longest keys and an owner.
 */
export const MAX_LIST_PAGE_BYTES = 8 * 1024 * 1024;

/** Default part size of multipart uploads: a few of them are in memory during a write. */
export const DEFAULT_PART_BYTES = 8 * 1024 * 1024;

/** Where the bucket is and how to reach it. */
export interface S3StoreOptions {
  /** e.g. https://s3.eu-west-1.amazonaws.com or http://127.0.0.1:7070. */
  readonly endpoint: URL;
  readonly region: string;
  readonly bucket: string;
  /** Folder in the bucket ("" for its root); slashes at either end are ignored. */
  readonly prefix: string;
  /** `endpoint/bucket/key` (MinIO, versitygw) instead of `bucket.endpoint/key` (AWS). */
  readonly pathStyle: boolean;
  readonly credentials: Credentials;
  /** Part size of multipart uploads (default 8 MiB; S3's minimum is 5 MiB). */
  readonly partSizeBytes?: number;
  /** Parts uploading at once (default 2; one more is being read). */
  readonly partsInFlight?: number;
  /** Allows parts under 5 MiB: for unit tests with a fake fetch only (S3 refuses them). */
  readonly allowSmallParts?: boolean;
  /** Time limit of one request (default 60 s). */
  readonly requestTimeoutMs?: number;
  readonly retry?: Partial<RetryPolicy>;
  /** Replaces the HTTP/1.1 client with a fetch-shaped function: a seam for unit tests. */
  readonly fetch?: FetchLike;
}

function sameBytes(a: Uint8Array, b: Uint8Array): boolean {
  return a.length === b.length && a.every((v, i) => v === b[i]);
}

function holds(condition: WriteCondition, now: ObjectBytes | undefined): boolean {
  return "ifNoneMatch" in condition ? now === undefined : now?.etag === condition.ifMatch;
}

/** The store in an S3 bucket. */
export class S3Store implements Store {
  readonly description: string;
  readonly #client: S3Client;
  readonly #root: string;
  readonly #partSizeBytes: number;
  readonly #partsInFlight: number | undefined;

  /** @throws {RangeError} for a part size under 5 MiB (unless allowed) */
  constructor(options: S3StoreOptions) {
    this.#root = options.prefix.split("/").filter((s) => s !== "").join("/");
    if (this.#root !== "") checkKey(this.#root);
    this.#partSizeBytes = options.partSizeBytes ?? DEFAULT_PART_BYTES;
    this.#partsInFlight = options.partsInFlight;
    if (
      !Number.isSafeInteger(this.#partSizeBytes) || this.#partSizeBytes < 1 ||
      (this.#partSizeBytes < MIN_PART_BYTES && !options.allowSmallParts)
    ) {
      throw new RangeError(`S3 part size ${this.#partSizeBytes} is not at least 5 MiB`);
    }
    const ep = options.endpoint;
    // No user info from the URL: descriptions go into logs and error messages.
    const where = `${ep.protocol}//${ep.host}${ep.pathname.replace(/\/+$/, "")}`;
    this.description = `s3://${options.bucket}/${this.#root} (${where})`;
    this.#client = new S3Client({
      address: { endpoint: ep, bucket: options.bucket, pathStyle: options.pathStyle },
      region: options.region,
      credentials: options.credentials,
      timeoutMs: options.requestTimeoutMs ?? 60_000,
      retry: { ...DEFAULT_RETRY, ...options.retry },
      transport: options.fetch ? fetchTransport(options.fetch) : new Http1Client(),
    });
  }

  #full(key: string): string {
    return this.#root === "" ? key : `${this.#root}/${key}`;
  }

  async putStream(
    key: string,
    body: ReadableStream<Uint8Array>,
    options: TransferOptions = {},
  ): Promise<PutResult> {
    checkKey(key);
    return await uploadStream({
      client: this.#client,
      key: this.#full(key),
      what: `Writing "${key}" to ${this.description}`,
      partSizeBytes: this.#partSizeBytes,
      ...(this.#partsInFlight !== undefined && { partsInFlight: this.#partsInFlight }),
      signal: options.signal,
      ...(options.onProgress ? { onProgress: options.onProgress } : {}),
    }, body);
  }

  async putBytes(
    key: string,
    bytes: Uint8Array,
    condition?: WriteCondition,
    options: RequestOptions = {},
  ): Promise<PutResult> {
    checkKey(key);
    const { signal } = options;
    const what = `Writing "${key}" to ${this.description}`;
    const headers: Record<string, string> = condition === undefined
      ? {}
      : "ifNoneMatch" in condition
      ? { "if-none-match": "*" }
      : { "if-match": `"${condition.ifMatch}"` };
    const put = async () => {
      const { response } = await this.#client.send({
        method: "PUT",
        key: this.#full(key),
        headers,
        body: new Uint8Array(bytes),
        what,
        // The same bytes again are harmless only without a condition (see the module doc).
        idempotent: condition === undefined,
        signal,
      });
      return { etag: unquoteEtag(response.headers.get("etag") ?? ""), size: bytes.length };
    };
    if (condition === undefined) return await put();
    let unanswered = false;
    for (let n = 1;; n++) {
      try {
        return await put();
      } catch (e) {
        if (!(e instanceof S3StoreError)) throw e;
        if (e.kind === "not_found" && "ifMatch" in condition) {
          // S3 answers If-Match on a missing object with 404 NoSuchKey: the condition lost.
          throw new StoreError("precondition_failed", `${e.message}: there is no object to match`);
        }
        if (e.kind === "precondition_failed" && !unanswered) throw e;
        if (e.kind !== "precondition_failed" && !e.retryable) throw e;
        // Did an unanswered try land? Then this write is done (a later try lost to it).
        const now = await this.getBytes(key, options);
        if (now !== undefined && sameBytes(now.bytes, bytes)) {
          return { etag: now.etag, size: bytes.length };
        }
        if (e.kind === "precondition_failed") throw e;
        if (!holds(condition, now)) {
          throw new StoreError(
            "precondition_failed",
            `${what} failed: the object ${
              now === undefined ? "is gone" : "changed"
            } while the store did not answer`,
          );
        }
        if (n >= this.#client.tries) throw e;
        unanswered = true;
      }
      await this.#client.backoff(n, signal);
    }
  }

  async getStream(key: string, options: TransferOptions = {}): Promise<ReadableStream<Uint8Array>> {
    checkKey(key);
    return await this.#client.open({
      method: "GET",
      key: this.#full(key),
      what: `Reading "${key}" from ${this.description}`,
      idempotent: true,
      signal: options.signal,
    });
  }

  async getBytes(key: string, options: RequestOptions = {}): Promise<ObjectBytes | undefined> {
    checkKey(key);
    try {
      const { response, body } = await this.#client.send({
        method: "GET",
        key: this.#full(key),
        what: `Reading "${key}" from ${this.description}`,
        idempotent: true,
        maxBodyBytes: MAX_OBJECT_BYTES,
        signal: options.signal,
      });
      return { bytes: body, etag: unquoteEtag(response.headers.get("etag") ?? "") };
    } catch (e) {
      if (e instanceof StoreError && e.kind === "not_found") return undefined;
      throw e;
    }
  }

  async list(prefix: string, options: RequestOptions = {}): Promise<StoredObject[]> {
    checkPrefix(prefix);
    const root = this.#root === "" ? "" : `${this.#root}/`;
    const what = `Listing "${prefix}" in ${this.description}`;
    const objects: StoredObject[] = [];
    let token: string | undefined;
    // The pages come over one connection.
    using _connection = this.#client.hold();
    do {
      const query: [string, string][] = [["list-type", "2"], ["prefix", root + prefix]];
      if (token !== undefined) query.push(["continuation-token", token]);
      const { body } = await this.#client.send({
        method: "GET",
        key: undefined,
        query,
        what,
        idempotent: true,
        maxBodyBytes: MAX_LIST_PAGE_BYTES,
        signal: options.signal,
      });
      let page;
      try {
        page = parseListObjectsV2(new TextDecoder().decode(body));
      } catch (e) {
        throw badAnswerError(what, e);
      }
      for (const o of page.objects) {
        if (o.key.startsWith(root)) objects.push({ ...o, key: o.key.slice(root.length) });
      }
      token = page.nextContinuationToken;
    } while (token !== undefined);
    return objects.sort((a, b) => a.key < b.key ? -1 : a.key > b.key ? 1 : 0);
  }

  async delete(key: string, options: RequestOptions = {}): Promise<void> {
    checkKey(key);
    try {
      await this.#client.send({
        method: "DELETE",
        key: this.#full(key),
        what: `Deleting "${key}" from ${this.description}`,
        idempotent: true,
        signal: options.signal,
      });
    } catch (e) {
      if (e instanceof StoreError && e.kind === "not_found") return;
      throw e;
    }
  }
}
