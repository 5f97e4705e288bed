import assert from "node:assert/strict";
import {
  checkProperty,
  createArgs,
  getArgs,
  mountArgs,
  poolHealthArgs,
  propertyArgs,
  setArgs,
} from "./args.ts";

Deno.test("argv builders return the exact argument lists", () => {
  const table: ReadonlyArray<readonly [string, () => readonly string[], readonly string[]]> = [
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
  ];
  for (const [name, build, expected] of table) {
    assert.deepEqual(build(), expected, name);
  }
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
  assert.throws(() => checkProperty("mountpoint=/etc", "x"), {
    name: "TypeError",
    message: 'Invalid ZFS property name "mountpoint=/etc"',
  });
  assert.throws(() => checkProperty("refquota", "1\n"), {
    name: "TypeError",
    message: 'Value of ZFS property "refquota" contains control characters',
  });
  assert.doesNotThrow(() => checkProperty("org.zfs-csi:managed", "yes"));
  assert.doesNotThrow(() => checkProperty("refquota", ""));
});
