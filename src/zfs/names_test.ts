import assert from "node:assert/strict";
import { Code } from "../errors.ts";
import { assertThrowsCsi } from "../../tests/support/assert_errors.ts";
import {
  checkDatasetName,
  CLONE_PREFIX,
  cloneSnapshotComponent,
  datasetForVolume,
  decodeComponent,
  DELETED_AT_PROPERTY,
  DELETED_NAME_PROPERTY,
  DELETED_PREFIX,
  deletedComponent,
  encodeName,
  encodeVolumeId,
  isDeletedComponent,
  MAX_VOLUME_ID_BYTES,
  parseDeletedAt,
  poolOf,
  volumeForDataset,
} from "./names.ts";

function assertInvalid(fn: () => unknown, messageIncludes?: string): void {
  assertThrowsCsi(
    fn,
    Code.INVALID_ARGUMENT,
    messageIncludes === undefined ? undefined : { includes: messageIncludes },
  );
}

Deno.test("encodeVolumeId keeps letters, digits and _.- as they are", () => {
  assert.equal(encodeVolumeId("Vol_1.data-2"), "Vol_1.data-2");
});

Deno.test("encodeVolumeId escapes each UTF-8 byte of other characters as :xx", () => {
  const table: ReadonlyArray<readonly [string, string]> = [
    ["db[0]", "db:5b0:5d"],
    ["my vol", "my:20vol"],
    ["a:b", "a:3ab"],
    ["é", ":c3:a9"],
    ["日本", ":e6:97:a5:e6:9c:ac"],
    ["x🙂", "x:f0:9f:99:82"],
    ["A+B", "A:2bB"],
  ];
  for (const [id, component] of table) {
    assert.equal(encodeVolumeId(id), component, `encoding ${JSON.stringify(id)}`);
  }
});

Deno.test("encodeVolumeId escapes a leading dot but not a later one", () => {
  assert.equal(encodeVolumeId(".hidden"), ":2ehidden");
  assert.equal(encodeVolumeId("a.b"), "a.b");
  assert.equal(encodeVolumeId("."), ":2e");
});

Deno.test("decodeComponent reverses encodeVolumeId", () => {
  const ids = [
    "db[0]",
    "my vol",
    "a:b",
    "é",
    "日本語 ボリューム",
    "x🙂y",
    ".hidden",
    "plain-id_1.0",
    "~!#$^&*()=+{}|;'<>,?`\"\\",
    "x".repeat(MAX_VOLUME_ID_BYTES),
  ];
  for (const id of ids) {
    const component = encodeVolumeId(id);
    assert.match(component, /^[A-Za-z0-9_.:-]+$/);
    assert.equal(decodeComponent(component), id, `round trip of ${JSON.stringify(id)}`);
  }
});

Deno.test("decodeComponent refuses components no volume id encodes to", () => {
  const table = [
    "x:zz", // not hex
    "x:5", // truncated escape
    "x:5B", // upper-case hex is not what we write
    ":61", // "a" escaped although it is plain
    ".hidden", // a leading dot is always escaped
    ":ff", // not UTF-8
    "a/b", // not a component
    "a b",
    "",
    "a..b", // ".." is refused in ids
    "a:2fb", // "/" in an id is refused
  ];
  for (const component of table) {
    assert.equal(decodeComponent(component), undefined, `component ${JSON.stringify(component)}`);
  }
});

Deno.test("encodeVolumeId rejects unsafe or empty ids with INVALID_ARGUMENT", () => {
  const table: ReadonlyArray<readonly [string, string]> = [
    ["", "empty"],
    ["..", '".."'],
    ["a..b", '".."'],
    ["a/b", '"/"'],
    ["../etc", '"/"'],
    ["a@b", '"@"'],
    ["a%b", '"%"'],
    ["a\nb", "control characters"],
    ["a\u0000b", "control characters"],
    ["tab\there", "control characters"],
    ["del\u007f", "control characters"],
  ];
  for (const [id, why] of table) assertInvalid(() => encodeVolumeId(id), why);
});

Deno.test("encodeVolumeId accepts 128 bytes and rejects 129", () => {
  assert.equal(encodeVolumeId("a".repeat(128)), "a".repeat(128));
  assertInvalid(() => encodeVolumeId("a".repeat(129)), "longer than 128 bytes");
  // 43 three-byte characters are 129 bytes although only 43 UTF-16 units.
  assertInvalid(() => encodeVolumeId("€".repeat(43)), "longer than 128 bytes");
});

Deno.test("datasetForVolume names a direct child of the parent", () => {
  assert.equal(datasetForVolume("tank/nomad", "pg-data"), "tank/nomad/pg-data");
  assert.equal(datasetForVolume("tank/nomad", "db[0]"), "tank/nomad/db:5b0:5d");
  assert.equal(datasetForVolume("tank/nomad", "my vol"), "tank/nomad/my:20vol");
  assert.equal(datasetForVolume("tank/nomad", ".x"), "tank/nomad/:2ex");
  assertInvalid(() => datasetForVolume("tank/nomad", "tank/other"), '"/"');
});

Deno.test("datasetForVolume accepts the full dataset name of a child as an alias", () => {
  assert.equal(datasetForVolume("tank/nomad", "tank/nomad/pg-data"), "tank/nomad/pg-data");
  assert.equal(datasetForVolume("tank/nomad", "tank/nomad/db:5b0:5d"), "tank/nomad/db:5b0:5d");
});

Deno.test("datasetForVolume refuses aliases that are not a direct child", () => {
  assertInvalid(() => datasetForVolume("tank/nomad", "tank/nomad/a/b"));
  assertInvalid(() => datasetForVolume("tank/nomad", "tank/nomad/"));
  assertInvalid(() => datasetForVolume("tank/nomad", "tank/nomad/../x"));
  assertInvalid(() => datasetForVolume("tank/nomad", "tank/other/x"));
  assertInvalid(() => datasetForVolume("tank/nomad", "tank/nomad/x@snap"));
});

Deno.test("datasetForVolume refuses an id whose dataset would exceed 255 bytes", () => {
  const parent = "tank/" + "p".repeat(150); // 155 bytes, so the child may have 99
  assert.equal(datasetForVolume(parent, "v".repeat(99)), `${parent}/${"v".repeat(99)}`);
  assertInvalid(() => datasetForVolume(parent, "v".repeat(100)), "exceed 255 bytes");
  // 40 spaces are 40 bytes of id but 120 bytes of dataset name.
  assertInvalid(() => datasetForVolume(parent, " ".repeat(40)), "exceed 255 bytes");
});

Deno.test("volumeForDataset returns the volume id of a direct child", () => {
  assert.equal(volumeForDataset("tank/nomad", "tank/nomad/pg-data"), "pg-data");
  assert.equal(volumeForDataset("tank/nomad", "tank/nomad/db:5b0:5d"), "db[0]");
  assert.equal(volumeForDataset("tank/nomad", "tank/nomad/:2ehidden"), ".hidden");
});

Deno.test("volumeForDataset returns undefined for foreign datasets", () => {
  const table = [
    "tank/nomad/x:zz",
    "tank/other/x",
    "tank/nomad/a/b",
    "tank/nomad",
    "tank/nomad/",
    "tank/nomadx/y",
    "tank/nomad/.hidden",
    "tank/nomad/x@snap",
  ];
  for (const dataset of table) {
    assert.equal(volumeForDataset("tank/nomad", dataset), undefined, dataset);
  }
});

Deno.test("checkDatasetName accepts pool and dataset names", () => {
  for (const name of ["tank", "tank/nomad", "tpool/nomad/db:5b0:5d", "t1/a_b.c-d:e"]) {
    assert.doesNotThrow(() => checkDatasetName(name), name);
  }
});

Deno.test("checkDatasetName rejects malformed names with a TypeError", () => {
  const table: ReadonlyArray<readonly [string, RegExp]> = [
    ["", /empty/],
    ["/tank", /not valid/],
    ["tank/", /not valid/],
    ["tank//x", /not valid/],
    ["tank/./x", /not valid/],
    ["tank/../x", /not valid/],
    ["tank/a b", /not valid/],
    ["tank/x@snap", /not valid/],
    ["tank/x%y", /not valid/],
    ["1tank/x", /must start with a pool name beginning with a letter/],
    ["_tank", /must start with a pool name/],
    ["tank/" + "x".repeat(251), /longer than 255 bytes/],
  ];
  for (const [name, message] of table) {
    assert.throws(() => checkDatasetName(name), (err: unknown) => {
      assert.ok(err instanceof TypeError, `${JSON.stringify(name)}: ${String(err)}`);
      assert.match(err.message, message);
      return true;
    });
  }
  assert.doesNotThrow(() => checkDatasetName("tank/" + "x".repeat(250)));
});

Deno.test("poolOf returns the first component", () => {
  assert.equal(poolOf("tank/nomad/v1"), "tank");
  assert.equal(poolOf("tank"), "tank");
});

Deno.test("encodeName encodes like encodeVolumeId", () => {
  assert.equal(encodeName("Snapshot name", "db[0]"), "db:5b0:5d");
  assert.equal(encodeName("Snapshot name", "before upgrade"), "before:20upgrade");
  assert.equal(encodeName("Snapshot name", ".clone-x"), ":2eclone-x");
});

Deno.test("encodeName starts its messages with what it encodes", () => {
  const table: ReadonlyArray<readonly [string, string]> = [
    ["", "Snapshot name is empty"],
    ["s".repeat(129), "Snapshot name is longer than 128 bytes"],
    ["a\nb", 'Snapshot name "a\\nb" contains control characters'],
    ["a/b", 'Snapshot name "a/b" must not contain "/"'],
    ["a@b", 'Snapshot name "a@b" must not contain "@"'],
    ["a%b", 'Snapshot name "a%b" must not contain "%"'],
    ["a..b", 'Snapshot name "a..b" must not contain ".."'],
  ];
  for (const [name, message] of table) {
    assertThrowsCsi(
      () => encodeName("Snapshot name", name),
      Code.INVALID_ARGUMENT,
      message,
      JSON.stringify(name),
    );
  }
  assertInvalid(() => encodeName("Volume name", ""), "Volume name is empty");
});

Deno.test("DELETED_PREFIX and CLONE_PREFIX start with a dot, which no id encodes to", () => {
  assert.equal(DELETED_PREFIX, ".deleted-");
  assert.equal(CLONE_PREFIX, ".clone-");
  assert.equal(decodeComponent(DELETED_PREFIX + "1700000000-pg"), undefined);
  assert.equal(decodeComponent(CLONE_PREFIX + "0123456789abcdef-1700000000"), undefined);
});

Deno.test("deletedComponent writes .deleted-<seconds>-<component>", () => {
  assert.equal(deletedComponent("pg", 1700000000, 255), ".deleted-1700000000-pg");
  assert.equal(deletedComponent("db:5b0:5d", 1700000000, 255), ".deleted-1700000000-db:5b0:5d");
  // Fractions of a second are dropped.
  assert.equal(deletedComponent("pg", 1700000000.9, 255), ".deleted-1700000000-pg");
  assert.equal(deletedComponent("pg", 0, 255), ".deleted-0-pg");
  assert.equal(decodeComponent(deletedComponent("pg", 1700000000, 255)), undefined);
});

Deno.test("deletedComponent cuts the name to maxBytes, keeping prefix and time", () => {
  const long = "x".repeat(300);
  const cut = deletedComponent(long, 1700000000, 100);
  assert.equal(cut, ".deleted-1700000000-" + "x".repeat(80));
  assert.equal(cut.length, 100);
  // Exactly fitting names are not cut.
  assert.equal(deletedComponent("pg", 1700000000, 22), ".deleted-1700000000-pg");
  assert.equal(deletedComponent("pg", 1700000000, 21), ".deleted-1700000000-p");
  // However little room is given, prefix and 12 more characters are kept.
  assert.equal(deletedComponent("pg", 1700000000, 5), ".deleted-1700000000-p");
  assert.ok(isDeletedComponent(deletedComponent(long, 1700000000, 5)));
});

Deno.test("isDeletedComponent recognises what deletedComponent writes", () => {
  for (const c of ["pg", "db:5b0:5d", "x".repeat(300), ""]) {
    for (const t of [0, 1, 1700000000, 4102444800]) {
      assert.ok(isDeletedComponent(deletedComponent(c, t, 255)), `${c} at ${t}`);
    }
  }
});

Deno.test("isDeletedComponent refuses other names", () => {
  const table = [
    "pg",
    ".deleted-1700000000",
    ".deleted--pg",
    ".deleted-abc-pg",
    ".deleted-1234567890123-pg",
    "deleted-1700000000-pg",
    ":2edeleted-1700000000-pg",
    "x.deleted-1700000000-pg",
    ".clone-0123456789abcdef-1700000000",
    "",
  ];
  for (const c of table) assert.equal(isDeletedComponent(c), false, c);
});

Deno.test("DELETED_AT_PROPERTY and DELETED_NAME_PROPERTY are user properties of our namespace", () => {
  assert.equal(DELETED_AT_PROPERTY, "org.zfs-csi:deleted-at");
  assert.equal(DELETED_NAME_PROPERTY, "org.zfs-csi:deleted-name");
});

Deno.test("parseDeletedAt reads plain unix seconds and nothing else", () => {
  assert.equal(parseDeletedAt("1700000000"), 1700000000);
  assert.equal(parseDeletedAt("0"), 0);
  assert.equal(parseDeletedAt("999999999999"), 999999999999);
  for (const v of ["", "-", "1e9", "1700000000.5", "-1", " 1", "1234567890123", "0x10"]) {
    assert.equal(parseDeletedAt(v), undefined, JSON.stringify(v));
  }
});

Deno.test("cloneSnapshotComponent is .clone-<FNV-1a 64 of the target>-<seconds>", () => {
  // The published FNV-1a 64-bit test vectors.
  assert.equal(cloneSnapshotComponent("", 1700000000), ".clone-cbf29ce484222325-1700000000");
  assert.equal(cloneSnapshotComponent("a", 1700000000), ".clone-af63dc4c8601ec8c-1700000000");
  assert.equal(cloneSnapshotComponent("foobar", 1), ".clone-85944171f73967e8-1");
  // A hash below 2^60 is padded to 16 digits.
  assert.equal(
    cloneSnapshotComponent("tank/nomad/x00", 1700000000),
    ".clone-04aefac26b33d546-1700000000",
  );
  assert.equal(
    cloneSnapshotComponent("tank/nomad/copy", 1700000000.7),
    ".clone-ad5c7e1013b430f7-1700000000",
  );
});

Deno.test("cloneSnapshotComponent is deterministic and differs between targets", () => {
  const targets = ["tank/nomad/a", "tank/nomad/b", "tank/nomad/copy", "tank/nomad/db:5b0:5d"];
  const names = targets.map((t) => cloneSnapshotComponent(t, 1700000000));
  assert.equal(new Set(names).size, targets.length);
  for (const [i, t] of targets.entries()) {
    const name = names[i]!;
    assert.equal(cloneSnapshotComponent(t, 1700000000), name);
    assert.ok(name.startsWith(CLONE_PREFIX), name);
    assert.match(name, /^\.clone-[0-9a-f]{16}-1700000000$/);
    assert.equal(decodeComponent(name), undefined, name);
    assert.equal(isDeletedComponent(name), false, name);
    // Another second, the same hash.
    const later = cloneSnapshotComponent(t, 1700000001);
    assert.equal(later, name.replace(/-1700000000$/, "-1700000001"));
  }
});
