/**
 * Regression test for connection churn: Deno 2.9.x aborted (SIGABRT in nghttp2) when a grpc-js
 * client closed a connection that had carried many calls (denoland/deno#36788). Nomad opens a
 * fresh connection for every controller call and keeps fingerprinting on long-lived ones, so
 * the server must survive thousands of calls over connections that clients then close.
 */

import assert from "node:assert/strict";
import { fileURLToPath } from "node:url";
import { CsiClient } from "../support/csi_client.ts";
import { PluginProcess } from "../support/plugin_process.ts";
import { TestPool } from "../support/zfs_pool.ts";

const CONNECTIONS = Number(Deno.env.get("CHURN_CONNECTIONS") ?? 24);
const CALLS_PER_CONNECTION = Number(Deno.env.get("CHURN_CALLS") ?? 250);

Deno.test("connection churn: the server stays up across closed busy connections", async () => {
  await using pool = await TestPool.create();
  await using plugin = await PluginProcess.start({
    parentDataset: pool.parent,
    dir: pool.dir,
    logLevel: "info",
  });
  let calls = 0;
  for (let c = 0; c < CONNECTIONS; c++) {
    const client = new CsiClient(plugin.socketPath);
    const batch: Promise<unknown>[] = [];
    for (let i = 0; i < CALLS_PER_CONNECTION; i++) {
      batch.push(
        i % 3 === 0
          ? client.identity("Probe")
          : i % 3 === 1
          ? client.node("NodeGetInfo")
          : client.node("NodeGetCapabilities"),
      );
      // Keep some calls in flight while others finish, as several Nomad loops do.
      if (batch.length === 16) calls += (await Promise.all(batch.splice(0))).length;
    }
    calls += (await Promise.all(batch)).length;
    client.close();
    // Half the time close right away, half after a pause, to hit both orders of teardown.
    if (c % 2 === 0) await new Promise((r) => setTimeout(r, 20));
  }
  assert.equal(calls, CONNECTIONS * CALLS_PER_CONNECTION);
  // Clients that go away with calls still in flight (a Nomad agent restarting).
  for (let c = 0; c < CONNECTIONS / 2; c++) {
    const client = new CsiClient(plugin.socketPath);
    const done = await Promise.all(
      Array.from({ length: 64 }, () => client.identity("Probe")),
    );
    assert.equal(done.length, 64);
    const pending = Array.from({ length: 64 }, () => client.node("NodeGetInfo").catch(() => null));
    client.close();
    await Promise.all(pending);
  }
  // The process must still be there and answering on a brand-new connection.
  const fresh = new CsiClient(plugin.socketPath);
  try {
    const probe = await fresh.identity("Probe");
    assert.equal(probe.ready?.value, true);
  } finally {
    fresh.close();
  }
  const exited = await Promise.race([
    plugin.status.then(() => true),
    new Promise<boolean>((r) => setTimeout(() => r(false), 200)),
  ]);
  assert.equal(exited, false, "plugin process must not have exited");
});

/** The Go toolchain, if this machine has one (a fresh Debian with only Node/npm does not). */
function goPath(): string | undefined {
  for (const dir of (Deno.env.get("PATH") ?? "").split(":").concat("/usr/local/go/bin")) {
    try {
      if (Deno.statSync(`${dir}/go`).isFile) return `${dir}/go`;
    } catch {
      // Not there.
    }
  }
  return undefined;
}

const GO = goPath();
if (!GO) {
  Deno.stderr.writeSync(
    new TextEncoder().encode(
      "connection churn with grpc-go: skipped, no Go toolchain on PATH (tests/go_client needs Go 1.24+)\n",
    ),
  );
}

Deno.test({
  name: "connection churn: Nomad's own client library (grpc-go) opens, uses and closes connections",
  ignore: GO === undefined,
  async fn() {
    const root = fileURLToPath(new URL("../../", import.meta.url));
    const bin = `${root}.cache/go_client/go_client`;
    const build = await new Deno.Command(GO!, {
      args: ["build", "-o", bin, "."],
      cwd: `${root}tests/go_client`,
      stdout: "piped",
      stderr: "piped",
    }).output();
    assert.ok(build.success, new TextDecoder().decode(build.stderr));
    await using pool = await TestPool.create();
    await using plugin = await PluginProcess.start({
      parentDataset: pool.parent,
      dir: pool.dir,
      logLevel: "info",
    });
    const run = await new Deno.Command(bin, {
      args: [
        "-socket",
        plugin.socketPath,
        "-connections",
        "20",
        "-calls",
        "1000",
        "-parallel",
        "16",
      ],
      stdout: "piped",
      stderr: "piped",
    }).output();
    const dec = new TextDecoder();
    assert.ok(run.success, dec.decode(run.stderr));
    assert.match(dec.decode(run.stdout), /^calls=20000 connections=20 /);
    const probe = await plugin.client.identity("Probe");
    assert.equal(probe.ready?.value, true);
  },
});
