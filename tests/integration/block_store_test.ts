/**
 * Zvols through the store (docs/block-volumes.md, "Zvols in the store"): the plugin in its own
 * process with a block build's permission flags and a directory store (file://), on a real pool.
 *
 * zfs-fuse (here and in CI) has no zvols: there a zvol restore from the store is refused saying
 * why, before anything is received, and nothing appears in the pool. On OpenZFS
 * (tools/openzfs-vm/): a raw zvol holding a dd pattern and an ext4 zvol holding files (made by
 * the plugin at its first stage) are snapshotted to the store and restored, and the restored
 * zvols hold the same bytes and files (the ext4 one not formatted again: the same UUID); a
 * zvol's stored snapshot asked for as a dataset or as another content, and a dataset's asked for
 * as a zvol, are refused with INVALID_ARGUMENT before anything is received.
 */

import assert from "node:assert/strict";
import { Code } from "../../src/errors.ts";
import { rejects, retryWhileBusy } from "../support/csi_client.ts";
import { mountCapability } from "../support/nomad.ts";
import { PluginProcess } from "../support/plugin_process.ts";
import { Prng } from "../support/prng.ts";
import { openZfs } from "../support/stream_bytes.ts";
import { sh, TestPool, tryRun } from "../support/zfs_pool.ts";
import {
  blockCapability,
  type Capability,
  claimZvol,
  ddRead,
  fsCapability,
  probe,
  zvolDevice,
} from "../support/zvols.ts";

const MiB = 1024 * 1024;
const onOpenZfs = await openZfs();
/** mkfs, sends and receives under TCG take their time. */
const SLOW_MS = 300_000;
const FS_USAGE = "rw-file-system-single-node-writer";

function print(text: string): void {
  Deno.stdout.writeSync(new TextEncoder().encode(text + "\n"));
}

function createRequest(
  name: string,
  bytes: number,
  capability: Capability,
  over: Record<string, unknown> = {},
) {
  return {
    name,
    capacity_range: { required_bytes: String(bytes), limit_bytes: "0" },
    volume_capabilities: [capability],
    parameters: {},
    accessibility_requirements: { requisite: [], preferred: [] },
    ...over,
  };
}

const fromSnapshot = (id: string) => ({
  volume_content_source: { snapshot: { snapshot_id: id } },
});

/** The plugin with --block-volumes and a directory store below the test's directory. */
async function start(pool: TestPool): Promise<PluginProcess> {
  const storeDir = `${pool.dir}/store`;
  await Deno.mkdir(storeDir, { recursive: true });
  return await PluginProcess.start({
    parentDataset: pool.parent,
    dir: pool.dir,
    nodeId: "node-a",
    extraArgs: ["--block-volumes", "--store", `file://${storeDir}`],
    scope: { blockVolumes: true, extraDirs: [storeDir] },
  });
}

/** Names and types of the pool's datasets (what a refused call must leave alone). */
async function datasets(pool: TestPool): Promise<string> {
  return await sh("zfs", "list", "-H", "-r", "-t", "all", "-o", "name,type", pool.pool);
}

/** CreateSnapshot to the store, waited for until the store holds it. */
async function storeSnapshot(plugin: PluginProcess, volumeId: string, name: string) {
  const req = { source_volume_id: volumeId, name, parameters: { store: "true" } };
  for (let i = 0;; i++) {
    const { snapshot } = await plugin.client.controller("CreateSnapshot", req, SLOW_MS);
    if (snapshot.ready_to_use) return snapshot as { snapshot_id: string; size_bytes: string };
    if (i > 120) assert.fail(`snapshot ${name} never became ready`);
    await new Promise((r) => setTimeout(r, 1000));
  }
}

/** CreateVolume, again while the restore runs (UNAVAILABLE), as Nomad's retries do. */
async function createWaiting(plugin: PluginProcess, req: object) {
  return (await retryWhileBusy(
    () => plugin.client.controller("CreateVolume", req, SLOW_MS),
    SLOW_MS,
    2000,
  )).volume;
}

// --- zfs-fuse ---------------------------------------------------------------------------------

Deno.test({
  name:
    "block store: on zfs-fuse, a zvol restore from the store is refused saying why, and nothing is received",
  ignore: onOpenZfs,
  async fn() {
    await using pool = await TestPool.create();
    await using plugin = await start(pool);
    const c = plugin.client;
    const vol =
      (await c.controller("CreateVolume", createRequest("pg", 16 * MiB, mountCapability())))
        .volume;
    const snap = await storeSnapshot(plugin, vol.volume_id, "pg-snap");
    const before = await datasets(pool);
    for (const cap of [blockCapability(), fsCapability("ext4")]) {
      const details = await rejects(
        c.controller(
          "CreateVolume",
          createRequest("z", 16 * MiB, cap, fromSnapshot(snap.snapshot_id)),
        ),
        Code.INVALID_ARGUMENT,
        /zfs-fuse/,
      );
      print(`  ${JSON.stringify(cap)}: ${details}`);
    }
    assert.equal(await datasets(pool), before, "nothing received, nothing made");
    // The dataset's stored snapshot restores as a dataset, as before.
    await createWaiting(
      plugin,
      createRequest("pg-copy", 16 * MiB, mountCapability(), fromSnapshot(snap.snapshot_id)),
    );
    assert.equal(await pool.get(`${pool.parent}/pg-copy`, "type"), "filesystem");
  },
});

// --- OpenZFS ----------------------------------------------------------------------------------

Deno.test({
  name:
    "block store: a raw zvol's dd pattern comes back through the store; mismatched restores are refused",
  ignore: !onOpenZfs,
  async fn() {
    await using pool = await TestPool.create(1024);
    await using plugin = await start(pool);
    const c = plugin.client;
    const raw =
      (await c.controller("CreateVolume", createRequest("raw", 64 * MiB, blockCapability())))
        .volume;
    const device = await zvolDevice(`${pool.parent}/raw`);
    const pattern = new Prng(25).bytes(2 * MiB);
    await Deno.writeFile(`${pool.dir}/pattern.bin`, pattern);
    await sh(
      "dd",
      `if=${pool.dir}/pattern.bin`,
      `of=${device}`,
      "bs=1M",
      "seek=10",
      "oflag=direct",
      "conv=notrunc,fsync",
      "status=none",
    );
    const snap = await storeSnapshot(plugin, raw.volume_id, "raw-snap");

    const before = await datasets(pool);
    const refused: [string, Capability, RegExp][] = [
      ["as a ZFS dataset", mountCapability(), /is of a zvol holding block/],
      ["as ext4", fsCapability("ext4"), /holding block, and the request asks for ext4/],
    ];
    for (const [what, cap, message] of refused) {
      const details = await rejects(
        c.controller(
          "CreateVolume",
          createRequest("x", 64 * MiB, cap, fromSnapshot(snap.snapshot_id)),
        ),
        Code.INVALID_ARGUMENT,
        message,
      );
      print(`  a raw zvol's snapshot ${what}: ${details}`);
    }
    await rejects(
      c.controller(
        "CreateVolume",
        createRequest("x", 32 * MiB, blockCapability(), {
          ...fromSnapshot(snap.snapshot_id),
          capacity_range: { required_bytes: String(32 * MiB), limit_bytes: String(32 * MiB) },
        }),
      ),
      Code.OUT_OF_RANGE,
    );
    assert.equal(await datasets(pool), before, "nothing received, nothing made");

    const copy = await createWaiting(
      plugin,
      createRequest("raw-copy", 64 * MiB, blockCapability(), fromSnapshot(snap.snapshot_id)),
    );
    const ds = `${pool.parent}/raw-copy`;
    assert.equal(copy.volume_context.fs_type, "block");
    assert.equal(await pool.get(ds, "type"), "volume");
    assert.equal(await pool.get(ds, "volsize"), String(64 * MiB));
    assert.equal(await pool.get(ds, "org.zfs-csi:fs-type"), "block");
    assert.notEqual(await pool.get(ds, "refreservation"), "0", "reserved in full again");
    const received = await sh(
      "zfs",
      "get",
      "-H",
      "-s",
      "received",
      "-o",
      "property,value",
      "all",
      ds,
    );
    print(`  received properties of the copy: ${JSON.stringify(received.trim())}`);
    const back = await ddRead(await zvolDevice(ds), 10, 2 * MiB, pool.dir);
    assert.deepEqual(back, pattern, "the pattern came back through the store");
  },
});

Deno.test({
  name:
    "block store: an ext4 zvol's files come back through the store, its filesystem never made again",
  ignore: !onOpenZfs,
  async fn() {
    await using pool = await TestPool.create(1024);
    await using plugin = await start(pool);
    const c = plugin.client;
    const vol =
      (await c.controller("CreateVolume", createRequest("files", 64 * MiB, fsCapability("ext4"))))
        .volume;
    const cap = fsCapability("ext4");
    const use = (volume: { volume_id: string; volume_context: object }, allocId: string) =>
      claimZvol(plugin, volume, cap, { allocId, usage: FS_USAGE, deadlineMs: SLOW_MS });
    const a = await use(vol, "alloc-1");
    const data = new Prng(7).bytes(2 * MiB);
    await Deno.mkdir(`${a.target}/db`);
    await Deno.writeFile(`${a.target}/db/table.bin`, data);
    await Deno.writeTextFile(`${a.target}/notes.txt`, "ext4 through the store\n");
    await a.release();
    const source = `${pool.parent}/files`;
    assert.equal(await pool.get(source, "org.zfs-csi:format"), "done");
    const uuid = (await probe(await zvolDevice(source))).UUID;
    assert.ok(uuid, "the plugin made ext4");
    const snap = await storeSnapshot(plugin, vol.volume_id, "files-snap");

    await rejects(
      c.controller(
        "CreateVolume",
        createRequest("x", 64 * MiB, blockCapability(), fromSnapshot(snap.snapshot_id)),
      ),
      Code.INVALID_ARGUMENT,
      /holding ext4, and the request asks for block/,
    );
    // A dataset's stored snapshot asked for as a zvol.
    const plain =
      (await c.controller("CreateVolume", createRequest("plain", 16 * MiB, mountCapability())))
        .volume;
    const plainSnap = await storeSnapshot(plugin, plain.volume_id, "plain-snap");
    await rejects(
      c.controller(
        "CreateVolume",
        createRequest("y", 64 * MiB, fsCapability("ext4"), fromSnapshot(plainSnap.snapshot_id)),
      ),
      Code.INVALID_ARGUMENT,
      /is of a ZFS dataset/,
    );
    assert.equal(await tryRun("zfs", "list", `${pool.parent}/x`).then((r) => r.code), 1);
    assert.equal(await tryRun("zfs", "list", `${pool.parent}/y`).then((r) => r.code), 1);

    const copy = await createWaiting(
      plugin,
      createRequest("files-copy", 64 * MiB, fsCapability("ext4"), fromSnapshot(snap.snapshot_id)),
    );
    const ds = `${pool.parent}/files-copy`;
    assert.equal(copy.volume_context.fs_type, "ext4");
    assert.equal(await pool.get(ds, "org.zfs-csi:fs-type"), "ext4");
    assert.equal(await pool.get(ds, "org.zfs-csi:format"), "done", "formatted before the snapshot");
    const b = await use(copy, "alloc-2");
    assert.equal(
      (await probe(await zvolDevice(ds))).UUID,
      uuid,
      "the same filesystem, not made again",
    );
    assert.deepEqual(await Deno.readFile(`${b.target}/db/table.bin`), data);
    assert.equal(await Deno.readTextFile(`${b.target}/notes.txt`), "ext4 through the store\n");
    await b.release();
  },
});
