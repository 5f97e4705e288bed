import assert from "node:assert/strict";
import {
  binaryFlags,
  grantMessage,
  needsFromVariables,
  NO_NEEDS,
  serviceGrants,
  variablesOf,
} from "../src/permissions.ts";
import { parseConfig } from "../src/config.ts";
import { compileArgs } from "./compile_args.ts";
import {
  cliArgs,
  devPaths,
  devPluginArgs,
  pluginFlags,
  runArgs,
  runNeeds,
  taskArgs,
} from "./dev_args.ts";

const ROOT = "/src/zfs-csi";
const PATHS = devPaths(ROOT, {});
const CSI = `${ROOT}/.cache/dev/csi`;
const KEYS = { AWS_ACCESS_KEY_ID: "A", AWS_SECRET_ACCESS_KEY: "B" };

function noFiles(path: string): string {
  throw new Error(`read ${path}`);
}

/** The permission flags among `deno compile` arguments (between --no-check and --output). */
function compiledFlags(args: readonly string[]): string[] {
  return args.slice(args.indexOf("--no-check") + 1, args.indexOf("--output"));
}

/** The permission flags among `deno run` arguments (before main.ts). */
function runFlags(args: readonly string[]): string[] {
  return args.slice(args.indexOf("--quiet") + 1, args.indexOf(`${ROOT}/main.ts`));
}

Deno.test("devPaths: .cache/dev and zfscsidev, moved by ZFS_CSI_DEV_DIR and ZFS_CSI_DEV_POOL", () => {
  assert.deepEqual(PATHS, {
    dir: `${ROOT}/.cache/dev`,
    image: `${ROOT}/.cache/dev/pool.img`,
    mountRoot: `${ROOT}/.cache/dev/zfs`,
    pool: "zfscsidev",
    parent: "zfscsidev/nomad",
    csiDir: CSI,
    socket: `${CSI}/csi.sock`,
    baseDir: `${CSI}/base`,
  });
  const moved = devPaths(ROOT, { ZFS_CSI_DEV_DIR: "/tmp/d/", ZFS_CSI_DEV_POOL: "zdev1" });
  assert.equal(moved.socket, "/tmp/d/csi/csi.sock");
  assert.equal(moved.parent, "zdev1/nomad");
  assert.throws(
    () => devPaths(ROOT, { ZFS_CSI_DEV_DIR: "rel" }),
    /ZFS_CSI_DEV_DIR must be absolute/,
  );
});

Deno.test("taskArgs drops the '--' deno task passes on, and only a leading one", () => {
  assert.deepEqual(taskArgs(["--", "--store", "file:///tmp/x"]), ["--store", "file:///tmp/x"]);
  assert.deepEqual(taskArgs(["--log-level", "debug"]), ["--log-level", "debug"]);
  assert.deepEqual(taskArgs(["list", "--", "x"]), ["list", "--", "x"]);
});

Deno.test("dev: a file store and a metrics address run with a build's permissions for them", () => {
  const args = devPluginArgs(PATHS, [
    "--store",
    "file:///tmp/x",
    "--metrics-listen",
    "127.0.0.1:9474",
  ]);
  assert.deepEqual(args.slice(0, 8), [
    "--parent-dataset",
    "zfscsidev/nomad",
    "--node-id",
    "dev",
    "--endpoint",
    `unix://${CSI}/csi.sock`,
    "--stage-publish-base-dir",
    `${CSI}/base`,
  ]);
  const needs = runNeeds(args, {}, noFiles, PATHS);
  assert.deepEqual(variablesOf(needs), [
    `ZFS_CSI_EXTRA_DIRS=${CSI}:/tmp/x`,
    "ZFS_CSI_METRICS_LISTEN=127.0.0.1:9474",
  ]);
  // The same flags as `deno task compile` with those variables: one function, binaryFlags.
  const vars = Object.fromEntries(variablesOf(needs).map((v) => v.split(/=(.*)/s)));
  const compiled = compiledFlags(compileArgs({ ...needsFromVariables(vars), output: "x" }));
  const run = runArgs(ROOT, needs, args);
  assert.deepEqual(runFlags(run), compiled);
  assert.deepEqual(compiled, binaryFlags(needs));
  assert.deepEqual(run.slice(0, 3), ["run", "--frozen", "--quiet"]);
  assert.deepEqual(run.slice(-args.length - 1), [`${ROOT}/main.ts`, ...args]);
  assert.ok(compiled.includes("--allow-net=127.0.0.1:9474"));
  assert.ok(compiled.some((f) => f.startsWith("--allow-write=") && f.endsWith(`,${CSI},/tmp/x`)));
});

Deno.test("dev: an S3 endpoint on this host, keys from a file: its host:port and the file", () => {
  const files: Record<string, string> = {
    "/tmp/keys": "aws_access_key_id=A\naws_secret_access_key=B\n",
  };
  const args = devPluginArgs(PATHS, [
    "--store",
    "s3://bkt",
    "--store-endpoint",
    "http://127.0.0.1:7070",
    "--store-path-style",
    "--store-credentials-file",
    "/tmp/keys",
  ]);
  const needs = runNeeds(args, {}, (p) => files[p] ?? noFiles(p), PATHS);
  assert.deepEqual(variablesOf(needs), [
    `ZFS_CSI_EXTRA_DIRS=${CSI}`,
    "ZFS_CSI_STORE_HOSTS=127.0.0.1:7070",
    "ZFS_CSI_EXTRA_READ_FILES=/tmp/keys",
  ]);
  // Keys from the environment: no file.
  const fromEnv = runNeeds(args.slice(0, -2), KEYS, noFiles, PATHS);
  assert.deepEqual(fromEnv.extraReadFiles, []);
  assert.deepEqual(fromEnv.storeHosts, ["127.0.0.1:7070"]);
});

Deno.test("dev: every refusal naming a build variable is met by the dev task's own needs", () => {
  const args = devPluginArgs(PATHS, [
    "--store",
    "s3://bkt",
    "--store-endpoint",
    "http://127.0.0.1:7070",
    "--store-path-style",
    "--metrics-listen",
    "[::1]:9474",
  ]);
  const parsed = parseConfig(args, KEYS, noFiles);
  assert.ok(parsed.kind === "run");
  const flags = binaryFlags(runNeeds(args, KEYS, noFiles, PATHS));
  for (const grant of serviceGrants(parsed.config)) {
    // "rebuild with NAME=value deno task compile": NAME=value is among the dev run's flags.
    const value = grant.fix.split("=")[1]!;
    assert.match(grantMessage(grant), /rebuild with ZFS_CSI_[A-Z_]+=/);
    assert.ok(flags.some((f) => f.startsWith("--allow-net=") && f.split(/[=,]/).includes(value)));
  }
});

Deno.test("dev: the build variables of the environment are honoured, beside the derived needs", () => {
  const env = {
    ZFS_CSI_EXTRA_DIRS: "/srv/nomad/client/csi",
    ZFS_CSI_STORE_HOSTS: "s3.example.com",
  };
  const needs = runNeeds(devPluginArgs(PATHS, []), env, noFiles, PATHS);
  assert.deepEqual(needs, {
    ...NO_NEEDS,
    extraDirs: ["/srv/nomad/client/csi", CSI],
    storeHosts: ["s3.example.com"],
  });
});

Deno.test("dev: arguments the plugin refuses add nothing; --help adds nothing", () => {
  const env = { ZFS_CSI_EXTRA_DIRS: "/srv/x" };
  for (const extra of [["--store"], ["--store", "ftp://x"], ["--help"]]) {
    assert.deepEqual(
      runNeeds(devPluginArgs(PATHS, extra), env, noFiles, PATHS),
      { ...NO_NEEDS, extraDirs: ["/srv/x"] },
      extra.join(" "),
    );
  }
});

Deno.test("cli: a subcommand without --parent-dataset is aimed at the dev pool, socket and base", () => {
  assert.deepEqual(cliArgs(PATHS, ["list"]), [
    "list",
    "--endpoint",
    `unix://${CSI}/csi.sock`,
    "--stage-publish-base-dir",
    `${CSI}/base`,
    "--parent-dataset",
    "zfscsidev/nomad",
    "--node-id",
    "dev",
  ]);
  // The user's own flags stay, after the defaults, and replace a default they give.
  assert.deepEqual(cliArgs(PATHS, ["list", "--node-id=other", "--json"]), [
    "list",
    "--endpoint",
    `unix://${CSI}/csi.sock`,
    "--stage-publish-base-dir",
    `${CSI}/base`,
    "--parent-dataset",
    "zfscsidev/nomad",
    "--node-id=other",
    "--json",
  ]);
  // demo takes the socket and base only.
  assert.deepEqual(cliArgs(PATHS, ["demo", "--keep"]), [
    "demo",
    "--endpoint",
    `unix://${CSI}/csi.sock`,
    "--stage-publish-base-dir",
    `${CSI}/base`,
    "--keep",
  ]);
  // Another pool: nothing added. help, flags alone, host volume operations: nothing.
  for (
    const args of [
      ["list", "--parent-dataset", "tank/nomad", "--node-id", "a"],
      ["help"],
      ["help", "list"],
      ["--version"],
      ["fingerprint"],
      [],
    ]
  ) {
    assert.deepEqual(cliArgs(PATHS, args), args);
  }
});

Deno.test("cli: pluginFlags keeps the plugin's flags of a subcommand's command line", () => {
  assert.deepEqual(
    pluginFlags([
      "verify",
      "pg",
      "--store",
      "file:///b",
      "--keep",
      "--to=x/y",
      "--store-path-style",
    ]),
    ["--store", "file:///b", "--store-path-style"],
  );
});

Deno.test("cli: runs with the build's permissions for the store its flags name, the same as dev", () => {
  const args = cliArgs(PATHS, ["verify", "pg", "--store", "file:///mnt/backup"]);
  const needs = runNeeds(args, {}, noFiles, PATHS);
  assert.deepEqual(variablesOf(needs), [`ZFS_CSI_EXTRA_DIRS=${CSI}:/mnt/backup`]);
  const devNeeds = runNeeds(
    devPluginArgs(PATHS, ["--store", "file:///mnt/backup"]),
    {},
    noFiles,
    PATHS,
  );
  assert.deepEqual(needs, devNeeds);
  assert.deepEqual(runFlags(runArgs(ROOT, needs, args)), binaryFlags(needs));
  // Another pool with production paths: the production build exactly.
  const prod = cliArgs(PATHS, ["list", "--parent-dataset", "tank/nomad", "--node-id", "a"]);
  assert.deepEqual(runNeeds(prod, {}, noFiles, PATHS), NO_NEEDS);
  // demo (no --parent-dataset of its own): its socket and base directory.
  assert.deepEqual(
    variablesOf(runNeeds(cliArgs(PATHS, ["demo"]), {}, noFiles, PATHS)),
    [`ZFS_CSI_EXTRA_DIRS=${CSI}`],
  );
});
