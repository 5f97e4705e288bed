/**
 * What every operator subcommand starts from: its own flags beside the plugin's (resolved by
 * src/config.ts exactly as the server resolves them), and the same zfs, mount and trash modules
 * the server builds, bound to the same parent dataset.
 */

import { parseArgs } from "node:util";
import { type Config, CONFIG_OPTIONS, ConfigError, parseConfig } from "../config.ts";
import { STORE_ENV } from "../config_store.ts";
import { Code, CsiError, ZfsError } from "../errors.ts";
import { KeyedLock } from "../lock.ts";
import { Logger, type LogLevel, type LogSink } from "../log.ts";
import type { Mounter } from "../mount/mounter.ts";
import { grantMessage, type NeededGrant, programRefusal, readFileGrant } from "../permissions.ts";
import { type CommandRunner, DenoCommandRunner } from "../run.ts";
import { mounterFor, zfsFor } from "../system_tools.ts";
import { poolOf } from "../zfs/names.ts";
import type { PropertyMap } from "../zfs/parse.ts";
import type { Zfs } from "../zfs/zfs.ts";

/** A flag of a subcommand's own, as node:util parseArgs takes it. */
export type OwnOption = { readonly type: "string" | "boolean"; readonly multiple?: boolean };

/** A subcommand's command line, split into its own flags, positionals and the plugin's flags. */
export interface SplitArgs {
  readonly own: Readonly<Record<string, string | boolean | string[] | undefined>>;
  readonly positionals: readonly string[];
  /** The plugin's flags as given, for {@linkcode parseConfig}. */
  readonly configArgs: readonly string[];
}

/**
 * Splits a subcommand's arguments (after its name) into its own flags, positionals and the
 * plugin's flags.
 * @throws {ConfigError} for an unknown flag or a flag without its value
 */
export function splitArgs(
  args: readonly string[],
  own: Readonly<Record<string, OwnOption>>,
): SplitArgs {
  for (const name of Object.keys(own)) {
    if (name in CONFIG_OPTIONS) throw new TypeError(`Flag --${name} is the plugin's already`);
  }
  const options = { ...CONFIG_OPTIONS, ...own };
  let parsed;
  try {
    parsed = parseArgs({
      args: [...args],
      options,
      strict: true,
      allowPositionals: true,
      tokens: true,
    });
  } catch (err) {
    throw new ConfigError(flagError(err, Object.keys(options)));
  }
  const ownValues: Record<string, string | boolean | string[] | undefined> = {};
  const configArgs: string[] = [];
  for (const token of parsed.tokens ?? []) {
    if (token.kind !== "option") continue;
    if (token.name in own) {
      const value = token.value ?? true;
      const prev = ownValues[token.name];
      ownValues[token.name] = own[token.name]!.multiple
        ? [...(Array.isArray(prev) ? prev : []), String(value)]
        : value;
    } else {
      configArgs.push(`--${token.name}`, ...(token.value === undefined ? [] : [token.value]));
    }
  }
  return { own: ownValues, positionals: parsed.positionals, configArgs };
}

/** Edits (insert, delete, replace, swap two neighbours) that turn `a` into `b`. */
function distance(a: string, b: string): number {
  const d = Array.from({ length: a.length + 1 }, (_, i) => [i, ...Array(b.length).fill(0)]);
  for (let j = 1; j <= b.length; j++) d[0]![j] = j;
  for (let i = 1; i <= a.length; i++) {
    for (let j = 1; j <= b.length; j++) {
      const cost = a[i - 1] === b[j - 1] ? 0 : 1;
      let v = Math.min(d[i - 1]![j]! + 1, d[i]![j - 1]! + 1, d[i - 1]![j - 1]! + cost);
      if (i > 1 && j > 1 && a[i - 1] === b[j - 2] && a[i - 2] === b[j - 1]) {
        v = Math.min(v, d[i - 2]![j - 2]! + 1);
      }
      d[i]![j] = v;
    }
  }
  return d[a.length]![b.length]!;
}

/** The known flag closest to `given` (a typo of it), or undefined when none is close. */
export function closestFlag(given: string, known: readonly string[]): string | undefined {
  const name = given.replace(/^-+/, "").split("=")[0]!;
  let best: { flag: string; d: number } | undefined;
  for (const flag of known) {
    const d = flag.startsWith(name) && name.length >= 3 ? 1 : distance(name, flag);
    if (d <= Math.max(1, Math.floor(flag.length / 4)) && (!best || d < best.d)) {
      best = { flag, d };
    }
  }
  return best?.flag;
}

/**
 * One line for a command line node:util parseArgs refused: the flag, what is wrong, and the
 * flag meant when it looks like a typo; never the parser's own text.
 */
export function flagError(err: unknown, known: readonly string[]): string {
  const code = (err as { code?: unknown })?.code;
  const message = err instanceof Error ? err.message : String(err);
  const flag = /'(-[^' ]*)/.exec(message)?.[1];
  if (code === "ERR_PARSE_ARGS_UNKNOWN_OPTION" && flag) {
    const near = closestFlag(flag, known);
    return `unknown flag ${flag}` + (near ? `; did you mean --${near}?` : "") + " (see --help)";
  }
  if (code === "ERR_PARSE_ARGS_INVALID_OPTION_VALUE" && flag) {
    return /argument missing/.test(message)
      ? `flag ${flag} needs a value (see --help)`
      : `flag ${flag} takes no value (see --help)`;
  }
  return `${message} (see --help)`;
}

/** An environment variable, or undefined where this build may not read it. */
function readEnv(name: string): string | undefined {
  if (Deno.permissions.querySync({ name: "env", variable: name }).state !== "granted") {
    return undefined;
  }
  return Deno.env.get(name);
}

/** Throws the one line that says which build variable grants `grant`, if it is not granted. */
export function requireGrant(grant: NeededGrant): void {
  if (grant.descriptors.some((d) => Deno.permissions.querySync(d).state !== "granted")) {
    throw new ConfigError(grantMessage(grant));
  }
}

function readTextFile(path: string): string {
  requireGrant(readFileGrant(path, "the file"));
  return Deno.readTextFileSync(path);
}

/**
 * The plugin's config from the plugin's flags and environment, as the server reads them.
 * @throws {ConfigError} as the server would
 */
export function resolveConfig(configArgs: readonly string[]): Config {
  const env = Object.fromEntries(["CSI_ENDPOINT", ...STORE_ENV].map((n) => [n, readEnv(n)]));
  const parsed = parseConfig(configArgs, env, readTextFile);
  if (parsed.kind !== "run") throw new ConfigError("--help and --version are not subcommands");
  return parsed.config;
}

/**
 * The parent dataset's tree (`zfs get -r -d depth`), saying plainly when the parent or its pool
 * does not exist: zfs's "does not exist" of the parent is believed once zfs answers about its
 * pool; the hedge that ZFS may not see the pool stays only for a zfs that could not answer.
 * @throws {CsiError} NOT_FOUND naming the parent (and pool) that does not exist
 */
export async function readParentTree(
  tools: Tools,
  depth: number,
  props: readonly string[],
): Promise<Map<string, PropertyMap>> {
  const parent = tools.config.parentDataset;
  try {
    return await tools.zfs.getTree(parent, depth, props) ?? new Map();
  } catch (err) {
    const said = err instanceof ZfsError && err.kind === "unavailable" &&
        err.cause instanceof ZfsError && err.cause.kind === "not_found"
      ? err.cause
      : undefined;
    if (!said) throw err;
    const pool = poolOf(parent);
    let poolThere: boolean;
    try {
      poolThere = pool !== parent && (await tools.zfs.getProperties(pool, ["type"])) !== undefined;
    } catch {
      // zfs could not answer about the pool either: keep the hedge.
      throw err;
    }
    const zfsSaid = said.stderr.trim().split("\n")[0];
    throw new CsiError(
      Code.NOT_FOUND,
      poolThere
        ? `Parent dataset "${parent}" does not exist (zfs said: ${zfsSaid}): give ` +
          `--parent-dataset as the plugin has it, or create it with "zfs create -p ${parent}"`
        : `Parent dataset "${parent}" does not exist: zfs knows no pool "${pool}" (zfs said: ` +
          `${zfsSaid}); import it (zpool import ${pool}), or give --parent-dataset as the ` +
          `plugin has it`,
      { cause: err },
    );
  }
}

/**
 * Checks that the parent dataset exists, saying plainly when it or its pool does not (see
 * {@linkcode readParentTree}): for subcommands whose first zfs call is below the parent.
 * @throws {CsiError} NOT_FOUND naming the parent (and pool) that does not exist
 */
export async function requireParent(tools: Tools): Promise<void> {
  await readParentTree(tools, 1, ["type"]);
}

/** The modules a subcommand works with, built like the server's. */
export interface Tools {
  readonly config: Config;
  readonly zfs: Zfs;
  readonly mounter: Mounter;
  readonly locks: KeyedLock;
  readonly log: Logger;
  readonly runner: CommandRunner;
}

/** Options of {@linkcode buildTools}. */
export interface ToolOptions {
  /** The subprocess seam; the real one by default. */
  readonly runner?: CommandRunner;
  /** Where log lines go (stderr by default), and from which level (the config's by default). */
  readonly sink?: LogSink;
  readonly level?: LogLevel;
}

/** zfs, mount and locks for `config`, with "does not exist" below the parent checked as the server does. */
export function buildTools(config: Config, opts: ToolOptions = {}): Tools {
  const runner = opts.runner ?? new DenoCommandRunner(config.commandTimeoutMs);
  const log = new Logger(opts.level ?? config.logLevel, { cli: true }, opts.sink);
  const zfs = zfsFor(config, runner, log);
  const mounter = mounterFor(config, runner, log);
  return { config, zfs, mounter, locks: new KeyedLock(), log, runner };
}

/**
 * Refuses, in one line, a build that may not run the programs `config` names (the server's
 * check, src/plugin.ts, for what a subcommand runs).
 * @throws {ConfigError} naming the program
 */
export function checkPrograms(programs: readonly string[]): void {
  for (const command of programs) {
    const refused = programRefusal(command);
    if (refused !== undefined) throw new ConfigError(refused);
  }
}
