/**
 * Keeps background work on a follow copy (standby receives, standby.ts; the holder's scheduled
 * backups, mover.ts scheduledBackup) out of the way of the calls Nomad waits for: a NodeStage or
 * a release of a follow volume first stops such work on the same dataset (a download and zfs
 * receive are aborted: an increment lands whole or not at all, a full receive goes into a hidden
 * dataset; an upload is aborted before its manifest) and waits for it to end, and none starts
 * while one of them runs. So the standby never holds up a stage for the
 * length of a download, and never receives into a copy a stage is judging or mounting.
 */

/** A standby receive in progress. */
interface Running {
  readonly abort: AbortController;
  readonly done: Promise<void>;
}

/** See the module doc. */
export class CopyGate {
  /** Datasets a stage or release is working on, and how many of them. */
  readonly #busy = new Map<string, number>();
  readonly #running = new Map<string, Running>();

  /**
   * For background work (a standby receive, a scheduled backup): runs `fn` with a signal that a stage aborts, unless a stage or
   * release works on `dataset` (or another standby run does): then `fn` does not run.
   * @returns whether `fn` ran, and its result
   */
  async background<T>(
    dataset: string,
    fn: (signal: AbortSignal) => Promise<T>,
  ): Promise<{ ran: false } | { ran: true; value: T }> {
    if (this.#busy.has(dataset) || this.#running.has(dataset)) return { ran: false };
    const abort = new AbortController();
    let end!: () => void;
    const done = new Promise<void>((resolve) => end = resolve);
    this.#running.set(dataset, { abort, done });
    try {
      return { ran: true, value: await fn(abort.signal) };
    } finally {
      this.#running.delete(dataset);
      end();
    }
  }

  /**
   * For a stage or release: stops a standby receive into `dataset` and keeps new ones out
   * while `fn` runs.
   */
  async exclusive<T>(dataset: string, fn: () => Promise<T>): Promise<T> {
    this.#busy.set(dataset, (this.#busy.get(dataset) ?? 0) + 1);
    try {
      const running = this.#running.get(dataset);
      if (running) {
        running.abort.abort(new DOMException("a stage of the volume preempted it", "AbortError"));
        await running.done;
      }
      return await fn();
    } finally {
      const n = (this.#busy.get(dataset) ?? 1) - 1;
      if (n > 0) this.#busy.set(dataset, n);
      else this.#busy.delete(dataset);
    }
  }

  /** Whether a stage or release works on `dataset` now. */
  isBusy(dataset: string): boolean {
    return this.#busy.has(dataset);
  }
}
