/**
 * An HTTP proxy on 127.0.0.1 in front of a real server, whose faults tests switch at runtime:
 * pass requests through, answer the next N with an S3 error, delay them, or cut answers off
 * midway. Requests are forwarded with their own Host header (node:http; fetch would replace it),
 * so SigV4 signatures made for the proxy's address still verify at the server.
 */

import http from "node:http";

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
  | { readonly kind: "cut"; readonly afterBytes: number; readonly count: number };

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
  #held: Promise<void> = Promise.resolve();
  readonly #server: Deno.HttpServer<Deno.NetAddr>;
  readonly #target: URL;

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
    this.#held = new Promise((resolve) => this.#unhold = resolve);
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
    if (fault.kind === "delay") await new Promise((res) => setTimeout(res, fault.ms));
    if (fault.kind === "hold") await this.#held;
    const answer = await this.#forward(r, target);
    if (fault.kind === "lose") {
      // The request took effect; the client never learns it.
      await answer.body?.cancel();
      return s3Error(503, "ServiceUnavailable");
    }
    if (fault.kind !== "cut" || answer.body === null) return answer;
    return new Response(cutAfter(answer.body, fault.afterBytes), answer);
  }

  /** Sends the request on to the server with the same method, Host and headers. */
  #forward(r: Request, target: string): Promise<Response> {
    const headers: Record<string, string> = {};
    r.headers.forEach((v, k) => {
      if (!HOP_BY_HOP.has(k)) headers[k] = v;
    });
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
    this.#unhold();
    await this.#server.shutdown().catch(() => {});
  }

  async [Symbol.asyncDispose](): Promise<void> {
    await this.stop();
  }
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
