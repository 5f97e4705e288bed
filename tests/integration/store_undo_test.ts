/**
 * A mistaken delete undone from the store: the volume is restored under its own name on the same
 * node and continues its history there (the same record, no deletion mark, increments on the
 * snapshots just received). File store, real pool, the plugin as it ships.
 */

import assert from "node:assert/strict";
import { PluginProcess } from "../support/plugin_process.ts";
import { createVolumeRequest } from "../support/nomad.ts";
import { sh, TestPool } from "../support/zfs_pool.ts";
import { treeHash } from "../support/tree_hash.ts";

Deno.test("store: a deleted volume restored under its own name keeps its record and chain", async () => {
  await using pool = await TestPool.create();
  const store = await Deno.makeTempDir({ prefix: "zfs-csi-store-" });
  const record = async () =>
    JSON.parse(await Deno.readTextFile(`${store}/v1/volumes/undo/volume.json`));
  const manifests = async () => {
    const out = [];
    for await (const e of Deno.readDir(`${store}/v1/volumes/undo/snapshots`)) {
      out.push(JSON.parse(await Deno.readTextFile(`${store}/v1/volumes/undo/snapshots/${e.name}`)));
    }
    return out;
  };
  try {
    await using plugin = await PluginProcess.start({
      parentDataset: pool.parent,
      dir: pool.dir,
      nodeId: "node-a",
      extraArgs: ["--store", `file://${store}`, "--deleted-retention", "0"],
      scope: { extraDirs: [store] },
    });
    const c = plugin.client;
    await c.controller("CreateVolume", createVolumeRequest("undo"));
    const mountpoint = `${pool.mountRoot}/nomad/undo`;
    await Deno.writeTextFile(`${mountpoint}/data.txt`, "first\n".repeat(1000));
    const before = await treeHash(mountpoint);
    const first = await c.controller("CreateSnapshot", {
      source_volume_id: "undo@node-a",
      name: "first",
      parameters: {},
    });
    assert.equal(first.snapshot.ready_to_use, true);
    const uid = (await record()).uid;

    await c.controller("DeleteVolume", { volume_id: "undo@node-a" });
    assert.equal(typeof (await record()).deletedAt, "string", "deleted: marked in the store");
    assert.deepEqual(await pool.datasets(), [pool.pool, pool.parent]);

    await c.controller(
      "CreateVolume",
      createVolumeRequest("undo", {
        volume_content_source: { snapshot: { snapshot_id: first.snapshot.snapshot_id } },
      }),
    );
    const restored = await record();
    assert.equal(restored.uid, uid, "the same record");
    assert.equal(restored.deletedAt, undefined, "restored: the deletion mark is gone at once");
    await sh("zfs", "mount", `${pool.parent}/undo`);
    assert.equal(await treeHash(mountpoint), before);

    await Deno.writeTextFile(`${mountpoint}/more.txt`, "second\n");
    const second = await c.controller("CreateSnapshot", {
      source_volume_id: "undo@node-a",
      name: "second",
      parameters: {},
    });
    const all = await manifests();
    const firstGuid = all.find((m) => m.csiName === "first").guid;
    const next = all.find((m) => m.csiName === "second");
    assert.equal(next.volumeUid, uid);
    assert.equal(next.baseGuid, firstGuid, "incremental on the received snapshot");
    assert.match(second.snapshot.snapshot_id, /^store:undo:[0-9a-f]{16}$/);
  } finally {
    await Deno.remove(store, { recursive: true });
  }
});
