/**
 * Start-up order on a real pool, through the plugin's own process: the first health check and
 * the first Probe come before housekeeping (here the purge of `--deleted-retention 0`), so the
 * Probe an orchestrator waits on at start is not answered behind the processes housekeeping
 * starts; and a plugin nobody probes still purges, a few seconds after its first health check.
 * (What the first ready Probe means is unchanged: tests/integration/unavailable_test.ts.)
 */

import assert from "node:assert/strict";
import { createVolumeRequest } from "../support/nomad.ts";
import { PluginProcess, READY_MS } from "../support/plugin_process.ts";
import { sh, TestPool } from "../support/zfs_pool.ts";

/** The trash datasets below the parent (`.deleted-*`). */
async function trash(pool: TestPool): Promise<string[]> {
  const out = await sh("zfs", "list", "-H", "-r", "-o", "name", pool.parent);
  return out.split("\n").filter((n) => n.includes("/.deleted-"));
}

/** Sets one volume aside (default retention), as a plugin that stopped before purging did. */
async function setAside(pool: TestPool, name: string): Promise<void> {
  await using plugin = await PluginProcess.start({ parentDataset: pool.parent, dir: pool.dir });
  await plugin.client.controller("CreateVolume", createVolumeRequest(name));
  await plugin.client.controller("DeleteVolume", { volume_id: `${name}@node-a` });
  assert.equal((await trash(pool)).length, 1, "the volume is set aside");
}

/** Starts the plugin with retention 0, without probing it, and waits for its first check. */
async function startUnprobed(pool: TestPool): Promise<PluginProcess> {
  const plugin = await PluginProcess.start({
    parentDataset: pool.parent,
    dir: pool.dir,
    logLevel: "info",
    waitReady: false,
    extraArgs: ["--deleted-retention", "0"],
  });
  const deadline = Date.now() + READY_MS;
  while (!plugin.records().some((r) => r.msg === "plugin healthy")) {
    if (Date.now() > deadline) throw new Error(`never healthy:\n${plugin.logs().join("\n")}`);
    await new Promise((r) => setTimeout(r, 20));
  }
  return plugin;
}

async function waitEmpty(pool: TestPool, ms: number): Promise<string[]> {
  const deadline = Date.now() + ms;
  let left = await trash(pool);
  while (left.length > 0 && Date.now() < deadline) {
    await new Promise((r) => setTimeout(r, 200));
    left = await trash(pool);
  }
  return left;
}

Deno.test("start-up: housekeeping waits for the first Probe, then runs", async () => {
  await using pool = await TestPool.create();
  await setAside(pool, "old");
  await using plugin = await startUnprobed(pool);
  // Healthy and serving, but not yet probed: the purge has not started (it would within a
  // second: bench/startup.ts shows the whole start taking a fraction of that).
  await new Promise((r) => setTimeout(r, 1_000));
  assert.equal((await trash(pool)).length, 1, "purged before the first Probe");
  await plugin.waitReady(READY_MS);
  assert.deepEqual(await waitEmpty(pool, 20_000), [], "not purged after the first Probe");
});

Deno.test("start-up: with no Probe at all, housekeeping still starts", async () => {
  await using pool = await TestPool.create();
  await setAside(pool, "old");
  await using plugin = await startUnprobed(pool);
  assert.deepEqual(await waitEmpty(pool, 20_000), [], "never purged without a Probe");
  assert.ok(plugin.records().some((r) => r.msg === "plugin healthy"));
});
