/**
 * The controller's store side without a real store: a restore's key checks, made before anything
 * is received (the receive itself runs on real pools in tests/integration/store_*_test.ts).
 */

import assert from "node:assert/strict";
import { Code } from "../errors.ts";
import { assertRejectsCsi } from "../../tests/support/assert_errors.ts";
import { FakeStreamRunner } from "../../tests/support/fake_stream_runner.ts";
import { MemoryStore } from "../../tests/support/memory_store.ts";
import {
  fakeController,
  fakeServices,
  fakeTrash,
  fsCap,
} from "../../tests/support/service_harness.ts";
import { encodeJson, parseVolumeRecord } from "../store/chain.ts";
import { manifestKey, type SnapshotManifest, streamKey, volumeRecordKey } from "../store/layout.ts";
import { storedSnapshotId } from "../store/snapshot_ids.ts";
import { BackupScheduler } from "../replicate/scheduler.ts";
import { StoredSnapshots } from "./stored_snapshots.ts";
import type { CreateVolumeRequest } from "./types.ts";

const PARENT = "tank/nomad";

/** A controller with a store holding one full snapshot of "pg", `raw` or not. */
async function setup(raw: boolean, referencedBytes?: number) {
  const parts = fakeServices({
    parent: PARENT,
    flags: ["--store", "file:///srv/backups", "--key-dir", "/etc/zfs/keys"],
    host: (runner) => runner,
  });
  const { zfs, locks, log, runner } = parts;
  const store = new MemoryStore();
  const guid = "1234";
  const manifest: SnapshotManifest = {
    format: 1,
    volume: "pg",
    volumeUid: "0".repeat(32),
    guid,
    baseGuid: null,
    snapshot: ".backup-1700000000",
    kind: "scheduled",
    createdAt: "2024-01-01T00:00:00.000Z",
    stream: streamKey("pg", guid, "0".repeat(32)),
    size: 3,
    sha256: "0".repeat(64),
    raw,
    node: "node-a",
    capacityBytes: 1 << 30,
    ...(referencedBytes !== undefined ? { referencedBytes } : {}),
  };
  await store.putBytes(manifestKey("pg", guid), encodeJson(manifest));
  await store.putBytes(manifest.stream, new Uint8Array([1, 2, 3]));
  const trash = fakeTrash(parts);
  const streams = new FakeStreamRunner(() => ({ code: 1, stderr: "not expected" }));
  const scheduler = new BackupScheduler({
    zfs,
    parentDataset: PARENT,
    log,
    backup: () => Promise.reject(new Error("no backups in this test")),
  });
  const stored = new StoredSnapshots({
    zfs,
    store,
    parentDataset: PARENT,
    nodeId: "n1",
    locks,
    trash,
    scheduler,
    backup: {
      zfs,
      store,
      send: () => Promise.reject(new Error("no sends in this test")),
      locks,
      log,
      parentDataset: PARENT,
      node: "n1",
    },
    receive: { streams, zfsPath: "zfs", zfs, store, log },
    log,
  });
  const controller = fakeController(parts, { stored, scheduler }, trash);
  // zfs-fuse's answer to the probe of receive's -x (zfs.ts receiveOverrides).
  runner.when((argv) => argv[1] === "receive" && argv.includes("-n"), {
    code: 2,
    stderr: "invalid option 'x'\n",
  });
  // The parent exists and knows every property asked; the target does not exist yet.
  runner.on(
    ["zfs", "get"],
    (argv) =>
      argv.at(-1) === PARENT
        ? { stdout: `${PARENT}\t${argv.at(-2)}\t-\t-\n` }
        : { code: 1, stderr: `cannot open '${argv.at(-1)}': dataset does not exist\n` },
  );
  return {
    ...parts,
    controller,
    stored,
    store,
    manifest,
    streams,
    id: storedSnapshotId("pg", guid),
  };
}

function restoreReq(id: string, parameters: Record<string, string>): CreateVolumeRequest {
  return {
    name: "restored",
    capacity_range: null,
    volume_capabilities: [fsCap()],
    parameters,
    secrets: {},
    volume_content_source: { snapshot: { snapshot_id: id } },
    accessibility_requirements: null,
    mutable_parameters: {},
  };
}

Deno.test("ControllerService.CreateVolume from an encrypted stored snapshot needs keylocation, before any receive", async () => {
  const h = await setup(true);
  await assertRejectsCsi(
    h.controller.CreateVolume(restoreReq(h.id, {})),
    Code.INVALID_ARGUMENT,
    `Snapshot "${h.id}" is of an encrypted volume, stored encrypted: give parameter keylocation ` +
      "(file:///<a file below --key-dir> holding its key) to restore it",
  );
  // keylocation alone, without encryption, is how a restore names the key: not refused as such.
  const withKey = h.controller.CreateVolume(
    restoreReq(h.id, { keylocation: "file:///etc/zfs/keys/pg.key" }),
  );
  await assert.rejects(withKey, (err: Error) => !/needs "encryption"/.test(err.message));
  assert.equal(h.streams.processes.length > 0, true, "the keyed restore went on to receive");
});

Deno.test("ControllerService.CreateVolume from an unencrypted stored snapshot takes no keylocation", async () => {
  const h = await setup(false);
  await assertRejectsCsi(
    h.controller.CreateVolume(restoreReq(h.id, { keylocation: "file:///etc/zfs/keys/pg.key" })),
    Code.INVALID_ARGUMENT,
    `Snapshot "${h.id}" is of an unencrypted volume: it takes no keylocation`,
  );
  assert.equal(h.streams.processes.length, 0, "nothing received");
  // A plain create still needs encryption with a keylocation.
  await assertRejectsCsi(
    h.controller.CreateVolume({
      ...restoreReq(h.id, { keylocation: "file:///etc/zfs/keys/pg.key" }),
      volume_content_source: null,
    }),
    Code.INVALID_ARGUMENT,
    'Parameter "keylocation" needs "encryption"',
  );
});

Deno.test("StoredSnapshots.list believes a manifest only under its own volume's key, and skips one it cannot read", async () => {
  const h = await setup(false);
  // A copy of pg's manifest under "web", and an object that is no manifest under pg.
  await h.store.putBytes(manifestKey("web", h.manifest.guid), encodeJson(h.manifest));
  await h.store.putBytes(manifestKey("pg", "99"), new TextEncoder().encode("not json"));
  const ids = (await h.stored.list()).map((e) => e.id);
  assert.deepEqual(ids, [h.id]);
  assert.deepEqual((await h.stored.list("web")).map((e) => e.id), []);
  // Read again through the cache: the same answer.
  assert.deepEqual((await h.stored.list()).map((e) => e.id), [h.id]);
  assert.ok(
    h.logs.some((l) => l.includes("store holds a manifest that cannot be read")),
    "the unreadable one is logged",
  );
});

Deno.test("StoredSnapshots.volumeDeleted and volumeRestored mark only the record of the volume's own uid", async () => {
  const h = await setup(false);
  const uid = "0".repeat(32);
  const key = volumeRecordKey("pg");
  await h.store.putBytes(
    key,
    encodeJson({
      format: 1,
      name: "pg",
      uid,
      createdAt: "2024-01-01T00:00:00.000Z",
      capacityBytes: 1 << 30,
      parameters: {},
      node: "node-a",
    }),
  );
  const record = () => parseVolumeRecord(h.store.peek(key)!);
  await h.stored.volumeDeleted("pg", "f".repeat(32));
  assert.equal(record().deletedAt, undefined, "another uid's delete leaves the record alone");
  await h.stored.volumeDeleted("pg", uid);
  const deletedAt = record().deletedAt;
  assert.ok(deletedAt, "marked deleted");
  await h.stored.volumeDeleted("pg", uid);
  assert.equal(record().deletedAt, deletedAt, "a repeated delete keeps the first mark");
  await h.stored.volumeRestored("pg", uid);
  assert.equal(record().deletedAt, undefined, "restored under its own name: the mark goes");
  assert.equal(record().uid, uid);
});

Deno.test("ControllerService.CreateVolume from a stored snapshot refuses a capacity below what the snapshot holds, before any receive", async () => {
  const h = await setup(false, 300 << 20);
  const sized = (bytes: number): CreateVolumeRequest => ({
    ...restoreReq(h.id, {}),
    capacity_range: { required_bytes: String(bytes), limit_bytes: "0" },
  });
  await assertRejectsCsi(
    h.controller.CreateVolume(sized(100 << 20)),
    Code.OUT_OF_RANGE,
    `Snapshot "${h.id}" holds ${300 << 20} bytes, more than the requested capacity of ` +
      `${100 << 20} bytes`,
  );
  assert.equal(h.streams.processes.length, 0, "nothing received");
  // Enough room: it goes on to receive (the fake stream fails it later, not the size).
  await assert.rejects(
    h.controller.CreateVolume(sized(400 << 20)),
    (err: Error) => !/requested capacity/.test(err.message),
  );
  assert.ok(h.streams.processes.length > 0, "received");
});
