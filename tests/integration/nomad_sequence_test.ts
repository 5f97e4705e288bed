/**
 * Replays Nomad's call sequence against the plugin on a real ZFS pool, over a real unix socket:
 * fingerprint, stage, publish, write, unpublish, unstage, restart, stage and publish again
 * (the data is still there), then a restart while published and a clean release by the new
 * process of mounts the old one made.
 *
 * The pool is zfs-fuse (see tools/zfs-env.sh). What it cannot show, and where that is covered
 * instead: OpenZFS lists mounts with fsType "zfs" (unit tests in src/mount/mountinfo_test.ts),
 * /dev/zfs and mount propagation into a container (the Nomad end-to-end tests), and OpenZFS's
 * stderr wording (the patterns in src/zfs/zfs.ts match both; fixtures are from zfs-fuse).
 */

import assert from "node:assert/strict";
import { PLUGIN_NAME } from "../../src/version.ts";
import { claimPaths, mountCapability, mountsAt } from "../support/nomad.ts";
import { PluginProcess } from "../support/plugin_process.ts";
import { TestPool } from "../support/zfs_pool.ts";

const VOLUME = "db[0]";
const DATASET_SUFFIX = "db:5b0:5d";

Deno.test("Nomad lifecycle: data survives unstage, restart and restage", async (t) => {
  await using pool = await TestPool.create();
  let plugin = await PluginProcess.start({
    parentDataset: pool.parent,
    dir: pool.dir,
    nodeId: "node-a",
    topology: ["zone=eu1", "rack=r7"],
    // The register-only layout: no controller, datasets created at first stage.
    extraArgs: ["--mode", "node"],
  });
  const dataset = `${pool.parent}/${DATASET_SUFFIX}`;
  const cap = mountCapability();
  const context = { size: "64MiB" };
  const first = await claimPaths(plugin.baseDir, { volumeId: VOLUME, allocId: "alloc-1" });

  try {
    await t.step("fingerprint as Nomad does", async () => {
      const probe = await plugin.client.identity("Probe");
      assert.equal(probe.ready?.value, true);
      const info = await plugin.client.identity("GetPluginInfo");
      assert.equal(info.name, PLUGIN_NAME);
      assert.match(info.name, /^[a-z0-9-]+(\.[a-z0-9-]+)+$/);
      assert.notEqual(info.vendor_version, "");
      const caps = await plugin.client.identity("GetPluginCapabilities");
      const services = caps.capabilities.map((c: { service: { type: string } }) => c.service.type);
      assert.deepEqual(services, ["VOLUME_ACCESSIBILITY_CONSTRAINTS"]);
      const node = await plugin.client.node("NodeGetInfo");
      assert.equal(node.node_id, "node-a");
      assert.equal(Number(node.max_volumes_per_node), 0);
      assert.deepEqual(node.accessible_topology.segments, {
        zone: "eu1",
        rack: "r7",
        [`${PLUGIN_NAME}/node`]: "node-a",
      });
      const nodeCaps = await plugin.client.node("NodeGetCapabilities");
      assert.deepEqual(
        nodeCaps.capabilities.map((c: { rpc: { type: string } }) => c.rpc.type).sort(),
        ["EXPAND_VOLUME", "GET_VOLUME_STATS", "STAGE_UNSTAGE_VOLUME", "VOLUME_CONDITION"],
      );
    });

    await t.step("stage creates the dataset with its quota and marker, twice is OK", async () => {
      const req = {
        volume_id: VOLUME,
        staging_target_path: first.staging,
        volume_capability: cap,
        volume_context: context,
        secrets: { token: "s3cr3t-value" },
      };
      await plugin.client.node("NodeStageVolume", req);
      await plugin.client.node("NodeStageVolume", req);
      assert.equal(await pool.get(dataset, "refquota"), String(64 * 1024 * 1024));
      assert.equal(await pool.get(dataset, "org.zfs-csi:managed"), "yes");
      const mounts = await mountsAt(first.staging);
      assert.equal(mounts.length, 1, "exactly one mount at the staging path");
      assert.equal(mounts[0]!.source, dataset);
    });

    await t.step("publish bind-mounts the target it creates, twice is OK", async () => {
      const req = {
        volume_id: VOLUME,
        staging_target_path: first.staging,
        target_path: first.target,
        volume_capability: cap,
        readonly: false,
        volume_context: context,
      };
      await plugin.client.node("NodePublishVolume", req);
      await plugin.client.node("NodePublishVolume", req);
      const mounts = await mountsAt(first.target);
      assert.equal(mounts.length, 1);
      assert.equal(mounts[0]!.source, dataset);
      assert.ok(!mounts[0]!.options.includes("ro"));
    });

    await t.step("the task writes a file", async () => {
      await Deno.writeTextFile(`${first.target}/hello.txt`, "written by alloc-1\n");
      const viaStaging = await Deno.readTextFile(`${first.staging}/hello.txt`);
      assert.equal(viaStaging, "written by alloc-1\n");
    });

    await t.step("unpublish removes mount and target, twice is OK", async () => {
      const req = { volume_id: VOLUME, target_path: first.target };
      await plugin.client.node("NodeUnpublishVolume", req);
      await plugin.client.node("NodeUnpublishVolume", req);
      assert.deepEqual(await mountsAt(first.target), []);
      await assert.rejects(Deno.lstat(first.target), Deno.errors.NotFound);
    });

    await t.step("unstage unmounts the staging path, twice is OK; data stays", async () => {
      const req = { volume_id: VOLUME, staging_target_path: first.staging };
      await plugin.client.node("NodeUnstageVolume", req);
      await plugin.client.node("NodeUnstageVolume", req);
      assert.deepEqual(await mountsAt(first.staging), []);
      assert.ok((await pool.datasets()).includes(dataset));
    });

    await t.step("secrets never reach the log", () => {
      const all = plugin.logs().join("\n");
      assert.ok(!all.includes("s3cr3t-value"));
      const stage = plugin.records().find((r) => r.method === "NodeStageVolume");
      assert.ok(stage, "one log line per RPC");
      assert.equal(stage.volumeId, VOLUME);
      assert.equal(stage.code, "OK");
      assert.equal(typeof stage.durationMs, "number");
    });

    await t.step("restart, stage and publish again: the file is still there", async () => {
      const status = await plugin.stop("SIGTERM");
      assert.equal(status.code, 0);
      plugin = await PluginProcess.start({
        parentDataset: pool.parent,
        dir: pool.dir,
        extraArgs: ["--mode", "node"],
      });
      const again = await claimPaths(plugin.baseDir, { volumeId: VOLUME, allocId: "alloc-2" });
      await plugin.client.node("NodeStageVolume", {
        volume_id: VOLUME,
        staging_target_path: again.staging,
        volume_capability: cap,
        volume_context: context,
      });
      await plugin.client.node("NodePublishVolume", {
        volume_id: VOLUME,
        staging_target_path: again.staging,
        target_path: again.target,
        volume_capability: cap,
        readonly: false,
        volume_context: context,
      });
      assert.equal(await Deno.readTextFile(`${again.target}/hello.txt`), "written by alloc-1\n");
    });

    await t.step("a killed plugin leaves mounts; its successor releases them", async () => {
      const again = await claimPaths(plugin.baseDir, { volumeId: VOLUME, allocId: "alloc-2" });
      await plugin.stop("SIGKILL");
      assert.equal((await mountsAt(again.target)).length, 1, "mount outlives the plugin");
      assert.equal(await Deno.readTextFile(`${again.target}/hello.txt`), "written by alloc-1\n");
      plugin = await PluginProcess.start({
        parentDataset: pool.parent,
        dir: pool.dir,
        extraArgs: ["--mode", "node"],
      });
      await plugin.client.node("NodeUnpublishVolume", {
        volume_id: VOLUME,
        target_path: again.target,
      });
      await plugin.client.node("NodeUnstageVolume", {
        volume_id: VOLUME,
        staging_target_path: again.staging,
      });
      assert.deepEqual(await mountsAt(again.target), []);
      assert.deepEqual(await mountsAt(again.staging), []);
    });
  } finally {
    await plugin.stop("SIGKILL");
  }
});
