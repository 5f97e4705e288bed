/**
 * The controller's zvol kind (docs/block-volumes.md) on a model pool: when zvols are refused
 * (no --block-volumes; a zfs that cannot make them), how a raw and an ext4/xfs zvol are made,
 * repeated, checked against capabilities, grown and deleted. zfs-fuse has no zvols, so the real
 * commands are proven in the OpenZFS VM (tests/integration/block_volumes_test.ts). Zvols that
 * follow their job (once refused here) are controller_follow_zvol_test.ts's.
 */

import assert from "node:assert/strict";
import { Code } from "../errors.ts";
import { assertRejectsCsi } from "../../tests/support/assert_errors.ts";
import { FakePool } from "../../tests/support/fake_pool.ts";
import { blockCap, fakeServices, fsCap } from "../../tests/support/service_harness.ts";
import { ControllerService } from "./controller.ts";
import { Trash } from "../volume/trash.ts";
import type { CreateVolumeRequest, VolumeCapability } from "./types.ts";

const PARENT = "tank/nomad";
const DB = `${PARENT}/db`;
const GiB = 1024 * 1024 * 1024;
const OPENZFS = "zfs-2.2.2-1";

function setup(opts: { flags?: string[]; version?: string | undefined } = {}) {
  const parts = fakeServices({
    parent: PARENT,
    flags: ["--deleted-retention", "0", ...opts.flags ?? ["--block-volumes"]],
    host: (runner) =>
      new FakePool(runner).add(PARENT).serveCreates(runner, {
        ...("version" in opts ? (opts.version ? { version: opts.version } : {}) : {
          version: OPENZFS,
        }),
      }),
  });
  const { config, runner, host: pool, zfs, mounter, health, locks, log } = parts;
  const trash = new Trash({ zfs, parentDataset: PARENT, retentionSeconds: 0, locks, log });
  const controller = new ControllerService({ config, zfs, mounter, health, locks, trash, log });
  return { runner, pool, controller, [Symbol.dispose]: () => runner.assertNoUnexpected() };
}

function fsTypeCap(fsType: string, mode = "SINGLE_NODE_WRITER"): VolumeCapability {
  const cap = fsCap(mode);
  return { ...cap, mount: { ...cap.mount!, fs_type: fsType } };
}

function createReq(over: Partial<CreateVolumeRequest> = {}): CreateVolumeRequest {
  return {
    name: "db",
    capacity_range: { required_bytes: String(GiB), limit_bytes: "0" },
    volume_capabilities: [blockCap()],
    parameters: {},
    secrets: {},
    ...over,
  } as CreateVolumeRequest;
}

/** The commands that change something. */
const changes = (argvs: string[][]) =>
  argvs.filter((a) => ["create", "clone", "destroy", "rename", "set", "snapshot"].includes(a[1]!));

Deno.test("CreateVolume of a block volume without --block-volumes is refused naming the flag, before any zfs command", async () => {
  using h = setup({ flags: [] });
  for (
    const req of [
      createReq(),
      createReq({ volume_capabilities: [fsTypeCap("ext4")] }),
      createReq({ volume_capabilities: [fsCap()], parameters: { fs_type: "xfs" } }),
    ]
  ) {
    await assertRejectsCsi(
      h.controller.CreateVolume(req),
      Code.INVALID_ARGUMENT,
      /--block-volumes/,
    );
  }
  assert.deepEqual(h.runner.argvs, []);
});

Deno.test("CreateVolume of a block volume on a zfs that cannot make zvols (zfs-fuse) says why, and makes nothing", async () => {
  using h = setup({ version: undefined });
  await assertRejectsCsi(
    h.controller.CreateVolume(createReq()),
    Code.INVALID_ARGUMENT,
    /this node's zfs cannot make zvols \(zfs-fuse/,
  );
  assert.deepEqual(changes(h.runner.argvs), []);
});

Deno.test("CreateVolume of a raw block volume makes a reserved zvol of the size, marked and recorded", async () => {
  using h = setup();
  const res = await h.controller.CreateVolume(createReq({ parameters: { volblocksize: "16K" } }));
  assert.deepEqual(changes(h.runner.argvs), [[
    "zfs",
    "create",
    "-V",
    String(GiB),
    "-o",
    "org.zfs-csi:fs-type=block",
    "-o",
    "org.zfs-csi:managed=yes",
    "-o",
    "org.zfs-csi:name=db",
    "-o",
    'org.zfs-csi:parameters={"volblocksize":"16K"}',
    "-o",
    "volblocksize=16K",
    DB,
  ]]);
  assert.deepEqual(res, {
    volume: {
      volume_id: "db@n1",
      capacity_bytes: String(GiB),
      volume_context: { dataset: DB, fs_type: "block" },
      accessible_topology: [{ segments: { zone: "eu1", "org.zfs-csi/node": "n1" } }],
    },
  });
  // The same request again is answered with the same volume: zfs refuses the create (as for
  // a dataset, a repeat is told by that refusal), and nothing else is tried.
  const before = changes(h.runner.argvs).length;
  h.pool.setValue(DB, "creation", String(Math.floor(Date.now() / 1000)));
  assert.deepEqual(
    await h.controller.CreateVolume(createReq({ parameters: { volblocksize: "16K" } })),
    res,
  );
  assert.equal(changes(h.runner.argvs).length, before + 1);
  assert.deepEqual(changes(h.runner.argvs).at(-1), changes(h.runner.argvs)[0]);
});

Deno.test("CreateVolume of ext4 or xfs: from the mount capability or the fs_type parameter", async () => {
  using h = setup();
  await h.controller.CreateVolume(createReq({ volume_capabilities: [fsTypeCap("ext4")] }));
  assert.equal(h.pool.value(DB, "org.zfs-csi:fs-type"), "ext4");
  assert.equal(h.pool.value(DB, "type"), "volume");
  const xfs = await h.controller.CreateVolume(
    createReq({ name: "x", volume_capabilities: [fsCap()], parameters: { fs_type: "xfs" } }),
  ) as { volume: { volume_context: Record<string, string>; capacity_bytes: string } };
  assert.equal(h.pool.value(`${PARENT}/x`, "org.zfs-csi:fs-type"), "xfs");
  assert.deepEqual(xfs.volume.volume_context, { dataset: `${PARENT}/x`, fs_type: "xfs" });
  // A ZFS dataset as before: fs_type "zfs" is not a zvol (the create is a filesystem's).
  await h.controller.CreateVolume(
    createReq({ name: "plain", volume_capabilities: [fsCap()], parameters: { fs_type: "zfs" } }),
  );
  assert.equal(h.pool.value(`${PARENT}/plain`, "type"), "filesystem");
  assert.equal(h.pool.value(`${PARENT}/plain`, "org.zfs-csi:parameters"), "{}");
});

Deno.test("CreateVolume of xfs is at least 300 MiB (mkfs.xfs refuses less), and sizes are whole 128K steps", async () => {
  using h = setup();
  const small = await h.controller.CreateVolume(createReq({
    volume_capabilities: [fsTypeCap("xfs")],
    capacity_range: { required_bytes: "1000", limit_bytes: "0" },
  })) as { volume: { capacity_bytes: string } };
  assert.equal(small.volume.capacity_bytes, String(300 * 1024 * 1024));
  const odd = await h.controller.CreateVolume(createReq({
    name: "odd",
    capacity_range: { required_bytes: String(GiB + 1), limit_bytes: "0" },
  })) as { volume: { capacity_bytes: string } };
  assert.equal(odd.volume.capacity_bytes, String(GiB + 128 * 1024));
  await assertRejectsCsi(
    h.controller.CreateVolume(createReq({
      name: "tight",
      volume_capabilities: [fsTypeCap("xfs")],
      capacity_range: { required_bytes: "0", limit_bytes: String(100 * 1024 * 1024) },
    })),
    Code.OUT_OF_RANGE,
  );
});

Deno.test("CreateVolume refuses a request for two kinds, filesystem-only parameters, quota and sparse without its flag", async () => {
  using h = setup();
  const cases: [Partial<CreateVolumeRequest>, RegExp][] = [
    [{ volume_capabilities: [blockCap(), fsCap()] }, /more than one kind of volume/],
    [{ volume_capabilities: [fsTypeCap("ext4"), fsTypeCap("xfs")] }, /more than one kind/],
    [{ volume_capabilities: [fsTypeCap("ext4")], parameters: { fs_type: "xfs" } }, /more than/],
    [{ volume_capabilities: [blockCap()], parameters: { fs_type: "ext4" } }, /more than one/],
    [{ parameters: { fs_type: "btrfs" } }, /fs_type="btrfs" is not supported/],
    [{ parameters: { recordsize: "16K" } }, /"recordsize" does not apply to a zvol/],
    [{ parameters: { quota: "capacity" } }, /"quota" does not apply to a zvol/],
    [{ parameters: { volblocksize: "3K" } }, /power of two from 4K to 128K/],
    [{ parameters: { volblocksize: "256K" } }, /power of two from 4K to 128K/],
    [{ parameters: { sparse: "true" } }, /--allow-sparse-zvols/],
    [{ parameters: { sparse: "yes" } }, /"true" or "false"/],
  ];
  for (const [over, message] of cases) {
    await assertRejectsCsi(
      h.controller.CreateVolume(createReq(over)),
      Code.INVALID_ARGUMENT,
      message,
      JSON.stringify(over),
    );
  }
  assert.deepEqual(changes(h.runner.argvs), []);
});

Deno.test("CreateVolume sparse=true makes a thin zvol (-s) only with --allow-sparse-zvols", async () => {
  using h = setup({ flags: ["--block-volumes", "--allow-sparse-zvols"] });
  await h.controller.CreateVolume(createReq({ parameters: { sparse: "true" } }));
  const create = changes(h.runner.argvs)[0]!;
  assert.deepEqual(create.slice(0, 5), ["zfs", "create", "-V", String(GiB), "-s"]);
});

Deno.test("CreateVolume for a name taken by a zvol holding something else answers ALREADY_EXISTS", async () => {
  using h = setup();
  await h.controller.CreateVolume(createReq());
  await assertRejectsCsi(
    h.controller.CreateVolume(createReq({ volume_capabilities: [fsTypeCap("ext4")] })),
    Code.ALREADY_EXISTS,
    /holding block/,
  );
  // And a dataset request for the zvol's name is refused as not a filesystem.
  await assertRejectsCsi(
    h.controller.CreateVolume(createReq({ volume_capabilities: [fsCap()] })),
    Code.ALREADY_EXISTS,
    /not a filesystem/,
  );
});

Deno.test("ValidateVolumeCapabilities confirms block only for raw zvols and mounts only for filesystems", async () => {
  using h = setup();
  await h.controller.CreateVolume(createReq());
  await h.controller.CreateVolume(
    createReq({ name: "e", volume_capabilities: [fsTypeCap("ext4")] }),
  );
  h.pool.add(`${PARENT}/plain`, { "org.zfs-csi:managed": "yes" });
  const validate = (id: string, cap: VolumeCapability, ctx: Record<string, string> = {}) =>
    h.controller.ValidateVolumeCapabilities({
      volume_id: id,
      volume_capabilities: [cap],
      volume_context: ctx,
      parameters: {},
      mutable_parameters: {},
      secrets: {},
    }) as Promise<{ confirmed?: { volume_capabilities: unknown[] }; message?: string }>;
  const raw = await validate("db@n1", blockCap(), { fs_type: "block" });
  assert.deepEqual(raw.confirmed?.volume_capabilities, [{
    access_mode: { mode: "SINGLE_NODE_WRITER" },
    block: {},
  }]);
  assert.ok((await validate("e@n1", fsTypeCap("ext4"), { fs_type: "ext4" })).confirmed);
  assert.ok((await validate("e@n1", fsCap(), { fs_type: "ext4" })).confirmed);
  assert.ok((await validate("plain@n1", fsCap())).confirmed);
  const refusals: [string, VolumeCapability, Record<string, string>, RegExp][] = [
    ["db@n1", fsCap(), { fs_type: "block" }, /raw zvol/],
    ["e@n1", blockCap(), { fs_type: "ext4" }, /holds ext4/],
    ["e@n1", fsTypeCap("xfs"), { fs_type: "ext4" }, /holds ext4/],
    ["e@n1", fsTypeCap("zfs"), { fs_type: "ext4" }, /holds ext4/],
    ["plain@n1", blockCap(), {}, /ZFS dataset, not a block device/],
    ["plain@n1", fsTypeCap("ext4"), {}, /ZFS dataset/],
    // A context that lies about what the volume is.
    ["plain@n1", fsCap(), { fs_type: "ext4" }, /context says fs_type "ext4"/],
    ["db@n1", blockCap(), {}, /context says fs_type "zfs"/],
  ];
  for (const [id, cap, ctx, message] of refusals) {
    const res = await validate(id, cap, ctx);
    assert.equal(res.confirmed, undefined, `${id} ${JSON.stringify(cap)}`);
    assert.match(res.message ?? "", message);
  }
});

Deno.test("ControllerExpandVolume grows volsize, never shrinks, and asks the node to grow ext4/xfs only", async () => {
  using h = setup();
  await h.controller.CreateVolume(createReq());
  await h.controller.CreateVolume(
    createReq({ name: "e", volume_capabilities: [fsTypeCap("ext4")] }),
  );
  const expand = (id: string, bytes: number) =>
    h.controller.ControllerExpandVolume({
      volume_id: id,
      capacity_range: { required_bytes: String(bytes), limit_bytes: "0" },
      volume_capability: null,
      secrets: {},
    });
  assert.deepEqual(await expand("db@n1", 2 * GiB), {
    capacity_bytes: String(2 * GiB),
    node_expansion_required: false,
  });
  assert.equal(h.pool.value(DB, "volsize"), String(2 * GiB));
  assert.deepEqual(await expand("e@n1", 2 * GiB), {
    capacity_bytes: String(2 * GiB),
    node_expansion_required: true,
  });
  const sets = changes(h.runner.argvs).filter((a) => a[1] === "set");
  // Smaller than it is: nothing set, the current size answered.
  assert.deepEqual(await expand("db@n1", GiB), {
    capacity_bytes: String(2 * GiB),
    node_expansion_required: false,
  });
  assert.equal(changes(h.runner.argvs).filter((a) => a[1] === "set").length, sets.length);
  assert.deepEqual(sets, [
    ["zfs", "set", `volsize=${2 * GiB}`, DB],
    ["zfs", "set", `volsize=${2 * GiB}`, `${PARENT}/e`],
  ]);
});

Deno.test("DeleteVolume of a zvol is refused while a node has it staged, then destroys it without unmount or canmount", async () => {
  using h = setup();
  await h.controller.CreateVolume(createReq());
  h.pool.setValue(DB, "org.zfs-csi:attached", "n2");
  await assertRejectsCsi(
    h.controller.DeleteVolume({ volume_id: "db@n1", secrets: {} }),
    Code.FAILED_PRECONDITION,
    /staged on node "n2"/,
  );
  assert.ok(h.pool.has(DB));
  h.pool.objects.get(DB)!.delete("org.zfs-csi:attached");
  await h.controller.DeleteVolume({ volume_id: "db@n1", secrets: {} });
  assert.equal(h.pool.has(DB), false);
  assert.deepEqual(
    h.runner.argvs.filter((a) => a[1] === "unmount" || a.some((x) => x.startsWith("canmount"))),
    [],
  );
  // Gone: a repeat succeeds.
  await h.controller.DeleteVolume({ volume_id: "db@n1", secrets: {} });
});

Deno.test("CreateVolume from a snapshot of a zvol clones it (grown when asked), and refuses a source of another kind", async () => {
  using h = setup();
  await h.controller.CreateVolume(createReq());
  await h.controller.CreateSnapshot({
    source_volume_id: "db@n1",
    name: "s1",
    parameters: {},
    secrets: {},
  });
  const snap = [...h.pool.objects.keys()].find((n) => n.startsWith(`${DB}@`))!;
  assert.ok(snap, "the snapshot was taken");
  const res = await h.controller.CreateVolume(createReq({
    name: "copy",
    capacity_range: { required_bytes: String(2 * GiB), limit_bytes: "0" },
    volume_content_source: { snapshot: { snapshot_id: "db@s1@n1" } },
  })) as { volume: { capacity_bytes: string; volume_context: Record<string, string> } };
  assert.equal(h.pool.value(`${PARENT}/copy`, "type"), "volume");
  assert.equal(h.pool.value(`${PARENT}/copy`, "origin"), snap);
  assert.equal(h.pool.value(`${PARENT}/copy`, "volsize"), String(2 * GiB));
  assert.equal(h.pool.value(`${PARENT}/copy`, "refreservation"), "auto");
  assert.equal(res.volume.capacity_bytes, String(2 * GiB));
  assert.equal(res.volume.volume_context.fs_type, "block");
  await assertRejectsCsi(
    h.controller.CreateVolume(createReq({
      name: "asfs",
      volume_capabilities: [fsTypeCap("ext4")],
      volume_content_source: { snapshot: { snapshot_id: "db@s1@n1" } },
    })),
    Code.INVALID_ARGUMENT,
    /holds block, and the request asks for ext4/,
  );
  await assertRejectsCsi(
    h.controller.CreateVolume(createReq({
      name: "small",
      capacity_range: { required_bytes: "0", limit_bytes: String(GiB / 2) },
      volume_content_source: { volume: { volume_id: "db@n1" } },
    })),
    Code.OUT_OF_RANGE,
  );
});

Deno.test("DeleteSnapshot of a zvol's snapshot sets it aside (destroyed at retention 0), as for a dataset", async () => {
  using h = setup();
  await h.controller.CreateVolume(createReq());
  await h.controller.CreateSnapshot({
    source_volume_id: "db@n1",
    name: "s1",
    parameters: {},
    secrets: {},
  });
  const list = await h.controller.ListSnapshots({
    source_volume_id: "db@n1",
    snapshot_id: "",
    max_entries: 0,
    starting_token: "",
    secrets: {},
  }) as { entries: { snapshot: { snapshot_id: string } }[] };
  assert.deepEqual(list.entries.map((e) => e.snapshot.snapshot_id), ["db@s1@n1"]);
  await h.controller.DeleteSnapshot({ snapshot_id: "db@s1@n1", secrets: {} });
  assert.deepEqual([...h.pool.objects.keys()].filter((n) => n.includes("@")), []);
});

Deno.test("ControllerExpandVolume with only limit_bytes grows to the largest whole step within it", async () => {
  using h = setup();
  await h.controller.CreateVolume(createReq());
  const res = await h.controller.ControllerExpandVolume({
    volume_id: "db@n1",
    capacity_range: { required_bytes: "0", limit_bytes: String(2 * GiB + 1000) },
    volume_capability: null,
    secrets: {},
  });
  assert.deepEqual(res, { capacity_bytes: String(2 * GiB), node_expansion_required: false });
  assert.equal(h.pool.value(DB, "volsize"), String(2 * GiB));
  // Again: at the largest step within the limit already, nothing to set, the size answered.
  const sets = h.runner.argvs.filter((a) => a[1] === "set").length;
  assert.deepEqual(
    await h.controller.ControllerExpandVolume({
      volume_id: "db@n1",
      capacity_range: { required_bytes: "0", limit_bytes: String(2 * GiB + 1000) },
      volume_capability: null,
      secrets: {},
    }),
    res,
  );
  assert.equal(h.runner.argvs.filter((a) => a[1] === "set").length, sets);
  await assertRejectsCsi(
    h.controller.ControllerExpandVolume({
      volume_id: "db@n1",
      capacity_range: { required_bytes: String(3 * GiB + 1), limit_bytes: String(3 * GiB + 1000) },
      volume_capability: null,
      secrets: {},
    }),
    Code.OUT_OF_RANGE,
  );
});
