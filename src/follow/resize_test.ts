/**
 * Expansion of follow volumes: the settings grow as any volume's size does (never smaller,
 * unlimited stays unlimited), the owner object is changed with a conditional write that a
 * holder's later renewal keeps, and a stage gives a copy made before the expansion the recorded
 * size. Real zfs: tests/integration/follow_lifecycle_test.ts.
 */

import assert from "node:assert/strict";
import { assertRejectsCsi, assertThrowsCsi } from "../../tests/support/assert_errors.ts";
import {
  alwaysTakeOver,
  createFollowOwner,
  DATASET as DS,
  followHarness,
  followManifest,
  holdAs,
  storeManifests,
} from "../../tests/support/follow_harness.ts";
import { MemoryStore } from "../../tests/support/memory_store.ts";
import { Code } from "../errors.ts";
import type { SnapshotManifest } from "../store/layout.ts";
import type { PropertyMap } from "../zfs/parse.ts";
import { FOLLOW_GENERATION_PROPERTY, FOLLOW_RELEASED_PROPERTY } from "./copy.ts";
import { type FollowSettings, markDeleted, readOwner, release, renew } from "./owner.ts";
import {
  recordedSizeChanges,
  resizedSettings,
  resizeFollowVolume,
  SizedFollowVolumes,
} from "./resize.ts";

const MiB = 1024 * 1024;

const settings = (refquota: number, extra: Record<string, string> = {}): FollowSettings => ({
  capacityBytes: refquota,
  properties: {
    "org.zfs-csi:managed": "yes",
    ...(refquota > 0 ? { refquota: String(refquota) } : {}),
    ...extra,
  },
});

async function volume(store: MemoryStore, s: FollowSettings): Promise<void> {
  await createFollowOwner(store, { settings: s });
}

function props(values: Record<string, string>): PropertyMap {
  return new Map(Object.entries(values).map(([k, v]) => [k, { value: v, source: "local" }]));
}

Deno.test("resizedSettings grows the refquota and the capacity, and a repeat changes nothing", () => {
  const before = settings(64 * MiB, { compression: "lz4" });
  const after = resizedSettings("pg@*", before, { requiredBytes: 128 * MiB, limitBytes: 0 });
  assert.deepEqual(after, settings(128 * MiB, { compression: "lz4" }));
  assert.equal(
    resizedSettings("pg@*", after, { requiredBytes: 128 * MiB, limitBytes: 0 }),
    after,
    "the same object: nothing to write",
  );
  assert.equal(
    resizedSettings("pg@*", after, { requiredBytes: 32 * MiB, limitBytes: 0 }),
    after,
    "a smaller required size is already met",
  );
});

Deno.test("resizedSettings refuses a shrink and keeps an unlimited volume unlimited", () => {
  assertThrowsCsi(
    () => resizedSettings("pg@*", settings(64 * MiB), { requiredBytes: 0, limitBytes: 32 * MiB }),
    Code.OUT_OF_RANGE,
    /shrinking to 33554432 is not supported/,
  );
  const unlimited = settings(0);
  assert.equal(
    resizedSettings("pg@*", unlimited, { requiredBytes: 128 * MiB, limitBytes: 0 }),
    unlimited,
  );
});

Deno.test("resizeFollowVolume writes the store, says whether a node holds it, and a holder's renewal keeps it", async () => {
  const store = new MemoryStore();
  await volume(store, settings(64 * MiB));
  const released = await resizeFollowVolume(store, "pg", "pg@*", {
    requiredBytes: 96 * MiB,
    limitBytes: 0,
  });
  assert.deepEqual(released, { capacityBytes: 96 * MiB, held: false, changed: true });
  const holding = await holdAs(store, "n1");
  const held = await resizeFollowVolume(store, "pg", "pg@*", {
    requiredBytes: 128 * MiB,
    limitBytes: 0,
  });
  assert.deepEqual(held, { capacityBytes: 128 * MiB, held: true, changed: true });
  // The holder's handle predates the expansion: its renewal and release must not undo it.
  const renewed = await renew(store, "pg", holding, 1000);
  assert.equal(renewed.record.settings.capacityBytes, 128 * MiB);
  await release(store, "pg", renewed, undefined, 2000);
  const r = (await readOwner(store, "pg"))!.record;
  assert.equal(r.state, "released");
  assert.deepEqual(r.settings, settings(128 * MiB));
  const repeat = await resizeFollowVolume(store, "pg", "pg@*", {
    requiredBytes: 128 * MiB,
    limitBytes: 0,
  });
  assert.equal(repeat.changed, false);
});

Deno.test("resizeFollowVolume answers NOT_FOUND for a deleted or unknown volume, OUT_OF_RANGE for a shrink", async () => {
  const store = new MemoryStore();
  await assertRejectsCsi(
    resizeFollowVolume(store, "pg", "pg@*", { requiredBytes: MiB, limitBytes: 0 }),
    Code.NOT_FOUND,
    /not found in memory store$/,
  );
  await volume(store, settings(64 * MiB));
  await assertRejectsCsi(
    resizeFollowVolume(store, "pg", "pg@*", { requiredBytes: 0, limitBytes: 16 * MiB }),
    Code.OUT_OF_RANGE,
    /shrinking/,
  );
  await markDeleted(store, "pg", 0);
  await assertRejectsCsi(
    resizeFollowVolume(store, "pg", "pg@*", { requiredBytes: 128 * MiB, limitBytes: 0 }),
    Code.NOT_FOUND,
    /was deleted/,
  );
});

Deno.test("recordedSizeChanges grows a copy to the recorded size, never shrinks it", () => {
  const recorded = settings(128 * MiB, { refreservation: String(128 * MiB) });
  assert.deepEqual(
    recordedSizeChanges(props({ refquota: String(64 * MiB), refreservation: "none" }), recorded),
    [["refquota", String(128 * MiB)], ["refreservation", String(128 * MiB)]],
  );
  assert.deepEqual(
    recordedSizeChanges(
      props({ refquota: String(256 * MiB), refreservation: String(128 * MiB) }),
      recorded,
    ),
    [],
    "grown further here (a NodeExpandVolume the store missed): kept",
  );
  assert.deepEqual(recordedSizeChanges(props({ refquota: "none" }), settings(0)), []);
});

/** A snapshot node "n0" stored before the expansion. */
function manifest(guid: string, baseGuid: string | null): SnapshotManifest {
  return followManifest(guid, baseGuid, { node: "n0", capacityBytes: 64 * MiB });
}

/** Node "n1" with SizedFollowVolumes, and "pg" registered with these settings. */
async function sizedNode(registered: FollowSettings) {
  const h = followHarness();
  await volume(h.store, registered);
  return { ...h, follow: new SizedFollowVolumes(h.deps) };
}

Deno.test("SizedFollowVolumes: a stage on a warm copy made before an expansion gives it the recorded size", async () => {
  const { pool, store, follow } = await sizedNode(settings(64 * MiB));
  await storeManifests(store, [manifest("1", null), manifest("2", "1")]);
  // n0 held it and released it at snapshot 2; this node's warm copy is at 2 with the old size.
  const holding = await holdAs(store, "n0", { mayTakeOver: alwaysTakeOver });
  await release(store, "pg", holding, { guid: "2", createdAt: "2026-01-01T00:00:02Z" }, 0);
  pool.add(DS, {
    "org.zfs-csi:managed": "yes",
    [FOLLOW_GENERATION_PROPERTY]: "0",
    [FOLLOW_RELEASED_PROPERTY]: "2",
    readonly: "on",
    refquota: String(64 * MiB),
  });
  pool.add(`${DS}@.backup-2`, { guid: "2", createtxg: "20" });
  await resizeFollowVolume(store, "pg", "pg@*", { requiredBytes: 128 * MiB, limitBytes: 0 });
  await follow.prepareStage({ name: "pg", dataset: DS });
  assert.equal(pool.value(DS, "refquota"), String(128 * MiB));
  assert.equal(pool.value(DS, "readonly"), "off", "the copy was used as it is and made writable");
  assert.equal((await readOwner(store, "pg"))!.record.holder, "n1");
});

Deno.test("SizedFollowVolumes never sizes a node-local volume of the same name before a stage", async () => {
  const { pool, follow } = await sizedNode(settings(128 * MiB));
  // This node's own volume "pg" (no follow generation): the stage refuses it, untouched.
  pool.add(DS, { "org.zfs-csi:managed": "yes", refquota: String(64 * MiB) });
  await assertRejectsCsi(
    follow.prepareStage({ name: "pg", dataset: DS }),
    Code.FAILED_PRECONDITION,
    /holds a volume of this node/,
  );
  assert.equal(pool.value(DS, "refquota"), String(64 * MiB));
});
