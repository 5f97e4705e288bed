/**
 * Soft delete. DeleteVolume and DeleteSnapshot set the dataset or snapshot aside under a hidden
 * name (`.deleted-<unix seconds>-<old name>`) instead of destroying it, and a periodic purge
 * destroys what is older than the retention. Until then an operator can undo a mistaken delete
 * with one `zfs rename`. A retention of 0 destroys at once, except what clones still need.
 */

import { ZfsError } from "../errors.ts";
import type { KeyedLock } from "../lock.ts";
import type { Logger } from "../log.ts";
import { CLONE_PREFIX, deletedAt, deletedComponent, MAX_DATASET_NAME } from "../zfs/names.ts";
import type { Zfs } from "../zfs/zfs.ts";

/** What the trash works with. */
export interface TrashDeps {
  readonly zfs: Zfs;
  readonly parentDataset: string;
  /** How long deleted volumes and snapshots are kept; 0 destroys at once. */
  readonly retentionSeconds: number;
  readonly locks: KeyedLock;
  readonly log: Logger;
  /** Unix seconds now; replaceable in tests. */
  readonly now?: () => number;
}

/** Hidden clone snapshots older than this with no clone are leftovers of an interrupted clone. */
const CLONE_LEFTOVER_SECONDS = 3600;

/** Sets deleted volumes and snapshots aside and purges them after the retention. */
export class Trash {
  readonly #d: TrashDeps;
  readonly #now: () => number;
  #timer: ReturnType<typeof setInterval> | undefined;
  #purging: Promise<void> | undefined;

  constructor(deps: TrashDeps) {
    this.#d = deps;
    this.#now = deps.now ?? (() => Math.floor(Date.now() / 1000));
  }

  /**
   * Removes a volume's dataset (the caller holds its lock and has checked that it is ours and
   * unused). It is unmounted first, so a busy filesystem stops the delete before anything
   * changed.
   * @throws {ZfsError} busy (FAILED_PRECONDITION) when the filesystem is in use
   */
  async removeVolume(dataset: string): Promise<void> {
    await this.#d.zfs.unmount(dataset);
    if (this.#d.retentionSeconds === 0) {
      for (let attempt = 0;; attempt++) {
        try {
          await this.#d.zfs.destroy(dataset, { recursive: true });
          return;
        } catch (err) {
          if (!(err instanceof ZfsError)) throw err;
          // A clone made from this volume still needs its data: set it aside until it goes.
          if (err.kind === "dependents") break;
          // Unmounted, yet busy: zfs needs a moment after an unmount. Past that, set aside.
          if (err.kind !== "busy") throw err;
          if (attempt >= 4) break;
          await pause(100 * (attempt + 1));
        }
      }
    }
    const hidden = await this.#renameAside(dataset, this.#d.parentDataset);
    try {
      // Not mounted again at boot; `zfs set canmount=on` undoes this.
      await this.#d.zfs.set(hidden, "canmount", "noauto");
    } catch (err) {
      this.#d.log.warn("could not set canmount=noauto on a deleted volume", {
        dataset: hidden,
        error: err,
      });
    }
    this.#d.log.info("volume set aside", {
      dataset,
      deletedAs: hidden,
      retentionSeconds: this.#d.retentionSeconds,
    });
  }

  /** Removes a snapshot; one that clones depend on is set aside and goes with the last clone. */
  async removeSnapshot(snapshot: string): Promise<void> {
    if (this.#d.retentionSeconds === 0) {
      try {
        await this.#d.zfs.destroy(snapshot);
        return;
      } catch (err) {
        if (!(err instanceof ZfsError && err.kind === "dependents")) throw err;
      }
      const hidden = await this.#renameAside(snapshot, snapshot.slice(0, snapshot.indexOf("@")));
      await this.#d.zfs.destroy(hidden, { deferred: true });
      return;
    }
    const hidden = await this.#renameAside(snapshot, snapshot.slice(0, snapshot.indexOf("@")));
    this.#d.log.info("snapshot set aside", {
      snapshot,
      deletedAs: hidden,
      retentionSeconds: this.#d.retentionSeconds,
    });
  }

  /** Renames `name` (a child of `container`, or a snapshot of it) to a hidden deleted name. */
  async #renameAside(name: string, container: string): Promise<string> {
    const isSnapshot = name.includes("@");
    const sep = isSnapshot ? "@" : "/";
    const component = name.slice(name.lastIndexOf(sep) + 1);
    const room = MAX_DATASET_NAME - container.length - 1;
    for (let attempt = 0;; attempt++) {
      const hidden = `${container}${sep}${
        deletedComponent(component, this.#now() + attempt, room)
      }`;
      try {
        await this.#d.zfs.rename(name, hidden);
        return hidden;
      } catch (err) {
        if (!(err instanceof ZfsError) || attempt >= 5) throw err;
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

  /**
   * Destroys what was set aside longer ago than the retention, and hidden clone snapshots an
   * interrupted clone left behind. What clones still need stays and is tried again next time.
   * Never throws: failures are logged.
   */
  purge(): Promise<void> {
    this.#purging ??= this.#purgeOnce().finally(() => (this.#purging = undefined));
    return this.#purging;
  }

  async #purgeOnce(): Promise<void> {
    const parent = this.#d.parentDataset;
    let tree;
    try {
      tree = await this.#d.zfs.getTree(parent, 2, ["type", "creation", "defer_destroy"]);
    } catch (err) {
      this.#d.log.warn("purge could not list the parent dataset", { error: err });
      return;
    }
    if (!tree) return;
    const now = this.#now();
    for (const [name, props] of tree) {
      const type = props.get("type")?.value;
      const at = name.indexOf("@");
      const container = at >= 0 ? name.slice(0, at) : name.slice(0, name.lastIndexOf("/"));
      const component = at >= 0 ? name.slice(at + 1) : name.slice(name.lastIndexOf("/") + 1);
      if (at < 0 && container !== parent) continue;
      const deleted = deletedAt(component);
      const expired = deleted !== undefined && deleted + this.#d.retentionSeconds <= now;
      const leftoverClone = type === "snapshot" && component.startsWith(CLONE_PREFIX) &&
        Number(props.get("creation")?.value ?? now) + CLONE_LEFTOVER_SECONDS <= now;
      if (!expired && !leftoverClone) continue;
      // Already marked: ZFS destroys it with the last clone that needs it.
      if (type === "snapshot" && props.get("defer_destroy")?.value === "on") continue;
      // A clone in progress holds its source's lock; never race it.
      const held = this.#d.locks.tryAcquire([at >= 0 ? container : name]);
      if (!held) continue;
      try {
        if (type === "snapshot") {
          await this.#d.zfs.destroy(name, { deferred: true });
        } else if (type === "filesystem") {
          await this.#d.zfs.destroy(name, { recursive: true });
        }
        this.#d.log.info("purged", { name });
      } catch (err) {
        const kind = err instanceof ZfsError ? err.kind : "unknown";
        const log = kind === "dependents" || kind === "busy" ? this.#d.log.debug : this.#d.log.warn;
        log.call(this.#d.log, "purge kept a deleted dataset for now", { name, error: err });
      } finally {
        held.release();
      }
    }
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
    this.#timer = undefined;
  }
}

function pause(ms: number): Promise<void> {
  return new Promise((r) => setTimeout(r, ms));
}
