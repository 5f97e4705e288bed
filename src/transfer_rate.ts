/**
 * The rate of a transfer of a known size and the time it has left: one computation for the
 * command line's progress bar (src/cli/io.ts) and the log of a long receive
 * (src/follow/progress.ts), so both say the same of the same bytes.
 */

/** How fast a transfer goes, and how long it has left. */
export interface TransferRate {
  /** Bytes per second since it started. */
  readonly bytesPerSecond: number;
  /** Seconds left at that rate; undefined when nothing has moved yet or all bytes are done. */
  readonly secondsLeft: number | undefined;
}

/**
 * The rate of `doneBytes` of `totalBytes` moved in `elapsedMs`. A start less than a millisecond
 * ago counts as one, so the first bytes give a rate rather than a division by zero.
 */
export function transferRate(
  doneBytes: number,
  totalBytes: number,
  elapsedMs: number,
): TransferRate {
  const seconds = Math.max(elapsedMs / 1000, 0.001);
  const bytesPerSecond = doneBytes / seconds;
  const secondsLeft = bytesPerSecond > 0 && doneBytes < totalBytes
    ? (totalBytes - doneBytes) / bytesPerSecond
    : undefined;
  return { bytesPerSecond, secondsLeft };
}
