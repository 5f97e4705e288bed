/**
 * An HTTP proxy on 127.0.0.1 in front of a real server, whose faults tests switch at runtime:
 * pass requests through, answer the next N with an S3 error, delay them, cut answers off
 * midway, take requests and never answer them, or act as a server that ignores conditional
 * writes. Requests are forwarded with their own Host header (node:http; fetch would replace it),
 * so SigV4 signatures made for the proxy's address still verify at the server.
 */

import http from "node:http";
import { EMPTY_SHA256, signS3Request } from "../../src/store/sigv4.ts";

/** What the proxy does with the requests that match. */
export type Fault =
  | { readonly kind: "pass" }
  /**
   * Answers the next `count` requests with `status` and an S3 `<Error>` of `code`, after
   * `meanwhile` (what another client does while this one waits) has run.
   */
  | {
    readonly kind: "error";
    readonly status: number;
    readonly code: string;
    readonly count: number;
    readonly meanwhile?: () => Promise<unknown>;
  }
  /** Forwards the next `count` requests, then answers 503 instead of the server's answer. */
  | { readonly kind: "lose"; readonly count: number }
  /** Waits `ms` before forwarding each request. */
  | { readonly kind: "delay"; readonly ms: number }
  /**
   * Accepts each request and answers nothing until the fault is changed (`set`), then forwards
   * it: a server that hangs for a while, whose requests take effect late (or, when the client
   * gave up meanwhile, with the body it managed to send).
   */
  | { readonly kind: "hold" }
  /** Forwards the next `count` requests but drops the connection after `afterBytes` of the body. */
  | { readonly kind: "cut"; readonly afterBytes: number; readonly count: number }
  /**
   * Takes each request and never answers it (a store that accepts connections and hangs): the
   * request is held until its client goes away or the proxy stops.
   */
  | { readonly kind: "hang" }
  /**
   * Forwards each request without its If-None-Match and If-Match headers, signed again with
   * `keys` (the server checks the signature): the server then writes whatever the condition
   * said, as an S3 server that ignores conditional writes does.
   */
  | {
    readonly kind: "strip-conditions";
    readonly keys: { readonly accessKeyId: string; readonly secretAccessKey: string };
    readonly region: string;
  };

/** One request the proxy saw. */
export interface SeenRequest {
  readonly method: string;
  /** Path and query. */
  readonly target: string;
  /** "forwarded", or the fault applied. */
  readonly outcome: "forwarded" | Fault["kind"];
}

const HOP_BY_HOP = new Set(["connection", "keep-alive", "transfer-encoding", "upgrade"]);

/** The proxy; stop it (or dispose) to make the store unreachable. */
export class FaultProxy implements AsyncDisposable {
  readonly endpoint: URL;
  readonly seen: SeenRequest[] = [];
  #fault: Fault = { kind: "pass" };
  #match: (r: Request) => boolean = () => true;
  /** Lets the held requests go on; replaced at every `set`. */
  #unhold: () => void = () => {};
  #holdGate: Promise<void> = Promise.resolve();
  readonly #server: Deno.HttpServer<Deno.NetAddr>;
  readonly #target: URL;
  /** Ends each request a "hang" fault holds. */
  readonly #held = new Set<() => void>();

  constructor(target: URL) {
    this.#target = target;
    this.#server = Deno.serve(
      { hostname: "127.0.0.1", port: 0, onListen() {} },
      (r) => this.#handle(r),
    );
    this.endpoint = new URL(`http://127.0.0.1:${this.#server.addr.port}`);
  }

  /** Applies `fault` from now on to requests `match` accepts (default: all). */
  set(fault: Fault, match: (r: Request) => boolean = () => true): void {
    this.#fault = fault;
    this.#match = match;
    this.#unhold();
    this.#holdGate = new Promise((resolve) => this.#unhold = resolve);
  }

  /** Takes one use of a counted fault; back to passing when used up. */
  #take(r: Request): Fault {
    const f = this.#fault;
    if (f.kind === "pass" || !this.#match(r)) return { kind: "pass" };
    if (f.kind === "error" || f.kind === "cut" || f.kind === "lose") {
      this.#fault = f.count > 1 ? { ...f, count: f.count - 1 } : { kind: "pass" };
    }
    return f;
  }

  async #handle(r: Request): Promise<Response> {
    const url = new URL(r.url);
    const target = `${url.pathname}${url.search}`;
    const fault = this.#take(r);
    this.seen.push({
      method: r.method,
      target,
      outcome: fault.kind === "pass" ? "forwarded" : fault.kind,
    });
    if (fault.kind === "error") {
      await r.body?.cancel();
      await fault.meanwhile?.();
      return s3Error(fault.status, fault.code);
    }
    if (fault.kind === "hang") return await this.#hold(r);
    if (fault.kind === "strip-conditions") {
      return await this.#forward(r, target, withoutConditions(r, fault.keys, fault.region));
    }
    if (fault.kind === "delay") await new Promise((res) => setTimeout(res, fault.ms));
    if (fault.kind === "hold") await this.#holdGate;
    const answer = await this.#forward(r, target);
    if (fault.kind === "lose") {
      // The request took effect; the client never learns it.
      await answer.body?.cancel();
      return s3Error(503, "ServiceUnavailable");
    }
    if (fault.kind !== "cut" || answer.body === null) return answer;
    return new Response(cutAfter(answer.body, fault.afterBytes), answer);
  }

  /** Answers only once the client went away or the proxy stops (then 503, seen by nobody). */
  #hold(r: Request): Promise<Response> {
    return new Promise((resolve) => {
      const end = () => {
        this.#held.delete(end);
        resolve(s3Error(503, "ServiceUnavailable"));
      };
      this.#held.add(end);
      r.signal.addEventListener("abort", end, { once: true });
    });
  }

  /** Requests a "hang" fault holds now. */
  get holding(): number {
    return this.#held.size;
  }

  /** Sends the request on to the server with the same method, Host and headers (or `given`). */
  #forward(r: Request, target: string, given?: Record<string, string>): Promise<Response> {
    const headers: Record<string, string> = given ?? {};
    if (given === undefined) {
      r.headers.forEach((v, k) => {
        if (!HOP_BY_HOP.has(k)) headers[k] = v;
      });
    }
    return new Promise((resolve, reject) => {
      const out = http.request({
        host: this.#target.hostname,
        port: Number(this.#target.port),
        method: r.method,
        path: target,
        headers,
      }, (res) => {
        const answerHeaders = new Headers();
        for (const [k, v] of Object.entries(res.headers)) {
          if (v === undefined || HOP_BY_HOP.has(k)) continue;
          for (const one of Array.isArray(v) ? v : [v]) answerHeaders.append(k, one);
        }
        const body = r.method === "HEAD" || res.statusCode === 204 || res.statusCode === 304
          ? null
          : new ReadableStream<Uint8Array>({
            start(c) {
              // The reader may have cancelled (a "lose" fault): later events are dropped.
              const safely = (f: () => void) => {
                try {
                  f();
                } catch {
                  res.destroy();
                }
              };
              res.on("data", (chunk: Uint8Array) => safely(() => c.enqueue(new Uint8Array(chunk))));
              res.on("end", () => safely(() => c.close()));
              res.on("error", (e) => safely(() => c.error(e)));
            },
            cancel() {
              res.destroy();
            },
          });
        resolve(new Response(body, { status: res.statusCode ?? 502, headers: answerHeaders }));
      });
      out.on("error", reject);
      (async () => {
        if (r.body !== null) { for await (const chunk of r.body) out.write(chunk); }
        out.end();
      })().catch((e) => out.destroy(e));
    });
  }

  /** Stops listening: the store behind it is unreachable from now on. */
  async stop(): Promise<void> {
    for (const end of [...this.#held]) end();
    this.#unhold();
    await this.#server.shutdown().catch(() => {});
  }

  async [Symbol.asyncDispose](): Promise<void> {
    await this.stop();
  }
}

/** Headers the signature is made again without: the conditions, and the old signature's own. */
const RESIGNED = new Set([
  "if-none-match",
  "if-match",
  "authorization",
  "x-amz-date",
  "x-amz-content-sha256",
  "host",
  "content-length",
]);

/** The request's headers without its conditions, signed again for the same Host and payload. */
function withoutConditions(
  r: Request,
  keys: { readonly accessKeyId: string; readonly secretAccessKey: string },
  region: string,
): Record<string, string> {
  const kept: Record<string, string> = {};
  r.headers.forEach((v, k) => {
    if (!HOP_BY_HOP.has(k) && !RESIGNED.has(k)) kept[k] = v;
  });
  const signed = signS3Request({
    method: r.method,
    url: new URL(r.url),
    headers: kept,
    payloadHash: r.headers.get("x-amz-content-sha256") ?? EMPTY_SHA256,
    region,
  }, keys);
  const out: Record<string, string> = { host: new URL(r.url).host };
  signed.forEach((v, k) => out[k] = v);
  const length = r.headers.get("content-length");
  if (length !== null) out["content-length"] = length;
  return out;
}

function s3Error(status: number, code: string): Response {
  const xml = `<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>${code}</Code>` +
    `<Message>Injected by the test proxy</Message></Error>`;
  return new Response(xml, { status, headers: { "content-type": "application/xml" } });
}

/** The body's first `limit` bytes, then an error: the connection is dropped midway. */
function cutAfter(body: ReadableStream<Uint8Array>, limit: number): ReadableStream<Uint8Array> {
  const reader = body.getReader();
  let sent = 0;
  return new ReadableStream<Uint8Array>({
    async pull(c) {
      const r = await reader.read();
      if (r.done) return c.close();
      const room = limit - sent;
      if (r.value.length < room) {
        sent += r.value.length;
        return c.enqueue(r.value);
      }
      if (room > 0) c.enqueue(r.value.subarray(0, room));
      await reader.cancel();
      c.error(new Error("the test proxy cut the answer"));
    },
  });
}
