/** The exact `deno compile` arguments of the release binary; kept pure so a test can read them. */

import { PRODUCTION_DIRS, PRODUCTION_READ_FILES, runtimeFlags } from "../src/permissions.ts";

/** What varies between builds. */
export interface CompileOptions {
  /** More directories to read and write (ZFS_CSI_EXTRA_DIRS), e.g. a file store's. */
  readonly extraDirs: readonly string[];
  /** host[:port] of the store (ZFS_CSI_STORE_HOSTS); none: the binary has no network. */
  readonly storeHosts?: readonly string[];
  /** Single files to read (ZFS_CSI_EXTRA_READ_FILES), e.g. a store credentials file. */
  readonly extraReadFiles?: readonly string[];
  /** host:port the metrics endpoint may listen on (ZFS_CSI_METRICS_LISTEN); none: no endpoint. */
  readonly metricsListen?: readonly string[];
  readonly output: string;
  readonly target?: string;
}

/** Build variables as the compile task reads them from its environment. */
export interface BuildVariables {
  readonly ZFS_CSI_EXTRA_DIRS?: string | undefined;
  readonly ZFS_CSI_STORE_HOSTS?: string | undefined;
  readonly ZFS_CSI_EXTRA_READ_FILES?: string | undefined;
  readonly ZFS_CSI_METRICS_LISTEN?: string | undefined;
}

/**
 * The permission parts of {@linkcode CompileOptions} from the build variables: paths are
 * colon-separated, hosts and listen addresses comma-separated (an IPv6 host has colons).
 */
export function fromBuildVariables(
  vars: BuildVariables,
): Pick<CompileOptions, "extraDirs" | "storeHosts" | "extraReadFiles" | "metricsListen"> {
  const list = (v: string | undefined, sep: string) =>
    (v ?? "").split(sep).map((s) => s.trim()).filter((s) => s !== "");
  return {
    extraDirs: list(vars.ZFS_CSI_EXTRA_DIRS, ":"),
    storeHosts: list(vars.ZFS_CSI_STORE_HOSTS, ","),
    extraReadFiles: list(vars.ZFS_CSI_EXTRA_READ_FILES, ":"),
    metricsListen: list(vars.ZFS_CSI_METRICS_LISTEN, ","),
  };
}

/**
 * Arguments after `deno`. The CSI descriptor (src/grpc/csi_descriptor.json) is a JSON import
 * and the store and metrics modules are imported by literal specifiers, so all are in the graph.
 */
export function compileArgs(opts: CompileOptions): string[] {
  return [
    "compile",
    "--frozen",
    ...runtimeFlags({
      dirs: [...PRODUCTION_DIRS, ...opts.extraDirs],
      netHosts: opts.storeHosts ?? [],
      readFiles: [...PRODUCTION_READ_FILES, ...opts.extraReadFiles ?? []],
      listen: opts.metricsListen ?? [],
    }),
    ...(opts.target ? ["--target", opts.target] : []),
    "--output",
    opts.output,
    "main.ts",
  ];
}
