import assert from "node:assert/strict";
import type { SnapshotManifest } from "../store/layout.ts";
import { restoredProperties } from "./restore.ts";

const M: SnapshotManifest = {
  format: 1,
  volume: "disk",
  volumeUid: "0".repeat(32),
  guid: "1234",
  baseGuid: null,
  snapshot: ".backup-1-1",
  kind: "scheduled",
  createdAt: "2024-01-01T00:00:00.000Z",
  stream: "v1/volumes/disk/streams/x.zfs",
  size: 3,
  sha256: "0".repeat(64),
  raw: false,
  node: "n",
  capacityBytes: 1 << 30,
};

Deno.test("zfs-csi restore from the store sets a zvol's records, never a refquota", () => {
  assert.deepEqual(restoredProperties(M, "other"), [["refquota", String(1 << 30)]]);
  const ext4 = { ...M, zvol: { content: "ext4" as const, volblocksize: 16384, formatted: true } };
  assert.deepEqual(restoredProperties(ext4, "disk"), [
    ["org.zfs-csi:fs-type", "ext4"],
    ["refreservation", "auto"],
    ["org.zfs-csi:format", "done"],
    ["org.zfs-csi:store-uid", "0".repeat(32)],
  ]);
  const unformatted = { ...ext4, zvol: { ...ext4.zvol, formatted: false } };
  assert.deepEqual(restoredProperties(unformatted, "other"), [
    ["org.zfs-csi:fs-type", "ext4"],
    ["refreservation", "auto"],
  ]);
  const raw = { ...M, zvol: { content: "block" as const, volblocksize: 8192, formatted: true } };
  assert.deepEqual(restoredProperties(raw, "other"), [
    ["org.zfs-csi:fs-type", "block"],
    ["refreservation", "auto"],
  ]);
});
