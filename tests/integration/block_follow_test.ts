/**
 * Zvols that follow their job (docs/block-volumes.md, docs/follow.md): two plugins as they ship
 * (a block build's permission flags, --block-volumes), node-a and node-b, each on its own pool,
 * sharing one directory store, called as Nomad calls them.
 *
 * zfs-fuse (here and in CI) has no zvols: a CreateVolume of a follow zvol and a NodeStage of one
 * are refused saying why, and nothing is written to the store or made in the pool. On OpenZFS
 * (tools/openzfs-vm/):
 * - a raw follow zvol moves node-a → node-b → node-a with a dd pattern intact, the move back
 *   receiving only the increment; grown while node-b holds it (the store's record, node-b's
 *   copy by NodeExpandVolume, node-a's at its next stage); the warm copy left behind is read-only (a write to its device
 *   is refused); a release is refused while the device is still bound onto a target file; and
 *   a copy written after its release (diverged) is set aside at its next stage, never
 *   published, the head's chain received in full instead;
 * - an ext4 follow zvol moves with its files intact, its filesystem made once on node-a and
 *   never again on node-b (the same UUID, no mkfs in node-b's log); its snapshot (the last copy
 *   in the store, pinned) makes a new follow zvol holding the same filesystem.
 */

import assert from "node:assert/strict";
import { Code } from "../../src/errors.ts";
import { rejects } from "../support/csi_client.ts";
import { claimPaths } from "../support/nomad.ts";
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
  type ZvolClaim,
  zvolDevice,
} from "../support/zvols.ts";

const MiB = 1024 * 1024;
const onOpenZfs = await openZfs();
/** mkfs, sends and receives under TCG take their time; Nomad gives stages no deadline. */
const SLOW_MS = 300_000;
const BLOCK_USAGE = "rw-block-device-single-node-writer";
const FS_USAGE = "rw-file-system-single-node-writer";

function print(text: string): void {
  Deno.stdout.writeSync(new TextEncoder().encode(text + "\n"));
}

if (!onOpenZfs) {
  print(
    "block follow: this zfs makes no zvols (zfs-fuse): only the refusals run here; the moves " +
      "of raw and ext4 follow zvols run on OpenZFS (tools/openzfs-vm/)",
  );
}

/** One node: its pool and the plugin on it. */
interface Node {
  readonly name: string;
  readonly pool: TestPool;
  readonly plugin: PluginProcess;
}

/** Two nodes sharing a directory store below `dir`, each with --block-volumes. */
async function cluster(dir: string): Promise<{ a: Node; b: Node; storeDir: string }> {
  const storeDir = `${dir}/store`;
  await Deno.mkdir(storeDir, { recursive: true });
  const node = async (name: string): Promise<Node> => {
    const pool = await TestPool.create(1024);
    const plugin = await PluginProcess.start({
      parentDataset: pool.parent,
      dir: pool.dir,
      nodeId: name,
      extraArgs: ["--block-volumes", "--store", `file://${storeDir}`],
      scope: { blockVolumes: true, extraDirs: [storeDir] },
    });
    return { name, pool, plugin };
  };
  return { a: await node("node-a"), b: await node("node-b"), storeDir };
}

async function stopAll(nodes: readonly Node[]): Promise<void> {
  for (const n of nodes) await n.plugin.stop();
  for (const n of nodes) await n.pool.destroy();
}

/**
 * Runs `fn` on two nodes sharing a store below a temporary directory, printing their last log
 * lines when it fails, and stops and removes everything after.
 */
async function withCluster(
  fn: (c: { a: Node; b: Node; storeDir: string; dir: string }) => Promise<void>,
): Promise<void> {
  const dir = await Deno.makeTempDir({ prefix: "zfs-csi-block-follow-" });
  const { a, b, storeDir } = await cluster(dir);
  try {
    await fn({ a, b, storeDir, dir });
  } catch (err) {
    print(a.plugin.logs().slice(-30).join("\n"));
    print(b.plugin.logs().slice(-30).join("\n"));
    throw err;
  } finally {
    await stopAll([a, b]);
    await Deno.remove(dir, { recursive: true });
  }
}

function createRequest(name: string, bytes: number, capability: Capability) {
  return {
    name,
    capacity_range: { required_bytes: String(bytes), limit_bytes: "0" },
    volume_capabilities: [capability],
    parameters: { follow: "true" },
    accessibility_requirements: { requisite: [], preferred: [] },
  };
}

/** The owner object of `volume` in the store, read without the plugin's code. */
async function ownerOf(storeDir: string, volume: string): Promise<Record<string, unknown>> {
  return JSON.parse(await Deno.readTextFile(`${storeDir}/v1/volumes/${volume}/owner.json`));
}

let allocs = 0;

/** NodeStage and NodePublish of `volume` on `node` with `cap`, for a new alloc. */
function claim(
  node: Node,
  volume: { volume_id: string; volume_context: Record<string, string> },
  cap: Capability,
): Promise<ZvolClaim> {
  return claimZvol(node.plugin, volume, cap, {
    allocId: `alloc-${++allocs}`,
    usage: "block" in cap ? BLOCK_USAGE : FS_USAGE,
    deadlineMs: SLOW_MS,
    // Nomad's paths name its own volume id, never the plugin's "<name>@*".
    nomadVolumeId: volume.volume_id.replace("@*", ""),
  });
}

/** Writes `data` at `offsetMiB` of the device at `path` (direct I/O, synced), via a file in `dir`. */
async function ddWrite(path: string, offsetMiB: number, data: Uint8Array, dir: string) {
  const file = `${dir}/pattern-${offsetMiB}.bin`;
  await Deno.writeFile(file, data);
  await sh(
    "dd",
    `if=${file}`,
    `of=${path}`,
    "bs=1M",
    `seek=${offsetMiB}`,
    "oflag=direct",
    "conv=notrunc,fsync",
    "status=none",
  );
  await Deno.remove(file);
}

/** What the stages of `node` logged about the volume since log record `from`. */
function stagesSince(node: Node, from: number) {
  const records = node.plugin.records().slice(from);
  return {
    plans: records.filter((r) => r.msg === "follow volume held here").map((r) => r.plan),
    receivedBytes: records.filter((r) => r.msg === "follow volume received")
      .reduce((n, r) => n + Number(r.bytes), 0),
    formatted: records.filter((r) => r.msg === "zvol formatted").length,
  };
}

// --- zfs-fuse ---------------------------------------------------------------------------------

Deno.test({
  name:
    "block follow: on zfs-fuse, a follow zvol is refused saying why, at CreateVolume and NodeStage, with nothing written",
  ignore: onOpenZfs,
  fn: () =>
    withCluster(async ({ a, b, storeDir }) => {
      for (const cap of [blockCapability(), fsCapability("ext4")]) {
        const details = await rejects(
          a.plugin.client.controller("CreateVolume", createRequest("moving", 64 * MiB, cap)),
          Code.INVALID_ARGUMENT,
          /zfs-fuse/,
        );
        print(`  CreateVolume ${JSON.stringify(cap)}: ${details}`);
      }
      const p = await claimPaths(b.plugin.baseDir, {
        volumeId: "moving",
        allocId: "alloc-0",
        usage: BLOCK_USAGE,
      });
      const details = await rejects(
        b.plugin.client.node("NodeStageVolume", {
          volume_id: "moving@*",
          volume_capability: blockCapability(),
          volume_context: { fs_type: "block" },
          staging_target_path: p.staging,
        }),
        Code.INVALID_ARGUMENT,
        /zfs-fuse/,
      );
      print(`  NodeStage: ${details}`);
      assert.equal(
        await Deno.stat(`${storeDir}/v1/volumes/moving`).then(() => true, () => false),
        false,
        "nothing written to the store",
      );
      for (const n of [a, b]) {
        assert.deepEqual(await n.pool.datasets(), [n.pool.pool, n.pool.parent], n.name);
      }
    }),
});

// --- OpenZFS ----------------------------------------------------------------------------------

Deno.test({
  name:
    "block follow: a raw follow zvol moves a→b→a with its dd pattern, the way back an increment; a read-only warm copy; release waits for the bound device; a diverged copy set aside",
  ignore: !onOpenZfs,
  fn: () =>
    withCluster(async ({ a, b, storeDir, dir }) => {
      const ds = (n: Node) => `${n.pool.parent}/moving`;
      const volume = (await a.plugin.client.controller(
        "CreateVolume",
        createRequest("moving", 64 * MiB, blockCapability()),
        SLOW_MS,
      )).volume;
      assert.equal(volume.volume_id, "moving@*");
      assert.deepEqual(volume.volume_context, { fs_type: "block" });
      assert.equal(await tryRun("zfs", "list", ds(a)).then((r) => r.code), 1, "no zvol yet");

      // node-a: the first stage makes the zvol; the job writes a pattern through its device.
      // Larger than what node-b adds, so that the move back (an increment) is told from a full one.
      const p1 = new Prng(41).bytes(8 * MiB);
      const onA = await claim(a, volume, blockCapability());
      assert.equal(await a.pool.get(ds(a), "type"), "volume");
      assert.equal(await a.pool.get(ds(a), "volsize"), String(64 * MiB));
      await ddWrite(onA.target, 10, p1, dir);
      await onA.release();
      assert.equal((await ownerOf(storeDir, "moving")).state, "released");
      // The warm copy: read-only, its device too.
      assert.equal(await a.pool.get(ds(a), "readonly"), "on");
      const write = await tryRun(
        "dd",
        "if=/dev/zero",
        `of=${await zvolDevice(ds(a))}`,
        "bs=4096",
        "count=1",
        "oflag=direct",
        "conv=notrunc",
        "status=none",
      );
      print(`  a write to node-a's warm copy: exit ${write.code}: ${write.stderr.trim()}`);
      assert.notEqual(write.code, 0, "the warm copy's device refuses writes");

      // node-b: no copy, the whole chain; the pattern is there; the job adds another.
      let mark = b.plugin.records().length;
      const onB = await claim(b, volume, blockCapability());
      const bStage = stagesSince(b, mark);
      print(`  node-b's stage: ${JSON.stringify(bStage)}`);
      assert.deepEqual(bStage.plans, ["full"]);
      assert.deepEqual(await ddRead(onB.target, 10, 8 * MiB, dir), p1, "node-a's pattern on b");
      const p2 = new Prng(42).bytes(MiB);
      await ddWrite(onB.target, 20, p2, dir);
      // Grown while node-b holds it: the store's record, then node-b's copy (NodeExpandVolume).
      const range = { required_bytes: String(96 * MiB), limit_bytes: "0" };
      const grown = await a.plugin.client.controller("ControllerExpandVolume", {
        volume_id: "moving@*",
        capacity_range: range,
      }, SLOW_MS);
      assert.deepEqual(grown, {
        capacity_bytes: String(96 * MiB),
        node_expansion_required: true,
      });
      await b.plugin.client.node("NodeExpandVolume", {
        volume_id: "moving@*",
        volume_path: onB.target,
        staging_target_path: onB.staging,
        capacity_range: range,
        volume_capability: blockCapability(),
      }, SLOW_MS);
      assert.equal(await b.pool.get(ds(b), "volsize"), String(96 * MiB));
      // Nomad unstages another usage while this one's device is still bound: not released.
      const other = await claimPaths(b.plugin.baseDir, {
        volumeId: "moving",
        allocId: "alloc-other",
        usage: "ro-block-device-single-node-reader-only",
      });
      await b.plugin.client.node("NodeUnstageVolume", {
        volume_id: "moving@*",
        staging_target_path: other.staging,
      }, SLOW_MS);
      const stillHeld = await ownerOf(storeDir, "moving");
      assert.equal(stillHeld.state, "held", "not released while its device is bound");
      assert.equal(stillHeld.holder, "node-b");
      assert.equal(await b.pool.get(ds(b), "readonly"), "off");
      await onB.release();
      assert.equal((await ownerOf(storeDir, "moving")).state, "released");

      // Back to node-a: its clean warm copy takes only node-b's increment.
      mark = a.plugin.records().length;
      const backOnA = await claim(a, volume, blockCapability());
      const aStage = stagesSince(a, mark);
      print(`  node-a's stage: ${JSON.stringify(aStage)}`);
      assert.deepEqual(aStage.plans, ["increment"]);
      assert.equal(await a.pool.get(ds(a), "volsize"), String(96 * MiB), "the recorded size");
      assert.ok(
        aStage.receivedBytes < bStage.receivedBytes / 2,
        "node-b's increment only, not the whole chain",
      );
      assert.deepEqual(await ddRead(backOnA.target, 10, 8 * MiB, dir), p1);
      assert.deepEqual(await ddRead(backOnA.target, 20, MiB, dir), p2);
      await backOnA.release();

      // node-b's warm copy is written after its release (by hand): it diverged.
      await sh("zfs", "set", "readonly=off", ds(b));
      await ddWrite(await zvolDevice(ds(b)), 30, new Prng(43).bytes(MiB), dir);
      await sh("zfs", "set", "readonly=on", ds(b));
      // `written` counts what reached the pool: let the transaction group with the write end.
      await sh("zpool", "sync", b.pool.pool);
      print(`  node-b's copy written since its release: ${await b.pool.get(ds(b), "written")}`);
      mark = b.plugin.records().length;
      const again = await claim(b, volume, blockCapability());
      const diverged = stagesSince(b, mark);
      print(`  node-b's stage after it diverged: ${JSON.stringify(diverged)}`);
      assert.deepEqual(diverged.plans, ["full"]);
      const aside = (await sh("zfs", "list", "-H", "-o", "name", "-r", b.pool.parent))
        .split("\n").filter((n) => n.includes("/.deleted-"));
      assert.equal(aside.length, 1, "set aside, not destroyed");
      assert.deepEqual(
        await ddRead(again.target, 30, MiB, dir),
        new Uint8Array(MiB),
        "the diverged writes are not published",
      );
      assert.deepEqual(await ddRead(again.target, 10, 8 * MiB, dir), p1);
      assert.deepEqual(await ddRead(again.target, 20, MiB, dir), p2);
      await again.release();
    }),
});

Deno.test({
  name:
    "block follow: an ext4 follow zvol moves a→b→a with its files, its filesystem made once and never again; a new follow zvol from its snapshot",
  ignore: !onOpenZfs,
  fn: () =>
    withCluster(async ({ a, b, storeDir }) => {
      const ds = (n: Node) => `${n.pool.parent}/files`;
      const cap = fsCapability("ext4");
      const volume = (await a.plugin.client.controller(
        "CreateVolume",
        createRequest("files", 64 * MiB, cap),
        SLOW_MS,
      )).volume;
      assert.deepEqual(volume.volume_context, { fs_type: "ext4" });
      let mark = a.plugin.records().length;
      const onA = await claim(a, volume, cap);
      assert.equal(stagesSince(a, mark).formatted, 1, "made at its first stage");
      const uuid = (await probe(await zvolDevice(ds(a)))).UUID;
      assert.ok(uuid);
      const data = new Prng(51).bytes(2 * MiB);
      await Deno.mkdir(`${onA.target}/db`);
      await Deno.writeFile(`${onA.target}/db/table.bin`, data);
      await Deno.writeTextFile(`${onA.target}/notes.txt`, "written on node-a\n");
      await onA.release();

      mark = b.plugin.records().length;
      const onB = await claim(b, volume, cap);
      const bStage = stagesSince(b, mark);
      print(`  node-b's stage: ${JSON.stringify(bStage)}`);
      assert.deepEqual(bStage.plans, ["full"]);
      assert.equal(bStage.formatted, 0, "never formatted again");
      assert.equal(await b.pool.get(ds(b), "org.zfs-csi:format"), "done");
      assert.equal((await probe(await zvolDevice(ds(b)))).UUID, uuid, "the same filesystem");
      assert.deepEqual(await Deno.readFile(`${onB.target}/db/table.bin`), data);
      assert.equal(await Deno.readTextFile(`${onB.target}/notes.txt`), "written on node-a\n");
      await Deno.writeTextFile(`${onB.target}/notes.txt`, "and on node-b\n", { append: true });
      await onB.release();
      assert.equal((await ownerOf(storeDir, "files")).holder, "node-b");

      mark = a.plugin.records().length;
      const backOnA = await claim(a, volume, cap);
      const aStage = stagesSince(a, mark);
      print(`  node-a's stage: ${JSON.stringify(aStage)}`);
      assert.deepEqual(aStage.plans, ["increment"]);
      assert.equal(aStage.formatted, 0);
      assert.equal(
        await Deno.readTextFile(`${backOnA.target}/notes.txt`),
        "written on node-a\nand on node-b\n",
      );
      assert.deepEqual(await Deno.readFile(`${backOnA.target}/db/table.bin`), data);
      await backOnA.release();
      assert.equal((await ownerOf(storeDir, "files")).state, "released");

      // A snapshot is its last copy in the store, pinned; a new follow zvol made from it holds
      // the same filesystem wherever it is staged.
      const { snapshot } = await a.plugin.client.controller("CreateSnapshot", {
        source_volume_id: "files@*",
        name: "files-snap",
        parameters: {},
      }, SLOW_MS);
      assert.equal(snapshot.ready_to_use, true);
      const copy = (await a.plugin.client.controller("CreateVolume", {
        ...createRequest("files-copy", 64 * MiB, cap),
        capacity_range: null,
        volume_content_source: { snapshot: { snapshot_id: snapshot.snapshot_id } },
      }, SLOW_MS)).volume;
      assert.deepEqual(copy.volume_context, { fs_type: "ext4" });
      assert.equal(copy.capacity_bytes, String(64 * MiB), "the snapshot's volsize");
      mark = b.plugin.records().length;
      const copyOnB = await claim(b, copy, cap);
      assert.equal(stagesSince(b, mark).formatted, 0);
      assert.equal(
        (await probe(await zvolDevice(`${b.pool.parent}/files-copy`))).UUID,
        uuid,
        "the snapshot's filesystem",
      );
      assert.equal(
        await Deno.readTextFile(`${copyOnB.target}/notes.txt`),
        "written on node-a\nand on node-b\n",
      );
      // Measured, not asserted: what readonly=on (a fenced or suspended copy) does to writes
      // of a filesystem mounted on the zvol, which holds its device open.
      await sh("zfs", "set", "readonly=on", `${b.pool.parent}/files-copy`);
      const fenced = await tryRun(
        "sh",
        "-c",
        `echo fenced >> ${copyOnB.target}/fenced.txt && sync ${copyOnB.target}/fenced.txt`,
      );
      print(
        `  a write while readonly=on and ext4 stays mounted: exit ${fenced.code} ` +
          `${fenced.stderr.trim()}`,
      );
      await sh("zfs", "set", "readonly=off", `${b.pool.parent}/files-copy`);
      await copyOnB.release();
    }),
});
