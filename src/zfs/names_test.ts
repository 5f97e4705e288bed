import assert from "node:assert/strict";
import { Code, CsiError } from "../errors.ts";
import {
  checkDatasetName,
  datasetForVolume,
  decodeComponent,
  encodeVolumeId,
  MAX_VOLUME_ID_BYTES,
  poolOf,
  volumeForDataset,
} from "./names.ts";

function assertInvalid(fn: () => unknown, messageIncludes?: string): void {
  assert.throws(fn, (err: unknown) => {
    assert.ok(err instanceof CsiError, `expected a CsiError, got ${String(err)}`);
    assert.equal(err.code, Code.INVALID_ARGUMENT);
    if (messageIncludes !== undefined) {
      assert.ok(err.message.includes(messageIncludes), err.message);
    }
    return true;
  });
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
