import assert from "node:assert/strict";
import {
  type Config,
  ConfigError,
  DEFAULT_ENDPOINT,
  DEFAULT_STAGE_PUBLISH_DIR,
  parseConfig,
  USAGE,
} from "./config.ts";
import { NODE_TOPOLOGY_KEY, PLUGIN_NAME, PLUGIN_VERSION } from "./version.ts";

const REQUIRED = ["--parent-dataset", "tank/nomad", "--node-id", "n1"];

function run(args: readonly string[], env: Record<string, string | undefined> = {}): Config {
  const parsed = parseConfig(args, env);
  assert.equal(parsed.kind, "run");
  if (parsed.kind !== "run") throw new Error("unreachable");
  return parsed.config;
}

function fails(args: readonly string[], message: string | RegExp, env = {}): void {
  assert.throws(() => parseConfig(args, env), (err: unknown) => {
    assert.ok(err instanceof ConfigError, `expected a ConfigError, got ${String(err)}`);
    if (typeof message === "string") assert.equal(err.message, message);
    else assert.match(err.message, message);
    return true;
  });
}

Deno.test("parseConfig returns the help text for --help and -h", () => {
  assert.deepEqual(parseConfig(["--help"], {}), { kind: "help", text: USAGE });
  assert.deepEqual(parseConfig(["-h"], {}), { kind: "help", text: USAGE });
  // Help wins over missing required flags.
  assert.deepEqual(parseConfig(["--node-id", "n1", "-h"], {}), { kind: "help", text: USAGE });
  assert.match(USAGE, /--parent-dataset NAME/);
});

Deno.test("parseConfig returns the name and version for --version", () => {
  assert.deepEqual(parseConfig(["--version"], {}), {
    kind: "version",
    text: `${PLUGIN_NAME} ${PLUGIN_VERSION}`,
  });
});

Deno.test("parseConfig fills every field with its default", () => {
  const config = run(REQUIRED);
  assert.deepEqual(config, {
    mode: "monolith",
    deletedRetentionSeconds: 7 * 86400,
    endpoint: DEFAULT_ENDPOINT,
    socketPath: "/csi/csi.sock",
    nodeId: "n1",
    topology: { [NODE_TOPOLOGY_KEY]: "n1" },
    parentDataset: "tank/nomad",
    logLevel: "info",
    zfsPath: "zfs",
    zpoolPath: "zpool",
    mountPath: "mount",
    umountPath: "umount",
    stagePublishDirs: [DEFAULT_STAGE_PUBLISH_DIR],
    commandTimeoutMs: 60_000,
    nodeLocalPluginId: false,
    parameterPolicy: { rules: {}, keyDir: undefined },
    blockVolumes: false,
    allowSparseZvols: false,
    follow: { leaseTtlSeconds: 30, standbyIntervalSeconds: 30 },
  });
  assert.equal(Object.isFrozen(config), true);
  assert.equal(Object.isFrozen(config.topology), true);
  assert.equal(Object.isFrozen(config.stagePublishDirs), true);
});

Deno.test("parseConfig takes every option", () => {
  const config = run([
    ...REQUIRED,
    "--endpoint=unix:///run/csi/zfs.sock",
    "--topology",
    "zone=eu1",
    "--topology",
    "topology.example.com/rack=r-12",
    "--stage-publish-base-dir",
    "/var/lib/nomad/client/csi/",
    "--stage-publish-base-dir",
    "//opt//nomad/csi",
    "--log-level",
    "debug",
    "--zfs",
    "/usr/sbin/zfs",
    "--zpool",
    "/usr/sbin/zpool",
    "--mount",
    "/usr/bin/mount",
    "--umount",
    "/usr/bin/umount",
    "--command-timeout",
    "2.5",
    "--mode",
    "node",
    "--deleted-retention",
    "36h",
    "--node-local-plugin-id",
    "--allow-parameter",
    "setuid=on",
    "--deny-parameter",
    "dedup",
    "--key-dir",
    "/etc/zfs/keys/",
    "--lease-ttl",
    "45s",
    "--takeover-after",
    "5m",
    "--standby-interval",
    "2m",
    "--block-volumes",
    "--allow-sparse-zvols",
  ]);
  assert.deepEqual(config, {
    mode: "node",
    deletedRetentionSeconds: 36 * 3600,
    endpoint: "unix:///run/csi/zfs.sock",
    socketPath: "/run/csi/zfs.sock",
    nodeId: "n1",
    topology: { zone: "eu1", "topology.example.com/rack": "r-12", [NODE_TOPOLOGY_KEY]: "n1" },
    parentDataset: "tank/nomad",
    logLevel: "debug",
    zfsPath: "/usr/sbin/zfs",
    zpoolPath: "/usr/sbin/zpool",
    mountPath: "/usr/bin/mount",
    umountPath: "/usr/bin/umount",
    stagePublishDirs: ["/var/lib/nomad/client/csi", "/opt/nomad/csi"],
    commandTimeoutMs: 2500,
    nodeLocalPluginId: true,
    parameterPolicy: {
      rules: { setuid: { kind: "allow", values: ["on"] }, dedup: { kind: "deny" } },
      keyDir: "/etc/zfs/keys",
    },
    blockVolumes: true,
    allowSparseZvols: true,
    follow: { leaseTtlSeconds: 45, takeoverAfterSeconds: 300, standbyIntervalSeconds: 120 },
  });
});

Deno.test("parseConfig refuses a lease TTL below 3s and reads --takeover-after off", () => {
  assert.throws(() => run([...REQUIRED, "--lease-ttl", "2s"]), /--lease-ttl must be at least 3s/);
  assert.deepEqual(run([...REQUIRED, "--takeover-after", "off"]).follow, {
    leaseTtlSeconds: 30,
    standbyIntervalSeconds: 30,
  });
  assert.throws(() => run([...REQUIRED, "--takeover-after", "soon"]), /--takeover-after "soon"/);
});

Deno.test("parseConfig reads --standby-interval: 30s by default, off for never", () => {
  assert.equal(run([...REQUIRED]).follow?.standbyIntervalSeconds, 30);
  assert.equal(
    run([...REQUIRED, "--standby-interval", "off"]).follow?.standbyIntervalSeconds,
    undefined,
  );
  assert.throws(
    () => run([...REQUIRED, "--standby-interval", "0s"]),
    /--standby-interval must be at least 1s, or off/,
  );
});

Deno.test("parseConfig reads each mode and retention unit", () => {
  for (const mode of ["node", "controller", "monolith"]) {
    assert.equal(run([...REQUIRED, "--mode", mode]).mode, mode);
  }
  const cases: Array<[string, number]> = [["0", 0], ["90s", 90], ["30m", 1800], ["2h", 7200], [
    "7d",
    604800,
  ]];
  for (const [text, seconds] of cases) {
    assert.equal(run([...REQUIRED, "--deleted-retention", text]).deletedRetentionSeconds, seconds);
  }
});

Deno.test("parseConfig refuses an unknown mode and a malformed retention", () => {
  fails([...REQUIRED, "--mode", "both"], '--mode "both" is not one of node, controller, monolith');
  for (const bad of ["7", "1w", "-1d", "1.5h", "", "99999999d"]) {
    fails(
      [...REQUIRED, `--deleted-retention=${bad}`],
      `--deleted-retention "${bad}" must be 0 or a duration such as 90s, 30m, 24h or 7d`,
    );
  }
});

Deno.test("parseConfig refuses a missing --parent-dataset", () => {
  fails(["--node-id", "n1"], "Missing required flag --parent-dataset (for example tank/nomad)");
});

Deno.test("parseConfig refuses a missing or empty --node-id", () => {
  fails(["--parent-dataset", "tank/nomad"], "Missing required flag --node-id (a stable node name)");
  fails(
    ["--parent-dataset", "tank/nomad", "--node-id", ""],
    "Missing required flag --node-id (a stable node name)",
  );
  fails(
    ["--parent-dataset", "tank/nomad", "--node-id", "node 1"],
    /^--node-id "node 1" is not valid/,
  );
});

Deno.test("parseConfig refuses unknown flags and positionals", () => {
  fails([...REQUIRED, "--bogus"], /^Unknown option '--bogus'.* \(see --help\)$/);
  fails([...REQUIRED, "extra"], /extra.* \(see --help\)$/);
  fails([...REQUIRED, "--node-id"], /--node-id.* \(see --help\)$/);
});

Deno.test("parseConfig refuses a whole pool as parent dataset", () => {
  fails(
    ["--parent-dataset", "tank", "--node-id", "n1"],
    '--parent-dataset "tank" is a whole pool: give a dataset inside it, e.g. tank/nomad',
  );
});

Deno.test("parseConfig refuses a malformed parent dataset", () => {
  fails(
    ["--parent-dataset", "tank/a b", "--node-id", "n1"],
    /^--parent-dataset: Dataset name "tank\/a b" is not valid/,
  );
  fails(["--parent-dataset", "tank/nomad/", "--node-id", "n1"], /^--parent-dataset: /);
  fails(["--parent-dataset", "", "--node-id", "n1"], "--parent-dataset: Dataset name is empty");
});

Deno.test("parseConfig refuses malformed topology", () => {
  const table: ReadonlyArray<readonly [string, string | RegExp]> = [
    ["zone", '--topology "zone" is not of the form key=value'],
    ["=eu1", '--topology "=eu1" is not of the form key=value'],
    ["zone=", '--topology value "" of "zone" is not valid: 1-63 letters, digits and "-_."'],
    ["zone=eu 1", /^--topology value "eu 1" of "zone" is not valid/],
    ["zo ne=eu1", /^--topology key "zo ne" is not valid/],
    ["Bad_Prefix/zone=eu1", /^--topology key "Bad_Prefix\/zone" is not valid/],
    ["example.com/=eu1", /^--topology key "example.com\/" is not valid/],
    [`zone=${"x".repeat(64)}`, /^--topology value "x{64}" of "zone" is not valid/],
  ];
  for (const [item, message] of table) fails([...REQUIRED, "--topology", item], message);
});

Deno.test("parseConfig accepts a repeated topology key with the same value only", () => {
  assert.deepEqual(run([...REQUIRED, "--topology", "zone=a", "--topology", "zone=a"]).topology, {
    zone: "a",
    [NODE_TOPOLOGY_KEY]: "n1",
  });
  fails(
    [...REQUIRED, "--topology", "zone=a", "--topology", "zone=b"],
    '--topology key "zone" is given twice with different values',
  );
});

Deno.test("parseConfig refuses the reserved node topology key", () => {
  fails(
    [...REQUIRED, "--topology", `${NODE_TOPOLOGY_KEY}=other`],
    `--topology key "${NODE_TOPOLOGY_KEY}" is reserved: it is always the node id`,
  );
});

Deno.test("parseConfig falls back to CSI_ENDPOINT, and --endpoint wins over it", () => {
  const fromEnv = run(REQUIRED, { CSI_ENDPOINT: "unix:///var/run/csi.sock" });
  assert.equal(fromEnv.endpoint, "unix:///var/run/csi.sock");
  assert.equal(fromEnv.socketPath, "/var/run/csi.sock");
  const fromFlag = run([...REQUIRED, "--endpoint", "unix:///a/b.sock"], {
    CSI_ENDPOINT: "unix:///var/run/csi.sock",
  });
  assert.equal(fromFlag.socketPath, "/a/b.sock");
  assert.equal(run(REQUIRED, { CSI_ENDPOINT: undefined }).endpoint, DEFAULT_ENDPOINT);
});

Deno.test("parseConfig accepts unix endpoints in both forms and refuses others", () => {
  assert.equal(
    run([...REQUIRED, "--endpoint", "unix:///csi/csi.sock"]).socketPath,
    "/csi/csi.sock",
  );
  assert.equal(run([...REQUIRED, "--endpoint", "unix:/csi/csi.sock"]).socketPath, "/csi/csi.sock");
  for (
    const endpoint of [
      "tcp://127.0.0.1:10000",
      "unix:csi.sock",
      "/csi/csi.sock",
      "unix:///csi/",
      "",
    ]
  ) {
    fails(
      [...REQUIRED, "--endpoint", endpoint],
      `Endpoint "${endpoint}" is not supported: use unix:///absolute/path/csi.sock`,
    );
  }
  fails(REQUIRED, /^Endpoint "tcp:\/\/x:1" is not supported/, { CSI_ENDPOINT: "tcp://x:1" });
});

Deno.test("parseConfig refuses bad stage-publish dirs, log levels, timeouts and programs", () => {
  const table: ReadonlyArray<readonly [readonly string[], string | RegExp]> = [
    [["--stage-publish-base-dir", "local/csi"], /must be an absolute path without "\." or "\.\."$/],
    [["--stage-publish-base-dir", "/local/../etc"], /must be an absolute path/],
    [["--stage-publish-base-dir", "/"], '--stage-publish-base-dir must not be "/"'],
    [["--log-level", "verbose"], '--log-level "verbose" is not one of debug, info, warn, error'],
    [["--command-timeout", "0"], '--command-timeout "0" must be seconds between 0 and 3600'],
    [["--command-timeout=-1"], /^--command-timeout "-1"/],
    [["--command-timeout", "3601"], /^--command-timeout "3601"/],
    [["--command-timeout", "1e3"], /^--command-timeout "1e3"/],
    [["--zfs", ""], '--zfs "" is not a program name or path'],
    [["--umount", "umount\n-l"], /^--umount ".*" is not a program name or path$/s],
  ];
  for (const [extra, message] of table) fails([...REQUIRED, ...extra], message);
});

Deno.test("parseConfig removes duplicate stage-publish dirs", () => {
  assert.deepEqual(
    run([...REQUIRED, "--stage-publish-base-dir", "/a", "--stage-publish-base-dir", "/a/"])
      .stagePublishDirs,
    ["/a"],
  );
});

Deno.test("parseConfig resolves the parameter policy from repeated flags", () => {
  const config = run([
    ...REQUIRED,
    "--allow-parameter",
    "compression=lz4|zstd",
    "--allow-parameter=compression=off",
    "--allow-parameter",
    "com.sun:*=*",
    "--deny-parameter",
    "com.example:*",
    "--deny-parameter",
    "*",
    "--key-dir",
    "//run//keys",
  ]);
  assert.deepEqual(config.parameterPolicy, {
    rules: {
      compression: { kind: "allow", values: ["lz4", "zstd", "off"] },
      "com.sun:*": { kind: "allow", values: "any" },
      "com.example:*": { kind: "deny" },
      "*": { kind: "deny" },
    },
    keyDir: "/run/keys",
  });
  assert.equal(Object.isFrozen(config.parameterPolicy), true);
  assert.equal(Object.isFrozen(config.parameterPolicy.rules), true);
});

Deno.test("parseConfig refuses unknown parameter names and bad values in the policy flags", () => {
  const table: ReadonlyArray<readonly [readonly string[], string | RegExp]> = [
    [
      ["--allow-parameter", "mountpoint=/etc"],
      '--allow-parameter "mountpoint=/etc": "mountpoint" is not a parameter zfs-csi accepts ' +
      "(a ZFS property of the list in docs/parameters.md, quota, refreservation, backup_interval, backup_keep, module:name, module:* or *)",
    ],
    [["--allow-parameter", "compresion=lz4"], /"compresion" is not a parameter zfs-csi accepts/],
    [["--allow-parameter", "setuid"], /^--allow-parameter "setuid" is not of the form NAME=VALUE/],
    [["--allow-parameter", "setuid=yes"], /is not a value zfs accepts for setuid$/],
    [["--deny-parameter", "sharenfs"], /^--deny-parameter "sharenfs": "sharenfs" is not a/],
    [
      ["--allow-parameter", "exec=on", "--deny-parameter", "exec"],
      '--allow-parameter and --deny-parameter both name "exec"',
    ],
    [
      ["--key-dir", "etc/keys"],
      '--key-dir "etc/keys" must be an absolute path without "." or ".."',
    ],
    [["--key-dir", "/etc/../keys"], /^--key-dir "\/etc\/\.\.\/keys" must be an absolute path/],
    [["--key-dir", "/"], '--key-dir must not be "/"'],
    [
      ["--key-dir", "/keys", "--deny-parameter", "keylocation"],
      "--key-dir is given, but --deny-parameter keylocation refuses every key",
    ],
  ];
  for (const [extra, message] of table) fails([...REQUIRED, ...extra], message);
});

Deno.test("parseConfig lists the parameter policy flags in its help", () => {
  for (const flag of ["--allow-parameter N=V[|V]", "--deny-parameter N", "--key-dir DIR"]) {
    assert.ok(USAGE.includes(flag), flag);
  }
});

Deno.test("parseConfig takes --node-local-plugin-id as a flag without a value, off by default", () => {
  assert.equal(run(REQUIRED).nodeLocalPluginId, false);
  assert.equal(run([...REQUIRED, "--node-local-plugin-id"]).nodeLocalPluginId, true);
  fails([...REQUIRED, "--node-local-plugin-id=yes"], /node-local-plugin-id/);
  assert.ok(USAGE.includes("--node-local-plugin-id"));
});

Deno.test("parseConfig refuses --allow-sparse-zvols without --block-volumes", () => {
  assert.throws(
    () => run([...REQUIRED, "--allow-sparse-zvols"]),
    /--allow-sparse-zvols needs --block-volumes/,
  );
  assert.equal(run([...REQUIRED, "--block-volumes"]).blockVolumes, true);
  assert.equal(run([...REQUIRED, "--block-volumes"]).allowSparseZvols, false);
});
