/**
 * The node's side of zvols (volume_kinds/node_zvol.ts) on a model host: a pool (FakePool), a
 * mount table, blkid/mkfs/wipefs that change the device's signature, and a device probe for
 * /dev/zvol/<dataset> → /dev/zd0. zfs-fuse has no zvols: the real devices and tools are proven
 * in the OpenZFS VM (tests/integration/block_volumes_test.ts).
 */

import assert from "node:assert/strict";
import { Code } from "../errors.ts";
import { assertRejectsCsi } from "../../tests/support/assert_errors.ts";
import { FakePool } from "../../tests/support/fake_pool.ts";
import { BlockHost, DEVICE, EXT4, XFS } from "../../tests/support/fake_block_host.ts";
import { blockCap, fakeNode, fakeServices, fsCap } from "../../tests/support/service_harness.ts";
import { BlockTools } from "../block/tools.ts";
import type { VolumeCapability } from "./types.ts";

const PARENT = "tank/nomad";
const DB = `${PARENT}/db`;
const GiB = 1024 * 1024 * 1024;
async function setup(
  content: "block" | "ext4" | "xfs",
  opts: { flags?: string[]; zfsFuse?: boolean; props?: Record<string, string> } = {},
) {
  const base = await Deno.makeTempDir({ prefix: "zfs-csi-zvol-" });
  let block: BlockHost | undefined;
  const parts = fakeServices({
    parent: PARENT,
    flags: ["--stage-publish-base-dir", base, ...opts.flags ?? ["--block-volumes"]],
    before: (runner) => {
      block = new BlockHost(runner, DB);
    },
    host: (runner) =>
      new FakePool(runner).add(PARENT).add(DB, {
        type: "volume",
        "org.zfs-csi:managed": "yes",
        "org.zfs-csi:fs-type": content,
        volsize: String(GiB),
        ...opts.props,
      }).serveCreates(runner, opts.zfsFuse ? {} : { version: "zfs-2.2.2-1" }),
  });
  const { runner, host: pool, log } = parts;
  const host = block!;
  const node = fakeNode(parts, {
    blockTools: new BlockTools(runner, { timeoutMs: 1000, log }),
    deviceProbe: host.probe,
    statfs: () =>
      Promise.resolve({ bsize: 4096, blocks: 1000, bfree: 600, bavail: 500, files: 64, ffree: 60 }),
  });
  const staging = `${base}/staging/db/rw-file-system-single-node-writer`;
  const target = `${base}/per-alloc/a1/db/rw-file-system-single-node-writer`;
  await Deno.mkdir(staging, { recursive: true });
  await Deno.mkdir(`${base}/per-alloc/a1/db`, { recursive: true });
  return {
    base,
    runner,
    pool,
    host,
    node,
    staging,
    target,
    [Symbol.asyncDispose]: async () => {
      runner.assertNoUnexpected();
      await Deno.remove(base, { recursive: true });
    },
  };
}

function fsTypeCap(fsType: string): VolumeCapability {
  const cap = fsCap();
  return { ...cap, mount: { ...cap.mount!, fs_type: fsType } };
}

type H = Awaited<ReturnType<typeof setup>>;

const stage = (h: H, cap: VolumeCapability, ctx: Record<string, string> = {}) =>
  h.node.NodeStageVolume({
    volume_id: "db@n1",
    staging_target_path: h.staging,
    volume_capability: cap,
    volume_context: ctx,
    publish_context: {},
    secrets: {},
  });
const publish = (h: H, cap: VolumeCapability, readonly = false, ctx: Record<string, string> = {}) =>
  h.node.NodePublishVolume({
    volume_id: "db@n1",
    staging_target_path: h.staging,
    target_path: h.target,
    volume_capability: cap,
    volume_context: ctx,
    publish_context: {},
    readonly,
    secrets: {},
  });
const unpublish = (h: H) =>
  h.node.NodeUnpublishVolume({ volume_id: "db@n1", target_path: h.target });
const unstage = (h: H) =>
  h.node.NodeUnstageVolume({ volume_id: "db@n1", staging_target_path: h.staging });

/** The block tools run, in order. */
const tools = (h: H) =>
  h.runner.argvs.filter((a) => /^(blkid|wipefs|mkfs\.|resize2fs|xfs_growfs)/.test(a[0]!));

Deno.test("NodeStage of ext4 on a blank zvol records begun, formats, records done, then mounts at staging", async () => {
  await using h = await setup("ext4");
  await stage(h, fsTypeCap("ext4"), { fs_type: "ext4" });
  const sets = h.runner.argvs.filter((a) => a[1] === "set" || a[0] === "mkfs.ext4")
    .map((a) => a[0] === "zfs" ? a[2]!.replace(/=\d+$/, "=<now>") : a[0]!);
  assert.deepEqual(sets, [
    "org.zfs-csi:attached=n1",
    "org.zfs-csi:staged-at=<now>",
    "org.zfs-csi:format=begun",
    "mkfs.ext4",
    "org.zfs-csi:format=done",
  ]);
  assert.deepEqual(h.host.mounts, [{
    source: DEVICE,
    mountPoint: h.staging,
    fsType: "ext4",
    options: "nosuid,nodev",
  }]);
  // Again: nothing formatted, nothing mounted twice.
  await stage(h, fsTypeCap("ext4"), { fs_type: "ext4" });
  assert.equal(tools(h).filter((a) => a[0] === "mkfs.ext4").length, 1);
  assert.equal(h.host.mounts.length, 1);
});

Deno.test("NodeStage never formats a filesystem it finished, even after unstage, and grows it on expand", async () => {
  await using h = await setup("ext4", { props: { "org.zfs-csi:format": "done" } });
  h.host.signature = EXT4;
  await stage(h, fsCap());
  await unstage(h);
  await stage(h, fsCap());
  assert.deepEqual(tools(h).map((a) => a[0]), ["blkid", "blkid"]);
  await publish(h, fsCap());
  assert.deepEqual(
    await h.node.NodeExpandVolume({
      volume_id: "db@n1",
      volume_path: h.target,
      staging_target_path: h.staging,
      capacity_range: { required_bytes: String(GiB), limit_bytes: "0" },
      volume_capability: null,
      secrets: {},
    }),
    { capacity_bytes: String(GiB) },
  );
  assert.deepEqual(tools(h).at(-1), ["resize2fs", DEVICE]);
});

Deno.test("NodeStage after a SIGKILL during mkfs: the half-made filesystem is wiped and made again", async () => {
  // The record says begun: the plugin died after it, with mkfs half done (or done, unrecorded).
  await using h = await setup("xfs", { props: { "org.zfs-csi:format": "begun" } });
  h.host.signature = XFS;
  await stage(h, fsTypeCap("xfs"), { fs_type: "xfs" });
  assert.deepEqual(tools(h).map((a) => a[0]), ["blkid", "wipefs", "mkfs.xfs"]);
  assert.equal(h.pool.value(DB, "org.zfs-csi:format"), "done");
  assert.equal(h.host.mounts.at(-1)?.source, DEVICE);
  // xfs is mounted nouuid: a clone (its source's UUID) mounts beside its source.
  assert.equal(h.host.mounts.at(-1)?.options, "nosuid,nodev,nouuid");
});

Deno.test("NodeStage refuses to format over a filesystem it did not make, or over a finished one that changed", async () => {
  await using h = await setup("ext4");
  h.host.signature = XFS;
  await assertRejectsCsi(
    stage(h, fsTypeCap("ext4")),
    Code.FAILED_PRECONDITION,
    /never formatted over/,
  );
  h.pool.setValue(DB, "org.zfs-csi:format", "done");
  h.host.signature = undefined;
  await assertRejectsCsi(
    stage(h, fsTypeCap("ext4")),
    Code.FAILED_PRECONDITION,
    /not formatted again/,
  );
  assert.deepEqual(tools(h).map((a) => a[0]), ["blkid", "blkid"]);
  assert.deepEqual(h.host.mounts, []);
});

Deno.test("A raw zvol: stage waits for the device, publish binds it onto a file, unpublish and unstage undo it", async () => {
  await using h = await setup("block");
  await stage(h, blockCap(), { fs_type: "block" });
  assert.equal(h.pool.value(DB, "org.zfs-csi:attached"), "n1");
  assert.deepEqual(h.host.mounts, []);
  await publish(h, blockCap(), false, { fs_type: "block" });
  assert.ok((await Deno.lstat(h.target)).isFile);
  const binds = h.runner.argvs.filter((a) => a[0] === "mount" && a.length > 1);
  assert.deepEqual(binds, [["mount", "-c", "--bind", DEVICE, h.target]]);
  // Again: nothing more.
  await publish(h, blockCap(), false, { fs_type: "block" });
  assert.equal(h.runner.argvs.filter((a) => a[0] === "mount" && a.length > 1).length, 1);
  assert.deepEqual(
    await h.node.NodeGetVolumeStats({
      volume_id: "db@n1",
      volume_path: h.target,
      staging_target_path: h.staging,
    }),
    {
      usage: [{ unit: "BYTES", total: GiB }],
      volume_condition: { abnormal: false, message: "Volume is healthy" },
    },
  );
  await unpublish(h);
  await assert.rejects(Deno.lstat(h.target), Deno.errors.NotFound);
  assert.deepEqual(h.host.mounts, []);
  await unstage(h);
  assert.equal(h.pool.value(DB, "org.zfs-csi:attached"), undefined);
});

Deno.test("NodePublish of a raw zvol refuses a read-only claim: a read-only bind of a device node does not stop writes", async () => {
  await using h = await setup("block");
  await stage(h, blockCap(), { fs_type: "block" });
  const before = h.runner.argvs.length;
  await assertRejectsCsi(
    publish(h, blockCap(), true, { fs_type: "block" }),
    Code.INVALID_ARGUMENT,
    /read-only.*device/,
  );
  assert.deepEqual(h.runner.argvs.slice(before).filter((a) => a[0] === "mount"), []);
  await assert.rejects(Deno.lstat(h.target), Deno.errors.NotFound);
  await unstage(h);
});

Deno.test("NodeStage and NodePublish refuse a capability or context that does not fit the zvol", async () => {
  await using h = await setup("ext4");
  await assertRejectsCsi(stage(h, blockCap()), Code.INVALID_ARGUMENT, /holds ext4/);
  await assertRejectsCsi(stage(h, fsTypeCap("xfs")), Code.INVALID_ARGUMENT, /holds ext4/);
  await assertRejectsCsi(
    stage(h, fsCap(), { fs_type: "block" }),
    Code.INVALID_ARGUMENT,
    /context says fs_type "block"/,
  );
  await assertRejectsCsi(publish(h, blockCap()), Code.INVALID_ARGUMENT, /holds ext4/);
  assert.deepEqual(tools(h), []);
  assert.deepEqual(h.host.mounts, []);
  assert.equal(h.pool.value(DB, "org.zfs-csi:attached"), undefined);
});

Deno.test("NodeStage of a raw zvol refuses a mount capability and a device link leading elsewhere", async () => {
  await using h = await setup("block");
  await assertRejectsCsi(stage(h, fsCap()), Code.INVALID_ARGUMENT, /raw zvol/);
  h.host.link = "/dev/sda";
  await assertRejectsCsi(
    stage(h, blockCap()),
    Code.FAILED_PRECONDITION,
    /leads to "\/dev\/sda", which is not a zvol's block device/,
  );
  h.host.link = undefined;
  await assertRejectsCsi(stage(h, blockCap()), Code.UNAVAILABLE, /did not appear within 30 s/);
  assert.deepEqual(h.host.mounts, []);
});

Deno.test("NodeStage of a zvol without --block-volumes, or on zfs-fuse, is refused saying why", async () => {
  {
    await using h = await setup("block", { flags: [] });
    await assertRejectsCsi(stage(h, blockCap()), Code.INVALID_ARGUMENT, /--block-volumes/);
    assert.deepEqual(h.runner.argvs, []);
  }
  {
    await using h = await setup("block", { zfsFuse: true });
    await assertRejectsCsi(
      stage(h, blockCap()),
      Code.INVALID_ARGUMENT,
      /this node's zfs cannot make zvols \(zfs-fuse/,
    );
    assert.deepEqual(h.runner.argvs, [["zfs", "version"]]);
  }
});

Deno.test("NodePublish of a raw zvol not staged here is refused", async () => {
  await using h = await setup("block");
  await assertRejectsCsi(
    publish(h, blockCap()),
    Code.FAILED_PRECONDITION,
    /not staged on this node/,
  );
});

Deno.test("NodeUnstage of a raw zvol keeps the attached mark while its device is still bound at another usage's target", async () => {
  await using h = await setup("block");
  await stage(h, blockCap(), { fs_type: "block" });
  await publish(h, blockCap(), false, { fs_type: "block" });
  // Nomad's other usage (ro vs rw) stages at its own path: this unstage is of that one.
  const other = `${h.base}/staging/db/ro-block-device-single-node-reader-only`;
  await Deno.mkdir(other, { recursive: true });
  await h.node.NodeUnstageVolume({ volume_id: "db@n1", staging_target_path: other });
  assert.equal(h.pool.value(DB, "org.zfs-csi:attached"), "n1");
  await unpublish(h);
  await unstage(h);
  assert.equal(h.pool.value(DB, "org.zfs-csi:attached"), undefined);
});

Deno.test("NodeStage never formats a device that is mounted elsewhere on the node, whatever the record says", async () => {
  await using h = await setup("ext4", { props: { "org.zfs-csi:format": "begun" } });
  h.host.signature = EXT4;
  h.host.mounts.push({ source: DEVICE, mountPoint: "/mnt/by-hand", fsType: "ext4", options: "rw" });
  await assertRejectsCsi(
    stage(h, fsTypeCap("ext4")),
    Code.FAILED_PRECONDITION,
    /mounted elsewhere/,
  );
  assert.deepEqual(tools(h).map((a) => a[0]), ["blkid"]);
});

Deno.test("NodeStage and NodePublish refuse a /dev/zvol link swapped to a zvol of another dataset: nothing formatted, mounted or bound", async () => {
  {
    await using h = await setup("ext4");
    h.host.zvolOfDevice = "tank/outside";
    await assertRejectsCsi(stage(h, fsTypeCap("ext4")), Code.FAILED_PRECONDITION, /tank\/outside/);
    assert.deepEqual(tools(h), []);
    assert.deepEqual(h.host.mounts, []);
  }
  {
    await using h = await setup("block");
    await stage(h, blockCap(), { fs_type: "block" });
    h.host.zvolOfDevice = "tank/nomad/other";
    await assertRejectsCsi(
      publish(h, blockCap(), false, { fs_type: "block" }),
      Code.FAILED_PRECONDITION,
      /tank\/nomad\/other/,
    );
    assert.deepEqual(h.host.bound, new Set());
    await assert.rejects(Deno.lstat(h.target), Deno.errors.NotFound);
  }
});
