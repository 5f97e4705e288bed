/**
 * Soft delete. DeleteVolume and DeleteSnapshot set the dataset or snapshot aside under a hidden
 * name (`.deleted-<unix seconds>-<old name>`, cut to fit) and mark it: the plugin's marker, the
 * deletion time and the old name, set locally (see names.ts). A periodic purge destroys what is
 * marked and older than the retention. Until then an operator can undo a mistaken delete with one
 * `zfs rename` to the recorded name. A retention of 0 destroys at once, except what clones need.
 *
 * Nothing is destroyed that the plugin did not make: before a dataset goes, its subtree is read
 * and judged (subtree.ts); its own hidden snapshots are destroyed one by one, then the dataset
 * without `-r`, so whatever appeared since the check stops the destroy instead of going with it.
 * A name alone never makes anything the purge's: an unmarked `.deleted-*` dataset (made by hand,
 * by an older zfs-csi, or left by a crash between rename and marking) is logged, never destroyed.
 * A zvol set aside reserves nothing until undelete puts its recorded reservation back.
 *
 * Age is never taken from the wall clock alone: it counts wall-clock time only up to when this
 * process first saw an item, and monotonic time after that, and nothing is destroyed before the
 * process has watched it for a while (see {@linkcode TrashDeps.minObservationSeconds}).
 */

import { Code, CsiError, ZfsError } from "../errors.ts";
import type { KeyedLock } from "../lock.ts";
import type { Logger } from "../log.ts";
import {
  DELETED_AT_PROPERTY,
  DELETED_NAME_PROPERTY,
  deletedComponent,
  isDeletedComponent,
  MANAGED_PROPERTY,
  MANAGED_VALUE,
  MAX_DATASET_NAME,
} from "../zfs/names.ts";
import type { PropertyList } from "../zfs/args.ts";
import type { PropertyMap } from "../zfs/parse.ts";
import type { Zfs } from "../zfs/zfs.ts";
import {
  checkSubtree,
  CLONES_PROPERTY,
  deletedMarks,
  isCloneComponent,
  needsSiblings,
  obstacleMessage,
  SIBLING_PROPERTIES,
  SUBTREE_PROPERTIES,
  type SubtreeCheck,
} from "./subtree.ts";
import { RESERVATION_RECORD_PROPERTY, reservationRecord } from "./zvol_reservation.ts";

/** What the trash works with. */
export interface TrashDeps {
  readonly zfs: Zfs;
  readonly parentDataset: string;
  /** How long deleted volumes and snapshots are kept; 0 destroys at once. */
  readonly retentionSeconds: number;
  readonly locks: KeyedLock;
  readonly log: Logger;
  /** Unix seconds by the wall clock; replaceable in tests. */
  readonly now?: () => number;
  /** Seconds by a clock that never jumps (default `performance.now()`); replaceable in tests. */
  readonly monotonic?: () => number;
  /**
   * How long this process must have watched an item before the purge destroys it (capped at
   * the retention): time for a wall clock that was wrong at start-up to be corrected. 1 hour.
   */
  readonly minObservationSeconds?: number;
  /** How soon a purge that zfs refused as busy is tried again; default BUSY_RETRY_MS. */
  readonly busyRetryMs?: number;
}

/** A dataset's subtree as read right before it is deleted, and judged. */
export interface Inspection {
  /** The dataset's own properties ({@linkcode SUBTREE_PROPERTIES}). */
  readonly props: PropertyMap;
  readonly check: SubtreeCheck;
}

/** Hidden clone snapshots older than this with no clone are leftovers of an interrupted clone. */
const CLONE_LEFTOVER_SECONDS = 3600;
/** Default of {@linkcode TrashDeps.minObservationSeconds}. */
const MIN_OBSERVATION_SECONDS = 3600;
/** How soon a purge that zfs refused as busy is tried again (see Trash.purge). */
const BUSY_RETRY_MS = 5_000;
/** A deletion time this far ahead of the wall clock is worth a warning (and is kept). */
const FUTURE_WARN_SECONDS = 60;

/** What the purge lists below the parent (children and their snapshots). */
export const PURGE_PROPERTIES = [
  "type",
  "creation",
  "defer_destroy",
  "userrefs",
  "origin",
  MANAGED_PROPERTY,
  DELETED_AT_PROPERTY,
  DELETED_NAME_PROPERTY,
] as const;

/** When this process first saw an item, and how old the wall clock then said it was. */
interface Sighting {
  /** Monotonic seconds at first sight. */
  readonly mono: number;
  /** Age at first sight (seconds): the lowest the wall clock has implied since. */
  age: number;
}

/** Sets deleted volumes and snapshots aside and purges them after the retention. */
export class Trash {
  readonly #d: TrashDeps;
  readonly #now: () => number;
  readonly #mono: () => number;
  readonly #minObservation: number;
  /** Items seen set aside, by name and deletion time. */
  readonly #seen = new Map<string, Sighting>();
  /** Warnings already given, so a purge every 10 minutes does not repeat them. */
  readonly #warned = new Set<string>();
  /** Whether zfs has OpenZFS's `clones` property; undefined until a read found out. */
  #hasClones: boolean | undefined;
  #timer: ReturnType<typeof setInterval> | undefined;
  #purging: Promise<void> | undefined;
  /** Whether this purge kept something only because zfs said busy (retried soon, see purge). */
  #keptBusy = false;
  #busyRetry: ReturnType<typeof setTimeout> | undefined;

  constructor(deps: TrashDeps) {
    this.#d = deps;
    this.#now = deps.now ?? (() => Math.floor(Date.now() / 1000));
    this.#mono = deps.monotonic ?? (() => performance.now() / 1000);
    this.#minObservation = Math.min(
      deps.retentionSeconds,
      deps.minObservationSeconds ?? MIN_OBSERVATION_SECONDS,
    );
  }

  /**
   * Reads and judges the subtree of `dataset` (a volume, or a set-aside one): one `zfs get` of
   * it, and one of the parent's children when its snapshots may have clones. Undefined when the
   * dataset does not exist.
   * @throws {ZfsError} when zfs fails
   */
  async inspect(dataset: string): Promise<Inspection | undefined> {
    const tree = await this.#getTree(dataset, 1, SUBTREE_PROPERTIES);
    const props = tree?.get(dataset);
    if (!tree || !props) return undefined;
    const parent = this.#d.parentDataset;
    const siblings = needsSiblings(tree)
      ? await this.#d.zfs.getTree(parent, 1, SIBLING_PROPERTIES)
      : undefined;
    const check = checkSubtree({ parent, root: dataset, tree, ...(siblings ? { siblings } : {}) });
    return { props, check };
  }

  /**
   * Removes a volume's dataset. The caller holds its lock, has checked that it is ours and
   * unused, and passes the {@linkcode inspect}ion that found nothing in the way. It is unmounted
   * first, so a busy filesystem stops the delete before anything changed. With retention 0 it is
   * destroyed (its own hidden snapshots one by one, then the dataset without `-r`); a volume that
   * clones still need is set aside instead, like every volume with a retention. A zvol set aside
   * gives its reservation back: recorded with the marks, then dropped (zvol_reservation.ts).
   * @throws {CsiError} FAILED_PRECONDITION when something not made by zfs-csi is in the way
   * @throws {ZfsError} busy (FAILED_PRECONDITION) when the filesystem is in use
   */
  async removeVolume(dataset: string, found: Inspection): Promise<void> {
    const { check } = found;
    if (check.root !== dataset) throw new Error(`An inspection of "${check.root}" was given`);
    // The caller refuses these with better messages; this is the last line of defence.
    if (check.csiSnapshots.length > 0) {
      throw new CsiError(
        Code.FAILED_PRECONDITION,
        `Dataset "${dataset}" has snapshots (${check.csiSnapshots.join(", ")}); delete them first`,
      );
    }
    if (check.obstacles.length > 0) {
      throw new CsiError(
        Code.FAILED_PRECONDITION,
        obstacleMessage(`Dataset "${dataset}" is not deleted`, dataset, check.obstacles),
      );
    }
    // A zvol has nothing mounted by zfs (what a node mounts from it, it unmounts at unstage).
    const filesystem = found.props.get("type")?.value === "filesystem";
    if (filesystem) await this.#d.zfs.unmount(dataset);
    if (this.#d.retentionSeconds === 0 && check.clonedSnapshots.length === 0) {
      for (let attempt = 0;; attempt++) {
        try {
          if (await this.#destroyChecked(dataset, check)) return;
          // A clone appeared since the check: set aside until it goes.
          break;
        } catch (err) {
          if (!(err instanceof ZfsError)) throw err;
          if (err.kind !== "busy") {
            // zfs refuses a dataset that gained a snapshot or child since the check: say which.
            if (await this.#goneOrRefuse(dataset)) return;
            throw err;
          }
          // Unmounted, yet busy: zfs needs a moment after an unmount. Past that, set aside.
          if (attempt >= 4) break;
          await pause(100 * (attempt + 1));
        }
      }
    }
    // A zvol's reservation is given back while it is set aside (zvol_reservation.ts): read now,
    // so that a failed read stops the delete before anything changed.
    const reserved = filesystem ? undefined : await this.#reservation(dataset);
    const at = this.#now();
    const hidden = await this.#renameAside(dataset, this.#d.parentDataset, at);
    const marked = await this.#mark(hidden, [
      // Volumes carry the marker; one received with `zfs send -p` gets it set locally too.
      ...(found.props.get(MANAGED_PROPERTY)?.source === "local"
        ? []
        : [[MANAGED_PROPERTY, MANAGED_VALUE] as const]),
      [DELETED_NAME_PROPERTY, dataset],
      // Recorded with the marks, before the reservation is dropped.
      ...(reserved === undefined ? [] : [[RESERVATION_RECORD_PROPERTY, reserved] as const]),
      [DELETED_AT_PROPERTY, String(at)],
      // Not mounted again at boot; `zfs set canmount=on` undoes this (zvols are not mounted).
      ...(filesystem ? [["canmount", "noauto"] as const] : []),
    ], at);
    if (marked && reserved !== undefined) await this.#dropReservation(hidden);
    this.#d.log.info("volume set aside", {
      dataset,
      deletedAs: hidden,
      retentionSeconds: this.#d.retentionSeconds,
      ...(reserved === undefined ? {} : { reservationBytes: Number(reserved) }),
    });
  }

  /**
   * The record of a zvol's refreservation ({@linkcode reservationRecord}): undefined when it
   * reserves nothing (sparse).
   * @throws {ZfsError} when zfs fails; CsiError INTERNAL when zfs gives no byte count
   */
  async #reservation(zvol: string): Promise<string | undefined> {
    const props = await this.#d.zfs.getProperties(zvol, ["refreservation"]);
    const value = props?.get("refreservation")?.value;
    try {
      return reservationRecord(value);
    } catch (err) {
      throw new CsiError(Code.INTERNAL, `zfs gave "${value}" as the refreservation of "${zvol}"`, {
        cause: err,
      });
    }
  }

  /**
   * Sets a set-aside zvol's refreservation to none, its record written already. A failure is
   * logged: the delete has happened, and the zvol holds its space until the purge.
   */
  async #dropReservation(hidden: string): Promise<void> {
    try {
      await this.#d.zfs.set(hidden, "refreservation", "none");
    } catch (err) {
      this.#d.log.error("set aside but its reservation is kept until the purge", {
        name: hidden,
        error: err,
        hint: `zfs set refreservation=none ${hidden} (its value is recorded in ` +
          `${RESERVATION_RECORD_PROPERTY}, which zfs-csi undelete puts back)`,
      });
    }
  }

  /** Removes a snapshot; one that clones depend on is set aside and goes with the last clone. */
  async removeSnapshot(snapshot: string): Promise<void> {
    const container = snapshot.slice(0, snapshot.indexOf("@"));
    if (this.#d.retentionSeconds === 0) {
      try {
        await this.#d.zfs.destroy(snapshot);
        return;
      } catch (err) {
        if (!(err instanceof ZfsError && err.kind === "dependents")) throw err;
      }
    }
    const at = this.#now();
    const hidden = await this.#renameAside(snapshot, container, at);
    await this.#mark(hidden, [
      // A snapshot inherits its dataset's marker; the purge wants its own.
      [MANAGED_PROPERTY, MANAGED_VALUE],
      [DELETED_NAME_PROPERTY, snapshot],
      [DELETED_AT_PROPERTY, String(at)],
    ], at);
    if (this.#d.retentionSeconds === 0) {
      await this.#d.zfs.destroy(hidden, { deferred: true });
      return;
    }
    this.#d.log.info("snapshot set aside", {
      snapshot,
      deletedAs: hidden,
      retentionSeconds: this.#d.retentionSeconds,
    });
  }

  /**
   * Destroys what was set aside and marked longer ago than the retention, and hidden clone
   * snapshots an interrupted clone left behind, each after reading it again right before. What
   * clones still need, and anything with something in the way, stays. Never throws: failures
   * are logged.
   */
  purge(): Promise<void> {
    this.#purging ??= this.#purgeOnce().finally(() => {
      this.#purging = undefined;
      this.#retrySoonIfBusy();
    });
    return this.#purging;
  }

  /**
   * A destroy that zfs refused as busy (a moment after an unmount or a rename, often on
   * zfs-fuse) is tried again BUSY_RETRY_MS later rather than at the next periodic purge, once
   * per purge that met it, and only while the periodic purge runs.
   */
  #retrySoonIfBusy(): void {
    const busy = this.#keptBusy;
    this.#keptBusy = false;
    if (!busy || this.#timer === undefined || this.#busyRetry !== undefined) return;
    this.#busyRetry = setTimeout(() => {
      this.#busyRetry = undefined;
      if (this.#timer !== undefined) void this.purge();
    }, this.#d.busyRetryMs ?? BUSY_RETRY_MS);
    Deno.unrefTimer(this.#busyRetry);
  }

  /** Purges now and then every `intervalMs`, without keeping the process alive. */
  startPeriodic(intervalMs = 10 * 60_000): void {
    if (this.#timer !== undefined) return;
    void this.purge();
    const timer = setInterval(() => void this.purge(), intervalMs);
    Deno.unrefTimer(timer);
    this.#timer = timer;
  }

  /** Stops the periodic purge. */
  stop(): void {
    if (this.#timer !== undefined) clearInterval(this.#timer);
    if (this.#busyRetry !== undefined) clearTimeout(this.#busyRetry);
    this.#timer = undefined;
    this.#busyRetry = undefined;
  }

  async #purgeOnce(): Promise<void> {
    const parent = this.#d.parentDataset;
    let listing;
    try {
      listing = await this.#getTree(parent, 2, PURGE_PROPERTIES);
    } catch (err) {
      this.#d.log.warn("purge could not list the parent dataset", { error: err });
      return;
    }
    if (!listing) return;
    const started = this.#mono();
    const current = new Set<string>();
    const gone = new Set<string>();
    for (const [name, props] of listing) {
      const at = name.indexOf("@");
      const container = at >= 0 ? name.slice(0, at) : name.slice(0, name.lastIndexOf("/"));
      const component = at >= 0 ? name.slice(at + 1) : name.slice(name.lastIndexOf("/") + 1);
      if (at < 0 && container !== parent) continue;
      // Its dataset was purged a moment ago, snapshots and all.
      if (gone.has(container)) continue;
      const type = props.get("type")?.value;
      if (isDeletedComponent(component)) {
        const marks = deletedMarks(props);
        if (!marks) {
          this.#reportUnmarked(name, props);
          continue;
        }
        const key = sightingKey(name, marks.at);
        current.add(key);
        if (!this.#expired(name, key, marks.at, this.#d.retentionSeconds)) continue;
        if (type === "snapshot") {
          await this.#purgeSnapshot(name, container, listing, marks.at);
        } else if (
          (type === "filesystem" || type === "volume") && await this.#purgeDataset(name, marks.at)
        ) {
          gone.add(name);
        }
      } else if (type === "snapshot" && isCloneComponent(component)) {
        if (props.get("defer_destroy")?.value === "on") continue;
        const creation = Number(props.get("creation")?.value);
        if (!Number.isInteger(creation)) continue;
        const key = sightingKey(name, creation);
        current.add(key);
        if (!this.#expired(name, key, creation, CLONE_LEFTOVER_SECONDS)) continue;
        await this.#purgeSnapshot(name, container, listing, undefined);
      }
    }
    // Forget what is gone, so the memory of sightings does not grow (but not what a delete set
    // aside while this purge ran, after its listing).
    for (const [key, s] of this.#seen) {
      if (!current.has(key) && s.mono < started) this.#seen.delete(key);
    }
  }

  /**
   * Whether an item deleted (or made) at `since` is older than `retention`. Its age is what the
   * wall clock said at first sight (the lowest it has implied since, so a clock corrected back
   * lowers it and a jump forward does not raise it), plus monotonic time since; and this process
   * must have watched it for the minimum observation.
   */
  #expired(name: string, key: string, since: number, retention: number): boolean {
    const wall = this.#now();
    const mono = this.#mono();
    if (since > wall) {
      if (since > wall + FUTURE_WARN_SECONDS) {
        this.#warnOnce(`future:${key}`, "purge keeps an item deleted in the future", {
          name,
          deletedAt: since,
          now: wall,
          hint: "the wall clock is behind, or was ahead when it was deleted; it is kept until " +
            "the clock passes its deletion time, then for the retention",
        });
      }
      return false;
    }
    let s = this.#seen.get(key);
    if (!s) {
      s = { mono, age: wall - since };
      this.#seen.set(key, s);
    }
    const watched = mono - s.mono;
    s.age = Math.max(0, Math.min(s.age, wall - since - watched));
    return s.age + watched >= retention && watched >= Math.min(retention, this.#minObservation);
  }

  /**
   * Destroys an expired, marked set-aside dataset after judging its subtree again.
   * @returns whether it was destroyed
   */
  async #purgeDataset(name: string, at: number): Promise<boolean> {
    const held = this.#d.locks.tryAcquire([name]);
    if (!held) return false;
    try {
      const found = await this.inspect(name);
      // Gone, replaced or unmarked since the listing: not the item that expired.
      const type = found?.props.get("type")?.value;
      if (!found || (type !== "filesystem" && type !== "volume")) return false;
      if (deletedMarks(found.props)?.at !== at) return false;
      const { check } = found;
      if (check.obstacles.length > 0) {
        this.#warnOnce(`obstacles:${name}`, "purge keeps a set-aside dataset", {
          name,
          reason: obstacleMessage(`Dataset "${name}" is not purged`, name, check.obstacles),
        });
        return false;
      }
      if (check.clonedSnapshots.length > 0) {
        this.#d.log.debug("purge keeps a set-aside dataset that clones still need", {
          name,
          snapshots: check.clonedSnapshots,
        });
        return false;
      }
      if (await this.#destroyChecked(name, check)) {
        this.#d.log.info("purged", { name });
        return true;
      }
      this.#d.log.debug("purge keeps a set-aside dataset that a new clone needs", { name });
    } catch (err) {
      this.#logKept(name, err);
    } finally {
      held.release();
    }
    return false;
  }

  /**
   * Destroys an expired snapshot: a marked set-aside one (`at` its deletion time) or a clone
   * leftover (`at` undefined), after reading it again. One that own clones need is marked for
   * deferred destroy and goes with the last of them.
   */
  async #purgeSnapshot(
    name: string,
    container: string,
    listing: ReadonlyMap<string, PropertyMap>,
    at: number | undefined,
  ): Promise<void> {
    // A clone in progress holds its source's lock; never race it.
    const held = this.#d.locks.tryAcquire([container]);
    if (!held) return;
    try {
      const props = await this.#d.zfs.getProperties(name, this.#withClones(SUBTREE_PROPERTIES));
      if (!props || props.get("defer_destroy")?.value === "on") return;
      if (at !== undefined && deletedMarks(props)?.at !== at) return;
      const check = checkSubtree({
        parent: this.#d.parentDataset,
        root: container,
        tree: new Map([[name, props]]),
        siblings: listing,
      });
      if (check.obstacles.length > 0) {
        this.#warnOnce(`obstacles:${name}`, "purge keeps a set-aside snapshot", {
          name,
          reason: obstacleMessage(`Snapshot "${name}" is not purged`, container, check.obstacles),
        });
        return;
      }
      await this.#d.zfs.destroy(name, { deferred: check.clonedSnapshots.length > 0 });
      this.#d.log.info("purged", { name });
    } catch (err) {
      this.#logKept(name, err);
    } finally {
      held.release();
    }
  }

  /**
   * Destroys a dataset whose subtree `check` found to hold only the plugin's own things: its
   * hidden snapshots one by one, then the dataset itself without `-r`, so anything made since
   * the check makes zfs refuse instead of going too. False when a clone appeared meanwhile.
   * @throws {ZfsError} for other failures (busy, or a snapshot or child made since the check)
   */
  async #destroyChecked(dataset: string, check: SubtreeCheck): Promise<boolean> {
    for (const snapshot of check.ownSnapshots) {
      try {
        await this.#d.zfs.destroy(snapshot);
      } catch (err) {
        if (!(err instanceof ZfsError)) throw err;
        if (err.kind === "dependents") return false;
        // Gone already (a deferred one that went with its clone, or an earlier attempt).
        if (err.kind !== "not_found") throw err;
      }
    }
    try {
      await this.#d.zfs.destroy(dataset);
      return true;
    } catch (err) {
      if (err instanceof ZfsError && err.kind === "dependents") return false;
      throw err;
    }
  }

  /**
   * Reads `dataset` again after zfs refused to destroy it: true if it is gone after all, and a
   * refusal naming what is now in the way if anything is.
   * @throws {CsiError} FAILED_PRECONDITION naming what is in the way
   * @throws {ZfsError} when it cannot be read (unavailable: the pool cannot be seen)
   */
  async #goneOrRefuse(dataset: string): Promise<boolean> {
    const found = await this.inspect(dataset);
    if (!found) return true;
    const obstacles = found.check.obstacles;
    if (obstacles.length === 0) return false;
    throw new CsiError(
      Code.FAILED_PRECONDITION,
      obstacleMessage(`Volume dataset "${dataset}" is not deleted`, dataset, obstacles),
    );
  }

  /**
   * Sets the set-aside markers on `hidden`: in one `zfs set` where zfs takes several, else one
   * after the other in the order given (the deletion time after the marker it needs, so an
   * interruption leaves it unmarked, which the purge never destroys). A failure is logged with
   * the commands that finish the job: the delete itself has happened.
   * @returns whether it is marked
   */
  async #mark(hidden: string, props: PropertyList, at: number): Promise<boolean> {
    try {
      await this.#d.zfs.setProperties(hidden, props);
      this.#seen.set(sightingKey(hidden, at), { mono: this.#mono(), age: 0 });
      return true;
    } catch (err) {
      this.#d.log.error("set aside but not marked: the purge will not destroy it", {
        name: hidden,
        error: err,
        hint: props.map(([k, v]) => `zfs set ${k}=${v} ${hidden}`).join("; "),
      });
      return false;
    }
  }

  /** Logs, once per process, a `.deleted-*` item without the plugin's marks. */
  #reportUnmarked(name: string, props: PropertyMap): void {
    const snapshot = name.includes("@");
    const managed = props.get(MANAGED_PROPERTY)?.source === "local";
    const mark = `${managed ? "" : `zfs set ${MANAGED_PROPERTY}=${MANAGED_VALUE} ${name}; `}` +
      `zfs set ${DELETED_AT_PROPERTY}=<unix seconds> ${name}`;
    this.#warnOnce(`unmarked:${name}`, "purge never destroys a set-aside item without marks", {
      name,
      hint: "set aside by hand, by an older zfs-csi or interrupted: to keep it, rename it back " +
        `("zfs rename ${name} <old name>"); to let the purge take it, mark it ("${mark}"); ` +
        `or destroy it yourself ("zfs destroy ${snapshot ? "" : "-r "}${name}")`,
    });
  }

  #warnOnce(key: string, msg: string, fields: Record<string, unknown>): void {
    if (this.#warned.has(key)) return;
    this.#warned.add(key);
    this.#d.log.warn(msg, fields);
  }

  #logKept(name: string, err: unknown): void {
    const kind = err instanceof ZfsError ? err.kind : "unknown";
    if (kind === "busy") this.#keptBusy = true;
    const log = kind === "dependents" || kind === "busy" ? this.#d.log.debug : this.#d.log.warn;
    log.call(this.#d.log, "purge kept a deleted dataset for now", { name, error: err });
  }

  /** `props` and, where zfs has it, `clones`. */
  #withClones(props: readonly string[]): readonly string[] {
    return this.#hasClones ? [...props, CLONES_PROPERTY] : props;
  }

  /**
   * `zfs get -r` with `clones` added, unless zfs is known not to have it: the first read that
   * zfs refuses for it finds out (zfs-fuse) and reads again without.
   */
  async #getTree(
    root: string,
    depth: number,
    props: readonly string[],
  ): Promise<Map<string, PropertyMap> | undefined> {
    if (this.#hasClones !== false) {
      try {
        const tree = await this.#d.zfs.getTree(root, depth, [...props, CLONES_PROPERTY]);
        this.#hasClones = true;
        return tree;
      } catch (err) {
        if (this.#hasClones === true || !(err instanceof ZfsError && err.kind === "invalid")) {
          throw err;
        }
        const unknown = await this.#d.zfs.unknownProperties(this.#d.parentDataset, [
          CLONES_PROPERTY,
        ]);
        if (!unknown.includes(CLONES_PROPERTY)) throw err;
        this.#hasClones = false;
        this.#d.log.info(
          "zfs has no clones property: clones outside the parent dataset are " +
            "found only when zfs refuses a destroy",
        );
      }
    }
    return await this.#d.zfs.getTree(root, depth, props);
  }

  /** Renames `name` (a child of `container`, or a snapshot of it) to a hidden deleted name. */
  async #renameAside(name: string, container: string, at: number): Promise<string> {
    const isSnapshot = name.includes("@");
    const sep = isSnapshot ? "@" : "/";
    const component = name.slice(name.lastIndexOf(sep) + 1);
    const room = MAX_DATASET_NAME - container.length - 1;
    for (let attempt = 0;; attempt++) {
      const hidden = `${container}${sep}${deletedComponent(component, at + attempt, room)}`;
      try {
        await this.#d.zfs.rename(name, hidden);
        return hidden;
      } catch (err) {
        if (!(err instanceof ZfsError) || attempt >= RENAME_ATTEMPTS - 1) throw err;
        // The same name deleted twice within a second: take the next second's name.
        if (err.kind === "exists") continue;
        // zfs-fuse now and then fails a rename without a word: it may have renamed all the
        // same, and otherwise the dataset is still where it was and a retry is safe.
        if (err.kind === "unknown" && err.stderr.trim() === "") {
          if (await this.#d.zfs.getProperties(hidden, ["type"])) return hidden;
          await pause(100 * (attempt + 1));
          continue;
        }
        // Right after an unmount, zfs can still call the dataset busy for a moment.
        if (err.kind !== "busy" || isSnapshot) throw err;
        await pause(100 * (attempt + 1));
      }
    }
  }
}

/**
 * How often a rename aside is tried. zfs-fuse can call a dataset busy for a second or more after
 * its unmount on a loaded machine; the pauses grow by 100 ms, about 4.5 s in all.
 */
const RENAME_ATTEMPTS = 10;

/** Identifies one set-aside item: a name can be reused, a name with its deletion time is not. */
function sightingKey(name: string, at: number): string {
  return `${name}\u0000${at}`;
}

function pause(ms: number): Promise<void> {
  return new Promise((r) => setTimeout(r, ms));
}
