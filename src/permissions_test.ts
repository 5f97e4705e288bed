import assert from "node:assert/strict";
import { parseConfig, type StoreConfig } from "./config.ts";
import {
  ALLOWED_BLOCK_PROGRAMS,
  ALLOWED_ENV,
  ALLOWED_PROGRAMS,
  binaryFlags,
  BLOCK_PROGRAM_NAMES,
  configGrants,
  defaultProgram,
  grantMessage,
  grantNeeds,
  listenHost,
  mergeNeeds,
  metricsGrant,
  needsFromVariables,
  netHost,
  NO_NEEDS,
  permissionFlags,
  PRODUCTION_DIRS,
  PRODUCTION_READ_FILES,
  PROGRAM_DIRS,
  PROGRAM_NAMES,
  type ProgramLookup,
  programRefusal,
  runtimeFlags,
  serviceGrants,
  storeGrants,
  V8_FLAGS,
  variablesOf,
} from "./permissions.ts";

const RUN_FLAG = `--allow-run=${ALLOWED_PROGRAMS.join(",")}`;
const READ_PROGRAMS = ALLOWED_PROGRAMS.join(",");

Deno.test("permissionFlags allows exactly zfs, zpool, mount and umount, by absolute path", () => {
  const flags = permissionFlags({ dirs: ["/csi"] });
  assert.deepEqual(flags.filter((f) => f.startsWith("--allow-run")), [RUN_FLAG]);
  assert.deepEqual([...PROGRAM_NAMES], ["zfs", "zpool", "mount", "umount"]);
  // Where Debian (merged /usr or not), zfs-fuse, util-linux and OpenZFS from source put them.
  for (
    const file of [
      "/sbin/zfs",
      "/usr/sbin/zfs",
      "/usr/local/sbin/zfs",
      "/sbin/zpool",
      "/usr/sbin/zpool",
      "/bin/mount",
      "/usr/bin/mount",
      "/bin/umount",
      "/usr/bin/umount",
    ]
  ) {
    assert.ok(ALLOWED_PROGRAMS.includes(file), file);
  }
  assert.equal(ALLOWED_PROGRAMS.length, PROGRAM_NAMES.length * PROGRAM_DIRS.length);
  for (const file of ALLOWED_PROGRAMS) {
    const name = file.slice(file.lastIndexOf("/") + 1);
    assert.ok((PROGRAM_NAMES as readonly string[]).includes(name), file);
    assert.ok((PROGRAM_DIRS as readonly string[]).includes(file.slice(0, -name.length - 1)), file);
  }
  // No shell, no interpreter, and no bare name (which would need PATH to start).
  assert.ok(ALLOWED_PROGRAMS.every((f) => f.startsWith("/")));
  assert.ok(!ALLOWED_PROGRAMS.some((f) => /\/(sh|bash|env|deno)$/.test(f)));
});

Deno.test("permissionFlags adds a test's extra programs to --allow-run only", () => {
  const flags = permissionFlags({ dirs: ["/csi"], extraPrograms: ["/tmp/shims/mount"] });
  assert.deepEqual(flags.filter((f) => f.startsWith("--allow-run")), [
    `${RUN_FLAG},/tmp/shims/mount`,
  ]);
  assert.ok(!flags.some((f) => f.startsWith("--allow-read") && f.includes("/tmp/shims")));
  assert.throws(() => permissionFlags({ dirs: ["/csi"], extraPrograms: ["mount"] }), {
    name: "TypeError",
    message: 'Permission program "mount" must be an absolute path without ","',
  });
});

/** A process with `path` as PATH and exactly `files` on disk. */
function lookup(path: string | undefined, files: readonly string[]): ProgramLookup & {
  asked: string[];
} {
  const asked: string[] = [];
  return {
    asked,
    path: () => path,
    exists: (file) => {
      asked.push(file);
      return files.includes(file);
    },
  };
}

Deno.test("defaultProgram: with PATH, the bare name, looked up on PATH when run", () => {
  const l = lookup("/usr/bin:/bin", ["/usr/local/sbin/zfs", "/sbin/zfs"]);
  for (const name of PROGRAM_NAMES) assert.equal(defaultProgram(name, l), name);
  assert.deepEqual(l.asked, [], "no file is looked at");
});

Deno.test("defaultProgram: without PATH, or with an empty one, the first listed file that exists", () => {
  for (const path of [undefined, ""]) {
    // Debian with zfs-fuse or zfsutils-linux, /usr not merged: /sbin and /bin.
    const debian = lookup(path, ["/sbin/zfs", "/sbin/zpool", "/bin/mount", "/bin/umount"]);
    assert.equal(defaultProgram("zfs", debian), "/sbin/zfs");
    assert.equal(defaultProgram("zpool", debian), "/sbin/zpool");
    assert.equal(defaultProgram("mount", debian), "/bin/mount");
    assert.equal(defaultProgram("umount", debian), "/bin/umount");
    // In the order of Debian's default PATH: OpenZFS from source in /usr/local comes first.
    const both = lookup(path, ["/usr/local/sbin/zfs", "/usr/sbin/zfs", "/sbin/zfs"]);
    assert.equal(defaultProgram("zfs", both), "/usr/local/sbin/zfs");
    const merged = lookup(path, ["/usr/sbin/zfs", "/sbin/zfs", "/usr/bin/mount", "/bin/mount"]);
    assert.equal(defaultProgram("zfs", merged), "/usr/sbin/zfs");
    assert.equal(defaultProgram("mount", merged), "/usr/bin/mount");
    assert.deepEqual(merged.asked, [
      "/usr/local/sbin/zfs",
      "/usr/local/bin/zfs",
      "/usr/sbin/zfs",
      "/usr/local/sbin/mount",
      "/usr/local/bin/mount",
      "/usr/sbin/mount",
      "/usr/bin/mount",
    ]);
    // Nowhere: the bare name, which the start-up check then refuses in one line.
    assert.equal(defaultProgram("zpool", lookup(path, [])), "zpool");
  }
});

Deno.test("programRefusal names the program and where the build runs programs from", () => {
  // Unit tests run without --allow-run: every program is refused.
  assert.equal(
    programRefusal("/opt/x/zfs"),
    'this build may not run "/opt/x/zfs": it runs zfs, zpool, mount, umount only from ' +
      `${PROGRAM_DIRS.join(", ")}; install them there, or name one of those paths`,
  );
  assert.match(
    programRefusal("zfs") ?? "",
    /^this build may not run "zfs" \(by name it is looked up on PATH, and there is no PATH or it leads elsewhere\): /,
  );
});

Deno.test("permissionFlags never grants all permissions or unscoped access", () => {
  const flags = permissionFlags({ dirs: [...PRODUCTION_DIRS] });
  for (const f of flags) {
    assert.notEqual(f, "-A");
    assert.notEqual(f, "--allow-all");
    assert.equal(f.startsWith("--allow-all"), false, f);
    if (f.startsWith("--allow-")) assert.ok(f.includes("="), `${f} is not scoped`);
  }
  assert.equal(
    flags.some((f) => f.startsWith("--allow-net") || f.startsWith("--allow-ffi")),
    false,
  );
  assert.ok(flags.includes("--no-prompt"));
});

Deno.test("permissionFlags lists the directories for reading and writing, once each", () => {
  const flags = permissionFlags({ dirs: ["/csi", "/local/csi", "/csi"] });
  assert.deepEqual(flags, [
    RUN_FLAG,
    `--allow-read=/csi,/local/csi,${READ_PROGRAMS}`,
    "--allow-write=/csi,/local/csi",
    `--allow-env=${ALLOWED_ENV.join(",")}`,
    "--allow-sys=statfs,osUptime",
    "--no-prompt",
  ]);
  assert.ok(ALLOWED_ENV.includes("CSI_ENDPOINT"));
});

Deno.test("permissionFlags refuses relative directories and directories with a comma", () => {
  assert.throws(() => permissionFlags({ dirs: ["csi"] }), {
    name: "TypeError",
    message: 'Permission directory "csi" must be an absolute path without ","',
  });
  assert.throws(() => permissionFlags({ dirs: ["/a,/etc"] }), TypeError);
});

Deno.test("runtimeFlags adds the V8 heap settings to the permission flags and nothing else", () => {
  const scope = { dirs: ["/csi", "/local/csi"] };
  assert.deepEqual(runtimeFlags(scope), [...permissionFlags(scope), V8_FLAGS]);
  assert.match(V8_FLAGS, /^--v8-flags=--max-semi-space-size=\d+,--max-old-space-size=\d+$/);
});

Deno.test("permissionFlags allows the store's host:port only, and no network without one", () => {
  assert.ok(!permissionFlags({ dirs: ["/csi"] }).some((f) => f.startsWith("--allow-net")));
  assert.ok(
    !permissionFlags({ dirs: ["/csi"], netHosts: [] }).some((f) => f.startsWith("--allow-net")),
  );
  const flags = permissionFlags({
    dirs: ["/csi"],
    netHosts: ["S3.Example.com", "127.0.0.1:7070", "[::1]:9000", "s3.example.com:443"],
  });
  assert.deepEqual(flags.filter((f) => f.startsWith("--allow-net")), [
    "--allow-net=s3.example.com:443,127.0.0.1:7070,[::1]:9000",
  ]);
});

Deno.test("netHost refuses wildcards, schemes, paths and bad ports", () => {
  assert.equal(netHost("bkt.s3.eu-west-3.amazonaws.com"), "bkt.s3.eu-west-3.amazonaws.com:443");
  for (
    const bad of ["", "*", "*.example.com", "https://h", "h/x", "h:0", "h:65536", "h:", "a,b", "-h"]
  ) {
    assert.throws(() => netHost(bad), {
      name: "TypeError",
      message: `Store host "${bad}" must be host[:port], e.g. s3.example.com:443`,
    });
  }
  assert.throws(() => permissionFlags({ dirs: ["/csi"], netHosts: ["*"] }), TypeError);
});

Deno.test("permissionFlags lets single files be read, never written", () => {
  const flags = permissionFlags({ dirs: ["/csi"], readFiles: ["/secrets/s3.ini", "/csi"] });
  assert.ok(flags.includes(`--allow-read=/csi,/secrets/s3.ini,${READ_PROGRAMS}`));
  assert.ok(flags.includes("--allow-write=/csi"));
  assert.throws(() => permissionFlags({ dirs: ["/csi"], readFiles: ["s3.ini"] }), {
    name: "TypeError",
    message: 'Permission file "s3.ini" must be an absolute path without ","',
  });
});

Deno.test("ALLOWED_ENV holds the S3 key pair and token, and no other AWS variable", () => {
  const aws = ALLOWED_ENV.filter((n) => n.startsWith("AWS_"));
  assert.deepEqual(aws, ["AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN"]);
});

function storeOf(args: string[], files: Record<string, string> = {}): StoreConfig {
  const parsed = parseConfig(
    ["--parent-dataset", "tank/nomad", "--node-id", "n1", ...args],
    { AWS_ACCESS_KEY_ID: "A", AWS_SECRET_ACCESS_KEY: "B" },
    (p) => files[p] ?? "",
  );
  assert.ok(parsed.kind === "run" && parsed.config.store);
  return parsed.config.store;
}

Deno.test("storeGrants names what each store needs and the build variable that adds it", () => {
  const file = storeGrants(storeOf(["--store", "file:///mnt/backup"]));
  assert.deepEqual(file, [{
    descriptors: [{ name: "read", path: "/mnt/backup" }, { name: "write", path: "/mnt/backup" }],
    what: 'read and write the store directory "/mnt/backup"',
    fix: "ZFS_CSI_EXTRA_DIRS=/mnt/backup",
  }]);
  assert.equal(
    grantMessage(file[0]!),
    'this build may not read and write the store directory "/mnt/backup"; rebuild with ' +
      "ZFS_CSI_EXTRA_DIRS=/mnt/backup deno task compile",
  );
  const s3 = storeGrants(storeOf(["--store", "s3://bkt"]));
  assert.deepEqual(s3, [{
    descriptors: [{ name: "net", host: "bkt.s3.us-east-1.amazonaws.com:443" }],
    what: 'connect to the store at "bkt.s3.us-east-1.amazonaws.com:443"',
    fix: "ZFS_CSI_STORE_HOSTS=bkt.s3.us-east-1.amazonaws.com:443",
  }]);
  const withFile = storeGrants(
    storeOf(["--store", "s3://bkt", "--store-credentials-file", "/secrets/s3"], {
      "/secrets/s3": "aws_access_key_id=A\naws_secret_access_key=B\n",
    }),
  );
  assert.deepEqual(withFile[1], {
    descriptors: [{ name: "read", path: "/secrets/s3" }],
    what: 'read the store credentials file "/secrets/s3"',
    fix: "ZFS_CSI_EXTRA_READ_FILES=/secrets/s3",
  });
});

Deno.test("permissionFlags adds metrics listen addresses to the one --allow-net", () => {
  const flags = permissionFlags({
    dirs: ["/csi"],
    netHosts: ["s3.example.com"],
    listen: ["0.0.0.0:9474", "[::]:9474"],
  });
  assert.deepEqual(flags.filter((f) => f.startsWith("--allow-net")), [
    "--allow-net=s3.example.com:443,0.0.0.0:9474,[::]:9474",
  ]);
  assert.equal(listenHost("127.0.0.1:09474"), "127.0.0.1:9474");
  // No default port for a listener: the grant must name exactly what is bound.
  assert.throws(() => listenHost("0.0.0.0"), /Metrics listen address "0\.0\.0\.0"/);
});

Deno.test("metricsGrant asks for the listen address and names ZFS_CSI_METRICS_LISTEN", () => {
  const run = parseConfig(
    ["--parent-dataset", "t/n", "--node-id", "a", "--metrics-listen", "127.0.0.1:9474"],
    {},
  );
  assert.ok(run.kind === "run" && run.config.metricsListen);
  const grant = metricsGrant(run.config.metricsListen);
  assert.deepEqual(grant.descriptors, [{ name: "net", host: "127.0.0.1:9474" }]);
  assert.equal(
    grantMessage(grant),
    'this build may not listen for metrics on "127.0.0.1:9474"; rebuild with ' +
      "ZFS_CSI_METRICS_LISTEN=127.0.0.1:9474 deno task compile",
  );
});

Deno.test("needsFromVariables splits paths on ':' and hosts on ','; variablesOf writes them back", () => {
  assert.deepEqual(needsFromVariables({}), NO_NEEDS);
  const vars = {
    ZFS_CSI_EXTRA_DIRS: "/srv/csi::/mnt/backup",
    ZFS_CSI_STORE_HOSTS: "s3.example.com, [::1]:9000,",
    ZFS_CSI_EXTRA_READ_FILES: "/secrets/s3.ini",
    ZFS_CSI_METRICS_LISTEN: "0.0.0.0:9474, [::1]:9474",
    HOME: "/root",
  };
  const needs = needsFromVariables(vars);
  assert.deepEqual(needs, {
    extraDirs: ["/srv/csi", "/mnt/backup"],
    storeHosts: ["s3.example.com", "[::1]:9000"],
    extraReadFiles: ["/secrets/s3.ini"],
    metricsListen: ["0.0.0.0:9474", "[::1]:9474"],
    blockVolumes: [],
  });
  assert.deepEqual(variablesOf(needs), [
    "ZFS_CSI_EXTRA_DIRS=/srv/csi:/mnt/backup",
    "ZFS_CSI_STORE_HOSTS=s3.example.com,[::1]:9000",
    "ZFS_CSI_EXTRA_READ_FILES=/secrets/s3.ini",
    "ZFS_CSI_METRICS_LISTEN=0.0.0.0:9474,[::1]:9474",
  ]);
  assert.deepEqual(
    needsFromVariables(Object.fromEntries(variablesOf(needs).map((v) => v.split(/=(.*)/s)))),
    needs,
  );
  assert.deepEqual(variablesOf(NO_NEEDS), []);
  assert.deepEqual(
    mergeNeeds(needs, { ...NO_NEEDS, extraDirs: ["/mnt/backup", "/x"] }).extraDirs,
    ["/srv/csi", "/mnt/backup", "/x"],
  );
});

Deno.test("binaryFlags: the production base plus the needs, as runtimeFlags writes them", () => {
  assert.deepEqual(
    binaryFlags(NO_NEEDS),
    runtimeFlags({ dirs: [...PRODUCTION_DIRS], readFiles: [...PRODUCTION_READ_FILES] }),
  );
  const needs = needsFromVariables({
    ZFS_CSI_EXTRA_DIRS: "/mnt/backup",
    ZFS_CSI_STORE_HOSTS: "127.0.0.1:7070",
    ZFS_CSI_EXTRA_READ_FILES: "/secrets/s3.ini",
    ZFS_CSI_METRICS_LISTEN: "127.0.0.1:9474",
  });
  assert.deepEqual(
    binaryFlags(needs),
    runtimeFlags({
      dirs: [...PRODUCTION_DIRS, "/mnt/backup"],
      netHosts: ["127.0.0.1:7070"],
      readFiles: [...PRODUCTION_READ_FILES, "/secrets/s3.ini"],
      listen: ["127.0.0.1:9474"],
    }),
  );
});

function configOf(
  args: string[],
  env: Record<string, string> = {},
  files: Record<string, string> = {},
) {
  const parsed = parseConfig(
    ["--parent-dataset", "tank/nomad", "--node-id", "n1", ...args],
    env,
    (p) => {
      const text = files[p];
      if (text === undefined) throw new Error(`no ${p}`);
      return text;
    },
  );
  assert.ok(parsed.kind === "run");
  return parsed.config;
}

Deno.test("configGrants: the socket's and base directories, then the store and metrics grants", () => {
  const config = configOf([
    "--endpoint",
    "unix:///srv/dev/csi/csi.sock",
    "--stage-publish-base-dir",
    "/srv/dev/csi/base",
    "--store",
    "file:///mnt/backup",
    "--metrics-listen",
    "127.0.0.1:9474",
  ]);
  assert.deepEqual(configGrants(config).map((g) => g.fix), [
    "ZFS_CSI_EXTRA_DIRS=/srv/dev/csi",
    "ZFS_CSI_EXTRA_DIRS=/srv/dev/csi/base",
    "ZFS_CSI_EXTRA_DIRS=/mnt/backup",
    "ZFS_CSI_METRICS_LISTEN=127.0.0.1:9474",
  ]);
  // The plugin refuses with serviceGrants' messages (src/plugin.ts): the same grants.
  assert.deepEqual(serviceGrants(config), configGrants(config).slice(2));
});

Deno.test("grantNeeds: the build variables each refusal names, less what every build has", () => {
  const s3 = configOf(
    [
      "--store",
      "s3://bkt",
      "--store-endpoint",
      "http://127.0.0.1:7070",
      "--store-path-style",
      "--store-credentials-file",
      "/secrets/s3.ini",
    ],
    {},
    { "/secrets/s3.ini": "aws_access_key_id=A\naws_secret_access_key=B\n" },
  );
  // The default socket /csi/csi.sock and base /local/csi are production directories.
  assert.deepEqual(grantNeeds(configGrants(s3)), {
    ...NO_NEEDS,
    storeHosts: ["127.0.0.1:7070"],
    extraReadFiles: ["/secrets/s3.ini"],
  });
  const dev = configOf([
    "--endpoint",
    "unix:///srv/dev/csi/csi.sock",
    "--stage-publish-base-dir",
    "/srv/dev/csi/base",
    "--stage-publish-base-dir",
    "/var/lib/nomad/client/csi/other",
    "--store",
    "file:///srv/dev/csi/store",
    "--metrics-listen",
    "[::1]:9474",
  ]);
  // Below another needed directory or a production one: nothing more.
  assert.deepEqual(grantNeeds(configGrants(dev)), {
    ...NO_NEEDS,
    extraDirs: ["/srv/dev/csi"],
    metricsListen: ["[::1]:9474"],
  });
  // A credentials file inside a needed directory is read through that directory's grant.
  assert.deepEqual(
    grantNeeds([
      ...configGrants(dev),
      { descriptors: [], what: "read x", fix: "ZFS_CSI_EXTRA_READ_FILES=/srv/dev/csi/s3.ini" },
      {
        descriptors: [],
        what: "read y",
        fix: `ZFS_CSI_EXTRA_READ_FILES=${PRODUCTION_READ_FILES[0]}`,
      },
    ]).extraReadFiles,
    [],
  );
  // "/" covers everything; "/srvx" is not below "/srv".
  assert.deepEqual(
    grantNeeds([
      { descriptors: [], what: "a", fix: "ZFS_CSI_EXTRA_DIRS=/srv" },
      { descriptors: [], what: "b", fix: "ZFS_CSI_EXTRA_DIRS=/srvx" },
    ]).extraDirs,
    ["/srv", "/srvx"],
  );
  assert.throws(
    () => grantNeeds([{ descriptors: [], what: "x", fix: "HOME=/root" }]),
    { name: "TypeError", message: 'Grant fix "HOME=/root" is not NAME=value of a build variable' },
  );
});

Deno.test("grantNeeds meets every grant it is given: binaryFlags then allow each descriptor", () => {
  const config = configOf(
    [
      "--endpoint",
      "unix:///srv/dev/csi/csi.sock",
      "--stage-publish-base-dir",
      "/srv/dev/csi/base",
      "--store",
      "s3://bkt/p",
      "--store-endpoint",
      "http://127.0.0.1:7070",
      "--store-path-style",
      "--store-credentials-file",
      "/secrets/s3.ini",
      "--metrics-listen",
      "127.0.0.1:9474",
    ],
    {},
    { "/secrets/s3.ini": "aws_access_key_id=A\naws_secret_access_key=B\n" },
  );
  const flags = binaryFlags(grantNeeds(configGrants(config)));
  const list = (name: string) =>
    (flags.find((f) => f.startsWith(`--allow-${name}=`)) ?? "=").split("=")[1]!.split(",");
  const covers = (paths: string[], p: string) =>
    paths.some((d) => p === d || p.startsWith(d + "/"));
  for (const grant of configGrants(config)) {
    for (const d of grant.descriptors) {
      if (d.name === "read") assert.ok(covers(list("read"), String(d.path)), grant.fix);
      else if (d.name === "write") assert.ok(covers(list("write"), String(d.path)), grant.fix);
      else if (d.name === "net") assert.ok(list("net").includes(String(d.host)), grant.fix);
      else assert.fail(`unexpected descriptor ${d.name}`);
    }
  }
});

Deno.test("a build for block volumes adds exactly the block tools and /dev/zvol; every other build has none", () => {
  const base = binaryFlags(NO_NEEDS);
  const block = binaryFlags(needsFromVariables({ ZFS_CSI_BLOCK_VOLUMES: "on" }));
  const flag = (flags: string[], name: string) =>
    flags.find((f) => f.startsWith(`${name}=`))!.slice(name.length + 1).split(",");
  for (const program of ALLOWED_BLOCK_PROGRAMS) {
    assert.ok(!flag(base, "--allow-run").includes(program), program);
    assert.ok(flag(block, "--allow-run").includes(program), program);
  }
  // OpenZFS's udev helper, where Debian (merged /usr or not) and source builds put it.
  for (const zvolId of ["/lib/udev/zvol_id", "/usr/lib/udev/zvol_id"]) {
    assert.ok(flag(block, "--allow-run").includes(zvolId), zvolId);
  }
  assert.deepEqual([...BLOCK_PROGRAM_NAMES], [
    "lsblk",
    "blkid",
    "wipefs",
    "mkfs.ext4",
    "mkfs.xfs",
    "resize2fs",
    "xfs_growfs",
  ]);
  // Nothing below /dev, in either (Deno asks for --allow-all there; lsblk reads the links).
  assert.ok(!flag(base, "--allow-read").some((p) => p.startsWith("/dev")));
  assert.ok(!flag(block, "--allow-read").some((p) => p.startsWith("/dev")));
  // Nothing else changes: writes, network, env and sys are the base build's; reads add only
  // the tools' files (to find them without PATH).
  const rest = (flags: string[]) =>
    flags.filter((f) => !f.startsWith("--allow-run=") && !f.startsWith("--allow-read="));
  assert.deepEqual(rest(block), rest(base));
  assert.deepEqual(
    flag(block, "--allow-read").filter((p) => !flag(base, "--allow-read").includes(p)),
    [...ALLOWED_BLOCK_PROGRAMS],
  );
  assert.deepEqual(
    flag(block, "--allow-run").filter((p) => !flag(base, "--allow-run").includes(p)),
    [...ALLOWED_BLOCK_PROGRAMS],
  );
});

Deno.test("--block-volumes needs a block build: its grant, its one line and its build variable", () => {
  assert.deepEqual(serviceGrants(configOf([])), []);
  const grants = serviceGrants(configOf(["--block-volumes"]));
  assert.equal(grants.length, 1);
  assert.equal(
    grantMessage(grants[0]!),
    "this build may not run lsblk, blkid, wipefs, mkfs.ext4, mkfs.xfs, resize2fs, xfs_growfs, " +
      "zvol_id (--block-volumes); rebuild with ZFS_CSI_BLOCK_VOLUMES=on deno task compile",
  );
  assert.deepEqual(grantNeeds(grants), { ...NO_NEEDS, blockVolumes: ["on"] });
  assert.deepEqual(variablesOf(grantNeeds(grants)), ["ZFS_CSI_BLOCK_VOLUMES=on"]);
});
