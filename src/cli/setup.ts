/**
 * What every operator subcommand starts from: its own flags beside the plugin's (resolved by
 * src/config.ts exactly as the server resolves them), and the same zfs, mount and trash modules
 * the server builds, bound to the same parent dataset.
 */

import { parseArgs } from "node:util";
import { type Config, CONFIG_OPTIONS, ConfigError, parseConfig } from "../config.ts";
import { STORE_ENV } from "../config_store.ts";
import { KeyedLock } from "../lock.ts";
import { Logger, type LogLevel, type LogSink } from "../log.ts";
import type { Mounter } from "../mount/mounter.ts";
import { grantMessage, type NeededGrant, programRefusal, readFileGrant } from "../permissions.ts";
import { type CommandRunner, DenoCommandRunner } from "../run.ts";
import { mounterFor, zfsFor } from "../system_tools.ts";
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
  let parsed;
  try {
    parsed = parseArgs({
      args: [...args],
      options: { ...CONFIG_OPTIONS, ...own },
      strict: true,
      allowPositionals: true,
      tokens: true,
    });
  } catch (err) {
    throw new ConfigError(`${err instanceof Error ? err.message : String(err)} (see --help)`);
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
