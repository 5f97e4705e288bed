import assert from "node:assert/strict";
import { Code } from "../errors.ts";
import { assertThrowsCsi } from "../../tests/support/assert_errors.ts";
import {
  followVolumeId,
  type IdScope,
  isFollowVolumeId,
  resolveSnapshot,
  resolveVolume,
  snapshotIdOf,
  volumeIdFor,
  volumeIdOfDataset,
} from "./ids.ts";

const scope: IdScope = { parentDataset: "tank/nomad", nodeId: "node-a" };

/** Asserts that `id` resolves to `dataset` in `s`, keeping the id as sent. */
function assertResolves(id: string, dataset: string, s: IdScope = scope): void {
  assert.deepEqual(resolveVolume(id, s), { id, dataset }, id);
}

/** Asserts that `fn` refuses each `[input, message]` of `table` with INVALID_ARGUMENT. */
function assertInvalidEach(
  fn: (input: string, s: IdScope) => unknown,
  table: ReadonlyArray<readonly [string, string | RegExp]>,
): void {
  for (const [input, message] of table) {
    assertThrowsCsi(() => fn(input, scope), Code.INVALID_ARGUMENT, message, input);
  }
}

/** Asserts that `fn` answers undefined for each of `names`. */
function assertNoneOf(fn: (name: string, s: IdScope) => string | undefined, names: string[]): void {
  for (const name of names) assert.equal(fn(name, scope), undefined, name);
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
  for (const [id, dataset] of table) assertResolves(id, dataset);
});

Deno.test("resolveVolume accepts name@node of this node and keeps the id as sent", () => {
  assertResolves("pg-data@node-a", "tank/nomad/pg-data");
  assertResolves("db[0]@node-a", "tank/nomad/db:5b0:5d");
  // Node ids with dots and underscores, as cloud hostnames have them.
  const cloud: IdScope = { parentDataset: "tank/nomad", nodeId: "ip-10-0-0-1.ec2_internal" };
  assertResolves("v@ip-10-0-0-1.ec2_internal", "tank/nomad/v", cloud);
  const one: IdScope = { parentDataset: "tank/nomad", nodeId: "a" };
  assertResolves("v@a", "tank/nomad/v", one);
});

Deno.test("resolveVolume refuses another node's volume with FAILED_PRECONDITION naming both nodes", () => {
  assertThrowsCsi(
    () => resolveVolume("pg-data@node-b", scope),
    Code.FAILED_PRECONDITION,
    /^Volume "pg-data@node-b" lives on node "node-b", but this plugin runs on node "node-a": /,
  );
  // Node ids are case-sensitive.
  assertThrowsCsi(
    () => resolveVolume("pg-data@Node-A", scope),
    Code.FAILED_PRECONDITION,
    /lives on node "Node-A", but this plugin runs on node "node-a"/,
  );
});

Deno.test("resolveVolume refuses malformed ids with INVALID_ARGUMENT naming the id", () => {
  assertInvalidEach(resolveVolume, [
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
  ]);
  // 63 characters is the longest node id.
  const long = "n".repeat(63);
  assertThrowsCsi(
    () => resolveVolume(`a@${long}`, scope),
    Code.FAILED_PRECONDITION,
    new RegExp(`lives on node "${long}"`),
  );
});

Deno.test("resolveVolume accepts the full dataset name of a child as an alias", () => {
  assertResolves("tank/nomad/pg", "tank/nomad/pg");
  assertResolves("tank/nomad/db:5b0:5d", "tank/nomad/db:5b0:5d");
  assertResolves("tank/nomad/pg@node-a", "tank/nomad/pg");
  assertThrowsCsi(
    () => resolveVolume("tank/other/pg", scope),
    Code.INVALID_ARGUMENT,
    'Volume id "tank/other/pg" must not contain "/"',
  );
  assertThrowsCsi(
    () => resolveVolume("tank/nomad/a/b", scope),
    Code.INVALID_ARGUMENT,
    'Volume id "tank/nomad/a/b" must not contain "/"',
  );
  assertThrowsCsi(
    () => resolveVolume("tank/nomad/pg@node-b", scope),
    Code.FAILED_PRECONDITION,
    /^Volume "tank\/nomad\/pg@node-b" lives on node "node-b"/,
  );
});

Deno.test("resolveSnapshot resolves volume@snapshot and volume@snapshot@node", () => {
  const table: ReadonlyArray<readonly [string, string, string, string]> = [
    // id, dataset, component, snapshot
    ["pg@snap1", "tank/nomad/pg", "snap1", "tank/nomad/pg@snap1"],
    ["pg@snap1@node-a", "tank/nomad/pg", "snap1", "tank/nomad/pg@snap1"],
    [
      "db[0]@before upgrade@node-a",
      "tank/nomad/db:5b0:5d",
      "before:20upgrade",
      "tank/nomad/db:5b0:5d@before:20upgrade",
    ],
    ["tank/nomad/pg@snap1", "tank/nomad/pg", "snap1", "tank/nomad/pg@snap1"],
  ];
  for (const [id, dataset, component, snapshot] of table) {
    assert.deepEqual(resolveSnapshot(id, scope), { id, dataset, component, snapshot }, id);
  }
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
  assertThrowsCsi(
    () => resolveSnapshot("pg@snap1@node-b", scope),
    Code.FAILED_PRECONDITION,
    /^Snapshot "pg@snap1@node-b" lives on node "node-b", but this plugin runs on node "node-a": /,
  );
});

Deno.test("resolveSnapshot refuses malformed ids with INVALID_ARGUMENT naming the id", () => {
  const form = (id: string) => `Snapshot id "${id}" is not of the form volume@snapshot@node`;
  assertInvalidEach(resolveSnapshot, [
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
  ]);
});

Deno.test("volumeIdFor qualifies a name with this node", () => {
  assert.equal(volumeIdFor("pg-data", scope), "pg-data@node-a");
  assert.equal(volumeIdFor("db[0]", scope), "db[0]@node-a");
  assert.equal(volumeIdFor("my vol", scope), "my vol@node-a");
});

Deno.test("volumeIdFor keeps the id within 128 bytes, node included", () => {
  // "@node-a" takes 7 bytes, leaving 121 for the name.
  assert.equal(volumeIdFor("x".repeat(121), scope), `${"x".repeat(121)}@node-a`);
  assertThrowsCsi(
    () => volumeIdFor("x".repeat(122), scope),
    Code.INVALID_ARGUMENT,
    `Volume name "${"x".repeat(122)}" is too long: its id "${"x".repeat(122)}@node-a" ` +
      `would exceed 128 bytes`,
  );
  // Bytes, not characters: 60 "é" are 120 bytes, 61 are 122.
  assert.equal(volumeIdFor("é".repeat(60), scope), `${"é".repeat(60)}@node-a`);
  assertThrowsCsi(
    () => volumeIdFor("é".repeat(61), scope),
    Code.INVALID_ARGUMENT,
    /^Volume name "é+" is too long: its id "é+@node-a" would exceed 128 bytes$/,
  );
});

Deno.test("volumeIdFor refuses invalid names with INVALID_ARGUMENT", () => {
  assertInvalidEach(volumeIdFor, [
    ["", "Volume name is empty"],
    ["a/b", 'Volume name "a/b" must not contain "/"'],
    ["a@b", 'Volume name "a@b" must not contain "@"'],
    ["a..b", 'Volume name "a..b" must not contain ".."'],
    ["a\u0000", 'Volume name "a\\u0000" contains control characters'],
    ["x".repeat(129), "Volume name is longer than 128 bytes"],
  ]);
});

Deno.test("volumeIdOfDataset returns the node-qualified id of a volume's dataset", () => {
  assert.equal(volumeIdOfDataset("tank/nomad/pg", scope), "pg@node-a");
  assert.equal(volumeIdOfDataset("tank/nomad/db:5b0:5d", scope), "db[0]@node-a");
  assert.equal(volumeIdOfDataset("tank/nomad/:2ehidden", scope), ".hidden@node-a");
});

Deno.test("volumeIdOfDataset returns undefined for hidden and foreign datasets", () => {
  assertNoneOf(volumeIdOfDataset, [
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
  ]);
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
  assertNoneOf(snapshotIdOf, [
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
  ]);
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

Deno.test("resolveVolume and resolveSnapshot take the shortened names CreateVolume answers with", () => {
  const hash = "0123456789abcdef";
  assertResolves(`pg-data..${hash}@node-a`, `tank/nomad/pg-data..${hash}`);
  assertResolves(`db[0]..${hash}`, `tank/nomad/db:5b0:5d..${hash}`);
  assert.equal(volumeIdFor(`pg-data..${hash}`, scope), `pg-data..${hash}@node-a`);
  assert.deepEqual(resolveSnapshot(`pg..${hash}@s..${hash}@node-a`, scope), {
    id: `pg..${hash}@s..${hash}@node-a`,
    dataset: `tank/nomad/pg..${hash}`,
    component: `s..${hash}`,
    snapshot: `tank/nomad/pg..${hash}@s..${hash}`,
  });
  assert.equal(
    snapshotIdOf(`tank/nomad/pg..${hash}@s..${hash}`, scope),
    `pg..${hash}@s..${hash}@node-a`,
  );
  assert.equal(volumeIdOfDataset(`tank/nomad/pg..${hash}`, scope), `pg..${hash}@node-a`);
});

Deno.test("resolveVolume refuses an id without a node in a mutating call, naming what to do", () => {
  for (const id of ["cache", "tank/nomad/cache"]) {
    assertThrowsCsi(
      () => resolveVolume(id, scope, { mutating: true }),
      Code.FAILED_PRECONDITION,
      new RegExp(
        `^Volume id "${id}" names no node, and this plugin \\(node "node-a"\\) changes, ` +
          `deletes or copies nothing by such an id: .* e\\.g\\. "${id}@node-a" .*` +
          `--node-local-plugin-id$`,
      ),
      id,
    );
    // Reading calls and node calls take it; so does a mutating call on a node-local plugin id.
    assertResolves(id, "tank/nomad/cache");
    assert.deepEqual(resolveVolume(id, { ...scope, nodeLocal: true }, { mutating: true }), {
      id,
      dataset: "tank/nomad/cache",
    });
  }
  assert.deepEqual(resolveVolume("cache@node-a", scope, { mutating: true }), {
    id: "cache@node-a",
    dataset: "tank/nomad/cache",
  });
  // A malformed id is still INVALID_ARGUMENT, another node's still FAILED_PRECONDITION.
  assertThrowsCsi(
    () => resolveVolume("a/b", scope, { mutating: true }),
    Code.INVALID_ARGUMENT,
    'Volume id "a/b" must not contain "/"',
  );
  assertThrowsCsi(
    () => resolveVolume("cache@node-b", scope, { mutating: true }),
    Code.FAILED_PRECONDITION,
    /lives on node "node-b"/,
  );
});

Deno.test("resolveSnapshot refuses volume@snapshot without a node in a mutating call", () => {
  assertThrowsCsi(
    () => resolveSnapshot("pg@snap1", scope, { mutating: true }),
    Code.FAILED_PRECONDITION,
    /^Snapshot id "pg@snap1" names no node, .* e\.g\. "pg@snap1@node-a" /,
  );
  assert.equal(resolveSnapshot("pg@snap1", scope).snapshot, "tank/nomad/pg@snap1");
  assert.equal(
    resolveSnapshot("pg@snap1", { ...scope, nodeLocal: true }, { mutating: true }).snapshot,
    "tank/nomad/pg@snap1",
  );
  assert.equal(
    resolveSnapshot("pg@snap1@node-a", scope, { mutating: true }).snapshot,
    "tank/nomad/pg@snap1",
  );
  // An id that cannot name a snapshot at all stays INVALID_ARGUMENT (DeleteSnapshot answers OK).
  assertThrowsCsi(
    () => resolveSnapshot("reallyfakesnapshotid", scope, { mutating: true }),
    Code.INVALID_ARGUMENT,
  );
});

Deno.test("resolveVolume takes a follow id <name>@* only where the call supports it", () => {
  assert.deepEqual(resolveVolume("pg-data@*", scope, { follow: true }), {
    id: "pg-data@*",
    dataset: "tank/nomad/pg-data",
    follow: true,
  });
  assertThrowsCsi(
    () => resolveVolume("pg-data@*", scope, { mutating: true }),
    Code.FAILED_PRECONDITION,
    /"pg-data@\*" follows its job/,
  );
  // "*" is no node: "a@b@*" is not a follow id, and stays malformed.
  assertThrowsCsi(() => resolveVolume("a@b@*", scope, { follow: true }), Code.INVALID_ARGUMENT);
  assertThrowsCsi(() => resolveVolume("@*", scope, { follow: true }), Code.INVALID_ARGUMENT);
});

Deno.test("followVolumeId appends @* and refuses names that could not come back", () => {
  assert.equal(followVolumeId("pg-data"), "pg-data@*");
  assert.equal(isFollowVolumeId(followVolumeId("db[0]")), true);
  assert.equal(isFollowVolumeId("pg-data@node-a"), false);
  assert.equal(isFollowVolumeId("pg-data"), false);
  assertThrowsCsi(() => followVolumeId("a@b"), Code.INVALID_ARGUMENT, /must not contain "@"/);
  assertThrowsCsi(() => followVolumeId("x".repeat(127)), Code.INVALID_ARGUMENT, /too long/);
});
