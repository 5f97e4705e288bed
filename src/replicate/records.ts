/**
 * One volume's objects in the store, read and written as layout.ts says: its manifests (read
 * through a small cache, since a manifest never changes once written), its record (created
 * with If-None-Match, rewritten with If-Match), and the removal of one stored snapshot.
 */

import { Code, CsiError } from "../errors.ts";
import type { Logger } from "../log.ts";
import { encodeJson, parseManifest, parseVolumeRecord } from "../store/chain.ts";
import {
  manifestKey,
  manifestsPrefix,
  type SnapshotManifest,
  type VolumeRecord,
  volumeRecordKey,
} from "../store/layout.ts";
import { type Store, StoreError } from "../store/store.ts";

/** Manifests already read, by key, with the etag they had: a listing with the same etag is trusted. */
export type ManifestCache = Map<
  string,
  { readonly etag: string; readonly manifest: SnapshotManifest }
>;

/** What {@linkcode readManifests} found under a volume's `snapshots/`. */
export interface VolumeManifests {
  readonly manifests: SnapshotManifest[];
  /** Keys of manifests that could not be read: never pruned, for the operator to look at. */
  readonly unreadable: string[];
}

/**
 * Every manifest of one volume (all uids). A manifest that does not parse is logged and listed
 * in `unreadable`, never thrown: one damaged object must not stop a volume's backups.
 * @throws {StoreError} when the store fails
 */
export async function readManifests(
  store: Store,
  volumeKey: string,
  log: Logger,
  cache?: ManifestCache,
): Promise<VolumeManifests> {
  const manifests: SnapshotManifest[] = [];
  const unreadable: string[] = [];
  const prefix = manifestsPrefix(volumeKey);
  const listed = await store.list(prefix);
  const keys = new Set(listed.map((o) => o.key));
  for (const obj of listed) {
    if (!obj.key.endsWith(".json")) continue;
    const read = await readManifest(store, obj, log, cache);
    if (read === "unreadable") unreadable.push(obj.key);
    else if (read) manifests.push(read);
  }
  // Forget this volume's manifests that are gone (the cache may hold other volumes' too).
  for (const key of cache?.keys() ?? []) {
    if (key.startsWith(prefix) && !keys.has(key)) cache!.delete(key);
  }
  return { manifests, unreadable };
}

/**
 * One listed manifest, through `cache` when its etag is the listed one. A manifest that does not
 * parse is logged and answered "unreadable", never thrown; undefined when it is gone since the
 * listing (a prune elsewhere).
 * @throws {StoreError} when the store fails
 */
export async function readManifest(
  store: Store,
  obj: { readonly key: string; readonly etag: string },
  log: Logger,
  cache?: ManifestCache,
): Promise<SnapshotManifest | "unreadable" | undefined> {
  const hit = cache?.get(obj.key);
  if (hit && hit.etag === obj.etag) return hit.manifest;
  const got = await store.getBytes(obj.key);
  if (!got) return undefined;
  try {
    const manifest = parseManifest(got.bytes, { key: obj.key });
    cache?.set(obj.key, { etag: got.etag, manifest });
    return manifest;
  } catch (err) {
    log.warn("store holds a manifest that cannot be read; it is left as it is", {
      key: obj.key,
      store: store.description,
      error: err,
    });
    return "unreadable";
  }
}

/** What a backup wants the volume's record to say. */
export interface RecordWanted {
  readonly name: string;
  readonly uid: string;
  readonly capacityBytes: number;
  readonly parameters: Readonly<Record<string, string>>;
  readonly schedule?: VolumeRecord["schedule"];
  readonly node: string;
  /** Now, for a new record's createdAt. */
  readonly nowMs: number;
}

const RECORD_ATTEMPTS = 5;

/**
 * Makes the volume's record say what `want` says: creates it (If-None-Match) when absent, else
 * updates it (If-Match) where it differs, clearing `deletedAt` (a backup of the same uid means
 * the volume lives). Fields it does not know are kept. A lost race reads it again.
 * @throws {CsiError} FAILED_PRECONDITION when the record belongs to another uid (another volume
 *   of this name writes there) or cannot be read
 * @throws {StoreError} when the store fails, or the record keeps changing under it
 */
export async function ensureRecord(
  store: Store,
  volumeKey: string,
  want: RecordWanted,
): Promise<VolumeRecord> {
  const key = volumeRecordKey(volumeKey);
  return await updateRecord(
    store,
    key,
    "while a backup wrote it; retrying later",
    (got): RecordChange<VolumeRecord> => {
      if (!got) {
        const next: VolumeRecord = {
          format: 1,
          name: want.name,
          uid: want.uid,
          createdAt: new Date(want.nowMs).toISOString(),
          capacityBytes: want.capacityBytes,
          parameters: want.parameters,
          ...(want.schedule ? { schedule: want.schedule } : {}),
          node: want.node,
        };
        return { write: next, result: next };
      }
      const current = readRecord(got, key, store);
      if (current.uid !== want.uid) {
        throw new CsiError(
          Code.FAILED_PRECONDITION,
          `Cannot back up volume "${want.name}" to ${store.description}: "${key}" belongs to ` +
            `another volume of this name (uid ${current.uid}${
              current.deletedAt ? `, deleted at ${current.deletedAt}` : ""
            }; this volume's uid is ${want.uid}). Its backups stay until they are pruned; ` +
            `give this volume another name, or remove that volume's objects from the store`,
        );
      }
      const { deletedAt: _, schedule: __, ...kept } = current;
      const next: VolumeRecord = {
        ...kept,
        capacityBytes: want.capacityBytes,
        parameters: want.parameters,
        ...(want.schedule ? { schedule: want.schedule } : {}),
        node: want.node,
      };
      if (JSON.stringify(next) === JSON.stringify(current)) return { result: current };
      return { write: next, result: next };
    },
  );
}

/** What {@linkcode updateRecord}'s change decided: a record to write, or nothing to write. */
export type RecordChange<T> =
  | { readonly write: VolumeRecord; readonly result: T }
  | { readonly write?: undefined; readonly result: T };

/**
 * The read-modify-write of a volume record: `change` sees its bytes (undefined when absent) and
 * says what to write; the write is conditional (If-None-Match when it was absent, else If-Match
 * on the etag read), and a lost race reads it again, up to 5 times.
 * @param busy how the error for a record that keeps changing ends, after "kept changing "
 * @throws {StoreError} when the store fails, or the record keeps changing under it
 */
export async function updateRecord<T>(
  store: Store,
  key: string,
  busy: string,
  change: (bytes: Uint8Array | undefined) => RecordChange<T>,
): Promise<T> {
  for (let attempt = 1;; attempt++) {
    const got = await store.getBytes(key);
    const decided = change(got?.bytes);
    if (decided.write === undefined) return decided.result;
    const condition = got ? { ifMatch: got.etag } : { ifNoneMatch: "*" } as const;
    try {
      await store.putBytes(key, encodeJson(decided.write), condition);
      return decided.result;
    } catch (err) {
      if (!(err instanceof StoreError && err.kind === "precondition_failed")) throw err;
      if (attempt >= RECORD_ATTEMPTS) {
        throw new StoreError(
          "unavailable",
          `"${key}" in ${store.description} kept changing ${busy}`,
          { cause: err },
        );
      }
    }
  }
}

/**
 * Reads a record, or refuses: a record the plugin cannot read is never overwritten.
 * @throws {CsiError} FAILED_PRECONDITION naming the key and what is wrong
 */
export function readRecord(bytes: Uint8Array, key: string, store: Store): VolumeRecord {
  try {
    return parseVolumeRecord(bytes);
  } catch (err) {
    throw new CsiError(
      Code.FAILED_PRECONDITION,
      `"${key}" in ${store.description} cannot be read (${(err as Error).message}); ` +
        `it is left as it is: repair or remove it`,
      { cause: err },
    );
  }
}

/** Options of {@linkcode removeManifests}. */
export interface RemoveOptions {
  /** The manifest to put back for one that turns out to be needed (default: as it was). */
  readonly putBack?: (manifest: SnapshotManifest) => SnapshotManifest;
  /** Asked before each manifest is removed: false stops the removal there. */
  readonly proceed?: () => Promise<boolean>;
  readonly cache?: ManifestCache;
}

/** What {@linkcode removeManifests} did. */
export interface Removal {
  /** Removed, manifest and stream. */
  readonly removed: SnapshotManifest[];
  /** Removed, then put back: another writer based a new snapshot on it meanwhile. */
  readonly restored: SnapshotManifest[];
}

/**
 * Removes stored snapshots of one volume, safely while another node may base a new incremental
 * on one of them (its backup read the listing before this began). Every manifest goes first
 * (in the order given: leaves first), which is the moment a snapshot stops existing; then the
 * volume's manifests are listed again, and a removed one that a listed manifest needs (directly
 * or through other removed ones) is put back as it was (`putBack`); only then do the streams of
 * the others go. The writing side (backup.ts) writes its manifest and then reads its base's
 * again, withdrawing its own if the base is gone. On a linearizable store (S3, the directory
 * store) at least one side sees the other: the writer's manifest is listed here (and its base
 * put back), or the writer finds its base gone (and withdraws); so no manifest is left without
 * its base, and no stream is removed while a manifest needs it. A crash between a manifest's
 * removal and its stream's leaves an orphan stream, which the store-wide prune removes.
 * @throws {StoreError} when the store fails
 */
export async function removeManifests(
  store: Store,
  volumeKey: string,
  doomed: readonly SnapshotManifest[],
  log: Logger,
  options: RemoveOptions = {},
): Promise<Removal> {
  const gone: SnapshotManifest[] = [];
  for (const m of doomed) {
    if (options.proceed && !(await options.proceed())) break;
    await store.delete(manifestKey(volumeKey, m.guid));
    gone.push(m);
  }
  if (gone.length === 0) return { removed: [], restored: [] };
  const { manifests } = await readManifests(store, volumeKey, log, options.cache);
  const byGuid = new Map(gone.map((m) => [m.guid, m]));
  const needed = new Set<string>();
  for (const m of manifests) {
    for (let base = m.baseGuid; base !== null && byGuid.has(base) && !needed.has(base);) {
      needed.add(base);
      base = byGuid.get(base)!.baseGuid;
    }
  }
  const restored: SnapshotManifest[] = [];
  // Bases first, so that a reader never meets a put-back manifest without its base.
  for (const m of [...gone].reverse()) {
    if (!needed.has(m.guid)) continue;
    const back = (options.putBack ?? ((x) => x))(m);
    try {
      await store.putBytes(manifestKey(volumeKey, m.guid), encodeJson(back), { ifNoneMatch: "*" });
    } catch (err) {
      // Someone wrote it back first: it is there either way.
      if (!(err instanceof StoreError && err.kind === "precondition_failed")) throw err;
    }
    restored.push(m);
  }
  const removed = gone.filter((m) => !needed.has(m.guid));
  for (const m of removed) await store.delete(m.stream);
  return { removed, restored };
}

/** What {@linkcode releaseStored} did. */
export type ReleaseOutcome = "removed" | "released" | "absent";

/**
 * Lets go of a stored snapshot a user asked for (DeleteSnapshot): it is removed at once
 * (manifest, then stream) when no other stored snapshot is based on it; otherwise it becomes
 * kind "scheduled" (its manifest rewritten with If-Match), and the volume's keep policy removes
 * it once nothing needs it. Safe while another node backs the volume up and bases a new
 * incremental on it meanwhile (see {@linkcode removeManifests}): it is then put back, as kind
 * "scheduled", and the answer is "released".
 * @returns "absent" when the store has no such snapshot
 * @throws {StoreError} when the store fails or the manifest changes meanwhile
 */
export async function releaseStored(
  store: Store,
  volumeKey: string,
  guid: string,
  log: Logger,
): Promise<ReleaseOutcome> {
  const key = manifestKey(volumeKey, guid);
  const got = await store.getBytes(key);
  if (!got) return "absent";
  const manifest = parseManifest(got.bytes, { key });
  const { manifests } = await readManifests(store, volumeKey, log);
  if (!manifests.some((m) => m.baseGuid === guid)) {
    const { removed } = await removeManifests(store, volumeKey, [manifest], log, {
      putBack: asScheduled,
    });
    if (removed.length > 0) return "removed";
    log.info("stored snapshot kept as a scheduled backup: a backup based on it meanwhile", {
      volumeKey,
      guid,
    });
    return "released";
  }
  if (manifest.kind === "requested") {
    await store.putBytes(key, encodeJson(asScheduled(manifest)), { ifMatch: got.etag });
  }
  return "released";
}

/** A manifest as a scheduled backup: no longer pinned by a user, no CSI name. */
function asScheduled(manifest: SnapshotManifest): SnapshotManifest {
  const { csiName: _, ...rest } = manifest;
  return { ...rest, kind: "scheduled" };
}
