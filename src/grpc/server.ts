/**
 * The gRPC server on a unix socket: h2c, as Nomad dials it. A stale socket left by a previous
 * process is removed; a live one (another plugin still serving: it answers) is an error.
 */

import * as grpc from "@grpc/grpc-js";
import { dirname } from "node:path";
import type { Logger } from "../log.ts";
import { type AsyncHandler, type CallObserver, unary } from "./handler.ts";
import { loadCsiServices } from "./proto.ts";

/** Handlers by method name, per service. Services left out answer UNIMPLEMENTED. */
export interface ServiceHandlers {
  Identity: Readonly<Record<string, AsyncHandler>>;
  Node?: Readonly<Record<string, AsyncHandler>>;
  Controller?: Readonly<Record<string, AsyncHandler>>;
}

/** A running server. */
export interface RunningServer {
  readonly socketPath: string;
  /** Stops accepting calls, waits up to `graceMs` for calls in flight, removes the socket. */
  stop(graceMs?: number): Promise<void>;
}

async function removeStaleSocket(path: string): Promise<void> {
  let info: Deno.FileInfo;
  try {
    info = await Deno.lstat(path);
  } catch (err) {
    if (err instanceof Deno.errors.NotFound) return;
    throw err;
  }
  if (!info.isSocket) {
    throw new Error(`Cannot listen on "${path}": it exists and is not a socket`);
  }
  let conn: Deno.UnixConn;
  try {
    conn = await Deno.connect({ transport: "unix", path });
  } catch (err) {
    if (!(err instanceof Deno.errors.ConnectionRefused || err instanceof Deno.errors.NotFound)) {
      throw err;
    }
    await Deno.remove(path);
    return;
  }
  try {
    if (await answers(conn)) {
      throw new Error(`Cannot listen on "${path}": another process is serving on it`);
    }
  } finally {
    conn.close();
  }
  await Deno.remove(path);
}

/** How long a server on an existing socket has to send its first bytes. */
const ANSWER_WAIT_MS = 3_000;

/**
 * Whether a server accepted the connection: a gRPC (HTTP/2) server sends its SETTINGS frame at
 * once. A connect can succeed with nobody serving: a killed plugin's listening socket lives on
 * in its subprocesses (Deno's node:net socket is inherited across exec), such as a `zfs receive`
 * reading a stored file on its own (src/replicate/restore.ts), and queues connections that no
 * one will ever accept.
 */
async function answers(conn: Deno.UnixConn): Promise<boolean> {
  let timer: ReturnType<typeof setTimeout> | undefined;
  const silent = new Promise<null>((resolve) =>
    timer = setTimeout(() => resolve(null), ANSWER_WAIT_MS)
  );
  try {
    const n = await Promise.race([conn.read(new Uint8Array(16)).catch(() => null), silent]);
    return n !== null && n > 0;
  } finally {
    clearTimeout(timer);
  }
}

function implementation(
  service: grpc.ServiceDefinition,
  handlers: Readonly<Record<string, AsyncHandler>>,
  log: Logger,
  observe: CallObserver | undefined,
): grpc.UntypedServiceImplementation {
  const impl: grpc.UntypedServiceImplementation = {};
  for (const method of Object.keys(service)) {
    const fn = handlers[method];
    if (fn) impl[method] = unary(method, fn, log, observe);
  }
  return impl;
}

/**
 * Serves the given handlers on `socketPath`; `observeCall` hears of every answered call.
 * @throws {Error} when the socket cannot be created
 */
export async function startServer(
  socketPath: string,
  handlers: ServiceHandlers,
  log: Logger,
  observeCall?: CallObserver,
): Promise<RunningServer> {
  const services = loadCsiServices();
  const server = new grpc.Server();
  server.addService(
    services.Identity.service,
    implementation(services.Identity.service, handlers.Identity, log, observeCall),
  );
  if (handlers.Node) {
    server.addService(
      services.Node.service,
      implementation(services.Node.service, handlers.Node, log, observeCall),
    );
  }
  if (handlers.Controller) {
    server.addService(
      services.Controller.service,
      implementation(services.Controller.service, handlers.Controller, log, observeCall),
    );
  }
  await Deno.mkdir(dirname(socketPath), { recursive: true });
  await removeStaleSocket(socketPath);
  await new Promise<void>((resolve, reject) => {
    server.bindAsync(`unix://${socketPath}`, grpc.ServerCredentials.createInsecure(), (err) => {
      if (err) reject(err);
      else resolve();
    });
  });
  await Deno.chmod(socketPath, 0o660);
  return {
    socketPath,
    async stop(graceMs = 5_000) {
      await new Promise<void>((resolve) => {
        const timer = setTimeout(() => {
          server.forceShutdown();
          resolve();
        }, graceMs);
        server.tryShutdown(() => {
          clearTimeout(timer);
          resolve();
        });
      });
      await Deno.remove(socketPath).catch(() => {});
    },
  };
}
