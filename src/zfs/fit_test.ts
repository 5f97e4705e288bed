import assert from "node:assert/strict";
import { createHash } from "node:crypto";
import { Code } from "../errors.ts";
import { assertThrowsCsi } from "../../tests/support/assert_errors.ts";
import { fittedSnapshotName, fittedVolumeName, isFormOf } from "./fit.ts";
import { byteLength, childDataset, encodeName } from "./names.ts";

const hash16 = (s: string) => createHash("sha256").update(s).digest("hex").slice(0, 16);

Deno.test("fittedVolumeName keeps a name whose id and dataset fit", () => {
  assert.equal(fittedVolumeName("pg-data", "tank/nomad", "node-a"), "pg-data");
  // 121 + "@node-a" is exactly 128 bytes.
  const exact = "x".repeat(121);
  assert.equal(fittedVolumeName(exact, "tank/nomad", "node-a"), exact);
});

Deno.test("fittedVolumeName shortens a 128-byte name to a prefix and its hash, the same every time", () => {
  const name = "sanity-max-" + "a".repeat(117);
  assert.equal(name.length, 128);
  const short = fittedVolumeName(name, "tank/nomad", "node-a");
  assert.equal(short, `${name.slice(0, 96 - 7 - 18)}..${hash16(name)}`);
  assert.equal(byteLength(`${short}@node-a`), 96);
  assert.equal(fittedVolumeName(name, "tank/nomad", "node-a"), short);
  // Names that differ only after the prefix still get different volumes.
  const other = name.slice(0, -1) + "b";
  assert.notEqual(fittedVolumeName(other, "tank/nomad", "node-a"), short);
});

Deno.test("fittedVolumeName shortens for a long parent dataset too, and cuts at whole characters", () => {
  const parent = "tank/" + "p".repeat(200);
  const short = fittedVolumeName("é".repeat(40), parent, "n1");
  assert.ok(byteLength(`${parent}/${short.replace(/é/g, ":c3:a9")}`) <= 255, short);
  assert.match(short, /^é+\.\.[0-9a-f]{16}$/);
  assertThrowsCsi(
    () => fittedVolumeName("v", "tank/" + "p".repeat(250), "n1"),
    Code.INVALID_ARGUMENT,
    /cannot be made to fit/,
  );
  assertThrowsCsi(() => fittedVolumeName("a/b", "tank/nomad", "n1"), Code.INVALID_ARGUMENT);
  assertThrowsCsi(
    () => fittedVolumeName("x".repeat(129), "tank/nomad", "n1"),
    Code.INVALID_ARGUMENT,
  );
});

Deno.test("fittedSnapshotName shortens what does not fit beside the volume's name", () => {
  const volume = "CreateSnapshot-volume-maxlen-name-0123ABCD-4567EF01";
  const dataset = `tank/nomad/${volume}`;
  assert.equal(fittedSnapshotName(volume, dataset, "nightly", "node-a"), "nightly");
  const name = "s".repeat(128);
  const short = fittedSnapshotName(volume, dataset, name, "node-a");
  assert.equal(byteLength(`${volume}@${short}@node-a`), 128);
  assert.ok(short.endsWith(`..${hash16(name)}`));
  assert.ok(isFormOf(short, name));
  // A volume name that leaves no room for even the hash is refused.
  const full = "v".repeat(110);
  assertThrowsCsi(
    () => fittedSnapshotName(full, `tank/nomad/${full}`, name, "node-a"),
    Code.INVALID_ARGUMENT,
    /leaves no room/,
  );
});

Deno.test("isFormOf knows a name and its shortened forms, and nothing else", () => {
  const name = "n".repeat(100) + "z";
  const h = hash16(name);
  assert.ok(isFormOf(name, name));
  assert.ok(isFormOf(`${"n".repeat(10)}..${h}`, name));
  assert.ok(!isFormOf(`${"m".repeat(10)}..${h}`, name));
  assert.ok(!isFormOf(`${"n".repeat(10)}..${hash16("other")}`, name));
  assert.ok(!isFormOf("n".repeat(100), name));
  // The earlier forms, which snapshots made before ".." marked them still carry.
  assert.ok(isFormOf(`${"n".repeat(10)}-${h}`, name));
  assert.ok(isFormOf(h, name));
  assert.ok(!isFormOf(`${"m".repeat(10)}-${h}`, name));
  assert.ok(!isFormOf(`${"n".repeat(10)}-${hash16("other")}`, name));
});

Deno.test("fittedVolumeName: no name a client sends equals another name's shortened form", () => {
  const long = "postgres-" + "x".repeat(119);
  const short = fittedVolumeName(long, "tank/nomad", "node-a");
  assert.match(short, /^postgres-x+\.\.[0-9a-f]{16}$/);
  // Sent as a name of its own, the shortened form is refused, as a volume and as a snapshot...
  assertThrowsCsi(
    () => fittedVolumeName(short, "tank/nomad", "node-a"),
    Code.INVALID_ARGUMENT,
    `Volume name "${short}" must not contain ".."`,
  );
  assertThrowsCsi(
    () => fittedSnapshotName("v", "tank/nomad/v", short, "node-a"),
    Code.INVALID_ARGUMENT,
    /must not contain "\.\."/,
  );
  assertThrowsCsi(() => encodeName("Volume name", short), Code.INVALID_ARGUMENT);
  // ... while the earlier "-" form is an ordinary name, with a dataset of its own.
  const legacy = short.replace("..", "-");
  assert.equal(fittedVolumeName(legacy, "tank/nomad", "node-a"), legacy);
  assert.notEqual(
    childDataset("tank/nomad", "Volume name", legacy),
    childDataset("tank/nomad", "Volume name", short),
  );
});

Deno.test("fittedVolumeName keeps at least one character of prefix, never a bare hash", () => {
  // "tank/" and 230 bytes: "<parent>/a..<hash>" is exactly 255 bytes.
  const parent = "tank/" + "p".repeat(230);
  const name = "a".repeat(128);
  const short = fittedVolumeName(name, parent, "n1");
  assert.equal(short, `a..${hash16(name)}`);
  assert.equal(byteLength(`${parent}/${short}`), 255);
  // One encoded character no longer fits, and a bare hash is not offered instead.
  assertThrowsCsi(
    () => fittedVolumeName("é".repeat(64), parent, "n1"),
    Code.INVALID_ARGUMENT,
    /cannot be made to fit/,
  );
});
