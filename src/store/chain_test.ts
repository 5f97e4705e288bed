import assert from "node:assert/strict";
import {
  ChainError,
  chainTo,
  encodeJson,
  isNewer,
  latest,
  MAX_SEQUENCE,
  nextSequence,
  oldestFirst,
  parseManifest,
  parseVolumeRecord,
  sequenceOf,
} from "./chain.ts";
import { manifestKey, type SnapshotManifest, streamKey, type VolumeRecord } from "./layout.ts";

const UID = "0123456789abcdef0123456789abcdef";

/** A valid manifest of volume "pg-data" (guid 10 unless told), full unless a base is given. */
function manifest(over: Partial<SnapshotManifest> = {}): SnapshotManifest {
  const guid = over.guid ?? "10";
  return {
    format: 1,
    volume: "pg-data",
    volumeUid: UID,
    guid,
    baseGuid: null,
    snapshot: ".backup-1700000000",
    kind: "scheduled",
    createdAt: "2023-11-14T22:13:20.000Z",
    stream: streamKey("pg-data", guid, "00112233aabbccdd"),
    size: 1234,
    sha256: "a".repeat(64),
    raw: false,
    node: "node-1",
    capacityBytes: 1 << 30,
    ...over,
  };
}

const record: VolumeRecord = {
  format: 1,
  name: "pg-data",
  uid: UID,
  createdAt: "2023-11-14T22:13:20Z",
  capacityBytes: 1 << 30,
  parameters: { compression: "lz4" },
  schedule: { intervalSeconds: 900, keep: { last: 4, hourly: 24, daily: 14, weekly: 0 } },
  node: "node-1",
};

/** The manifest as JSON with `field` replaced (undefined removes it). */
function withField(field: string, value: unknown): string {
  const obj: Record<string, unknown> = { ...manifest() };
  if (value === undefined) delete obj[field];
  else obj[field] = value;
  return JSON.stringify(obj);
}

Deno.test("parseManifest reads back what encodeJson wrote, bytes or text", () => {
  const m = manifest({ csiName: "nightly", kind: "requested", baseGuid: "9" });
  const bytes = encodeJson(m);
  assert.deepEqual(parseManifest(bytes), m);
  assert.deepEqual(parseManifest(new TextDecoder().decode(bytes)), m);
  assert.match(new TextDecoder().decode(bytes), /^{\n {2}"format": 1,\n/);
});

Deno.test("parseManifest keeps fields a later layout adds", () => {
  const m = parseManifest(JSON.stringify({ ...manifest(), generation: 7 }));
  assert.equal((m as unknown as Record<string, unknown>).generation, 7);
});

Deno.test("parseManifest refuses each malformed field, naming it", () => {
  const cases: [string, unknown, RegExp][] = [
    ["format", 2, /"format" must be 1/],
    ["format", undefined, /"format" must be 1 .*missing/],
    ["volume", "", /"volume" must be a non-empty string/],
    ["volume", "a/b", /"volume" is not a valid volume name/],
    ["volumeUid", "xyz", /"volumeUid" must be 32 lowercase hex digits/],
    ["guid", "0x10", /"guid" must be a ZFS guid in decimal digits/],
    ["guid", 10, /"guid" must be a ZFS guid/],
    ["guid", "18446744073709551616", /"guid" must be a ZFS guid \(64 bits/],
    ["guid", undefined, /"guid" .*missing/],
    ["baseGuid", "10", /"baseGuid" must be another snapshot's guid/],
    ["baseGuid", "abc", /"baseGuid" must be a ZFS guid/],
    ["baseGuid", undefined, /"baseGuid" .*missing/],
    ["kind", "manual", /"kind" must be "scheduled" or "requested"/],
    ["createdAt", "yesterday", /"createdAt" must be an ISO 8601 time/],
    ["createdAt", "2023-13-45T99:00:00Z", /"createdAt" must be an ISO 8601 time/],
    ["size", -1, /"size" must be a non-negative integer/],
    ["size", 1.5, /"size" must be a non-negative integer/],
    ["size", 2 ** 53, /"size" must be a non-negative integer/],
    ["size", "12", /"size" must be a non-negative integer/],
    ["capacityBytes", null, /"capacityBytes" must be a non-negative integer/],
    ["sha256", "A".repeat(64), /"sha256" must be 64 lowercase hex digits/],
    ["sha256", "a".repeat(63), /"sha256" must be 64 lowercase hex digits/],
    ["raw", "no", /"raw" must be true or false/],
    ["node", undefined, /"node" must be a non-empty string/],
    ["csiName", 5, /"csiName" must be a non-empty string/],
    // The snapshot's name reaches zfs (`<dataset>@<snapshot>`): only names the plugin makes.
    ["snapshot", ".backup-1\u0000x", /"snapshot" must be a snapshot name of letters/],
    ["snapshot", "a@b", /"snapshot" must be a snapshot name of letters/],
    ["snapshot", "a/b", /"snapshot" must be a snapshot name of letters/],
    ["snapshot", "..", /"snapshot" must be a snapshot name of letters/],
    ["snapshot", ".", /"snapshot" must be a snapshot name of letters/],
    ["snapshot", "a b", /"snapshot" must be a snapshot name of letters/],
    ["snapshot", "é", /"snapshot" must be a snapshot name of letters/],
    ["snapshot", "x".repeat(256), /"snapshot" must be a snapshot name of letters/],
    ["snapshot", 7, /"snapshot" must be a snapshot name of letters/],
    // Shown in messages and logs: no control characters.
    ["node", "node\n-b", /"node" must be a name without control characters/],
    ["csiName", "nightly\u0000", /"csiName" must be a name without control characters/],
    // Another volume's streams, or a key outside the volume.
    ["stream", streamKey("other", "10", "00112233aabbccdd"), /"stream" must be a key/],
    ["stream", "v1/volumes/pg-data/streams/../x.zfs", /"stream" must be a key/],
    ["stream", "v1/volumes/pg-data/snapshots/000000000000000a.json", /"stream" must be a key/],
    ["stream", streamKey("pg-data", "11", "00112233aabbccdd"), /named after the guid/],
  ];
  for (const [field, value, message] of cases) {
    assert.throws(
      () => parseManifest(withField(field, value)),
      (err: unknown) => err instanceof SyntaxError && message.test(err.message),
      `${field} = ${JSON.stringify(value)}`,
    );
  }
});

Deno.test("parseManifest reads a stream's form back, and takes a manifest without one", () => {
  const form = {
    compressed: true,
    largeBlocks: true,
    embedded: true,
    features: ["compressed", "embed_data", "lz4"],
  };
  assert.deepEqual(parseManifest(encodeJson(manifest({ form }))).form, form);
  const noFeatures = { compressed: true, largeBlocks: false, embedded: false };
  assert.deepEqual(parseManifest(encodeJson(manifest({ form: noFeatures }))).form, noFeatures);
  // Written before forms existed: a plain stream, and no form is made up for it.
  assert.equal(parseManifest(withField("form", undefined)).form, undefined);
  const later = parseManifest(withField("form", { ...noFeatures, checksum: "blake3" }));
  assert.equal((later.form as unknown as Record<string, unknown>).checksum, "blake3");
});

Deno.test("parseManifest refuses a malformed form, naming the field", () => {
  const plain = { compressed: false, largeBlocks: false, embedded: false };
  const cases: [unknown, RegExp][] = [
    ["-c -L -e", /"form" must be an object/],
    [null, /"form" must be an object/],
    [[], /"form" must be an object/],
    [{ ...plain, compressed: "yes" }, /form: field "compressed" must be true or false/],
    [{ compressed: true, embedded: false }, /form: field "largeBlocks" must be true or false/],
    [{ ...plain, features: "lz4" }, /form: field "features" must be a list/],
    [{ ...plain, features: ["lz4", "lz4"] }, /form: field "features" must be a list/],
    [{ ...plain, features: ["LZ4"] }, /form: field "features" must be a list/],
    [{ ...plain, features: ["lz4\n"] }, /form: field "features" must be a list/],
    [{ ...plain, features: [1] }, /form: field "features" must be a list/],
    [{ ...plain, features: Array.from({ length: 31 }, (_, i) => `f${i}`) }, /at most 30/],
  ];
  for (const [value, message] of cases) {
    assert.throws(
      () => parseManifest(withField("form", value)),
      (err: unknown) => err instanceof SyntaxError && message.test(err.message),
      JSON.stringify(value),
    );
  }
});

Deno.test("parseManifest takes every snapshot name the plugin makes", () => {
  for (
    const snapshot of [".backup-1700000000", ".stored-nightly:2f1", "s_1.a-b:c", "x".repeat(255)]
  ) {
    assert.equal(parseManifest(withField("snapshot", snapshot)).snapshot, snapshot);
  }
});

Deno.test("parseManifest refuses what is not a JSON object", () => {
  for (const text of ["", "[]", "null", "{", "42"]) {
    assert.throws(() => parseManifest(text), SyntaxError, text);
  }
  assert.throws(() => parseManifest(new Uint8Array([0xff, 0xfe])), /not UTF-8/);
});

Deno.test("parseManifest checks the key it was read from", () => {
  const m = manifest();
  const key = manifestKey("pg-data", m.guid);
  assert.deepEqual(parseManifest(encodeJson(m), { key }), m);
  assert.throws(
    () => parseManifest(encodeJson(m), { key: manifestKey("pg-data", "11") }),
    (err: unknown) =>
      err instanceof SyntaxError && err.message.includes(`whose manifest key is "${key}"`),
  );
});

Deno.test("parseVolumeRecord reads back a record, and refuses malformed ones", () => {
  assert.deepEqual(parseVolumeRecord(encodeJson(record)), record);
  const deleted = { ...record, deletedAt: "2024-01-01T00:00:00.000Z", owner: "x" };
  assert.deepEqual(parseVolumeRecord(JSON.stringify(deleted)), deleted);
  const { schedule: _, ...unscheduled } = record;
  assert.deepEqual(parseVolumeRecord(JSON.stringify(unscheduled)), unscheduled);
  const bad: [Record<string, unknown>, RegExp][] = [
    [{ format: 0 }, /"format" must be 1/],
    [{ uid: "0123" }, /"uid" must be 32 lowercase hex digits/],
    [{ name: "" }, /"name" must be a non-empty string/],
    [{ parameters: { a: 1 } }, /"parameters" must be an object of strings/],
    [{ parameters: [] }, /"parameters" must be an object/],
    [{ capacityBytes: -5 }, /"capacityBytes" must be a non-negative integer/],
    [{ deletedAt: "soon" }, /"deletedAt" must be an ISO 8601 time/],
    [{ schedule: { intervalSeconds: 0, keep: record.schedule!.keep } }, /intervalSeconds/],
    [{ schedule: { intervalSeconds: 60, keep: { last: 1 } } }, /schedule.keep: field "hourly"/],
  ];
  for (const [over, message] of bad) {
    assert.throws(
      () => parseVolumeRecord(JSON.stringify({ ...record, ...over })),
      (err: unknown) => err instanceof SyntaxError && message.test(err.message),
      JSON.stringify(over),
    );
  }
});

/** Manifests: full 1, 2 on 1, 3 on 2; full 4; 6 on 5 (5 missing). */
function history(): SnapshotManifest[] {
  const at = (s: number) => new Date(Date.UTC(2024, 0, 1, 0, s)).toISOString();
  return [
    manifest({ guid: "3", baseGuid: "2", createdAt: at(3) }),
    manifest({ guid: "1", createdAt: at(1) }),
    manifest({ guid: "2", baseGuid: "1", createdAt: at(2) }),
    manifest({ guid: "4", createdAt: at(4) }),
    manifest({ guid: "6", baseGuid: "5", createdAt: at(6) }),
  ];
}

Deno.test("chainTo returns the full stream first, then each incremental", () => {
  assert.deepEqual(chainTo(history(), "3").map((m) => m.guid), ["1", "2", "3"]);
  assert.deepEqual(chainTo(history(), "1").map((m) => m.guid), ["1"]);
  assert.deepEqual(chainTo(history(), "4").map((m) => m.guid), ["4"]);
});

Deno.test("chainTo names the missing base of a broken chain", () => {
  assert.throws(
    () => chainTo(history(), "6"),
    (err: unknown) =>
      err instanceof ChainError && err.missing === "5" && err.guid === "6" &&
      /needs base 5 \(of 6\), which the store does not hold/.test(err.message),
  );
  assert.throws(
    () => chainTo(history(), "7"),
    (err: unknown) => err instanceof ChainError && /no snapshot with guid 7/.test(err.message),
  );
});

Deno.test("chainTo refuses a loop and a base of another volume uid", () => {
  const loop = [manifest({ guid: "1", baseGuid: "2" }), manifest({ guid: "2", baseGuid: "1" })];
  assert.throws(() => chainTo(loop, "1"), /loops at/);
  const foreign = [
    manifest({ guid: "1", volumeUid: "f".repeat(32) }),
    manifest({ guid: "2", baseGuid: "1" }),
  ];
  assert.throws(() => chainTo(foreign, "2"), /belongs to another volume/);
});

Deno.test("latest is the newest; in one second a snapshot comes after its base", () => {
  assert.equal(latest(history())?.guid, "6");
  assert.equal(latest([]), undefined);
  const same = "2024-01-01T00:00:00.000Z";
  const tied = [
    manifest({ guid: "9", baseGuid: "8", createdAt: same }),
    manifest({ guid: "8", createdAt: same }),
  ];
  assert.equal(latest(tied)?.guid, "9");
  assert.equal(latest([...tied].reverse())?.guid, "9");
  assert.deepEqual(oldestFirst(history()).map((m) => m.guid), ["1", "2", "3", "4", "6"]);
});

/** Guids oldest first. */
const order = (ms: SnapshotManifest[]) => oldestFirst(ms).map((m) => m.guid);
const at = (minute: number) => new Date(Date.UTC(2026, 0, 1, 10, minute)).toISOString();

Deno.test("oldestFirst never puts a snapshot before its base, whatever the clocks said", () => {
  // Old manifests (no sequence): node B's clock was 10 minutes behind A's when it extended A's
  // chain. Either way round in the input, B's snapshots come after the base they need.
  const old = [
    manifest({ guid: "1", createdAt: at(30) }),
    manifest({ guid: "2", baseGuid: "1", createdAt: at(31) }),
    manifest({ guid: "3", baseGuid: "2", createdAt: at(22), node: "node-b" }),
    manifest({ guid: "4", baseGuid: "3", createdAt: at(23), node: "node-b" }),
  ];
  assert.deepEqual(order(old), ["1", "2", "3", "4"]);
  assert.deepEqual(order([...old].reverse()), ["1", "2", "3", "4"]);
  assert.equal(latest(old)?.guid, "4");
});

Deno.test("oldestFirst orders chains by sequence number, not by createdAt", () => {
  const ms = [
    manifest({ guid: "1", createdAt: at(50), sequence: 1 }),
    manifest({ guid: "2", baseGuid: "1", createdAt: at(51), sequence: 2 }),
    // A new full stream by a node whose clock is an hour behind: newer all the same.
    manifest({ guid: "3", createdAt: at(0), sequence: 3 }),
    manifest({ guid: "4", baseGuid: "3", createdAt: at(1), sequence: 4 }),
  ];
  assert.deepEqual(order(ms), ["1", "2", "3", "4"]);
  assert.equal(latest([...ms].reverse())?.guid, "4");
  // Two writers that had not seen each other's (a fenced holder's late upload): the same
  // number, the deeper one later, then by guid; the same on every node.
  const twins = [...ms, manifest({ guid: "5", baseGuid: "2", createdAt: at(59), sequence: 4 })];
  assert.deepEqual(order(twins), ["1", "2", "3", "4", "5"]);
  assert.deepEqual(order([...twins].reverse()), ["1", "2", "3", "4", "5"]);
});

Deno.test("oldestFirst puts manifests without sequence numbers before numbered chains", () => {
  const ms = [
    // Written by this version: numbered, with a clock far behind.
    manifest({ guid: "7", createdAt: at(0), sequence: 1 }),
    manifest({ guid: "8", baseGuid: "7", createdAt: at(1), sequence: 2 }),
    // Written before the upgrade: later createdAt, yet older.
    manifest({ guid: "5", createdAt: at(40) }),
    manifest({ guid: "6", baseGuid: "5", createdAt: at(41) }),
    // An old node's incremental on a numbered snapshot during a rolling upgrade: its base's
    // number plus one.
    manifest({ guid: "9", baseGuid: "8", createdAt: at(2) }),
  ];
  assert.deepEqual(order(ms), ["5", "6", "7", "8", "9"]);
  assert.equal(nextSequence(ms), 4);
  // A numbered incremental on an old snapshot comes after it.
  const upgraded = [
    manifest({ guid: "5", createdAt: at(40) }),
    manifest({ guid: "6", baseGuid: "5", sequence: 1 }),
  ];
  assert.deepEqual(order(upgraded), ["5", "6"]);
});

Deno.test("sequenceOf reads only whole numbers from 1 to MAX_SEQUENCE; others count as absent", () => {
  assert.equal(sequenceOf(manifest({ sequence: 12 })), 12);
  assert.equal(sequenceOf(manifest({ sequence: MAX_SEQUENCE })), MAX_SEQUENCE);
  assert.equal(sequenceOf(manifest()), undefined);
  for (const bad of [0, -1, 1.5, MAX_SEQUENCE + 1, Number.NaN, "3", null, true, [4]]) {
    const m = { ...manifest(), sequence: bad } as unknown as SnapshotManifest;
    assert.equal(sequenceOf(m), undefined, String(bad));
  }
  // A number not above its base's (hostile or broken) still comes after its base.
  const low = [
    manifest({ guid: "1", sequence: 9 }),
    manifest({ guid: "2", baseGuid: "1", sequence: 3 }),
  ];
  assert.deepEqual(order(low), ["1", "2"]);
  assert.equal(nextSequence(low), 11);
});

Deno.test("nextSequence is one more than the highest seen, at least its floor", () => {
  assert.equal(nextSequence([]), 1);
  assert.equal(nextSequence([], 7), 7);
  assert.equal(nextSequence([manifest({ guid: "1" })]), 1, "old manifests only");
  const ms = [manifest({ guid: "1", sequence: 4 }), manifest({ guid: "2", sequence: 2 })];
  assert.equal(nextSequence(ms), 5);
  assert.equal(nextSequence(ms, 9), 9);
  assert.throws(() => nextSequence([manifest({ sequence: MAX_SEQUENCE })]), RangeError);
});

Deno.test("isNewer follows oldestFirst; false for a guid not listed", () => {
  const ms = [
    manifest({ guid: "1", createdAt: at(50), sequence: 1 }),
    manifest({ guid: "2", createdAt: at(0), sequence: 2 }),
  ];
  assert.equal(isNewer(ms, "2", "1"), true);
  assert.equal(isNewer(ms, "1", "2"), false);
  assert.equal(isNewer(ms, "1", "1"), false);
  assert.equal(isNewer(ms, "3", "1"), false);
  assert.equal(isNewer(ms, "1", "3"), false);
});
