/**
 * The CSI handlers' follow side without zfs: CreateVolume and DeleteVolume of a volume that
 * follows its job act on the store only, and NodeStage refuses clearly without a store. The
 * moves themselves run on real pools in tests/integration/follow_*_test.ts.
 */

import assert from "node:assert/strict";
import { Code } from "../errors.ts";
import { assertRejectsCsi } from "../../tests/support/assert_errors.ts";
import { MemoryStore } from "../../tests/support/memory_store.ts";
import {
  createFollowOwner,
  followManifest,
  holdAs,
  storeManifests,
} from "../../tests/support/follow_harness.ts";
import {
  fakeController,
  fakeNode,
  fakeServices,
  fsCap,
} from "../../tests/support/service_harness.ts";
import type { ControllerExpandVolumeRequest, CreateVolumeRequest } from "../csi/types.ts";
import { parseVolumeRecord } from "../store/chain.ts";
import { ownerKey, volumeRecordKey } from "../store/layout.ts";
import { acquire, moveHead, parseOwner, release } from "./owner.ts";
import { splitFollow } from "./volume.ts";

const PARENT = "tank/nomad";

function controller(withStore: boolean) {
  const parts = fakeServices({
    parent: PARENT,
    flags: withStore ? ["--store", "file:///srv/backups"] : [],
    // No zfs command is expected: the follow side of the controller uses the store only.
    host: (runner) => runner,
  });
  const store = new MemoryStore();
  const service = fakeController(
    parts,
    withStore ? { follow: { store, ttlSeconds: 30 } } : {},
  );
  return { service, store, runner: parts.runner };
}

function createReq(over: Partial<CreateVolumeRequest> = {}): CreateVolumeRequest {
  return {
    name: "pg-data",
    capacity_range: { required_bytes: String(1 << 30), limit_bytes: "0" },
    volume_capabilities: [fsCap()],
    parameters: { follow: "true", compression: "lz4" },
    ...over,
  } as CreateVolumeRequest;
}

Deno.test("CreateVolume follow=true writes the owner object and record, answers <name>@* without topology", async () => {
  const { service, store, runner } = controller(true);
  const answer = await service.CreateVolume(createReq()) as {
    volume: Record<string, unknown>;
  };
  assert.deepEqual(answer.volume, {
    volume_id: "pg-data@*",
    capacity_bytes: String(1 << 30),
    volume_context: {},
  });
  assert.equal(runner.calls.length, 0, "no zfs command: no dataset on the controller's node");
  const owner = parseOwner(store.peek(ownerKey("pg-data"))!);
  assert.equal(owner.state, "released");
  assert.equal(owner.generation, 0);
  assert.equal(owner.settings.capacityBytes, 1 << 30);
  assert.equal(owner.settings.properties.compression, "lz4");
  assert.equal(owner.settings.properties.refquota, String(1 << 30));
  assert.equal(owner.settings.properties["org.zfs-csi:backup-interval"], "60");
  assert.equal(owner.settings.properties["org.zfs-csi:managed"], "yes");
  const record = parseVolumeRecord(store.peek(volumeRecordKey("pg-data"))!);
  assert.equal(record.uid, owner.uid, "manifests of every node carry the same uid");
  assert.equal(record.parameters.follow, "true");
  // A retry answers the same; another size is another volume.
  assert.deepEqual(await service.CreateVolume(createReq()), answer);
  await assertRejectsCsi(
    service.CreateVolume(
      createReq({ capacity_range: { required_bytes: String(2 * 2 ** 30), limit_bytes: "0" } }),
    ),
    Code.ALREADY_EXISTS,
    /with other parameters, size, standby nodes or source/,
  );
});

Deno.test("CreateVolume follow=true is ALREADY_EXISTS once a node held the volume", async () => {
  const { service, store } = controller(true);
  await service.CreateVolume(createReq());
  await acquire(store, "pg-data", {
    node: "node-b",
    nowMs: Date.now(),
    ttlSeconds: 30,
    mayTakeOver: () => ({ ok: false, message: "no" }),
  });
  await assertRejectsCsi(
    service.CreateVolume(createReq()),
    Code.ALREADY_EXISTS,
    /held by node "node-b"/,
  );
});

Deno.test("CreateVolume follow=true refuses without a store, a zero interval, or a source", async () => {
  await assertRejectsCsi(
    controller(false).service.CreateVolume(createReq()),
    Code.FAILED_PRECONDITION,
    /needs a store shared by the nodes.*--store/,
  );
  const { service } = controller(true);
  await assertRejectsCsi(
    service.CreateVolume(createReq({ parameters: { follow: "true", backup_interval: "0" } })),
    Code.INVALID_ARGUMENT,
    /backup_interval cannot be 0/,
  );
  await assertRejectsCsi(
    service.CreateVolume(
      createReq({ volume_content_source: { volume: { volume_id: "other@n1" } } }),
    ),
    Code.INVALID_ARGUMENT,
    /from a snapshot in the store \(an id store:…\) only, not from a volume/,
  );
  await assertRejectsCsi(
    service.CreateVolume(createReq({ parameters: { follow: "yes" } })),
    Code.INVALID_ARGUMENT,
    /"follow" must be "true" or "false"/,
  );
});

Deno.test("DeleteVolume of a held follow volume is refused naming the holder, and marks it deleted once released", async () => {
  const { service, store, runner } = controller(true);
  await service.CreateVolume(createReq());
  const held = await acquire(store, "pg-data", {
    node: "node-b",
    nowMs: Date.now(),
    ttlSeconds: 30,
    mayTakeOver: () => ({ ok: false, message: "no" }),
  });
  await assertRejectsCsi(
    service.DeleteVolume({ volume_id: "pg-data@*", secrets: {} }),
    Code.FAILED_PRECONDITION,
    /in use: held by node "node-b"/,
  );
  assert.equal(parseOwner(store.peek(ownerKey("pg-data"))!).state, "held");
  // Released: the store marks it deleted; this node has no copy (zfs says so).
  await release(store, "pg-data", held.holding, undefined, Date.now());
  runner.on(["zfs", "get"], () => ({
    code: 1,
    stderr: "cannot open 'tank/nomad/pg-data': dataset does not exist\n",
  }));
  runner.on(["mount"], () => ({ code: 0, stdout: "" }));
  runner.on(["findmnt"], () => ({ code: 0, stdout: "" }));
  await service.DeleteVolume({ volume_id: "pg-data@*", secrets: {} });
  assert.equal(parseOwner(store.peek(ownerKey("pg-data"))!).state, "deleted");
  const record = parseVolumeRecord(store.peek(volumeRecordKey("pg-data"))!);
  assert.ok(record.deletedAt, "the record's deletedAt starts the store's retention");
});

Deno.test("NodeStageVolume of a follow volume without a store fails saying so", async () => {
  const parts = fakeServices({ parent: PARENT, host: (runner) => runner });
  const node = fakeNode(parts);
  for (
    const [id, ctx] of [["pg-data@*", {}], ["pg-data", { follow: "true" }]] as const
  ) {
    await assertRejectsCsi(
      node.NodeStageVolume({
        volume_id: id,
        staging_target_path: "/local/csi/staging/pg",
        volume_capability: fsCap(),
        volume_context: ctx,
        publish_context: {},
        secrets: {},
      }),
      Code.FAILED_PRECONDITION,
      /follows its job through a store, and this plugin has none/,
    );
  }
  assert.equal(parts.runner.calls.length, 0, "nothing ran");
});

Deno.test("splitFollow takes the key out and reads only true and false", () => {
  assert.deepEqual(splitFollow({ follow: "true", size: "1G" }), {
    follow: true,
    rest: { size: "1G" },
  });
  assert.deepEqual(splitFollow(undefined), { follow: false, rest: {} });
  assert.deepEqual(splitFollow({ follow: "false" }), { follow: false, rest: {} });
});

Deno.test("ValidateVolumeCapabilities of a follow id asks the store, not this node's zfs", async () => {
  const { service, runner } = controller(true);
  await assertRejectsCsi(
    service.ValidateVolumeCapabilities({
      volume_id: "pg-data@*",
      volume_capabilities: [fsCap()],
      volume_context: {},
      parameters: {},
      secrets: {},
      mutable_parameters: {},
    }),
    Code.NOT_FOUND,
    /"pg-data@\*" not found/,
  );
  await service.CreateVolume(createReq());
  const res = await service.ValidateVolumeCapabilities({
    volume_id: "pg-data@*",
    volume_capabilities: [fsCap()],
    volume_context: { follow: "true" },
    parameters: {},
    secrets: {},
    mutable_parameters: {},
  }) as { confirmed?: unknown; message?: string };
  assert.ok(res.confirmed, String(res.message));
  assert.equal(runner.calls.length, 0);
});

function expandReq(id: string, required: string, limit: string): ControllerExpandVolumeRequest {
  return {
    volume_id: id,
    capacity_range: { required_bytes: required, limit_bytes: limit },
  } as ControllerExpandVolumeRequest;
}

Deno.test("ControllerExpandVolume of a follow volume grows it in the store; node expansion only while a node holds it", async () => {
  const { service, store, runner } = controller(true);
  await service.CreateVolume(createReq());
  const expand = (bytes: number) =>
    service.ControllerExpandVolume(expandReq("pg-data@*", String(bytes), "0")) as Promise<
      Record<string, unknown>
    >;
  assert.deepEqual(await expand(2 * 2 ** 30), {
    capacity_bytes: String(2 * 2 ** 30),
    node_expansion_required: false,
  });
  const owner = () => parseOwner(store.peek(ownerKey("pg-data"))!);
  assert.equal(owner().settings.capacityBytes, 2 * 2 ** 30);
  assert.equal(owner().settings.properties.refquota, String(2 * 2 ** 30));
  assert.equal(owner().settings.properties.compression, "lz4", "the other settings stay");
  await acquire(store, "pg-data", {
    node: "node-b",
    nowMs: Date.now(),
    ttlSeconds: 30,
    mayTakeOver: () => ({ ok: false, message: "no" }),
  });
  assert.deepEqual(await expand(3 * 2 ** 30), {
    capacity_bytes: String(3 * 2 ** 30),
    node_expansion_required: true,
  });
  assert.equal(owner().holder, "node-b", "still held: the expansion changes the size only");
  // A smaller required size without a limit is met already: no shrink is asked for.
  assert.equal((await expand(2 ** 30)).capacity_bytes, String(3 * 2 ** 30));
  await assertRejectsCsi(
    service.ControllerExpandVolume(expandReq("pg-data@*", "0", String(2 ** 30))),
    Code.OUT_OF_RANGE,
    /shrinking/,
  );
  await assertRejectsCsi(
    service.ControllerExpandVolume(expandReq("other@*", String(2 ** 30), "0")),
    Code.NOT_FOUND,
    /"other@\*" not found/,
  );
  assert.equal(runner.calls.length, 0, "no zfs command on the controller's node");
});

Deno.test("CreateSnapshot of a follow volume answers its size at the copy, not the copy's stream", async () => {
  const { service, store, runner } = controller(true);
  const MiB = 2 ** 20;
  await createFollowOwner(store, { settings: { capacityBytes: 512 * MiB, properties: {} } });
  await storeManifests(store, [
    followManifest("1", null, { size: 300 * MiB, referencedBytes: 300 * MiB }),
    followManifest("2", "1", { size: 624, referencedBytes: 301 * MiB }),
    // Stored by a plugin from before manifests recorded the size.
    followManifest("3", "2", { size: 700, capacityBytes: 512 * MiB }),
  ]);
  let held = await holdAs(store, "n1");
  const head = async (guid: string) => {
    held = await moveHead(store, "pg", held, { guid, createdAt: "x" }, 0);
  };
  const snapshot = async (name: string) =>
    ((await service.CreateSnapshot({
      source_volume_id: "pg@*",
      name,
      parameters: {},
      secrets: {},
    })) as {
      snapshot: { size_bytes: string };
    }).snapshot.size_bytes;
  await head("2");
  assert.equal(await snapshot("monday"), String(301 * MiB));
  // Without a recorded size: its chain's streams (what a restore receives), at most its capacity.
  await head("3");
  assert.equal(await snapshot("tuesday"), String(300 * MiB + 624 + 700));
  assert.equal(runner.calls.length, 0, "no zfs command on the controller's node");
});
