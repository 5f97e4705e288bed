/**
 * One signed S3 request at a time over a fetch-shaped transport (src/store/http1.ts in
 * production, a fake in unit tests): the URL (path-style or virtual-hosted), the
 * SigV4 headers, a time limit joined with the caller's signal, retries of idempotent requests
 * on transient failures, and failed answers turned into {@linkcode StoreError}s
 * (src/store/s3_errors.ts). Knows nothing of the store's keys or layout.
 */

import { answerError, S3StoreError, unreachableError } from "./s3_errors.ts";
import { parseErrorBody } from "./s3_xml.ts";
import { relayStream } from "./relay.ts";
import { type Credentials, EMPTY_SHA256, sha256Hex, signS3Request, uriEncode } from "./sigv4.ts";
import { tooLargeError } from "./store.ts";

/** Where the bucket is. */
export interface S3Address {
  /** e.g. https://s3.eu-west-1.amazonaws.com or http://127.0.0.1:7070 (a path is kept). */
  readonly endpoint: URL;
  readonly bucket: string;
  /** `endpoint/bucket/key` instead of `bucket.endpoint/key`. */
  readonly pathStyle: boolean;
}

/** Query parameters in order; a value of "" is sent as a bare name (`?uploads`). */
export type Query = readonly (readonly [string, string])[];

/**
 * The URL of an object (`key`, the whole S3 key) or of the bucket (`key` undefined). Each key
 * segment is encoded as SigV4 encodes it, so the path on the wire is the canonical one.
 */
export function s3Url(address: S3Address, key: string | undefined, query: Query = []): URL {
  const ep = address.endpoint;
  const base = ep.pathname.replace(/\/+$/, "");
  const object = key === undefined ? "" : key.split("/").map((s) => uriEncode(s)).join("/");
  const path = address.pathStyle
    ? `${base}/${uriEncode(address.bucket)}${key === undefined ? "" : `/${object}`}`
    : `${base}/${object}`;
  const host = address.pathStyle ? ep.host : `${address.bucket}.${ep.host}`;
  const search = query.map(([n, v]) => v === "" ? uriEncode(n) : `${uriEncode(n)}=${uriEncode(v)}`)
    .join("&");
  return new URL(`${ep.protocol}//${host}${path}${search ? `?${search}` : ""}`);
}

/** How often and how patiently requests are retried. */
export interface RetryPolicy {
  /** Attempts in all (1 = no retry). */
  readonly tries: number;
  /** First pause; doubles each time, with jitter, up to `maxDelayMs`. */
  readonly baseDelayMs: number;
  readonly maxDelayMs: number;
}

/** Four tries over about 2 s. */
export const DEFAULT_RETRY: RetryPolicy = { tries: 4, baseDelayMs: 250, maxDelayMs: 4000 };

/** What a request hands its transport: fetch's arguments, narrowed to what is sent. */
export interface TransportInit {
  readonly method: string;
  readonly headers: Headers;
  /** Sent as it is: the transport neither copies nor keeps it. */
  readonly body: Uint8Array<ArrayBuffer> | null;
  readonly signal: AbortSignal;
  readonly redirect: "manual";
  /** Told each time bytes of the request went out (a transport that cannot tell never calls it). */
  readonly onSent?: (bytes: number) => void;
}

/** Sends one request (fetch fits, and so does {@linkcode Http1Client.fetch}). */
export type FetchLike = (url: URL, init: TransportInit) => Promise<Response>;

/** How requests go out. */
export interface Transport {
  readonly fetch: FetchLike;
  /** Keeps connections open for reuse until disposed (a multipart upload's run of parts). */
  hold(): Disposable;
}

/** A transport over `fetch` (which pools its connections by itself): for tests and fakes. */
export function fetchTransport(fetchLike: FetchLike): Transport {
  return { fetch: fetchLike, hold: () => ({ [Symbol.dispose]() {} }) };
}

/** Options of an {@linkcode S3Client}. */
export interface S3ClientOptions {
  readonly address: S3Address;
  readonly region: string;
  readonly credentials: Credentials;
  /** Time limit of one request (for a download: of each wait for more bytes). */
  readonly timeoutMs: number;
  readonly retry: RetryPolicy;
  readonly transport: Transport;
}

/** One request. */
export interface S3Request {
  readonly method: "GET" | "HEAD" | "PUT" | "POST" | "DELETE";
  /** The whole S3 key, or undefined for the bucket. */
  readonly key: string | undefined;
  readonly query?: Query;
  readonly headers?: Readonly<Record<string, string>>;
  /** A body held in memory (hashed and signed, unless {@linkcode unsignedPayload}). */
  readonly body?: Uint8Array<ArrayBuffer>;
  /**
   * A large body (a stream's part) that is sent as UNSIGNED-PAYLOAD where the connection
   * already protects it: TLS, or loopback, where no network is crossed. Elsewhere (plain http
   * to another host) it is hashed and signed all the same. Its SHA-256 is of no use to the
   * store: the stream's own SHA-256, recorded in its manifest, is checked at every restore.
   */
  readonly unsignedPayload?: boolean;
  /** What is being done, for messages: `Reading "k" from <store>`. */
  readonly what: string;
  /** Safe to send again after a transient failure. */
  readonly idempotent: boolean;
  readonly signal?: AbortSignal | undefined;
  /** Overrides the client's time limit. */
  readonly timeoutMs?: number;
  /**
   * The most {@linkcode S3Client.send} reads of the answer's body (default
   * {@linkcode MAX_ANSWER_BYTES}): a larger answer fails as "invalid", read no further.
   */
  readonly maxBodyBytes?: number;
  /**
   * Told whenever the request moves: bytes of its body went out, its answer's head or bytes of
   * the body read whole came in (see TransferOptions.onProgress in store.ts).
   */
  readonly onProgress?: (() => void) | undefined;
}

/** The most of an answer's body read whole unless a request says otherwise (XML, manifests). */
export const MAX_ANSWER_BYTES = 1024 * 1024;

/** Pauses, or rejects with the signal's reason once it aborts. */
export function pause(ms: number, signal: AbortSignal | undefined): Promise<void> {
  return new Promise((resolve, reject) => {
    if (signal?.aborted) return reject(signal.reason);
    const done = () => {
      signal?.removeEventListener("abort", onAbort);
      resolve();
    };
    const timer = setTimeout(done, ms);
    const onAbort = () => {
      clearTimeout(timer);
      reject(signal?.reason);
    };
    signal?.addEventListener("abort", onAbort, { once: true });
  });
}

const MAX_ERROR_BODY = 64 * 1024;

/** The value of x-amz-content-sha256 that says the body is not part of the signature. */
export const UNSIGNED_PAYLOAD = "UNSIGNED-PAYLOAD";

/** Whether a connection to `endpoint` protects a body by itself: TLS, or never leaving the host. */
export function protectsPayload(endpoint: URL): boolean {
  const host = endpoint.hostname;
  return endpoint.protocol === "https:" || host === "localhost" || host === "[::1]" ||
    /^127\.\d+\.\d+\.\d+$/.test(host);
}

/** Signed requests with time limits, retries and classified errors. */
export class S3Client {
  readonly #o: S3ClientOptions;
  readonly #unsignedAllowed: boolean;

  constructor(options: S3ClientOptions) {
    this.#o = options;
    this.#unsignedAllowed = protectsPayload(options.address.endpoint);
  }

  /** Keeps the transport's connections open for a run of requests, until disposed. */
  hold(): Disposable {
    return this.#o.transport.hold();
  }

  /** The URL of an object or the bucket (see {@linkcode s3Url}). */
  url(key: string | undefined, query: Query = []): URL {
    return s3Url(this.#o.address, key, query);
  }

  /**
   * Sends a request, retrying an idempotent one on transient failures, and returns the 2xx
   * answer with its body read whole (small answers: XML, a manifest), up to the request's cap.
   * @throws {StoreError} classified; invalid for a body over the cap; the caller's abort reason
   *   when its signal aborts
   */
  async send(request: S3Request): Promise<{ response: Response; body: Uint8Array }> {
    return await this.#withRetries(request, async (signal) => {
      const response = await this.#fetch(request, signal);
      const cap = request.maxBodyBytes ?? MAX_ANSWER_BYTES;
      return { response, body: await readCapped(response, cap, request.what, request.onProgress) };
    });
  }

  /**
   * Sends a request and returns the 2xx answer with its body unread, to be streamed. The time
   * limit then applies to each wait for more bytes, not to the whole download.
   * @throws {StoreError} classified; the caller's abort reason when its signal aborts
   */
  async open(request: S3Request): Promise<ReadableStream<Uint8Array>> {
    return await this.#withRetries(request, async (signal, idle) => {
      const response = await this.#fetch(request, signal);
      const body = response.body ?? ReadableStream.from<Uint8Array>([]);
      return idleLimited(body, idle, request, (e) => this.#requestError(request, e));
    });
  }

  /** Runs `attempt` with a fresh time limit per try, pausing between retryable failures. */
  async #withRetries<T>(
    request: S3Request,
    attempt: (signal: AbortSignal, idle: IdleTimer) => Promise<T>,
  ): Promise<T> {
    const { tries } = this.#o.retry;
    for (let n = 1;; n++) {
      const idle = new IdleTimer(request.timeoutMs ?? this.#o.timeoutMs);
      const signal = request.signal ? AbortSignal.any([request.signal, idle.signal]) : idle.signal;
      idle.arm();
      try {
        return await attempt(signal, idle);
      } catch (e) {
        const error = this.#requestError(request, e);
        if (
          !(error instanceof S3StoreError && error.retryable) || !request.idempotent || n >= tries
        ) {
          throw error;
        }
      } finally {
        idle.disarm();
      }
      await this.backoff(n, request.signal);
    }
  }

  /** How many tries a retried request gets. */
  get tries(): number {
    return this.#o.retry.tries;
  }

  /** The pause after failed try `n` (1-based): doubling, capped, with jitter. */
  async backoff(n: number, signal?: AbortSignal): Promise<void> {
    const { baseDelayMs, maxDelayMs } = this.#o.retry;
    const delay = Math.min(maxDelayMs, baseDelayMs * 2 ** (n - 1));
    await pause(delay * (0.5 + Math.random() / 2), signal);
  }

  /** Turns whatever a try threw into the error to throw: the caller's abort stays as it is. */
  #requestError(request: S3Request, e: unknown): unknown {
    if (request.signal?.aborted) return request.signal.reason;
    // The transport (like fetch) rejects with a TypeError when the connection fails or the
    // answer is broken, and with the signal's reason (a TimeoutError) when the limit aborts it.
    if (e instanceof TypeError || (e instanceof DOMException && e.name === "TimeoutError")) {
      return unreachableError(request.what, e);
    }
    return e;
  }

  async #fetch(request: S3Request, signal: AbortSignal): Promise<Response> {
    const url = this.url(request.key, request.query);
    const payloadHash = !request.body
      ? EMPTY_SHA256
      : request.unsignedPayload && this.#unsignedAllowed
      ? UNSIGNED_PAYLOAD
      : sha256Hex(request.body);
    const headers = signS3Request(
      {
        method: request.method,
        url,
        headers: request.headers ?? {},
        payloadHash,
        region: this.#o.region,
      },
      this.#o.credentials,
    );
    const progress = request.onProgress;
    const response = await this.#o.transport.fetch(url, {
      method: request.method,
      headers,
      body: request.body ?? null,
      signal,
      redirect: "manual",
      ...(progress ? { onSent: () => progress() } : {}),
    });
    progress?.();
    if (response.ok) return response;
    if (request.method === "HEAD") {
      // HEAD answers have no body: S3's 404 to HEAD is a missing object.
      await response.body?.cancel();
      const code = response.status === 404 ? "NoSuchKey" : "";
      throw answerError(request.what, response.status, { code, message: "" });
    }
    const text = await readSome(response, MAX_ERROR_BODY);
    const body = parseErrorBody(text) ?? { code: "", message: "" };
    throw answerError(request.what, response.status, body, { bucket: this.#o.address.bucket });
  }
}

/** Aborts its signal when armed for longer than the limit. */
class IdleTimer {
  readonly #controller = new AbortController();
  readonly #limitMs: number;
  #timer: ReturnType<typeof setTimeout> | undefined;

  constructor(limitMs: number) {
    this.#limitMs = limitMs;
  }

  get signal(): AbortSignal {
    return this.#controller.signal;
  }

  arm(): void {
    this.disarm();
    this.#timer = setTimeout(() => {
      this.#controller.abort(new DOMException("The store did not answer in time", "TimeoutError"));
    }, this.#limitMs);
  }

  disarm(): void {
    if (this.#timer !== undefined) clearTimeout(this.#timer);
    this.#timer = undefined;
  }
}

/**
 * An answer's whole body, refused once it is over `cap` bytes: by its Content-Length before
 * any of it is read, or as soon as the bytes read pass the cap (the rest is never read).
 * @throws {StoreError} invalid, naming `what` and the cap
 */
async function readCapped(
  response: Response,
  cap: number,
  what: string,
  onProgress?: () => void,
): Promise<Uint8Array> {
  if (response.body === null) return new Uint8Array(0);
  if (Number(response.headers.get("content-length") ?? 0) > cap) {
    await response.body.cancel().catch(() => {});
    throw tooLargeError(what, cap);
  }
  const reader = response.body.getReader();
  const chunks: Uint8Array[] = [];
  let size = 0;
  for (;;) {
    const r = await reader.read();
    if (r.done) break;
    onProgress?.();
    size += r.value.length;
    if (size > cap) {
      await reader.cancel().catch(() => {});
      throw tooLargeError(what, cap);
    }
    chunks.push(r.value);
  }
  const all = new Uint8Array(size);
  chunks.reduce((at, c) => (all.set(c, at), at + c.length), 0);
  return all;
}

/** Reads at most `limit` bytes of an answer as text, then drops the rest. */
async function readSome(response: Response, limit: number): Promise<string> {
  if (response.body === null) return "";
  const reader = response.body.getReader();
  const chunks: Uint8Array[] = [];
  let size = 0;
  try {
    while (size < limit) {
      const r = await reader.read();
      if (r.done) break;
      chunks.push(r.value);
      size += r.value.length;
    }
  } catch {
    // A broken error body still leaves the status to classify by.
  } finally {
    reader.cancel().catch(() => {});
  }
  const all = new Uint8Array(size);
  chunks.reduce((at, c) => (all.set(c, at), at + c.length), 0);
  return new TextDecoder().decode(all.subarray(0, limit));
}

/**
 * The download as the caller reads it, pulled one chunk at a time (nothing is buffered ahead:
 * the socket's receive buffer already holds what arrives while the caller is busy, and a queue
 * of our own cost CPU and memory without making restores faster; see docs/benchmarks.md): the
 * time limit runs only while a read waits, and a failure becomes a StoreError. A byte stream
 * (the HTTP/1.1 client's body) stays one (relay.ts).
 */
function idleLimited(
  body: ReadableStream<Uint8Array>,
  idle: IdleTimer,
  request: S3Request,
  toError: (e: unknown) => unknown,
): ReadableStream<Uint8Array> {
  idle.disarm();
  return relayStream(body, (cancel) => ({
    read: async (read) => {
      idle.arm();
      try {
        return await read();
      } catch (e) {
        if (request.signal?.aborted !== true) cancel();
        throw toError(e);
      } finally {
        idle.disarm();
      }
    },
    end: () => idle.disarm(),
  }));
}
