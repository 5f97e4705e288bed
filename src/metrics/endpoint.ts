/**
 * The HTTP endpoint Prometheus scrapes: GET /metrics on the --metrics-listen address. Nothing
 * else is served; it reads nothing from the request but its method and path.
 */

import type { Logger } from "../log.ts";
import { CONTENT_TYPE } from "./exposition.ts";
import type { ListenAddress } from "../listen_address.ts";

/** A listening endpoint. */
export interface MetricsEndpoint {
  /** The bound address (its port is the real one when 0 was asked). */
  readonly addr: Deno.NetAddr;
  /** Stops listening; scrapes in flight are answered first. */
  stop(): Promise<void>;
}

/** Answers one request: the scrape, or 404/405. Exported for tests. */
export async function answer(req: Request, scrape: () => Promise<string>): Promise<Response> {
  const { pathname } = new URL(req.url);
  if (pathname !== "/metrics") return new Response("Not found: see /metrics\n", { status: 404 });
  if (req.method !== "GET" && req.method !== "HEAD") {
    return new Response("Method not allowed\n", { status: 405, headers: { allow: "GET, HEAD" } });
  }
  const body = await scrape();
  return new Response(req.method === "HEAD" ? null : body, {
    headers: { "content-type": CONTENT_TYPE, "cache-control": "no-store" },
  });
}

/**
 * Listens on `listen` and answers scrapes with `scrape()`.
 * @throws {Deno.errors.NotCapable} when the build may not listen there
 * @throws {Deno.errors.AddrInUse} when the port is taken
 */
export function startMetricsEndpoint(
  listen: ListenAddress,
  scrape: () => Promise<string>,
  log: Logger,
): MetricsEndpoint {
  const server = Deno.serve({
    hostname: listen.hostname,
    port: listen.port,
    onListen() {},
    onError(err) {
      log.warn("metrics scrape failed", { error: err });
      return new Response("Scrape failed; see the plugin's log\n", { status: 500 });
    },
  }, (req) => answer(req, scrape));
  log.info("metrics endpoint listening", {
    address: `${listen.hostPort.replace(/:\d+$/, "")}:${server.addr.port}`,
    path: "/metrics",
  });
  return {
    addr: server.addr,
    stop: () => server.shutdown(),
  };
}
