import assert from "node:assert/strict";
import { encodeJson, parseManifest } from "./chain.ts";
import { type SnapshotManifest, streamKey } from "./layout.ts";
import { storedSnapshotSize } from "./snapshot_size.ts";

const UID = "0123456789abcdef0123456789abcdef";
const MiB = 1024 * 1024;

/** A manifest of volume "pg" (a full stream of 1000 bytes unless told), of a 1 GiB volume. */
function manifest(guid: string, over: Partial<SnapshotManifest> = {}): SnapshotManifest {
  return {
    format: 1,
    volume: "pg",
    volumeUid: UID,
    guid,
    baseGuid: null,
    snapshot: `.backup-${guid}`,
    kind: "scheduled",
    createdAt: "2024-01-01T00:00:00.000Z",
    stream: streamKey("pg", guid, "00112233aabbccdd"),
    size: 1000,
    sha256: "a".repeat(64),
    raw: false,
    node: "node-1",
    capacityBytes: 1 << 30,
    ...over,
  };
}

Deno.test("parseManifest reads back referencedBytes, and refuses a malformed one naming it", () => {
  const m = manifest("10", { referencedBytes: 300 * MiB });
  assert.deepEqual(parseManifest(encodeJson(m)), m);
  const { referencedBytes: _, ...older } = m;
  assert.equal(parseManifest(encodeJson(older)).referencedBytes, undefined, "optional");
  for (const bad of [-1, 1.5, "300M", null, 2 ** 53]) {
    assert.throws(
      () => parseManifest(JSON.stringify({ ...older, referencedBytes: bad })),
      (err: unknown) =>
        err instanceof SyntaxError &&
        /field "referencedBytes" must be a non-negative integer/.test(err.message),
      String(bad),
    );
  }
});

Deno.test("storedSnapshotSize is the recorded referencedBytes, not the increment's stream", () => {
  const full = manifest("10", { size: 300 * MiB, referencedBytes: 300 * MiB });
  const inc = manifest("11", { baseGuid: "10", size: 624, referencedBytes: 301 * MiB });
  assert.equal(storedSnapshotSize(inc, [full, inc]), 301 * MiB);
  // Recorded: the chain is not needed, nor even whole.
  assert.equal(storedSnapshotSize(inc, []), 301 * MiB);
  assert.equal(storedSnapshotSize(manifest("12", { referencedBytes: 0 }), []), 0);
});

Deno.test("storedSnapshotSize of a manifest without it: the chain's streams, at most the capacity", () => {
  const full = manifest("10", { size: 1000 });
  const inc = manifest("11", { baseGuid: "10", size: 624 });
  // Another uid's snapshot of the same guid is never part of the chain.
  const other = manifest("10", { volumeUid: "f".repeat(32), size: 5 });
  assert.equal(storedSnapshotSize(inc, [other, full, inc]), 1624);
  assert.equal(storedSnapshotSize(full, [full, inc]), 1000);
  // The volume's refquota at the snapshot bounds what it referenced.
  assert.equal(storedSnapshotSize({ ...inc, capacityBytes: 1500 }, [full, inc]), 1500);
  // An unlimited volume: the streams alone.
  assert.equal(storedSnapshotSize({ ...inc, capacityBytes: 0 }, [full, inc]), 1624);
  // A broken chain: only the capacity is known; nothing known at all is CSI's 0, "unspecified".
  assert.equal(storedSnapshotSize(inc, [inc]), 1 << 30);
  assert.equal(storedSnapshotSize({ ...inc, capacityBytes: 0 }, [inc]), 0);
});
