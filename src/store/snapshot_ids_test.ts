import assert from "node:assert/strict";
import { isStoredSnapshotId, parseStoredSnapshotId, storedSnapshotId } from "./snapshot_ids.ts";

Deno.test("storedSnapshotId round-trips through parseStoredSnapshotId", () => {
  for (
    const [volume, guid] of [
      ["pg-data", "1"],
      ["db[0]", "18446744073709551615"],
      ["a:b", "12345678901234567890"],
    ] as const
  ) {
    const id = storedSnapshotId(volume, guid);
    assert.ok(!id.includes("@"), id);
    const ref = parseStoredSnapshotId(id);
    assert.deepEqual(ref && { volume: ref.volume, guid: ref.guid }, { volume, guid });
  }
  assert.equal(storedSnapshotId("pg-data", "255"), "store:pg-data:00000000000000ff");
});

Deno.test("parseStoredSnapshotId refuses ids this plugin does not make", () => {
  for (
    const id of [
      "pg-data@snap",
      "store:pg-data@x:00000000000000ff",
      "store:pg-data:ff",
      "store::00000000000000ff",
      "store:pg-data:00000000000000FF",
      "store:bad:zz:00000000000000ff",
      "store:../x:00000000000000ff",
      "stor:pg-data:00000000000000ff",
    ]
  ) {
    assert.equal(parseStoredSnapshotId(id), undefined, id);
  }
  assert.equal(isStoredSnapshotId("pg-data@snap@node"), false);
});
