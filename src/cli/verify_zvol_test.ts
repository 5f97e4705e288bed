import assert from "node:assert/strict";
import { FakePool } from "../../tests/support/fake_pool.ts";
import { FakeRunner, fakeTools } from "../../tests/support/fake_runner.ts";
import { type SnapshotManifest, streamKey } from "../store/layout.ts";
import { removeScratch } from "./verify.ts";

function manifest(guid: string, baseGuid: string | null): SnapshotManifest {
  return {
    format: 1,
    volume: "disk",
    volumeUid: "0".repeat(32),
    guid,
    baseGuid,
    snapshot: `.backup-${guid}`,
    kind: "scheduled",
    createdAt: "2026-01-01T00:00:00Z",
    stream: streamKey("disk", guid, "00000001"),
    size: 10,
    sha256: "0".repeat(64),
    raw: false,
    node: "node-a",
    capacityBytes: 1 << 30,
    zvol: { content: "block", volblocksize: 16384, formatted: false },
  };
}

Deno.test("removeScratch takes a zvol's chain received as a volume, and refuses a filesystem there", async () => {
  const runner = new FakeRunner();
  const pool = new FakePool(runner);
  const { zfs } = fakeTools(runner);
  const chain = [manifest("11", null), manifest("22", "11")];
  pool.add("tank/nomad/.verify-1");
  pool.add("tank/nomad/.verify-1/data", { type: ["volume", "-"] });
  pool.add("tank/nomad/.verify-1/data@.backup-11", { guid: "11" });
  pool.add("tank/nomad/.verify-1/data@.backup-22", { guid: "22" });
  await removeScratch(zfs, "tank/nomad/.verify-1", chain);
  assert.ok(!pool.has("tank/nomad/.verify-1"));
  pool.add("tank/nomad/.verify-2");
  pool.add("tank/nomad/.verify-2/data");
  await assert.rejects(() => removeScratch(zfs, "tank/nomad/.verify-2", chain), /verify-2\/data/);
  assert.ok(pool.has("tank/nomad/.verify-2/data"));
});
