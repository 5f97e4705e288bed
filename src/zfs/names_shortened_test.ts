import assert from "node:assert/strict";
import { Code } from "../errors.ts";
import { assertThrowsCsi } from "../../tests/support/assert_errors.ts";
import {
  datasetForVolume,
  decodeComponent,
  encodeComponent,
  encodeName,
  MANAGED_PROPERTY,
  NAME_PROPERTY,
  SHORTENED_SEPARATOR,
  splitShortened,
  STAGED_PROPERTY,
  volumeForDataset,
} from "./names.ts";

const HASH = "0123456789abcdef";

Deno.test("encodeComponent takes shortened names, which encodeName refuses", () => {
  const table: ReadonlyArray<readonly [string, string]> = [
    [`pg-data..${HASH}`, `pg-data..${HASH}`],
    [`db[0]..${HASH}`, `db:5b0:5d..${HASH}`],
    [`é..${HASH}`, `:c3:a9..${HASH}`],
    // A leading "." of the prefix is escaped as anywhere: the component is never hidden.
    [`.x..${HASH}`, `:2ex..${HASH}`],
    // A prefix that ends with ".": the last 18 characters are always "..<hash>".
    [`a...${HASH}`, `a...${HASH}`],
    ["plain", "plain"],
  ];
  for (const [name, component] of table) {
    assert.equal(encodeComponent("Volume id", name), component, name);
    if (name !== "plain") {
      assertThrowsCsi(
        () => encodeName("Volume name", name),
        Code.INVALID_ARGUMENT,
        `Volume name "${name}" must not contain ".."`,
      );
    }
  }
});

Deno.test("encodeComponent takes only the exact shortened shape", () => {
  const bad = [
    "..",
    `..${HASH}`,
    `a..${HASH.toUpperCase()}`,
    `a..${HASH}0`,
    `a..${HASH.slice(1)}`,
    `a..b..${HASH}`,
    "a..x",
    `a..${HASH}..${HASH}`,
  ];
  for (const name of bad) {
    assertThrowsCsi(
      () => encodeComponent("Volume id", name),
      Code.INVALID_ARGUMENT,
      `Volume id "${name}" must not contain ".."`,
      name,
    );
  }
  // The other checks see the whole name.
  assertThrowsCsi(
    () => encodeComponent("Volume id", `a/b..${HASH}`),
    Code.INVALID_ARGUMENT,
    `Volume id "a/b..${HASH}" must not contain "/"`,
  );
  assertThrowsCsi(
    () => encodeComponent("Volume id", `${"x".repeat(111)}..${HASH}`),
    Code.INVALID_ARGUMENT,
    "Volume id is longer than 128 bytes",
  );
});

Deno.test("splitShortened finds the prefix and hash of a shortened name only", () => {
  assert.deepEqual(splitShortened(`pg..${HASH}`), { prefix: "pg", hash: HASH });
  assert.deepEqual(splitShortened(`a...${HASH}`), { prefix: "a.", hash: HASH });
  assert.equal(splitShortened(`pg-${HASH}`), undefined);
  assert.equal(splitShortened(HASH), undefined);
  assert.equal(SHORTENED_SEPARATOR, "..");
});

Deno.test("decodeComponent reverses encodeComponent for shortened names, in their exact shape only", () => {
  for (
    const name of [`pg..${HASH}`, `db[0]..${HASH}`, `é..${HASH}`, `a...${HASH}`, `.x..${HASH}`]
  ) {
    assert.equal(decodeComponent(encodeComponent("Volume id", name)), name, name);
  }
  const foreign = [
    `.x..${HASH}`, // hidden: a leading dot is always escaped
    `..${HASH}`,
    `a:2e.${HASH}`, // the same name, escaped where it is never escaped
    `a..b..${HASH}`,
    `a..${HASH.toUpperCase()}`,
  ];
  for (const component of foreign) assert.equal(decodeComponent(component), undefined, component);
});

Deno.test("datasetForVolume and volumeForDataset map shortened ids both ways", () => {
  assert.equal(datasetForVolume("tank/nomad", `pg..${HASH}`), `tank/nomad/pg..${HASH}`);
  assert.equal(datasetForVolume("tank/nomad", `tank/nomad/pg..${HASH}`), `tank/nomad/pg..${HASH}`);
  assert.equal(volumeForDataset("tank/nomad", `tank/nomad/pg..${HASH}`), `pg..${HASH}`);
  assert.equal(volumeForDataset("tank/nomad", `tank/nomad/.deleted-1-pg..${HASH}`), undefined);
});

Deno.test("NAME_PROPERTY and STAGED_PROPERTY are user properties of our namespace", () => {
  for (const p of [NAME_PROPERTY, STAGED_PROPERTY]) {
    assert.ok(p.startsWith(MANAGED_PROPERTY.slice(0, MANAGED_PROPERTY.indexOf(":") + 1)), p);
  }
  assert.deepEqual([NAME_PROPERTY, STAGED_PROPERTY], ["org.zfs-csi:name", "org.zfs-csi:staged-at"]);
});
