/**
 * The gRPC server on a unix socket: h2c, as Nomad dials it. A stale socket left by a previous
 * process is removed; a live one (another plugin still serving) is an error.
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
  try {
    const conn = await Deno.connect({ transport: "unix", path });
    conn.close();
    throw new Error(`Cannot listen on "${path}": another process is serving on it`);
  } catch (err) {
    if (!(err instanceof Deno.errors.ConnectionRefused || err instanceof Deno.errors.NotFound)) {
      throw err;
    }
  }
  await Deno.remove(path);
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
