/**
 * The controller's side of zvols that follow their job (volume_kinds/follow_zvol.ts): a
 * CreateVolume that asks for a zvol with follow = "true" writes the owner object and record to
 * the store with what every node makes the zvol with, touching no node; it is refused, with
 * nothing written, where this plugin serves no zvols (zfs-fuse, no --block-volumes) or without a
 * store; from a stored snapshot only a zvol's holding the same, never smaller. ControllerGetVolume,
 * ValidateVolumeCapabilities and ControllerExpandVolume answer from the store. (These requests
 * were refused as "cannot be a zvol in this release" before: controller_zvol_test.ts.)
 */

import assert from "node:assert/strict";
import { Code } from "../errors.ts";
import { assertRejectsCsi } from "../../tests/support/assert_errors.ts";
import { FakePool } from "../../tests/support/fake_pool.ts";
import { MemoryStore } from "../../tests/support/memory_store.ts";
import { followManifest, holdAs, storeManifests } from "../../tests/support/follow_harness.ts";
import {
  blockCap,
  fakeController,
  fakeServices,
  fsCap,
} from "../../tests/support/service_harness.ts";
import { parseOwner } from "../follow/owner.ts";
import { ownerKey } from "../store/layout.ts";
import { storedSnapshotId } from "../store/snapshot_ids.ts";
import type { SnapshotManifest } from "../store/layout.ts";
import type { CreateVolumeRequest, VolumeCapability } from "./types.ts";

const PARENT = "tank/nomad";
const GiB = 1024 * 1024 * 1024;
const MiB = 1024 * 1024;

function fsTypeCap(fsType: string): VolumeCapability {
  const cap = fsCap();
  return { ...cap, mount: { ...cap.mount!, fs_type: fsType } };
}

/**
 * A controller with a store (unless `store` is false) and `flags` (default --block-volumes), on
 * a node whose zfs is OpenZFS (or zfs-fuse: no `zfs version`).
 */
function setup(opts: { flags?: string[]; store?: boolean; zfsFuse?: boolean } = {}) {
  const parts = fakeServices({
    parent: PARENT,
    flags: [
      ...(opts.store === false ? [] : ["--store", "file:///srv/backups"]),
      ...opts.flags ?? ["--block-volumes"],
    ],
    host: (runner) =>
      new FakePool(runner).add(PARENT).serveCreates(
        runner,
        opts.zfsFuse ? {} : { version: "zfs-2.2.2-1" },
      ),
  });
  const store = new MemoryStore();
  const controller = fakeController(
    parts,
    opts.store === false ? {} : { follow: { store, ttlSeconds: 30 } },
  );
  return { controller, store, runner: parts.runner, pool: parts.host };
}

function createReq(over: Partial<CreateVolumeRequest> = {}): CreateVolumeRequest {
  return {
    name: "db",
    capacity_range: { required_bytes: String(GiB), limit_bytes: "0" },
    volume_capabilities: [blockCap()],
    parameters: { follow: "true" },
    secrets: {},
    ...over,
  } as CreateVolumeRequest;
}

/** The zfs commands that would change a pool. */
const changes = (argvs: string[][]) =>
  argvs.filter((a) => ["create", "clone", "destroy", "rename", "set", "snapshot"].includes(a[1]!));

Deno.test("CreateVolume of a raw follow zvol writes its zvol settings to the store and touches no dataset", async () => {
  const h = setup();
  const answer = await h.controller.CreateVolume(
    createReq({ parameters: { follow: "true", compression: "lz4" } }),
  ) as { volume: Record<string, unknown> };
  assert.deepEqual(answer.volume, {
    volume_id: "db@*",
    capacity_bytes: String(GiB),
    volume_context: { fs_type: "block" },
  });
  assert.deepEqual(changes(h.runner.argvs), [], "no zfs command changes anything here");
  const owner = parseOwner(h.store.peek(ownerKey("db"))!);
  assert.deepEqual(owner.settings.zvol, { content: "block", sparse: false });
  assert.equal(owner.settings.capacityBytes, GiB, "its volsize");
  const props = owner.settings.properties;
  assert.equal(props["org.zfs-csi:fs-type"], "block");
  assert.equal(props.compression, "lz4");
  assert.equal(props["org.zfs-csi:managed"], "yes");
  assert.equal(props["org.zfs-csi:backup-interval"], "60");
  for (const p of ["refquota", "quota", "refreservation", "canmount", "mountpoint"]) {
    assert.equal(props[p], undefined, `no ${p}: it does not apply to a zvol`);
  }
  // A retry answers the same.
  assert.deepEqual(
    await h.controller.CreateVolume(
      createReq({ parameters: { follow: "true", compression: "lz4" } }),
    ),
    answer,
  );
  // What a node reads back: the volume, its context, its capabilities.
  const got = await h.controller.ControllerGetVolume({ volume_id: "db@*" }) as {
    volume: Record<string, unknown>;
  };
  assert.deepEqual(got.volume.volume_context, { fs_type: "block" });
  const validate = (cap: VolumeCapability) =>
    h.controller.ValidateVolumeCapabilities({
      volume_id: "db@*",
      volume_capabilities: [cap],
      volume_context: { fs_type: "block" },
      parameters: { follow: "true", compression: "lz4" },
      secrets: {},
      mutable_parameters: {},
    }) as Promise<{ confirmed?: unknown; message?: string }>;
  const block = await validate(blockCap());
  assert.ok(block.confirmed, String(block.message));
  assert.match((await validate(fsCap())).message ?? "", /raw zvol/);
});

Deno.test("CreateVolume of an ext4 or xfs follow zvol records its content, volblocksize and sparse; xfs is at least 300 MiB", async () => {
  const h = setup({ flags: ["--block-volumes", "--allow-sparse-zvols"] });
  await h.controller.CreateVolume(createReq({
    volume_capabilities: [fsCap()],
    parameters: { follow: "true", fs_type: "ext4", volblocksize: "16K", sparse: "true" },
  }));
  const ext4 = parseOwner(h.store.peek(ownerKey("db"))!);
  assert.deepEqual(ext4.settings.zvol, { content: "ext4", volblocksize: 16384, sparse: true });
  assert.equal(ext4.settings.properties["org.zfs-csi:fs-type"], "ext4");
  assert.equal(ext4.settings.properties.volblocksize, undefined, "made with it, never set");
  const xfs = await h.controller.CreateVolume(createReq({
    name: "files",
    volume_capabilities: [fsTypeCap("xfs")],
    capacity_range: { required_bytes: String(10 * MiB), limit_bytes: "0" },
  })) as { volume: Record<string, unknown> };
  assert.equal(xfs.volume.capacity_bytes, String(300 * MiB));
  assert.deepEqual(xfs.volume.volume_context, { fs_type: "xfs" });
  assert.deepEqual(changes(h.runner.argvs), []);
});

Deno.test("CreateVolume of a follow zvol is refused, with nothing written, on zfs-fuse, without --block-volumes, without a store, and with parameters a zvol does not take", async () => {
  {
    // zfs-fuse makes no zvols: the controller's node says so before the store is touched.
    const h = setup({ zfsFuse: true });
    await assertRejectsCsi(
      h.controller.CreateVolume(createReq()),
      Code.INVALID_ARGUMENT,
      /this node's zfs cannot make zvols \(zfs-fuse/,
    );
    assert.deepEqual(await h.store.list(""), [], "nothing in the store");
  }
  {
    const h = setup({ flags: [] });
    await assertRejectsCsi(
      h.controller.CreateVolume(createReq()),
      Code.INVALID_ARGUMENT,
      /--block-volumes/,
    );
    assert.deepEqual(await h.store.list(""), []);
  }
  await assertRejectsCsi(
    setup({ store: false }).controller.CreateVolume(createReq()),
    Code.FAILED_PRECONDITION,
    /needs a store shared by the nodes/,
  );
  const h = setup();
  const cases: [Record<string, string>, RegExp][] = [
    [{ recordsize: "16K" }, /"recordsize" does not apply to a zvol/],
    [{ quota: "capacity" }, /"quota" does not apply to a zvol/],
    [{ sparse: "true" }, /--allow-sparse-zvols/],
    [{ volblocksize: "3K" }, /power of two/],
    [{ backup_interval: "0" }, /backup_interval cannot be 0/],
  ];
  for (const [params, message] of cases) {
    await assertRejectsCsi(
      h.controller.CreateVolume(createReq({ parameters: { follow: "true", ...params } })),
      Code.INVALID_ARGUMENT,
      message,
      JSON.stringify(params),
    );
  }
  assert.deepEqual(await h.store.list(""), [], "nothing in the store");
  assert.deepEqual(changes(h.runner.argvs), []);
});

/** A stored snapshot "src" of volume "old" (uid b…), and its stream. */
async function storedSnapshot(
  store: MemoryStore,
  fields: Partial<SnapshotManifest>,
): Promise<string> {
  const m = followManifest("7", null, { volume: "old", snapshot: "src", ...fields });
  await storeManifests(store, [m], { stream: () => new Uint8Array(m.size) });
  return storedSnapshotId("old", m.guid);
}

Deno.test("CreateVolume of a follow zvol from a stored snapshot: a zvol's holding the same only, never smaller, checked before anything is copied", async () => {
  const h = setup();
  const zvolSnapshot = { zvol: { content: "ext4", volblocksize: 16384, formatted: true } } as const;
  const id = await storedSnapshot(h.store, { capacityBytes: 2 * GiB, ...zvolSnapshot });
  const from = { volume_content_source: { snapshot: { snapshot_id: id } } };
  const copied = async (name: string) =>
    (await h.store.list(`v1/volumes/${name}/`)).map((o) => o.key);
  const refusals: [Partial<CreateVolumeRequest>, typeof Code[keyof typeof Code], RegExp][] = [
    [{ name: "raw", volume_capabilities: [blockCap()] }, Code.INVALID_ARGUMENT, /holding ext4/],
    [
      {
        name: "small",
        volume_capabilities: [fsTypeCap("ext4")],
        capacity_range: { required_bytes: String(GiB), limit_bytes: "0" },
      },
      Code.OUT_OF_RANGE,
      /never shrunk/,
    ],
    [
      {
        name: "vbs",
        volume_capabilities: [fsTypeCap("ext4")],
        parameters: { follow: "true", volblocksize: "8K" },
      },
      Code.INVALID_ARGUMENT,
      /volblocksize does not apply/,
    ],
    // A follow *dataset* from a zvol's snapshot is refused too.
    [{ name: "ds", volume_capabilities: [fsCap()] }, Code.INVALID_ARGUMENT, /is of a zvol/],
  ];
  for (const [over, code, message] of refusals) {
    await assertRejectsCsi(
      h.controller.CreateVolume(createReq({ capacity_range: null, ...from, ...over })),
      code,
      message,
      over.name,
    );
    assert.deepEqual(await copied(over.name!), [], `${over.name}: nothing copied`);
  }
  const made = await h.controller.CreateVolume(createReq({
    name: "copy",
    capacity_range: null,
    volume_capabilities: [fsTypeCap("ext4")],
    ...from,
  })) as { volume: Record<string, unknown> };
  assert.equal(made.volume.capacity_bytes, String(2 * GiB), "the snapshot's volsize");
  assert.deepEqual(made.volume.volume_context, { fs_type: "ext4" });
  const owner = parseOwner(h.store.peek(ownerKey("copy"))!);
  assert.deepEqual(owner.settings.zvol, { content: "ext4", sparse: false });
  assert.equal(owner.head, "7", "its head is the copied snapshot");
  assert.equal((await copied("copy")).filter((k) => k.includes("/snapshots/")).length, 1);

  // A zvol from a dataset's snapshot: refused as well.
  const g = setup();
  const dataset = await storedSnapshot(g.store, {});
  await assertRejectsCsi(
    g.controller.CreateVolume(createReq({
      capacity_range: null,
      volume_content_source: { snapshot: { snapshot_id: dataset } },
    })),
    Code.INVALID_ARGUMENT,
    /is of a ZFS dataset/,
  );
  assert.deepEqual((await g.store.list("v1/volumes/db/")).map((o) => o.key), []);

  // A zvol's snapshot whose manifest records no volsize: its size cannot be the volume's.
  const z = setup();
  const sizeless = await storedSnapshot(z.store, { capacityBytes: 0, ...zvolSnapshot });
  await assertRejectsCsi(
    z.controller.CreateVolume(createReq({
      capacity_range: null,
      volume_capabilities: [fsTypeCap("ext4")],
      volume_content_source: { snapshot: { snapshot_id: sizeless } },
    })),
    Code.FAILED_PRECONDITION,
    /records no size/,
  );
  assert.deepEqual((await z.store.list("v1/volumes/db/")).map((o) => o.key), []);
});

Deno.test("ControllerExpandVolume of a follow zvol grows the recorded volsize in whole steps, never shrinks it, and asks the holder to grow its copy", async () => {
  const h = setup();
  await h.controller.CreateVolume(createReq());
  const expand = (required: number, limit = 0) =>
    h.controller.ControllerExpandVolume({
      volume_id: "db@*",
      capacity_range: { required_bytes: String(required), limit_bytes: String(limit) },
      secrets: {},
      volume_capability: null,
    });
  assert.deepEqual(await expand(GiB + 1), {
    capacity_bytes: String(GiB + 128 * 1024),
    node_expansion_required: false,
  });
  assert.equal(parseOwner(h.store.peek(ownerKey("db"))!).settings.capacityBytes, GiB + 128 * 1024);
  await assertRejectsCsi(expand(GiB, GiB), Code.OUT_OF_RANGE, /never shrunk/);
  // Held by a node: that node's NodeExpandVolume grows its copy (raw zvols too).
  await holdAs(h.store, "node-b", { name: "db" });
  assert.deepEqual(await expand(2 * GiB), {
    capacity_bytes: String(2 * GiB),
    node_expansion_required: true,
  });
  const settings = parseOwner(h.store.peek(ownerKey("db"))!).settings;
  assert.equal(settings.capacityBytes, 2 * GiB);
  assert.equal(settings.properties.refquota, undefined, "no dataset size property");
  assert.deepEqual(changes(h.runner.argvs), []);
});
