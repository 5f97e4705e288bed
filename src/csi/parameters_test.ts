import assert from "node:assert/strict";
import { Code } from "../errors.ts";
import { assertThrowsCsi } from "../../tests/support/assert_errors.ts";
import {
  checkSizes,
  isKnownParameter,
  parseParameters,
  SIZE_PARAMETERS,
  sizeOf,
  ZFS_PARAMETERS,
} from "./parameters.ts";

function assertInvalid(fn: () => unknown, message: string | RegExp, label?: string): void {
  assertThrowsCsi(fn, Code.INVALID_ARGUMENT, message, label);
}

/** Asserts that parseParameters refuses `params` with INVALID_ARGUMENT and `message`. */
function assertRefused(params: Record<string, string>, message: string | RegExp, label?: string) {
  assertInvalid(() => parseParameters(params), message, label);
}

const unsupported = (key: string) =>
  `Parameter "${key}" is not supported; use ZFS properties such as ` +
  `compression, recordsize, atime, quota or a user property (module:name)`;
const notAccepted = (key: string, value: string) =>
  `Parameter ${key}="${value}" is not a value zfs accepts for ${key}`;

/** A value zfs accepts for each allowlisted property. */
const SAMPLES: Readonly<Record<string, string>> = {
  aclinherit: "passthrough",
  acltype: "posixacl",
  atime: "off",
  casesensitivity: "insensitive",
  checksum: "sha256",
  compression: "zstd-3",
  copies: "2",
  dedup: "sha256,verify",
  devices: "off",
  dnodesize: "auto",
  encryption: "aes-256-gcm",
  exec: "off",
  keyformat: "passphrase",
  keylocation: "file:///etc/zfs/keys/pg.key",
  logbias: "throughput",
  normalization: "formD",
  pbkdf2iters: "350000",
  primarycache: "metadata",
  recordsize: "1M",
  redundant_metadata: "most",
  relatime: "on",
  secondarycache: "none",
  setuid: "off",
  snapdir: "visible",
  special_small_blocks: "64K",
  sync: "disabled",
  utf8only: "on",
  xattr: "sa",
};

/** The properties zfs-fuse and older ZFS releases do not know. */
const OPENZFS_ONLY = [
  "acltype",
  "dnodesize",
  "encryption",
  "keyformat",
  "keylocation",
  "pbkdf2iters",
  "redundant_metadata",
  "relatime",
  "special_small_blocks",
];

Deno.test("ZFS_PARAMETERS is the allowlist these tests have a sample for", () => {
  assert.deepEqual(Object.keys(ZFS_PARAMETERS).sort(), Object.keys(SAMPLES).sort());
  assert.deepEqual(
    Object.keys(ZFS_PARAMETERS).filter((k) => ZFS_PARAMETERS[k]?.openzfsOnly).sort(),
    OPENZFS_ONLY,
  );
  assert.deepEqual(Object.keys(SIZE_PARAMETERS).sort(), ["quota", "refreservation"]);
});

Deno.test("parseParameters accepts every allowlisted key with a sample value", () => {
  for (const [key, value] of Object.entries(SAMPLES)) {
    // keylocation only comes with encryption, and keyformat with keylocation.
    const params: Record<string, string> = key === "keylocation"
      ? { encryption: "on", [key]: value }
      : key === "keyformat"
      ? { encryption: "on", keylocation: "file:///k", [key]: value }
      : { [key]: value };
    const p = parseParameters(params);
    assert.deepEqual(p.properties, params, key);
    assert.deepEqual(
      p.openzfsOnly,
      Object.keys(params).sort().filter((k) => OPENZFS_ONLY.includes(k)),
      key,
    );
    assert.equal(p.quota, undefined, key);
    assert.equal(p.refreservation, undefined, key);
  }
});

Deno.test("parseParameters accepts the values zfs documents", () => {
  const table: ReadonlyArray<readonly [string, readonly string[]]> = [
    ["compression", ["on", "off", "lz4", "lzjb", "gzip", "gzip-1", "gzip-9", "zle", "zstd"]],
    ["compression", ["zstd-19", "zstd-fast", "zstd-fast-1000"]],
    ["checksum", ["on", "off", "fletcher4", "sha512", "skein", "edonr", "blake3"]],
    ["dedup", ["on", "off", "verify", "sha256", "blake3,verify", "edonr,verify"]],
    ["copies", ["1", "3"]],
    ["recordsize", ["512", "4096", "128K", "128k", "1M", "16MiB", "128KB"]],
    ["special_small_blocks", ["0", "32K"]],
    ["keylocation", ["file:///run/keys/x", "https://keys.example/x", "http://10.0.0.1/k"]],
    ["xattr", ["on", "off", "sa", "dir"]],
    ["snapdir", ["hidden", "visible", "disabled"]],
    ["aclinherit", ["discard", "noallow", "restricted", "passthrough", "passthrough-x"]],
  ];
  for (const [key, values] of table) {
    for (const value of values) {
      const params = key === "keylocation" ? { encryption: "on", [key]: value } : { [key]: value };
      assert.equal(parseParameters(params).properties[key], value, `${key}=${value}`);
    }
  }
});

Deno.test("parseParameters refuses values zfs would not take, naming key and value", () => {
  const table: ReadonlyArray<readonly [string, string]> = [
    ["compression", "LZ4"],
    ["compression", "lz4 -o mountpoint=/etc"],
    ["compression", "lz4,mountpoint=/etc"],
    ["compression", "gzip-10"],
    ["compression", "brotli"],
    ["compression", " lz4"],
    ["atime", "yes"],
    ["atime", "On"],
    ["copies", "4"],
    ["copies", "0"],
    ["checksum", "md5"],
    ["dedup", "verify,sha256"],
    ["recordsize", "big"],
    ["recordsize", "128K -o mountpoint=/etc"],
    ["recordsize", "-1"],
    ["sync", "never"],
    ["encryption", "aes-512-gcm"],
    ["keyformat", "pem"],
    ["snapdir", "Visible"],
    ["xattr", "on,off"],
    ["pbkdf2iters", "many"],
    ["normalization", "NFC"],
    ["primarycache", "some"],
  ];
  for (const [key, value] of table) {
    assertRefused({ [key]: value }, notAccepted(key, value), `${key}=${value}`);
  }
});

Deno.test("parseParameters refuses keylocation=prompt: the plugin has no terminal", () => {
  for (const value of ["prompt", "file://relative/key", "file:///a,b", "ftp://host/key"]) {
    assertRefused(
      { encryption: "on", keyformat: "passphrase", keylocation: value },
      notAccepted("keylocation", value),
      value,
    );
  }
});

Deno.test("parseParameters refuses keylocation without encryption", () => {
  assertRefused(
    { keylocation: "file:///etc/zfs/keys/pg.key" },
    'Parameter "keylocation" needs "encryption"',
  );
  assertRefused(
    { keyformat: "raw", keylocation: "file:///etc/zfs/keys/pg.key" },
    'Parameter "keylocation" needs "encryption"',
  );
  assert.deepEqual(
    parseParameters({
      encryption: "aes-256-gcm",
      keyformat: "raw",
      keylocation: "file:///etc/zfs/keys/pg.key",
    }).properties,
    { encryption: "aes-256-gcm", keyformat: "raw", keylocation: "file:///etc/zfs/keys/pg.key" },
  );
});

Deno.test("parseParameters refuses keys outside the allowlist with INVALID_ARGUMENT naming them", () => {
  const keys = [
    "mountpoint",
    "sharenfs",
    "sharesmb",
    "canmount",
    "readonly",
    "refquota",
    "reservation",
    "volsize",
    "zoned",
    "quotas",
    "Quota",
    "quota ",
    "refreserv",
    "compresion",
    "Compression",
    "compression=lz4",
    "-o",
    "",
    "org.zfs-csi:managed",
    "org.zfs-csi:parameters",
    "org.zfs-csi:source",
    "org.zfs-csi:anything",
    "Com.Example:x",
    "com.example:X",
    "com.example:",
    ":x",
    "com.example:x y",
    "com.example:x=y",
    "userquota@nobody",
  ];
  for (const key of keys) {
    assertRefused({ [key]: "on" }, unsupported(key), JSON.stringify(key));
    assert.equal(isKnownParameter(key), false, JSON.stringify(key));
  }
  // One bad key among good ones is enough.
  assertRefused(
    { atime: "off", mountpoint: "/etc", compression: "lz4" },
    unsupported("mountpoint"),
  );
});

Deno.test("parseParameters passes user properties of other modules through", () => {
  const p = parseParameters({
    "com.example:owner": "team a",
    "com.example:a.b+c-d_e:f": "x",
    "org.zfs-csi.other:x": "y",
  });
  assert.deepEqual(p.properties, {
    "com.example:a.b+c-d_e:f": "x",
    "com.example:owner": "team a",
    "org.zfs-csi.other:x": "y",
  });
  assert.deepEqual(p.openzfsOnly, []);
  // A user property's value is one argv element, however it looks.
  assert.equal(
    parseParameters({ "com.example:note": "lz4 -o mountpoint=/etc" }).properties[
      "com.example:note"
    ],
    "lz4 -o mountpoint=/etc",
  );
  for (const key of ["com.example:owner", "a:b", "quota", "refreservation", "compression"]) {
    assert.equal(isKnownParameter(key), true, key);
  }
});

Deno.test("parseParameters refuses empty values and values over 1024 bytes", () => {
  const message = (key: string) => `Parameter "${key}" must have a value of 1 to 1024 bytes`;
  assertRefused({ atime: "" }, message("atime"));
  assertRefused({ "com.example:x": "" }, message("com.example:x"));
  assertRefused({ "com.example:x": "v".repeat(1025) }, message("com.example:x"));
  // 513 two-byte characters are 1026 bytes.
  assertRefused({ "com.example:x": "é".repeat(513) }, message("com.example:x"));
  assertRefused({ quota: "1".repeat(1025) }, message("quota"));
  assert.equal(
    parseParameters({ "com.example:x": "v".repeat(1024) }).properties["com.example:x"],
    "v".repeat(1024),
  );
  assert.equal(
    parseParameters({ "com.example:x": "é".repeat(512) }).properties["com.example:x"],
    "é".repeat(512),
  );
});

Deno.test("parseParameters refuses values with control characters", () => {
  const table: ReadonlyArray<readonly [string, string]> = [
    ["atime", "on\n"],
    ["compression", "lz4\nmountpoint=/etc"],
    ["com.example:x", "a\tb"],
    ["com.example:x", "a\u0000"],
    ["com.example:x", "a\u007f"],
    ["quota", "1G\r"],
  ];
  for (const [key, value] of table) {
    assertRefused(
      { [key]: value },
      `Parameter "${key}": Value of ZFS property "${key}" contains control characters`,
      JSON.stringify(value),
    );
  }
});

Deno.test("parseParameters lists the OpenZFS-only properties in key order", () => {
  const p = parseParameters({
    relatime: "on",
    compression: "lz4",
    acltype: "posixacl",
    dnodesize: "auto",
    "com.example:x": "y",
  });
  assert.deepEqual(p.openzfsOnly, ["acltype", "dnodesize", "relatime"]);
  assert.deepEqual(parseParameters({ compression: "lz4", atime: "off" }).openzfsOnly, []);
});

Deno.test("parseParameters gives the same canonical form whatever the key order", () => {
  const a = parseParameters({ quota: "capacity", compression: "lz4", atime: "off" });
  const b = parseParameters({ atime: "off", quota: "capacity", compression: "lz4" });
  const c = parseParameters({ compression: "lz4", atime: "off", quota: "capacity" });
  const expected = '{"atime":"off","compression":"lz4","quota":"capacity"}';
  assert.equal(a.canonical, expected);
  assert.equal(b.canonical, expected);
  assert.equal(c.canonical, expected);
  assert.notEqual(parseParameters({ atime: "on", compression: "lz4" }).canonical, expected);
  assert.equal(
    parseParameters({ "com.example:b": "2", "com.example:a": "1", refreservation: "1G" })
      .canonical,
    '{"com.example:a":"1","com.example:b":"2","refreservation":"1G"}',
  );
});

Deno.test("parseParameters of no parameters is empty", () => {
  const empty = { properties: {}, openzfsOnly: [], canonical: "{}" };
  assert.deepEqual(parseParameters({}), empty);
  assert.deepEqual(parseParameters(null), empty);
  assert.deepEqual(parseParameters(undefined), empty);
});

Deno.test("parseParameters reads quota and refreservation as capacity or bytes", () => {
  const table: ReadonlyArray<readonly [string, unknown]> = [
    ["capacity", { kind: "capacity" }],
    ["20GiB", { kind: "bytes", bytes: 20 * 1024 ** 3 }],
    ["20G", { kind: "bytes", bytes: 20 * 1024 ** 3 }],
    ["20GB", { kind: "bytes", bytes: 20 * 1000 ** 3 }],
    ["1073741824", { kind: "bytes", bytes: 1073741824 }],
    ["1.5K", { kind: "bytes", bytes: 1536 }],
  ];
  for (const [value, setting] of table) {
    const q = parseParameters({ quota: value });
    assert.deepEqual(q.quota, setting, `quota=${value}`);
    assert.equal(q.refreservation, undefined);
    // Size parameters are the plugin's to set, never passed through as they are.
    assert.deepEqual(q.properties, {});
    assert.equal(q.canonical, JSON.stringify({ quota: value }));
    const r = parseParameters({ refreservation: value });
    assert.deepEqual(r.refreservation, setting, `refreservation=${value}`);
    assert.equal(r.quota, undefined);
    assert.deepEqual(r.properties, {});
  }
  const both = parseParameters({ quota: "capacity", refreservation: "1G", atime: "off" });
  assert.deepEqual(both.quota, { kind: "capacity" });
  assert.deepEqual(both.refreservation, { kind: "bytes", bytes: 1024 ** 3 });
  assert.deepEqual(both.properties, { atime: "off" });
});

Deno.test("parseParameters refuses quota and refreservation that are no size", () => {
  for (const key of ["quota", "refreservation"]) {
    for (const value of ["none", "0", "-1", "lots", "Capacity", "capacity ", "1X", "1G 2G"]) {
      assertRefused(
        { [key]: value },
        `Parameter ${key}="${value}" must be a size such as 20GiB, or "capacity"`,
        `${key}=${value}`,
      );
    }
  }
});

Deno.test("sizeOf is the capacity or the fixed bytes", () => {
  assert.equal(sizeOf({ kind: "capacity" }, 5000), 5000);
  assert.equal(sizeOf({ kind: "capacity" }, 0), 0);
  assert.equal(sizeOf({ kind: "bytes", bytes: 1234 }, 5000), 1234);
  assert.equal(sizeOf({ kind: "bytes", bytes: 1234 }, 0), 1234);
});

Deno.test("checkSizes accepts quota at or above and refreservation at or below the capacity", () => {
  const G = 1024 ** 3;
  const ok: ReadonlyArray<readonly [Record<string, string>, number]> = [
    [{}, G],
    [{}, 0],
    [{ quota: "capacity" }, G],
    [{ quota: "1G" }, G],
    [{ quota: "2G" }, G],
    // No capacity means unlimited: any quota will do.
    [{ quota: "1K" }, 0],
    [{ quota: "capacity" }, 0],
    [{ refreservation: "capacity" }, G],
    [{ refreservation: "1G" }, G],
    [{ refreservation: "1K" }, G],
    [{ refreservation: "5G" }, 0],
    [{ quota: "capacity", refreservation: "capacity" }, G],
  ];
  for (const [params, capacity] of ok) {
    assert.doesNotThrow(
      () => checkSizes(parseParameters(params), capacity),
      `${JSON.stringify(params)} at ${capacity}`,
    );
  }
});

Deno.test("checkSizes refuses quota below and refreservation above the capacity", () => {
  const G = 1024 ** 3;
  const below = (bytes: number) =>
    `Parameter quota is below the volume's capacity of ${bytes} bytes`;
  const above = (bytes: number) =>
    `Parameter refreservation is above the volume's capacity of ${bytes} bytes`;
  const refused: ReadonlyArray<readonly [Record<string, string>, number, string]> = [
    [{ quota: "1G" }, 2 * G, below(2147483648)],
    [{ quota: "1073741823" }, G, below(1073741824)],
    [{ refreservation: "2G" }, G, above(1073741824)],
    [{ refreservation: "1073741825" }, G, above(1073741824)],
    [{ refreservation: "capacity" }, 0, 'Parameter refreservation="capacity" needs a capacity'],
  ];
  for (const [params, capacity, message] of refused) {
    assertInvalid(
      () => checkSizes(parseParameters(params), capacity),
      message,
      `${JSON.stringify(params)} at ${capacity}`,
    );
  }
});

Deno.test("parseParameters refuses names of Object.prototype members as unknown parameters", () => {
  for (const key of ["constructor", "toString", "valueOf", "hasOwnProperty"]) {
    assert.equal(isKnownParameter(key), false, key);
    assertRefused({ [key]: "x" }, new RegExp(`^Parameter "${key}" is not supported`), key);
  }
});

Deno.test("parseParameters refuses a keyformat without a keylocation: zfs would prompt", () => {
  assertRefused(
    { encryption: "on", keyformat: "passphrase" },
    'Parameter "keyformat" needs "keylocation" (file:///path or https://...): ' +
      "the plugin cannot prompt for a key",
  );
  // Without a keyformat, a child of an encrypted parent inherits its key: zfs decides.
  assert.deepEqual(parseParameters({ encryption: "on" }).properties, { encryption: "on" });
  assert.deepEqual(
    parseParameters({ encryption: "on", keyformat: "hex", keylocation: "file:///k" }).properties,
    { encryption: "on", keyformat: "hex", keylocation: "file:///k" },
  );
});
