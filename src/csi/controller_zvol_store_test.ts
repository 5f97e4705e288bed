/**
 * Zvols through the store (docs/block-volumes.md): CreateSnapshot to the store of a zvol and
 * CreateVolume from it, on a model pool (FakePool) with a model `zfs receive` that makes what
 * the stream holds. What a restore gives the zvol (its records anew, a full reservation, the
 * format record only when the snapshot surely holds the whole filesystem) and what it refuses
 * (a zvol's snapshot as a dataset and the reverse, another content, a smaller size) are shown
 * here; real zfs send/receive of zvols is proven in the OpenZFS VM
 * (tests/integration/block_store_test.ts).
 */

import assert from "node:assert/strict";
import { createHash } from "node:crypto";
import { Code } from "../errors.ts";
import { assertRejectsCsi } from "../../tests/support/assert_errors.ts";
import { FakePool } from "../../tests/support/fake_pool.ts";
import { FakeStreamRunner } from "../../tests/support/fake_stream_runner.ts";
import { MemoryStore } from "../../tests/support/memory_store.ts";
import {
  blockCap,
  fakeController,
  fakeServices,
  fakeTrash,
  fsCap,
} from "../../tests/support/service_harness.ts";
import { parseManifest } from "../store/chain.ts";
import { volumeRecordKey } from "../store/layout.ts";
import { BackupScheduler } from "../replicate/scheduler.ts";
import { restoreTempDataset } from "../replicate/restore.ts";
import { StoredSnapshots } from "./stored_snapshots.ts";
import type { CreateVolumeRequest, VolumeCapability } from "./types.ts";

const PARENT = "tank/nomad";
const GiB = 1024 * 1024 * 1024;
const encoder = new TextEncoder();

function fsTypeCap(fsType: string): VolumeCapability {
  const cap = fsCap();
  return { ...cap, mount: { ...cap.mount!, fs_type: fsType } };
}

function createReq(
  name: string,
  cap: VolumeCapability,
  over: Partial<CreateVolumeRequest> = {},
): CreateVolumeRequest {
  return {
    name,
    capacity_range: null,
    volume_capabilities: [cap],
    parameters: {},
    secrets: {},
    volume_content_source: null,
    accessibility_requirements: null,
    mutable_parameters: {},
    ...over,
  };
}

const from = (id: string) => ({ volume_content_source: { snapshot: { snapshot_id: id } } });

/**
 * A controller with --block-volumes and a store. Snapshots get a guid; `zfs send` is a stream
 * naming its snapshot; `zfs receive` of one makes the snapshot's dataset again at the target,
 * a volume with the source's volsize and volblocksize (as zfs does), nothing set locally.
 */
function setup() {
  let guid = 5000;
  let pool: FakePool | undefined;
  const parts = fakeServices({
    parent: PARENT,
    flags: [
      "--block-volumes",
      "--allow-sparse-zvols",
      "--store",
      "file:///srv/backups",
      "--deleted-retention",
      "0",
    ],
    before: (runner) => {
      runner.on(["zfs", "snapshot"], (argv) => {
        const name = argv.at(-1)!;
        if (pool!.has(name)) return { code: 1, stderr: `cannot create snapshot: exists\n` };
        pool!.add(name, {
          guid: [String(++guid), "-"],
          createtxg: [String(guid), "-"],
          creation: ["1700000000", "-"],
          referenced: [String(1 << 20), "-"],
        });
        return {};
      });
    },
    host: (
      runner,
    ) => (pool = new FakePool(runner).add(PARENT).serveCreates(runner, { version: "zfs-2.2.2-1" })),
  });
  pool!.receiveOverrides = true;
  const { zfs, locks, log, runner } = parts;
  const store = new MemoryStore();
  const trash = fakeTrash(parts);
  const streams = new FakeStreamRunner((argv) => {
    if (argv[1] !== "receive") return { code: 1, stderr: `not expected: ${argv.join(" ")}` };
    const target = argv.at(-1)!;
    return {
      onStdinEnd: (bytes) => {
        const snapshot = new TextDecoder().decode(bytes);
        const source = snapshot.slice(0, snapshot.indexOf("@"));
        pool!.add(target, { creation: [String(Math.floor(Date.now() / 1000)), "-"] });
        pool!.setValue(target, "type", pool!.value(source, "type")!);
        for (const p of ["volsize", "volblocksize"]) {
          pool!.setValue(target, p, [pool!.value(source, p)!, p === "volsize" ? "local" : "-"]);
        }
        const component = snapshot.slice(snapshot.indexOf("@") + 1);
        pool!.add(`${target}@${component}`, { guid: [pool!.value(snapshot, "guid")!, "-"] });
        return { code: 0, stderr: "" };
      },
    };
  });
  const scheduler = new BackupScheduler({
    zfs,
    parentDataset: PARENT,
    log,
    backup: () => Promise.reject(new Error("no scheduled backups in this test")),
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
      send: async (spec) => {
        const bytes = encoder.encode(spec.snapshot);
        await store.putStream(spec.key, ReadableStream.from([bytes]));
        return { size: bytes.length, sha256: createHash("sha256").update(bytes).digest("hex") };
      },
      locks,
      log,
      parentDataset: PARENT,
      node: "n1",
    },
    receive: { streams, zfsPath: "zfs", zfs, store, log },
    log,
  });
  const controller = fakeController(parts, { stored, scheduler }, trash);
  return { runner, pool: pool!, store, controller, streams };
}

/** Makes zvol `name` holding `cap`'s content and stores a snapshot of it; returns its id. */
async function storedZvol(
  h: ReturnType<typeof setup>,
  name: string,
  cap: VolumeCapability,
  records: Record<string, string> = {},
): Promise<string> {
  const made = await h.controller.CreateVolume(
    createReq(name, cap, { capacity_range: { required_bytes: String(GiB), limit_bytes: "0" } }),
  ) as { volume: { volume_id: string } };
  for (const [k, v] of Object.entries(records)) h.pool.setValue(`${PARENT}/${name}`, k, v);
  const snap = await h.controller.CreateSnapshot({
    source_volume_id: made.volume.volume_id,
    name: `${name}-snap`,
    parameters: { store: "true" },
    secrets: {},
  }) as { snapshot: { snapshot_id: string; ready_to_use: boolean } };
  assert.equal(snap.snapshot.ready_to_use, true);
  return snap.snapshot.snapshot_id;
}

Deno.test("CreateSnapshot to the store of a zvol records it as a zvol: content, volblocksize, formatted, volsize", async () => {
  const h = setup();
  await storedZvol(h, "files", fsTypeCap("ext4"), { "org.zfs-csi:format": "done" });
  await storedZvol(h, "disk", blockCap());
  const manifests = h.store.keys().filter((k) => /\/snapshots\/[0-9a-f]{16}\.json$/.test(k))
    .map((k) => parseManifest(h.store.peek(k)!));
  const by = new Map(manifests.map((m) => [m.volume, m]));
  assert.deepEqual(by.get("files")?.zvol, {
    content: "ext4",
    volblocksize: 16384,
    formatted: true,
  });
  assert.deepEqual(by.get("disk")?.zvol, {
    content: "block",
    volblocksize: 16384,
    formatted: false,
  });
  assert.equal(by.get("files")?.capacityBytes, GiB);
});

Deno.test("CreateVolume from a zvol's stored snapshot makes a zvol of the same content, formatted when its snapshot was", async () => {
  const h = setup();
  const id = await storedZvol(h, "files", fsTypeCap("ext4"), { "org.zfs-csi:format": "done" });
  const out = await h.controller.CreateVolume(createReq("copy", fsTypeCap("ext4"), from(id))) as {
    volume: { capacity_bytes: string; volume_context: Record<string, string> };
  };
  const copy = `${PARENT}/copy`;
  assert.equal(h.pool.value(copy, "type"), "volume");
  assert.equal(out.volume.capacity_bytes, String(GiB));
  assert.equal(out.volume.volume_context.fs_type, "ext4");
  assert.equal(h.pool.value(copy, "org.zfs-csi:fs-type"), "ext4");
  assert.equal(h.pool.value(copy, "org.zfs-csi:format"), "done");
  assert.equal(h.pool.value(copy, "org.zfs-csi:managed"), "yes");
  assert.equal(h.pool.value(copy, "refreservation"), "auto");
  assert.equal(h.pool.has(restoreTempDataset(PARENT, copy)), false);
  // A repeat answers with the same volume.
  const again = await h.controller.CreateVolume(createReq("copy", fsTypeCap("ext4"), from(id)));
  assert.deepEqual(again, out);
});

Deno.test("CreateVolume from a zvol's stored snapshot taken before its filesystem was made leaves no format record, and grows to the size asked", async () => {
  const h = setup();
  const id = await storedZvol(h, "files", fsTypeCap("xfs"));
  await h.controller.CreateVolume(
    createReq("copy", fsTypeCap("xfs"), {
      ...from(id),
      capacity_range: { required_bytes: String(2 * GiB), limit_bytes: "0" },
      parameters: { sparse: "true" },
    }),
  );
  const copy = `${PARENT}/copy`;
  assert.equal(h.pool.value(copy, "org.zfs-csi:format"), undefined);
  assert.equal(h.pool.value(copy, "volsize"), String(2 * GiB));
  assert.equal(h.pool.value(copy, "refreservation"), "none", "sparse: nothing reserved");
});

Deno.test("CreateVolume refuses a zvol's stored snapshot as a dataset, another content or a smaller size, and a dataset's as a zvol, before any receive", async () => {
  const h = setup();
  const id = await storedZvol(h, "files", fsTypeCap("ext4"), { "org.zfs-csi:format": "done" });
  await assertRejectsCsi(
    h.controller.CreateVolume(createReq("a", fsCap(), from(id))),
    Code.INVALID_ARGUMENT,
    /is of a zvol holding ext4: restore it as a zvol \(fs_type "ext4"\)/,
  );
  await assertRejectsCsi(
    h.controller.CreateVolume(createReq("b", blockCap(), from(id))),
    Code.INVALID_ARGUMENT,
    /holding ext4, and the request asks for block/,
  );
  await assertRejectsCsi(
    h.controller.CreateVolume(
      createReq("c", fsTypeCap("ext4"), {
        ...from(id),
        capacity_range: { required_bytes: String(GiB / 2), limit_bytes: String(GiB / 2) },
      }),
    ),
    Code.OUT_OF_RANGE,
    /never shrunk/,
  );
  await assertRejectsCsi(
    h.controller.CreateVolume(
      createReq("d", fsTypeCap("ext4"), { ...from(id), parameters: { volblocksize: "8K" } }),
    ),
    Code.INVALID_ARGUMENT,
    /volblocksize/,
  );
  // A dataset's stored snapshot as a zvol.
  const ds = await h.controller.CreateVolume(createReq("pg", fsCap())) as {
    volume: { volume_id: string };
  };
  const dsSnap = await h.controller.CreateSnapshot({
    source_volume_id: ds.volume.volume_id,
    name: "pg-snap",
    parameters: { store: "true" },
    secrets: {},
  }) as { snapshot: { snapshot_id: string } };
  await assertRejectsCsi(
    h.controller.CreateVolume(createReq("e", blockCap(), from(dsSnap.snapshot.snapshot_id))),
    Code.INVALID_ARGUMENT,
    /is of a ZFS dataset: a zvol is restored only from a zvol's snapshot/,
  );
  assert.deepEqual(h.streams.processes.filter((p) => p.argv[1] === "receive"), []);
  for (const name of ["a", "b", "c", "d", "e"]) {
    assert.equal(h.pool.has(`${PARENT}/${name}`), false);
  }
});

Deno.test("CreateVolume of a zvol takes backup_interval/backup_keep with a store; DeleteVolume keeps its backups for the retention", async () => {
  const h = setup();
  const made = await h.controller.CreateVolume(
    createReq("disk", blockCap(), {
      capacity_range: { required_bytes: String(GiB), limit_bytes: "0" },
      parameters: { backup_interval: "15m", backup_keep: "last=4,daily=7" },
    }),
  ) as { volume: { volume_id: string } };
  const ds = `${PARENT}/disk`;
  assert.equal(h.pool.value(ds, "org.zfs-csi:backup-interval"), "900");
  assert.equal(h.pool.value(ds, "org.zfs-csi:backup-keep"), "last=4,hourly=0,daily=7,weekly=0");
  await h.controller.CreateSnapshot({
    source_volume_id: made.volume.volume_id,
    name: "disk-snap",
    parameters: { store: "true" },
    secrets: {},
  });
  const snapshotId = (await h.controller.ListSnapshots({
    source_volume_id: made.volume.volume_id,
    snapshot_id: "",
    max_entries: 0,
    starting_token: "",
    secrets: {},
  }) as {
    entries: { snapshot: { snapshot_id: string } }[];
  }).entries[0]!.snapshot.snapshot_id;
  await h.controller.DeleteSnapshot({ snapshot_id: snapshotId, secrets: {} });
  await h.controller.DeleteVolume({ volume_id: made.volume.volume_id, secrets: {} });
  const record = JSON.parse(new TextDecoder().decode(h.store.peek(volumeRecordKey("disk"))!));
  assert.match(record.deletedAt, /^\d{4}-/, "the volume's record in the store is marked deleted");
});

Deno.test("CreateVolume of a zvol with backup parameters and no store is refused naming --store", async () => {
  const parts = fakeServices({
    parent: PARENT,
    flags: ["--block-volumes"],
    host: (runner) =>
      new FakePool(runner).add(PARENT).serveCreates(runner, { version: "zfs-2.2.2-1" }),
  });
  const controller = fakeController(parts);
  await assertRejectsCsi(
    controller.CreateVolume(
      createReq("disk", blockCap(), { parameters: { backup_interval: "1h" } }),
    ),
    Code.INVALID_ARGUMENT,
    /need a store.*--store/,
  );
  assert.equal(parts.host.has(`${PARENT}/disk`), false);
});
