/**
 * The CSI side of the store (the plugin's `--store`): CreateSnapshot puts a snapshot in the
 * store, ListSnapshots shows what the store holds, DeleteSnapshot lets a stored snapshot go,
 * CreateVolume restores one on this node, DeleteVolume marks the volume's backups deleted (kept
 * for the store's retention). The handlers in controller.ts stay thin and call this; the work
 * is done by src/replicate/ and src/store/.
 */

import { Code, CsiError, ZfsError } from "../errors.ts";
import { type KeyedLock, withLock } from "../lock.ts";
import type { Logger } from "../log.ts";
import { type BackupDeps, backupSnapshot } from "../replicate/backup.ts";
import type { ReceiveDeps } from "../replicate/receive.ts";
import {
  type ManifestCache,
  readManifest,
  type RecordChange,
  releaseStored,
  updateRecord,
} from "../replicate/records.ts";
import { restoreVolume } from "../replicate/restore.ts";
import type { BackupScheduler } from "../replicate/scheduler.ts";
import { ChainError, chainTo, parseVolumeRecord } from "../store/chain.ts";
import {
  manifestKey,
  type SnapshotManifest,
  volumeRecordKey,
  volumesPrefix,
} from "../store/layout.ts";
import { storedSnapshotId, type StoredSnapshotRef } from "../store/snapshot_ids.ts";
import { storedSnapshotSize } from "../store/snapshot_size.ts";
import type { Store } from "../store/store.ts";
import type { PropertyList } from "../zfs/args.ts";
import { qualifiedVolumeId } from "../zfs/ids.ts";
import { decodeComponent, encodeComponent, STORED_PREFIX } from "../zfs/names.ts";
import { parseBytes } from "../zfs/parse.ts";
import type { Zfs } from "../zfs/zfs.ts";
import type { Trash } from "../volume/trash.ts";
import { FORMAT, FORMAT_PROPERTY } from "../volume/zvol.ts";

/** What the store's CSI side works with. */
export interface StoredSnapshotsDeps {
  readonly zfs: Zfs;
  readonly store: Store;
  readonly parentDataset: string;
  readonly nodeId: string;
  readonly locks: KeyedLock;
  readonly trash: Trash;
  readonly scheduler: BackupScheduler;
  readonly backup: BackupDeps;
  readonly receive: ReceiveDeps;
  readonly log: Logger;
  /** How long CreateSnapshot and CreateVolume wait for their transfer before answering (ms). */
  readonly answerWithinMs?: number;
}

/** A snapshot the store holds, or one on its way there. */
export interface StoredEntry {
  readonly id: string;
  /** The source volume's name, and the node that sent the snapshot. */
  readonly volume: string;
  readonly node: string;
  /** Unix seconds. */
  readonly creation: number;
  readonly sizeBytes: number;
  /** False while the upload runs. */
  readonly ready: boolean;
}

/** An upload CreateSnapshot started. */
interface Upload {
  readonly entry: StoredEntry;
  readonly done: Promise<SnapshotManifest>;
}

/** A restore CreateVolume started, by target dataset. */
interface Restore {
  readonly snapshotId: string;
  readonly bytes: number;
  readonly done: Promise<void>;
}

/** Nomad's controller calls have two minutes; answer well within them. */
const DEFAULT_ANSWER_WITHIN_MS = 90_000;

/** The snapshots of the store, for the controller's handlers. */
export class StoredSnapshots {
  readonly #d: StoredSnapshotsDeps;
  readonly #cache: ManifestCache = new Map();
  /** Uploads started by CreateSnapshot, by stored snapshot id. */
  readonly #uploads = new Map<string, Upload>();
  readonly #restores = new Map<string, Restore>();

  constructor(deps: StoredSnapshotsDeps) {
    this.#d = deps;
  }

  /** Where the snapshots go, for messages. */
  get description(): string {
    return this.#d.store.description;
  }

  /**
   * CreateSnapshot with the store: takes `<dataset>@.stored-<name>` (once; a repeat finds it)
   * and uploads it, answering ready when the upload ends within the wait, else not ready (the
   * upload goes on; ListSnapshots shows when it is done). The caller checked the volume.
   * @throws {CsiError} ALREADY_EXISTS when another volume has a stored snapshot of this name
   * @throws {StoreError} when the store fails before the upload could start
   */
  async create(
    dataset: string,
    volumeName: string,
    name: string,
    fitted: string,
  ): Promise<StoredEntry> {
    const manifests = await this.#allManifests();
    const other = manifests.find((m) => m.csiName === name && m.volume !== volumeName);
    if (other) {
      throw new CsiError(
        Code.ALREADY_EXISTS,
        `A snapshot named "${name}" already exists in ${this.description}, of another volume ` +
          `("${other.volume}")`,
      );
    }
    // The name as fitted to ZFS's limits (fit.ts); the manifest keeps the requested one.
    const local = `${dataset}@${STORED_PREFIX}${encodeComponent("Snapshot name", fitted)}`;
    const snap = await withLock(this.#d.locks, [dataset], async () => {
      const props = ["guid", "creation", "referenced"];
      let got = await this.#d.zfs.getProperties(local, props);
      let formattedBefore = false;
      if (!got) {
        // A zvol's format record before the snapshot: done then, the snapshot holds the whole
        // filesystem (the record only ever goes to done). Taken earlier: not known.
        const record = await this.#d.zfs.getProperties(dataset, [FORMAT_PROPERTY]);
        const format = record?.get(FORMAT_PROPERTY);
        formattedBefore = format?.source === "local" && format.value === FORMAT.done;
        await this.#d.zfs.snapshot(local);
        got = await this.#d.zfs.getProperties(local, props);
      }
      if (!got) throw new CsiError(Code.INTERNAL, `Snapshot "${local}" vanished after creation`);
      return {
        guid: got.get("guid")?.value ?? "",
        creation: Number(got.get("creation")?.value ?? "0") || 0,
        referenced: parseBytes(got.get("referenced")?.value ?? "0"),
        formattedBefore,
      };
    });
    const id = storedSnapshotId(volumeName, snap.guid);
    // CSI's size_bytes is the snapshot's size, what a volume made from it holds: the volume's
    // `referenced` at the snapshot (what refquota bounds, as a local snapshot answers), never
    // the stream's bytes, which for an incremental are only the changes since its base.
    const sized = (e: StoredEntry): StoredEntry => ({ ...e, sizeBytes: snap.referenced });
    const stored = manifests.find((m) => m.volume === volumeName && m.guid === snap.guid);
    if (stored) return sized(this.#entry(stored, []));
    let upload = this.#uploads.get(id);
    if (!upload) {
      const entry: StoredEntry = {
        id,
        volume: volumeName,
        node: this.#d.nodeId,
        creation: snap.creation,
        sizeBytes: snap.referenced,
        ready: false,
      };
      const done = this.#d.scheduler.runExclusive(async (signal) => {
        const outcome = await backupSnapshot(
          this.#d.backup,
          { dataset, snapshot: local, csiName: name, formattedBefore: snap.formattedBefore },
          { signal },
        );
        if (outcome.status !== "stored") {
          throw new CsiError(Code.UNAVAILABLE, `Volume "${volumeName}" stayed busy`);
        }
        return outcome.manifest;
      });
      upload = { entry, done };
      this.#uploads.set(id, upload);
      done.then(
        () => this.#uploads.delete(id),
        (err) => {
          this.#uploads.delete(id);
          this.#d.log.warn("snapshot upload to the store failed; CreateSnapshot again retries it", {
            snapshotId: id,
            store: this.description,
            error: err,
          });
        },
      );
    }
    const manifest = await within(upload.done, this.#answerWithinMs());
    return manifest ? sized(this.#entry(manifest, [])) : upload.entry;
  }

  /**
   * Every stored snapshot (scheduled backups and requested snapshots) and the uploads on their
   * way, optionally of one volume only.
   * @throws {StoreError} when the store cannot be listed
   */
  async list(volumeName?: string): Promise<StoredEntry[]> {
    const manifests = await this.#allManifests();
    // Each volume's own, for the sizes of manifests that predate theirs (snapshot_size.ts).
    const byUid = Map.groupBy(manifests, (m) => m.volumeUid);
    const stored = manifests.map((m) => this.#entry(m, byUid.get(m.volumeUid)!));
    const ids = new Set(stored.map((e) => e.id));
    const running = [...this.#uploads.values()].map((u) => u.entry).filter((e) => !ids.has(e.id));
    return [...stored, ...running].filter((e) =>
      volumeName === undefined || e.volume === volumeName
    );
  }

  /**
   * DeleteSnapshot of a stored snapshot: removed from the store when nothing stored builds on
   * it, else kept as a scheduled backup until the volume's keep policy drops it; the local
   * `.stored-*` snapshot of it on this node goes too (set aside like any deleted snapshot).
   * @throws {StoreError} when the store fails
   */
  async delete(ref: StoredSnapshotRef): Promise<void> {
    await this.#uploads.get(ref.id)?.done.catch(() => {});
    const outcome = await this.#d.scheduler.runExclusive(() =>
      releaseStored(this.#d.store, ref.volumeKey, ref.guid, this.#d.log)
    );
    this.#d.log.info("stored snapshot deleted", { snapshotId: ref.id, outcome });
    const dataset = `${this.#d.parentDataset}/${ref.volumeKey}`;
    await withLock(this.#d.locks, [dataset], async () => {
      const tree = await this.#d.zfs.getTree(dataset, 1, ["type", "guid"]);
      for (const [name, props] of tree ?? []) {
        const component = name.slice(dataset.length + 1);
        if (
          name.startsWith(`${dataset}@${STORED_PREFIX}`) && props.get("guid")?.value === ref.guid &&
          decodeComponent(component.slice(STORED_PREFIX.length)) !== undefined
        ) {
          await this.#d.trash.removeSnapshot(name);
        }
      }
    });
  }

  /**
   * CreateVolume from a stored snapshot: receives its chain into `target` on this node (see
   * restore.ts), waiting up to the answer time; a restore still running answers UNAVAILABLE and
   * goes on, so the same `nomad volume create` again finds it done.
   * @returns the manifest restored, for the volume's size
   * @throws {CsiError} NOT_FOUND for a snapshot the store does not hold; UNAVAILABLE while the
   *   restore runs; and whatever the restore threw (ReplicateError, ZfsError, StoreError)
   */
  async restore(
    ref: StoredSnapshotRef,
    target: string,
    properties: (manifest: SnapshotManifest) => PropertyList,
  ): Promise<SnapshotManifest> {
    const manifests = await this.#volumeManifests(ref.volumeKey);
    const manifest = manifests.find((m) => m.guid === ref.guid);
    if (!manifest) {
      throw new CsiError(Code.NOT_FOUND, `Snapshot "${ref.id}" not found in ${this.description}`);
    }
    let restore = this.#restores.get(target);
    if (restore && restore.snapshotId !== ref.id) {
      throw new CsiError(
        Code.ALREADY_EXISTS,
        `Volume dataset "${target}" is being restored from another snapshot ("${restore.snapshotId}")`,
      );
    }
    if (!restore) {
      let chain: SnapshotManifest[];
      try {
        chain = chainTo(manifests.filter((m) => m.volumeUid === manifest.volumeUid), ref.guid);
      } catch (err) {
        if (!(err instanceof ChainError)) throw err;
        throw new CsiError(
          Code.FAILED_PRECONDITION,
          `Snapshot "${ref.id}" cannot be restored: ${err.message}`,
        );
      }
      const done = restoreVolume(this.#d.receive, {
        parentDataset: this.#d.parentDataset,
        chain,
        target,
        properties: properties(manifest),
      });
      restore = {
        snapshotId: ref.id,
        bytes: chain.reduce((n, m) => n + m.size, 0),
        done,
      };
      this.#restores.set(target, restore);
      // Forgotten once settled: a repeat then finds the volume, or starts again after a failure.
      done.finally(() => this.#restores.delete(target)).catch(() => {});
    }
    const bytes = restore.bytes;
    const finished = await within(
      restore.done.then(() => true, (err) => {
        if (!(err instanceof ZfsError && err.kind === "no_space")) throw err;
        throw new CsiError(
          Code.RESOURCE_EXHAUSTED,
          `Restoring "${target}" from stored snapshot "${ref.id}" needs room for about ${bytes} ` +
            `bytes (its streams), more than the pool has free; nothing was kept. Free space or ` +
            `restore on another node (zfs said: ${err.stderr.trim().split("\n")[0]})`,
          { cause: err },
        );
      }),
      this.#answerWithinMs(),
    );
    if (!finished) {
      throw new CsiError(
        Code.UNAVAILABLE,
        `Restoring "${target}" from stored snapshot "${ref.id}" (${restore.bytes} bytes) is ` +
          `still running; run the same volume create again to wait for it`,
      );
    }
    return manifest;
  }

  /**
   * DeleteVolume: marks the volume's record in the store deleted (If-Match), so its backups stay
   * for the store's deleted retention and then go. Only the record of this dataset's own uid.
   * @throws {StoreError} when the store fails
   */
  async volumeDeleted(volumeName: string, uid: string | undefined): Promise<void> {
    if (uid === undefined) return;
    if (await this.#markRecord(volumeName, uid, new Date().toISOString())) {
      this.#d.log.info("volume's backups kept in the store for its deleted retention", {
        volume: volumeName,
        store: this.description,
      });
    }
  }

  /**
   * A volume restored under its own name lives again: its record's deletion mark goes at once,
   * not only at its next backup (it may have none), so the pruner never takes its history.
   * @throws {StoreError} when the store fails
   */
  async volumeRestored(volumeName: string, uid: string): Promise<void> {
    await this.#markRecord(volumeName, uid, undefined);
  }

  /** Sets or clears `deletedAt` on the record of `uid`; false when there was nothing to do. */
  async #markRecord(volumeName: string, uid: string, deletedAt: string | undefined) {
    const key = volumeRecordKey(encodeComponent("Volume name", volumeName));
    return await updateRecord(
      this.#d.store,
      key,
      "while the plugin wrote it; try again",
      (bytes): RecordChange<boolean> => {
        if (!bytes) return { result: false };
        const { deletedAt: was, ...record } = parseVolumeRecord(bytes);
        if (record.uid !== uid || (was === undefined) === (deletedAt === undefined)) {
          return { result: false };
        }
        return { write: deletedAt === undefined ? record : { ...record, deletedAt }, result: true };
      },
    );
  }

  #answerWithinMs(): number {
    return this.#d.answerWithinMs ?? DEFAULT_ANSWER_WITHIN_MS;
  }

  /** The entry of stored snapshot `m`; `manifests`: its volume's (see storedSnapshotSize). */
  #entry(m: SnapshotManifest, manifests: readonly SnapshotManifest[]): StoredEntry {
    return {
      id: storedSnapshotId(m.volume, m.guid),
      volume: m.volume,
      node: m.node,
      creation: Math.floor(Date.parse(m.createdAt) / 1000) || 0,
      sizeBytes: storedSnapshotSize(m, manifests),
      ready: true,
    };
  }

  /** The manifests of one volume (all uids). */
  async #volumeManifests(volumeKey: string): Promise<SnapshotManifest[]> {
    return await this.#manifestsUnder(`${volumesPrefix()}${volumeKey}/snapshots/`);
  }

  /** Every manifest in the store. */
  async #allManifests(): Promise<SnapshotManifest[]> {
    return await this.#manifestsUnder(volumesPrefix());
  }

  /** The manifests below `prefix`, read through the cache (a manifest never changes). */
  async #manifestsUnder(prefix: string): Promise<SnapshotManifest[]> {
    const listed = await this.#d.store.list(prefix);
    const out: SnapshotManifest[] = [];
    for (const obj of listed) {
      if (!/\/snapshots\/[0-9a-f]{16}\.json$/.test(obj.key)) continue;
      const manifest = await readManifest(this.#d.store, obj, this.#d.log, this.#cache);
      if (manifest === "unreadable" || !manifest) continue;
      // The key must be the manifest's own: a copy under another volume is not believed.
      const volumeKey = encodeComponent("Volume name", manifest.volume);
      if (manifestKey(volumeKey, manifest.guid) !== obj.key) continue;
      out.push(manifest);
    }
    return out;
  }

  /** The source volume's CSI id of a stored snapshot. */
  static sourceVolumeId(entry: StoredEntry): string {
    return qualifiedVolumeId(entry.volume, entry.node);
  }
}

/** Settles with `p`'s value if it settles within `ms`, else with undefined (`p` goes on). */
async function within<T>(p: Promise<T>, ms: number): Promise<T | undefined> {
  let timer: ReturnType<typeof setTimeout> | undefined;
  const late = new Promise<undefined>((r) => (timer = setTimeout(() => r(undefined), ms)));
  try {
    return await Promise.race([p, late]);
  } finally {
    clearTimeout(timer);
  }
}
