/**
 * DeleteVolume and the purge on a real pool, through the plugin's own process: nothing the
 * plugin did not make is destroyed (an operator's or sanoid's snapshot, a child dataset, a clone
 * of one of its hidden snapshots, a `.deleted-*` dataset made by hand or by an older version),
 * what is set aside carries the plugin's marks, and the undo of docs/deleting.md works by the recorded name,
 * also for names too long to keep in the hidden one.
 *
 * zfs-fuse cannot show: holds (`zfs hold` needs pyzfs; see src/csi/delete_safety_test.ts), the
 * `clones` property (OpenZFS), with which a clone outside the parent dataset is refused up front
 * (here it is found only when zfs refuses the destroy, and the volume is set aside instead), and
 * several properties in one `zfs set`. Clock jumps are unit-tested (src/csi/trash_test.ts): this
 * machine's clock is shared.
 */

import assert from "node:assert/strict";
import { Code } from "../../src/errors.ts";
import { type CsiClient, rejects } from "../support/csi_client.ts";
import { createVolumeRequest } from "../support/nomad.ts";
import { PluginProcess } from "../support/plugin_process.ts";
import { destroyRetrying, poolState, sh, TestPool, tryRun } from "../support/zfs_pool.ts";

const SANOID = "autosnap_2024-01-01_00:00:00_hourly";
const AT = "org.zfs-csi:deleted-at";
const NAME = "org.zfs-csi:deleted-name";
const MANAGED = "org.zfs-csi:managed";

/** A property's value and source, as `zfs get` reports them. */
async function valueAndSource(name: string, prop: string): Promise<[string, string]> {
  const out = await sh("zfs", "get", "-Hp", "-o", "value,source", prop, name);
  const [value, source] = out.trimEnd().split("\t");
  return [value ?? "", source ?? ""];
}

/** Every dataset and snapshot below the parent. */
async function everything(pool: TestPool): Promise<string[]> {
  const out = await sh("zfs", "get", "-H", "-r", "-o", "name", "type", pool.parent);
  return out.split("\n").filter((l) => l !== "");
}

async function exists(name: string): Promise<boolean> {
  return (await tryRun("zfs", "get", "-H", "-o", "value", "type", name)).code === 0;
}

async function volumeIds(c: CsiClient): Promise<string[]> {
  const res = await c.controller("ListVolumes", {});
  return res.entries.map((e: { volume: { volume_id: string } }) => e.volume.volume_id);
}

async function start(pool: TestPool, retention: string): Promise<PluginProcess> {
  return await PluginProcess.start({
    parentDataset: pool.parent,
    dir: pool.dir,
    nodeId: "node-a",
    extraArgs: ["--deleted-retention", retention],
  });
}

Deno.test("delete safety: nothing the plugin did not make is destroyed, what it sets aside is marked", async (t) => {
  await using pool = await TestPool.create(1024);
  const p = pool.parent;
  let plugin = await start(pool, "7d");
  const c = () => plugin.client;
  try {
    // Volumes with something in the way, made once and refused under both retentions.
    for (const name of ["snapd", "nested", "src"]) {
      await c().controller("CreateVolume", createVolumeRequest(name));
    }
    await sh("zfs", "snapshot", `${p}/snapd@${SANOID}`);
    await sh("zfs", "create", `${p}/nested/wal`);
    // CreateVolume from a volume leaves src a hidden .clone-* snapshot; an operator clones it.
    await c().controller(
      "CreateVolume",
      createVolumeRequest("copy", {
        volume_content_source: { volume: { volume_id: "src@node-a" } },
      }),
    );
    const cloneSnap = (await everything(pool)).find((n) => n.startsWith(`${p}/src@.clone-`));
    assert.ok(cloneSnap, "src has a hidden clone snapshot");
    await sh("zfs", "clone", cloneSnap, `${p}/mine`);

    const refusals: [string, RegExp][] = [
      ["snapd@node-a", new RegExp(`snapshot "${p}/snapd@${SANOID}", not made by zfs-csi`)],
      ["nested@node-a", new RegExp(`child dataset "${p}/nested/wal"`)],
      ["src@node-a", new RegExp(`dataset "${p}/mine", not a zfs-csi volume, is a clone of`)],
    ];
    for (const retention of ["7d", "0"]) {
      await t.step(`retention ${retention}: DeleteVolume refuses and changes nothing`, async () => {
        if (retention === "0") {
          await plugin.stop();
          plugin = await start(pool, "0");
        }
        const before = await poolState(pool);
        for (const [id, message] of refusals) {
          await rejects(
            c().controller("DeleteVolume", { volume_id: id }),
            Code.FAILED_PRECONDITION,
            message,
          );
        }
        assert.equal(await poolState(pool), before);
        assert.ok(await exists(`${p}/snapd@${SANOID}`));
      });
    }

    await t.step(
      "a clone outside the parent is never destroyed (zfs-fuse: set aside)",
      async () => {
        // The operator's clone moves out of the parent; the plugin's own clone goes.
        await sh("zfs", "create", `${pool.pool}/other`);
        await sh("zfs", "clone", cloneSnap, `${pool.pool}/other/x`);
        await destroyRetrying(`${p}/mine`);
        await c().controller("DeleteVolume", { volume_id: "copy@node-a" });
        // OpenZFS names the clone in `clones` and refuses; zfs-fuse finds it when zfs refuses to
        // destroy the snapshot, and sets the volume aside.
        const res = await c().controller("DeleteVolume", { volume_id: "src@node-a" })
          .then(() => "ok", (e: { code: number; details: string }) => `${e.code} ${e.details}`);
        assert.ok(res === "ok" || res.startsWith(`${Code.FAILED_PRECONDITION} `), res);
        assert.equal(await pool.get(`${pool.pool}/other/x`, "type"), "filesystem");
        const origin = await pool.get(`${pool.pool}/other/x`, "origin");
        assert.ok(await exists(origin), `its origin ${origin} is kept`);
        if (res === "ok") assert.match(origin, new RegExp(`^${p}/\\.deleted-\\d+-src@\\.clone-`));
      },
    );

    await t.step(
      "what is set aside is marked, and the undo by the recorded name works for long names",
      async () => {
        await plugin.stop();
        plugin = await start(pool, "7d");
        // A name whose dataset nearly fills ZFS's 255 bytes: the hidden name must be cut.
        const brackets = Math.floor((255 - p.length - 2) / 3);
        const name = "v" + "[".repeat(Math.min(brackets, 120));
        const created = await c().controller("CreateVolume", createVolumeRequest(name));
        const id: string = created.volume.volume_id;
        const dataset: string = created.volume.volume_context.dataset;
        assert.ok(dataset.length > 255 - 20, `${dataset.length} bytes`);
        await c().controller("DeleteVolume", { volume_id: id });
        const hidden = (await pool.datasets()).find((n) =>
          n.startsWith(`${p}/.deleted-`) && n.includes("v:5b")
        );
        assert.ok(hidden, "set aside");
        assert.ok(!hidden.endsWith(dataset.slice(p.length + 1)), "the hidden name is cut");
        assert.deepEqual(await valueAndSource(hidden, NAME), [dataset, "local"]);
        assert.equal((await valueAndSource(hidden, AT))[1], "local");
        assert.match((await valueAndSource(hidden, AT))[0], /^\d{10}$/);
        assert.deepEqual(await valueAndSource(hidden, MANAGED), ["yes", "local"]);
        assert.equal(await pool.get(hidden, "canmount"), "noauto");
        assert.ok(!(await volumeIds(c())).includes(id));
        // The undo of docs/deleting.md, by hand, step by step.
        const original = (await sh("zfs", "get", "-H", "-o", "value", NAME, hidden)).trim();
        await sh("zfs", "rename", hidden, original);
        await sh("zfs", "inherit", AT, original);
        await sh("zfs", "inherit", NAME, original);
        await sh("zfs", "set", "canmount=on", original);
        assert.ok((await volumeIds(c())).includes(id));

        // A snapshot: marked on itself (zfs-fuse keeps user properties on snapshots), and undone.
        await c().controller("CreateVolume", createVolumeRequest("snapvol"));
        await c().controller("CreateSnapshot", {
          source_volume_id: "snapvol@node-a",
          name: "nightly",
        });
        const snapshots = async () =>
          (await c().controller("ListSnapshots", { source_volume_id: "snapvol@node-a" })).entries
            .length;
        assert.equal(await snapshots(), 1);
        await c().controller("DeleteSnapshot", { snapshot_id: "snapvol@nightly@node-a" });
        assert.equal(await snapshots(), 0);
        const hiddenSnap = (await everything(pool)).find((n) =>
          n.startsWith(`${p}/snapvol@.deleted-`)
        );
        assert.ok(hiddenSnap);
        assert.deepEqual(await valueAndSource(hiddenSnap, MANAGED), ["yes", "local"]);
        assert.deepEqual(await valueAndSource(hiddenSnap, NAME), [
          `${p}/snapvol@nightly`,
          "local",
        ]);
        await sh(
          "zfs",
          "rename",
          hiddenSnap,
          (await sh("zfs", "get", "-H", "-o", "value", NAME, hiddenSnap)).trim(),
        );
        assert.equal(await snapshots(), 1);
      },
    );

    await t.step(
      "the purge destroys only marked trash, and keeps trash someone put something in",
      async () => {
        for (const name of ["gone1", "kept1"]) {
          await c().controller("CreateVolume", createVolumeRequest(name));
          await c().controller("DeleteVolume", { volume_id: `${name}@node-a` });
        }
        const trash = async (name: string) =>
          (await pool.datasets()).find((n) => new RegExp(`/\\.deleted-\\d+-${name}$`).test(n));
        const gone1 = await trash("gone1");
        const kept1 = await trash("kept1");
        assert.ok(gone1 && kept1);
        // A recursive snapshot tool reaches the trash too.
        await sh("zfs", "snapshot", `${kept1}@${SANOID}`);
        // Made by hand, and as an older zfs-csi left them: hidden names without the marks.
        await sh("zfs", "create", `${p}/.deleted-1-x`);
        await sh("zfs", "create", "-o", `${MANAGED}=yes`, `${p}/.deleted-100-legacy`);
        await c().controller("CreateVolume", createVolumeRequest("keepsnap"));
        await sh("zfs", "snapshot", `${p}/keepsnap@.deleted-1-y`);

        await plugin.stop();
        plugin = await start(pool, "0");
        const deadline = Date.now() + 20_000;
        while (Date.now() < deadline && await exists(gone1)) {
          await new Promise((r) => setTimeout(r, 200));
        }
        assert.ok(!(await exists(gone1)), "marked trash is purged");
        for (
          const name of [
            kept1,
            `${kept1}@${SANOID}`,
            `${p}/.deleted-1-x`,
            `${p}/.deleted-100-legacy`,
            `${p}/keepsnap@.deleted-1-y`,
          ]
        ) {
          assert.ok(await exists(name), `${name} is kept`);
        }
        const warned = plugin.records().filter((r) => r.level === "warn").map((r) => r.name);
        for (const name of [kept1, `${p}/.deleted-1-x`, `${p}/.deleted-100-legacy`]) {
          assert.ok(warned.includes(name), `a warning names ${name}: ${JSON.stringify(warned)}`);
        }
      },
    );
  } finally {
    await plugin.stop("SIGKILL");
  }
});
