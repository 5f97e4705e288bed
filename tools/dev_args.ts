/**
 * What `deno task dev` and `deno task cli` run, kept pure so a test can read it: the dev pool's
 * paths, the plugin's and a subcommand's arguments with the dev defaults, and the permissions of
 * a binary built for those arguments. The needs come from the plugin's own grants
 * (src/permissions.ts configGrants, the ones its refusals name) and from the build variables in
 * the environment; the flags from binaryFlags, the function `deno task compile` bakes in. So a
 * dev run has the permissions of the binary `deno task compile` would build for it, and a
 * refusal that names a build variable is met by setting it for the dev task too.
 */

import { parseArgs } from "node:util";
import { CONFIG_OPTIONS, ConfigError, parseConfig, type ReadTextFile } from "../src/config.ts";
import { SUBCOMMANDS } from "../src/cli/commands.ts";
import {
  binaryFlags,
  type BuildNeeds,
  configGrants,
  grantNeeds,
  mergeNeeds,
  needsFromVariables,
} from "../src/permissions.ts";

type Env = Readonly<Record<string, string | undefined>>;

/** Moves the dev pool's directory (default `.cache/dev` in the checkout). */
export const DEV_DIR_VARIABLE = "ZFS_CSI_DEV_DIR";
/** Names the dev pool (default `zfscsidev`): pool names are the host's, one per name. */
export const DEV_POOL_VARIABLE = "ZFS_CSI_DEV_POOL";
/** The dev plugin's node id. */
export const DEV_NODE_ID = "dev";

/** Where the dev plugin and its pool live. */
export interface DevPaths {
  readonly dir: string;
  /** The pool's backing file (sparse). */
  readonly image: string;
  /** The pool's mountpoint. */
  readonly mountRoot: string;
  readonly pool: string;
  /** The parent dataset, `<pool>/nomad`. */
  readonly parent: string;
  /** The socket's directory, holding the staging and publish base too. */
  readonly csiDir: string;
  readonly socket: string;
  /** The plugin's --stage-publish-base-dir. */
  readonly baseDir: string;
}

/** The dev paths of the checkout at `root`, moved by {@linkcode DEV_DIR_VARIABLE} and
 * {@linkcode DEV_POOL_VARIABLE}. */
export function devPaths(root: string, env: Env): DevPaths {
  const dir = (env[DEV_DIR_VARIABLE] || `${root}/.cache/dev`).replace(/\/+$/, "");
  if (!dir.startsWith("/")) throw new ConfigError(`${DEV_DIR_VARIABLE} must be absolute`);
  const pool = env[DEV_POOL_VARIABLE] || "zfscsidev";
  const csiDir = `${dir}/csi`;
  return {
    dir,
    image: `${dir}/pool.img`,
    mountRoot: `${dir}/zfs`,
    pool,
    parent: `${pool}/nomad`,
    csiDir,
    socket: `${csiDir}/csi.sock`,
    baseDir: `${csiDir}/base`,
  };
}

/** The task's arguments: `deno task dev -- --store X` passes the "--" on, which goes. */
export function taskArgs(args: readonly string[]): string[] {
  return args[0] === "--" ? args.slice(1) : [...args];
}

/** The dev plugin's arguments: its pool, node id, socket and base, then the user's. */
export function devPluginArgs(paths: DevPaths, args: readonly string[]): string[] {
  return [
    "--parent-dataset",
    paths.parent,
    "--node-id",
    DEV_NODE_ID,
    "--endpoint",
    `unix://${paths.socket}`,
    "--stage-publish-base-dir",
    paths.baseDir,
    ...args,
  ];
}

function given(args: readonly string[], flag: string): boolean {
  return args.some((a) => a === `--${flag}` || a.startsWith(`--${flag}=`));
}

/**
 * A subcommand's arguments: aimed at the dev plugin's pool, socket and base directory, unless
 * they name a --parent-dataset (another pool: nothing is added) or the flag itself. `demo`
 * takes only the socket and base; `help`, flags alone and Nomad's host volume operations get
 * nothing.
 */
export function cliArgs(paths: DevPaths, args: readonly string[]): string[] {
  const [name, ...rest] = args;
  if (name === undefined || !Object.hasOwn(SUBCOMMANDS, name) || given(rest, "parent-dataset")) {
    return [...args];
  }
  const defaults: [string, string][] = [
    ["endpoint", `unix://${paths.socket}`],
    ["stage-publish-base-dir", paths.baseDir],
    ...(name === "demo" ? [] : [
      ["parent-dataset", paths.parent],
      ["node-id", DEV_NODE_ID],
    ] satisfies [string, string][]),
  ];
  const added = defaults.filter(([flag]) => !given(rest, flag)).flatMap(([f, v]) => [`--${f}`, v]);
  return [name, ...added, ...rest];
}

/**
 * The plugin's flags among `args`, which may hold a subcommand's own flags and positionals
 * (those are dropped: a subcommand's own flag is read as a switch).
 */
export function pluginFlags(args: readonly string[]): string[] {
  const { tokens } = parseArgs({
    args: [...args],
    options: CONFIG_OPTIONS,
    strict: false,
    allowPositionals: true,
    tokens: true,
  });
  return tokens.flatMap((t) =>
    t.kind === "option" && Object.hasOwn(CONFIG_OPTIONS, t.name)
      ? [`--${t.name}`, ...(t.value === undefined ? [] : [t.value])]
      : []
  );
}

/**
 * What a binary must allow for `args` (the plugin's, or a subcommand's): the build variables in
 * `env`, and the grants of the config the plugin's flags among `args` resolve to (its socket and
 * base directories, store and metrics address). `fallback` stands in for a parent dataset and
 * node id the arguments do not give (`demo` takes none), which grant nothing. Arguments the
 * plugin would refuse add nothing: the plugin then says why itself.
 */
export function runNeeds(
  args: readonly string[],
  env: Env,
  readTextFile: ReadTextFile,
  fallback: DevPaths,
): BuildNeeds {
  const variables = needsFromVariables(env);
  let parsed;
  try {
    parsed = parseConfig(
      ["--parent-dataset", fallback.parent, "--node-id", DEV_NODE_ID, ...pluginFlags(args)],
      env,
      readTextFile,
    );
  } catch (err) {
    if (err instanceof ConfigError) return variables;
    throw err;
  }
  if (parsed.kind !== "run") return variables;
  return mergeNeeds(variables, grantNeeds(configGrants(parsed.config)));
}

/** `deno` arguments that run main.ts with `args` as a binary built for `needs` would. */
export function runArgs(root: string, needs: BuildNeeds, args: readonly string[]): string[] {
  return ["run", "--frozen", "--quiet", ...binaryFlags(needs), `${root}/main.ts`, ...args];
}
