/**
 * Issue 21, item 10a: the store's conditional writes, checked. `zfs-csi store check` (the
 * binary's subcommand, with its production permissions) against versitygw, which enforces
 * If-None-Match and If-Match; through a proxy that strips them (tests/support/fault_proxy.ts), as
 * an S3 server that ignores them would; and on a bucket that does not exist. Then the plugin as
 * it ships on such a server: its start-up probe finds it out in the background (Probe is ready
 * meanwhile), volumes that follow their job are refused with the server's answer, and ordinary
 * backups go on.
 */

import assert from "node:assert/strict";
import { Code } from "../../src/errors.ts";
import { rejects } from "../support/csi_client.ts";
import { FaultProxy } from "../support/fault_proxy.ts";
import { claimPaths, createVolumeRequest, mountCapability } from "../support/nomad.ts";
import { PluginProcess, runZfsCsi } from "../support/plugin_process.ts";
import { S3Server, signedFetch } from "../support/s3_server.ts";
import { TestPool } from "../support/zfs_pool.ts";

/** The plugin's store flags and grant for `bucket` on `endpoint` (the server, or a proxy). */
function storeFlags(server: S3Server, endpoint: URL, bucket = server.bucket) {
  return {
    extraArgs: [
      "--store",
      `s3://${bucket}/check`,
      "--store-endpoint",
      endpoint.origin,
      "--store-path-style",
      "--store-region",
      server.region,
    ],
    scope: { netHosts: [endpoint.host] },
    env: { AWS_ACCESS_KEY_ID: server.accessKeyId, AWS_SECRET_ACCESS_KEY: server.secretAccessKey },
  };
}

/** `zfs-csi store check` as the binary runs it, against `endpoint`. */
async function storeCheck(server: S3Server, endpoint: URL, bucket?: string) {
  const dir = await Deno.makeTempDir({ prefix: "zfs-csi-store-check-" });
  try {
    const flags = storeFlags(server, endpoint, bucket);
    return await runZfsCsi(dir, [
      "store",
      "check",
      "--parent-dataset",
      "tank/nomad",
      "--node-id",
      "node-a",
      ...flags.extraArgs,
    ], { scope: flags.scope, env: flags.env });
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
}

/** The checks' lines: "<status> <name>". */
function checked(stdout: string): string[] {
  return stdout.split("\n").filter((l) => l.startsWith("  ")).map((l) =>
    l.trim().replace(/ +/, " ").split(":")[0]!
  );
}

Deno.test("zfs-csi store check passes versitygw and fails a server that ignores conditional writes", async () => {
  await using server = await S3Server.start();
  const good = await storeCheck(server, server.endpoint);
  assert.equal(good.code, 0, good.stdout + good.stderr);
  assert.deepEqual(checked(good.stdout), [
    "ok reachable",
    "ok bucket exists",
    "ok listing",
    "ok put, get and delete",
    "ok conditional writes",
  ]);
  assert.match(good.stdout, /Every check passed/);

  await using proxy = new FaultProxy(server.endpoint);
  proxy.set({ kind: "strip-conditions", keys: server, region: server.region });
  const bad = await storeCheck(server, proxy.endpoint);
  assert.equal(bad.code, 1, bad.stdout + bad.stderr);
  assert.deepEqual(checked(bad.stdout), [
    "ok reachable",
    "ok bucket exists",
    "ok listing",
    "ok put, get and delete",
    "FAILED conditional writes",
  ]);
  assert.match(
    bad.stdout,
    /FAILED +conditional writes: a write with If-None-Match: \* to an object that exists was accepted .*412 Precondition Failed/,
  );
  assert.match(bad.stdout, /volumes that follow their job are refused on this store/);

  const missing = await storeCheck(server, server.endpoint, "no-such-bucket-here");
  assert.equal(missing.code, 1);
  assert.deepEqual(checked(missing.stdout).slice(0, 2), ["ok reachable", "FAILED bucket exists"]);
  assert.match(missing.stdout, /the bucket "no-such-bucket-here" does not exist/);

  // Nothing of the probes is left in the bucket.
  const listed = await signedFetch(
    server,
    "GET",
    new URL(`/${server.bucket}?list-type=2&prefix=check%2F`, server.endpoint),
  );
  const xml = await listed.text();
  assert.equal(listed.status, 200, xml);
  assert.doesNotMatch(xml, /<Key>/, "no probe object left");
});

Deno.test("the plugin refuses follow volumes on a server that ignores conditional writes, and backs up all the same", async () => {
  await using server = await S3Server.start();
  await using proxy = new FaultProxy(server.endpoint);
  proxy.set({ kind: "strip-conditions", keys: server, region: server.region });
  const pool = await TestPool.create();
  let plugin: PluginProcess | undefined;
  try {
    // Ready as soon as its own checks pass: the store's probe runs in the background.
    plugin = await PluginProcess.start({
      parentDataset: pool.parent,
      dir: pool.dir,
      nodeId: "node-a",
      ...storeFlags(server, proxy.endpoint),
    });
    const client = plugin.client;
    const answer = /a write with If-None-Match: \* to an object that exists was accepted/;

    const create = await rejects(
      client.controller(
        "CreateVolume",
        createVolumeRequest("moving", { parameters: { follow: "true", backup_interval: "1h" } }),
      ),
      Code.FAILED_PRECONDITION,
      answer,
    );
    assert.match(create, /^Volumes that follow their job need a store that enforces/);

    // A registered follow volume gets its owner object at its first stage: refused too.
    const paths = await claimPaths(plugin.baseDir, { volumeId: "registered", allocId: "a1" });
    await rejects(
      client.node("NodeStageVolume", {
        volume_id: "registered",
        volume_capability: mountCapability(),
        volume_context: { follow: "true" },
        staging_target_path: paths.staging,
      }),
      Code.FAILED_PRECONDITION,
      answer,
    );
    assert.ok(
      plugin.records().some((r) =>
        r.msg?.toString().startsWith("the store does not enforce conditional writes")
      ),
      "the start-up probe's verdict is logged",
    );

    // Ordinary backups do not depend on it.
    const data = await client.controller("CreateVolume", createVolumeRequest("data"));
    const snapshot = (await client.controller("CreateSnapshot", {
      source_volume_id: data.volume.volume_id,
      name: "data-snap",
      parameters: {},
    }, 120_000)).snapshot;
    assert.match(snapshot.snapshot_id, /^store:data:[0-9a-f]{16}$/);
    assert.equal(snapshot.ready_to_use, true);
  } finally {
    await plugin?.stop("SIGKILL");
    await proxy.stop();
    await pool.destroy();
  }
});
