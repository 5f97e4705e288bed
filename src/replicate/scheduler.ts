/**
 * Scheduled backups on one node. Every tick (30 s) the parent's children with
 * `org.zfs-csi:backup-interval` are listed in one `zfs get`, and each volume whose last backup
 * (`org.zfs-csi:backup-last`) is older than its interval is backed up, most overdue first.
 *
 * One backup at a time on the node, requested snapshots included ({@linkcode
 * BackupScheduler.runExclusive}): uploads are bounded I/O, never a burst. A volume whose lock is
 * held (a stage or publish, a delete) is skipped until the next tick; the backup itself holds
 * the lock only around its zfs steps (backup.ts). A failed volume is logged and tried again
 * after a backoff that doubles up to an hour; {@linkcode BackupScheduler.status} tells the
 * volume's last success, last error and whether it is running, for the volume's condition.
 */

import type { Logger } from "../log.ts";
import { DELETED_PREFIX, MANAGED_PROPERTY, MANAGED_VALUE } from "../zfs/names.ts";
import { hasOwnMarker } from "../zfs/parse.ts";
import type { Zfs } from "../zfs/zfs.ts";
import { parseInterval } from "../store/policy.ts";
import {
  BACKUP_INTERVAL_PROPERTY,
  BACKUP_LAST_PROPERTY,
  type BackupOptions,
  type BackupOutcome,
} from "./backup.ts";

/** What the scheduler works with. */
export interface SchedulerDeps {
  readonly zfs: Zfs;
  readonly parentDataset: string;
  readonly log: Logger;
  /** One volume's backup: `(dataset, options) => backupVolume(backupDeps, dataset, options)`. */
  readonly backup: (dataset: string, options: BackupOptions) => Promise<BackupOutcome>;
  /** First retry delay after a failure, doubled each failure (default 30 s), in ms. */
  readonly firstBackoffMs?: number;
  /** Longest retry delay (default an hour), in ms. */
  readonly maxBackoffMs?: number;
  /** Wall clock, ms since the epoch (backup-last is unix seconds); replaceable in tests. */
  readonly now?: () => number;
  /** A clock that never jumps, in ms (default `performance.now()`); replaceable in tests. */
  readonly monotonic?: () => number;
}

/** One volume's scheduled backups, as the scheduler last saw them. */
export interface VolumeBackupStatus {
  /** When the last backup succeeded (ms since the epoch), from backup-last at first. */
  readonly lastSuccessAt?: number;
  /** Why the last attempt failed; cleared by a success. */
  readonly lastError?: string;
  /** Failures in a row. */
  readonly failures: number;
  /** Whether its backup runs now. */
  readonly running: boolean;
}

const SCHEDULE_PROPS = ["type", MANAGED_PROPERTY, BACKUP_INTERVAL_PROPERTY, BACKUP_LAST_PROPERTY];

/** A volume due for a backup. */
interface Due {
  readonly dataset: string;
  /** Seconds it is overdue by. */
  readonly overdue: number;
}

/** Runs scheduled backups one at a time; see the module doc. */
export class BackupScheduler {
  readonly #d: SchedulerDeps;
  readonly #now: () => number;
  readonly #mono: () => number;
  readonly #status = new Map<string, VolumeBackupStatus>();
  /** Monotonic ms before which a failed volume is not tried again. */
  readonly #retryAt = new Map<string, number>();
  readonly #warned = new Set<string>();
  #abort = new AbortController();
  /** The tail of the one-at-a-time queue. */
  #queue: Promise<void> = Promise.resolve();
  #ticking: Promise<void> | undefined;
  #timer: ReturnType<typeof setInterval> | undefined;

  constructor(deps: SchedulerDeps) {
    this.#d = deps;
    this.#now = deps.now ?? Date.now;
    this.#mono = deps.monotonic ?? (() => performance.now());
  }

  /** Ticks now and then every `tickMs` (default 30 s), without keeping the process alive. */
  start(tickMs = 30_000): void {
    if (this.#timer !== undefined) return;
    if (this.#abort.signal.aborted) this.#abort = new AbortController();
    void this.tick();
    this.#timer = setInterval(() => void this.tick(), tickMs);
    Deno.unrefTimer(this.#timer);
  }

  /** Stops ticking, aborts the running backup (its upload leaves nothing) and waits for it. */
  async stop(): Promise<void> {
    if (this.#timer !== undefined) clearInterval(this.#timer);
    this.#timer = undefined;
    this.#abort.abort(new DOMException("The plugin is stopping", "AbortError"));
    await this.#ticking;
    await this.#queue;
  }

  /**
   * Runs `fn` when no backup runs, and no other backup until it ends: for CreateSnapshot's
   * uploads to the store, so they never run beside scheduled ones. The signal aborts on stop().
   */
  runExclusive<T>(fn: (signal: AbortSignal) => Promise<T>): Promise<T> {
    const signal = this.#abort.signal;
    const run = this.#queue.then(() => {
      signal.throwIfAborted();
      return fn(signal);
    });
    this.#queue = run.then(() => {}, () => {});
    return run;
  }

  /** One pass: backs up every due volume, one after the other. Never throws. */
  tick(): Promise<void> {
    this.#ticking ??= this.#tickOnce().finally(() => (this.#ticking = undefined));
    return this.#ticking;
  }

  /** The volume's status, if it has scheduled backups. */
  status(dataset: string): VolumeBackupStatus | undefined {
    return this.#status.get(dataset);
  }

  /** Every scheduled volume's status, by dataset. */
  statuses(): ReadonlyMap<string, VolumeBackupStatus> {
    return this.#status;
  }

  async #tickOnce(): Promise<void> {
    let due: Due[];
    try {
      due = await this.#dueVolumes();
    } catch (err) {
      this.#d.log.warn("backup scheduler could not list the volumes", { error: err });
      return;
    }
    for (const { dataset } of due) {
      if (this.#abort.signal.aborted) return;
      try {
        await this.runExclusive((signal) => this.#backupOne(dataset, signal));
      } catch {
        // Stopping: the queue refused to start it.
        return;
      }
    }
  }

  /** The volumes due now, most overdue first; forgets volumes no longer scheduled. */
  async #dueVolumes(): Promise<Due[]> {
    const parent = this.#d.parentDataset;
    const tree = await this.#d.zfs.getTree(parent, 1, SCHEDULE_PROPS);
    const nowSeconds = this.#now() / 1000;
    const due: Due[] = [];
    const scheduled = new Set<string>();
    for (const [dataset, props] of tree ?? []) {
      const component = dataset.slice(parent.length + 1);
      if (!dataset.startsWith(`${parent}/`) || component.includes("/")) continue;
      if (component.startsWith(".") || component.startsWith(DELETED_PREFIX)) continue;
      if (!hasOwnMarker(props, MANAGED_PROPERTY, MANAGED_VALUE)) continue;
      const intervalText = props.get(BACKUP_INTERVAL_PROPERTY)?.value;
      if (intervalText === undefined || intervalText === "-" || intervalText === "") continue;
      const interval = this.#interval(dataset, intervalText);
      if (!interval) continue;
      scheduled.add(dataset);
      const lastText = props.get(BACKUP_LAST_PROPERTY)?.value ?? "";
      const last = /^\d{1,12}$/.test(lastText) ? Number(lastText) : undefined;
      if (!this.#status.has(dataset)) {
        this.#status.set(dataset, {
          failures: 0,
          running: false,
          ...(last === undefined ? {} : { lastSuccessAt: last * 1000 }),
        });
      }
      if ((this.#retryAt.get(dataset) ?? -Infinity) > this.#mono()) continue;
      // Never backed up, due, or stamped in the future by a clock that was ahead.
      const overdue = last === undefined ? Infinity : nowSeconds - (last + interval);
      if (overdue >= 0 || last! > nowSeconds + interval) due.push({ dataset, overdue });
    }
    for (const dataset of [...this.#status.keys()]) {
      if (!scheduled.has(dataset) && !this.#status.get(dataset)!.running) {
        this.#status.delete(dataset);
        this.#retryAt.delete(dataset);
      }
    }
    return due.sort((a, b) => b.overdue - a.overdue);
  }

  /** The interval in seconds, or undefined (warned once) when it cannot be read. */
  #interval(dataset: string, text: string): number | undefined {
    try {
      return parseInterval(text) || undefined;
    } catch (err) {
      const key = `${dataset}\u0000${text}`;
      if (!this.#warned.has(key)) {
        this.#warned.add(key);
        this.#d.log.warn("volume's backup interval cannot be read: no scheduled backups", {
          dataset,
          property: BACKUP_INTERVAL_PROPERTY,
          error: err,
        });
      }
      return undefined;
    }
  }

  async #backupOne(dataset: string, signal: AbortSignal): Promise<void> {
    const before = this.#status.get(dataset) ?? { failures: 0, running: false };
    this.#status.set(dataset, { ...before, running: true });
    try {
      const outcome = await this.#d.backup(dataset, { skipIfBusy: true, signal });
      if (outcome.status === "busy") {
        this.#d.log.debug("backup skipped: the volume is busy; next tick", { dataset });
        this.#status.set(dataset, { ...before, running: false });
        return;
      }
      this.#retryAt.delete(dataset);
      this.#status.set(dataset, { lastSuccessAt: this.#now(), failures: 0, running: false });
    } catch (err) {
      if (signal.aborted) {
        this.#status.set(dataset, { ...before, running: false });
        return;
      }
      const failures = before.failures + 1;
      const delay = Math.min(
        this.#d.maxBackoffMs ?? 3_600_000,
        (this.#d.firstBackoffMs ?? 30_000) * 2 ** Math.min(failures - 1, 30),
      );
      this.#retryAt.set(dataset, this.#mono() + delay);
      const { lastError: _, ...rest } = before;
      this.#status.set(dataset, {
        ...rest,
        lastError: err instanceof Error ? err.message : String(err),
        failures,
        running: false,
      });
      this.#d.log.warn("backup failed; retrying later", {
        dataset,
        failures,
        retryInMs: delay,
        error: err,
      });
    }
  }
}
