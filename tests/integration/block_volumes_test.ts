/**
 * Block volumes (issue 25) through the plugin's gRPC API, the plugin in its own process with its
 * production permission flags, on a real pool.
 *
 * Everywhere (zfs-fuse here and in CI, OpenZFS in the VM): without `--block-volumes` a block
 * capability and fs_type ext4/xfs are refused with INVALID_ARGUMENT naming the flag, and nothing
 * appears in the pool nor below the test's directory.
 *
 * zfs-fuse has no zvols: there `--block-volumes` still refuses them, saying why. Everything else
 * runs on OpenZFS only (tools/openzfs-vm/, ZFS_CSI_VM_OPENZFS=2.1 and 2.3): a raw block volume
 * (a pattern written with dd onto the published device, read back after unpublish/republish,
 * restage and expansion; a read-only claim is refused), ext4 and xfs volumes (files survive
 * restaging, the filesystem is never made again, expansion grows it as seen from inside), snapshot,
 * clone and restore, the set-aside delete (the reservation given back at once) and its undo, a SIGKILL of the plugin and of mkfs while
 * it formats, and hostile input (a block capability for a filesystem volume and the reverse, a
 * volume_context that lies, a /dev/zvol link swapped to a zvol outside the parent dataset).
 */

import assert from "node:assert/strict";
import { Code } from "../../src/errors.ts";
import { rejects, retryWhileBusy } from "../support/csi_client.ts";
import { claimPaths, hostMounts, mountCapability } from "../support/nomad.ts";
import { PluginProcess, runZfsCsi } from "../support/plugin_process.ts";
import { Prng } from "../support/prng.ts";
import { openZfs } from "../support/stream_bytes.ts";
import { destroyRetrying, sh, TestPool, tryRun } from "../support/zfs_pool.ts";
import { blockCapability, type Capability, ddRead, fsCapability, probe } from "../support/zvols.ts";

const MiB = 1024 * 1024;
const NODE = "node-a";
const onOpenZfs = await openZfs();
/** Nomad's usage segments of block-device and file-system claims. */
const BLOCK_USAGE = "rw-block-device-single-node-writer";
const FS_USAGE = "rw-file-system-single-node-writer";
/** mkfs and growing under TCG take their time. */
const SLOW_MS = 300_000;

function print(text: string): void {
  Deno.stdout.writeSync(new TextEncoder().encode(text + "\n"));
}

function createRequest(
  name: string,
  bytes: number,
  capability: Capability,
  parameters: Record<string, string> = {},
  over: Record<string, unknown> = {},
) {
  return {
    name,
    capacity_range: { required_bytes: String(bytes), limit_bytes: "0" },
    volume_capabilities: [capability],
    parameters,
    accessibility_requirements: { requisite: [], preferred: [] },
    ...over,
  };
}

/**
 * The pool's datasets with the properties a refused call must leave alone, and every mount below
 * the test's directory (not the whole mount table: other tests on the machine change it).
 */
async function state(pool: TestPool): Promise<string> {
  const props = await sh(
    "zfs",
    "get",
    "-Hp",
    "-r",
    "-o",
    "name,property,value",
    "type,refquota,volsize,mounted,org.zfs-csi:managed",
    pool.pool,
  );
  const mounts = (await hostMounts()).filter((m) => m.path.startsWith(pool.dir + "/"))
    .map((m) => `${m.source} ${m.path}`);
  return props + "\n" + mounts.sort().join("\n");
}

// --- everywhere -------------------------------------------------------------------------------

Deno.test("block volumes: off by default, a block capability and fs_type ext4/xfs are refused naming --block-volumes", async () => {
  await using pool = await TestPool.create();
  await using plugin = await PluginProcess.start({ parentDataset: pool.parent, dir: pool.dir });
  const c = plugin.client;
  // A filesystem volume, for the node calls below.
  const fsVolume = (await c.controller(
    "CreateVolume",
    createRequest("plain", 64 * MiB, mountCapability()),
  )).volume;
  const before = await state(pool);
  const refused: [string, () => Promise<unknown>][] = [
    [
      "a block capability",
      () => c.controller("CreateVolume", createRequest("b", 64 * MiB, blockCapability())),
    ],
    [
      "fs_type ext4",
      () => c.controller("CreateVolume", createRequest("e", 64 * MiB, fsCapability("ext4"))),
    ],
    [
      "fs_type xfs",
      () => c.controller("CreateVolume", createRequest("x", 64 * MiB, fsCapability("xfs"))),
    ],
    [
      "the parameter fs_type=ext4",
      () =>
        c.controller(
          "CreateVolume",
          createRequest("p", 64 * MiB, mountCapability(), { fs_type: "ext4" }),
        ),
    ],
  ];
  for (const [what, call] of refused) {
    const details = await rejects(call(), Code.INVALID_ARGUMENT, /--block-volumes/);
    print(`  ${what}: ${details}`);
  }
  // The node refuses a block claim of a volume, naming the flag too.
  const p = await claimPaths(plugin.baseDir, {
    volumeId: fsVolume.volume_id,
    allocId: "a1",
    usage: BLOCK_USAGE,
  });
  await rejects(
    c.node("NodeStageVolume", {
      volume_id: fsVolume.volume_id,
      volume_capability: blockCapability(),
      volume_context: fsVolume.volume_context,
      staging_target_path: p.staging,
    }),
    Code.INVALID_ARGUMENT,
    /--block-volumes/,
  );
  assert.equal(
    await state(pool),
    before,
    "nothing changed in the pool nor below the test's directory",
  );
  const validated = await c.controller("ValidateVolumeCapabilities", {
    volume_id: fsVolume.volume_id,
    volume_capabilities: [blockCapability()],
  });
  assert.equal(validated.confirmed, null, "a block capability is not confirmed");
});

Deno.test({
  name: "block volumes: on zfs-fuse, --block-volumes refuses zvols saying why, and makes nothing",
  ignore: onOpenZfs,
  async fn() {
    await using pool = await TestPool.create();
    await using plugin = await PluginProcess.start({
      parentDataset: pool.parent,
      dir: pool.dir,
      extraArgs: ["--block-volumes", "--allow-sparse-zvols"],
      scope: { blockVolumes: true },
    });
    const c = plugin.client;
    const before = await state(pool);
    const calls: [string, () => Promise<unknown>][] = [
      [
        "a block capability",
        () => c.controller("CreateVolume", createRequest("b", 64 * MiB, blockCapability())),
      ],
      [
        "fs_type ext4",
        () => c.controller("CreateVolume", createRequest("e", 64 * MiB, fsCapability("ext4"))),
      ],
      [
        "a sparse xfs volume",
        () =>
          c.controller(
            "CreateVolume",
            createRequest("x", 512 * MiB, mountCapability(), { fs_type: "xfs", sparse: "true" }),
          ),
      ],
    ];
    for (const [what, call] of calls) {
      let details = "";
      try {
        await call();
        assert.fail(`${what}: CreateVolume succeeded on zfs-fuse`);
      } catch (err) {
        const e = err as { code: number; details: string };
        assert.ok(
          e.code === Code.INVALID_ARGUMENT || e.code === Code.FAILED_PRECONDITION,
          `${what}: code ${e.code}: ${e.details}`,
        );
        details = e.details;
      }
      assert.match(details, /zvol/i, `${what}: the message says zvols cannot be made`);
      assert.match(details, /zfs-fuse/, `${what}: and why (zfs-fuse)`);
      print(`  ${what}: ${details}`);
    }
    assert.equal(
      await state(pool),
      before,
      "nothing changed in the pool nor below the test's directory",
    );
    // Filesystem volumes are served as before.
    await c.controller("CreateVolume", createRequest("plain", 64 * MiB, mountCapability()));
    assert.equal(await pool.get(`${pool.parent}/plain`, "type"), "filesystem");
  },
});

// --- OpenZFS: helpers -------------------------------------------------------------------------

async function startBlock(pool: TestPool, extra: readonly string[] = []): Promise<PluginProcess> {
  return await PluginProcess.start({
    parentDataset: pool.parent,
    dir: pool.dir,
    nodeId: NODE,
    extraArgs: ["--block-volumes", ...extra],
    // A block build's flags (ZFS_CSI_BLOCK_VOLUMES=on): without them --block-volumes refuses to start.
    scope: { blockVolumes: true },
  });
}

/** A volume as CreateVolume answered it. */
interface Volume {
  readonly volume_id: string;
  readonly capacity_bytes: string;
  readonly volume_context: Record<string, string>;
}

/** One claim's paths and its calls, as Nomad makes them. */
interface BlockClaim {
  readonly staging: string;
  readonly target: string;
  stage(): Promise<void>;
  publish(): Promise<void>;
  unpublish(): Promise<void>;
  unstage(): Promise<void>;
  release(): Promise<void>;
}

/** The paths of a claim with `capability`, not staged yet. */
async function claimOf(
  plugin: () => PluginProcess,
  volume: Volume,
  allocId: string,
  capability: Capability,
  opts: {
    readonly usage?: string;
    readonly readonly?: boolean;
    readonly context?: Record<string, string>;
  } = {},
): Promise<BlockClaim> {
  const usage = opts.usage ?? ("block" in capability ? BLOCK_USAGE : FS_USAGE);
  const p = await claimPaths(plugin().baseDir, { volumeId: volume.volume_id, allocId, usage });
  const base = {
    volume_id: volume.volume_id,
    volume_capability: capability,
    volume_context: opts.context ?? volume.volume_context,
  };
  const unpublish = async () => {
    await plugin().client.node("NodeUnpublishVolume", {
      volume_id: volume.volume_id,
      target_path: p.target,
    });
  };
  const unstage = async () => {
    await plugin().client.node(
      "NodeUnstageVolume",
      { volume_id: volume.volume_id, staging_target_path: p.staging },
      SLOW_MS,
    );
  };
  return {
    ...p,
    stage: async () => {
      await plugin().client.node(
        "NodeStageVolume",
        { ...base, staging_target_path: p.staging },
        SLOW_MS,
      );
    },
    publish: async () => {
      await plugin().client.node("NodePublishVolume", {
        ...base,
        staging_target_path: p.staging,
        target_path: p.target,
        readonly: opts.readonly ?? false,
      });
    },
    unpublish,
    unstage,
    release: async () => {
      await unpublish();
      await unstage();
    },
  };
}

/** Stages and publishes: a claim in use. */
async function claim(
  plugin: () => PluginProcess,
  volume: Volume,
  allocId: string,
  capability: Capability,
  opts: Parameters<typeof claimOf>[4] = {},
): Promise<BlockClaim> {
  const cl = await claimOf(plugin, volume, allocId, capability, opts);
  await cl.stage();
  await cl.publish();
  return cl;
}

/**
 * Where a path resolves to, asked of readlink: Deno wants --allow-all for anything below /dev,
 * which integration tests do not have. Undefined when a component is missing.
 */
async function resolved(path: string): Promise<string | undefined> {
  const r = await tryRun("readlink", "-e", path);
  return r.code === 0 ? r.stdout.trim() : undefined;
}

/** The device node of a zvol (what /dev/zvol/<dataset> resolves to), waiting for udev. */
async function zvolDevice(dataset: string): Promise<string> {
  const link = `/dev/zvol/${dataset}`;
  for (let i = 0;; i++) {
    const device = await resolved(link);
    if (device !== undefined) return device;
    if (i >= 120) throw new Error(`${link} did not appear`);
    await new Promise((r) => setTimeout(r, 250));
  }
}

/** The zvol a /dev/zd* node belongs to, asked of zfs's udev helper (not of the links). */
async function zvolOfDevice(device: string): Promise<string> {
  for (const helper of ["/usr/lib/udev/zvol_id", "/lib/udev/zvol_id"]) {
    const r = await tryRun(helper, device);
    if (r.code === 0) return r.stdout.trim();
  }
  throw new Error(`zvol_id could not name ${device}`);
}

/** The device numbers of a block device node (or of what a path resolves to), asked of stat. */
async function rdevOf(path: string): Promise<string> {
  const [type, numbers] = (await sh("stat", "-L", "-c", "%F|%t:%T", path)).trim().split("|");
  assert.equal(type, "block special file", `${path} is a block device`);
  return numbers!;
}

/** Writes `file` onto `device` at `offsetMiB`, bypassing the page cache. */
async function ddWrite(file: string, device: string, offsetMiB: number): Promise<void> {
  await sh(
    "dd",
    `if=${file}`,
    `of=${device}`,
    "bs=1M",
    `seek=${offsetMiB}`,
    "oflag=direct",
    "conv=notrunc,fsync",
    "status=none",
  );
}

/** A seeded pattern of `bytes` in a file of `dir`. */
async function patternFile(
  dir: string,
  name: string,
  seed: number,
  bytes = MiB,
): Promise<{ path: string; data: Uint8Array }> {
  const data = new Prng(seed).bytes(bytes);
  const path = `${dir}/${name}.bin`;
  await Deno.writeFile(path, data);
  return { path, data };
}

/** Whether the filesystem on `device` (not mounted) is consistent: e2fsck -fn / xfs_repair -n. */
async function fsck(
  fs: "ext4" | "xfs",
  device: string,
): Promise<{ clean: boolean; output: string }> {
  const r = fs === "ext4"
    ? await tryRun("e2fsck", "-fn", device)
    : await tryRun("xfs_repair", "-n", device);
  return { clean: r.code === 0, output: (r.stdout + r.stderr).trim() };
}

/** Total bytes of the filesystem at `path`, as statfs reports it from inside. */
async function statfsBytes(path: string): Promise<number> {
  const [bsize, blocks] = (await sh("stat", "-f", "-c", "%S %b", path)).trim().split(" ").map(
    Number,
  );
  return bsize! * blocks!;
}

/** The mounts the plugin made below the test's directory. */
async function mountsBelow(pool: TestPool): Promise<string[]> {
  // Not the pool's own datasets, which OpenZFS mounts below pool.mountRoot.
  return (await hostMounts())
    .filter((m) => m.path.startsWith(pool.dir + "/"))
    .filter((m) => m.path !== pool.mountRoot && !m.path.startsWith(pool.mountRoot + "/"))
    .map((m) => `${m.fsType} ${m.source} ${m.path}`);
}

/** The one mount at `path`. */
async function mountAt(path: string) {
  const at = (await hostMounts()).filter((m) => m.path === path);
  assert.equal(at.length, 1, `one mount at ${path}: ${JSON.stringify(at)}`);
  return at[0]!;
}

/** Whether anything is at `path` (a block device target too: lstat(1), not Deno's). */
async function exists(path: string): Promise<boolean> {
  return (await tryRun("stat", "-c", "%F", path)).code === 0;
}

/** A call must fail with one of `codes`; returns the details. */
async function refusedWith(
  call: Promise<unknown>,
  codes: readonly number[],
  what: string,
): Promise<string> {
  try {
    await call;
  } catch (err) {
    const e = err as { code: number; details: string };
    assert.ok(
      codes.includes(e.code),
      `${what}: code ${e.code} (${e.details}), expected one of ${codes}`,
    );
    return e.details;
  }
  assert.fail(`${what}: the call succeeded`);
}

const REFUSED = [Code.INVALID_ARGUMENT, Code.FAILED_PRECONDITION] as const;

// --- OpenZFS: the raw block volume ------------------------------------------------------------

Deno.test({
  name:
    "block volumes: a raw zvol keeps what dd wrote through republish, restage and growth; a read-only claim is refused",
  ignore: !onOpenZfs,
  async fn() {
    await using pool = await TestPool.create(2048);
    await using plugin = await startBlock(pool);
    const p = () => plugin;
    const c = plugin.client;
    const ds = `${pool.parent}/raw`;
    const req = createRequest("raw", 64 * MiB, blockCapability(), { volblocksize: "16K" });
    const vol: Volume = (await c.controller("CreateVolume", req)).volume;
    assert.equal(vol.volume_id, `raw@${NODE}`);
    assert.equal(vol.capacity_bytes, String(64 * MiB));
    assert.equal(vol.volume_context.fs_type, "block");
    assert.equal(await pool.get(ds, "type"), "volume");
    assert.equal(await pool.get(ds, "volsize"), String(64 * MiB));
    assert.equal(await pool.get(ds, "volblocksize"), "16384");
    assert.equal(await pool.get(ds, "org.zfs-csi:managed"), "yes");
    assert.ok(
      Number(await pool.get(ds, "refreservation")) >= 64 * MiB,
      "not sparse: the space is reserved",
    );
    // Idempotent; the same name as another kind is taken.
    assert.deepEqual((await c.controller("CreateVolume", req)).volume, vol);
    await rejects(
      c.controller("CreateVolume", createRequest("raw", 64 * MiB, fsCapability("ext4"))),
      Code.ALREADY_EXISTS,
    );
    // Sparse only where the operator allows it.
    await rejects(
      c.controller(
        "CreateVolume",
        createRequest("thin", 64 * MiB, blockCapability(), { sparse: "true" }),
      ),
      Code.INVALID_ARGUMENT,
      /--allow-sparse-zvols/,
    );
    const validated = await c.controller("ValidateVolumeCapabilities", {
      volume_id: vol.volume_id,
      volume_capabilities: [blockCapability()],
      volume_context: vol.volume_context,
    });
    assert.equal(
      validated.confirmed?.volume_capabilities?.length,
      1,
      "a block capability is confirmed",
    );

    const one = await patternFile(pool.dir, "one", 25);
    const a = await claim(p, vol, "alloc-1", blockCapability());
    assert.equal(
      await rdevOf(a.target),
      await rdevOf(`/dev/zvol/${ds}`),
      "the target is the zvol's device",
    );
    assert.equal(await zvolOfDevice(await zvolDevice(ds)), ds);
    await ddWrite(one.path, a.target, 4);
    const stats = await c.node("NodeGetVolumeStats", {
      volume_id: vol.volume_id,
      volume_path: a.target,
    });
    const bytes = stats.usage.find((u: { unit: string }) => u.unit === "BYTES");
    assert.equal(bytes?.total, String(64 * MiB), `stats: ${JSON.stringify(stats)}`);
    assert.equal(
      stats.volume_condition?.abnormal ?? false,
      false,
      `stats: ${JSON.stringify(stats)}`,
    );

    await a.unpublish();
    assert.equal(await exists(a.target), false, "unpublish removes the target it made");
    await a.publish();
    assert.deepEqual(
      await ddRead(a.target, 4, MiB, pool.dir),
      one.data,
      "after unpublish and republish",
    );
    await a.release();
    assert.deepEqual(await mountsBelow(pool), [], "nothing mounted after unstage");
    const b = await claim(p, vol, "alloc-2", blockCapability());
    assert.deepEqual(
      await ddRead(b.target, 4, MiB, pool.dir),
      one.data,
      "after unstage and restage",
    );

    // A read-only claim is refused: a read-only bind of a device node does not stop writes
    // (the kernel checks the flag on files and directories only), so the plugin never makes one.
    const ro = await claimOf(p, vol, "alloc-ro", blockCapability(), {
      usage: "ro-block-device-single-node-writer",
      readonly: true,
    });
    await ro.stage();
    await rejects(ro.publish(), Code.INVALID_ARGUMENT, /read-only/);
    const roTarget = await tryRun("test", "-e", ro.target);
    assert.notEqual(roTarget.code, 0, "nothing made at the refused read-only target");
    await ro.release();
    assert.deepEqual(await ddRead(b.target, 4, MiB, pool.dir), one.data, "and changed nothing");

    // Growth: volsize, and the device's size as the node sees it; the data stays.
    const grown = await c.controller("ControllerExpandVolume", {
      volume_id: vol.volume_id,
      capacity_range: { required_bytes: String(128 * MiB), limit_bytes: "0" },
      volume_capability: blockCapability(),
    });
    assert.equal(grown.capacity_bytes, String(128 * MiB));
    assert.equal(await pool.get(ds, "volsize"), String(128 * MiB));
    if (grown.node_expansion_required) {
      await c.node("NodeExpandVolume", {
        volume_id: vol.volume_id,
        volume_path: b.target,
        staging_target_path: b.staging,
        capacity_range: { required_bytes: String(128 * MiB), limit_bytes: "0" },
        volume_capability: blockCapability(),
      });
    }
    let size = 0;
    for (let i = 0; i < 120 && size !== 128 * MiB; i++) {
      size = Number((await sh("blockdev", "--getsize64", b.target)).trim());
      if (size !== 128 * MiB) await new Promise((r) => setTimeout(r, 250));
    }
    assert.equal(size, 128 * MiB, "the published device has the new size");
    assert.deepEqual(await ddRead(b.target, 4, MiB, pool.dir), one.data, "after growth");
    await ddWrite(one.path, b.target, 100);
    assert.deepEqual(await ddRead(b.target, 100, MiB, pool.dir), one.data, "beyond the old end");
    // Never shrinks.
    try {
      const shrunk = await c.controller("ControllerExpandVolume", {
        volume_id: vol.volume_id,
        capacity_range: { required_bytes: String(32 * MiB), limit_bytes: "0" },
      });
      assert.equal(shrunk.capacity_bytes, String(128 * MiB));
    } catch (err) {
      print(`  a smaller capacity was refused: ${(err as { details: string }).details}`);
    }
    assert.equal(await pool.get(ds, "volsize"), String(128 * MiB), "never shrinks");

    // In use: not deleted; released: set aside.
    await rejects(
      c.controller("DeleteVolume", { volume_id: vol.volume_id }),
      Code.FAILED_PRECONDITION,
    );
    await b.release();
    assert.deepEqual(await mountsBelow(pool), []);
    await c.controller("DeleteVolume", { volume_id: vol.volume_id });
    assert.equal((await tryRun("zfs", "get", "-H", "type", ds)).code, 1, "the name is free");
  },
});

// --- OpenZFS: ext4 and xfs on a zvol ----------------------------------------------------------

/** mkfs.xfs (xfsprogs 5.19 and later) refuses filesystems under 300 MiB. */
const FS_SIZE = { ext4: 64 * MiB, xfs: 320 * MiB } as const;

for (const fs of ["ext4", "xfs"] as const) {
  Deno.test({
    name:
      `block volumes: an ${fs} zvol is formatted once, keeps its files, and grows as seen from inside`,
    ignore: !onOpenZfs,
    async fn() {
      await using pool = await TestPool.create(2048);
      await using plugin = await startBlock(pool);
      const p = () => plugin;
      const c = plugin.client;
      const size = FS_SIZE[fs];
      const ds = `${pool.parent}/${fs}`;
      const vol: Volume =
        (await c.controller("CreateVolume", createRequest(fs, size, fsCapability(fs))))
          .volume;
      assert.equal(vol.volume_context.fs_type, fs);
      assert.equal(await pool.get(ds, "type"), "volume");
      assert.equal(await pool.get(ds, "volsize"), String(size));
      // The parameter asks for the same, with the capability Nomad sends for a plain spec.
      const byParameter: Volume = (await c.controller(
        "CreateVolume",
        createRequest(`${fs}-param`, size, mountCapability(), { fs_type: fs }),
      )).volume;
      assert.equal(byParameter.volume_context.fs_type, fs);
      assert.equal(await pool.get(`${ds}-param`, "type"), "volume");
      const device = await zvolDevice(ds);
      assert.deepEqual(await probe(device), {}, "not formatted before the first stage");

      const a = await claim(p, vol, "alloc-1", fsCapability(fs));
      const staged = await mountAt(a.staging);
      assert.equal(staged.fsType, fs);
      assert.equal(await resolved(staged.source), device, "the zvol is mounted at staging");
      assert.equal((await mountAt(a.target)).fsType, fs);
      const made = await probe(device);
      assert.equal(made.TYPE, fs);
      assert.ok(made.UUID, "the new filesystem has a UUID");
      const data = await patternFile(pool.dir, "data", 7, 2 * MiB);
      await Deno.mkdir(`${a.target}/db`);
      await Deno.writeFile(`${a.target}/db/table.bin`, data.data);
      await Deno.writeTextFile(`${a.target}/notes.txt`, `${fs} on a zvol\n`);
      const before = await statfsBytes(a.target);
      const stats = await c.node("NodeGetVolumeStats", {
        volume_id: vol.volume_id,
        volume_path: a.target,
      });
      const bytes = stats.usage.find((u: { unit: string }) => u.unit === "BYTES");
      assert.equal(Number(bytes?.total), before, `stats from statfs: ${JSON.stringify(stats)}`);
      await a.release();
      assert.deepEqual(await mountsBelow(pool), []);
      const first = await fsck(fs, device);
      assert.ok(first.clean, `consistent after unstage: ${first.output}`);

      // Staged again: the same filesystem (never made again), the files there.
      const b = await claim(p, vol, "alloc-2", fsCapability(fs));
      assert.equal((await probe(device)).UUID, made.UUID, "not formatted again");
      assert.deepEqual(await Deno.readFile(`${b.target}/db/table.bin`), data.data);
      assert.equal(await Deno.readTextFile(`${b.target}/notes.txt`), `${fs} on a zvol\n`);

      // Growth: volsize at the controller, the filesystem on the node, seen from inside.
      const grown = await c.controller("ControllerExpandVolume", {
        volume_id: vol.volume_id,
        capacity_range: { required_bytes: String(2 * size), limit_bytes: "0" },
        volume_capability: fsCapability(fs),
      });
      assert.equal(grown.capacity_bytes, String(2 * size));
      assert.equal(grown.node_expansion_required, true, "the filesystem grows on the node");
      assert.equal(await pool.get(ds, "volsize"), String(2 * size));
      const nodeGrown = await c.node("NodeExpandVolume", {
        volume_id: vol.volume_id,
        volume_path: b.target,
        staging_target_path: b.staging,
        capacity_range: { required_bytes: String(2 * size), limit_bytes: "0" },
        volume_capability: fsCapability(fs),
      }, SLOW_MS);
      print(`  NodeExpandVolume: ${JSON.stringify(nodeGrown)}`);
      const after = await statfsBytes(b.target);
      print(
        `  ${fs}: statfs ${before / MiB} MiB before, ${after / MiB} MiB after growing to ${
          2 * size / MiB
        } MiB`,
      );
      assert.ok(
        after - before >= 0.9 * size,
        `grew by ${(after - before) / MiB} MiB of ${size / MiB}`,
      );
      // More than the old filesystem could hold fits now.
      await sh(
        "dd",
        "if=/dev/urandom",
        `of=${b.target}/big.bin`,
        "bs=1M",
        `count=${Math.round(before / MiB)}`,
        "conv=fsync",
        "status=none",
      );
      assert.equal((await probe(device)).UUID, made.UUID);
      await b.release();
      const second = await fsck(fs, device);
      assert.ok(second.clean, `consistent after growing: ${second.output}`);
      // A restage after growth mounts the grown filesystem, as it is.
      const d = await claim(p, vol, "alloc-3", fsCapability(fs));
      assert.equal(await statfsBytes(d.target), after);
      assert.deepEqual(await Deno.readFile(`${d.target}/db/table.bin`), data.data);
      await d.release();
      // The volume asked for by parameter formats with the plain capability too.
      const e = await claim(p, byParameter, "alloc-4", mountCapability());
      assert.equal((await mountAt(e.staging)).fsType, fs);
      await e.release();
      assert.deepEqual(await mountsBelow(pool), []);
      for (const v of [vol, byParameter]) {
        await c.controller("DeleteVolume", { volume_id: v.volume_id });
      }
    },
  });
}

Deno.test({
  name:
    "block volumes: an xfs volume under mkfs.xfs's 300 MiB is refused at CreateVolume, or made big enough",
  ignore: !onOpenZfs,
  async fn() {
    await using pool = await TestPool.create(2048);
    await using plugin = await startBlock(pool);
    const c = plugin.client;
    try {
      const vol: Volume =
        (await c.controller("CreateVolume", createRequest("small", 64 * MiB, fsCapability("xfs"))))
          .volume;
      print(`  a 64 MiB xfs volume was made with ${Number(vol.capacity_bytes) / MiB} MiB`);
      const cl = await claim(() => plugin, vol, "alloc-1", fsCapability("xfs"));
      assert.equal((await mountAt(cl.staging)).fsType, "xfs");
      await cl.release();
    } catch (err) {
      const e = err as { code: number; details: string };
      assert.ok(
        e.code === Code.OUT_OF_RANGE || e.code === Code.INVALID_ARGUMENT,
        `code ${e.code}: ${e.details ?? err}`,
      );
      assert.match(e.details, /xfs/);
      print(`  refused: ${e.details}`);
      assert.equal(
        (await tryRun("zfs", "get", "-H", "type", `${pool.parent}/small`)).code,
        1,
        "nothing made",
      );
    }
  },
});

// --- OpenZFS: snapshots, clones, restores; delete and undo ------------------------------------

Deno.test({
  name:
    "block volumes: snapshots, clones and restores of zvols keep their data; an xfs clone mounts beside its source",
  ignore: !onOpenZfs,
  async fn() {
    await using pool = await TestPool.create(2048);
    await using plugin = await startBlock(pool);
    const p = () => plugin;
    const c = plugin.client;
    const one = await patternFile(pool.dir, "one", 1);
    const two = await patternFile(pool.dir, "two", 2);

    const raw: Volume =
      (await c.controller("CreateVolume", createRequest("raw", 64 * MiB, blockCapability())))
        .volume;
    const a = await claim(p, raw, "alloc-1", blockCapability());
    await ddWrite(one.path, a.target, 8);
    const snap = (await c.controller("CreateSnapshot", {
      source_volume_id: raw.volume_id,
      name: "s1",
      parameters: {},
    }))
      .snapshot;
    assert.equal(snap.source_volume_id, raw.volume_id);
    assert.equal(snap.ready_to_use, true);
    const listed = await c.controller("ListSnapshots", { source_volume_id: raw.volume_id });
    assert.deepEqual(
      listed.entries.map((e: { snapshot: { snapshot_id: string } }) => e.snapshot.snapshot_id),
      [
        snap.snapshot_id,
      ],
    );
    await ddWrite(two.path, a.target, 8);

    // Restored from the snapshot: the data of then. Cloned from the volume: the data of now.
    const restored: Volume = (await c.controller(
      "CreateVolume",
      createRequest("restored", 64 * MiB, blockCapability(), {}, {
        volume_content_source: { snapshot: { snapshot_id: snap.snapshot_id } },
      }),
    )).volume;
    const cloned: Volume = (await c.controller(
      "CreateVolume",
      createRequest("cloned", 64 * MiB, blockCapability(), {}, {
        volume_content_source: { volume: { volume_id: raw.volume_id } },
      }),
    )).volume;
    for (const [v, want, what] of [[restored, one, "restored"], [cloned, two, "cloned"]] as const) {
      assert.equal(v.volume_context.fs_type, "block");
      assert.equal(await pool.get(`${pool.parent}/${what}`, "type"), "volume");
      const cl = await claim(p, v, `alloc-${what}`, blockCapability());
      assert.notEqual(await rdevOf(cl.target), await rdevOf(a.target), `${what} is its own device`);
      assert.deepEqual(await ddRead(cl.target, 8, MiB, pool.dir), want.data, what);
      await ddWrite(one.path, cl.target, 16);
      await cl.release();
    }
    assert.deepEqual(
      await ddRead(a.target, 8, MiB, pool.dir),
      two.data,
      "the source is untouched by its copies",
    );
    // A restore of another kind is refused: the snapshot is of a raw volume.
    await refusedWith(
      c.controller(
        "CreateVolume",
        createRequest("as-ext4", 64 * MiB, fsCapability("ext4"), {}, {
          volume_content_source: { snapshot: { snapshot_id: snap.snapshot_id } },
        }),
      ),
      REFUSED,
      "a raw volume's snapshot restored as ext4",
    );
    assert.equal((await tryRun("zfs", "get", "-H", "type", `${pool.parent}/as-ext4`)).code, 1);
    await a.release();

    // xfs refuses a second filesystem with the same UUID: a clone is staged beside its source.
    const x: Volume =
      (await c.controller("CreateVolume", createRequest("x", FS_SIZE.xfs, fsCapability("xfs"))))
        .volume;
    const xa = await claim(p, x, "alloc-x", fsCapability("xfs"));
    await Deno.writeTextFile(`${xa.target}/hello.txt`, "from the source\n");
    await sh("sync");
    const xsnap = (await c.controller("CreateSnapshot", {
      source_volume_id: x.volume_id,
      name: "xs",
      parameters: {},
    }))
      .snapshot;
    const xc: Volume = (await c.controller(
      "CreateVolume",
      createRequest("xc", FS_SIZE.xfs, fsCapability("xfs"), {}, {
        volume_content_source: { snapshot: { snapshot_id: xsnap.snapshot_id } },
      }),
    )).volume;
    const xb = await claim(p, xc, "alloc-xc", fsCapability("xfs"));
    assert.equal(await Deno.readTextFile(`${xb.target}/hello.txt`), "from the source\n");
    await Deno.writeTextFile(`${xb.target}/hello.txt`, "from the clone\n");
    assert.equal(await Deno.readTextFile(`${xa.target}/hello.txt`), "from the source\n");
    await xb.release();
    await xa.release();
    assert.deepEqual(await mountsBelow(pool), []);

    // Snapshots go before their volume; clones do not hold their origin's delete back.
    await rejects(
      c.controller("DeleteVolume", { volume_id: raw.volume_id }),
      Code.FAILED_PRECONDITION,
      /snapshot/,
    );
    await c.controller("DeleteSnapshot", { snapshot_id: snap.snapshot_id });
    await c.controller("DeleteSnapshot", { snapshot_id: xsnap.snapshot_id });
    for (const v of [raw, restored, cloned, x, xc]) {
      await c.controller("DeleteVolume", { volume_id: v.volume_id });
    }
    const live = (await sh("zfs", "list", "-H", "-r", "-t", "all", "-o", "name", pool.parent))
      .split("\n")
      .filter((n) => n !== "" && n !== pool.parent && !/\/\.deleted-|@\.deleted-/.test(n));
    assert.deepEqual(live, [], "only what was set aside is left");
  },
});

Deno.test({
  name:
    "block volumes: a deleted zvol is set aside, marked, gives its reservation back, and undelete brings it back reserved with its data (refused, unchanged, without room)",
  ignore: !onOpenZfs,
  async fn() {
    await using pool = await TestPool.create(2048);
    await using plugin = await startBlock(pool);
    const p = () => plugin;
    const c = plugin.client;
    const one = await patternFile(pool.dir, "one", 3);
    const raw: Volume =
      (await c.controller("CreateVolume", createRequest("raw", 64 * MiB, blockCapability())))
        .volume;
    const e4: Volume =
      (await c.controller("CreateVolume", createRequest("e4", 64 * MiB, fsCapability("ext4"))))
        .volume;
    const a = await claim(p, raw, "alloc-1", blockCapability());
    await ddWrite(one.path, a.target, 2);
    const b = await claim(p, e4, "alloc-2", fsCapability("ext4"));
    await Deno.writeTextFile(`${b.target}/kept.txt`, "kept\n");
    const uuid = (await probe(await zvolDevice(`${pool.parent}/e4`))).UUID;
    await rejects(
      c.controller("DeleteVolume", { volume_id: e4.volume_id }),
      Code.FAILED_PRECONDITION,
      /in use/,
    );
    await a.release();
    await b.release();

    // What each zvol reserves, which the delete gives back to the pool at once (docs/deleting.md).
    const reserved = new Map<string, string>();
    const hidden = new Map<string, string>();
    const available = async () => Number(await pool.get(pool.parent, "available"));
    for (const name of ["raw", "e4"]) {
      const dataset = `${pool.parent}/${name}`;
      reserved.set(name, await pool.get(dataset, "refreservation"));
      assert.ok(Number(reserved.get(name)) > 64 * MiB, `${name} is reserved in full`);
      const unused = Number(await pool.get(dataset, "usedbyrefreservation"));
      const before = await available();
      await c.controller("DeleteVolume", { volume_id: `${name}@${NODE}` });
      assert.equal((await tryRun("zfs", "get", "-H", "type", dataset)).code, 1);
      const aside =
        (await sh("zfs", "list", "-H", "-d", "1", "-t", "volume", "-o", "name", pool.parent)).split(
          "\n",
        )
          .filter((n) => n.startsWith(`${pool.parent}/.deleted-`) && n.endsWith(`-${name}`));
      assert.equal(aside.length, 1, `${name} is set aside: ${aside}`);
      hidden.set(name, aside[0]!);
      assert.equal(await pool.get(aside[0]!, "org.zfs-csi:deleted-name"), dataset);
      assert.match(await pool.get(aside[0]!, "org.zfs-csi:deleted-at"), /^\d+$/);
      assert.equal(await pool.get(aside[0]!, "org.zfs-csi:managed"), "yes");
      assert.equal(await pool.get(aside[0]!, "refreservation"), "0");
      assert.equal(
        await pool.get(aside[0]!, "org.zfs-csi:deleted-refreservation"),
        reserved.get(name),
      );
      const after = await available();
      print(
        `  delete ${name}: reserved ${reserved.get(name)}, of it unused ${unused}; ` +
          `available ${before} -> ${after}`,
      );
      assert.ok(after - before >= unused * 0.9, `the pool's space came back at ${name}'s delete`);
    }
    const listed = await c.controller("ListVolumes", {});
    assert.deepEqual(listed.entries, [], "Nomad sees no deleted volume");

    const flags = [
      "--parent-dataset",
      pool.parent,
      "--node-id",
      NODE,
      "--stage-publish-base-dir",
      plugin.baseDir,
    ];
    // With no room left for its reservation, undelete refuses and the zvol stays set aside as it
    // was; with room again, it comes back reserved in full.
    const filler = `${pool.pool}/filler`;
    await sh("zfs", "create", "-o", `refreservation=${(await available()) - 8 * MiB}`, filler);
    const refused = await runZfsCsi(pool.dir, ["undelete", ...flags, "raw"]);
    print(`  undelete raw without room: ${refused.code} ${refused.stderr.trim()}`);
    assert.equal(refused.code, 1);
    assert.match(refused.stderr, /The pool has no room to reserve \d+ bytes for .* unchanged/);
    const rawAside = hidden.get("raw")!;
    assert.equal(await pool.get(rawAside, "type"), "volume");
    assert.equal(await pool.get(rawAside, "refreservation"), "0");
    assert.equal(
      await pool.get(rawAside, "org.zfs-csi:deleted-refreservation"),
      reserved.get("raw"),
    );
    assert.match(await pool.get(rawAside, "org.zfs-csi:deleted-at"), /^\d+$/);
    assert.equal((await tryRun("zfs", "get", "-H", "type", `${pool.parent}/raw`)).code, 1);
    await destroyRetrying(filler);
    for (const name of ["raw", "e4"]) {
      const r = await runZfsCsi(pool.dir, ["undelete", ...flags, name]);
      assert.equal(r.code, 0, `undelete ${name}: ${r.stdout}${r.stderr}`);
      print(`  undelete ${name}: ${r.stdout.trim()}`);
      const dataset = `${pool.parent}/${name}`;
      assert.equal(await pool.get(dataset, "type"), "volume");
      assert.equal(await pool.get(dataset, "org.zfs-csi:deleted-at"), "-");
      assert.equal(await pool.get(dataset, "org.zfs-csi:deleted-refreservation"), "-");
      assert.equal(await pool.get(dataset, "refreservation"), reserved.get(name), "reserved again");
    }
    const again = await claim(p, raw, "alloc-3", blockCapability());
    assert.deepEqual(
      await ddRead(again.target, 2, MiB, pool.dir),
      one.data,
      "the raw volume's data is back",
    );
    await again.release();
    const e4again = await claim(p, e4, "alloc-4", fsCapability("ext4"));
    assert.equal(await Deno.readTextFile(`${e4again.target}/kept.txt`), "kept\n");
    assert.equal(
      (await probe(await zvolDevice(`${pool.parent}/e4`))).UUID,
      uuid,
      "the same filesystem, not made again",
    );
    await e4again.release();
  },
});

// --- OpenZFS: a crash while formatting --------------------------------------------------------

/** Processes whose command line names mkfs and `device` (or its /dev/zvol link), from pgrep. */
async function mkfsProcesses(device: string, link: string): Promise<number[]> {
  const r = await tryRun("pgrep", "-a", "-f", "mkfs|mke2fs");
  return r.stdout.split("\n").filter((l) => l.includes(device) || l.includes(link))
    .map((l) => Number(l.split(" ")[0])).filter((pid) => pid > 0);
}

for (const fs of ["ext4", "xfs"] as const) {
  Deno.test({
    name:
      `block volumes: a SIGKILL of the plugin and mkfs.${fs} while formatting: the next stage neither formats again nor mounts a half-made filesystem`,
    ignore: !onOpenZfs,
    async fn() {
      await using pool = await TestPool.create(2048);
      const args = ["--allow-sparse-zvols"];
      let plugin = await startBlock(pool, args);
      try {
        // Big and sparse, so mkfs takes long enough to be caught (it discards and writes
        // metadata across the whole device) while the pool holds little.
        let caught: { volume: Volume; device: string; pids: number[]; cl: BlockClaim } | undefined;
        for (let attempt = 0; attempt < 3 && caught === undefined; attempt++) {
          const name = `big${attempt}`;
          const volume: Volume = (await plugin.client.controller(
            "CreateVolume",
            createRequest(name, (16 << attempt) * 1024 * MiB, fsCapability(fs), { sparse: "true" }),
          )).volume;
          assert.equal(await pool.get(`${pool.parent}/${name}`, "refreservation"), "0", "sparse");
          const link = `/dev/zvol/${pool.parent}/${name}`;
          const device = await zvolDevice(`${pool.parent}/${name}`);
          const current = plugin;
          const cl = await claimOf(() => current, volume, "alloc-1", fsCapability(fs));
          let done = false;
          const staging = cl.stage().then(() => "staged", (e) => `failed: ${e.details ?? e}`)
            .finally(() => done = true);
          let pids: number[] = [];
          while (!done && pids.length === 0) pids = await mkfsProcesses(device, link);
          if (pids.length > 0) {
            // As a container's end takes them: the plugin, then what it runs.
            await plugin.stop("SIGKILL");
            for (const pid of pids) {
              try {
                Deno.kill(pid, "SIGKILL");
              } catch {
                // Ended meanwhile.
              }
            }
            caught = { volume, device, pids, cl };
            print(
              `  attempt ${attempt}: killed the plugin and mkfs (${pids}) while formatting ${device}`,
            );
          } else {
            print(
              `  attempt ${attempt}: mkfs ended before it was seen (${await staging}); a bigger volume`,
            );
            await cl.unstage();
          }
          await staging;
        }
        assert.ok(caught, "mkfs was caught running in one of three attempts");
        // Gone for sure before looking at the device.
        for (const pid of caught.pids) {
          for (let i = 0; i < 200 && (await tryRun("kill", "-0", String(pid))).code === 0; i++) {
            await new Promise((r) => setTimeout(r, 50));
          }
        }
        const left = await probe(caught.device);
        const leftCheck = left.TYPE
          ? await fsck(fs, caught.device)
          : { clean: false, output: "no signature" };
        print(
          `  left on the device: ${JSON.stringify(left)}; fsck: ${
            leftCheck.clean ? "clean" : "not clean"
          }`,
        );

        plugin = await startBlock(pool, args);
        const current = plugin;
        const cl = await claimOf(() => current, caught.volume, "alloc-1", fsCapability(fs));
        await retryWhileBusy(() => cl.stage(), 60_000, 500);
        await cl.publish();
        assert.equal((await mountAt(cl.staging)).fsType, fs);
        const now = await probe(caught.device);
        assert.equal(now.TYPE, fs);
        // A filesystem mkfs finished before the kill was never mounted and holds nothing: made
        // again or adopted, both are safe. What counts: what is mounted is whole, and once a
        // stage has mounted it, it is never made again (below).
        print(
          `  the next stage ${now.UUID === left.UUID ? "adopted" : "made"} the filesystem ` +
            `(UUID ${left.UUID ?? "none"} after the kill, ${now.UUID} now)`,
        );
        await Deno.writeTextFile(`${cl.target}/after.txt`, "after the crash\n");
        await cl.release();
        const check = await fsck(fs, caught.device);
        assert.ok(check.clean, `what the stage mounted is a whole filesystem: ${check.output}`);
        const again = await claim(() => current, caught.volume, "alloc-2", fsCapability(fs));
        assert.equal(await Deno.readTextFile(`${again.target}/after.txt`), "after the crash\n");
        assert.equal((await probe(caught.device)).UUID, now.UUID, "and it is never made again");
        await again.release();
      } finally {
        await plugin.stop("SIGKILL");
      }
    },
  });
}

// --- OpenZFS: hostile input -------------------------------------------------------------------

Deno.test({
  name: "block volumes: hostile input never formats, mounts or exposes what the volume is not",
  ignore: !onOpenZfs,
  async fn(t) {
    await using pool = await TestPool.create(2048);
    await using plugin = await startBlock(pool);
    const p = () => plugin;
    const c = plugin.client;
    const one = await patternFile(pool.dir, "one", 11);
    const raw: Volume =
      (await c.controller("CreateVolume", createRequest("raw", 64 * MiB, blockCapability())))
        .volume;
    const e4: Volume =
      (await c.controller("CreateVolume", createRequest("e4", 64 * MiB, fsCapability("ext4"))))
        .volume;
    const plain: Volume =
      (await c.controller("CreateVolume", createRequest("plain", 64 * MiB, mountCapability())))
        .volume;
    const rawDevice = await zvolDevice(`${pool.parent}/raw`);
    const e4Device = await zvolDevice(`${pool.parent}/e4`);
    {
      const w = await claim(p, raw, "alloc-w", blockCapability());
      await ddWrite(one.path, w.target, 0);
      await w.release();
    }
    // A zvol outside the parent dataset, with a pattern and no filesystem.
    const outside = `${pool.pool}/outside`;
    await sh("zfs", "create", "-V", String(64 * MiB), outside);
    const outsideDevice = await zvolDevice(outside);
    await ddWrite(one.path, outsideDevice, 0);
    const poolBefore = await state(pool);

    /** What no refused call may change: the raw pattern, e4 and outside unformatted, no mounts. */
    const untouched = async (what: string) => {
      assert.deepEqual(
        await ddRead(rawDevice, 0, MiB, pool.dir),
        one.data,
        `${what}: the raw volume's data`,
      );
      assert.deepEqual(await probe(rawDevice), {}, `${what}: no filesystem made on the raw volume`);
      assert.deepEqual(
        await probe(e4Device),
        {},
        `${what}: the ext4 volume not formatted by a refused call`,
      );
      assert.deepEqual(
        await ddRead(outsideDevice, 0, MiB, pool.dir),
        one.data,
        `${what}: the outside zvol`,
      );
      assert.deepEqual(await probe(outsideDevice), {}, `${what}: the outside zvol not formatted`);
      assert.deepEqual(await mountsBelow(pool), [], `${what}: nothing mounted`);
      assert.equal(await state(pool), poolBefore, `${what}: the pool as it was`);
    };

    const cases: [string, Volume, Capability, Record<string, string> | undefined][] = [
      ["a raw volume staged as a filesystem (no fs_type)", raw, mountCapability(), undefined],
      ["a raw volume staged as ext4", raw, fsCapability("ext4"), undefined],
      ["a raw volume staged as ext4, its volume_context saying ext4", raw, fsCapability("ext4"), {
        fs_type: "ext4",
      }],
      ["an ext4 volume staged as a block device", e4, blockCapability(), undefined],
      ["an ext4 volume staged as xfs", e4, fsCapability("xfs"), undefined],
      ["an ext4 volume staged as xfs, its volume_context saying xfs", e4, fsCapability("xfs"), {
        fs_type: "xfs",
      }],
      ["a ZFS filesystem volume staged as a block device", plain, blockCapability(), undefined],
      [
        "a ZFS filesystem volume staged as ext4, its volume_context saying ext4",
        plain,
        fsCapability("ext4"),
        {
          fs_type: "ext4",
        },
      ],
    ];
    let n = 0;
    for (const [what, v, cap, context] of cases) {
      await t.step(what, async () => {
        const cl = await claimOf(p, v, `alloc-h${n++}`, cap, context ? { context } : {});
        const details = await refusedWith(cl.stage(), REFUSED, what);
        print(`    ${details}`);
        await untouched(what);
        const validated = await c.controller("ValidateVolumeCapabilities", {
          volume_id: v.volume_id,
          volume_capabilities: [cap],
        });
        assert.equal(
          validated.confirmed,
          null,
          `${what}: not confirmed by ValidateVolumeCapabilities`,
        );
      });
    }

    await t.step(
      "a block claim published from a staging path of another volume is refused",
      async () => {
        const good = await claimOf(p, raw, "alloc-g", blockCapability());
        await good.stage();
        const other = await claimOf(p, e4, "alloc-o", blockCapability());
        await refusedWith(
          c.node("NodePublishVolume", {
            volume_id: e4.volume_id,
            volume_capability: blockCapability(),
            volume_context: e4.volume_context,
            staging_target_path: good.staging,
            target_path: other.target,
            readonly: false,
          }),
          [...REFUSED, Code.NOT_FOUND],
          "publish e4 from raw's staging path",
        );
        assert.equal(await exists(other.target), false, "no target made");
        await good.unstage();
        await untouched("publish from another volume's staging path");
      },
    );

    await t.step(
      "a /dev/zvol link swapped to a zvol outside the parent dataset is not followed",
      async () => {
        await sh("udevadm", "settle");
        const links = [`/dev/zvol/${pool.parent}/raw`, `/dev/zvol/${pool.parent}/e4`];
        try {
          for (const link of links) {
            await sh("ln", "-sfn", outsideDevice, link);
          }
          // The block claim: refused, or the device published is raw's own, never the outside one.
          const b = await claimOf(p, raw, "alloc-s1", blockCapability());
          let published = false;
          try {
            await b.stage();
            await b.publish();
            published = true;
          } catch (err) {
            print(`    raw with a swapped link: ${(err as { details: string }).details}`);
          }
          if (published) {
            const rdev = await rdevOf(b.target);
            assert.notEqual(rdev, await rdevOf(outsideDevice), "the outside zvol is not published");
            assert.equal(rdev, await rdevOf(rawDevice), "the raw volume's own device is");
            print("    raw with a swapped link: published its own device");
            await b.release();
          }
          // The filesystem claim: the outside zvol is never formatted nor mounted.
          const f = await claimOf(p, e4, "alloc-s2", fsCapability("ext4"));
          let staged = false;
          try {
            await f.stage();
            staged = true;
          } catch (err) {
            print(`    e4 with a swapped link: ${(err as { details: string }).details}`);
          }
          assert.deepEqual(await probe(outsideDevice), {}, "the outside zvol is not formatted");
          assert.deepEqual(await ddRead(outsideDevice, 0, MiB, pool.dir), one.data, "nor written");
          if (staged) {
            const m = await mountAt(f.staging);
            assert.equal(
              await resolved(m.source),
              e4Device,
              "what is mounted is e4's own device",
            );
            print("    e4 with a swapped link: formatted and mounted its own device");
            await f.unstage();
          }
          for (const link of links) {
            assert.equal(
              await resolved(link),
              outsideDevice,
              "the swap held during the calls",
            );
          }
        } finally {
          for (const [link, device] of [[links[0]!, rawDevice], [links[1]!, e4Device]] as const) {
            await sh("ln", "-sfn", device, link);
          }
        }
        assert.deepEqual(await mountsBelow(pool), []);
      },
    );

    for (const v of [raw, e4, plain]) {
      await c.controller("DeleteVolume", { volume_id: v.volume_id });
    }
    await destroyRetrying(outside);
  },
});
