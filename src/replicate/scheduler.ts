/**
 * Scheduled backups on one node. Each pass lists the parent's children in one `zfs get` (CSI
 * volumes and host volumes, whose one-shot plugin cannot schedule anything itself), and backs up
 * each volume whose last backup (`org.zfs-csi:backup-last`) is older than its interval, most
 * overdue first.
 *
 * A volume's interval ({@linkcode effectiveSchedule}): its own `org.zfs-csi:backup-interval`
 * (set by CreateVolume, a registered volume's context, `zfs-csi backup set`, or inherited from
 * a dataset above it), else a `backup_interval` its CreateVolume parameters recorded (an explicit
 * 0 stays off), else the plugin's `--backup-interval`. So the default covers every volume that
 * chose nothing, including the ones made before it was set: an operator who adds
 * `--backup-interval 1h` means "back up my volumes hourly" (its help says "volumes that set no
 * interval"), and a volume created before that flag had no way to choose. A volume that follows
 * its job never takes the default: its interval is its owner record's (src/follow/). The first
 * pass logs which volumes have no schedule at all, and the command that gives them one.
 *
 * The scheduler wakes when the earliest volume is due (or its failure backoff ends), not on a
 * fixed tick, so a 10 s interval means about 10 s between copies, which is the RPO a volume that
 * follows its job promises. Bounds: never sooner than `minWakeMs` (5 s) after the previous pass
 * began nor 1 s after it ended (no busy loop, whatever the intervals), never later than
 * `maxWakeMs` (30 s: new volumes and changed intervals are seen that soon), and at most
 * `maxPerPass` backups per pass (the rest wait for the next pass, re-sorted by lateness).
 *
 * One backup at a time on the node, requested snapshots included ({@linkcode
 * BackupScheduler.runExclusive}): uploads are bounded I/O, never a burst. A volume whose lock is
 * held (a stage or publish, a delete) is skipped until the next pass; the backup itself holds
 * the lock only around its zfs steps (backup.ts). A failed volume is logged and tried again
 * after a backoff that doubles up to an hour; {@linkcode BackupScheduler.status} tells the
 * volume's last success, last error and whether it is running, for the volume's condition.
 */

import type { Logger } from "../log.ts";
import { PARAMETERS_PROPERTY } from "../volume/catalog.ts";
import { FOLLOW_GENERATION_PROPERTY } from "../follow/copy.ts";
import { DELETED_PREFIX, MANAGED_PROPERTY, MANAGED_VALUE, volumeForDataset } from "../zfs/names.ts";
import { hasOwnMarker, type PropertyMap } from "../zfs/parse.ts";
import type { Zfs } from "../zfs/zfs.ts";
import { parseInterval } from "../store/policy.ts";
import { isHostDataset } from "../volume/host_names.ts";
import { ZVOL_CONTENT_PROPERTY } from "../volume/zvol.ts";
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
  /**
   * `--backup-interval`: seconds between backups of a volume that chose no interval (0: none).
   */
  readonly defaultIntervalSeconds?: number;
  /** First retry delay after a failure, doubled each failure (default 30 s), in ms. */
  readonly firstBackoffMs?: number;
  /** Longest retry delay (default an hour), in ms. */
  readonly maxBackoffMs?: number;
  /** Wall clock, ms since the epoch (backup-last is unix seconds); replaceable in tests. */
  readonly now?: () => number;
  /** A clock that never jumps, in ms (default `performance.now()`); replaceable in tests. */
  readonly monotonic?: () => number;
  /** Shortest time from the start of one pass to the start of the next (default 5 s), in ms. */
  readonly minWakeMs?: number;
  /** Longest time between passes (default 30 s), in ms. */
  readonly maxWakeMs?: number;
  /** Most backups one pass starts (default 16). */
  readonly maxPerPass?: number;
  /** Timers (default `setTimeout` unref'd, `clearTimeout`); replaceable in tests. */
  readonly timers?: SchedulerTimers;
}

/** The id of a timer {@linkcode SchedulerTimers.set} started. */
export type TimerId = ReturnType<typeof setTimeout>;

/** The one-shot timer the scheduler sleeps on between passes. */
export interface SchedulerTimers {
  /** Calls `fn` once after `ms`; must not keep the process alive. */
  set(fn: () => void, ms: number): TimerId;
  /** Cancels a timer `set` started. */
  clear(id: TimerId): void;
}

const REAL_TIMERS: SchedulerTimers = {
  set(fn, ms) {
    const id = setTimeout(fn, ms);
    Deno.unrefTimer(id);
    return id;
  },
  clear: (id) => clearTimeout(id),
};

/** Least time after the end of a pass before the next one, in ms: no busy loop. */
const REST_AFTER_PASS_MS = 1_000;

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

/** What a listing reads of each child of the parent to know its schedule. */
export const SCHEDULE_PROPS = [
  "type",
  MANAGED_PROPERTY,
  BACKUP_INTERVAL_PROPERTY,
  BACKUP_LAST_PROPERTY,
  PARAMETERS_PROPERTY,
  FOLLOW_GENERATION_PROPERTY,
  ZVOL_CONTENT_PROPERTY,
] as const;

/** Where a volume's backup interval comes from. */
export type ScheduleSource =
  /** Its own org.zfs-csi:backup-interval (set on it, or inherited from above). */
  | "own"
  /** The backup_interval its CreateVolume parameters recorded (only 0 gets here). */
  | "parameter"
  /** The plugin's --backup-interval. */
  | "default"
  /** A copy of a volume that follows its job, with no interval of its own: never the default. */
  | "follow"
  /** Nothing: no interval of its own and no default. */
  | "none";

/** A volume's backup schedule as the scheduler reads it. */
export interface EffectiveSchedule {
  /** Seconds between backups; 0: no scheduled backups. */
  readonly intervalSeconds: number;
  readonly source: ScheduleSource;
  /** Set when its own value cannot be read (then it has no scheduled backups). */
  readonly error?: string;
}

/** The backup_interval recorded in the CreateVolume parameters, if any. */
function recordedInterval(props: PropertyMap): string | undefined {
  const text = props.get(PARAMETERS_PROPERTY)?.value;
  if (text === undefined || text === "-" || text === "") return undefined;
  try {
    const v: unknown = JSON.parse(text);
    if (!v || typeof v !== "object" || Array.isArray(v)) return undefined;
    const interval = (v as Record<string, unknown>).backup_interval;
    return typeof interval === "string" ? interval : undefined;
  } catch {
    return undefined;
  }
}

/**
 * A volume's backup interval and where it comes from (see the module doc): its own property,
 * else its recorded CreateVolume parameter, else `defaultSeconds` (not for a volume that follows
 * its job).
 */
export function effectiveSchedule(
  props: PropertyMap,
  defaultSeconds: number,
): EffectiveSchedule {
  const own = props.get(BACKUP_INTERVAL_PROPERTY)?.value;
  const chosen = own !== undefined && own !== "-" && own !== ""
    ? { text: own, source: "own" as const }
    : (() => {
      const recorded = recordedInterval(props);
      return recorded === undefined ? undefined : { text: recorded, source: "parameter" as const };
    })();
  if (chosen) {
    try {
      return { intervalSeconds: parseInterval(chosen.text), source: chosen.source };
    } catch (err) {
      return {
        intervalSeconds: 0,
        source: chosen.source,
        error: err instanceof Error ? err.message : String(err),
      };
    }
  }
  if ((props.get(FOLLOW_GENERATION_PROPERTY)?.value ?? "-") !== "-") {
    return { intervalSeconds: 0, source: "follow" };
  }
  if (defaultSeconds > 0) return { intervalSeconds: defaultSeconds, source: "default" };
  return { intervalSeconds: 0, source: "none" };
}

/**
 * What kind of dataset `props` describe, if it is one the scheduler backs up: a filesystem, or
 * a zvol the plugin made (its own fs-type record, set at create; a zvol without it is not the
 * plugin's, whatever its marker says).
 */
export function scheduledType(props: PropertyMap): "filesystem" | "zvol" | undefined {
  const type = props.get("type")?.value;
  if (type === "filesystem") return "filesystem";
  if (type === "volume" && props.get(ZVOL_CONTENT_PROPERTY)?.source === "local") return "zvol";
  return undefined;
}

/**
 * Whether a child of the parent is one the scheduler backs up (a managed volume or host volume,
 * not one set aside or hidden).
 */
export function isScheduledKind(
  parent: string,
  dataset: string,
  props: PropertyMap,
): boolean {
  const component = dataset.slice(parent.length + 1);
  if (!dataset.startsWith(`${parent}/`) || component.includes("/")) return false;
  if (scheduledType(props) === undefined) return false;
  // Host volumes (src/dhv/) are hidden from CSI but backed up here: their plugin has no daemon.
  if (component.startsWith(".") && !isHostDataset(parent, dataset)) return false;
  if (component.startsWith(DELETED_PREFIX)) return false;
  return hasOwnMarker(props, MANAGED_PROPERTY, MANAGED_VALUE);
}

/** The name an operator gives `zfs-csi backup set` for a dataset: a volume's name, else its dataset. */
export function operatorName(parent: string, dataset: string): string {
  return isHostDataset(parent, dataset) ? dataset : volumeForDataset(parent, dataset) ?? dataset;
}

/** A volume due for a backup. */
interface Due {
  readonly dataset: string;
  /** Seconds it is overdue by. */
  readonly overdue: number;
  /** Its interval, in seconds. */
  readonly interval: number;
}

/** What one listing found: the volumes due now, and in how long the next one falls due. */
interface Listing {
  readonly due: Due[];
  /** Ms until the earliest volume not due now falls due (or its backoff ends); Infinity if none. */
  readonly nextInMs: number;
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
  /** The volumes without a schedule that were last reported. */
  #unscheduledKey: string | undefined;
  #abort = new AbortController();
  /** The tail of the one-at-a-time queue. */
  #queue: Promise<void> = Promise.resolve();
  /** The pass that runs now, resolving to the ms until the next volume is due. */
  #ticking: Promise<number> | undefined;
  #timer: TimerId | undefined;
  #running = false;
  readonly #timers: SchedulerTimers;

  constructor(deps: SchedulerDeps) {
    this.#d = deps;
    this.#now = deps.now ?? Date.now;
    this.#mono = deps.monotonic ?? (() => performance.now());
    this.#timers = deps.timers ?? REAL_TIMERS;
  }

  /**
   * Runs a pass now, then one whenever the next volume falls due (see the module doc), without
   * keeping the process alive.
   */
  start(): void {
    if (this.#running) return;
    this.#running = true;
    if (this.#abort.signal.aborted) this.#abort = new AbortController();
    void this.#wake();
  }

  /** Stops the passes, aborts the running backup (its upload leaves nothing) and waits for it. */
  async stop(): Promise<void> {
    this.#running = false;
    if (this.#timer !== undefined) this.#timers.clear(this.#timer);
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

  /**
   * One pass: backs up the due volumes (at most `maxPerPass`), one after the other. A call
   * while a pass runs joins it. Never throws.
   */
  tick(): Promise<void> {
    return this.#pass().then(() => {});
  }

  /** The volume's status, if it has scheduled backups. */
  status(dataset: string): VolumeBackupStatus | undefined {
    return this.#status.get(dataset);
  }

  /** Every scheduled volume's status, by dataset. */
  statuses(): ReadonlyMap<string, VolumeBackupStatus> {
    return this.#status;
  }

  /** A pass, then the timer for the next one, while started. */
  async #wake(): Promise<void> {
    this.#timer = undefined;
    const began = this.#mono();
    const nextInMs = await this.#pass();
    if (!this.#running || this.#timer !== undefined) return;
    const ended = this.#mono();
    const minWake = this.#d.minWakeMs ?? 5_000;
    const maxWake = this.#d.maxWakeMs ?? 30_000;
    // From the end of this pass: when the next volume falls due, within the bounds.
    const delay = Math.min(
      maxWake,
      Math.max(nextInMs, began + minWake - ended, REST_AFTER_PASS_MS),
    );
    this.#timer = this.#timers.set(() => void this.#wake(), delay);
  }

  /** One pass, joined by concurrent callers; resolves to the ms until the next volume is due. */
  #pass(): Promise<number> {
    this.#ticking ??= this.#passOnce().finally(() => (this.#ticking = undefined));
    return this.#ticking;
  }

  async #passOnce(): Promise<number> {
    let listing: Listing;
    try {
      listing = await this.#dueVolumes();
    } catch (err) {
      this.#d.log.warn("backup scheduler could not list the volumes", { error: err });
      return Infinity;
    }
    const limit = this.#d.maxPerPass ?? 16;
    // Volumes left over for the next pass are due at once.
    let nextInMs = listing.due.length > limit ? 0 : listing.nextInMs;
    for (const { dataset, interval } of listing.due.slice(0, limit)) {
      if (this.#abort.signal.aborted) return Infinity;
      try {
        const again = await this.runExclusive((signal) =>
          this.#backupOne(dataset, interval, signal)
        );
        nextInMs = Math.min(nextInMs, again);
      } catch {
        // Stopping: the queue refused to start it.
        return Infinity;
      }
    }
    return nextInMs;
  }

  /** The volumes due now, most overdue first; forgets volumes no longer scheduled. */
  async #dueVolumes(): Promise<Listing> {
    const parent = this.#d.parentDataset;
    const tree = await this.#d.zfs.getTree(parent, 1, SCHEDULE_PROPS);
    const nowSeconds = this.#now() / 1000;
    const due: Due[] = [];
    let nextInMs = Infinity;
    const scheduled = new Set<string>();
    const unscheduled: string[] = [];
    for (const [dataset, props] of tree ?? []) {
      if (!isScheduledKind(parent, dataset, props)) continue;
      const schedule = effectiveSchedule(props, this.#d.defaultIntervalSeconds ?? 0);
      if (schedule.error !== undefined) {
        this.#warnOnce(dataset, props.get(BACKUP_INTERVAL_PROPERTY)?.value ?? "", schedule.error);
        continue;
      }
      if (schedule.intervalSeconds === 0) {
        if (schedule.source === "none") unscheduled.push(operatorName(parent, dataset));
        continue;
      }
      const interval = schedule.intervalSeconds;
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
      const retryInMs = (this.#retryAt.get(dataset) ?? -Infinity) - this.#mono();
      if (retryInMs > 0) {
        nextInMs = Math.min(nextInMs, retryInMs);
        continue;
      }
      // Never backed up, due, or stamped in the future by a clock that was ahead.
      const overdue = last === undefined ? Infinity : nowSeconds - (last + interval);
      if (overdue >= 0 || last! > nowSeconds + interval) due.push({ dataset, overdue, interval });
      else nextInMs = Math.min(nextInMs, -overdue * 1000);
    }
    this.#reportUnscheduled(unscheduled);
    for (const dataset of [...this.#status.keys()]) {
      if (!scheduled.has(dataset) && !this.#status.get(dataset)!.running) {
        this.#status.delete(dataset);
        this.#retryAt.delete(dataset);
      }
    }
    return { due: due.sort((a, b) => b.overdue - a.overdue), nextInMs };
  }

  /** Warns once per dataset and value that its interval cannot be read. */
  #warnOnce(dataset: string, text: string, error: string): void {
    const key = `${dataset}\u0000${text}`;
    if (this.#warned.has(key)) return;
    this.#warned.add(key);
    this.#d.log.warn("volume's backup interval cannot be read: no scheduled backups", {
      dataset,
      property: BACKUP_INTERVAL_PROPERTY,
      error,
    });
  }

  /**
   * Says, at the first pass and whenever the list changes, which volumes have no schedule at
   * all and how to give them one.
   */
  #reportUnscheduled(names: readonly string[]): void {
    const key = [...names].sort().join("\u0000");
    if (key === this.#unscheduledKey) return;
    this.#unscheduledKey = key;
    if (names.length === 0) return;
    this.#d.log.warn(
      "volumes without a backup schedule are never backed up: give each one with " +
        '"zfs-csi backup set VOLUME --interval 1h", or give the plugin --backup-interval',
      { volumes: [...names].sort() },
    );
  }

  /** Backs up one volume; resolves to the ms until it should be tried again. */
  async #backupOne(dataset: string, interval: number, signal: AbortSignal): Promise<number> {
    const startedAt = this.#now();
    const before = this.#status.get(dataset) ?? { failures: 0, running: false };
    this.#status.set(dataset, { ...before, running: true });
    try {
      const outcome = await this.#d.backup(dataset, { skipIfBusy: true, signal });
      if (outcome.status === "busy") {
        this.#d.log.debug("backup skipped: the volume is busy; next pass", { dataset });
        this.#status.set(dataset, { ...before, running: false });
        return 0;
      }
      this.#retryAt.delete(dataset);
      this.#status.set(dataset, { lastSuccessAt: this.#now(), failures: 0, running: false });
      // backup-last is the snapshot's creation, taken at about the start.
      return startedAt + interval * 1000 - this.#now();
    } catch (err) {
      if (signal.aborted) {
        this.#status.set(dataset, { ...before, running: false });
        return Infinity;
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
      return delay;
    }
  }
}
