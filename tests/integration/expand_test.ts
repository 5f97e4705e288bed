/**
 * Growing volumes on a real pool: every expansion sets quota, refquota and refreservation to
 * what the recorded parameters and the capacity say, so one that failed half way (no room for
 * the reservation) is finished by a retry with room, and repeated expansions never move the
 * quota further. A fixed quota is never moved, and NodeExpandVolume grows a volume only
 * through a path that holds it.
 *
 * On zfs-fuse each property takes its own `zfs set` (learnt from the first try, logged once);
 * OpenZFS takes them in one, which the unit tests check (src/zfs/zfs_test.ts).
 */

import assert from "node:assert/strict";
import { Code } from "../../src/errors.ts";
import { type CsiClient, rejects } from "../support/csi_client.ts";
import { claimPaths, mountCapability } from "../support/nomad.ts";
import { PluginProcess } from "../support/plugin_process.ts";
import { destroyRetrying, sh, TestPool } from "../support/zfs_pool.ts";

const MiB = 1024 * 1024;

async function create(
  c: CsiClient,
  name: string,
  bytes: number,
  parameters: Record<string, string>,
): Promise<string> {
  const res = await c.controller("CreateVolume", {
    name,
    capacity_range: { required_bytes: String(bytes), limit_bytes: "0" },
    volume_capabilities: [mountCapability()],
    parameters,
    accessibility_requirements: { requisite: [], preferred: [] },
  });
  return res.volume.volume_id;
}

function expand(c: CsiClient, volumeId: string, bytes: number): Promise<unknown> {
  return c.controller("ControllerExpandVolume", {
    volume_id: volumeId,
    capacity_range: { required_bytes: String(bytes), limit_bytes: "0" },
  });
}

/**
 * The size properties of everything in the test's pool, to compare before and after a refused
 * call. (Not the host's mount table: other tests on the machine change that meanwhile.)
 */
function sizeState(pool: TestPool): Promise<string> {
  return sh(
    "zfs",
    "get",
    "-Hp",
    "-r",
    "-o",
    "name,property,value",
    "quota,refquota,refreservation",
    pool.pool,
  );
}

/** quota, refquota and refreservation of a dataset, in MiB. */
async function sizes(pool: TestPool, dataset: string): Promise<Record<string, number>> {
  const out: Record<string, number> = {};
  for (const p of ["quota", "refquota", "refreservation"]) {
    out[p] = Number(await pool.get(dataset, p)) / MiB;
  }
  return out;
}

Deno.test("expand: a reservation that found no room is finished by a retry, and quota never drifts", async () => {
  // OpenZFS keeps slop space of at least 128 MiB (half of a small pool) out of `available`: a
  // 256 MiB pool would never have room for the 192 MiB below.
  await using pool = await TestPool.create(1024);
  await using plugin = await PluginProcess.start({ parentDataset: pool.parent, dir: pool.dir });
  const c = plugin.client;
  const dataset = `${pool.parent}/grow`;
  const id = await create(c, "grow", 32 * MiB, { quota: "capacity", refreservation: "capacity" });
  assert.deepEqual(await sizes(pool, dataset), { quota: 32, refquota: 32, refreservation: 32 });

  // Leave room for 48 MiB more: the reservation cannot grow by 96.
  const available = Number(await pool.get(pool.parent, "available"));
  const filler = `${pool.pool}/filler`;
  await sh("zfs", "create", "-o", `refreservation=${available - 48 * MiB}`, filler);
  for (let attempt = 0; attempt < 2; attempt++) {
    await rejects(
      expand(c, id, 128 * MiB),
      Code.RESOURCE_EXHAUSTED,
      /^ZFS operation "zfs set" failed \(no space\): .*size is greater than available space/,
    );
    // What zfs could set is set, the reservation is not; a retry moves nothing further.
    assert.deepEqual(await sizes(pool, dataset), { quota: 128, refquota: 128, refreservation: 32 });
  }

  await destroyRetrying(filler);
  // OpenZFS frees a destroyed dataset's space asynchronously: wait until the room is back.
  for (let i = 0; i < 60; i++) {
    if (Number(await pool.get(pool.parent, "available")) >= 128 * MiB) break;
    await new Promise((r) => setTimeout(r, 500));
  }
  // The capacity is reached already: the retry sets the missing reservation and answers.
  assert.deepEqual(await expand(c, id, 128 * MiB), {
    capacity_bytes: String(128 * MiB),
    node_expansion_required: false,
  });
  assert.deepEqual(await sizes(pool, dataset), { quota: 128, refquota: 128, refreservation: 128 });

  // Repeats and further growth: every value exact, the quota never ahead of the capacity.
  const steps = [[128, 128], [160, 160], [160, 160], [192, 192], [100, 192]] as const;
  for (const [asked, size] of steps) {
    assert.deepEqual(await expand(c, id, asked * MiB), {
      capacity_bytes: String(size! * MiB),
      node_expansion_required: false,
    });
    assert.deepEqual(
      await sizes(pool, dataset),
      { quota: size, refquota: size, refreservation: size },
      `asked for ${asked} MiB`,
    );
  }
  // zfs-fuse takes one property per `zfs set`: found out once, then remembered.
  const learnt = plugin.records().filter((r) => String(r.msg).startsWith("zfs sets one property"));
  assert.ok(learnt.length <= 1, `learnt ${learnt.length} times`);
});

Deno.test("expand: a fixed quota stays as created, and growth past it changes nothing", async () => {
  await using pool = await TestPool.create(256);
  await using plugin = await PluginProcess.start({ parentDataset: pool.parent, dir: pool.dir });
  const c = plugin.client;
  const dataset = `${pool.parent}/fixed`;
  const id = await create(c, "fixed", 32 * MiB, { quota: "64MiB" });
  await expand(c, id, 48 * MiB);
  assert.deepEqual(await sizes(pool, dataset), { quota: 64, refquota: 48, refreservation: 0 });
  const before = await sizeState(pool);
  await rejects(
    expand(c, id, 96 * MiB),
    Code.OUT_OF_RANGE,
    /^Volume "fixed@node-a" cannot grow to 100663296 bytes: it was created with quota=67108864 bytes/,
  );
  assert.equal(await sizeState(pool), before);
});

Deno.test("expand: NodeExpandVolume grows a volume through the path that holds it, and no other", async () => {
  await using pool = await TestPool.create(256);
  await using plugin = await PluginProcess.start({ parentDataset: pool.parent, dir: pool.dir });
  const c = plugin.client;
  const dataset = `${pool.parent}/node`;
  const id = await create(c, "node", 32 * MiB, { quota: "capacity" });
  const ctx = (await c.controller("ControllerGetVolume", { volume_id: id })).volume.volume_context;
  const p = await claimPaths(plugin.baseDir, { volumeId: "node", allocId: "a1" });
  const base = { volume_id: id, volume_capability: mountCapability(), volume_context: ctx };
  await c.node("NodeStageVolume", { ...base, staging_target_path: p.staging });
  await c.node("NodePublishVolume", {
    ...base,
    staging_target_path: p.staging,
    target_path: p.target,
  });
  try {
    const req = (path: string, bytes: number) => ({
      volume_id: id,
      volume_path: path,
      capacity_range: { required_bytes: String(bytes), limit_bytes: "0" },
    });
    // Another alloc's path, which holds nothing.
    const other = await claimPaths(plugin.baseDir, { volumeId: "node", allocId: "a2" });
    await Deno.mkdir(other.target);
    const before = await sizeState(pool);
    await rejects(
      c.node("NodeExpandVolume", req(other.target, 64 * MiB)),
      Code.NOT_FOUND,
      /^volume_path ".*\/a2\/node\/[^"]+" does not hold volume "node@node-a"$/,
    );
    assert.equal(await sizeState(pool), before);

    const res = await c.node("NodeExpandVolume", req(p.target, 64 * MiB));
    assert.equal(String(res.capacity_bytes), String(64 * MiB));
    assert.deepEqual(await sizes(pool, dataset), { quota: 64, refquota: 64, refreservation: 0 });
  } finally {
    await c.node("NodeUnpublishVolume", { volume_id: id, target_path: p.target });
    await c.node("NodeUnstageVolume", { volume_id: id, staging_target_path: p.staging });
  }
});
