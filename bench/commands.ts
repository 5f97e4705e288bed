/**
 * What the plugin runs, and the floor it is compared with. Counting shims (small bash scripts
 * first on the plugin's PATH) log every zfs, zpool, mount and umount the plugin starts, with its
 * argv and exit code; the same commands, replayed by bash with nothing else around them, are the
 * floor the plugin's latency is measured against.
 */

import { PURGE_PROPERTIES } from "../src/volume/trash.ts";

/** The programs the plugin may run (src/permissions.ts). */
export const PROGRAMS = ["zfs", "zpool", "mount", "umount"] as const;

/** One command the plugin ran. */
export interface LoggedCommand {
  /** Its exit code. */
  readonly code: number;
  /** Program name as the plugin named it, then the arguments. */
  readonly argv: readonly string[];
}

/** Separates arguments in the shim log: a control character no argument may hold. */
const SEP = "\x1f";

/**
 * Parses the shim log: one `<code>\t<program>\x1f<arg>\x1f...` line per command.
 * @throws {SyntaxError} for a line of another shape
 */
export function parseCommandLog(text: string): LoggedCommand[] {
  return text.split("\n").filter((l) => l !== "").map((line) => {
    const m = /^(\d+)\t(.*)$/.exec(line);
    if (!m) throw new SyntaxError(`Cannot parse shim log line ${JSON.stringify(line)}`);
    const argv = m[2]!.split(SEP);
    // "$*" of no arguments leaves the program name alone, with a trailing separator.
    if (argv.at(-1) === "") argv.pop();
    return { code: Number(m[1]), argv };
  });
}

/** The bash shim for `program` that runs `realPath` and logs to `logPath`. */
export function shimScript(program: string, realPath: string, logPath: string): string {
  return [
    "#!/bin/bash",
    // Programs that zfs itself starts (zfs-fuse runs umount) are not the plugin's: not logged.
    `if [ -n "\${ZFS_CSI_SHIMMED:-}" ]; then exec ${shellQuote(realPath)} "$@"; fi`,
    "export ZFS_CSI_SHIMMED=1",
    `${shellQuote(realPath)} "$@"`,
    "rc=$?",
    `IFS=$'${"\\x1f"}'`,
    `printf '%s\\t%s\\n' "$rc" ${shellQuote(program)}$'\\x1f'"$*" >> ${shellQuote(logPath)}`,
    "exit $rc",
    "",
  ].join("\n");
}

/** Quotes one word for bash: single quotes, with embedded ones closed and escaped. */
export function shellQuote(word: string): string {
  return /^[A-Za-z0-9_@%+=:,./-]+$/.test(word) ? word : `'${word.replaceAll("'", `'\\''`)}'`;
}

/**
 * Whether a command only reads state: `zfs get`/`list`, `zpool list`/`status`, `mount` without
 * arguments. What is left is what any script doing the same job must run.
 */
export function isReadOnly(argv: readonly string[]): boolean {
  const [program, sub] = argv;
  if (program === "zfs") return sub === "get" || sub === "list";
  if (program === "zpool") return sub === "list" || sub === "status" || sub === "get";
  if (program === "mount") return argv.length === 1;
  return false;
}

/**
 * Commands of the plugin's background work (health check, purge) rather than of a call: these
 * are dropped when commands are attributed to calls.
 */
export function isBackground(argv: readonly string[], parentDataset: string): boolean {
  if (argv[0] === "zpool") return true;
  if (argv[0] !== "zfs" || argv[1] !== "get") return false;
  const props = argv.at(-2) ?? "";
  // The purge's listing adds "clones" where this ZFS has it.
  return argv.at(-1) === parentDataset &&
    (props === "type,mounted,mountpoint" || props.startsWith(PURGE_PROPERTIES.join(",")));
}

/** A named group of commands timed together (one CSI call's worth). */
export interface FloorStep {
  readonly name: string;
  readonly commands: readonly LoggedCommand[];
  /** Shell lines run before the step, untimed (directories the plugin makes with a syscall). */
  readonly setup?: readonly string[];
  /** Shell lines run after the step, untimed. */
  readonly teardown?: readonly string[];
}

/**
 * A bash script that runs each step's commands exactly as the plugin did (output discarded,
 * the same exit code required) and prints `<step> <microseconds>` per step. Timing uses bash's
 * own clock ($EPOCHREALTIME), so bash's start-up is not counted: the floor is as low as a shell
 * can go. `programs` maps program names to the real paths.
 */
export function floorScript(
  steps: readonly FloorStep[],
  programs: Readonly<Record<string, string>>,
): string {
  const lines = [
    "#!/bin/bash",
    "set -u",
    'fail() { echo "floor: $*" >&2; exit 1; }',
  ];
  for (const step of steps) {
    lines.push(...(step.setup ?? []));
    lines.push("t0=${EPOCHREALTIME/./}");
    for (const c of step.commands) {
      const [program, ...args] = c.argv;
      const real = programs[program!];
      if (real === undefined) throw new TypeError(`No real path for "${program}"`);
      const text = [real, ...args].map(shellQuote).join(" ");
      lines.push(`${text} >/dev/null 2>&1; rc=$?`);
      lines.push(`[ $rc -eq ${c.code} ] || fail ${shellQuote(`${step.name}: ${text}`)} "exit $rc"`);
    }
    lines.push("t1=${EPOCHREALTIME/./}");
    lines.push(`echo ${shellQuote(step.name)} $((10#$t1 - 10#$t0))`);
    lines.push(...(step.teardown ?? []));
  }
  lines.push("");
  return lines.join("\n");
}

/** Reads the `<step> <microseconds>` lines of a floor script as milliseconds by step. */
export function parseFloorTimes(stdout: string): Map<string, number> {
  const out = new Map<string, number>();
  for (const line of stdout.split("\n")) {
    const m = /^(\S+) (\d+)$/.exec(line);
    if (m) out.set(m[1]!, Number(m[2]) / 1000);
  }
  return out;
}
