/**
 * The plugin's Deno permissions, defined once. The compile task bakes these flags into the
 * binary; the dev task and the integration tests run the plugin with the very same flags
 * (built for their local directories), so what is tested is what ships.
 */

/** Programs the plugin may start. Nothing else, and never a shell. */
export const ALLOWED_PROGRAMS = ["zfs", "zpool", "mount", "umount"] as const;

/**
 * Environment variables the plugin (and grpc-js, which reads its logging and proxy settings at
 * load time) may read. Every other variable is denied.
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
] as const;

/**
 * Directories a production binary may write: Nomad's default `mount_dir` (the socket) and
 * `stage_publish_base_dir` inside a container task, and the host paths a raw_exec task gets
 * with the two usual Nomad data_dir locations. Operators with another data_dir extend this at
 * compile time with ZFS_CSI_EXTRA_DIRS (see README).
 */
export const PRODUCTION_DIRS = [
  "/csi",
  "/local/csi",
  "/var/lib/nomad/client/csi",
  "/opt/nomad/data/client/csi",
] as const;

/** The directories a build of the plugin may touch. */
export interface PermissionScope {
  /** Where sockets are created and where staging/target paths live. */
  readonly dirs: readonly string[];
}

/** The permission flags for `deno run` / `deno compile`; never -A. */
export function permissionFlags(scope: PermissionScope): string[] {
  const dirs = [...new Set(scope.dirs)];
  for (const d of dirs) {
    if (!d.startsWith("/") || d.includes(",")) {
      throw new TypeError(`Permission directory "${d}" must be an absolute path without ","`);
    }
  }
  return [
    `--allow-run=${ALLOWED_PROGRAMS.join(",")}`,
    // The directories, to check staging and target paths (the mount table comes from `mount`).
    `--allow-read=${dirs.join(",")}`,
    `--allow-write=${dirs.join(",")}`,
    `--allow-env=${ALLOWED_ENV.join(",")}`,
    // statfs(2) for NodeGetVolumeStats.
    "--allow-sys=statfs",
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
