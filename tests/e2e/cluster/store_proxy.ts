/**
 * The store's address for both plugins of tests/e2e/nomad_cluster.sh: the fault proxy of
 * tests/support/fault_proxy.ts in front of versitygw, which the script switches with curl on a
 * second port, so that a drain can meet a store that fails for a while:
 *
 *   PUT /fault/pass   forward every request (the start)
 *   PUT /fault/503    answer every request 503 ServiceUnavailable, forwarding none
 *   PUT /fault/hold   answer none until switched again, then forward them (a hung server)
 *   GET /seen         {"forwarded": n, "error": n, "hold": n}: requests by outcome so far
 *
 * Prints one JSON line {"endpoint": "http://127.0.0.1:<port>", "control": "http://..."} once
 * both listen. Loopback only:
 *
 *   ./tools/deno run --allow-net=127.0.0.1 tests/e2e/cluster/store_proxy.ts http://127.0.0.1:<s3 port>
 */

import { type Fault, FaultProxy } from "../../support/fault_proxy.ts";

const FAULTS: Readonly<Record<string, Fault>> = {
  pass: { kind: "pass" },
  // Counted faults: this one outlasts any window the script holds it for.
  "503": {
    kind: "error",
    status: 503,
    code: "ServiceUnavailable",
    count: Number.POSITIVE_INFINITY,
  },
  hold: { kind: "hold" },
};

/** One line on stdout or stderr (lint allows no console). */
function line(to: typeof Deno.stdout | typeof Deno.stderr, text: string): void {
  to.writeSync(new TextEncoder().encode(`${text}\n`));
}

const target = Deno.args[0] ?? "";
if (Deno.args.length !== 1 || !/^http:\/\/127\.0\.0\.1:\d+$/.test(target)) {
  line(Deno.stderr, "usage: store_proxy.ts http://127.0.0.1:<port of the S3 server>");
  Deno.exit(2);
}

const proxy = new FaultProxy(new URL(target));

function counts(): Record<string, number> {
  const out: Record<string, number> = { forwarded: 0, error: 0, hold: 0 };
  for (const s of proxy.seen) out[s.outcome] = (out[s.outcome] ?? 0) + 1;
  return out;
}

const control = Deno.serve({ hostname: "127.0.0.1", port: 0, onListen() {} }, (r) => {
  const path = new URL(r.url).pathname;
  if (r.method === "GET" && path === "/seen") return Response.json(counts());
  const name = path.startsWith("/fault/") ? path.slice("/fault/".length) : "";
  const fault = FAULTS[name];
  if (r.method !== "PUT" || fault === undefined) {
    return new Response(`PUT /fault/{${Object.keys(FAULTS).join(",")}} or GET /seen\n`, {
      status: 404,
    });
  }
  proxy.set(fault);
  return Response.json(counts());
});

line(
  Deno.stdout,
  JSON.stringify({
    endpoint: proxy.endpoint.href.replace(/\/$/, ""),
    control: `http://127.0.0.1:${control.addr.port}`,
  }),
);

// Until the script kills it; a clean stop lets held requests go first.
for (const signal of ["SIGINT", "SIGTERM"] as const) {
  Deno.addSignalListener(signal, async () => {
    await proxy.stop();
    await control.shutdown();
    Deno.exit(0);
  });
}
