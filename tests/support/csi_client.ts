/**
 * A promise-based CSI client over a unix socket, built from the same proto/csi.proto as the
 * plugin, dialled the way Nomad dials (insecure h2c, authority "localhost").
 */

import * as grpc from "@grpc/grpc-js";
import assert from "node:assert/strict";
import { Code } from "../../src/errors.ts";
import { loadCsiServices } from "../../src/grpc/proto.ts";

/** A failed call: the gRPC code and details. */
export interface CallError extends Error {
  code: number;
  details: string;
}

// deno-lint-ignore no-explicit-any
type Any = any;

/** Calls by method name: `await client.node("NodeStageVolume", {...})`. */
export class CsiClient {
  readonly #clients: Record<"Identity" | "Node" | "Controller", grpc.Client>;

  constructor(socketPath: string) {
    const s = loadCsiServices();
    const address = `unix://${socketPath}`;
    const creds = grpc.credentials.createInsecure();
    const opts = { "grpc.default_authority": "localhost" };
    this.#clients = {
      Identity: new s.Identity(address, creds, opts),
      Node: new s.Node(address, creds, opts),
      Controller: new s.Controller(address, creds, opts),
    };
  }

  #call(
    service: keyof CsiClient["clients"],
    method: string,
    req: object,
    deadlineMs = 30_000,
  ): Promise<Any> {
    const client = this.#clients[service] as unknown as Record<string, Any>;
    return new Promise((resolve, reject) => {
      client[method]!.call(
        client,
        req,
        { deadline: Date.now() + deadlineMs },
        (err: CallError | null, res: unknown) => (err ? reject(err) : resolve(res)),
      );
    });
  }

  /** For the type of #call's service parameter. */
  get clients(): Record<"Identity" | "Node" | "Controller", grpc.Client> {
    return this.#clients;
  }

  identity(method: string, req: object = {}, deadlineMs?: number): Promise<Any> {
    return this.#call("Identity", method, req, deadlineMs);
  }

  node(method: string, req: object = {}, deadlineMs?: number): Promise<Any> {
    return this.#call("Node", method, req, deadlineMs);
  }

  controller(method: string, req: object = {}, deadlineMs?: number): Promise<Any> {
    return this.#call("Controller", method, req, deadlineMs);
  }

  /** Closes every channel (and so the connection). */
  close(): void {
    for (const c of Object.values(this.#clients)) c.close();
  }
}

/** The gRPC code of a rejected call, for assertions. */
export async function codeOf(p: Promise<unknown>): Promise<number> {
  try {
    await p;
  } catch (err) {
    return (err as CallError).code;
  }
  return 0;
}

/**
 * Asserts that a call fails with `code` and, when given, details matching `message`.
 * @returns the details, for further checks
 */
export async function rejects(
  p: Promise<unknown>,
  code: number,
  message?: RegExp,
): Promise<string> {
  try {
    await p;
  } catch (err) {
    const e = err as CallError;
    assert.equal(e.code, code, `expected code ${code}, got ${e.code}: ${e.details}`);
    if (message) assert.match(e.details, message);
    return e.details;
  }
  assert.fail(`expected code ${code}, but the call succeeded`);
}

/** gRPC ABORTED and UNAVAILABLE: what a plugin answers while a call is still in progress. */
const BUSY_CODES: readonly number[] = [Code.ABORTED, Code.UNAVAILABLE];

/**
 * Calls `fn` until it does not fail with ABORTED or UNAVAILABLE (a call still running, a
 * restarted plugin settling), as Nomad's retries would, for at most `timeoutMs`.
 */
export async function retryWhileBusy<T>(
  fn: () => Promise<T>,
  timeoutMs: number,
  pollMs: number,
): Promise<T> {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    try {
      return await fn();
    } catch (err) {
      const code = (err as CallError).code;
      if (!BUSY_CODES.includes(code) || Date.now() > deadline) throw err;
      await new Promise((r) => setTimeout(r, pollMs));
    }
  }
}
