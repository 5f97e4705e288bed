/**
 * What `zfs send` and `zfs receive` share: the error of a streamed zfs command that failed,
 * classified as src/zfs/zfs.ts classifies every zfs failure.
 */

import { ZfsError } from "../errors.ts";
import type { StreamedExit } from "../run.ts";
import { classifyZfsError } from "../zfs/zfs.ts";

/** The ZfsError of a streamed zfs command that exited with `exit` (not 0). */
export function streamedZfsError(argv: readonly string[], exit: StreamedExit): ZfsError {
  if (exit.stderr.trim() !== "") {
    return new ZfsError(classifyZfsError(exit.stderr), argv, exit.stderr);
  }
  const detail = exit.killed
    ? "it was stopped before it finished"
    : `it exited with code ${exit.code} without saying why`;
  return new ZfsError("unknown", argv, "", { detail });
}
