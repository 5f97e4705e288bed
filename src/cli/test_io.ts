/**
 * For the subcommands' tests: a {@linkcode CliIo} that keeps what was written, with a clock the
 * test moves. Not used by the subcommands themselves.
 */

import type { CliIo } from "./io.ts";

/** A CliIo whose output the test reads. */
export interface MemoryIo extends CliIo {
  readonly stdout: string[];
  readonly stderr: string[];
  /** Moves the clock on. */
  advance(ms: number): void;
}

/** A CliIo writing into arrays; `terminal` chooses bar or plain progress lines. */
export function memoryIo(terminal = false): MemoryIo {
  const stdout: string[] = [];
  const stderr: string[] = [];
  let clock = 0;
  return {
    stdout,
    stderr,
    terminal,
    out: (line) => stdout.push(line),
    err: (line) => stderr.push(line),
    errRaw: (text) => stderr.push(text),
    now: () => clock,
    advance: (ms) => {
      clock += ms;
    },
  };
}

/** The plugin flags the tests give every subcommand. */
export const TEST_FLAGS = [
  "--parent-dataset",
  "tank/nomad",
  "--node-id",
  "node-a",
  "--stage-publish-base-dir",
  "/local/csi",
] as const;

/** The properties of a dataset the trash set aside: managed, deleted at `at` (epoch seconds), named `name` before. */
export const trashMarks = (name: string, at: string): Record<string, string> => ({
  "org.zfs-csi:managed": "yes",
  "org.zfs-csi:deleted-at": at,
  "org.zfs-csi:deleted-name": name,
});
