import assert from "node:assert/strict";
import { parseManifest } from "../store/chain.ts";
import { manifestKey } from "../store/layout.ts";
import { backupHarness } from "../../tests/support/backup_harness.ts";
import { backupSnapshot, backupVolume } from "./backup.ts";
import { type ManifestCache, readManifests, releaseStored } from "./records.ts";

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
