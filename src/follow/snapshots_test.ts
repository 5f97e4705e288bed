/**
 * Snapshots of follow volumes on the in-memory store: CreateSnapshot pins the head's stored
 * snapshot (kind "requested", the CSI name, the copy's own time), which the keep policy then
 * keeps with its chain after the head moved on; names are unique; DeleteSnapshot unpins a
 * snapshot on the head's chain and removes one off it. Real zfs and two plugins:
 * tests/integration/follow_lifecycle_test.ts.
 */

import assert from "node:assert/strict";
import { assertRejectsCsi } from "../../tests/support/assert_errors.ts";
import {
  createFollowOwner,
  followManifest,
  holdAs,
  storeManifests,
} from "../../tests/support/follow_harness.ts";
import { MemoryStore } from "../../tests/support/memory_store.ts";
import { Logger } from "../log.ts";
import { Code } from "../errors.ts";
import { parseManifest } from "../store/chain.ts";
import { manifestKey, type SnapshotManifest } from "../store/layout.ts";
import { retained } from "../store/policy.ts";
import { parseStoredSnapshotId, storedSnapshotId } from "../store/snapshot_ids.ts";
import { type Holding, markDeleted, moveHead, release } from "./owner.ts";
import { FollowSnapshots } from "./snapshots.ts";

const log = new Logger("error", {}, () => {});

/** Stored snapshot `guid` of `volume`, made on day `guid` of January 2026. */
function manifest(volume: string, guid: string, baseGuid: string | null): SnapshotManifest {
  return followManifest(guid, baseGuid, {
    volume,
    createdAt: `2026-01-0${guid}T00:00:00.000Z`,
    size: 100 * Number(guid),
  });
}

/** Stores the manifest and a stream of one byte. */
async function put(store: MemoryStore, m: SnapshotManifest): Promise<void> {
  await storeManifests(store, [m], { stream: () => new Uint8Array(1) });
}

function read(store: MemoryStore, volume: string, guid: string): SnapshotManifest | undefined {
  const bytes = store.peek(manifestKey(volume, guid));
  return bytes && parseManifest(bytes);
}

/** "pg", held by n1, with stored snapshots 1 ← 2 and the head at 2. */
async function setup(): Promise<{ store: MemoryStore; snaps: FollowSnapshots; held: Holding }> {
  const store = new MemoryStore();
  await createFollowOwner(store);
  await put(store, manifest("pg", "1", null));
  await put(store, manifest("pg", "2", "1"));
  const holding = await holdAs(store, "n1");
  const held = await moveHead(store, "pg", holding, {
    guid: "2",
    createdAt: "2026-01-02T00:00:00.000Z",
  }, 0);
  return { store, snaps: new FollowSnapshots(store, log), held };
}

Deno.test("FollowSnapshots.create pins the head's stored snapshot, at the copy's own time", async () => {
  const { store, snaps } = await setup();
  const m = await snaps.create("pg", "pg@*", "nightly");
  assert.equal(m.guid, "2");
  assert.equal(m.createdAt, "2026-01-02T00:00:00.000Z");
  const stored = read(store, "pg", "2")!;
  assert.equal(stored.kind, "requested");
  assert.equal(stored.csiName, "nightly");
  assert.equal(read(store, "pg", "1")!.kind, "scheduled", "only the head is pinned");
  // A repeat answers the same snapshot.
  assert.deepEqual(await snaps.create("pg", "pg@*", "nightly"), stored);
});

Deno.test("FollowSnapshots.create: a repeat finds its snapshot after the head moved; the keep policy keeps it and its chain", async () => {
  const { store, snaps, held } = await setup();
  await snaps.create("pg", "pg@*", "nightly");
  // The holder stores a new full stream and then an increment; the head moves to 4.
  await put(store, manifest("pg", "3", null));
  await put(store, manifest("pg", "4", "3"));
  await moveHead(store, "pg", held, { guid: "4", createdAt: "2026-01-04T00:00:00.000Z" }, 0);
  const again = await snaps.create("pg", "pg@*", "nightly");
  assert.equal(again.guid, "2", "the snapshot stays the copy it was");
  const all = ["1", "2", "3", "4"].map((g) => read(store, "pg", g)!);
  const kept = retained(all, { last: 1, hourly: 0, daily: 0, weekly: 0 });
  assert.ok(kept.has("2") && kept.has("1"), `pinned and its base kept: ${[...kept]}`);
  const plain = retained(
    all.map((m) => m.guid === "2" ? manifest("pg", "2", "1") : m),
    { last: 1, hourly: 0, daily: 0, weekly: 0 },
  );
  assert.ok(!plain.has("2"), "unpinned, the keep policy would have let it go");
});

Deno.test("FollowSnapshots.create refuses a name of another volume, a second name for the same copy, and a volume without a copy", async () => {
  const { store, snaps } = await setup();
  await put(store, { ...manifest("other", "7", null), kind: "requested", csiName: "taken" });
  await assertRejectsCsi(
    snaps.create("pg", "pg@*", "taken"),
    Code.ALREADY_EXISTS,
    /of another volume \("other"\)/,
  );
  await snaps.create("pg", "pg@*", "first");
  await assertRejectsCsi(
    snaps.create("pg", "pg@*", "second"),
    Code.FAILED_PRECONDITION,
    /already is snapshot "first"/,
  );
  await createFollowOwner(store, { name: "empty" });
  await assertRejectsCsi(
    snaps.create("empty", "empty@*", "x"),
    Code.FAILED_PRECONDITION,
    /no copy in memory store yet/,
  );
  await assertRejectsCsi(snaps.create("nope", "nope@*", "x"), Code.NOT_FOUND, /"nope@\*"/);
  await markDeleted(store, "empty", 0);
  await assertRejectsCsi(snaps.create("empty", "empty@*", "y"), Code.NOT_FOUND, /not found/);
});

Deno.test("FollowSnapshots.delete unpins a snapshot on the head's chain and removes one off it", async () => {
  const { store, snaps, held } = await setup();
  await snaps.create("pg", "pg@*", "on-chain");
  const ref = (guid: string) => parseStoredSnapshotId(storedSnapshotId("pg", guid))!;
  assert.equal(await snaps.delete(ref("2")), "unpinned");
  const two = read(store, "pg", "2")!;
  assert.equal(two.kind, "scheduled");
  assert.equal(two.csiName, undefined);
  assert.ok(store.peek(two.stream), "the head's stream stays");
  assert.equal(await snaps.delete(ref("1")), "released", "on the chain: kept, nothing to unpin");
  assert.ok(read(store, "pg", "1"));
  // A new chain becomes the head's; the old one is off it now.
  await put(store, manifest("pg", "3", null));
  await release(store, "pg", held, { guid: "3", createdAt: "2026-01-03T00:00:00.000Z" }, 0);
  assert.equal(await snaps.delete(ref("2")), "removed");
  assert.equal(read(store, "pg", "2"), undefined);
  assert.equal(await snaps.delete(ref("2")), "absent");
  assert.equal(
    await snaps.delete(parseStoredSnapshotId(storedSnapshotId("plain", "5"))!),
    undefined,
    "not a follow volume: the caller's ordinary path",
  );
});

Deno.test("FollowSnapshots.delete never removes a snapshot newer than the head", async () => {
  // The holder stored 3 (a new full stream) and is about to move the head to it when a
  // DeleteSnapshot of 3 comes: 3 stays (unpinned at most), so the head never names a snapshot
  // the store has lost.
  const { store, snaps, held } = await setup();
  await put(store, { ...manifest("pg", "3", null), sequence: 9 });
  const ref = parseStoredSnapshotId(storedSnapshotId("pg", "3"))!;
  assert.equal(await snaps.delete(ref), "released");
  assert.ok(read(store, "pg", "3"), "kept for the head");
  await moveHead(store, "pg", held, { guid: "3", createdAt: "2026-01-03T00:00:00.000Z" }, 0);
  // Off the chain and older than the head now: 2 and 1 go as any stored snapshot does.
  assert.equal(await snaps.delete(parseStoredSnapshotId(storedSnapshotId("pg", "2"))!), "removed");
});
