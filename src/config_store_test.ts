import assert from "node:assert/strict";
import { inspect } from "node:util";
import {
  type Config,
  ConfigError,
  Credentials,
  parseConfig,
  type S3StoreConfig,
  USAGE,
} from "./config.ts";
import { parseCredentialsText } from "./config_store.ts";
import { Logger } from "./log.ts";

const REQUIRED = ["--parent-dataset", "tank/nomad", "--node-id", "n1"];
const KEYS = { AWS_ACCESS_KEY_ID: "AKIDEXAMPLE", AWS_SECRET_ACCESS_KEY: "s3cr3t+Key/xyz" };
const SECRET = KEYS.AWS_SECRET_ACCESS_KEY;
type Env = Record<string, string | undefined>;

function run(args: readonly string[], env: Env = KEYS, files: Record<string, string> = {}): Config {
  const parsed = parseConfig([...REQUIRED, ...args], env, (path) => {
    const text = files[path];
    if (text === undefined) throw new Error(`No such file: ${path}`);
    return text;
  });
  if (parsed.kind !== "run") throw new Error("expected a run config");
  return parsed.config;
}

function s3(args: readonly string[], env: Env = KEYS, files: Record<string, string> = {}) {
  const store = run(args, env, files).store;
  assert.equal(store?.kind, "s3");
  return store as S3StoreConfig;
}

/** Expects a one-line ConfigError matching `message` that never shows a secret. */
function fails(
  args: readonly string[],
  message: string | RegExp,
  env: Env = KEYS,
  files: Record<string, string> = {},
): void {
  assert.throws(() => run(args, env, files), (err: unknown) => {
    assert.ok(err instanceof ConfigError, `expected a ConfigError, got ${String(err)}`);
    if (typeof message === "string") assert.equal(err.message, message);
    else assert.match(err.message, message);
    assert.ok(!err.message.includes("\n"), "one line");
    assert.ok(!/s3cr3t|hunter2/.test(err.message), `no secret in: ${err.message}`);
    return true;
  });
}

Deno.test("parseConfig without --store leaves backups off and refuses the store's companions", () => {
  assert.equal("store" in run([]), false);
  for (
    const [flag, value] of [
      ["--store-endpoint", "https://s3.example.com"],
      ["--store-region", "eu-west-1"],
      ["--store-path-style", undefined],
      ["--store-insecure-http", undefined],
      ["--store-credentials-file", "/secrets/s3"],
      ["--backup-interval", "15m"],
      ["--backup-keep", "last=1"],
      ["--store-deleted-retention", "1d"],
      ["--store-wait", "1m"],
    ] as const
  ) {
    fails(
      value === undefined ? [flag] : [flag, value],
      `${flag} needs --store (backups are off without one)`,
    );
  }
});

Deno.test("parseConfig reads a file store and fills the backup defaults", () => {
  const config = run(["--store", "file:///mnt/backup//zfs-csi/"], {});
  assert.deepEqual(config.store, {
    kind: "file",
    url: "file:///mnt/backup/zfs-csi",
    dir: "/mnt/backup/zfs-csi",
    defaultBackupIntervalSeconds: 0,
    defaultBackupKeep: { last: 4, hourly: 24, daily: 14, weekly: 8 },
    deletedRetentionSeconds: 30 * 86400,
    waitSeconds: 30,
  });
  assert.ok(Object.isFrozen(config.store));
  assert.ok(Object.isFrozen(config.store?.defaultBackupKeep));
  const spaced = run(["--store", "file:///mnt/my%20backup"], {}).store;
  assert.equal(spaced?.kind === "file" && spaced.dir, "/mnt/my backup");
  assert.equal(spaced?.url, "file:///mnt/my%20backup");
});

Deno.test("parseConfig refuses file stores that are not absolute directories", () => {
  fails(
    ["--store", "file://mnt/backup"],
    '--store "file://mnt/backup" is not a file:///absolute/dir URL',
  );
  fails(["--store", "file:///mnt/%zz"], /is not a file:\/\/\/absolute\/dir URL/);
  fails(["--store", "file:///mnt/x?y"], /is not a file:\/\/\/absolute\/dir URL/);
  fails(
    ["--store", "file:///mnt/../etc"],
    '--store "/mnt/../etc" must be an absolute path without "." or ".."',
  );
  fails(["--store", "file:///"], '--store must not be "/"');
  fails(
    ["--store", "/mnt/backup"],
    /^--store "\/mnt\/backup" is not a store: use file:\/\/\/absolute\/dir or s3:\/\/bucket\[\/prefix\]$/,
  );
  fails(["--store", "file:///b", "--store-region", "x"], "--store-region is only for s3:// stores");
  fails(
    ["--store", "file:///b", "--store-path-style"],
    "--store-path-style is only for s3:// stores",
  );
});

Deno.test("parseConfig reads an S3 store with AWS's defaults and keys from the environment", () => {
  const store = s3(["--store", "s3://my-bucket"]);
  assert.equal(store.url, "s3://my-bucket");
  assert.equal(store.bucket, "my-bucket");
  assert.equal(store.prefix, "");
  assert.equal(store.region, "us-east-1");
  assert.equal(store.endpoint, "https://s3.us-east-1.amazonaws.com");
  assert.equal(store.pathStyle, false);
  // Virtual-hosted: requests go to the bucket's own host, which the build must allow.
  assert.equal(store.netHost, "my-bucket.s3.us-east-1.amazonaws.com:443");
  assert.equal(store.credentials.accessKeyId, "AKIDEXAMPLE");
  assert.equal(store.credentials.secretAccessKey, SECRET);
  assert.equal(store.credentials.sessionToken, undefined);
  assert.equal(store.credentials.source, "the environment");
  assert.equal(store.credentialsFile, undefined);
  assert.equal(store.deletedRetentionSeconds, 30 * 86400);
  assert.ok(Object.isFrozen(store) && Object.isFrozen(store.credentials));

  const eu = s3(["--store", "s3://b1b/a/b/", "--store-region", "eu-west-3", "--store-path-style"]);
  assert.equal(eu.prefix, "a/b");
  assert.equal(eu.url, "s3://b1b/a/b");
  assert.equal(eu.endpoint, "https://s3.eu-west-3.amazonaws.com");
  assert.equal(eu.netHost, "s3.eu-west-3.amazonaws.com:443");
});

Deno.test("parseConfig takes a self-hosted endpoint and allows plain http only to this host", () => {
  const local = s3([
    "--store",
    "s3://b1b",
    "--store-endpoint",
    "http://127.0.0.1:7070/",
    "--store-path-style",
  ]);
  assert.equal(local.endpoint, "http://127.0.0.1:7070");
  assert.equal(local.netHost, "127.0.0.1:7070");
  const v6 = s3([
    "--store",
    "s3://b1b",
    "--store-endpoint",
    "http://[::1]:9000",
    "--store-path-style",
  ]);
  assert.equal(v6.netHost, "[::1]:9000");
  assert.equal(
    s3(["--store", "s3://b1b", "--store-endpoint", "http://localhost"]).netHost,
    "b1b.localhost:80",
  );
  assert.equal(
    s3(["--store", "s3://b1b", "--store-endpoint", "https://S3.Example.com:8443"]).netHost,
    "b1b.s3.example.com:8443",
  );
  fails(
    ["--store", "s3://b1b", "--store-endpoint", "http://minio.lan:9000"],
    '--store-endpoint "http://minio.lan:9000" is plain http to another host: volume data would ' +
      "cross the network unencrypted and unauthenticated; use https, or add --store-insecure-http",
  );
  const lan = s3([
    "--store",
    "s3://b1b",
    "--store-endpoint",
    "http://minio.lan:9000",
    "--store-insecure-http",
  ]);
  assert.equal(lan.netHost, "b1b.minio.lan:9000");
  fails(
    ["--store", "s3://b1b", "--store-insecure-http"],
    "--store-insecure-http is only for an http:// --store-endpoint",
  );
});

Deno.test("parseConfig refuses endpoints that are not a bare https or http origin", () => {
  for (
    const bad of ["s3.example.com", "ftp://h", "https://h/bucket", "https://h?x=1", "https://h#f"]
  ) {
    fails(
      ["--store", "s3://b1b", "--store-endpoint", bad],
      /must be https:\/\/host\[:port\] \(or http:\/\/\), without a path$/,
    );
  }
  fails(
    ["--store", "s3://b1b", "--store-endpoint", "https://AKID:hunter2@h"],
    "--store-endpoint must not carry credentials: use AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY or --store-credentials-file",
  );
  fails(
    ["--store", "s3://b1b", "--store-endpoint", "http://10.0.0.5:9000", "--store-insecure-http"],
    /is an IP address: add --store-path-style/,
  );
  fails(["--store", "s3://my.bucket"], /has a "\." and needs --store-path-style over https/);
  assert.equal(s3(["--store", "s3://my.bucket", "--store-path-style"]).bucket, "my.bucket");
});

Deno.test("parseConfig refuses malformed S3 URLs, buckets, prefixes and regions", () => {
  fails(
    ["--store", "s3://AKID:hunter2@bucket"],
    "--store must not carry credentials: use AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY or --store-credentials-file",
  );
  fails(["--store", "s3:bucket"], '--store "s3:bucket" is not an s3://bucket[/prefix] URL');
  fails(["--store", "s3://b1b?x"], /is not an s3:\/\/bucket\[\/prefix\] URL/);
  fails(
    ["--store", "https://user:hunter2@h/b"],
    /^--store "https:\/\/\[redacted\]@h\/b" is not a store/,
  );
  for (const bucket of ["", "ab", "Bucket", "b_b", "-bb", "bb-", "a..b", "x".repeat(64)]) {
    fails(
      ["--store", `s3://${bucket}`],
      /is not a valid bucket name: 3-63 lowercase letters, digits, "\." and "-"$/,
    );
  }
  for (const prefix of ["a//b", "a/../b", "a/./b", "a b", "x".repeat(257)]) {
    fails(
      ["--store", `s3://b1b/${prefix}`],
      /^--store prefix ".*" is not valid: at most 256 bytes/,
    );
  }
  fails(
    ["--store", "s3://b1b", "--store-region", "eu/west"],
    '--store-region "eu/west" is not valid: letters, digits and "._-"',
  );
});

Deno.test("parseConfig takes S3 keys from the environment as a pair, with an optional token", () => {
  const token = s3(["--store", "s3://b1b"], { ...KEYS, AWS_SESSION_TOKEN: "tok==" });
  assert.equal(token.credentials.sessionToken, "tok==");
  const empty = s3(["--store", "s3://b1b"], { ...KEYS, AWS_SESSION_TOKEN: "" });
  assert.equal(empty.credentials.sessionToken, undefined);
  fails(
    ["--store", "s3://b1b"],
    "--store s3://b1b needs credentials: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (and AWS_SESSION_TOKEN for temporary ones), or give --store-credentials-file",
    { AWS_SESSION_TOKEN: "tok" },
  );
  fails(
    ["--store", "s3://b1b"],
    "AWS_SECRET_ACCESS_KEY is not set, though AWS_ACCESS_KEY_ID or AWS_SECRET_ACCESS_KEY is",
    { AWS_ACCESS_KEY_ID: "AKID" },
  );
  fails(
    ["--store", "s3://b1b"],
    "AWS_ACCESS_KEY_ID is not set, though AWS_ACCESS_KEY_ID or AWS_SECRET_ACCESS_KEY is",
    { AWS_SECRET_ACCESS_KEY: "hunter2" },
  );
  fails(
    ["--store", "s3://b1b"],
    "AWS_SECRET_ACCESS_KEY is not valid: printable ASCII without spaces",
    { ...KEYS, AWS_SECRET_ACCESS_KEY: "hunter2 x" },
  );
  fails(["--store", "s3://b1b"], "AWS_SESSION_TOKEN is not valid: printable ASCII without spaces", {
    ...KEYS,
    AWS_SESSION_TOKEN: "a\r\nX-Evil: 1",
  });
});

const FILE = `# written by a Nomad template
[other]
aws_access_key_id = OTHER
aws_secret_access_key = other

[default]
aws_access_key_id = AKIDFILE
aws_secret_access_key=hunter2/Secret
; a comment
aws_session_token = FwoGZ==
region = ignored
`;

Deno.test("parseConfig reads S3 keys from --store-credentials-file, ahead of the environment", () => {
  const store = s3(["--store", "s3://b1b", "--store-credentials-file", "/secrets//s3.ini"], KEYS, {
    "/secrets/s3.ini": FILE,
  });
  assert.equal(store.credentialsFile, "/secrets/s3.ini");
  assert.equal(store.credentials.accessKeyId, "AKIDFILE");
  assert.equal(store.credentials.secretAccessKey, "hunter2/Secret");
  assert.equal(store.credentials.sessionToken, "FwoGZ==");
  assert.equal(store.credentials.source, "/secrets/s3.ini");
  // Lines before any section count as [default]; CRLF line ends are fine.
  const bare = parseCredentialsText("aws_access_key_id=A\r\naws_secret_access_key=B\r\n", "/f");
  assert.deepEqual([bare.accessKeyId, bare.secretAccessKey, bare.sessionToken], [
    "A",
    "B",
    undefined,
  ]);
  fails(
    ["--store", "s3://b1b", "--store-credentials-file", "s3.ini"],
    '--store-credentials-file "s3.ini" must be an absolute path without "." or ".."',
  );
  fails(
    ["--store", "s3://b1b", "--store-credentials-file", "/nope"],
    '--store-credentials-file "/nope" cannot be read: No such file: /nope',
  );
  assert.throws(
    () => parseConfig([...REQUIRED, "--store", "s3://b1b", "--store-credentials-file", "/f"], KEYS),
    {
      name: "ConfigError",
      message: '--store-credentials-file "/f" cannot be read: no file reader was given',
    },
  );
});

Deno.test("parseCredentialsText names what is wrong in the file, never a value", () => {
  const bad = (text: string, message: string) =>
    assert.throws(() => parseCredentialsText(text, "/f"), (err: unknown) => {
      assert.ok(err instanceof ConfigError);
      assert.equal(err.message, message);
      return true;
    });
  bad(
    "[default]\naws_access_key_id=A\n",
    '--store-credentials-file "/f" has no aws_secret_access_key in [default]',
  );
  bad(
    "[other]\naws_access_key_id=A\naws_secret_access_key=B\n",
    '--store-credentials-file "/f" has no aws_access_key_id in [default]',
  );
  bad(
    "aws_access_key_id=A\nhunter2\n",
    '--store-credentials-file "/f": line 2 is not "key = value" or "[section]"',
  );
  bad(
    "aws_access_key_id=A\nAWS_ACCESS_KEY_ID=B\n",
    '--store-credentials-file "/f" sets aws_access_key_id twice in [default]',
  );
  bad(
    "aws_access_key_id=A\naws_secret_access_key=hun ter2\n",
    '--store-credentials-file "/f": aws_secret_access_key is not valid: printable ASCII without spaces',
  );
  bad(
    "aws_access_key_id=A\naws_secret_access_key=\n",
    '--store-credentials-file "/f": aws_secret_access_key is not valid: printable ASCII without spaces',
  );
});

Deno.test("Credentials never show their values: JSON, String, inspect and log lines", () => {
  const config = run(["--store", "s3://b1b"], { ...KEYS, AWS_SESSION_TOKEN: "TOKENVALUE" });
  const creds = (config.store as S3StoreConfig).credentials;
  assert.ok(creds instanceof Credentials);
  const shown = [
    JSON.stringify(config),
    JSON.stringify(creds),
    String(creds),
    `${creds}`,
    Deno.inspect(config, { depth: 10, showHidden: true }),
    inspect(config, { depth: 10, showHidden: true }),
    JSON.stringify(Object.entries(creds)),
    JSON.stringify({ ...creds }),
  ];
  const lines: string[] = [];
  const log = new Logger("debug", { store: config.store }, (l) => lines.push(l));
  log.info("serving", { config, credentials: creds });
  log.error("failed", { cause: new Error("x", { cause: creds }) });
  for (const text of [...shown, ...lines]) {
    for (const value of [SECRET, "AKIDEXAMPLE", "TOKENVALUE"]) {
      assert.ok(!text.includes(value), `"${value}" shown in: ${text}`);
    }
  }
  assert.equal(JSON.stringify(creds), '"[redacted]"');
  assert.equal(String(creds), "Credentials from the environment [redacted]");
  assert.match(
    Deno.inspect(config, { depth: 10 }),
    /credentials: Credentials from the environment \[redacted\]/,
  );
});

Deno.test("parseConfig reads the backup defaults with the volumes' own syntax", () => {
  const store = run([
    "--store",
    "file:///b",
    "--backup-interval",
    "1h30m",
    "--backup-keep",
    "hourly=24,last=2",
    "--store-deleted-retention",
    "0",
  ]).store;
  assert.equal(store?.defaultBackupIntervalSeconds, 5400);
  assert.deepEqual(store?.defaultBackupKeep, { last: 2, hourly: 24, daily: 0, weekly: 0 });
  assert.ok(Object.isFrozen(store?.defaultBackupKeep));
  assert.equal(store?.deletedRetentionSeconds, 0);
  assert.equal(
    run(["--store", "file:///b", "--backup-interval", "900"]).store?.defaultBackupIntervalSeconds,
    900,
  );
  fails(
    ["--store", "file:///b", "--backup-interval", "15x"],
    /^--backup-interval: Backup interval "15x" is not valid: /,
  );
  fails(
    ["--store", "file:///b", "--backup-interval", "400d"],
    '--backup-interval: Backup interval "400d" is longer than a year',
  );
  fails(
    ["--store", "file:///b", "--store-deleted-retention", "1w"],
    '--store-deleted-retention "1w" must be 0 or a duration such as 90s, 30m, 24h or 7d',
  );
  for (const keep of ["", "last", "last=-1", "monthly=2", "last=1,last=2", "last=1,"]) {
    fails(["--store", "file:///b", "--backup-keep", keep], /^--backup-keep: Keep policy /);
  }
  fails(
    ["--store", "file:///b", "--backup-keep", "last=0,daily=0"],
    /^--backup-keep: Keep policy "last=0,daily=0" keeps nothing/,
  );
});

Deno.test("parseConfig reads --store-wait, a time from 1s to 1h", () => {
  assert.equal(s3(["--store", "s3://my-bucket"]).waitSeconds, 30);
  assert.equal(s3(["--store", "s3://my-bucket", "--store-wait", "2m"]).waitSeconds, 120);
  assert.equal(run(["--store", "file:///b", "--store-wait", "1s"]).store?.waitSeconds, 1);
  assert.equal(run(["--store", "file:///b", "--store-wait", "1h"]).store?.waitSeconds, 3600);
  for (const value of ["0", "61m", "2h", "30", "", "1.5s", "off"]) {
    fails(
      ["--store", "file:///b", "--store-wait", value],
      `--store-wait "${value}" must be a time from 1s to 1h, such as 30s or 2m`,
    );
  }
});

Deno.test("USAGE documents every store flag", () => {
  for (
    const flag of [
      "--store URL",
      "--store-endpoint URL",
      "--store-region NAME",
      "--store-path-style",
      "--store-insecure-http",
      "--store-credentials-file F",
      "--backup-interval TIME",
      "--backup-keep POLICY",
      "--store-deleted-retention TIME",
      "--store-wait TIME",
      "AWS_ACCESS_KEY_ID",
      "ZFS_CSI_STORE_HOSTS",
    ]
  ) {
    assert.ok(USAGE.includes(flag), flag);
  }
});
