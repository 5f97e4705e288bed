/**
 * The plugin's Deno permissions, defined once. The compile task bakes these flags into the
 * binary; the dev task and the integration tests run the plugin with the very same flags
 * (built for their local directories), so what is tested is what ships.
 */

import type { Config } from "./config.ts";
import type { StoreConfig } from "./config_store.ts";
import { DHV_ENV } from "./host_volume_env.ts";
import { type ListenAddress, parseListenAddress } from "./listen_address.ts";

/** The programs the plugin starts, by name. Nothing else, and never a shell. */
export const PROGRAM_NAMES = ["zfs", "zpool", "mount", "umount"] as const;

/** One of {@linkcode PROGRAM_NAMES}. */
export type ProgramName = typeof PROGRAM_NAMES[number];

/**
 * Where those programs live: Debian's zfsutils-linux (/sbin, /usr/sbin once /usr is merged),
 * zfs-fuse (/sbin), util-linux's mount (/bin, /usr/bin), OpenZFS built from source (/usr/local/sbin).
 * In the order of Debian's default PATH, so a plugin started without PATH (Nomad runs host volume
 * plugins so) finds what a root shell would. Every directory is listed, merged or not: Deno
 * compares the path a name resolves to with the list as written, without following a symlinked
 * /sbin to /usr/sbin.
 */
export const PROGRAM_DIRS = [
  "/usr/local/sbin",
  "/usr/local/bin",
  "/usr/sbin",
  "/usr/bin",
  "/sbin",
  "/bin",
] as const;

/**
 * The files the plugin may run (--allow-run): each program in each of {@linkcode PROGRAM_DIRS},
 * as absolute paths, which Deno accepts without PATH (entries need not exist). A bare name is
 * resolved on PATH when it is run and allowed only if it lands on one of these files.
 */
export const ALLOWED_PROGRAMS: readonly string[] = Object.freeze(
  PROGRAM_NAMES.flatMap((name) => PROGRAM_DIRS.map((dir) => `${dir}/${name}`)),
);

/**
 * The block tools a node runs for zvol volumes (src/block/), only in a build for them
 * (ZFS_CSI_BLOCK_VOLUMES) and only with --block-volumes: lsblk (where /dev/zvol/<dataset>
 * leads: Deno lets no narrow build read below /dev), blkid, wipefs, mkfs and the grows.
 */
export const BLOCK_PROGRAM_NAMES = [
  "lsblk",
  "blkid",
  "wipefs",
  "mkfs.ext4",
  "mkfs.xfs",
  "resize2fs",
  "xfs_growfs",
] as const;

/** One of {@linkcode BLOCK_PROGRAM_NAMES}. */
export type BlockProgramName = typeof BLOCK_PROGRAM_NAMES[number];

/**
 * OpenZFS's udev helper that names the dataset of a zvol device (the kernel's answer, by ioctl):
 * what udev itself runs to make /dev/zvol/<dataset>. It lives in udev's directory, not on PATH.
 */
export const ZVOL_ID_PROGRAMS = ["/lib/udev/zvol_id", "/usr/lib/udev/zvol_id"] as const;

/**
 * The files of the block tools in each of {@linkcode PROGRAM_DIRS}, as absolute paths, and
 * {@linkcode ZVOL_ID_PROGRAMS}.
 */
export const ALLOWED_BLOCK_PROGRAMS: readonly string[] = Object.freeze([
  ...BLOCK_PROGRAM_NAMES.flatMap((name) => PROGRAM_DIRS.map((dir) => `${dir}/${name}`)),
  ...ZVOL_ID_PROGRAMS,
]);

/** How {@linkcode defaultProgram} sees the process: its PATH and which files exist. */
export interface ProgramLookup {
  /** PATH, or undefined where it is unset (or this build may not read it). */
  readonly path: () => string | undefined;
  /** Whether `file` exists (false where this build may not look). */
  readonly exists: (file: string) => boolean;
}

/** The process's own PATH and files, through the build's grants. */
export const PROCESS_LOOKUP: ProgramLookup = {
  path: () =>
    Deno.permissions.querySync({ name: "env", variable: "PATH" }).state === "granted"
      ? Deno.env.get("PATH")
      : undefined,
  exists: (file) => {
    if (Deno.permissions.querySync({ name: "read", path: file }).state !== "granted") return false;
    try {
      return Deno.statSync(file).isFile;
    } catch {
      return false;
    }
  },
};

/**
 * The program to run for `name` when no flag names one: the bare name where PATH is set (found
 * on PATH when run, as a shell would); without PATH, or with an empty one, the first of
 * {@linkcode ALLOWED_PROGRAMS} that exists, else the bare name (refused at start in one line).
 */
export function defaultProgram(
  name: ProgramName | BlockProgramName,
  lookup: ProgramLookup = PROCESS_LOOKUP,
): string {
  if ((lookup.path() ?? "") !== "") return name;
  return PROGRAM_DIRS.map((dir) => `${dir}/${name}`).find((file) => lookup.exists(file)) ?? name;
}

/**
 * Why this build may not run `command` (a path, or a name as PATH resolves it), or undefined
 * where it may: the one line the server, the CLI and the host volume mode refuse to start with.
 */
export function programRefusal(command: string): string | undefined {
  if (Deno.permissions.querySync({ name: "run", command }).state === "granted") return undefined;
  const where = command.includes("/")
    ? ""
    : " (by name it is looked up on PATH, and there is no PATH or it leads elsewhere)";
  return `this build may not run "${command}"${where}: it runs ${PROGRAM_NAMES.join(", ")} ` +
    `only from ${PROGRAM_DIRS.join(", ")}; install them there, or name one of those paths`;
}

/**
 * Environment variables the plugin (and grpc-js, which reads its logging and proxy settings at
 * load time) may read. Every other variable is denied. Of AWS's variables only the S3 key pair
 * and session token: AWS_PROFILE, AWS_SHARED_CREDENTIALS_FILE, AWS_CONFIG_FILE,
 * AWS_WEB_IDENTITY_TOKEN_FILE and AWS_CONTAINER_CREDENTIALS_* would send the plugin to files or
 * credential endpoints outside its grants, and AWS_REGION or AWS_ENDPOINT_URL would let the
 * environment move the store away from the host the build may reach (those are flags).
 */
export const ALLOWED_ENV = [
  "CSI_ENDPOINT",
  "GRPC_NODE_TRACE",
  "GRPC_NODE_VERBOSITY",
  "GRPC_TRACE",
  "GRPC_VERBOSITY",
  "GRPC_NODE_USE_ALTERNATIVE_RESOLVER",
  "GRPC_EXPERIMENTAL_ENABLE_OUTLIER_DETECTION",
  "GRPC_DEFAULT_SSL_ROOTS_FILE_PATH",
  "GRPC_SSL_CIPHER_SUITES",
  "GRPC_NODE_DEBUG_SEND_ERROR_DETAILS",
  "grpc_proxy",
  "https_proxy",
  "http_proxy",
  "no_grpc_proxy",
  "no_proxy",
  "AWS_ACCESS_KEY_ID",
  "AWS_SECRET_ACCESS_KEY",
  "AWS_SESSION_TOKEN",
  // Only to tell whether there is one (defaultProgram). Setting it cannot widen what runs: a name
  // is allowed only where it resolves to one of ALLOWED_PROGRAMS.
  "PATH",
  // Read by Deno's node:child_process when it starts a command (src/run.ts hands `zfs send` and
  // `zfs receive` a file that way); the command's environment is still only LC_ALL and LANG.
  "NODE_V8_COVERAGE",
  // Nomad's dynamic host volume contract: what a host volume call is.
  ...DHV_ENV,
] as const;

/**
 * Directories a production binary may write: Nomad's default `mount_dir` (the socket) and
 * `stage_publish_base_dir` inside a container task, and the host paths a raw_exec task gets
 * with the two usual Nomad data_dir locations. Operators with another data_dir extend this at
 * compile time with ZFS_CSI_EXTRA_DIRS (see docs/security.md, "Permissions of the binary").
 */
export const PRODUCTION_DIRS = [
  "/csi",
  "/local/csi",
  "/var/lib/nomad/client/csi",
  "/opt/nomad/data/client/csi",
] as const;

/**
 * Single files a production binary may read: the host volume plugin's config file
 * (src/dhv/config.ts) in Nomad's default `host_volume_plugin_dir` for the two usual data_dir
 * locations. Only the file, not the directory. Another plugin dir: ZFS_CSI_EXTRA_READ_FILES.
 */
export const PRODUCTION_READ_FILES = [
  "/opt/nomad/data/host_volume_plugins/zfs-csi.conf",
  "/var/lib/nomad/host_volume_plugins/zfs-csi.conf",
] as const;

/** What a build of the plugin may touch. */
export interface PermissionScope {
  /** Where sockets are created, staging/target paths live, and a file store's directory. */
  readonly dirs: readonly string[];
  /** host:port the plugin may connect to (the store's); none: no network at all. */
  readonly netHosts?: readonly string[];
  /** host:port the metrics endpoint may listen on (ZFS_CSI_METRICS_LISTEN); a port is required. */
  readonly listen?: readonly string[];
  /** Single files it may read, such as a store credentials file outside `dirs`. */
  readonly readFiles?: readonly string[];
  /**
   * A build for zvol volumes: the block tools ({@linkcode ALLOWED_BLOCK_PROGRAMS}) may run (and
   * their files be looked for). Nothing below /dev is granted: Deno asks for --allow-all there.
   */
  readonly blockVolumes?: boolean;
  /**
   * Programs besides {@linkcode ALLOWED_PROGRAMS}, for tests only (a shim on PATH): the compile
   * task never sets it, so a shipped build runs exactly the listed files.
   */
  readonly extraPrograms?: readonly string[];
}

const LABEL = "[a-z0-9]([-a-z0-9]*[a-z0-9])?";
const HOST_PORT = new RegExp(`^(${LABEL}(\\.${LABEL})*|\\[[0-9a-f:.]+\\])(?<port>:\\d{1,5})?$`);

/**
 * A store host for --allow-net as host:port: lower-cased, with ":443" when no port is given
 * (a bare host would allow every port). No wildcards, no scheme.
 * @throws {TypeError} naming the value
 */
export function netHost(value: string): string {
  const host = value.toLowerCase();
  const m = HOST_PORT.exec(host);
  const given = m?.groups?.port;
  const port = given === undefined ? 443 : Number(given.slice(1));
  if (!m || port < 1 || port > 65535) {
    throw new TypeError(`Store host "${value}" must be host[:port], e.g. s3.example.com:443`);
  }
  return given === undefined ? `${host}:443` : host;
}

function absolute(kind: string, paths: readonly string[]): string[] {
  for (const p of paths) {
    if (!p.startsWith("/") || p.includes(",")) {
      throw new TypeError(`Permission ${kind} "${p}" must be an absolute path without ","`);
    }
  }
  return [...new Set(paths)];
}

/** The permission flags for `deno run` / `deno compile`; never -A, never a bare --allow-net. */
export function permissionFlags(scope: PermissionScope): string[] {
  const dirs = absolute("directory", scope.dirs);
  const files = absolute("file", scope.readFiles ?? []).filter((f) => !dirs.includes(f));
  const block = scope.blockVolumes === true;
  const programs = absolute("program", [
    ...ALLOWED_PROGRAMS,
    ...(block ? ALLOWED_BLOCK_PROGRAMS : []),
    ...scope.extraPrograms ?? [],
  ]);
  const hosts = [
    ...new Set([
      ...(scope.netHosts ?? []).map(netHost),
      ...(scope.listen ?? []).map((l) => listenHost(l)),
    ]),
  ];
  return [
    `--allow-run=${programs.join(",")}`,
    // The directories, to check staging and target paths (the mount table comes from `mount`);
    // the program files, only to see which exist when there is no PATH (defaultProgram).
    `--allow-read=${
      [
        ...dirs,
        ...files,
        ...ALLOWED_PROGRAMS,
        ...(block ? ALLOWED_BLOCK_PROGRAMS : []),
      ].join(",")
    }`,
    `--allow-write=${dirs.join(",")}`,
    // Only the store's host:port and the metrics address, and only when there is one.
    ...(hosts.length > 0 ? [`--allow-net=${hosts.join(",")}`] : []),
    `--allow-env=${ALLOWED_ENV.join(",")}`,
    // statfs(2) for NodeGetVolumeStats; the kernel's uptime, the one clock every process of the
    // machine shares, to tell an interrupted `zfs-csi verify`'s scratch dataset (cli/scratch.ts).
    "--allow-sys=statfs,osUptime",
    "--no-prompt",
  ];
}

/**
 * V8 heap settings: a small young generation (the plugin's garbage dies young, and a large one
 * only raises RSS) and a cap on the old generation far above the plugin's live heap (about
 * 14 MiB), so memory stays bounded on a busy node. See bench/startup.ts and bench/live_heap.ts.
 */
export const V8_FLAGS = "--v8-flags=--max-semi-space-size=1,--max-old-space-size=128";

/** Everything `deno run` / `deno compile` needs besides the script: permissions and V8 flags. */
export function runtimeFlags(scope: PermissionScope): string[] {
  return [...permissionFlags(scope), V8_FLAGS];
}

/**
 * The build variables that widen a build beyond {@linkcode PRODUCTION_DIRS} and
 * {@linkcode PRODUCTION_READ_FILES}: `deno task compile` reads them from its environment, and
 * `deno task dev` and `deno task cli` take them too. Paths are colon-separated, hosts and
 * listen addresses comma-separated (an IPv6 host has colons).
 */
export const BUILD_VARIABLES = {
  extraDirs: { name: "ZFS_CSI_EXTRA_DIRS", separator: ":" },
  storeHosts: { name: "ZFS_CSI_STORE_HOSTS", separator: "," },
  extraReadFiles: { name: "ZFS_CSI_EXTRA_READ_FILES", separator: ":" },
  metricsListen: { name: "ZFS_CSI_METRICS_LISTEN", separator: "," },
  blockVolumes: { name: "ZFS_CSI_BLOCK_VOLUMES", separator: "," },
} as const;

/** The value of ZFS_CSI_BLOCK_VOLUMES that builds for zvol volumes (any non-empty one does). */
export const BLOCK_VOLUMES_ON = "on";

/** What a build may do beyond every build's base: the build variables' values, as lists. */
export interface BuildNeeds {
  /** Directories to read and write (ZFS_CSI_EXTRA_DIRS): another data_dir, a file store. */
  readonly extraDirs: readonly string[];
  /** host[:port] of the store (ZFS_CSI_STORE_HOSTS); none: no network to a store. */
  readonly storeHosts: readonly string[];
  /** Single files to read (ZFS_CSI_EXTRA_READ_FILES), e.g. a store credentials file. */
  readonly extraReadFiles: readonly string[];
  /** host:port the metrics endpoint may listen on (ZFS_CSI_METRICS_LISTEN); none: no endpoint. */
  readonly metricsListen: readonly string[];
  /** ZFS_CSI_BLOCK_VOLUMES (e.g. "on"): the block tools and /dev/zvol; empty: none of them. */
  readonly blockVolumes: readonly string[];
}

const NEED_KEYS: readonly (keyof BuildNeeds)[] = [
  "extraDirs",
  "storeHosts",
  "extraReadFiles",
  "metricsListen",
  "blockVolumes",
];

/** Needs with each list made by `list`. */
function needsBy(list: (key: keyof BuildNeeds) => readonly string[]): BuildNeeds {
  return {
    extraDirs: list("extraDirs"),
    storeHosts: list("storeHosts"),
    extraReadFiles: list("extraReadFiles"),
    metricsListen: list("metricsListen"),
    blockVolumes: list("blockVolumes"),
  };
}

/** A build that needs nothing beyond the base. */
export const NO_NEEDS: BuildNeeds = Object.freeze({
  extraDirs: [],
  storeHosts: [],
  extraReadFiles: [],
  metricsListen: [],
  blockVolumes: [],
});

/** The build variables' values by name, as an environment holds them. */
export type BuildVariables = Readonly<Record<string, string | undefined>>;

/** {@linkcode BuildNeeds} from the build variables; empty items are dropped. */
export function needsFromVariables(vars: BuildVariables): BuildNeeds {
  return needsBy((key) => {
    const { name, separator } = BUILD_VARIABLES[key];
    return (vars[name] ?? "").split(separator).map((s) => s.trim()).filter((s) => s !== "");
  });
}

/** The build variables that give `needs`, as `NAME=value` words (none for an empty list). */
export function variablesOf(needs: BuildNeeds): string[] {
  return NEED_KEYS.filter((key) => needs[key].length > 0).map((key) =>
    `${BUILD_VARIABLES[key].name}=${needs[key].join(BUILD_VARIABLES[key].separator)}`
  );
}

/** Both lists of needs, each item once, in order. */
export function mergeNeeds(a: BuildNeeds, b: BuildNeeds): BuildNeeds {
  return needsBy((key) => [...new Set([...a[key], ...b[key]])]);
}

/**
 * The permission flags and V8 settings of a binary built for `needs`: the one function from what
 * the binary needs to its flags. `deno task compile` bakes these in; `deno task dev` and
 * `deno task cli` run main.ts with them for the needs their own arguments imply.
 */
export function binaryFlags(needs: BuildNeeds): string[] {
  return runtimeFlags({
    dirs: [...PRODUCTION_DIRS, ...needs.extraDirs],
    netHosts: needs.storeHosts,
    readFiles: [...PRODUCTION_READ_FILES, ...needs.extraReadFiles],
    listen: needs.metricsListen,
    blockVolumes: needs.blockVolumes.length > 0,
  });
}

/** Permissions the config needs from the build, and the build variable that adds them. */
export interface NeededGrant {
  readonly descriptors: readonly Deno.PermissionDescriptor[];
  /** What the build may not do without it, e.g. `connect to the store at "h:443"`. */
  readonly what: string;
  /** The build variable to set, e.g. `ZFS_CSI_STORE_HOSTS=h:443`. */
  readonly fix: string;
}

/** Reading one file outside the build's directories: ZFS_CSI_EXTRA_READ_FILES. */
export function readFileGrant(path: string, what: string): NeededGrant {
  return {
    descriptors: [{ name: "read", path }],
    what: `read ${what} "${path}"`,
    fix: `ZFS_CSI_EXTRA_READ_FILES=${path}`,
  };
}

/** What a store needs: its directory read and written, or its host and credentials file. */
export function storeGrants(store: StoreConfig): NeededGrant[] {
  if (store.kind === "file") {
    return [{
      descriptors: [{ name: "read", path: store.dir }, { name: "write", path: store.dir }],
      what: `read and write the store directory "${store.dir}"`,
      fix: `ZFS_CSI_EXTRA_DIRS=${store.dir}`,
    }];
  }
  return [
    {
      descriptors: [{ name: "net", host: store.netHost }],
      what: `connect to the store at "${store.netHost}"`,
      fix: `ZFS_CSI_STORE_HOSTS=${store.netHost}`,
    },
    ...(store.credentialsFile === undefined
      ? []
      : [readFileGrant(store.credentialsFile, "the store credentials file")]),
  ];
}

/**
 * A metrics listen address for --allow-net, as host:port (the port is required).
 * @throws {TypeError} naming the value
 */
export function listenHost(value: string): string {
  try {
    return parseListenAddress(value).hostPort;
  } catch (err) {
    throw new TypeError(`Metrics listen address ${(err as Error).message}`);
  }
}

/** What the metrics endpoint needs: to listen on its address. */
export function metricsGrant(listen: ListenAddress): NeededGrant {
  return {
    descriptors: [{ name: "net", host: listen.hostPort }],
    what: `listen for metrics on "${listen.hostPort}"`,
    fix: `ZFS_CSI_METRICS_LISTEN=${listen.hostPort}`,
  };
}

/** What --block-volumes needs: the block tools. */
export function blockVolumesGrant(): NeededGrant {
  return {
    descriptors: ALLOWED_BLOCK_PROGRAMS.map((command) => ({ name: "run" as const, command })),
    what: `run ${[...BLOCK_PROGRAM_NAMES, "zvol_id"].join(", ")} (--block-volumes)`,
    fix: `${BUILD_VARIABLES.blockVolumes.name}=${BLOCK_VOLUMES_ON}`,
  };
}

/** What the store, the metrics endpoint and block volumes a config names need from the build. */
export function serviceGrants(config: Config): NeededGrant[] {
  return [
    ...(config.store ? storeGrants(config.store) : []),
    ...(config.metricsListen ? [metricsGrant(config.metricsListen)] : []),
    ...(config.blockVolumes ? [blockVolumesGrant()] : []),
  ];
}

/** Reading and writing one directory: ZFS_CSI_EXTRA_DIRS. */
export function dirGrant(path: string, what: string): NeededGrant {
  return {
    descriptors: [{ name: "read", path }, { name: "write", path }],
    what: `read and write ${what} "${path}"`,
    fix: `ZFS_CSI_EXTRA_DIRS=${path}`,
  };
}

/**
 * Everything a config needs from the build: the socket's directory, the staging and publish
 * base directories, and {@linkcode serviceGrants}.
 */
export function configGrants(config: Config): NeededGrant[] {
  const socketDir = config.socketPath.slice(0, config.socketPath.lastIndexOf("/")) || "/";
  return [
    dirGrant(socketDir, "the socket's directory"),
    ...config.stagePublishDirs.map((dir) => dirGrant(dir, "the staging and publish directory")),
    ...serviceGrants(config),
  ];
}

/** Whether `path` is `dir` or lies below it (what a Deno path grant for `dir` covers). */
function within(path: string, dir: string): boolean {
  return path === dir || path.startsWith(dir === "/" ? "/" : `${dir}/`);
}

/**
 * The build variables that meet `grants`, as {@linkcode BuildNeeds}: each grant's fix
 * (`NAME=value`), less what every build has (a path within {@linkcode PRODUCTION_DIRS}, one of
 * {@linkcode PRODUCTION_READ_FILES}) and paths within another needed directory. The needs a
 * refusal names are exactly those that meet it.
 * @throws {TypeError} for a fix that is not one of {@linkcode BUILD_VARIABLES}
 */
export function grantNeeds(grants: readonly NeededGrant[]): BuildNeeds {
  const byName = new Map<string, keyof BuildNeeds>(
    NEED_KEYS.map((key) => [BUILD_VARIABLES[key].name, key]),
  );
  const lists: Record<keyof BuildNeeds, string[]> = {
    extraDirs: [],
    storeHosts: [],
    extraReadFiles: [],
    metricsListen: [],
    blockVolumes: [],
  };
  for (const grant of grants) {
    const eq = grant.fix.indexOf("=");
    const key = byName.get(grant.fix.slice(0, eq));
    if (eq < 0 || key === undefined) {
      throw new TypeError(`Grant fix "${grant.fix}" is not NAME=value of a build variable`);
    }
    lists[key].push(grant.fix.slice(eq + 1));
  }
  const dirs = [...new Set(lists.extraDirs)].filter((d) =>
    !PRODUCTION_DIRS.some((p) => within(d, p))
  );
  const neededDirs = dirs.filter((d) => !dirs.some((o) => o !== d && within(d, o)));
  const allDirs = [...PRODUCTION_DIRS, ...neededDirs];
  return {
    extraDirs: neededDirs,
    storeHosts: [...new Set(lists.storeHosts)],
    extraReadFiles: [...new Set(lists.extraReadFiles)].filter((f) =>
      !(PRODUCTION_READ_FILES as readonly string[]).includes(f) &&
      !allDirs.some((d) => within(f, d))
    ),
    metricsListen: [...new Set(lists.metricsListen)],
    blockVolumes: [...new Set(lists.blockVolumes)],
  };
}

/** The one line an unmet grant is refused with. */
export function grantMessage(grant: NeededGrant): string {
  return `this build may not ${grant.what}; rebuild with ${grant.fix} deno task compile`;
}
