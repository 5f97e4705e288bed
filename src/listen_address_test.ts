import assert from "node:assert/strict";
import { ConfigError, parseConfig } from "./config.ts";
import { parseListenAddress } from "./listen_address.ts";

Deno.test("parseListenAddress takes host:port with IPv4, names and bracketed IPv6", () => {
  assert.deepEqual(parseListenAddress("127.0.0.1:9474"), {
    hostname: "127.0.0.1",
    port: 9474,
    hostPort: "127.0.0.1:9474",
  });
  assert.deepEqual(parseListenAddress("[::]:09474"), {
    hostname: "::",
    port: 9474,
    hostPort: "[::]:9474",
  });
  assert.equal(parseListenAddress("Node-A.example:80").hostPort, "node-a.example:80");
  for (const bad of ["9474", ":9474", "0.0.0.0", "0.0.0.0:0", "h:65536", "::1:9474", "a b:1"]) {
    assert.throws(() => parseListenAddress(bad), TypeError, bad);
  }
});

const REQUIRED = ["--parent-dataset", "tank/nomad", "--node-id", "n1"];

Deno.test("parseConfig: --metrics-listen is off by default and parsed when given", () => {
  const off = parseConfig(REQUIRED, {});
  assert.ok(off.kind === "run" && off.config.metricsListen === undefined);
  const on = parseConfig([...REQUIRED, "--metrics-listen", "0.0.0.0:9474"], {});
  assert.ok(on.kind === "run");
  assert.deepEqual(on.config.metricsListen, {
    hostname: "0.0.0.0",
    port: 9474,
    hostPort: "0.0.0.0:9474",
  });
  assert.throws(
    () => parseConfig([...REQUIRED, "--metrics-listen", "9474"], {}),
    (e: unknown) =>
      e instanceof ConfigError && /^--metrics-listen "9474" is not host:port/.test(e.message),
  );
});
