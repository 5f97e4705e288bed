/**
 * A follow volume made from a stored snapshot, on the in-memory store: the snapshot's chain is
 * copied to the new volume as its own backups (new uid, new stream keys, the same bytes), the
 * owner object starts at the snapshot, a retry goes on with the same uid, and names or data
 * that are not the new volume's are refused. The receive at its first stage runs in
 * tests/integration/follow_lifecycle_test.ts.
 */

import assert from "node:assert/strict";
import { assertRejectsCsi } from "../../tests/support/assert_errors.ts";
import { MemoryStore } from "../../tests/support/memory_store.ts";
import { fakeController, fakeServices, fsCap } from "../../tests/support/service_harness.ts";
import { Code } from "../errors.ts";
import { Logger } from "../log.ts";
import { releaseStored } from "../replicate/records.ts";
import { encodeJson, parseManifest } from "../store/chain.ts";
import { manifestKey, ownerKey, type SnapshotManifest, streamKey } from "../store/layout.ts";
import { parseStoredSnapshotId, storedSnapshotId } from "../store/snapshot_ids.ts";
import type { CreateVolumeRequest } from "../csi/types.ts";
import { parseOwner } from "./owner.ts";
import { seedFromSnapshot } from "./seed.ts";

const log = new Logger("error", {}, () => {});
const SRC_UID = "1".repeat(32);
const NEW_UID = "2".repeat(32);

function bytesOf(guid: string): Uint8Array {
  return new TextEncoder().encode(`stream ${guid} `.repeat(10 * Number(guid)));
}

function manifest(guid: string, baseGuid: string | null): SnapshotManifest {
  return {
    format: 1,
    volume: "src",
    volumeUid: SRC_UID,
    guid,
    baseGuid,
    snapshot: `.backup-${guid}`,
    kind: guid === "2" ? "requested" : "scheduled",
    ...(guid === "2" ? { csiName: "snap" } : {}),
    createdAt: `2026-01-0${guid}T00:00:00.000Z`,
    stream: streamKey("src", guid, "a".repeat(16)),
    size: bytesOf(guid).length,
    sha256: "0".repeat(64),
    raw: false,
    node: "n1",
    capacityBytes: 64 << 20,
  };
}

/** "src" with stored snapshots 1 ← 2 ← 3; snapshot 2 is the one restored. */
async function setup(): Promise<MemoryStore> {
  const store = new MemoryStore({ chunkSize: 7 });
  for (const m of [manifest("1", null), manifest("2", "1"), manifest("3", "2")]) {
    await store.putBytes(manifestKey("src", m.guid), encodeJson(m));
    await store.putBytes(m.stream, bytesOf(m.guid));
  }
  return store;
}

const ref = parseStoredSnapshotId(storedSnapshotId("src", "2"))!;
const spec = { source: ref, volume: "dst", node: "n9", log, newUid: () => NEW_UID };

function copied(store: MemoryStore, guid: string): SnapshotManifest | undefined {
  const bytes = store.peek(manifestKey("dst", guid));
  return bytes && parseManifest(bytes);
}

Deno.test("seedFromSnapshot copies the snapshot's chain as the new volume's own backups", async () => {
  const store = await setup();
  const seed = await seedFromSnapshot(store, spec);
  assert.equal(seed.uid, NEW_UID);
  assert.deepEqual(seed.head, { guid: "2", createdAt: "2026-01-02T00:00:00.000Z" });
  assert.equal(seed.copiedBytes, bytesOf("1").length + bytesOf("2").length);
  for (const guid of ["1", "2"]) {
    const m = copied(store, guid)!;
    assert.equal(m.volume, "dst");
    assert.equal(m.volumeUid, NEW_UID);
    assert.equal(m.kind, "scheduled");
    assert.equal(m.csiName, undefined);
    assert.equal(m.node, "n9");
    assert.match(m.stream, /^v1\/volumes\/dst\/streams\//);
    assert.deepEqual(store.peek(m.stream), bytesOf(guid), "the same bytes");
  }
  assert.equal(copied(store, "3"), undefined, "nothing after the snapshot");
  // The source may go now: the new volume owes it nothing.
  await releaseStored(store, "src", "3", log);
  await releaseStored(store, "src", "2", log);
  assert.ok(store.peek(copied(store, "2")!.stream));
});

Deno.test("seedFromSnapshot: a retry goes on where an interrupted copy stopped, with its uid", async () => {
  const store = await setup();
  // The first attempt copied stream 1 and its manifest, then stopped.
  const first: SnapshotManifest = { ...manifest("1", null), volume: "dst", volumeUid: NEW_UID };
  const key = streamKey("dst", "1", "b".repeat(16));
  await store.putBytes(key, bytesOf("1"));
  await store.putBytes(manifestKey("dst", "1"), encodeJson({ ...first, stream: key }));
  const seed = await seedFromSnapshot(store, { ...spec, newUid: () => "f".repeat(32) });
  assert.equal(seed.uid, NEW_UID, "the uid the copy began with");
  assert.equal(seed.copiedBytes, bytesOf("2").length, "only what was missing");
  assert.equal(copied(store, "1")!.stream, key);
  const again = await seedFromSnapshot(store, spec);
  assert.equal(again.copiedBytes, 0);
});

Deno.test("seedFromSnapshot refuses an unknown snapshot, an encrypted one, and a name with other data", async () => {
  const store = await setup();
  await assertRejectsCsi(
    seedFromSnapshot(store, {
      ...spec,
      source: parseStoredSnapshotId(storedSnapshotId("src", "9"))!,
    }),
    Code.NOT_FOUND,
    /not found in memory store/,
  );
  const raw = {
    ...manifest("1", null),
    volume: "enc",
    stream: streamKey("enc", "1", "a".repeat(16)),
    raw: true,
  };
  await store.putBytes(manifestKey("enc", "1"), encodeJson(raw));
  await assertRejectsCsi(
    seedFromSnapshot(store, {
      ...spec,
      source: parseStoredSnapshotId(storedSnapshotId("enc", "1"))!,
    }),
    Code.FAILED_PRECONDITION,
    /encrypted/,
  );
  // "dst" holds the backups of another volume.
  const other = {
    ...manifest("7", null),
    volume: "dst",
    volumeUid: "3".repeat(32),
    stream: streamKey("dst", "7", "a".repeat(16)),
  };
  await store.putBytes(manifestKey("dst", "7"), encodeJson(other));
  await assertRejectsCsi(seedFromSnapshot(store, spec), Code.ALREADY_EXISTS, /backups are there/);
});

Deno.test("CreateVolume follow=true from a stored snapshot starts its owner object at the snapshot", async () => {
  const parts = fakeServices({
    parent: "tank/nomad",
    flags: ["--store", "file:///srv/backups"],
    host: (runner) => runner,
  });
  const store = await setup();
  const service = fakeController(parts, { follow: { store, ttlSeconds: 30 } });
  const req = {
    name: "dst",
    volume_capabilities: [fsCap()],
    parameters: { follow: "true" },
    volume_content_source: { snapshot: { snapshot_id: ref.id } },
  } as unknown as CreateVolumeRequest;
  const answer = await service.CreateVolume(req) as { volume: Record<string, unknown> };
  assert.deepEqual(answer.volume, {
    volume_id: "dst@*",
    capacity_bytes: String(64 << 20),
    volume_context: {},
    content_source: { snapshot: { snapshot_id: ref.id } },
  });
  const owner = parseOwner(store.peek(ownerKey("dst"))!);
  assert.equal(owner.head, "2");
  assert.equal(owner.headAt, "2026-01-02T00:00:00.000Z");
  assert.equal(owner.generation, 0);
  assert.equal(owner.settings.capacityBytes, 64 << 20, "the size the volume had then");
  assert.equal(copied(store, "2")!.volumeUid, owner.uid);
  assert.deepEqual(await service.CreateVolume(req), answer, "a retry answers the same");
  assert.equal(parts.runner.calls.length, 0, "no zfs command on the controller's node");
  await assertRejectsCsi(
    service.CreateVolume({
      ...req,
      parameters: { follow: "true", casesensitivity: "insensitive" },
    } as CreateVolumeRequest),
    Code.INVALID_ARGUMENT,
    /"casesensitivity" cannot be given to a volume made from a stored snapshot/,
  );
});
