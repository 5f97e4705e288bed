/**
 * Store-wide housekeeping, beside each volume's own pruning (backup.ts): the backups of a
 * deleted volume go once the store's deleted retention has passed (its manifests leaves first,
 * then its streams, its record last), and streams no manifest points to (an upload that died
 * before its manifest, a prune that died between a manifest and its stream) go once they have
 * been orphans for a day.
 *
 * A deleted volume's age is measured on the store's own clock: from the time the store stamped
 * on its record (written deleted) to the time it stamps on a probe written now
 * (src/store/store_clock.ts). The record's `deletedAt` is the deleting node's wall clock;
 * comparing it with this node's would let two clocks that disagree (a node 40 days behind, or
 * ahead) remove a deleted volume's backups early. This node's wall clock must also say the
 * retention passed since `deletedAt`, so a store clock stepping forward alone removes nothing
 * either. A store that gives no times keeps deleted volumes' backups.
 *
 * An orphan's age is counted from when this process first saw it listed, in monotonic time,
 * not from a date: a date of the upload's start (written into the key, or S3's LastModified of
 * a multipart upload, which is when it began) would make a stream that took a day to upload
 * look a day old in the moment between its completion and its manifest, and so be deleted
 * under a backup about to use it. A stream is listed only once complete, so a day after first
 * sight is a day after its upload ended. The cost: a restarted process waits a day again
 * before removing orphans.
 */

import type { Logger } from "../log.ts";
import { volumeRecordKey, volumesPrefix } from "../store/layout.ts";
import { pruneOrder } from "../store/policy.ts";
import type { Store, StoredObject } from "../store/store.ts";
import { readStoreClock } from "../store/store_clock.ts";
import { type ManifestCache, readManifests, readRecord, removeManifests } from "./records.ts";

/** What the store pruner works with. */
export interface StorePrunerDeps {
  readonly store: Store;
  readonly log: Logger;
  /** This node's id: names its store clock probe (src/store/store_clock.ts). */
  readonly node: string;
  /**
   * How long a deleted volume's backups stay, in ms: on the store's clock since its record was
   * written deleted, and on this node's wall clock since the record's deletedAt.
   */
  readonly deletedRetentionMs: number;
  /** How long a stream must have been seen orphaned before it goes (default a day), in ms. */
  readonly orphanAgeMs?: number;
  /** This node's wall clock, ms since the epoch (deletedAt is a date); replaceable in tests. */
  readonly now?: () => number;
  /** A clock that never jumps, in ms (default `performance.now()`); replaceable in tests. */
  readonly monotonic?: () => number;
  /**
   * The store's own leftovers of crashed writers (a directory store's temporary files), removed
   * at each pass; returns how many went.
   */
  readonly cleanTemp?: () => Promise<number>;
}

/** What one pass removed. */
export interface StorePruneResult {
  /** Volume keys whose backups were removed, record and all. */
  readonly volumes: string[];
  /** Orphan stream keys removed. */
  readonly orphans: string[];
}

const DAY_MS = 86_400_000;

/** Removes deleted volumes' backups after their retention, and orphan streams after a day. */
export class StorePruner {
  readonly #d: StorePrunerDeps;
  readonly #now: () => number;
  readonly #mono: () => number;
  /** Orphan streams by key: monotonic ms when first seen orphaned. */
  readonly #firstSeen = new Map<string, number>();
  readonly #cache: ManifestCache = new Map();
  #timer: ReturnType<typeof setInterval> | undefined;
  #running: Promise<StorePruneResult> | undefined;
  /** The store's clock in this pass, read when first needed; "failed" when it could not be. */
  #storeClock: Promise<number | undefined | "failed"> | undefined;
  /** Whether the log already said that the store gives no times (said once a process). */
  #saidNoTimes = false;

  constructor(deps: StorePrunerDeps) {
    this.#d = deps;
    this.#now = deps.now ?? Date.now;
    this.#mono = deps.monotonic ?? (() => performance.now());
  }

  /**
   * One pass over the whole store; a pass already running is joined. A volume that fails is
   * logged and the others go on.
   * @throws {StoreError} when the store cannot be listed
   */
  prune(): Promise<StorePruneResult> {
    this.#running ??= this.#pruneOnce().finally(() => (this.#running = undefined));
    return this.#running;
  }

  /** Prunes now and then every `intervalMs` (default an hour), without keeping the process alive. */
  startPeriodic(intervalMs = 3_600_000): void {
    if (this.#timer !== undefined) return;
    const run = () =>
      void this.prune().catch((err) => this.#d.log.warn("store prune failed", { error: err }));
    run();
    this.#timer = setInterval(run, intervalMs);
    Deno.unrefTimer(this.#timer);
  }

  /** Stops the periodic prune. */
  stop(): void {
    if (this.#timer !== undefined) clearInterval(this.#timer);
    this.#timer = undefined;
  }

  async #pruneOnce(): Promise<StorePruneResult> {
    const result: StorePruneResult = { volumes: [], orphans: [] };
    this.#storeClock = undefined;
    try {
      const removed = await this.#d.cleanTemp?.();
      if (removed) this.#d.log.info("store's leftover temporary files removed", { removed });
    } catch (err) {
      this.#d.log.warn("could not remove the store's leftover temporary files", { error: err });
    }
    const prefix = volumesPrefix();
    const byVolume = new Map<string, StoredObject[]>();
    for (const obj of await this.#d.store.list(prefix)) {
      const volumeKey = obj.key.slice(prefix.length).split("/")[0]!;
      const group = byVolume.get(volumeKey);
      if (group) group.push(obj);
      else byVolume.set(volumeKey, [obj]);
    }
    const orphansNow = new Set<string>();
    for (const [volumeKey, objects] of byVolume) {
      try {
        if (await this.#removeIfExpired(volumeKey, objects)) {
          result.volumes.push(volumeKey);
          continue;
        }
        await this.#removeOrphans(volumeKey, objects, orphansNow, result.orphans);
      } catch (err) {
        this.#d.log.warn("store prune skipped a volume", { volumeKey, error: err });
        // Its orphans stay known, so a failing volume does not restart their day.
        for (const key of this.#firstSeen.keys()) {
          if (key.startsWith(`${prefix}${volumeKey}/`)) orphansNow.add(key);
        }
      }
    }
    for (const key of this.#firstSeen.keys()) if (!orphansNow.has(key)) this.#firstSeen.delete(key);
    return result;
  }

  /** Removes every object of a volume deleted longer ago than the retention; whether it did. */
  async #removeIfExpired(volumeKey: string, objects: readonly StoredObject[]): Promise<boolean> {
    const { store, log } = this.#d;
    const key = volumeRecordKey(volumeKey);
    const first = await store.getBytes(key);
    if (!first) return false;
    const record = readRecord(first.bytes, key, store);
    if (record.deletedAt === undefined) return false;
    // Both clocks must say so (see the module doc); the wall clock first, as it costs nothing.
    if (this.#now() < Date.parse(record.deletedAt) + this.#d.deletedRetentionMs) return false;
    const listed = objects.find((o) => o.key === key);
    if (!(await this.#storeSaysExpired(volumeKey, listed, first.etag))) return false;
    // Read again before each removal: a backup of the same uid (a restored volume) clears
    // deletedAt, and from then on nothing more of it goes.
    const unchanged = async () => (await store.getBytes(key))?.etag === first.etag;
    const { manifests, unreadable } = await readManifests(store, volumeKey, log, this.#cache);
    // Safe against a backup of the same uid basing an incremental on one meanwhile (records.ts).
    const { removed } = await removeManifests(
      store,
      volumeKey,
      pruneOrder(manifests, new Set()),
      log,
      { proceed: unchanged, cache: this.#cache },
    );
    const gone = new Set(removed.map((m) => m.stream));
    if (removed.length < manifests.length || !(await unchanged())) {
      return this.#revived(volumeKey);
    }
    for (const k of unreadable) await store.delete(k);
    // What is left: streams without a manifest, and anything else under the volume's prefix.
    for (const obj of objects) {
      if (obj.key === key || obj.key.includes("/snapshots/") || gone.has(obj.key)) continue;
      await store.delete(obj.key);
    }
    if (!(await unchanged())) return this.#revived(volumeKey);
    await store.delete(key);
    log.info("store removed a deleted volume's backups", {
      volumeKey,
      deletedAt: record.deletedAt,
      snapshots: manifests.length,
    });
    return true;
  }

  /**
   * Whether the store's clock says the retention passed since the record was written. The
   * listing's time is that of the version read only when their etags agree: a version written
   * since the listing waits for the next pass. A record written again later (a backup reviving
   * it, a rewrite keeping deletedAt) has a later time, so its retention only gets longer.
   */
  async #storeSaysExpired(
    volumeKey: string,
    listed: StoredObject | undefined,
    etag: string,
  ): Promise<boolean> {
    if (listed === undefined || listed.etag !== etag) return false;
    const now = await this.#storeNow();
    if (now === "failed") return false;
    if (listed.lastModifiedMs === undefined || now === undefined) {
      if (!this.#saidNoTimes) {
        this.#saidNoTimes = true;
        this.#d.log.warn(
          "store gives no modification times: deleted volumes' backups are kept, since their " +
            "retention counts on the store's clock",
          { volumeKey, store: this.#d.store.description },
        );
      }
      return false;
    }
    return now - listed.lastModifiedMs >= this.#d.deletedRetentionMs;
  }

  /** The store's clock, read once a pass (a probe write, listing and delete). */
  #storeNow(): Promise<number | undefined | "failed"> {
    this.#storeClock ??= readStoreClock(this.#d.store, this.#d.node).catch((err) => {
      this.#d.log.warn("could not read the store's clock: deleted volumes are kept this pass", {
        error: err,
      });
      return "failed" as const;
    });
    return this.#storeClock;
  }

  #revived(volumeKey: string): false {
    this.#d.log.warn("store prune stopped: a deleted volume's record changed (backed up again?)", {
      volumeKey,
    });
    return false;
  }

  /** Removes the volume's streams no manifest points to, once seen orphaned for a day. */
  async #removeOrphans(
    volumeKey: string,
    objects: readonly StoredObject[],
    orphansNow: Set<string>,
    removed: string[],
  ): Promise<void> {
    const streams = objects.filter((o) => o.key.includes("/streams/"));
    if (streams.length === 0) return;
    const { manifests, unreadable } = await readManifests(
      this.#d.store,
      volumeKey,
      this.#d.log,
      this.#cache,
    );
    const referenced = new Set(manifests.map((m) => m.stream));
    // A manifest that cannot be read may still point to a stream of its guid: keep those.
    const unreadableHex = unreadable.map((k) => k.slice(k.lastIndexOf("/") + 1, -".json".length));
    const mono = this.#mono();
    const maxAge = this.#d.orphanAgeMs ?? DAY_MS;
    for (const { key } of streams) {
      const name = key.slice(key.lastIndexOf("/") + 1);
      if (referenced.has(key) || unreadableHex.some((h) => name.startsWith(`${h}-`))) continue;
      const seen = this.#firstSeen.get(key) ?? mono;
      this.#firstSeen.set(key, seen);
      if (mono - seen < maxAge) {
        orphansNow.add(key);
        continue;
      }
      await this.#d.store.delete(key);
      removed.push(key);
      this.#d.log.info("store removed an orphan stream", { key });
    }
  }
}
