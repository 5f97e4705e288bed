import assert from "node:assert/strict";
import { Code } from "../errors.ts";
import { assertThrowsCsi } from "../../tests/support/assert_errors.ts";
import {
  checkSizes,
  DEFAULT_DENIED_MODULES,
  DEFAULT_LIMITS,
  DEFAULT_PARAMETER_POLICY,
  isKeyFileBelow,
  isKnownParameter,
  MAX_DEFAULT_PBKDF2_ITERS,
  type ParameterPolicy,
  parametersRefusal,
  parseParameters,
  resolveParameterPolicy,
  SIZE_PARAMETERS,
  sizeOf,
  UNRESTRICTED_POLICY,
  ZFS_PARAMETERS,
} from "./parameters.ts";

/** The form checks alone: every parameter and value zfs accepts is let through. */
function parse(params: Readonly<Record<string, string>> | null | undefined) {
  return parseParameters(params, UNRESTRICTED_POLICY);
}

function assertInvalid(fn: () => unknown, message: string | RegExp, label?: string): void {
  assertThrowsCsi(fn, Code.INVALID_ARGUMENT, message, label);
}

/** Asserts that parseParameters refuses `params` with INVALID_ARGUMENT and `message`. */
function assertRefused(params: Record<string, string>, message: string | RegExp, label?: string) {
  assertInvalid(() => parse(params), message, label);
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
    const p = parse(params);
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
      assert.equal(parse(params).properties[key], value, `${key}=${value}`);
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
    parse({
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
  const p = parse({
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
    parse({ "com.example:note": "lz4 -o mountpoint=/etc" }).properties[
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
    parse({ "com.example:x": "v".repeat(1024) }).properties["com.example:x"],
    "v".repeat(1024),
  );
  assert.equal(
    parse({ "com.example:x": "é".repeat(512) }).properties["com.example:x"],
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
  const p = parse({
    relatime: "on",
    compression: "lz4",
    acltype: "posixacl",
    dnodesize: "auto",
    "com.example:x": "y",
  });
  assert.deepEqual(p.openzfsOnly, ["acltype", "dnodesize", "relatime"]);
  assert.deepEqual(parse({ compression: "lz4", atime: "off" }).openzfsOnly, []);
});

Deno.test("parseParameters gives the same canonical form whatever the key order", () => {
  const a = parse({ quota: "capacity", compression: "lz4", atime: "off" });
  const b = parse({ atime: "off", quota: "capacity", compression: "lz4" });
  const c = parse({ compression: "lz4", atime: "off", quota: "capacity" });
  const expected = '{"atime":"off","compression":"lz4","quota":"capacity"}';
  assert.equal(a.canonical, expected);
  assert.equal(b.canonical, expected);
  assert.equal(c.canonical, expected);
  assert.notEqual(parse({ atime: "on", compression: "lz4" }).canonical, expected);
  assert.equal(
    parse({ "com.example:b": "2", "com.example:a": "1", refreservation: "1G" })
      .canonical,
    '{"com.example:a":"1","com.example:b":"2","refreservation":"1G"}',
  );
});

Deno.test("parseParameters of no parameters is empty", () => {
  const empty = { properties: {}, openzfsOnly: [], canonical: "{}" };
  assert.deepEqual(parse({}), empty);
  assert.deepEqual(parse(null), empty);
  assert.deepEqual(parse(undefined), empty);
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
    const q = parse({ quota: value });
    assert.deepEqual(q.quota, setting, `quota=${value}`);
    assert.equal(q.refreservation, undefined);
    // Size parameters are the plugin's to set, never passed through as they are.
    assert.deepEqual(q.properties, {});
    assert.equal(q.canonical, JSON.stringify({ quota: value }));
    const r = parse({ refreservation: value });
    assert.deepEqual(r.refreservation, setting, `refreservation=${value}`);
    assert.equal(r.quota, undefined);
    assert.deepEqual(r.properties, {});
  }
  const both = parse({ quota: "capacity", refreservation: "1G", atime: "off" });
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
      () => checkSizes(parse(params), capacity),
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
      () => checkSizes(parse(params), capacity),
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
  assert.deepEqual(parse({ encryption: "on" }).properties, { encryption: "on" });
  assert.deepEqual(
    parse({ encryption: "on", keyformat: "hex", keylocation: "file:///k" }).properties,
    { encryption: "on", keyformat: "hex", keylocation: "file:///k" },
  );
});

// ---------------------------------------------------------------------------------------------
// The operator's policy

/** A policy from flags, as parseConfig resolves it. */
function policy(
  flags: { allow?: string[]; deny?: string[]; keyDir?: string } = {},
): ParameterPolicy {
  return resolveParameterPolicy({ allow: flags.allow ?? [], deny: flags.deny ?? [], ...flags });
}

/** Asserts that `params` are refused under `p`, with `message`. */
function assertPolicyRefuses(
  p: ParameterPolicy,
  params: Record<string, string>,
  message: string | RegExp,
  label?: string,
): void {
  assertInvalid(() => parseParameters(params, p), message, label ?? JSON.stringify(params));
}

/** Asserts that `params` are accepted under `p`, with the properties they ask for. */
function assertPolicyAccepts(p: ParameterPolicy, params: Record<string, string>): void {
  const got = parseParameters(params, p);
  const sizes = Object.keys(SIZE_PARAMETERS);
  assert.deepEqual(
    got.properties,
    Object.fromEntries(Object.entries(params).filter(([k]) => !sizes.includes(k))),
    JSON.stringify(params),
  );
}

const byDefault = (key: string, value: string, accepted: string, why: string) =>
  `Parameter ${key}="${value}" is not allowed on this node: ${accepted} by default, as ${why}; ` +
  `the operator can allow it with --allow-parameter ${key}=${value}`;

Deno.test("DEFAULT_LIMITS and DEFAULT_DENIED_MODULES are the defaults docs/parameters.md lists", () => {
  assert.deepEqual(Object.keys(DEFAULT_LIMITS).sort(), [
    "dedup",
    "devices",
    "exec",
    "pbkdf2iters",
    "setuid",
    "snapdir",
    "special_small_blocks",
  ]);
  assert.deepEqual(Object.keys(DEFAULT_DENIED_MODULES).sort(), [
    "com.sun",
    "com.ubuntu.zsys",
    "org.openzfs.systemd",
    "org.zfsbootmenu",
  ]);
  for (const key of Object.keys(DEFAULT_LIMITS)) assert.ok(isKnownParameter(key), key);
  assert.deepEqual(DEFAULT_PARAMETER_POLICY, { rules: {}, keyDir: undefined });
  assert.deepEqual(policy(), DEFAULT_PARAMETER_POLICY);
});

Deno.test("parseParameters by default accepts setuid, devices and exec only as off", () => {
  const p = DEFAULT_PARAMETER_POLICY;
  assertPolicyAccepts(p, { setuid: "off", devices: "off", exec: "off" });
  assertPolicyRefuses(
    p,
    { setuid: "on" },
    'Parameter setuid="on" is not allowed on this node: only "off" by default, as on would ' +
      "let setuid programs and file capabilities written in a container run for host users " +
      "from the dataset's own mount, even where the parent turned it off; the operator can " +
      "allow it with --allow-parameter setuid=on",
  );
  for (const key of ["devices", "exec"]) {
    assertPolicyRefuses(
      p,
      { [key]: "on" },
      byDefault(key, "on", 'only "off"', DEFAULT_LIMITS[key]!.why),
    );
  }
  // One refused value among accepted ones is enough.
  assertPolicyRefuses(p, { compression: "lz4", exec: "on", atime: "off" }, /exec="on"/);
});

Deno.test("parseParameters by default refuses dedup, special blocks, a visible snapdir and huge pbkdf2iters", () => {
  const p = DEFAULT_PARAMETER_POLICY;
  assertPolicyAccepts(p, { dedup: "off" });
  for (const value of ["on", "verify", "sha256", "blake3,verify"]) {
    assertPolicyRefuses(
      p,
      { dedup: value },
      byDefault(
        "dedup",
        value,
        'only "off"',
        "the dedup table costs memory and I/O of the whole pool",
      ),
    );
  }
  assertPolicyAccepts(p, { special_small_blocks: "0" });
  assertPolicyRefuses(p, { special_small_blocks: "32K" }, /special_small_blocks="32K" .*only "0"/);
  assertPolicyAccepts(p, { snapdir: "hidden" });
  assertPolicyAccepts(p, { snapdir: "disabled" });
  assertPolicyRefuses(
    p,
    { snapdir: "visible" },
    byDefault("snapdir", "visible", '"hidden" or "disabled"', DEFAULT_LIMITS.snapdir!.why),
  );
  assertPolicyAccepts(p, { pbkdf2iters: String(MAX_DEFAULT_PBKDF2_ITERS) });
  assertPolicyAccepts(p, { pbkdf2iters: "350000" });
  assertPolicyRefuses(
    p,
    { pbkdf2iters: String(MAX_DEFAULT_PBKDF2_ITERS + 1) },
    /pbkdf2iters="10000001" is not allowed on this node: at most 10000000 by default/,
  );
});

Deno.test("parseParameters by default accepts every other allowlisted parameter as zfs does", () => {
  const p = DEFAULT_PARAMETER_POLICY;
  for (const [key, value] of Object.entries(SAMPLES)) {
    if (Object.hasOwn(DEFAULT_LIMITS, key) || key === "keylocation" || key === "keyformat") {
      continue;
    }
    assertPolicyAccepts(p, { [key]: value });
  }
  for (const value of ["off", "noparity", "sha256"]) assertPolicyAccepts(p, { checksum: value });
  for (const value of ["disabled", "always"]) assertPolicyAccepts(p, { sync: value });
  assertPolicyAccepts(p, { copies: "3", quota: "capacity", refreservation: "capacity" });
  assertPolicyAccepts(p, { encryption: "on" });
  assertPolicyAccepts(p, { "com.example:owner": "team a", "com.sunny:x": "y" });
});

Deno.test("parseParameters by default refuses user properties that tools on the host act on", () => {
  const p = DEFAULT_PARAMETER_POLICY;
  assertPolicyRefuses(
    p,
    { "com.sun:auto-snapshot": "true" },
    'Parameter com.sun:auto-snapshot="true" is not allowed on this node: user properties of ' +
      "com.sun are refused by default, as zfs-auto-snapshot takes and keeps snapshots of " +
      "datasets that set com.sun:auto-snapshot, at the pool's cost; the operator can allow it " +
      "with --allow-parameter com.sun:auto-snapshot=true",
  );
  for (
    const key of [
      "com.sun:auto-snapshot:frequent",
      "org.openzfs.systemd:requires",
      "org.openzfs.systemd:wanted-by",
      "com.ubuntu.zsys:bootfs",
      "org.zfsbootmenu:commandline",
    ]
  ) {
    assertPolicyRefuses(p, { [key]: "x" }, new RegExp(`^Parameter ${key}="x" is not allowed`));
  }
});

Deno.test("parseParameters by default refuses every key location: no --key-dir was given", () => {
  const p = DEFAULT_PARAMETER_POLICY;
  for (
    const value of ["file:///etc/zfs/keys/pg.key", "file:///etc/shadow", "https://k.example/1"]
  ) {
    assertPolicyRefuses(
      p,
      { encryption: "on", keyformat: "hex", keylocation: value },
      `Parameter keylocation="${value}" is not allowed on this node: key locations are ` +
        "refused unless the operator gives --key-dir DIR (files below DIR); the operator " +
        `can allow it with --allow-parameter keylocation=${value}`,
    );
  }
  // Without a key location a child of an encrypted parent inherits its key: nothing to police.
  assertPolicyAccepts(p, { encryption: "on" });
});

Deno.test("parseParameters with --key-dir accepts only files strictly below it", () => {
  const p = policy({ keyDir: "/etc/zfs/keys" });
  const withKey = (keylocation: string) => ({ encryption: "on", keyformat: "raw", keylocation });
  for (
    const ok of [
      "file:///etc/zfs/keys/pg.key",
      "file:///etc/zfs/keys/team/a b.key",
      "file:////etc//zfs/keys//pg.key",
      "file:///etc/zfs/keys/..key",
    ]
  ) {
    assertPolicyAccepts(p, withKey(ok));
  }
  for (
    const bad of [
      "file:///etc/zfs/keys",
      "file:///etc/zfs/keys/",
      "file:///etc/zfs/keys/sub/",
      "file:///etc/zfs/keys/../../shadow",
      "file:///etc/zfs/keys/a/../b",
      "file:///etc/zfs/keys/./a",
      "file:///etc/zfs/keys/%2e%2e/shadow",
      "file:///etc/zfs/keysX/a",
      "file:///etc/zfs/key",
      "file:///etc/shadow",
      "https://keys.example/pg.key",
      "http://169.254.169.254/latest/meta-data",
    ]
  ) {
    assertPolicyRefuses(
      p,
      withKey(bad),
      `Parameter keylocation="${bad}" is not allowed on this node: key locations must be ` +
        `files below --key-dir "/etc/zfs/keys"; the operator can allow it with ` +
        `--allow-parameter keylocation=${bad}`,
      bad,
    );
  }
});

Deno.test("isKeyFileBelow reads only file URIs and never a path that climbs", () => {
  assert.equal(isKeyFileBelow("file:///k/a", "/k"), true);
  assert.equal(isKeyFileBelow("file:///k/a/b/c", "/k"), true);
  assert.equal(isKeyFileBelow("file:///k", "/k"), false);
  assert.equal(isKeyFileBelow("file:///k/a/..", "/k"), false);
  assert.equal(isKeyFileBelow("file://k/a", "/k"), false);
  assert.equal(isKeyFileBelow("/k/a", "/k"), false);
  assert.equal(isKeyFileBelow("prompt", "/k"), false);
  // A key dir given with a trailing slash matches nothing: it fails closed.
  assert.equal(isKeyFileBelow("file:///k/a", "/k/"), false);
});

Deno.test("parseParameters with --allow-parameter replaces the default limit of that name", () => {
  const p = policy({ allow: ["setuid=on", "dedup=on|verify", "snapdir=*"] });
  assertPolicyAccepts(p, { setuid: "on", dedup: "verify", snapdir: "visible" });
  // The operator's list replaces the default: "off" is no longer in it.
  assertPolicyRefuses(
    p,
    { setuid: "off" },
    'Parameter setuid="off" is not allowed on this node: volume creators may only use "on" ' +
      "(--allow-parameter setuid=on); the operator can allow it with --allow-parameter " +
      "setuid=off",
  );
  assertPolicyRefuses(
    p,
    { dedup: "sha256" },
    /may only use "on", "verify" \(--allow-parameter dedup=on\|verify\)/,
  );
  // Others keep their defaults.
  assertPolicyRefuses(p, { exec: "on" }, /exec="on" .* by default/);
});

Deno.test("parseParameters with --allow-parameter lists the values of every flag for a name", () => {
  const p = policy({ allow: ["compression=lz4", "compression=zstd|lz4", "quota=capacity"] });
  assert.deepEqual(p.rules.compression, { kind: "allow", values: ["lz4", "zstd"] });
  assertPolicyAccepts(p, { compression: "zstd", quota: "capacity" });
  assertPolicyRefuses(p, { compression: "gzip-9" }, /may only use "lz4", "zstd"/);
  assertPolicyRefuses(p, { quota: "1G" }, /quota="1G" is not allowed/);
  // Values are compared as written.
  assertPolicyRefuses(p, { compression: "on" }, /compression="on" is not allowed/);
  assert.deepEqual(policy({ allow: ["compression=lz4", "compression=*"] }).rules.compression, {
    kind: "allow",
    values: "any",
  });
});

Deno.test("parseParameters with --deny-parameter refuses a name, a module or everything", () => {
  const named = policy({ deny: ["compression", "quota"] });
  assertPolicyRefuses(
    named,
    { compression: "lz4" },
    'Parameter compression="lz4" is not allowed on this node: the operator refuses it ' +
      "(--deny-parameter compression)",
  );
  assertPolicyRefuses(named, { quota: "capacity" }, /quota="capacity" .*--deny-parameter quota/);
  assertPolicyAccepts(named, { atime: "off" });

  const module = policy({ deny: ["com.example:*"], allow: ["com.example:owner=*"] });
  assertPolicyRefuses(
    module,
    { "com.example:team": "db" },
    'Parameter com.example:team="db" is not allowed on this node: the operator refuses it ' +
      "(--deny-parameter com.example:*); the operator can allow it with --allow-parameter " +
      "com.example:team=db",
  );
  // The exact name is more specific than the module.
  assertPolicyAccepts(module, { "com.example:owner": "anyone" });

  const all = policy({ deny: ["*"], allow: ["compression=lz4", "com.sun:*=*"] });
  assertPolicyAccepts(all, { compression: "lz4", "com.sun:auto-snapshot": "true" });
  assertPolicyRefuses(all, { atime: "off" }, /atime="off" .*\(--deny-parameter \*\)/);
  assertPolicyRefuses(all, { "com.example:x": "y" }, /--deny-parameter \*/);
  assertPolicyRefuses(all, { compression: "zstd" }, /may only use "lz4"/);
});

Deno.test("parseParameters with --allow-parameter for a module or * lifts the defaults", () => {
  const sun = policy({ allow: ["com.sun:*=true|false"] });
  assertPolicyAccepts(sun, { "com.sun:auto-snapshot": "false" });
  assertPolicyRefuses(sun, { "com.sun:auto-snapshot": "yes" }, /may only use "true", "false"/);
  const all = policy({ allow: ["*=*"] });
  assertPolicyAccepts(all, { setuid: "on", dedup: "on", "org.openzfs.systemd:ignore": "on" });
  assertPolicyAccepts(all, {
    encryption: "on",
    keyformat: "hex",
    keylocation: "https://keys.example/k",
  });
});

Deno.test("parseParameters with --key-dir and --allow-parameter keylocation accepts either", () => {
  const p = policy({ keyDir: "/keys", allow: ["keylocation=https://keys.example/k1"] });
  const withKey = (keylocation: string) => ({ encryption: "on", keyformat: "raw", keylocation });
  assertPolicyAccepts(p, withKey("file:///keys/a"));
  assertPolicyAccepts(p, withKey("https://keys.example/k1"));
  assertPolicyRefuses(p, withKey("https://keys.example/k2"), /may only use "https:\/\/keys/);
  // --key-dir is the operator's word too: a blanket deny leaves it in force.
  const only = policy({ keyDir: "/keys", deny: ["*"], allow: ["encryption=*", "keyformat=*"] });
  assertPolicyAccepts(only, withKey("file:///keys/a"));
  assertPolicyRefuses(only, withKey("file:///etc/shadow"), /--deny-parameter \*/);
});

Deno.test("resolveParameterPolicy refuses malformed flags, unknown names and bad values", () => {
  const table: ReadonlyArray<
    readonly [{ allow?: string[]; deny?: string[]; keyDir?: string }, string | RegExp]
  > = [
    [
      { allow: ["setuid"] },
      '--allow-parameter "setuid" is not of the form NAME=VALUE[|VALUE...] or NAME=*',
    ],
    [
      { allow: ["=on"] },
      '--allow-parameter "=on" is not of the form NAME=VALUE[|VALUE...] or NAME=*',
    ],
    [
      { allow: ["mountpoint=/etc"] },
      '--allow-parameter "mountpoint=/etc": "mountpoint" is not a parameter zfs-csi accepts ' +
      "(a ZFS property of the list in docs/parameters.md, quota, refreservation, backup_interval, backup_keep, module:name, module:* or *)",
    ],
    [{ allow: ["org.zfs-csi:managed=no"] }, /"org.zfs-csi:managed" is not a parameter/],
    [{ allow: ["org.zfs-csi:*=*"] }, /"org.zfs-csi:\*" is not a parameter/],
    [{ allow: ["Com.Sun:*=*"] }, /"Com.Sun:\*" is not a parameter/],
    [
      { allow: ["setuid="] },
      '--allow-parameter "setuid=": Parameter "setuid" must have a value of 1 to 1024 bytes',
    ],
    [{ allow: ["setuid=on|"] }, /^--allow-parameter "setuid=on\|": Parameter "setuid" must have/],
    [
      { allow: ["setuid=yes"] },
      '--allow-parameter "setuid=yes": Parameter setuid="yes" is not a value zfs accepts for setuid',
    ],
    [{ allow: ["quota=lots"] }, /must be a size such as 20GiB/],
    [{ allow: ["keylocation=prompt"] }, /is not a value zfs accepts for keylocation/],
    [{ allow: ["setuid=on|*"] }, '--allow-parameter "setuid=on|*": "*" stands alone (NAME=*)'],
    [{ allow: ["com.sun:*=a|"] }, '--allow-parameter "com.sun:*=a|": a value is empty'],
    [{ deny: ["sharenfs"] }, /^--deny-parameter "sharenfs": "sharenfs" is not a parameter/],
    [{ deny: [""] }, /^--deny-parameter "": "" is not a parameter/],
    [
      { allow: ["setuid=on"], deny: ["setuid"] },
      '--allow-parameter and --deny-parameter both name "setuid"',
    ],
    [
      { keyDir: "/keys", deny: ["keylocation"] },
      "--key-dir is given, but --deny-parameter keylocation refuses every key",
    ],
  ];
  for (const [flags, message] of table) {
    assert.throws(() => policy(flags), (err: unknown) => {
      assert.ok(err instanceof TypeError, String(err));
      if (typeof message === "string") assert.equal(err.message, message);
      else assert.match(err.message, message);
      return true;
    }, JSON.stringify(flags));
  }
});

Deno.test("resolveParameterPolicy returns frozen plain data", () => {
  const p = policy({ allow: ["compression=lz4"], deny: ["dedup"], keyDir: "/keys" });
  assert.deepEqual(p, {
    rules: { compression: { kind: "allow", values: ["lz4"] }, dedup: { kind: "deny" } },
    keyDir: "/keys",
  });
  assert.ok(Object.isFrozen(p) && Object.isFrozen(p.rules));
  assert.ok(Object.isFrozen(p.rules.compression));
  const c = p.rules.compression;
  assert.ok(c?.kind === "allow" && typeof c.values !== "string" && Object.isFrozen(c.values));
});

Deno.test("parametersRefusal gives parseParameters' message, or nothing", () => {
  assert.equal(parametersRefusal({ setuid: "off" }, DEFAULT_PARAMETER_POLICY), undefined);
  assert.equal(parametersRefusal(null, DEFAULT_PARAMETER_POLICY), undefined);
  assert.match(
    parametersRefusal({ setuid: "on" }, DEFAULT_PARAMETER_POLICY)!,
    /^Parameter setuid="on" is not allowed on this node/,
  );
  assert.equal(
    parametersRefusal({ mountpoint: "/" }, UNRESTRICTED_POLICY),
    unsupported("mountpoint"),
  );
});

Deno.test("UNRESTRICTED_POLICY still checks what zfs accepts", () => {
  assert.deepEqual(
    parseParameters({ setuid: "on", dedup: "on", snapdir: "visible" }, UNRESTRICTED_POLICY)
      .properties,
    { dedup: "on", setuid: "on", snapdir: "visible" },
  );
  assertInvalid(
    () => parseParameters({ setuid: "yes" }, UNRESTRICTED_POLICY),
    notAccepted("setuid", "yes"),
  );
  assertInvalid(
    () => parseParameters({ sharenfs: "on" }, UNRESTRICTED_POLICY),
    unsupported("sharenfs"),
  );
});
