/**
 * A small HTTP/1.1 client over Deno.connect (and Deno.startTls for https), made for the S3
 * store's transport: a request body is written from the caller's buffer as it is, with no copy
 * kept, and a response body is streamed as it arrives. Answers are parsed strictly; anything an
 * HTTP/1.1 server would not send fails the request instead of being guessed at.
 *
 * Connections are kept alive and reused per endpoint only while the client is in use (a
 * request is open or a {@linkcode Http1Client.hold} is held): when the last one ends, the idle
 * connections are closed, so no socket outlives the work and none goes stale between
 * scheduled backups (and one idle for more than 4 s is not reused at all). A connection is
 * reused only after its answer was read to the end, never after an error, an abort or a
 * `Connection: close` from either side.
 *
 * Compared with fetch: no proxy from HTTP(S)_PROXY, no HTTP/2, no redirects followed, no
 * compression negotiated, no cookies. Same permission: --allow-net for the URL's host:port.
 */

import { servingOthers, stepAside } from "../foreground.ts";

/** A request or answer that cannot be carried out: a network failure or a broken answer. */
export class Http1Error extends TypeError {
  /** Whether any byte of the answer arrived (a request that got none may not have landed). */
  readonly answered: boolean;

  constructor(message: string, answered: boolean, options?: ErrorOptions) {
    super(message, options);
    this.name = "Http1Error";
    this.answered = answered;
  }
}

/** Options of an {@linkcode Http1Client}. */
export interface Http1ClientOptions {
  /** Idle connections kept per endpoint while the client is in use (default 8). */
  readonly maxIdlePerEndpoint?: number;
  /**
   * How long a connection may sit idle and still be used again (default 4 s): kept short, so
   * that a server closing idle connections is unlikely to have closed it in the meantime.
   */
  readonly maxIdleMs?: number;
  /** Time limit of connecting, TLS handshake included (default 30 s). */
  readonly connectTimeoutMs?: number;
  /** Extra CA certificates (PEM) for https, besides the default roots. */
  readonly caCerts?: readonly string[];
}

/** One request: fetch's shape, narrowed to what this client sends. */
export interface Http1Init {
  readonly method?: string;
  readonly headers?: HeadersInit;
  /** Written as it is, with a Content-Length; never copied nor kept after the request. */
  readonly body?: Uint8Array | null;
  /** Aborting closes the connection; the request (or the body's reads) reject with its reason. */
  readonly signal?: AbortSignal | null;
  /**
   * Told each time bytes of the request went out (the socket took them): a large body is
   * written as the network drains, so a caller sees a slow upload move and a stalled one stop.
   */
  readonly onSent?: (bytes: number) => void;
}

/** The most an answer's status line and headers may take. */
export const MAX_HEAD_BYTES = 64 * 1024;
const MAX_HEADERS = 128;
/** Bytes read from the socket at a time into a connection's buffer (heads, chunk sizes). */
const READ_BYTES = 256 * 1024;
/**
 * The most read from the socket at once for a body (and the largest chunk a body stream gives).
 * A download of 256 MiB from versitygw on loopback, hashed as it came, took 0.38 CPU-seconds
 * in 1 MiB reads against 0.41 in 256 KiB reads (0.40 against 0.43 with the plugin's V8 flags;
 * 7 trials each, medians): fewer reads, fewer buffers to allocate and collect.
 */
const BODY_READ_BYTES = 1024 * 1024;
/** Bodies up to this size go out in one write with the head. */
const SMALL_BODY_BYTES = 64 * 1024;
/** A body's slices while a volume call is served: a few milliseconds each at the slow rate. */
const STEP_ASIDE_SLICE_BYTES = 64 * 1024;

const TOKEN = /^[!#$%&'*+\-.^_`|~0-9A-Za-z]+$/;
// A field value: visible characters, spaces, tabs and obs-text; no CR, LF, NUL or other controls.
const FIELD_VALUE = /^[\t\x20-\x7e\x80-\xff]*$/;
const STATUS_LINE = /^HTTP\/1\.([01]) ([1-9]\d\d)(?: ([\t\x20-\x7e\x80-\xff]*))?$/;
const latin1 = new TextDecoder("latin1");

/** Keep-alive HTTP/1.1 requests with streamed answers. */
export class Http1Client {
  readonly #idle = new Map<string, Connection[]>();
  readonly #maxIdle: number;
  readonly #maxIdleMs: number;
  readonly #connectTimeoutMs: number;
  readonly #caCerts: string[] | undefined;
  /** Requests not yet done (answer read or dropped) plus holds. */
  #users = 0;

  constructor(options: Http1ClientOptions = {}) {
    this.#maxIdle = options.maxIdlePerEndpoint ?? 8;
    this.#maxIdleMs = options.maxIdleMs ?? 4000;
    this.#connectTimeoutMs = options.connectTimeoutMs ?? 30_000;
    this.#caCerts = options.caCerts ? [...options.caCerts] : undefined;
  }

  /**
   * Keeps idle connections open until disposed, for a run of requests (a multipart upload)
   * that would otherwise connect anew whenever none is open.
   */
  hold(): Disposable {
    this.#users++;
    let held = true;
    return {
      [Symbol.dispose]: () => {
        if (!held) return;
        held = false;
        this.#leave();
      },
    };
  }

  /** Idle connections now open, over all endpoints (for tests and metrics). */
  get idleConnections(): number {
    let n = 0;
    for (const list of this.#idle.values()) n += list.length;
    return n;
  }

  /** Closes the idle connections (requests in flight go on and close theirs when done). */
  close(): void {
    for (const list of this.#idle.values()) for (const c of list) c.close();
    this.#idle.clear();
  }

  /**
   * Sends one request and resolves with the answer once its head arrived; its body streams.
   * Any status is an answer (no redirect is followed).
   * @throws {Http1Error} when the connection fails or the answer is not valid HTTP/1.1
   * @throws {TypeError} for a request that cannot be sent as given (bad method, header, body)
   * @throws the signal's reason when it aborts
   */
  async fetch(input: URL | string, init: Http1Init = {}): Promise<Response> {
    const url = input instanceof URL ? input : new URL(input);
    const method = init.method ?? "GET";
    const head = requestHead(url, method, init.headers, init.body ?? null);
    const signal = init.signal ?? undefined;
    signal?.throwIfAborted();
    this.#users++;
    let conn: Connection | undefined;
    let done = false;
    const finish = (reusable: boolean) => {
      if (done) return;
      done = true;
      signal?.removeEventListener("abort", onAbort);
      if (conn !== undefined) this.#release(conn, reusable);
      this.#leave();
    };
    let body: BodyStream | undefined;
    const onAbort = () => {
      conn?.close();
      body?.fail(signal!.reason);
      finish(false);
    };
    try {
      conn = await this.#acquire(url, signal);
      signal?.addEventListener("abort", onAbort, { once: true });
      signal?.throwIfAborted();
      await writeRequest(conn, head.bytes, init.body ?? null, init.onSent);
      const answer = await readAnswerHead(conn, method);
      const reusable = !head.close && answer.keepAlive;
      if (answer.framing.kind === "none") {
        finish(reusable);
        return new Response(null, answer.init);
      }
      const c = conn;
      body = new BodyStream(c, answer.framing, (ok) => finish(ok && reusable));
      return new Response(body.stream, answer.init);
    } catch (e) {
      conn?.close();
      finish(false);
      if (signal?.aborted) throw signal.reason;
      throw http1Error(`${method} ${url.protocol}//${url.host}`, e);
    }
  }

  #leave(): void {
    if (--this.#users === 0) this.close();
  }

  #release(conn: Connection, reusable: boolean): void {
    // The request releasing it still counts as a user here: 1 means nobody else needs it.
    if (!reusable || conn.closed || this.#users <= 1) return conn.close();
    const list = this.#idle.get(conn.endpoint) ?? [];
    if (list.length >= this.#maxIdle) return conn.close();
    conn.idleSince = performance.now();
    list.push(conn);
    this.#idle.set(conn.endpoint, list);
  }

  async #acquire(url: URL, signal: AbortSignal | undefined): Promise<Connection> {
    const endpoint = endpointOf(url);
    const idle = this.#idle.get(endpoint) ?? [];
    for (let c; (c = idle.pop()) !== undefined;) {
      // The most recently used first; one idle too long may be closing on the server's side.
      if (performance.now() - c.idleSince <= this.#maxIdleMs) return c;
      c.close();
    }
    return await this.#connect(url, endpoint, signal);
  }

  async #connect(url: URL, endpoint: string, signal: AbortSignal | undefined): Promise<Connection> {
    const hostname = url.hostname.replace(/^\[(.*)\]$/, "$1");
    const port = Number(url.port || (url.protocol === "https:" ? 443 : 80));
    let conn: Deno.Conn | undefined;
    let timer: ReturnType<typeof setTimeout> | undefined;
    let stop: (() => void) | undefined;
    // Deno.connect takes no signal: the attempt is left to finish and its socket closed.
    const stopped = new Promise<never>((_, reject) => {
      stop = () => reject(signal?.reason);
      timer = setTimeout(() => {
        reject(
          new Error(`connecting to ${endpoint} took longer than ${this.#connectTimeoutMs} ms`),
        );
      }, this.#connectTimeoutMs);
      signal?.addEventListener("abort", stop, { once: true });
    });
    const connecting = (async () => {
      const tcp = await Deno.connect({ hostname, port, transport: "tcp" });
      conn = tcp;
      // Heads and small bodies go out at once, not held back by Nagle's algorithm.
      tcp.setNoDelay(true);
      if (url.protocol !== "https:") return tcp;
      const tls = await Deno.startTls(tcp, {
        hostname,
        alpnProtocols: ["http/1.1"],
        ...(this.#caCerts && { caCerts: this.#caCerts }),
      });
      conn = tls;
      await tls.handshake();
      return tls;
    })();
    try {
      return new Connection(await Promise.race([connecting, stopped]), endpoint);
    } catch (e) {
      connecting.then(closeQuietly, () => {});
      if (conn !== undefined) closeQuietly(conn);
      throw e;
    } finally {
      clearTimeout(timer);
      if (stop) signal?.removeEventListener("abort", stop);
    }
  }
}

function endpointOf(url: URL): string {
  if (url.protocol !== "http:" && url.protocol !== "https:") {
    throw new TypeError(`Cannot send a request to "${url.protocol}" URLs, only http: and https:`);
  }
  return `${url.protocol}//${url.host}`;
}

/** `e` as an {@linkcode Http1Error} naming what failed (Deno's own errors say only "reset"). */
function http1Error(what: string, e: unknown): Http1Error {
  const message = e instanceof Error ? e.message : String(e);
  const answered = e instanceof Http1Error && e.answered;
  return new Http1Error(`${what} failed: ${message}`, answered, { cause: e });
}

function closeQuietly(conn: Deno.Conn): void {
  try {
    conn.close();
  } catch {
    // Already closed.
  }
}

/**
 * The request's head as bytes. Every name and value is checked, so nothing given can add a
 * header or a request of its own (CR, LF or NUL in a value, a method or name that is not a
 * token). Host and Content-Length are always this client's.
 */
export function requestHead(
  url: URL,
  method: string,
  headers: HeadersInit | undefined,
  body: Uint8Array | null,
): { bytes: Uint8Array; close: boolean } {
  endpointOf(url);
  if (!TOKEN.test(method)) throw new TypeError(`The method "${method}" is not an HTTP token`);
  if (body !== null && !(body instanceof Uint8Array)) {
    throw new TypeError("A request body must be a Uint8Array");
  }
  if (url.username !== "" || url.password !== "") {
    throw new TypeError("A URL with credentials cannot be sent");
  }
  const lines = [`${method} ${url.pathname}${url.search} HTTP/1.1`, `host: ${url.host}`];
  let close = false;
  for (const [name, value] of pairs(headers)) {
    const lower = name.toLowerCase();
    if (!TOKEN.test(name)) throw new TypeError(`The header name "${name}" is not an HTTP token`);
    if (!FIELD_VALUE.test(value)) {
      throw new TypeError(`The value of header "${name}" has a control character`);
    }
    if (lower === "host" || lower === "content-length" || lower === "transfer-encoding") {
      throw new TypeError(`The header "${name}" is set by the client`);
    }
    if (lower === "connection" && connectionTokens(value).includes("close")) close = true;
    lines.push(`${lower}: ${value.trim()}`);
  }
  const sendsBody = body !== null || method === "PUT" || method === "POST";
  if (sendsBody) lines.push(`content-length: ${body?.length ?? 0}`);
  // Names and values were checked to be Latin-1 at most: one byte each.
  const text = `${lines.join("\r\n")}\r\n\r\n`;
  const bytes = new Uint8Array(text.length);
  for (let i = 0; i < text.length; i++) bytes[i] = text.charCodeAt(i);
  return { bytes, close };
}

function pairs(headers: HeadersInit | undefined): [string, string][] {
  if (headers === undefined) return [];
  // Not through `new Headers`: it would trim and fold away what must be refused instead.
  if (headers instanceof Headers) return [...headers];
  if (Array.isArray(headers)) return headers.map(([n, v]) => [String(n), String(v)]);
  return Object.entries(headers).map(([n, v]) => [n, String(v)]);
}

function connectionTokens(value: string): string[] {
  return value.split(",").map((s) => s.trim().toLowerCase());
}

async function writeRequest(
  conn: Connection,
  head: Uint8Array,
  body: Uint8Array | null,
  onSent?: (bytes: number) => void,
) {
  if (body !== null && body.length <= SMALL_BODY_BYTES) {
    const all = new Uint8Array(head.length + body.length);
    all.set(head);
    all.set(body, head.length);
    return await conn.writeAll(all, onSent);
  }
  await conn.writeAll(head, onSent);
  if (body !== null) await conn.writeAll(body, onSent);
}

/** How an answer's body is delimited. */
export type Framing =
  | { readonly kind: "none" }
  | { readonly kind: "length"; readonly length: number }
  | { readonly kind: "chunked" }
  | { readonly kind: "close" };

interface AnswerHead {
  readonly init: ResponseInit;
  readonly framing: Framing;
  readonly keepAlive: boolean;
}

/** Reads heads until a final one (1xx answers are skipped). */
async function readAnswerHead(conn: Connection, method: string): Promise<AnswerHead> {
  for (;;) {
    const lines = await conn.readHead();
    const parsed = parseAnswerHead(lines, method);
    if (parsed !== "interim") return parsed;
  }
}

/**
 * Parses a status line and header lines (without their CRLFs), strictly: HTTP/1.0 or 1.1, a
 * three-digit status, `name: value` lines with token names and no folding, one framing
 * (Content-Length values that agree, or `Transfer-Encoding: chunked` alone).
 * @returns "interim" for a 1xx answer other than 101, which is followed by the real one
 * @throws {Http1Error} for anything else
 */
export function parseAnswerHead(lines: readonly string[], method: string): AnswerHead | "interim" {
  const bad = (why: string) => new Http1Error(`the answer is not valid HTTP/1.1: ${why}`, true);
  const status = STATUS_LINE.exec(lines[0] ?? "");
  if (status === null) throw bad(`status line "${short(lines[0] ?? "")}"`);
  const code = Number(status[2]);
  if (code === 101) throw bad("101 Switching Protocols was not asked for");
  if (code >= 600) throw bad(`status ${code}`);
  if (lines.length - 1 > MAX_HEADERS) throw bad(`more than ${MAX_HEADERS} headers`);
  const headers = new Headers();
  for (const line of lines.slice(1)) {
    const colon = line.indexOf(":");
    const name = colon > 0 ? line.slice(0, colon) : "";
    if (!TOKEN.test(name)) throw bad(`header line "${short(line)}"`);
    const value = line.slice(colon + 1).replace(/^[ \t]+|[ \t]+$/g, "");
    if (!FIELD_VALUE.test(value)) throw bad(`control character in header "${name}"`);
    headers.append(name, value);
  }
  if (code < 200) return "interim";
  const http10 = status[1] === "0";
  const tokens = connectionTokens(headers.get("connection") ?? "");
  const keepAlive = http10 ? tokens.includes("keep-alive") : !tokens.includes("close");
  const init = { status: code, statusText: status[3] ?? "", headers };
  const te = headers.get("transfer-encoding");
  const cl = headers.get("content-length");
  if (method === "HEAD" || code === 204 || code === 304) {
    return { init, framing: { kind: "none" }, keepAlive };
  }
  if (te !== null) {
    if (cl !== null) throw bad("both Transfer-Encoding and Content-Length");
    if (te.toLowerCase() !== "chunked") throw bad(`Transfer-Encoding "${short(te)}"`);
    return { init, framing: { kind: "chunked" }, keepAlive };
  }
  if (cl !== null) {
    const values = new Set(cl.split(",").map((v) => v.trim()));
    const [value] = values;
    if (values.size !== 1 || !/^\d{1,15}$/.test(value!)) throw bad(`Content-Length "${short(cl)}"`);
    const length = Number(value);
    return {
      init,
      framing: length === 0 ? { kind: "none" } : { kind: "length", length },
      keepAlive,
    };
  }
  // No length: the body runs to the end of the connection, which cannot be used again.
  return { init, framing: { kind: "close" }, keepAlive: false };
}

function short(text: string): string {
  return text.length > 80 ? `${text.slice(0, 80)}…` : text;
}

/**
 * A socket with a read buffer: heads and chunk sizes are parsed from it, bodies read past it.
 * Reads go through the socket's readable stream, whose cancel ends a read that waits (closing
 * a Deno.Conn does not, in Deno 2.8); a write that waits on a server that reads nothing cannot
 * be ended at all, so it is left behind (it fails once the server drops the connection) and
 * the request fails at once.
 */
class Connection {
  readonly endpoint: string;
  /** When it was last put back to be used again (performance.now()). */
  idleSince = 0;
  readonly #conn: Deno.Conn;
  readonly #reader: ReadableStreamBYOBReader;
  readonly #closing: Promise<never>;
  #stop: (reason: Error) => void = () => {};
  #buffer = new Uint8Array(READ_BYTES);
  #start = 0;
  #end = 0;
  #closed = false;

  constructor(conn: Deno.Conn, endpoint: string) {
    this.#conn = conn;
    this.endpoint = endpoint;
    this.#reader = conn.readable.getReader({ mode: "byob" });
    this.#closing = new Promise<never>((_, reject) => this.#stop = reject);
    this.#closing.catch(() => {});
  }

  get closed(): boolean {
    return this.#closed;
  }

  close(): void {
    if (this.#closed) return;
    this.#closed = true;
    this.#stop(new Http1Error("the connection was closed", false));
    this.#reader.cancel().catch(() => {});
    closeQuietly(this.#conn);
  }

  async writeAll(bytes: Uint8Array, onSent?: (bytes: number) => void): Promise<void> {
    if (this.#start !== this.#end) {
      // Bytes arrived before the request was sent: not an answer to it.
      throw new Http1Error("the server sent bytes nobody asked for", true);
    }
    for (let at = 0; at < bytes.length;) {
      // While a volume call is served, a body goes out slowly, in slices (src/foreground.ts):
      // the store's server then leaves the cores to the call too.
      let end = bytes.length;
      if (servingOthers()) {
        end = Math.min(end, at + STEP_ASIDE_SLICE_BYTES);
        await stepAside(end - at);
      }
      const n = await Promise.race([this.#conn.write(bytes.subarray(at, end)), this.#closing]);
      at += n;
      onSent?.(n);
    }
  }

  /** Reads into `view` (which is handed over): the filled view of the same memory, or null at EOF. */
  async #read(view: Uint8Array<ArrayBuffer>): Promise<Uint8Array<ArrayBuffer> | null> {
    const filled = await this.#readView(view);
    return filled === undefined || filled.length === 0 ? null : filled;
  }

  /**
   * Reads into `view` (which is handed over): the view of the same memory, empty at EOF
   * (undefined only when the read was cancelled).
   */
  async #readView(view: Uint8Array<ArrayBuffer>): Promise<Uint8Array<ArrayBuffer> | undefined> {
    if (this.#closed) throw new Http1Error("the connection was closed", false);
    const r = await this.#reader.read(view);
    if (this.#closed) throw new Http1Error("the connection was closed", false);
    return r.value === undefined ? undefined : r.done ? r.value.subarray(0, 0) : r.value;
  }

  /** The head's lines, without the empty line that ends it. */
  async readHead(): Promise<string[]> {
    const lines: string[] = [];
    let size = 0;
    for (;;) {
      const line = await this.readLine(MAX_HEAD_BYTES - size, lines.length > 0);
      size += line.length + 2;
      if (line === "") {
        if (lines.length === 0) throw new Http1Error("the answer starts with an empty line", true);
        return lines;
      }
      if (lines.length > 0 && (line[0] === " " || line[0] === "\t")) {
        throw new Http1Error("the answer folds a header over lines", true);
      }
      lines.push(line);
    }
  }

  /** One CRLF-ended line of at most `limit` bytes, decoded as Latin-1 (bytes as they are). */
  async readLine(limit: number, answered = true, tooLong?: string): Promise<string> {
    let scanned = this.#start;
    for (;;) {
      const lf = this.#buffer.subarray(scanned, this.#end).indexOf(0x0a);
      if (lf >= 0) {
        const at = scanned + lf;
        if (at === this.#start || this.#buffer[at - 1] !== 0x0d) {
          throw new Http1Error("a line of the answer does not end in CRLF", true);
        }
        const line = latin1.decode(this.#buffer.subarray(this.#start, at - 1));
        this.#start = at + 1;
        return line;
      }
      if (this.#end - this.#start >= limit) {
        throw new Http1Error(tooLong ?? `a line of the answer is longer than ${limit} bytes`, true);
      }
      scanned = this.#end;
      if (this.#end === this.#buffer.length) {
        // Make room: the line so far moves to the front.
        this.#buffer.copyWithin(0, this.#start, this.#end);
        scanned -= this.#start;
        this.#end -= this.#start;
        this.#start = 0;
      }
      const read = await this.#read(
        new Uint8Array(this.#buffer.buffer, this.#end, this.#buffer.length - this.#end),
      );
      if (read !== null) this.#buffer = new Uint8Array(read.buffer);
      const n = read?.length ?? null;
      if (n === null) {
        throw new Http1Error(
          answered || this.#end > this.#start
            ? "the connection closed in the middle of the answer"
            : "the connection closed before any answer",
          answered || this.#end > this.#start,
        );
      }
      this.#end += n;
    }
  }

  /**
   * Up to `max` bytes of the body: buffered ones first, else one read; null at EOF. Given
   * `into` (a reader's own buffer, which is handed over), the bytes land there and the view of
   * the same memory comes back, empty at EOF; else they come in a new buffer.
   */
  async readSome(max: number, into?: Uint8Array<ArrayBuffer>): Promise<Uint8Array | null> {
    if (this.#end > this.#start) {
      const n = Math.min(max, this.#end - this.#start, into?.length ?? Infinity);
      const buffered = this.#buffer.subarray(this.#start, this.#start + n);
      this.#start += n;
      if (into === undefined) return buffered.slice();
      into.set(buffered);
      return into.subarray(0, n);
    }
    if (into !== undefined) {
      return await this.#readView(into.subarray(0, Math.min(max, into.length))) ?? null;
    }
    const read = await this.#read(new Uint8Array(Math.min(max, BODY_READ_BYTES)));
    // A short read keeps only its bytes: a chunk its reader holds on to (a restore holds back
    // the last one) or queues never holds a read buffer many times its size.
    return read !== null && read.length < read.buffer.byteLength / 2 ? read.slice() : read;
  }
}

/** An answer's body as a stream pulled from its connection. */
class BodyStream {
  readonly stream: ReadableStream<Uint8Array>;
  readonly #conn: Connection;
  readonly #framing: Framing;
  readonly #done: (ok: boolean) => void;
  #controller: ReadableByteStreamController | undefined;
  #left: number;
  /** In a chunked body: bytes left of the current chunk (0: a size line comes next). */
  #inChunk = 0;
  #ended = false;

  constructor(conn: Connection, framing: Framing, done: (ok: boolean) => void) {
    this.#conn = conn;
    this.#framing = framing;
    this.#done = done;
    this.#left = framing.kind === "length" ? framing.length : Infinity;
    // A byte stream: a reader with buffers of its own (a restore) has the socket read into
    // them. A new buffer for every read made a 1 GiB restore allocate gigabytes, and V8 then
    // marked its whole heap every few dozen MiB (see the read below).
    this.stream = new ReadableStream({
      type: "bytes",
      start: (controller: ReadableByteStreamController) => {
        this.#controller = controller;
      },
      pull: async (controller: ReadableByteStreamController) => {
        const request = controller.byobRequest;
        const given = request?.view;
        try {
          const into = given
            ? new Uint8Array(given.buffer, given.byteOffset, given.byteLength)
            : undefined;
          const chunk = await this.#next(into);
          if (chunk === null || chunk.length === 0) {
            this.#ended = true;
            controller.close();
            this.#done(true);
            // A reader's buffer that a read took over comes back (empty) in the view it gave.
            if (request && chunk) request.respondWithNewView(chunk);
            else request?.respond(0);
          } else if (request) request.respondWithNewView(chunk);
          else controller.enqueue(chunk);
        } catch (e) {
          this.fail(http1Error(`Reading the answer from ${this.#conn.endpoint}`, e));
        }
      },
      cancel: () => {
        this.#ended = true;
        this.#conn.close();
        this.#done(false);
      },
    });
  }

  /** Ends the stream with an error (an abort, a broken connection) and drops the connection. */
  fail(reason: unknown): void {
    if (this.#ended) return;
    this.#ended = true;
    this.#conn.close();
    this.#controller?.error(reason);
    this.#done(false);
  }

  /** The next bytes of the body (in `into`, when given), or null at its end. */
  async #next(into?: Uint8Array<ArrayBuffer>): Promise<Uint8Array | null> {
    switch (this.#framing.kind) {
      case "length":
        return await this.#nextOfLength(into);
      case "chunked":
        return await this.#nextChunk(into);
      default:
        return await this.#conn.readSome(BODY_READ_BYTES, into);
    }
  }

  async #nextOfLength(into?: Uint8Array<ArrayBuffer>): Promise<Uint8Array | null> {
    if (this.#left === 0) return null;
    const chunk = await this.#conn.readSome(this.#left, into);
    if (chunk === null || chunk.length === 0) {
      throw new Http1Error(
        `the connection closed with ${this.#left} bytes of the body to come`,
        true,
      );
    }
    this.#left -= chunk.length;
    return chunk;
  }

  async #nextChunk(into?: Uint8Array<ArrayBuffer>): Promise<Uint8Array | null> {
    if (this.#inChunk === 0) {
      const size = parseChunkSize(await this.#conn.readLine(4096));
      if (size === 0) {
        // Trailers, if any, up to the empty line; none of them is used.
        let trailers = 0;
        while ((await this.#conn.readLine(MAX_HEAD_BYTES)) !== "") {
          if (++trailers > MAX_HEADERS) throw new Http1Error("too many trailers", true);
        }
        return null;
      }
      this.#inChunk = size;
    }
    const chunk = await this.#conn.readSome(this.#inChunk, into);
    if (chunk === null || chunk.length === 0) {
      throw new Http1Error("the connection closed inside a chunk", true);
    }
    this.#inChunk -= chunk.length;
    const longer = "a chunk is longer than its size says";
    if (this.#inChunk === 0 && (await this.#conn.readLine(2, true, longer)) !== "") {
      throw new Http1Error(longer, true);
    }
    return chunk;
  }
}

/** A chunk-size line: hex digits, then optional `;extensions`, which are ignored. */
export function parseChunkSize(line: string): number {
  const m = /^([0-9A-Fa-f]{1,12})[ \t]*(?:;.*)?$/.exec(line);
  if (m === null) throw new Http1Error(`the chunk size "${short(line)}" is not hex`, true);
  return parseInt(m[1]!, 16);
}
