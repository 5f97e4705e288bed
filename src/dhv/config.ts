/**
 * How the host volume plugin finds its flags. Nomad runs it with the operation as the only
 * argument and an environment of `DHV_*` variables, so the operator's flags (the CSI server's
 * own: --parent-dataset, --deleted-retention, --allow-parameter, ...) come from
 *
 * - arguments after the operation, when a wrapper script passes them (`exec zfs-csi "$@" --flag`), or
 * - else the file {@linkcode CONFIG_FILE_NAME} in the plugin directory (`DHV_PLUGIN_DIR`).
 *
 * Either way they go through the server's own resolution (src/config.ts), so a flag means the
 * same in both modes. Never from the volume's parameters: those come from whoever may create a
 * volume, and the parent dataset and the policy are the operator's.
 */

import { type Config, ConfigError, parseConfig, type ReadTextFile } from "../config.ts";
import { DhvError, EXIT_BAD_REQUEST } from "./contract.ts";

/** The config file's name in the plugin directory. */
export const CONFIG_FILE_NAME = "zfs-csi.conf";

/**
 * The flags in a config file: one flag per line, as `--name value`, `--name=value` or a bare
 * `--switch`; blank lines and lines starting with "#" are skipped. A value runs to the end of
 * the line (spaces included, surrounding ones trimmed).
 * @throws {DhvError} EXIT_BAD_REQUEST naming the line that is not a flag
 */
export function parseConfigFile(text: string, path: string): string[] {
  const args: string[] = [];
  const lines = text.split("\n");
  for (const [i, raw] of lines.entries()) {
    const line = raw.trim();
    if (line === "" || line.startsWith("#")) continue;
    if (!line.startsWith("--")) {
      throw new DhvError(
        EXIT_BAD_REQUEST,
        `${path}:${i + 1}: "${line}" is not a flag (write one --flag [value] per line)`,
      );
    }
    const m = /^(\S+)\s+(.*)$/.exec(line);
    if (m) args.push(m[1]!, m[2]!.trim());
    else args.push(line);
  }
  return args;
}

/** Where the flags come from, as {@linkcode resolveHostConfig} reads them. */
export interface HostConfigSources {
  /** Arguments after the operation. */
  readonly flags: readonly string[];
  /** DHV_PLUGIN_DIR; "" when Nomad did not send it. */
  readonly pluginDir: string;
  /** DHV_NODE_ID: the default --node-id (a flag given wins). */
  readonly nodeId: string;
  /** Reads the config file and the files its flags name; throws Deno.errors.NotFound if absent. */
  readonly readTextFile: ReadTextFile;
  /** The store's variables (AWS_*), as the server reads them. */
  readonly env?: Readonly<Record<string, string | undefined>>;
}

/** The resolved config and where it came from (for the log). */
export interface HostConfig {
  readonly config: Config;
  readonly source: string;
}

/**
 * Resolves the plugin's config from its arguments, else its config file.
 * @throws {DhvError} EXIT_BAD_REQUEST when there is none, it cannot be read, or a flag is wrong
 */
export function resolveHostConfig(src: HostConfigSources): HostConfig {
  let flags = [...src.flags];
  let source = "arguments";
  if (flags.length === 0) {
    if (src.pluginDir === "") {
      throw new DhvError(
        EXIT_BAD_REQUEST,
        `No flags: DHV_PLUGIN_DIR is not set, so ${CONFIG_FILE_NAME} cannot be found`,
      );
    }
    const path = `${src.pluginDir}/${CONFIG_FILE_NAME}`;
    let text: string;
    try {
      text = src.readTextFile(path);
    } catch (err) {
      const why = err instanceof Deno.errors.NotFound
        ? "it does not exist"
        : err instanceof Error
        ? err.message
        : String(err);
      throw new DhvError(
        EXIT_BAD_REQUEST,
        `Cannot read the host volume plugin's flags from "${path}": ${why}. Put the server's ` +
          `flags there, one per line (at least --parent-dataset POOL/DATASET)`,
        { cause: err },
      );
    }
    flags = parseConfigFile(text, path);
    source = path;
  }
  // Nomad's node id is the default node id; one given in the flags comes later and wins.
  const nodeArgs = src.nodeId === "" ? [] : ["--node-id", src.nodeId];
  try {
    const parsed = parseConfig([...nodeArgs, ...flags], src.env ?? {}, src.readTextFile);
    if (parsed.kind !== "run") {
      throw new ConfigError(`--help and --version are not host volume plugin flags`);
    }
    return { config: parsed.config, source };
  } catch (err) {
    if (!(err instanceof ConfigError)) throw err;
    throw new DhvError(EXIT_BAD_REQUEST, `Flags from ${source}: ${err.message}`, { cause: err });
  }
}
