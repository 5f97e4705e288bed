import assert from "node:assert/strict";
import { manifestKey, manifestsPrefix } from "../store/layout.ts";
import { backupHarness } from "../../tests/support/backup_harness.ts";
import { backupSnapshot, backupVolume } from "./backup.ts";
import { MemoryStore } from "../../tests/support/memory_store.ts";
import { chainTo, parseManifest, parseVolumeRecord } from "../store/chain.ts";
import { Interleaver, twoSwitchSchedules } from "../../tests/support/interleaved_store.ts";
import { StoreError, type WriteCondition } from "../store/store.ts";
import {
  type ManifestCache,
  readManifests,
  type RecordChange,
  releaseStored,
  updateRecord,
} from "./records.ts";

Deno.test("releaseStored removes a leaf at once, and hands a needed base to the keep policy", async () => {
  const h = backupHarness();
  const ds = h.volume("pg");
  const snap = h.snapshot(ds, "nightly");
  const out = await backupSnapshot(h.deps, { dataset: ds, snapshot: snap, csiName: "nightly" });
  assert.equal(out.status, "stored");
  const requested = out.status === "stored" ? out.manifest : undefined;
  h.clock.ms += 3_600_000;
  // The next backup is incremental on the requested snapshot.
  await backupVolume(h.deps, ds);
  const key = manifestKey("pg", requested!.guid);
  assert.equal(await releaseStored(h.store, "pg", requested!.guid, h.deps.log), "released");
  const released = parseManifest(h.store.peek(key)!);
  assert.equal(released.kind, "scheduled");
  assert.equal(released.csiName, undefined);
  assert.ok(h.store.peek(released.stream));
  // A leaf goes, manifest and stream.
  const leaf = h.snapshot(ds, "leaf");
  const stored = await backupSnapshot(h.deps, { dataset: ds, snapshot: leaf, csiName: "leaf" });
  const m = stored.status === "stored" ? stored.manifest : undefined;
  assert.equal(await releaseStored(h.store, "pg", m!.guid, h.deps.log), "removed");
  assert.equal(h.store.peek(manifestKey("pg", m!.guid)), undefined);
  assert.equal(h.store.peek(m!.stream), undefined);
  assert.equal(await releaseStored(h.store, "pg", m!.guid, h.deps.log), "absent");
});

Deno.test("readManifests reads each manifest once through the cache, per volume", async () => {
  const h = backupHarness();
  const cache: ManifestCache = new Map();
  await backupVolume({ ...h.deps, cache }, h.volume("pg"));
  await backupVolume({ ...h.deps, cache }, h.volume("web"));
  const gets: string[] = [];
  const get = h.store.getBytes.bind(h.store);
  h.store.getBytes = (key: string) => {
    gets.push(key);
    return get(key);
  };
  for (let i = 0; i < 3; i++) {
    assert.equal((await readManifests(h.store, "pg", h.deps.log, cache)).manifests.length, 1);
    assert.equal((await readManifests(h.store, "web", h.deps.log, cache)).manifests.length, 1);
  }
  // Read once each, then from the cache.
  assert.equal(gets.length, 2);
  const pg = await readManifests(h.store, "pg", h.deps.log, cache);
  const web = await readManifests(h.store, "web", h.deps.log, cache);
  // A manifest removed from the store leaves the cache on the next read of its volume only.
  await h.store.delete(manifestKey("pg", pg.manifests[0]!.guid));
  assert.deepEqual((await readManifests(h.store, "pg", h.deps.log, cache)).manifests, []);
  assert.deepEqual([...cache.keys()], [manifestKey("web", web.manifests[0]!.guid)]);
});

Deno.test("updateRecord writes If-None-Match when absent, If-Match after, re-reads a lost race, gives up after 5", async () => {
  const store = new MemoryStore();
  const key = "v1/volumes/pg/volume.json";
  const conditions: (WriteCondition | undefined)[] = [];
  let racing = 0;
  const put = store.putBytes.bind(store);
  store.putBytes = (k, bytes, condition) => {
    conditions.push(condition);
    if (racing > 0) {
      racing--;
      return Promise.reject(new StoreError("precondition_failed", "changed meanwhile"));
    }
    return put(k, bytes, condition);
  };
  const record = {
    format: 1,
    name: "pg",
    uid: "0123456789abcdef0123456789abcdef",
    createdAt: "2026-01-01T00:00:00.000Z",
    capacityBytes: 1,
    parameters: {},
    node: "n1",
  } as const;
  const seen: (Uint8Array | undefined)[] = [];
  const write = (bytes: Uint8Array | undefined): RecordChange<string> => {
    seen.push(bytes);
    return { write: { ...record, capacityBytes: seen.length }, result: "written" };
  };
  assert.equal(await updateRecord(store, key, "while a test wrote it", write), "written");
  assert.deepEqual(conditions, [{ ifNoneMatch: "*" }]);
  assert.equal(seen[0], undefined);
  // Two lost races: read again each time, then written with the etag of the last read.
  racing = 2;
  conditions.length = 0;
  assert.equal(await updateRecord(store, key, "while a test wrote it", write), "written");
  assert.equal(conditions.length, 3);
  assert.ok(conditions.every((c) => c !== undefined && "ifMatch" in c));
  assert.equal(parseVolumeRecord(store.peek(key)!).capacityBytes, 4);
  // Nothing to write: no put at all.
  conditions.length = 0;
  assert.equal(await updateRecord(store, key, "x", () => ({ result: "kept" })), "kept");
  assert.deepEqual(conditions, []);
  // Five lost races: the record keeps changing, said with the caller's words.
  racing = 5;
  const before = store.peek(key);
  await assert.rejects(
    updateRecord(store, key, "while a test wrote it; try again", write),
    (err: unknown) =>
      err instanceof StoreError && err.kind === "unavailable" &&
      err.message ===
        `"${key}" in ${store.description} kept changing while a test wrote it; try again`,
  );
  assert.deepEqual(store.peek(key), before, "nothing written");
});

/**
 * Item 10 of issue 21: DeleteSnapshot on one node (releaseStored) races another node's backup
 * whose incremental is based on the snapshot being deleted. Run on one store whose requests
 * are interleaved in every order with at most two switches between the sides: afterwards no
 * manifest in the store is left without its base or stream, a backup that says it stored its
 * snapshot has it in the store with its whole chain, and a delete that says "removed" left
 * nothing based on it.
 */
Deno.test("releaseStored racing an incremental upload on the same base never leaves a chain broken", async () => {
  const run = async (schedule: readonly string[]) => {
    const h = backupHarness();
    const ds = h.volume("pg");
    const first = await backupVolume(h.deps, ds);
    assert.equal(first.status, "stored");
    const base = first.status === "stored" ? first.manifest : undefined;
    h.clock.ms += 3_600_000;
    const il = new Interleaver(h.store, schedule);
    const upload = backupVolume({ ...h.deps, store: il.view("upload") }, ds)
      .finally(() => il.done("upload"));
    const release = releaseStored(il.view("delete"), "pg", base!.guid, h.deps.log)
      .finally(() => il.done("delete"));
    const [up, del] = await Promise.allSettled([upload, release]);
    return { h, ds, base: base!, up, del, trace: il.trace };
  };
  // How many requests each side makes, at most: each run alone, before and after the other.
  const rest = (actor: string) => Array<string>(1000).fill(actor);
  const alone = [
    await run([...rest("upload"), ...rest("delete")]),
    await run([...rest("delete"), ...rest("upload")]),
  ];
  const count = (actor: string) =>
    Math.max(...alone.map((r) => r.trace.filter((t) => t.startsWith(`${actor} `)).length));
  const schedules = twoSwitchSchedules(
    { actor: "upload", requests: count("upload") },
    { actor: "delete", requests: count("delete") },
  );
  let racedBoth = 0;
  let withdrawn = 0;
  for (const schedule of schedules) {
    const { h, ds, base, up, del, trace } = await run(schedule);
    const ctx = `schedule:\n  ${trace.join("\n  ")}`;
    const all = h.store.keys().filter((k) => k.startsWith(manifestsPrefix("pg")))
      .map((k) => parseManifest(h.store.peek(k)!, { key: k }));
    for (const m of all) {
      const chain = (() => {
        try {
          return chainTo(all, m.guid);
        } catch (err) {
          return assert.fail(`${(err as Error).message}\n${ctx}`);
        }
      })();
      for (const c of chain) assert.ok(h.store.peek(c.stream), `stream of ${c.guid} gone\n${ctx}`);
    }
    if (up.status === "fulfilled") {
      const out = up.value;
      assert.equal(out.status, "stored", ctx);
      if (out.status === "stored") {
        assert.ok(all.some((m) => m.guid === out.manifest.guid), `upload lost\n${ctx}`);
      }
    }
    if (del.status === "fulfilled" && del.value === "removed") {
      assert.ok(!all.some((m) => m.guid === base.guid || m.baseGuid === base.guid), ctx);
    }
    assert.equal(del.status, "fulfilled", `${del.status === "rejected" && del.reason}\n${ctx}`);
    if (up.status === "fulfilled" && del.status === "fulfilled" && del.value === "released") {
      racedBoth++;
    }
    if (h.logs.some((l) => l.msg.startsWith("backup's base was removed"))) withdrawn++;
    // Whatever happened, the next backup stores a snapshot with a whole chain.
    h.clock.ms += 3_600_000;
    const next = await backupVolume(h.deps, ds);
    assert.equal(next.status, "stored", ctx);
    if (next.status === "stored") {
      const now = h.store.keys().filter((k) => k.startsWith(manifestsPrefix("pg")))
        .map((k) => parseManifest(h.store.peek(k)!, { key: k }));
      assert.doesNotThrow(() => chainTo(now, next.manifest.guid), ctx);
    }
  }
  assert.ok(schedules.length > 80, `${schedules.length} schedules`);
  assert.ok(racedBoth > 0, "some schedules let the upload win and the delete keep the base");
  assert.ok(withdrawn > 0, "some schedules made the upload find its base gone and send again");
});
