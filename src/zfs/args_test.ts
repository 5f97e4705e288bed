import assert from "node:assert/strict";
import {
  checkProperty,
  cloneArgs,
  createArgs,
  destroyArgs,
  getArgs,
  getTreeArgs,
  loadKeyArgs,
  mountArgs,
  poolHealthArgs,
  propertyArgs,
  renameArgs,
  setArgs,
  setManyArgs,
  snapshotArgs,
  unmountArgs,
} from "./args.ts";

/** A named call of an argv builder and the argument list it must return. */
type BuilderCase = readonly [
  name: string,
  build: () => readonly string[],
  expected: readonly string[],
];

/** Asserts that `fn` throws a TypeError saying exactly `message`. */
function assertTypeError(fn: () => unknown, message: string): void {
  assert.throws(fn, { name: "TypeError", message });
}

/** Asserts that each builder call returns exactly its expected argument list. */
function assertBuilds(cases: readonly BuilderCase[]): void {
  for (const [name, build, expected] of cases) assert.deepEqual(build(), expected, name);
}

Deno.test("argv builders return the exact argument lists", () => {
  assertBuilds([
    [
      "getArgs of one dataset",
      () => getArgs(["tank/nomad"], ["type", "mounted"]),
      ["get", "-Hp", "-o", "name,property,value,source", "type,mounted", "tank/nomad"],
    ],
    [
      "getArgs of two datasets and a user property",
      () => getArgs(["tank/nomad/a", "tank/nomad/b"], ["refquota", "org.zfs-csi:managed"]),
      [
        "get",
        "-Hp",
        "-o",
        "name,property,value,source",
        "refquota,org.zfs-csi:managed",
        "tank/nomad/a",
        "tank/nomad/b",
      ],
    ],
    ["createArgs without properties", () => createArgs("tank/nomad/v"), [
      "create",
      "tank/nomad/v",
    ]],
    [
      "createArgs with properties",
      () => createArgs("tank/nomad/v", { refquota: "1073741824", "org.zfs-csi:managed": "yes" }),
      [
        "create",
        "-o",
        "org.zfs-csi:managed=yes",
        "-o",
        "refquota=1073741824",
        "tank/nomad/v",
      ],
    ],
    [
      "setArgs",
      () => setArgs("tank/nomad/v", "refquota", "2147483648"),
      ["set", "refquota=2147483648", "tank/nomad/v"],
    ],
    ["mountArgs", () => mountArgs("tank/nomad/v"), ["mount", "tank/nomad/v"]],
    ["poolHealthArgs", () => poolHealthArgs("tank"), ["list", "-H", "-o", "name,health", "tank"]],
    ["propertyArgs of nothing", () => propertyArgs({}), []],
  ]);
});

Deno.test("propertyArgs sorts properties by name whatever the input order", () => {
  const expected = [
    "-o",
    "atime=off",
    "-o",
    "compression=lz4",
    "-o",
    "org.zfs-csi:managed=yes",
    "-o",
    "refquota=10",
  ];
  assert.deepEqual(
    propertyArgs({
      refquota: "10",
      compression: "lz4",
      "org.zfs-csi:managed": "yes",
      atime: "off",
    }),
    expected,
  );
  assert.deepEqual(
    propertyArgs({
      atime: "off",
      "org.zfs-csi:managed": "yes",
      refquota: "10",
      compression: "lz4",
    }),
    expected,
  );
});

Deno.test("propertyArgs keeps each name=value pair in one argument", () => {
  assert.deepEqual(propertyArgs({ "org.zfs-csi:note": "a b=c,d -o x" }), [
    "-o",
    "org.zfs-csi:note=a b=c,d -o x",
  ]);
});

Deno.test("property builders reject injected names and values with a TypeError", () => {
  const attempts: ReadonlyArray<readonly [string, () => unknown]> = [
    ["name with =", () => createArgs("tank/v", { "mountpoint=/etc": "x" })],
    ["name with space", () => createArgs("tank/v", { "refquota -o mountpoint": "1" })],
    ["name starting with -", () => createArgs("tank/v", { "-o": "x" })],
    ["upper-case name", () => createArgs("tank/v", { Refquota: "1" })],
    ["empty name", () => createArgs("tank/v", { "": "1" })],
    ["value with newline", () => createArgs("tank/v", { refquota: "1\nmountpoint=/etc" })],
    ["value with NUL", () => createArgs("tank/v", { refquota: "1\u0000" })],
    ["value with DEL", () => createArgs("tank/v", { refquota: "1\u007f" })],
    ["set name with =", () => setArgs("tank/v", "mountpoint=/etc", "x")],
    ["set value with newline", () => setArgs("tank/v", "refquota", "1\n")],
    ["set value with tab", () => setArgs("tank/v", "refquota", "1\t2")],
    ["get property with =", () => getArgs(["tank/v"], ["mountpoint=/etc"])],
    ["get property list smuggled in one entry", () => getArgs(["tank/v"], ["type,all"])],
  ];
  for (const [name, attempt] of attempts) {
    assert.throws(attempt, TypeError, name);
  }
});

Deno.test("checkProperty names the offending property", () => {
  assertTypeError(
    () => checkProperty("mountpoint=/etc", "x"),
    'Invalid ZFS property name "mountpoint=/etc"',
  );
  assertTypeError(
    () => checkProperty("refquota", "1\n"),
    'Value of ZFS property "refquota" contains control characters',
  );
  assert.doesNotThrow(() => checkProperty("org.zfs-csi:managed", "yes"));
  assert.doesNotThrow(() => checkProperty("refquota", ""));
});

Deno.test("argv builders of the controller return the exact argument lists", () => {
  assertBuilds([
    [
      "getTreeArgs of depth 2",
      () => getTreeArgs("tank/nomad", 2, ["type", "creation", "org.zfs-csi:managed"]),
      [
        "get",
        "-Hp",
        "-r",
        "-d",
        "2",
        "-o",
        "name,property,value,source",
        "type,creation,org.zfs-csi:managed",
        "tank/nomad",
      ],
    ],
    [
      "getTreeArgs of depth 1",
      () => getTreeArgs("tank/nomad/v", 1, ["type"]),
      ["get", "-Hp", "-r", "-d", "1", "-o", "name,property,value,source", "type", "tank/nomad/v"],
    ],
    ["snapshotArgs", () => snapshotArgs("tank/nomad/v@s1"), ["snapshot", "tank/nomad/v@s1"]],
    [
      "cloneArgs without properties",
      () => cloneArgs("tank/nomad/v@s1", "tank/nomad/w"),
      ["clone", "tank/nomad/v@s1", "tank/nomad/w"],
    ],
    [
      "cloneArgs with properties, sorted",
      () =>
        cloneArgs("tank/nomad/v@s1", "tank/nomad/w", {
          refquota: "1048576",
          "org.zfs-csi:source": "snapshot:v@s1@node-a",
          compression: "lz4",
        }),
      [
        "clone",
        "-o",
        "compression=lz4",
        "-o",
        "org.zfs-csi:source=snapshot:v@s1@node-a",
        "-o",
        "refquota=1048576",
        "tank/nomad/v@s1",
        "tank/nomad/w",
      ],
    ],
    ["destroyArgs", () => destroyArgs("tank/nomad/v"), ["destroy", "tank/nomad/v"]],
    [
      "destroyArgs of a snapshot",
      () => destroyArgs("tank/nomad/v@s1"),
      ["destroy", "tank/nomad/v@s1"],
    ],
    [
      "destroyArgs recursive",
      () => destroyArgs("tank/nomad/v", { recursive: true }),
      ["destroy", "-r", "tank/nomad/v"],
    ],
    [
      "destroyArgs deferred",
      () => destroyArgs("tank/nomad/v@s1", { deferred: true }),
      ["destroy", "-d", "tank/nomad/v@s1"],
    ],
    [
      "destroyArgs recursive and deferred",
      () => destroyArgs("tank/nomad/v@s1", { recursive: true, deferred: true }),
      ["destroy", "-r", "-d", "tank/nomad/v@s1"],
    ],
    [
      "destroyArgs with both options off",
      () => destroyArgs("tank/nomad/v", { recursive: false, deferred: false }),
      ["destroy", "tank/nomad/v"],
    ],
    [
      "renameArgs of a dataset",
      () => renameArgs("tank/nomad/v", "tank/nomad/.deleted-1700000000-v"),
      ["rename", "tank/nomad/v", "tank/nomad/.deleted-1700000000-v"],
    ],
    [
      "renameArgs of a snapshot",
      () => renameArgs("tank/nomad/v@s1", "tank/nomad/v@.deleted-1700000000-s1"),
      ["rename", "tank/nomad/v@s1", "tank/nomad/v@.deleted-1700000000-s1"],
    ],
    ["unmountArgs", () => unmountArgs("tank/nomad/v"), ["unmount", "tank/nomad/v"]],
    ["loadKeyArgs", () => loadKeyArgs("tank/nomad/v"), ["load-key", "tank/nomad/v"]],
  ]);
});

Deno.test("getTreeArgs refuses depths below 1 and non-integers with a RangeError", () => {
  for (const depth of [0, -1, 1.5, Number.NaN, Number.POSITIVE_INFINITY]) {
    assert.throws(() => getTreeArgs("tank/nomad", depth, ["type"]), {
      name: "RangeError",
      message: `Invalid depth ${depth}`,
    });
  }
});

Deno.test("getTreeArgs refuses injected property names with a TypeError", () => {
  for (const prop of ["type,all", "mountpoint=/etc", "-r", "Type", ""]) {
    assert.throws(() => getTreeArgs("tank/nomad", 1, [prop]), TypeError, prop);
  }
});

Deno.test("snapshotArgs and cloneArgs refuse a name that is no snapshot", () => {
  assertTypeError(() => snapshotArgs("tank/nomad/v"), '"tank/nomad/v" is not a snapshot name');
  assertTypeError(
    () => cloneArgs("tank/nomad/v", "tank/nomad/w"),
    '"tank/nomad/v" is not a snapshot name',
  );
  assert.throws(
    () => cloneArgs("tank/nomad/v@s", "tank/nomad/w", { "mountpoint=/etc": "x" }),
    TypeError,
  );
  assert.throws(() => cloneArgs("tank/nomad/v@s", "tank/nomad/w", { refquota: "1\n" }), TypeError);
});

Deno.test("destroyArgs refuses a deferred destroy of a filesystem", () => {
  for (const opts of [{ deferred: true }, { deferred: true, recursive: true }]) {
    assertTypeError(
      () => destroyArgs("tank/nomad/v", opts),
      'Deferred destroy applies to snapshots, not "tank/nomad/v"',
    );
  }
});

Deno.test("renameArgs refuses renaming between a snapshot and a dataset", () => {
  assertTypeError(
    () => renameArgs("tank/nomad/v@s1", "tank/nomad/w"),
    'Cannot rename "tank/nomad/v@s1" to "tank/nomad/w": both or neither must be snapshots',
  );
  assertTypeError(
    () => renameArgs("tank/nomad/v", "tank/nomad/v@s1"),
    'Cannot rename "tank/nomad/v" to "tank/nomad/v@s1": both or neither must be snapshots',
  );
});

Deno.test("setManyArgs sets several properties in one call, in the order given", () => {
  assertBuilds([
    [
      "one property",
      () => setManyArgs("tank/nomad/v", [["refquota", "1073741824"]]),
      ["set", "refquota=1073741824", "tank/nomad/v"],
    ],
    [
      "several, order kept (not sorted)",
      () =>
        setManyArgs("tank/nomad/v", [
          ["quota", "2147483648"],
          ["refquota", "1073741824"],
          ["refreservation", "none"],
        ]),
      ["set", "quota=2147483648", "refquota=1073741824", "refreservation=none", "tank/nomad/v"],
    ],
    [
      "a value with a space stays one argument",
      () => setManyArgs("tank/nomad/v", [["org.zfs-csi:note", "a b"], ["atime", "off"]]),
      ["set", "org.zfs-csi:note=a b", "atime=off", "tank/nomad/v"],
    ],
  ]);
});

Deno.test("setManyArgs refuses nothing to set, a property twice, and injected names", () => {
  assert.throws(() => setManyArgs("t/v", []), {
    name: "RangeError",
    message: 'No properties to set on "t/v"',
  });
  assert.throws(() => setManyArgs("t/v", [["quota", "1"], ["quota", "2"]]), {
    name: "RangeError",
    message: 'Property "quota" is set twice',
  });
  assertTypeError(
    () => setManyArgs("t/v", [["quota", "1"], ["-o", "x"]]),
    'Invalid ZFS property name "-o"',
  );
  assertTypeError(
    () => setManyArgs("t/v", [["quota", "1\nx"]]),
    'Value of ZFS property "quota" contains control characters',
  );
});
