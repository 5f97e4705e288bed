/**
 * Issue 21, defect 9: a store that accepts connections and never answers held a NodeStage for
 * about 4 minutes (4 tries × the 60 s request limit) before UNAVAILABLE, and Nomad waits with no
 * deadline. With `--store-wait`, every store wait of one call shares that budget: the plugin as
 * it ships, on a real pool, against versitygw behind a proxy (tests/support/fault_proxy.ts)
 * that takes requests and never answers, answers UNAVAILABLE naming the store and the time it
 * waited. The calls are given a deadline beyond the old 4 minutes, as Nomad gives none: what is
 * checked is the wait the answer reports (the budget, by construction), not the wall clock.
 */

import assert from "node:assert/strict";
import { Code } from "../../src/errors.ts";
import { rejects } from "../support/csi_client.ts";
import { FaultProxy } from "../support/fault_proxy.ts";
import { writeRandom } from "../support/follow_flows.ts";
import { claimPaths, claimVolume, createVolumeRequest, mountCapability } from "../support/nomad.ts";
import { PluginProcess } from "../support/plugin_process.ts";
import { print } from "../support/store_trials.ts";
import { S3Server } from "../support/s3_server.ts";
import { TestPool } from "../support/zfs_pool.ts";

/** The budget the plugin runs with: short, for a test. */
const STORE_WAIT_S = 2;
/** Longer than the 4 minutes a call took before: Nomad gives node calls no deadline. */
const NO_DEADLINE_MS = 300_000;
const MiB = 1024 * 1024;

Deno.test("a store that never answers: NodeStage of a follow volume and CreateVolume from a stored snapshot answer UNAVAILABLE after --store-wait", async () => {
  await using server = await S3Server.start();
  await using proxy = new FaultProxy(server.endpoint);
  const pool = await TestPool.create();
  let plugin: PluginProcess | undefined;
  try {
    plugin = await PluginProcess.start({
      parentDataset: pool.parent,
      dir: pool.dir,
      nodeId: "node-a",
      extraArgs: [
        "--store",
        `s3://${server.bucket}/wait`,
        "--store-endpoint",
        proxy.endpoint.origin,
        "--store-path-style",
        "--store-region",
        server.region,
        "--store-wait",
        `${STORE_WAIT_S}s`,
      ],
      scope: { netHosts: [proxy.endpoint.host] },
      env: { AWS_ACCESS_KEY_ID: server.accessKeyId, AWS_SECRET_ACCESS_KEY: server.secretAccessKey },
    });
    const client = plugin.client;
    const store = `s3://${server.bucket}/wait (${proxy.endpoint.origin})`;

    // While the store answers: a snapshot in the store, and a volume that follows its job.
    const data = await client.controller("CreateVolume", createVolumeRequest("data"));
    const claim = await claimVolume(plugin, data.volume, "alloc-data");
    await writeRandom(`${claim.target}/table.bin`, MiB);
    const snapshot = (await client.controller("CreateSnapshot", {
      source_volume_id: data.volume.volume_id,
      name: "data-snap",
      parameters: {},
    }, NO_DEADLINE_MS)).snapshot;
    assert.equal(snapshot.ready_to_use, true);
    await claim.release();
    const moving = await client.controller(
      "CreateVolume",
      createVolumeRequest("moving", { parameters: { follow: "true", backup_interval: "1h" } }),
    );

    // From now on the store takes every request and never answers.
    proxy.set({ kind: "hang" });
    const waited = new RegExp(`waited ${STORE_WAIT_S}\\.0 s`);

    const restore = await rejects(
      client.controller(
        "CreateVolume",
        createVolumeRequest("restored", {
          volume_content_source: { snapshot: { snapshot_id: snapshot.snapshot_id } },
        }),
        NO_DEADLINE_MS,
      ),
      Code.UNAVAILABLE,
      waited,
    );
    assert.ok(restore.includes(store), `names the store: ${restore}`);

    const paths = await claimPaths(plugin.baseDir, { volumeId: "moving", allocId: "alloc-1" });
    const stage = await rejects(
      client.node("NodeStageVolume", {
        volume_id: moving.volume.volume_id,
        volume_capability: mountCapability(),
        volume_context: moving.volume.volume_context,
        staging_target_path: paths.staging,
      }, NO_DEADLINE_MS),
      Code.UNAVAILABLE,
      waited,
    );
    assert.ok(stage.includes(store), `names the store: ${stage}`);
    print(`store wait: CreateVolume answered UNAVAILABLE: ${restore}`);
    print(`store wait: NodeStageVolume answered UNAVAILABLE: ${stage}`);
    assert.ok(proxy.seen.some((s) => s.outcome === "hang"), "the requests reached the store");
    // The budget is the whole wait of a call, far below the old 4 tries × 60 s.
    assert.ok(STORE_WAIT_S < 4 * 60);
  } finally {
    await plugin?.stop("SIGKILL");
    await proxy.stop();
    await pool.destroy();
  }
});
