import assert from "node:assert/strict";
import { backupHarness } from "../../tests/support/backup_harness.ts";
import { parseManifest } from "../store/chain.ts";
import { manifestsPrefix } from "../store/layout.ts";
import { BACKUP_KEEP_PROPERTY, backupVolume } from "../replicate/backup.ts";
import { headGuard, keptByHead, movesForward } from "./head.ts";
import { acquire, createOwner, moveHead } from "./owner.ts";
import { createFollowOwner, followManifest, holdAs } from "../../tests/support/follow_harness.ts";

const never = () => ({ ok: false as const, message: "held" });

Deno.test("the keep policy never prunes the head's chain of a follow volume", async () => {
  // The harness makes the store: the protection reads it once the harness exists.
  const ref: { store?: Parameters<typeof headGuard>[0] } = {};
  const h = backupHarness({
    // A new full stream every other backup, so that old chains can go.
    maxChainLength: 2,
    protect: (key, manifests) => headGuard(ref.store!, "node-1", key, manifests),
  });
  ref.store = h.store;
  const ds = h.volume("pg", { [BACKUP_KEEP_PROPERTY]: "last=1" });
  const first = await backupVolume(h.deps, ds);
  assert.equal(first.status, "stored");
  if (first.status !== "stored") return;
  await createOwner(h.store, "pg", {
    volume: "pg",
    uid: first.manifest.volumeUid,
    ttlSeconds: 30,
    settings: { capacityBytes: 0, properties: {} },
    nowMs: h.clock.ms,
  });
  // The backing-up node holds the volume: only a holder prunes.
  let held = (await acquire(h.store, "pg", {
    node: "node-1",
    nowMs: h.clock.ms,
    ttlSeconds: 30,
    mayTakeOver: never,
  })).holding;
  held = await moveHead(h.store, "pg", held, {
    guid: first.manifest.guid,
    createdAt: first.manifest.createdAt,
  }, h.clock.ms);
  // Three more backups that do not move the head (a new chain each other one).
  for (let i = 0; i < 3; i++) {
    h.clock.ms += 3_600_000;
    assert.equal((await backupVolume(h.deps, ds)).status, "stored");
  }
  const guids = h.store.keys().filter((k) => k.startsWith(manifestsPrefix("pg")))
    .map((k) => parseManifest(h.store.peek(k)!, { key: k }).guid);
  assert.ok(guids.includes(first.manifest.guid), "the head survived last=1");
  assert.ok(guids.length < 4, `the others were pruned by the keep policy: ${guids.length} left`);
  // Without the protection the head goes like any old backup.
  const h2 = backupHarness({ maxChainLength: 2 });
  const ds2 = h2.volume("pg", { [BACKUP_KEEP_PROPERTY]: "last=1" });
  const gone = await backupVolume(h2.deps, ds2);
  for (let i = 0; i < 3; i++) {
    h2.clock.ms += 3_600_000;
    await backupVolume(h2.deps, ds2);
  }
  const left = h2.store.keys().filter((k) => k.startsWith(manifestsPrefix("pg")))
    .map((k) => parseManifest(h2.store.peek(k)!, { key: k }).guid);
  assert.ok(gone.status === "stored" && !left.includes(gone.manifest.guid));
});

Deno.test("headGuard lets only the holder prune, from a listing that holds the head", async () => {
  const h = backupHarness();
  const m = (guid: string, baseGuid: string | null) => followManifest(guid, baseGuid);
  const listing = [m("1", null), m("2", "1"), m("3", null)];
  // Not a follow volume: no owner object, nothing to add.
  assert.deepEqual(await headGuard(h.store, "a", "pg", listing), { keep: new Set() });
  await createFollowOwner(h.store);
  const released = await headGuard(h.store, "a", "pg", listing);
  assert.ok("skip" in released && !released.listAgain, "released: nobody prunes");
  let held = await holdAs(h.store, "a");
  assert.deepEqual(await headGuard(h.store, "a", "pg", listing), { keep: new Set() }, "no head");
  held = await moveHead(h.store, "pg", held, { guid: "2", createdAt: "x" }, 0);
  assert.deepEqual(await headGuard(h.store, "a", "pg", listing), { keep: new Set(["1", "2"]) });
  const other = await headGuard(h.store, "b", "pg", listing);
  assert.ok("skip" in other && !other.listAgain && /only the node that holds/.test(other.skip));
  assert.match(other.skip, /held by node "a"/);
  // A listing read before the head moved to a snapshot it does not hold: list again.
  await moveHead(h.store, "pg", held, { guid: "4", createdAt: "x" }, 0);
  const stale = await headGuard(h.store, "a", "pg", listing);
  assert.ok("skip" in stale && stale.listAgain && /head \(snapshot guid 4\)/.test(stale.skip));
});

Deno.test("keptByHead keeps the head's chain and whatever is newer than the head", async () => {
  const h = backupHarness();
  const m = (guid: string, baseGuid: string | null, sequence: number) =>
    followManifest(guid, baseGuid, { sequence });
  // 1 <- 2 <- 3 (head) <- 5, and 4: an older chain; 6: a newer full stream.
  const listing = [
    m("1", null, 1),
    m("2", "1", 2),
    m("4", null, 3),
    m("3", "2", 4),
    m("5", "3", 5),
  ];
  assert.equal((await keptByHead(h.store, "pg", listing)).size, 0, "no owner object");
  await createFollowOwner(h.store);
  const held = await holdAs(h.store, "a");
  await moveHead(h.store, "pg", held, { guid: "3", createdAt: "x" }, 0);
  const kept = await keptByHead(h.store, "pg", [...listing, m("6", null, 6)]);
  assert.deepEqual([...kept].sort(), ["1", "2", "3", "5", "6"]);
});

Deno.test("movesForward: to a newer snapshot with a whole chain, also on a new full stream", () => {
  const m = (guid: string, baseGuid: string | null, sequence: number) =>
    followManifest(guid, baseGuid, { sequence });
  const listing = [m("1", null, 1), m("2", "1", 2), m("3", null, 3), m("4", "3", 4)];
  assert.equal(movesForward(listing, "4", "2"), true, "the holder's new chain");
  assert.equal(movesForward(listing, "3", "2"), true, "its full stream");
  assert.equal(movesForward(listing, "1", "2"), false, "backwards");
  assert.equal(movesForward(listing, "2", "2"), false, "nowhere");
  // Numbered lower than the head (written by a node that had not seen it): not forward.
  assert.equal(movesForward([...listing, m("5", null, 2)], "5", "4"), false);
  // A chain that is not whole is never the head.
  assert.equal(movesForward([...listing, m("6", "9", 9)], "6", "4"), false);
  assert.equal(movesForward(listing, "7", "4"), false, "not listed");
  // Without numbers (written before they existed): along the head's chain only, as before.
  const old = [followManifest("1", null), followManifest("2", "1"), followManifest("3", null)];
  assert.equal(movesForward(old, "2", "1"), true);
  assert.equal(movesForward(old, "3", "2"), false, "another chain, later only by its clock");
  // A numbered full stream after an old head: newer, whatever the clocks said.
  const upgraded = [
    ...old,
    followManifest("4", null, { sequence: 1, createdAt: "2020-01-01T00:00:00Z" }),
  ];
  assert.equal(movesForward(upgraded, "4", "2"), true);
});
