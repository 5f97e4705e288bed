/**
 * A small CSI client over a unix socket for the operator's subcommands, built from the same
 * proto loading as the server (src/grpc/proto.ts) and dialled as Nomad dials (insecure h2c,
 * authority "localhost"). Answers are the decoded messages, read through narrow accessors.
 */

import * as grpc from "@grpc/grpc-js";
import { loadCsiServices } from "../grpc/proto.ts";

/** The three CSI services. */
export type CsiService = "Identity" | "Node" | "Controller";

/** A call the plugin refused: its gRPC code name and details. */
export class CsiCallError extends Error {
  readonly code: number;
  readonly details: string;

  constructor(method: string, code: number, details: string) {
    super(`${method} failed: ${grpc.status[code] ?? `code ${code}`}: ${details}`);
    this.name = "CsiCallError";
    this.code = code;
    this.details = details;
  }
}

type Callback = (err: grpc.ServiceError | null, res: unknown) => void;
type Method = (req: object, meta: grpc.Metadata, opts: grpc.CallOptions, cb: Callback) => void;

/** Calls CSI methods by name over one socket. */
export class CsiSocketClient {
  readonly #clients: Record<CsiService, grpc.Client>;

  constructor(socketPath: string) {
    const services = loadCsiServices();
    const address = `unix://${socketPath}`;
    const creds = grpc.credentials.createInsecure();
    const options = { "grpc.default_authority": "localhost" };
    this.#clients = {
      Identity: new services.Identity(address, creds, options),
      Node: new services.Node(address, creds, options),
      Controller: new services.Controller(address, creds, options),
    };
  }

  /**
   * Calls `service.method` with `request`.
   * @throws {CsiCallError} when the plugin answers with an error (or cannot be reached)
   */
  call(
    service: CsiService,
    method: string,
    request: object,
    deadlineMs = 60_000,
  ): Promise<Record<string, unknown>> {
    const client = this.#clients[service];
    const fn = (client as unknown as Record<string, unknown>)[method];
    if (typeof fn !== "function") throw new TypeError(`No method ${service}.${method}`);
    return new Promise((resolve, reject) => {
      (fn as Method).call(
        client,
        request,
        new grpc.Metadata(),
        { deadline: Date.now() + deadlineMs },
        (err, res) => {
          if (err) reject(new CsiCallError(method, err.code, err.details));
          else resolve((res ?? {}) as Record<string, unknown>);
        },
      );
    });
  }

  /** Closes the channels (and so the connection). */
  close(): void {
    for (const c of Object.values(this.#clients)) c.close();
  }
}

/** A field of an answer that is an object, or an empty one. */
export function objectField(obj: unknown, name: string): Record<string, unknown> {
  const v = obj !== null && typeof obj === "object"
    ? (obj as Record<string, unknown>)[name]
    : undefined;
  return v !== null && typeof v === "object" ? (v as Record<string, unknown>) : {};
}

/** A field of an answer as text ("" when missing). */
export function textField(obj: unknown, name: string): string {
  const v = obj !== null && typeof obj === "object"
    ? (obj as Record<string, unknown>)[name]
    : undefined;
  return typeof v === "string" || typeof v === "number" || typeof v === "boolean" ? String(v) : "";
}

/** A field of an answer that is a list, or an empty one. */
export function listField(obj: unknown, name: string): unknown[] {
  const v = obj !== null && typeof obj === "object"
    ? (obj as Record<string, unknown>)[name]
    : undefined;
  return Array.isArray(v) ? v : [];
}
