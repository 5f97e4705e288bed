import assert from "node:assert/strict";
import { Code, CsiError, type GrpcCode } from "../errors.ts";
import {
  type IdScope,
  resolveSnapshot,
  resolveVolume,
  snapshotIdOf,
  volumeIdFor,
  volumeIdOfDataset,
} from "./ids.ts";

const scope: IdScope = { parentDataset: "tank/nomad", nodeId: "node-a" };

function assertCsiError(
  fn: () => unknown,
  code: GrpcCode,
  message: string | RegExp,
  label = String(message),
): void {
  assert.throws(fn, (err: unknown) => {
    assert.ok(err instanceof CsiError, `${label}: expected a CsiError, got ${String(err)}`);
    assert.equal(err.code, code, `${label}: ${err.message}`);
    if (typeof message === "string") assert.equal(err.message, message, label);
    else assert.match(err.message, message, label);
    return true;
  }, label);
}

Deno.test("resolveVolume maps a plain id to a child of the parent", () => {
  const table: ReadonlyArray<readonly [string, string]> = [
    ["pg-data", "tank/nomad/pg-data"],
    ["db[0]", "tank/nomad/db:5b0:5d"],
    ["my vol", "tank/nomad/my:20vol"],
    ["é", "tank/nomad/:c3:a9"],
    [".hidden", "tank/nomad/:2ehidden"],
    ["x".repeat(128), `tank/nomad/${"x".repeat(128)}`],
  ];
  for (const [id, dataset] of table) {
    assert.deepEqual(resolveVolume(id, scope), { id, dataset }, id);
  }
});

Deno.test("resolveVolume accepts name@node of this node and keeps the id as sent", () => {
  assert.deepEqual(resolveVolume("pg-data@node-a", scope), {
    id: "pg-data@node-a",
    dataset: "tank/nomad/pg-data",
  });
  assert.deepEqual(resolveVolume("db[0]@node-a", scope), {
    id: "db[0]@node-a",
    dataset: "tank/nomad/db:5b0:5d",
  });
  // Node ids with dots and underscores, as cloud hostnames have them.
  const cloud: IdScope = { parentDataset: "tank/nomad", nodeId: "ip-10-0-0-1.ec2_internal" };
  assert.deepEqual(resolveVolume("v@ip-10-0-0-1.ec2_internal", cloud), {
    id: "v@ip-10-0-0-1.ec2_internal",
    dataset: "tank/nomad/v",
  });
  const one: IdScope = { parentDataset: "tank/nomad", nodeId: "a" };
  assert.deepEqual(resolveVolume("v@a", one), { id: "v@a", dataset: "tank/nomad/v" });
});

Deno.test("resolveVolume refuses another node's volume with FAILED_PRECONDITION naming both nodes", () => {
  assertCsiError(
    () => resolveVolume("pg-data@node-b", scope),
    Code.FAILED_PRECONDITION,
    /^Volume "pg-data@node-b" lives on node "node-b", but this plugin runs on node "node-a": /,
  );
  // Node ids are case-sensitive.
  assertCsiError(
    () => resolveVolume("pg-data@Node-A", scope),
    Code.FAILED_PRECONDITION,
    /lives on node "Node-A", but this plugin runs on node "node-a"/,
  );
});

Deno.test("resolveVolume refuses malformed ids with INVALID_ARGUMENT naming the id", () => {
  const table: ReadonlyArray<readonly [string, string | RegExp]> = [
    ["", "Volume id is empty"],
    ["@x", 'Volume id "@x" is not of the form name or name@node'],
    ["@", 'Volume id "@" is not of the form name or name@node'],
    ["a@b@c", 'Volume id "a@b@c" is not of the form name or name@node'],
    ["a@node-a@node-a", 'Volume id "a@node-a@node-a" is not of the form name or name@node'],
    ["a@", 'Volume id "a@" names an invalid node ""'],
    ["a@-node", 'Volume id "a@-node" names an invalid node "-node"'],
    ["a@node-", 'Volume id "a@node-" names an invalid node "node-"'],
    ["a@node a", 'Volume id "a@node a" names an invalid node "node a"'],
    ["a@node/x", 'Volume id "a@node/x" names an invalid node "node/x"'],
    ["a@nöde", 'Volume id "a@nöde" names an invalid node "nöde"'],
    [
      `a@${"n".repeat(64)}`,
      `Volume id "a@${"n".repeat(64)}" names an invalid node "${"n".repeat(64)}"`,
    ],
    ["x".repeat(129), "Volume id is longer than 128 bytes"],
    // 43 three-byte characters are 129 bytes.
    ["€".repeat(43), "Volume id is longer than 128 bytes"],
    [`${"x".repeat(122)}@node-a`, "Volume id is longer than 128 bytes"],
    ["a/b", 'Volume id "a/b" must not contain "/"'],
    ["a/b@node-a", 'Volume id "a/b" must not contain "/"'],
    ["..", 'Volume id ".." must not contain ".."'],
    ["a%b", 'Volume id "a%b" must not contain "%"'],
    ["a\nb", /^Volume id "a\\nb" contains control characters$/],
  ];
  for (const [id, message] of table) {
    assertCsiError(() => resolveVolume(id, scope), Code.INVALID_ARGUMENT, message, id);
  }
  // 63 characters is the longest node id.
  const long = "n".repeat(63);
  assertCsiError(
    () => resolveVolume(`a@${long}`, scope),
    Code.FAILED_PRECONDITION,
    new RegExp(`lives on node "${long}"`),
  );
});

Deno.test("resolveVolume accepts the full dataset name of a child as an alias", () => {
  assert.deepEqual(resolveVolume("tank/nomad/pg", scope), {
    id: "tank/nomad/pg",
    dataset: "tank/nomad/pg",
  });
  assert.deepEqual(resolveVolume("tank/nomad/db:5b0:5d", scope), {
    id: "tank/nomad/db:5b0:5d",
    dataset: "tank/nomad/db:5b0:5d",
  });
  assert.deepEqual(resolveVolume("tank/nomad/pg@node-a", scope), {
    id: "tank/nomad/pg@node-a",
    dataset: "tank/nomad/pg",
  });
  assertCsiError(
    () => resolveVolume("tank/other/pg", scope),
    Code.INVALID_ARGUMENT,
    'Volume id "tank/other/pg" must not contain "/"',
  );
  assertCsiError(
    () => resolveVolume("tank/nomad/a/b", scope),
    Code.INVALID_ARGUMENT,
    'Volume id "tank/nomad/a/b" must not contain "/"',
  );
  assertCsiError(
    () => resolveVolume("tank/nomad/pg@node-b", scope),
    Code.FAILED_PRECONDITION,
    /^Volume "tank\/nomad\/pg@node-b" lives on node "node-b"/,
  );
});

Deno.test("resolveSnapshot resolves volume@snapshot and volume@snapshot@node", () => {
  assert.deepEqual(resolveSnapshot("pg@snap1", scope), {
    id: "pg@snap1",
    dataset: "tank/nomad/pg",
    component: "snap1",
    snapshot: "tank/nomad/pg@snap1",
  });
  assert.deepEqual(resolveSnapshot("pg@snap1@node-a", scope), {
    id: "pg@snap1@node-a",
    dataset: "tank/nomad/pg",
    component: "snap1",
    snapshot: "tank/nomad/pg@snap1",
  });
  assert.deepEqual(resolveSnapshot("db[0]@before upgrade@node-a", scope), {
    id: "db[0]@before upgrade@node-a",
    dataset: "tank/nomad/db:5b0:5d",
    component: "before:20upgrade",
    snapshot: "tank/nomad/db:5b0:5d@before:20upgrade",
  });
  assert.deepEqual(resolveSnapshot("tank/nomad/pg@snap1", scope), {
    id: "tank/nomad/pg@snap1",
    dataset: "tank/nomad/pg",
    component: "snap1",
    snapshot: "tank/nomad/pg@snap1",
  });
});

Deno.test("resolveSnapshot escapes hidden snapshot names so no id reaches them", () => {
  const table: ReadonlyArray<readonly [string, string]> = [
    ["pg@.clone-0123456789abcdef", "tank/nomad/pg@:2eclone-0123456789abcdef"],
    ["pg@.deleted-1700000000-old", "tank/nomad/pg@:2edeleted-1700000000-old"],
    ["pg@.deleted-1700000000-old@node-a", "tank/nomad/pg@:2edeleted-1700000000-old"],
  ];
  for (const [id, snapshot] of table) {
    assert.equal(resolveSnapshot(id, scope).snapshot, snapshot, id);
  }
});

Deno.test("resolveSnapshot refuses another node's snapshot with FAILED_PRECONDITION naming both nodes", () => {
  assertCsiError(
    () => resolveSnapshot("pg@snap1@node-b", scope),
    Code.FAILED_PRECONDITION,
    /^Snapshot "pg@snap1@node-b" lives on node "node-b", but this plugin runs on node "node-a": /,
  );
});

Deno.test("resolveSnapshot refuses malformed ids with INVALID_ARGUMENT naming the id", () => {
  const form = (id: string) => `Snapshot id "${id}" is not of the form volume@snapshot@node`;
  const table: ReadonlyArray<readonly [string, string]> = [
    ["", "Snapshot id is empty"],
    ["pg", form("pg")],
    ["pg@a@node-a@x", form("pg@a@node-a@x")],
    ["@snap1", form("@snap1")],
    ["pg@", form("pg@")],
    ["pg@@node-a", form("pg@@node-a")],
    ["@", form("@")],
    ["pg@snap1@", 'Snapshot id "pg@snap1@" names an invalid node ""'],
    ["pg@snap1@bad node", 'Snapshot id "pg@snap1@bad node" names an invalid node "bad node"'],
    ["pg@a%b", 'Snapshot name "a%b" must not contain "%"'],
    ["pg@a/b", 'Snapshot name "a/b" must not contain "/"'],
    [`pg@${"s".repeat(129)}`, "Snapshot id is longer than 128 bytes"],
    ["a/b@snap1", 'Volume id "a/b" must not contain "/"'],
    [`${"v".repeat(129)}@snap1`, "Snapshot id is longer than 128 bytes"],
    [`${"v".repeat(61)}@${"s".repeat(60)}@node-a`, "Snapshot id is longer than 128 bytes"],
  ];
  for (const [id, message] of table) {
    assertCsiError(() => resolveSnapshot(id, scope), Code.INVALID_ARGUMENT, message, id);
  }
});

Deno.test("volumeIdFor qualifies a name with this node", () => {
  assert.equal(volumeIdFor("pg-data", scope), "pg-data@node-a");
  assert.equal(volumeIdFor("db[0]", scope), "db[0]@node-a");
  assert.equal(volumeIdFor("my vol", scope), "my vol@node-a");
});

Deno.test("volumeIdFor keeps the id within 128 bytes, node included", () => {
  // "@node-a" takes 7 bytes, leaving 121 for the name.
  assert.equal(volumeIdFor("x".repeat(121), scope), `${"x".repeat(121)}@node-a`);
  assertCsiError(
    () => volumeIdFor("x".repeat(122), scope),
    Code.INVALID_ARGUMENT,
    `Volume name "${"x".repeat(122)}" is too long: its id "${"x".repeat(122)}@node-a" ` +
      `would exceed 128 bytes`,
  );
  // Bytes, not characters: 60 "é" are 120 bytes, 61 are 122.
  assert.equal(volumeIdFor("é".repeat(60), scope), `${"é".repeat(60)}@node-a`);
  assertCsiError(
    () => volumeIdFor("é".repeat(61), scope),
    Code.INVALID_ARGUMENT,
    /^Volume name "é+" is too long: its id "é+@node-a" would exceed 128 bytes$/,
  );
});

Deno.test("volumeIdFor refuses invalid names with INVALID_ARGUMENT", () => {
  const table: ReadonlyArray<readonly [string, string]> = [
    ["", "Volume name is empty"],
    ["a/b", 'Volume name "a/b" must not contain "/"'],
    ["a@b", 'Volume name "a@b" must not contain "@"'],
    ["a..b", 'Volume name "a..b" must not contain ".."'],
    ["a\u0000", 'Volume name "a\\u0000" contains control characters'],
    ["x".repeat(129), "Volume name is longer than 128 bytes"],
  ];
  for (const [name, message] of table) {
    assertCsiError(() => volumeIdFor(name, scope), Code.INVALID_ARGUMENT, message, name);
  }
});

Deno.test("volumeIdOfDataset returns the node-qualified id of a volume's dataset", () => {
  assert.equal(volumeIdOfDataset("tank/nomad/pg", scope), "pg@node-a");
  assert.equal(volumeIdOfDataset("tank/nomad/db:5b0:5d", scope), "db[0]@node-a");
  assert.equal(volumeIdOfDataset("tank/nomad/:2ehidden", scope), ".hidden@node-a");
});

Deno.test("volumeIdOfDataset returns undefined for hidden and foreign datasets", () => {
  const table = [
    "tank/nomad/.deleted-1700000000-pg",
    "tank/nomad/.clone-0123456789abcdef",
    "tank/nomad",
    "tank/nomad/",
    "tank/nomadx/pg",
    "tank/other/pg",
    "tank/nomad/a/b",
    "tank/nomad/pg@snap1",
    "tank/nomad/x:zz",
    "other/nomad/pg",
  ];
  for (const dataset of table) {
    assert.equal(volumeIdOfDataset(dataset, scope), undefined, dataset);
  }
});

Deno.test("volumeIdFor, resolveVolume and volumeIdOfDataset round trip", () => {
  for (const name of ["pg", "db[0]", "my vol", "日本", ".hidden", "a:b", "x".repeat(121)]) {
    const id = volumeIdFor(name, scope);
    const { dataset } = resolveVolume(id, scope);
    assert.equal(volumeIdOfDataset(dataset, scope), id, name);
  }
});

Deno.test("snapshotIdOf returns the node-qualified id of a CSI snapshot", () => {
  assert.equal(snapshotIdOf("tank/nomad/pg@snap1", scope), "pg@snap1@node-a");
  assert.equal(
    snapshotIdOf("tank/nomad/db:5b0:5d@before:20upgrade", scope),
    "db[0]@before upgrade@node-a",
  );
});

Deno.test("snapshotIdOf returns undefined for hidden snapshots and foreign datasets", () => {
  const table = [
    "tank/nomad/pg@.clone-0123456789abcdef",
    "tank/nomad/pg@.deleted-1700000000-old",
    "tank/nomad/.deleted-1700000000-old@snap1",
    "tank/nomad@snap1",
    "tank/nomadx/pg@snap1",
    "tank/other/pg@snap1",
    "tank/nomad/a/b@snap1",
    "tank/nomad/pg",
    "tank/nomad/pg@x:zz",
    "tank/nomad/pg@",
  ];
  for (const snapshot of table) {
    assert.equal(snapshotIdOf(snapshot, scope), undefined, snapshot);
  }
});

Deno.test("snapshotIdOf and resolveSnapshot round trip", () => {
  const table = [
    "tank/nomad/pg@snap1",
    "tank/nomad/db:5b0:5d@before:20upgrade",
    "tank/nomad/:2ehidden@:2ex",
    "tank/nomad/a:3ab@:e6:97:a5",
  ];
  for (const snapshot of table) {
    const id = snapshotIdOf(snapshot, scope);
    assert.ok(id !== undefined, snapshot);
    assert.equal(resolveSnapshot(id, scope).snapshot, snapshot, id);
  }
});
