/**
 * NodeStage, NodeUnstage and NodeExpandVolume of zvols that follow their job
 * (volume_kinds/node_follow_zvol.ts over src/follow/mover.ts and node_zvol.ts), on a model pool
 * (FakePool: a zvol refuses filesystem-only properties and `zfs unmount` as OpenZFS does), a
 * model mount table and block tools, a model `zfs receive` and the in-memory store. Shown: the
 * first stage makes the zvol read-only and opens it only after its proof; a stage receives the
 * head's chain in full (into a hidden zvol) or the increments onto a clean warm copy; a diverged
 * copy is set aside; the format record after a receive comes from the head's manifest; the
 * release waits while the device is bound or mounted anywhere; the warm copy is read-only; no
 * dataset-only property is ever set on a zvol. Real zvols move in the OpenZFS VM
 * (tests/integration/block_follow_test.ts). Before this, every such stage was refused.
 */

import assert from "node:assert/strict";
import { createHash } from "node:crypto";
import { Code } from "../errors.ts";
import { assertRejectsCsi } from "../../tests/support/assert_errors.ts";
import { BlockHost, DEVICE, EXT4 } from "../../tests/support/fake_block_host.ts";
import { FakePool, FILESYSTEM_ONLY } from "../../tests/support/fake_pool.ts";
import { FakeStreamRunner } from "../../tests/support/fake_stream_runner.ts";
import {
  alwaysTakeOver,
  createFollowOwner,
  DATASET as DS,
  followManifest,
  holdAs,
  PARENT,
  storeManifests,
} from "../../tests/support/follow_harness.ts";
import { MemoryStore } from "../../tests/support/memory_store.ts";
import { blockCap, fakeNode, fakeServices, fsCap } from "../../tests/support/service_harness.ts";
import { BlockTools } from "../block/tools.ts";
import { FOLLOW_GENERATION_PROPERTY, FOLLOW_RELEASED_PROPERTY } from "../follow/copy.ts";
import { FollowVolumes } from "../follow/mover.ts";
import { type FollowSettings, readOwner, release } from "../follow/owner.ts";
import type { BackupOutcome } from "../replicate/backup.ts";
import type { SnapshotManifest, StoredZvol } from "../store/layout.ts";
import type { Inspection } from "../volume/trash.ts";
import type { ZvolContent } from "../volume/zvol.ts";
import type { VolumeCapability } from "./types.ts";

const GiB = 1024 * 1024 * 1024;

/** The settings CreateVolume writes for a follow zvol "pg" holding `content` (follow_zvol.ts). */
function zvolSettings(content: ZvolContent): FollowSettings {
  return {
    capacityBytes: GiB,
    properties: {
      "org.zfs-csi:managed": "yes",
      "org.zfs-csi:name": "pg",
      "org.zfs-csi:backup-interval": "60",
      "org.zfs-csi:fs-type": content,
      compression: "lz4",
    },
    zvol: { content, sparse: false },
  };
}

/** The bytes of snapshot `guid`'s stored stream. */
function bytesOf(guid: string): Uint8Array {
  return new TextEncoder().encode(`zvol stream of ${guid}`);
}

/** A stored snapshot of the zvol (its manifest says what it holds), its stream {@linkcode bytesOf}. */
function manifest(
  guid: string,
  baseGuid: string | null,
  zvol: StoredZvol,
): SnapshotManifest {
  const bytes = bytesOf(guid);
  return followManifest(guid, baseGuid, {
    zvol,
    capacityBytes: GiB,
    size: bytes.length,
    sha256: createHash("sha256").update(bytes).digest("hex"),
  });
}

function fsTypeCap(fsType: string): VolumeCapability {
  const cap = fsCap();
  return { ...cap, mount: { ...cap.mount!, fs_type: fsType } };
}

/**
 * Node "n1" serving zvols (--block-volumes, OpenZFS or zfs-fuse) with the follow side on one
 * pool, mount table and store. `zfs receive` of a stored stream makes its snapshot (a full one
 * its zvol, with the manifest's volsize); the backup of a release stores `final`.
 */
async function setup(opts: { zfsFuse?: boolean; final?: SnapshotManifest } = {}) {
  const base = await Deno.makeTempDir({ prefix: "zfs-csi-follow-zvol-" });
  let block: BlockHost | undefined;
  let pool!: FakePool;
  const parts = fakeServices({
    parent: PARENT,
    flags: ["--stage-publish-base-dir", base, "--block-volumes"],
    before: (runner) => {
      block = new BlockHost(runner, DS, () => pool.value(DS, "type") === "volume");
    },
    host: (runner) =>
      pool = new FakePool(runner).add(PARENT, { "org.zfs-csi:managed": ["-", "-"] })
        .serveCreates(runner, opts.zfsFuse ? {} : { version: "zfs-2.2.2-1" }),
  });
  const { runner, zfs, locks, log } = parts;
  const host = block!;
  const store = new MemoryStore();
  const pending: SnapshotManifest[] = [];
  let txg = 100;
  const streams = new FakeStreamRunner((argv) => {
    const target = argv.at(-1)!;
    const m = pending.shift();
    if (!m) return { code: 1, stderr: "no receive expected" };
    if (!pool.has(target)) {
      pool.add(target, {});
      pool.setValue(target, "type", "volume");
      pool.setValue(target, "mountpoint", ["-", "-"]);
      pool.setValue(target, "volsize", [String(m.capacityBytes), "received"]);
    }
    pool.add(`${target}@${m.snapshot}`, { guid: m.guid, createtxg: String(++txg) });
    return {};
  });
  const setAside: string[] = [];
  const backups: string[] = [];
  const follow = new FollowVolumes({
    zfs,
    store,
    locks,
    trash: {
      inspect: (dataset) => {
        const props = pool.objects.get(dataset);
        return Promise.resolve(props && ({ props } as unknown as Inspection));
      },
      removeVolume: (dataset) => {
        setAside.push(dataset);
        for (const name of pool.names()) {
          if (name === dataset || name.startsWith(`${dataset}@`)) pool.objects.delete(name);
        }
        return Promise.resolve();
      },
    },
    log,
    parentDataset: PARENT,
    node: "n1",
    receive: { streams, zfsPath: "zfs", zfs, store, log },
    backup: (dataset): Promise<BackupOutcome> => {
      backups.push(dataset);
      const m = opts.final;
      if (!m) return Promise.reject(new Error("no backup expected"));
      pool.add(`${dataset}@${m.snapshot}`, { guid: m.guid, createtxg: String(++txg) });
      return Promise.resolve({
        status: "stored",
        manifest: m,
        sent: true,
        pruned: [],
        destroyed: [],
      });
    },
  });
  const node = fakeNode(parts, {
    follow,
    blockTools: new BlockTools(runner, { timeoutMs: 1000, log }),
    deviceProbe: host.probe,
  });
  const staging = `${base}/staging/pg/rw-block-device-single-node-writer`;
  const target = `${base}/per-alloc/a1/pg/rw-block-device-single-node-writer`;
  await Deno.mkdir(staging, { recursive: true });
  await Deno.mkdir(`${base}/per-alloc/a1/pg`, { recursive: true });
  return {
    base,
    runner,
    pool,
    host,
    store,
    node,
    follow,
    pending,
    setAside,
    backups,
    staging,
    target,
    logs: parts.logs,
    [Symbol.asyncDispose]: async () => {
      follow.stop();
      runner.assertNoUnexpected();
      await Deno.remove(base, { recursive: true });
    },
  };
}

type H = Awaited<ReturnType<typeof setup>>;

const stage = (
  h: H,
  cap: VolumeCapability,
  ctx: Record<string, string>,
  staging = h.staging,
  id = "pg@*",
) =>
  h.node.NodeStageVolume({
    volume_id: id,
    staging_target_path: staging,
    volume_capability: cap,
    volume_context: ctx,
    publish_context: {},
    secrets: {},
  });
const publish = (h: H, cap: VolumeCapability, ctx: Record<string, string>) =>
  h.node.NodePublishVolume({
    volume_id: "pg@*",
    staging_target_path: h.staging,
    target_path: h.target,
    volume_capability: cap,
    volume_context: ctx,
    publish_context: {},
    readonly: false,
    secrets: {},
  });
const unpublish = (h: H) =>
  h.node.NodeUnpublishVolume({ volume_id: "pg@*", target_path: h.target });
const unstage = (h: H, staging = h.staging) =>
  h.node.NodeUnstageVolume({ volume_id: "pg@*", staging_target_path: staging });

/**
 * Fails if any zfs command sets or makes a zvol with a filesystem-only property, or unmounts
 * one: OpenZFS refuses all of these on a volume (the model pool refuses them too).
 */
function assertNoDatasetOnlyProperty(h: H): void {
  for (const argv of h.runner.argvs) {
    if (argv[0] !== "zfs") continue;
    assert.notEqual(argv[1], "unmount", `a zvol has no mount of its own: ${argv.join(" ")}`);
    if (argv[1] !== "set" && argv[1] !== "create") continue;
    const named = argv.filter((a) => a.includes("=")).map((a) => a.slice(0, a.indexOf("=")));
    const misfit = named.filter((p) => FILESYSTEM_ONLY.has(p));
    assert.deepEqual(misfit, [], `no dataset-only property on a zvol: ${argv.join(" ")}`);
  }
}

/** The zfs commands that changed the copy or its hidden receive, as `verb args...`. */
const zfsChanges = (h: H) =>
  h.runner.argvs.filter((a) => a[0] === "zfs" && ["create", "set", "rename"].includes(a[1]!));

Deno.test("first NodeStage of a raw follow zvol makes it read-only with zfs create -V, opens it after the proof, and mounts nothing", async () => {
  await using h = await setup();
  await createFollowOwner(h.store, { settings: zvolSettings("block") });
  await stage(h, blockCap(), { fs_type: "block" });
  const create = h.runner.argvs.find((a) => a[1] === "create")!;
  assert.deepEqual(create.slice(0, 4), ["zfs", "create", "-V", String(GiB)]);
  assert.ok(create.includes("readonly=on"), "made read-only");
  assert.ok(create.includes("org.zfs-csi:fs-type=block"), "its content recorded");
  assert.ok(create.includes(`${FOLLOW_GENERATION_PROPERTY}=1`));
  assert.equal(h.pool.value(DS, "type"), "volume");
  assert.equal(h.pool.value(DS, "readonly"), "off", "writable once proved");
  assert.equal(h.pool.value(DS, "org.zfs-csi:attached"), "n1");
  const owner = (await readOwner(h.store, "pg"))!.record;
  assert.equal(owner.state, "held");
  assert.equal(owner.holder, "n1");
  assert.deepEqual(h.host.mounts, [], "nothing mounted for a raw zvol");
  assertNoDatasetOnlyProperty(h);
});

Deno.test("NodeUnstage of a follow zvol releases it only once nothing uses its device: refused while bound onto a target, then a read-only warm copy", async () => {
  const final = manifest("1", null, { content: "block", volblocksize: 16384, formatted: false });
  await using h = await setup({ final });
  await createFollowOwner(h.store, { settings: zvolSettings("block") });
  await stage(h, blockCap(), { fs_type: "block" });
  await publish(h, blockCap(), { fs_type: "block" });
  // Nomad's other usage of the volume is unstaged while this one's device is still bound.
  const other = `${h.base}/staging/pg/ro-block-device-single-node-reader-only`;
  await Deno.mkdir(other, { recursive: true });
  await unstage(h, other);
  assert.equal((await readOwner(h.store, "pg"))!.record.state, "held", "not released");
  assert.deepEqual(h.backups, [], "no final snapshot of a zvol in use");
  assert.equal(h.pool.value(DS, "readonly"), "off");
  assert.ok(h.logs.some((l) => l.includes("still in use") && l.includes(h.target)));
  await unpublish(h);
  await unstage(h);
  const owner = (await readOwner(h.store, "pg"))!.record;
  assert.equal(owner.state, "released");
  assert.equal(owner.head, "1", "the head on the final snapshot");
  assert.deepEqual(h.backups, [DS]);
  assert.equal(h.pool.value(DS, "readonly"), "on", "the warm copy is read-only (its device too)");
  assert.equal(h.pool.value(DS, FOLLOW_RELEASED_PROPERTY), "1");
  assert.equal(h.pool.value(DS, "org.zfs-csi:attached"), undefined);
  assertNoDatasetOnlyProperty(h);
});

Deno.test("NodeUnstage of an ext4 follow zvol mounted at another usage's staging path keeps it held", async () => {
  await using h = await setup();
  await createFollowOwner(h.store, { settings: zvolSettings("ext4") });
  await stage(h, fsTypeCap("ext4"), { fs_type: "ext4" });
  assert.deepEqual(
    h.runner.argvs.filter((a) => a[0] === "mkfs.ext4").length,
    1,
    "formatted at its first stage",
  );
  const other = `${h.base}/staging/pg/ro-file-system-single-node-reader-only`;
  await Deno.mkdir(other, { recursive: true });
  await stage(h, fsTypeCap("ext4"), { fs_type: "ext4" }, other);
  await unstage(h);
  assert.equal((await readOwner(h.store, "pg"))!.record.state, "held");
  assert.deepEqual(h.backups, []);
  assert.deepEqual(h.host.mounts.map((m) => [m.source, m.mountPoint]), [[DEVICE, other]]);
  assertNoDatasetOnlyProperty(h);
});

Deno.test("NodeStage receives the head's chain of a zvol in full into a hidden zvol; the format record is done only when the head's manifest says so", async (t) => {
  for (const formatted of [true, false]) {
    await t.step(
      formatted ? "formatted before the head" : "not known to be formatted",
      async () => {
        await using h = await setup();
        await createFollowOwner(h.store, { settings: zvolSettings("ext4") });
        const chain = [
          manifest("1", null, { content: "ext4", volblocksize: 16384, formatted: true }),
          manifest("2", "1", { content: "ext4", volblocksize: 16384, formatted }),
        ];
        await storeManifests(h.store, chain, { stream: (m) => bytesOf(m.guid) });
        const other = await holdAs(h.store, "n2");
        await release(h.store, "pg", other, { guid: "2", createdAt: chain[1]!.createdAt }, 0);
        h.pending.push(...chain);
        // What the received device holds: the filesystem the first holder made.
        h.host.signature = EXT4;
        await stage(h, fsTypeCap("ext4"), { fs_type: "ext4" });
        assert.equal(h.pending.length, 0, "both streams received");
        const set = zfsChanges(h).find((a) =>
          a[1] === "set" && a.includes("org.zfs-csi:managed=yes")
        )!;
        assert.match(set.at(-1)!, /^tank\/nomad\/\.restore-/, "set on the hidden zvol");
        assert.ok(set.includes("refreservation=auto"), "a full reservation again");
        assert.equal(set.includes("org.zfs-csi:format=done"), formatted);
        assert.equal(h.pool.value(DS, "org.zfs-csi:format"), "done", "done after the stage");
        assert.deepEqual(
          h.runner.argvs.filter((a) => a[0]?.startsWith("mkfs")),
          [],
          "never formatted",
        );
        assert.equal(h.host.mounts.at(-1)?.source, DEVICE);
        assert.equal(h.host.mounts.at(-1)?.mountPoint, h.staging);
        assertNoDatasetOnlyProperty(h);
      },
    );
  }
});

/** This node's warm copy of the zvol, released here at snapshot "1" (clean unless changed). */
function warmCopy(h: H, content: ZvolContent, fields: Record<string, string> = {}): void {
  h.pool.add(DS, {
    "org.zfs-csi:managed": "yes",
    "org.zfs-csi:fs-type": content,
    "org.zfs-csi:format": "done",
    [FOLLOW_GENERATION_PROPERTY]: "1",
    [FOLLOW_RELEASED_PROPERTY]: "1",
    readonly: "on",
    written: "0",
    volsize: String(GiB),
    ...fields,
  });
  h.pool.setValue(DS, "type", "volume");
  h.pool.setValue(DS, "mountpoint", ["-", "-"]);
  h.pool.add(`${DS}@.backup-1`, { guid: "1", createtxg: "50" });
}

/** The store has 1 ← 2 of an ext4 zvol, released by n2 at 2. */
async function movedOnAt2(h: H): Promise<SnapshotManifest[]> {
  await createFollowOwner(h.store, { settings: zvolSettings("ext4") });
  const z = { content: "ext4", volblocksize: 16384, formatted: true } as const;
  const chain = [manifest("1", null, z), manifest("2", "1", z)];
  await storeManifests(h.store, chain, { stream: (m) => bytesOf(m.guid) });
  const n2 = await holdAs(h.store, "n2");
  await release(h.store, "pg", n2, { guid: "2", createdAt: chain[1]!.createdAt }, 0);
  return chain;
}

Deno.test("NodeStage onto a clean warm zvol copy receives only the increment, and never formats it again", async () => {
  await using h = await setup();
  const chain = await movedOnAt2(h);
  warmCopy(h, "ext4");
  h.host.signature = EXT4;
  h.pending.push(chain[1]!);
  await stage(h, fsTypeCap("ext4"), { fs_type: "ext4" });
  assert.deepEqual(h.setAside, [], "a clean copy is kept");
  assert.equal(h.pending.length, 0, "the increment 1 → 2 was received");
  assert.equal(h.pool.value(DS, "readonly"), "off");
  assert.deepEqual(h.runner.argvs.filter((a) => a[0]?.startsWith("mkfs")), []);
  assert.equal(h.host.mounts.at(-1)?.mountPoint, h.staging);
  assertNoDatasetOnlyProperty(h);
});

Deno.test("NodeStage sets a diverged zvol copy aside and receives the head's chain in full: never published", async () => {
  await using h = await setup();
  const chain = await movedOnAt2(h);
  // Written after its release here: not the store's copy any more.
  warmCopy(h, "ext4", { written: "4096" });
  h.host.signature = EXT4;
  h.pending.push(...chain);
  await stage(h, fsTypeCap("ext4"), { fs_type: "ext4" });
  assert.deepEqual(h.setAside, [DS], "set aside with the trash");
  assert.ok(h.logs.some((l) => l.includes("diverged") && l.includes("4096 bytes written")));
  assert.equal(h.pending.length, 0, "the whole chain received");
  assert.ok(
    zfsChanges(h).some((a) => a[1] === "rename" && a[2]!.includes(".restore-") && a[3] === DS),
    "renamed to the volume only when whole",
  );
  assertNoDatasetOnlyProperty(h);
});

Deno.test("a fenced follow zvol copy is made read-only and left to its NodeUnstage: no canmount, no unmount", async () => {
  await using h = await setup();
  await createFollowOwner(h.store, { settings: zvolSettings("block") });
  await stage(h, blockCap(), { fs_type: "block" });
  // Node n2 takes it over (its rule allowed it); this node's renewal finds out.
  await holdAs(h.store, "n2", { mayTakeOver: alwaysTakeOver });
  await h.follow.renewAll();
  assert.equal(h.pool.value(DS, FOLLOW_RELEASED_PROPERTY), "fenced");
  assert.equal(h.pool.value(DS, "readonly"), "on");
  assert.equal(h.pool.value(DS, "org.zfs-csi:backup-interval"), "0");
  assertNoDatasetOnlyProperty(h);
});

Deno.test("NodeStage of a follow zvol as what it is not is refused before its copy is touched, and the volume handed back", async () => {
  await using h = await setup();
  await createFollowOwner(h.store, { settings: zvolSettings("ext4") });
  await assertRejectsCsi(
    stage(h, blockCap(), { fs_type: "block" }),
    Code.INVALID_ARGUMENT,
    /is a zvol holding ext4, and the request stages it as block/,
  );
  // A plain mount with no context: the dataset path, which the settings refuse too.
  await assertRejectsCsi(
    stage(h, fsCap(), {}),
    Code.INVALID_ARGUMENT,
    /is a zvol holding ext4: stage it as one \(fs_type "ext4"\)/,
  );
  assert.equal(h.pool.has(DS), false, "nothing made");
  assert.equal((await readOwner(h.store, "pg"))!.record.state, "released", "handed back");
  // Registered as a follow zvol (no CreateVolume): refused.
  await assertRejectsCsi(
    stage(h, fsTypeCap("ext4"), { follow: "true", fs_type: "ext4" }, h.staging, "pg"),
    Code.INVALID_ARGUMENT,
    /made by CreateVolume/,
  );
});

Deno.test("NodeStage of a follow zvol on zfs-fuse is refused saying why, before the store is touched", async () => {
  await using h = await setup({ zfsFuse: true });
  await createFollowOwner(h.store, { settings: zvolSettings("block") });
  const before = (await readOwner(h.store, "pg"))!.etag;
  await assertRejectsCsi(
    stage(h, blockCap(), { fs_type: "block" }),
    Code.INVALID_ARGUMENT,
    /this node's zfs cannot make zvols \(zfs-fuse/,
  );
  assert.equal((await readOwner(h.store, "pg"))!.etag, before, "the owner object unchanged");
  assert.equal(h.pool.has(DS), false);
});

Deno.test("NodeExpandVolume of a follow zvol this node holds grows its volsize in whole steps, then its filesystem", async () => {
  await using h = await setup();
  await createFollowOwner(h.store, { settings: zvolSettings("ext4") });
  await stage(h, fsTypeCap("ext4"), { fs_type: "ext4" });
  const target = `${h.base}/per-alloc/a1/pg/rw-file-system-single-node-writer`;
  await h.node.NodePublishVolume({
    volume_id: "pg@*",
    staging_target_path: h.staging,
    target_path: target,
    volume_capability: fsTypeCap("ext4"),
    volume_context: { fs_type: "ext4" },
    publish_context: {},
    readonly: false,
    secrets: {},
  });
  const grown = await h.node.NodeExpandVolume({
    volume_id: "pg@*",
    volume_path: target,
    staging_target_path: h.staging,
    capacity_range: { required_bytes: String(2 * GiB - 1), limit_bytes: "0" },
    volume_capability: null,
    secrets: {},
  });
  assert.deepEqual(grown, { capacity_bytes: String(2 * GiB) });
  assert.equal(h.pool.value(DS, "volsize"), String(2 * GiB));
  assert.deepEqual(h.runner.argvs.at(-1), ["resize2fs", DEVICE]);
  assertNoDatasetOnlyProperty(h);
});
