/**
 * Volume names and ids on a real pool, through the plugin's own process and socket, as Nomad
 * sends them: a repeated CreateVolume is the same volume only while it can be a retry (never
 * once a node staged it), a name never reaches another name's shortened dataset, and controller
 * calls that change a volume refuse ids without a node unless the plugin id is node-local.
 *
 * Not shown here (the unit tests in src/volume/tenancy_test.ts show them with a fake clock): a
 * repeat more than 10 minutes after the create.
 */

import assert from "node:assert/strict";
import { Code } from "../../src/errors.ts";
import { type CsiClient, rejects } from "../support/csi_client.ts";
import { claimPaths, createVolumeRequest, mountCapability } from "../support/nomad.ts";
import { PluginProcess } from "../support/plugin_process.ts";
import { poolState, sh, TestPool } from "../support/zfs_pool.ts";

const MiB = 1024 * 1024;

/** The volume these tests create: 32 MiB, compressed. */
function tenancyRequest(name: string, over: Record<string, unknown> = {}) {
  return createVolumeRequest(name, {
    capacity_range: { required_bytes: String(32 * MiB), limit_bytes: "0" },
    parameters: { compression: "on" },
    ...over,
  });
}

/** Stages a volume as Nomad does for an allocation in `namespace`, then unstages it. */
async function stageOnce(
  c: CsiClient,
  baseDir: string,
  volumeId: string,
  namespace: string,
): Promise<void> {
  const p = await claimPaths(baseDir, { volumeId, allocId: `a-${namespace}`, namespace });
  await c.node("NodeStageVolume", {
    volume_id: volumeId,
    staging_target_path: p.staging,
    volume_capability: mountCapability(),
    volume_context: {},
  });
  await c.node("NodeUnstageVolume", { volume_id: volumeId, staging_target_path: p.staging });
}

Deno.test("tenancy: a retry is the same volume; a staged volume's name, or a shortened form, is not", async (t) => {
  await using pool = await TestPool.create();
  await using plugin = await PluginProcess.start({ parentDataset: pool.parent, dir: pool.dir });
  const c = plugin.client;
  const ds = `${pool.parent}/postgres`;
  let first: { volume: { volume_id: string } };

  await t.step(
    "CreateVolume records the name; a repeat right after is the same volume",
    async () => {
      first = await c.controller("CreateVolume", tenancyRequest("postgres"));
      assert.equal(first.volume.volume_id, "postgres@node-a");
      assert.equal(await pool.get(ds, "org.zfs-csi:name"), "postgres");
      assert.equal(await pool.get(ds, "org.zfs-csi:staged-at"), "-");
      // An operator runs "nomad volume create" again after a failure: the same answer.
      assert.deepEqual(await c.controller("CreateVolume", tenancyRequest("postgres")), first);
    },
  );

  await t.step(
    "the first NodeStageVolume marks the volume; later stages keep the time",
    async () => {
      const before = Math.floor(Date.now() / 1000);
      await stageOnce(c, plugin.baseDir, "postgres@node-a", "staging");
      const after = Math.floor(Date.now() / 1000);
      const staged = Number(await pool.get(ds, "org.zfs-csi:staged-at"));
      assert.ok(staged >= before && staged <= after, `staged-at ${staged}`);
      assert.equal(
        (await sh("zfs", "get", "-H", "-o", "source", "org.zfs-csi:staged-at", ds)).trim(),
        "local",
      );
      await stageOnce(c, plugin.baseDir, "postgres@node-a", "staging2");
      assert.equal(Number(await pool.get(ds, "org.zfs-csi:staged-at")), staged);
    },
  );

  await t.step(
    "the same name from another namespace is ALREADY_EXISTS, and nothing changes",
    async () => {
      const state = await poolState(pool);
      const message = await rejects(
        c.controller("CreateVolume", tenancyRequest("postgres")),
        Code.ALREADY_EXISTS,
        /^Volume "postgres@node-a" already exists: created \S+Z and staged since \S+Z, so it holds data; .*"postgres-prod" rather than "postgres"/,
      );
      assert.match(message, /Nomad sends the plugin only a volume's name, not its id or namespace/);
      assert.equal(await poolState(pool), state);
      // What the message says to do works: a name of its own is a volume of its own.
      const prod = await c.controller("CreateVolume", tenancyRequest("postgres-prod"));
      assert.equal(prod.volume.volume_id, "postgres-prod@node-a");
      assert.equal(
        await pool.get(`${pool.parent}/postgres-prod`, "org.zfs-csi:name"),
        "postgres-prod",
      );
    },
  );

  await t.step("a long name gets a shortened dataset that records it in full", async () => {
    const long = "été-" + "x".repeat(120);
    const res = await c.controller("CreateVolume", tenancyRequest(long));
    const id: string = res.volume.volume_id;
    const short = id.slice(0, -"@node-a".length);
    assert.match(short, /^été-x+\.\.[0-9a-f]{16}$/);
    const dataset = `${pool.parent}/${short.replaceAll("é", ":c3:a9")}`;
    assert.deepEqual(res.volume.volume_context, { dataset });
    assert.equal(await pool.get(dataset, "org.zfs-csi:name"), long);
    assert.deepEqual(await c.controller("CreateVolume", tenancyRequest(long)), res);
    // Listed under the id CreateVolume answered, and usable by it.
    const list = await c.controller("ListVolumes", {});
    assert.ok(
      list.entries.some((e: { volume: { volume_id: string } }) => e.volume.volume_id === id),
    );
    const snap = await c.controller("CreateSnapshot", { source_volume_id: id, name: "s1" });
    assert.equal(snap.snapshot.snapshot_id, `${short}@s1@node-a`);
    await c.controller("DeleteSnapshot", { snapshot_id: snap.snapshot.snapshot_id });

    // Sent as a name of its own, the shortened form is refused before zfs is asked anything.
    const state = await poolState(pool);
    await rejects(
      c.controller("CreateVolume", tenancyRequest(short)),
      Code.INVALID_ARGUMENT,
      /must not contain "\.\."/,
    );
    await rejects(
      c.controller("CreateSnapshot", { source_volume_id: "postgres-prod@node-a", name: short }),
      Code.INVALID_ARGUMENT,
      /must not contain "\.\."/,
    );
    assert.equal(await poolState(pool), state);
  });

  await t.step("a dataset made before names were recorded is never handed out again", async () => {
    const legacy = `${pool.parent}/legacy`;
    await sh(
      "zfs",
      "create",
      "-o",
      "org.zfs-csi:managed=yes",
      "-o",
      'org.zfs-csi:parameters={"compression":"on"}',
      "-o",
      "compression=on",
      "-o",
      `refquota=${32 * MiB}`,
      legacy,
    );
    await rejects(
      c.controller("CreateVolume", tenancyRequest("legacy")),
      Code.ALREADY_EXISTS,
      /by an earlier zfs-csi, which did not record the name asked for/,
    );
  });
});

Deno.test("tenancy: ids without a node are refused for calls that change a volume, unless the plugin id is node-local", async (t) => {
  await using pool = await TestPool.create();
  let plugin = await PluginProcess.start({ parentDataset: pool.parent, dir: pool.dir });
  try {
    // Made by CreateVolume, then registered by an operator without its node (external_id = "cache").
    await plugin.client.controller("CreateVolume", tenancyRequest("cache"));
    await plugin.client.controller("CreateSnapshot", {
      source_volume_id: "cache@node-a",
      name: "s1",
    });

    await t.step(
      'a shared plugin id: delete, grow, snapshot and clone by "cache" are refused',
      async () => {
        const c = plugin.client;
        const state = await poolState(pool);
        const refused =
          /^Volume id "cache" names no node, .* e\.g\. "cache@node-a" .*--node-local-plugin-id$/;
        await rejects(
          c.controller("DeleteVolume", { volume_id: "cache" }),
          Code.FAILED_PRECONDITION,
          refused,
        );
        await rejects(
          c.controller("DeleteVolume", { volume_id: `${pool.parent}/cache` }),
          Code.FAILED_PRECONDITION,
          /names no node/,
        );
        await rejects(
          c.controller("ControllerExpandVolume", {
            volume_id: "cache",
            capacity_range: { required_bytes: String(64 * MiB) },
          }),
          Code.FAILED_PRECONDITION,
          refused,
        );
        await rejects(
          c.controller("CreateSnapshot", { source_volume_id: "cache", name: "s2" }),
          Code.FAILED_PRECONDITION,
          refused,
        );
        await rejects(
          c.controller("DeleteSnapshot", { snapshot_id: "cache@s1" }),
          Code.FAILED_PRECONDITION,
          /^Snapshot id "cache@s1" names no node/,
        );
        await rejects(
          c.controller(
            "CreateVolume",
            tenancyRequest("copy", { volume_content_source: { volume: { volume_id: "cache" } } }),
          ),
          Code.FAILED_PRECONDITION,
          refused,
        );
        assert.equal(await poolState(pool), state);
        // Reading calls and node calls take it.
        const got = await c.controller("ControllerGetVolume", { volume_id: "cache" });
        assert.equal(got.volume.volume_id, "cache@node-a");
        await stageOnce(c, plugin.baseDir, "cache", "default");
      },
    );

    await t.step("with --node-local-plugin-id the node-less id works for them", async () => {
      await plugin.stop();
      plugin = await PluginProcess.start({
        parentDataset: pool.parent,
        dir: pool.dir,
        extraArgs: ["--node-local-plugin-id"],
      });
      const c = plugin.client;
      await c.controller("DeleteSnapshot", { snapshot_id: "cache@s1" });
      await c.controller("DeleteVolume", { volume_id: "cache" });
      const left = await pool.datasets();
      assert.ok(!left.includes(`${pool.parent}/cache`), left.join(" "));
    });
  } finally {
    await plugin[Symbol.asyncDispose]();
  }
});
