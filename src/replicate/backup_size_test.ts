/**
 * A backup records the snapshot's `referenced` in its manifest: the snapshot's size, which CSI
 * answers for it (src/store/snapshot_size.ts), never the stream's bytes.
 */

import assert from "node:assert/strict";
import { parseManifest } from "../store/chain.ts";
import { manifestsPrefix, type SnapshotManifest } from "../store/layout.ts";
import { type BackupHarness, backupHarness } from "../../tests/support/backup_harness.ts";
import { backupSnapshot, backupVolume } from "./backup.ts";

const MiB = 1024 * 1024;

/** Every manifest of volume "pg" in the store, by guid. */
function manifests(h: BackupHarness): Map<string, SnapshotManifest> {
  const all = h.store.keys().filter((k) => k.startsWith(manifestsPrefix("pg")))
    .map((k) => parseManifest(h.store.peek(k)!));
  return new Map(all.map((m) => [m.guid, m]));
}

/** Each snapshot refers to the returned `bytes` as they are when zfs is first asked after it. */
function referencing(h: BackupHarness): { bytes: string } {
  const now = { bytes: "0" };
  h.pool.hook = () => {
    for (const name of h.pool.names()) {
      if (name.includes("@") && h.pool.value(name, "referenced") === undefined) {
        h.pool.setValue(name, "referenced", now.bytes);
      }
    }
    return undefined;
  };
  return now;
}

Deno.test("a backup's manifest records the snapshot's referenced bytes, full or incremental", async () => {
  const h = backupHarness();
  const now = referencing(h);
  const dataset = h.volume("pg");
  now.bytes = String(100 * MiB);
  const first = await backupVolume(h.deps, dataset);
  h.clock.ms += 3_600_000;
  now.bytes = String(300 * MiB);
  const second = await backupVolume(h.deps, dataset);
  assert.ok(first.status === "stored" && second.status === "stored");
  assert.equal(second.manifest.baseGuid, first.manifest.guid, "an increment");
  const stored = manifests(h);
  assert.equal(stored.get(first.manifest.guid)!.referencedBytes, 100 * MiB);
  assert.equal(stored.get(second.manifest.guid)!.referencedBytes, 300 * MiB);
  assert.ok(stored.get(second.manifest.guid)!.size < 100, "the stream is the increment's only");
});

Deno.test("a snapshot stored on request records its referenced bytes too; unknown ones none", async () => {
  const h = backupHarness();
  const now = referencing(h);
  const dataset = h.volume("pg");
  now.bytes = String(42 * MiB);
  const asked = h.snapshot(dataset, ".stored-nightly");
  const outcome = await backupSnapshot(h.deps, {
    dataset,
    snapshot: asked,
    csiName: "nightly",
  });
  assert.ok(outcome.status === "stored");
  assert.equal(manifests(h).get(outcome.manifest.guid)!.referencedBytes, 42 * MiB);
  // zfs that cannot tell ("-"): no size is recorded rather than a wrong one.
  now.bytes = "-";
  const blind = h.snapshot(dataset, ".stored-blind");
  const unknown = await backupSnapshot(h.deps, { dataset, snapshot: blind, csiName: "blind" });
  assert.ok(unknown.status === "stored");
  const m = manifests(h).get(unknown.manifest.guid)!;
  assert.equal("referencedBytes" in m, false, JSON.stringify(m));
});
