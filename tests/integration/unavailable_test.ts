/**
 * When ZFS cannot see the pool, "does not exist" is no answer: the plugin answers UNAVAILABLE
 * and changes nothing, instead of telling Nomad that a volume whose data is still there is
 * gone. Shown on a real pool for both ways it happens: the pool not imported (`zpool export`,
 * then `zpool import` brings everything back), and the zfs-fuse daemon out of reach (the
 * plugin runs in a private mount namespace with an empty /run/zfs, so the shared daemon other
 * tests use is never disturbed).
 *
 * zfs-fuse cannot show: OpenZFS without its kernel module (its stderr is a unit-test fixture,
 * tests/fixtures/openzfs/stderr_modules_not_loaded.txt); the daemon test is skipped there.
 */

import assert from "node:assert/strict";
import { Code } from "../../src/errors.ts";
import { type CsiClient, rejects } from "../support/csi_client.ts";
import { mountCapability } from "../support/nomad.ts";
import { PluginProcess } from "../support/plugin_process.ts";
import { sh, TestPool, tryRun } from "../support/zfs_pool.ts";

const MiB = 1024 * 1024;
const DATA = "still here\n";

/** A volume with a file and a snapshot; returns their ids and the dataset. */
async function volumeWithData(
  pool: TestPool,
  c: CsiClient,
): Promise<{ volumeId: string; snapshotId: string; dataset: string }> {
  const created = await c.controller("CreateVolume", {
    name: "keep",
    capacity_range: { required_bytes: String(32 * MiB), limit_bytes: "0" },
    volume_capabilities: [mountCapability()],
    parameters: { quota: "capacity" },
    accessibility_requirements: { requisite: [], preferred: [] },
  });
  const volumeId: string = created.volume.volume_id;
  const dataset = `${pool.parent}/keep`;
  await Deno.writeTextFile(`${await pool.get(dataset, "mountpoint")}/data.txt`, DATA);
  const snap = await c.controller("CreateSnapshot", { source_volume_id: volumeId, name: "s1" });
  return { volumeId, snapshotId: snap.snapshot.snapshot_id, dataset };
}

/** Every call that would read "does not exist" as gone, each answered UNAVAILABLE. */
async function assertAllUnavailable(
  c: CsiClient,
  ids: { volumeId: string; snapshotId: string },
  message: RegExp,
): Promise<void> {
  const calls: ReadonlyArray<readonly [string, object]> = [
    ["DeleteVolume", { volume_id: ids.volumeId }],
    ["DeleteSnapshot", { snapshot_id: ids.snapshotId }],
    ["ListVolumes", {}],
    ["ListSnapshots", {}],
    ["ControllerGetVolume", { volume_id: ids.volumeId }],
    [
      "ControllerExpandVolume",
      {
        volume_id: ids.volumeId,
        capacity_range: { required_bytes: String(64 * MiB), limit_bytes: "0" },
      },
    ],
  ];
  for (const [method, req] of calls) {
    await rejects(c.controller(method, req), Code.UNAVAILABLE, message).catch((err) => {
      throw new Error(`${method}: ${(err as Error).message}`);
    });
  }
}

/** The volume and its data as they were made. */
async function assertIntact(pool: TestPool, dataset: string): Promise<void> {
  assert.equal(await pool.get(dataset, "org.zfs-csi:managed"), "yes");
  assert.equal(await pool.get(dataset, "refquota"), String(32 * MiB));
  assert.equal(await pool.get(`${dataset}@s1`, "type"), "snapshot");
  assert.equal(
    await Deno.readTextFile(`${await pool.get(dataset, "mountpoint")}/data.txt`),
    DATA,
  );
}

Deno.test("unavailable: a pool that is not imported is no missing volume", async () => {
  await using pool = await TestPool.create(256);
  await using plugin = await PluginProcess.start({ parentDataset: pool.parent, dir: pool.dir });
  const c = plugin.client;
  const ids = await volumeWithData(pool, c);

  await sh("zpool", "export", pool.pool);
  try {
    await assertAllUnavailable(
      c,
      ids,
      /^ZFS operation "zfs get" failed \(unavailable\): the parent dataset "[^"]+\/nomad" is not visible( either)?, .*nothing was changed/,
    );
  } finally {
    await sh("zpool", "import", "-d", pool.dir, pool.pool);
  }
  await assertIntact(pool, ids.dataset);
  // Back: the same calls work as ever.
  const listed = await c.controller("ListVolumes", {});
  assert.deepEqual(
    listed.entries.map((e: { volume: { volume_id: string } }) => e.volume.volume_id),
    [
      ids.volumeId,
    ],
  );
  await c.controller("DeleteSnapshot", { snapshot_id: ids.snapshotId });
  await c.controller("DeleteVolume", { volume_id: ids.volumeId });
  assert.equal((await c.controller("ListVolumes", {})).entries.length, 0);
});

Deno.test({
  name: "unavailable: a zfs-fuse daemon out of reach is no missing volume",
  // Only zfs-fuse has a daemon socket to hide.
  ignore: !(await Deno.lstat("/run/zfs/zfs_socket").then(() => true, () => false)),
  fn: async () => {
    await using pool = await TestPool.create(256);
    let ids;
    {
      await using plugin = await PluginProcess.start({ parentDataset: pool.parent, dir: pool.dir });
      ids = await volumeWithData(pool, plugin.client);
    }
    // The plugin runs where /run/zfs is an empty tmpfs: its zfs cannot reach the daemon.
    const wrapper = `${pool.dir}/deno-without-zfs-daemon`;
    await Deno.writeTextFile(
      wrapper,
      `#!/bin/sh\nexec unshare -m sh -c 'mount -t tmpfs none /run/zfs && exec "$0" "$@"' ` +
        `"${Deno.execPath()}" "$@"\n`,
    );
    await Deno.chmod(wrapper, 0o755);
    const before = Deno.env.get("ZFS_CSI_PLUGIN_DENO");
    Deno.env.set("ZFS_CSI_PLUGIN_DENO", wrapper);
    let plugin: PluginProcess;
    try {
      plugin = await PluginProcess.start({
        parentDataset: pool.parent,
        dir: pool.dir,
        waitReady: false,
      });
    } finally {
      if (before === undefined) Deno.env.delete("ZFS_CSI_PLUGIN_DENO");
      else Deno.env.set("ZFS_CSI_PLUGIN_DENO", before);
    }
    await using _ = plugin;
    await waitServing(plugin);
    await assertAllUnavailable(
      plugin.client,
      ids,
      /^ZFS operation "zfs get" failed \(unavailable\): ZFS cannot be reached \(connect: .*zfs-fuse daemon is running.*\); this command changed nothing/,
    );
    // The host still sees ZFS, and everything is as it was.
    assert.equal(
      (await tryRun("zpool", "list", "-H", "-o", "health", pool.pool)).stdout,
      "ONLINE\n",
    );
    await assertIntact(pool, ids.dataset);
  },
});

/** Waits until the plugin answers Probe at all (it is not ready: ZFS is out of its reach). */
async function waitServing(plugin: PluginProcess): Promise<void> {
  const deadline = Date.now() + 20_000;
  let res;
  while (res === undefined) {
    try {
      await Deno.lstat(plugin.socketPath);
      res = await plugin.client.identity("Probe", {}, 2_000);
    } catch (err) {
      if (Date.now() > deadline) throw new Error(`${err}\n${plugin.logs().join("\n")}`);
      await new Promise((r) => setTimeout(r, 100));
    }
  }
  assert.notEqual(res.ready?.value, true);
}
