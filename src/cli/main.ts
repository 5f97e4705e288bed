/**
 * `zfs-csi <subcommand> …`: the operator's command line. main.ts sends here any first argument
 * that is not a flag (and not one of Nomad's host volume operations); the table of subcommands
 * is commands.ts.
 */

import { ConfigError } from "../config.ts";
import { CsiError, ZfsError } from "../errors.ts";
import { PLUGIN_VERSION } from "../version.ts";
import { SUBCOMMANDS } from "./commands.ts";
import { type CliIo, formatTable, processIo } from "./io.ts";
import { closestFlag } from "./setup.ts";

/** Exit code of a command line that is wrong (as the server's flags). */
export const EXIT_USAGE = 2;
/** Exit code of a subcommand that failed. */
export const EXIT_FAILED = 1;

/** The overview `zfs-csi help` prints. */
export function overview(): string {
  const rows = Object.entries(SUBCOMMANDS).map(([name, s]) => [`  ${name}`, s.summary]);
  return [
    `zfs-csi ${PLUGIN_VERSION}: operator subcommands`,
    "",
    "Usage: zfs-csi <subcommand> [the plugin's flags] [options]",
    "",
    ...formatTable(["Subcommands:", ""], rows),
    "",
    "They take the plugin's own flags (--parent-dataset, --node-id, --store, ...; see",
    "zfs-csi --help) and touch nothing outside the parent dataset. --json prints JSON.",
    "zfs-csi help <subcommand> shows one in full.",
  ].join("\n");
}

/**
 * The subcommands, for the end of the server's `zfs-csi --help`: an operator who reads the
 * flags learns the commands exist.
 */
export function subcommandsHelp(): string {
  const rows = Object.entries(SUBCOMMANDS).map(([name, s]) => [`  ${name}`, s.summary]);
  return [
    "",
    "Operator subcommands (zfs-csi <subcommand> --help shows one; they take the flags above):",
    ...formatTable(["", ""], rows).slice(1),
  ].join("\n");
}

function describe(err: unknown): string {
  if (err instanceof ZfsError || err instanceof CsiError) return err.message;
  return err instanceof Error ? err.message : String(err);
}

/**
 * Runs the subcommand `args[0]` with the rest of `args`.
 * @returns the exit code: 0, 1 when it failed, 2 for a wrong command line
 */
export async function runCli(args: readonly string[], io: CliIo = processIo()): Promise<number> {
  const [name = "help", ...rest] = args;
  if (name === "help") {
    const topic = rest[0];
    if (topic === undefined) {
      io.out(overview());
      return 0;
    }
    const sub = Object.hasOwn(SUBCOMMANDS, topic) ? SUBCOMMANDS[topic] : undefined;
    if (!sub) return unknown(io, topic);
    io.out((await sub.load()).usage);
    return 0;
  }
  const sub = Object.hasOwn(SUBCOMMANDS, name) ? SUBCOMMANDS[name] : undefined;
  if (!sub) return unknown(io, name);
  const module = await sub.load();
  if (rest.includes("--help") || rest.includes("-h")) {
    io.out(module.usage);
    return 0;
  }
  try {
    return await module.run(rest, io);
  } catch (err) {
    if (err instanceof ConfigError) {
      io.err(`zfs-csi ${name}: ${err.message}`);
      return EXIT_USAGE;
    }
    io.err(`zfs-csi ${name}: ${describe(err)}`);
    return EXIT_FAILED;
  }
}

function unknown(io: CliIo, name: string): number {
  const near = closestFlag(name, Object.keys(SUBCOMMANDS));
  io.err(
    `zfs-csi: unknown subcommand "${name}"; subcommands: ${Object.keys(SUBCOMMANDS).join(", ")} ` +
      `(zfs-csi help), or flags only to serve (zfs-csi --help)` +
      (near ? `; did you mean "${near}"?` : ""),
  );
  return EXIT_USAGE;
}
