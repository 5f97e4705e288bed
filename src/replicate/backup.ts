/**
 * One volume's backup, the whole step: take `<dataset>@.backup-<unix seconds>-<sequence>`, send
 * it to the store (incrementally from the newest local snapshot the store already holds), write
 * its manifest last, then prune the store by the volume's keep policy and destroy the older
 * `.backup-*` snapshots the plugin made. {@linkcode backupSnapshot} stores a snapshot a user
 * asked for (CreateSnapshot) the same way, and prunes nothing.
 *
 * The sequence number (src/store/chain.ts) is one more than the highest the store and the
 * dataset hold: it orders the volume's backups without any clock, and it makes the snapshot's
 * name unique for ever along any chain, so a chain always receives into one dataset.
 *
 * The prune never removes what this backup just stored, nor (through `protect`) the head's
 * chain of a volume that follows its job, and it is safe against another node basing a new
 * incremental on what it removes (records.ts removeManifests; this side: {@linkcode
 * sendAndRecord} reads its base's manifest again after writing its own).
 *
 * The volume's lock is held only around the zfs steps (reading the dataset, the snapshot, the
 * properties, the local prune), never during the upload: stage and publish of the volume wait
 * at most for one short zfs command. Backups of one node run one at a time (scheduler.ts).
 */

import { Code, CsiError } from "../errors.ts";
import { type KeyedLock, LockTimeoutError } from "../lock.ts";
import type { Logger } from "../log.ts";
import { encodeJson, nextSequence, parseManifest } from "../store/chain.ts";
import {
  guidHex,
  type KeepPolicy,
  manifestKey,
  type SnapshotKind,
  type SnapshotManifest,
  streamKey,
} from "../store/layout.ts";
import { pruneOrder, retained } from "../store/policy.ts";
import { type Store, StoreError } from "../store/store.ts";
import { PLAIN_FORM } from "../zfs/stream_form.ts";
import type { Zfs } from "../zfs/zfs.ts";
import { backupSequenceOf } from "../volume/backup_names.ts";
import {
  BACKUP_LAST_PROPERTY,
  checkSameVolume,
  destroyBackups,
  keepOf,
  type LocalSnapshot,
  nextBackupSequence,
  parametersOf,
  pickBase,
  pruneLocal,
  randomHex,
  readVolume,
  scheduleOf,
  takeSnapshot,
  type Volume,
} from "./local.ts";
import { ensureRecord, type ManifestCache, readManifests, removeManifests } from "./records.ts";
import type { SendToStoreSpec, SentStream } from "./send.ts";

export {
  BACKUP_INTERVAL_PROPERTY,
  BACKUP_KEEP_PROPERTY,
  BACKUP_LAST_PROPERTY,
  type LocalSnapshot,
  pickBase,
  STORE_UID_PROPERTY,
} from "./local.ts";

/** What a backup works with. */
export interface BackupDeps {
  readonly zfs: Zfs;
  readonly store: Store;
  /** Sends one stream to the store: `(spec) => sendToStore(sendDeps, spec)` (send.ts). */
  readonly send: (spec: SendToStoreSpec) => Promise<SentStream>;
  readonly locks: KeyedLock;
  readonly log: Logger;
  readonly parentDataset: string;
  /** This node's id, recorded in manifests and the record. */
  readonly node: string;
  /** The keep policy of volumes without `org.zfs-csi:backup-keep`; none: no pruning. */
  readonly defaultKeep?: KeepPolicy;
  /** See policy.ts needsFull. */
  readonly maxChainLength?: number;
  readonly maxChainAgeMs?: number;
  /** How long to wait for the volume's lock after an upload (default 60 s). */
  readonly lockWaitMs?: number;
  /** Manifests read before, kept between backups (one cache per store). */
  readonly cache?: ManifestCache;
  /**
   * What the keep policy of a volume must keep besides its own rules, read before each prune
   * with the volume's manifests (of its uid, listed after its upload): a volume that follows
   * its job keeps its head's chain, and is pruned only by its holder (src/follow/head.ts).
   */
  readonly protect?: (
    volumeKey: string,
    manifests: readonly SnapshotManifest[],
  ) => Promise<PruneGuard>;
  /** Milliseconds since the epoch; replaceable in tests. */
  readonly now?: () => number;
  /** Random lowercase hex of `bytes` bytes; replaceable in tests. */
  readonly randomHex?: (bytes: number) => string;
}

/** What {@linkcode BackupDeps.protect} says of one prune. */
export type PruneGuard =
  /** Prune, keeping these guids (a closed set: every base of one is in it) too. */
  | { readonly keep: ReadonlySet<string> }
  /**
   * Do not prune now; `skip` says why (for the log). `listAgain`: the listing lacked what the
   * guard needs (the head), so a newer listing may do.
   */
  | { readonly skip: string; readonly listAgain: boolean };

/** Options of one backup. */
export interface BackupOptions {
  /** Stops the upload; nothing becomes visible in the store. */
  readonly signal?: AbortSignal;
  /** Return "busy" at once when the volume's lock is held, instead of waiting for it. */
  readonly skipIfBusy?: boolean;
}

/** What a backup did. */
export type BackupOutcome =
  | { readonly status: "busy" }
  | {
    readonly status: "stored";
    readonly manifest: SnapshotManifest;
    /** False when the store already held the snapshot. */
    readonly sent: boolean;
    /** Guids removed from the store by the keep policy. */
    readonly pruned: readonly string[];
    /** Local `.backup-*` snapshots destroyed. */
    readonly destroyed: readonly string[];
  };

/**
 * Backs up one volume (a direct child of the parent dataset): see the module doc.
 * @throws {CsiError} NOT_FOUND when the dataset is gone; FAILED_PRECONDITION when it is not a
 *   volume of the plugin or its store record belongs to another volume of this name
 * @throws {ZfsError} when zfs fails
 * @throws {StoreError} when the store fails
 */
export async function backupVolume(
  deps: BackupDeps,
  dataset: string,
  options: BackupOptions = {},
): Promise<BackupOutcome> {
  const now = deps.now ?? Date.now;
  const log = deps.log.child({ dataset });
  const volume = await underLock(deps, dataset, options, () => readVolume(deps, dataset));
  if (!volume) return { status: "busy" };
  const stored = await prepareStore(deps, volume);
  const sequence = nextBackupSequence(volume.snapshots, stored.nextSequence);
  const snap = await underLock(deps, dataset, options, async () => {
    await checkSameVolume(deps, volume);
    await dropUnstored(deps, dataset, stored);
    return await takeSnapshot(deps, dataset, { seconds: Math.floor(now() / 1000), sequence });
  });
  if (!snap) return { status: "busy" };
  const { manifest, sent } = await sendAndRecord(deps, volume, stored, snap, "scheduled", options);
  // The upload is done: wait for the lock, however busy the volume is meanwhile.
  const destroyed = await underLock(deps, dataset, {}, async () => {
    await deps.zfs.set(dataset, BACKUP_LAST_PROPERTY, String(snap.creation));
    return await pruneLocal(deps, dataset, snap);
  });
  if (!destroyed) {
    log.warn("backup stored, but the volume stayed busy: its local prune waits for the next one");
  }
  const pruned = await pruneStore(deps, volume, manifest, log);
  return { status: "stored", manifest, sent, pruned, destroyed: destroyed ?? [] };
}

/** A snapshot a user asked to store, and how CreateSnapshot named it. */
export interface SnapshotToStore {
  readonly dataset: string;
  /** `<dataset>@<component>`. */
  readonly snapshot: string;
  /** The CSI snapshot name. */
  readonly csiName: string;
  /**
   * For a zvol: whether its format record said done before the snapshot was taken (read by
   * the caller, which took it). Unknown (a snapshot taken earlier) counts as not formatted.
   */
  readonly formattedBefore?: boolean;
}

/**
 * Stores an existing snapshot of a volume as kind "requested" (kept until DeleteSnapshot),
 * incrementally from the newest older local snapshot the store holds. Stored already: returns
 * its manifest. Call it outside the volume's lock (it takes the lock briefly itself).
 * @throws as {@linkcode backupVolume}; CsiError NOT_FOUND when the snapshot is gone
 */
export async function backupSnapshot(
  deps: BackupDeps,
  target: SnapshotToStore,
  options: BackupOptions = {},
): Promise<BackupOutcome> {
  const { dataset, snapshot } = target;
  if (!snapshot.startsWith(`${dataset}@`)) {
    throw new TypeError(`"${snapshot}" is not a snapshot of "${dataset}"`);
  }
  const read = await underLock(deps, dataset, options, () => readVolume(deps, dataset));
  if (!read) return { status: "busy" };
  // Read after the snapshot was taken: only the caller knows the record before it.
  const volume: Volume = read.zvol
    ? {
      ...read,
      zvol: { ...read.zvol, formatted: read.zvol.formatted && target.formattedBefore === true },
    }
    : read;
  const snap = volume.snapshots.find((s) => s.name === snapshot);
  if (!snap) throw new CsiError(Code.NOT_FOUND, `Snapshot "${snapshot}" does not exist`);
  const stored = await prepareStore(deps, volume);
  const { manifest, sent } = await sendAndRecord(
    deps,
    volume,
    stored,
    snap,
    "requested",
    options,
    target.csiName,
  );
  return { status: "stored", manifest, sent, pruned: [], destroyed: [] };
}

/**
 * Runs `fn` holding the volume's lock: taken at once or not at all with skipIfBusy, else
 * waited for (up to lockWaitMs). Undefined when the lock was not had.
 */
async function underLock<T>(
  deps: BackupDeps,
  dataset: string,
  options: BackupOptions,
  fn: () => Promise<T>,
): Promise<T | undefined> {
  const held = await lockFor(deps, dataset, options);
  if (!held) return undefined;
  try {
    return await fn();
  } finally {
    held.release();
  }
}

/** The volume's lock: at once or not at all with skipIfBusy, else within the wait. */
async function lockFor(deps: BackupDeps, dataset: string, options: BackupOptions) {
  const label = "a backup";
  if (options.skipIfBusy) return deps.locks.tryAcquire([dataset], label);
  try {
    return await deps.locks.acquire([dataset], { timeoutMs: deps.lockWaitMs ?? 60_000, label });
  } catch (err) {
    if (err instanceof LockTimeoutError) return undefined;
    throw err;
  }
}

/** What the store holds of a volume, read before its snapshot is taken. */
interface StoredState {
  /** The manifests of the volume's uid. */
  readonly mine: SnapshotManifest[];
  /** Guids (as hex) of every manifest key, readable or not, of any uid. */
  readonly guidHexes: ReadonlySet<string>;
  /** One more than the highest sequence number of any manifest of the volume. */
  readonly nextSequence: number;
}

/** Puts the volume's record right, then reads its manifests. */
async function prepareStore(deps: BackupDeps, volume: Volume): Promise<StoredState> {
  const now = deps.now ?? Date.now;
  const schedule = scheduleOf(volume.props, deps.defaultKeep);
  await ensureRecord(deps.store, volume.volumeKey, {
    name: volume.name,
    uid: volume.uid,
    capacityBytes: volume.capacityBytes,
    parameters: parametersOf(volume.props),
    ...(schedule ? { schedule } : {}),
    node: deps.node,
    nowMs: now(),
  });
  return await readStored(deps, volume);
}

/** The volume's manifests as the store holds them now. */
async function readStored(deps: BackupDeps, volume: Volume): Promise<StoredState> {
  const read = await readManifests(deps.store, volume.volumeKey, deps.log, deps.cache);
  const guidHexes = new Set(read.manifests.map((m) => guidHex(m.guid)));
  for (const key of read.unreadable) guidHexes.add(key.slice(key.lastIndexOf("/") + 1, -5));
  return {
    mine: read.manifests.filter((m) => m.volumeUid === volume.uid),
    guidHexes,
    nextSequence: nextSequence(read.manifests),
  };
}

/**
 * Destroys the `.backup-*` snapshots of `dataset` the store has no manifest for: left by a
 * backup whose upload failed, they can never be a base. At most one is then left behind by a
 * store that stays down. The caller holds the lock.
 */
async function dropUnstored(deps: BackupDeps, dataset: string, stored: StoredState) {
  await destroyBackups(deps, dataset, (s) => !stored.guidHexes.has(guidHex(s.guid)));
}

/** The base of an incremental was removed from the store while it uploaded. */
class BaseGone extends Error {}

/** How often a backup starts its upload again when its base was removed meanwhile. */
const BASE_GONE_ATTEMPTS = 3;

/**
 * Sends `snap` (incrementally where it can) and writes its manifest last (If-None-Match). When
 * another node removed the base meanwhile (a DeleteSnapshot, a prune), the upload is withdrawn
 * and done again on what the store holds now (see {@linkcode sendOnce}).
 * @throws {CsiError} ABORTED when that keeps happening
 */
async function sendAndRecord(
  deps: BackupDeps,
  volume: Volume,
  stored: StoredState,
  snap: LocalSnapshot,
  kind: SnapshotKind,
  options: BackupOptions,
  csiName?: string,
): Promise<{ manifest: SnapshotManifest; sent: boolean }> {
  for (let attempt = 1;; attempt++) {
    try {
      return await sendOnce(deps, volume, stored, snap, kind, options, csiName);
    } catch (err) {
      if (!(err instanceof BaseGone)) throw err;
      deps.log.warn("backup's base was removed from the store while it uploaded; sent again", {
        dataset: volume.dataset,
        snapshot: snap.name,
        reason: err.message,
        attempt,
      });
      if (attempt >= BASE_GONE_ATTEMPTS) {
        throw new CsiError(
          Code.ABORTED,
          `Backup of "${snap.name}" to ${deps.store.description} lost its base ${attempt} times ` +
            `in a row (another node keeps removing stored snapshots of this volume); retrying later`,
          { cause: err },
        );
      }
      stored = await readStored(deps, volume);
    }
  }
}

/**
 * One upload of `snap` and its manifest. An incremental's manifest is written, then its base's
 * manifest read again: a node that removes that base (records.ts removeManifests) removes the
 * base's manifest first and then lists the volume again, so on a linearizable store either it
 * sees this manifest (and puts its base back) or this read sees the base gone, and the new
 * manifest and stream are removed again (thrown as {@linkcode BaseGone}): no chain is left with
 * a missing base either way.
 */
async function sendOnce(
  deps: BackupDeps,
  volume: Volume,
  stored: StoredState,
  snap: LocalSnapshot,
  kind: SnapshotKind,
  options: BackupOptions,
  csiName: string | undefined,
): Promise<{ manifest: SnapshotManifest; sent: boolean }> {
  const now = deps.now ?? Date.now;
  const log = deps.log.child({ dataset: volume.dataset, snapshot: snap.name });
  const { volumeKey, uid } = volume;
  const { mine } = stored;
  const capacityBytes = volume.capacityBytes;
  const already = mine.find((m) => m.guid === snap.guid);
  if (already) return { manifest: already, sent: false };
  const base = pickBase(volume.snapshots, mine, {
    before: snap.createtxg,
    name: snap.component,
    nowMs: now(),
    ...(deps.maxChainLength === undefined ? {} : { maxChainLength: deps.maxChainLength }),
    ...(deps.maxChainAgeMs === undefined ? {} : { maxChainAgeMs: deps.maxChainAgeMs }),
  });
  const key = streamKey(volumeKey, snap.guid, (deps.randomHex ?? randomHex)(16));
  const started = now();
  const sent = await deps.send({
    snapshot: snap.name,
    // An incremental keeps its chain's -L (src/zfs/stream_form.ts); no form: a plain stream.
    ...(base
      ? { base: base.name, baseForm: mine.find((m) => m.guid === base.guid)?.form ?? PLAIN_FORM }
      : {}),
    raw: volume.raw,
    key,
    ...(options.signal ? { signal: options.signal } : {}),
  });
  const manifest: SnapshotManifest = {
    format: 1,
    volume: volume.name,
    volumeUid: uid,
    guid: snap.guid,
    baseGuid: base?.guid ?? null,
    snapshot: snap.component,
    ...(csiName === undefined ? {} : { csiName }),
    kind,
    createdAt: new Date(snap.creation * 1000).toISOString(),
    sequence: Math.max(stored.nextSequence, backupSequenceOf(snap.component) ?? 0),
    stream: key,
    size: sent.size,
    sha256: sent.sha256,
    raw: volume.raw,
    ...(sent.form ? { form: sent.form } : {}),
    node: deps.node,
    capacityBytes,
    ...(volume.zvol ? { zvol: volume.zvol } : {}),
    ...(snap.referenced === undefined ? {} : { referencedBytes: snap.referenced }),
  };
  const written = await writeManifest(deps.store, volumeKey, manifest);
  if (
    base && written === manifest && !(await deps.store.getBytes(manifestKey(volumeKey, base.guid)))
  ) {
    await deps.store.delete(manifestKey(volumeKey, manifest.guid));
    await deps.store.delete(manifest.stream);
    throw new BaseGone(`base "${base.name}" (guid ${base.guid}) is no longer in the store`);
  }
  log.info("backup stored", {
    guid: snap.guid,
    sequence: written.sequence ?? null,
    base: base?.name ?? null,
    bytes: sent.size,
    ms: now() - started,
    ...(written === manifest ? {} : { alreadyStored: true }),
  });
  return { manifest: written, sent: written === manifest };
}

/**
 * Writes a manifest last, with If-None-Match. Losing to a manifest of the same snapshot and
 * uid (a retry, another writer) is fine: that one stands and this upload's stream goes.
 * @throws {StoreError} precondition_failed when another volume's manifest holds the key
 */
async function writeManifest(
  store: Store,
  volumeKey: string,
  manifest: SnapshotManifest,
): Promise<SnapshotManifest> {
  const key = manifestKey(volumeKey, manifest.guid);
  try {
    await store.putBytes(key, encodeJson(manifest), { ifNoneMatch: "*" });
    return manifest;
  } catch (err) {
    if (!(err instanceof StoreError && err.kind === "precondition_failed")) throw err;
    const got = await store.getBytes(key);
    let other: SnapshotManifest | undefined;
    try {
      other = got && parseManifest(got.bytes, { key });
    } catch {
      // Unreadable: not ours to replace.
    }
    if (other?.guid !== manifest.guid || other.volumeUid !== manifest.volumeUid) throw err;
    await store.delete(manifest.stream);
    return other;
  }
}

/** How often a prune lists the store when its guard says the listing lacked the head. */
const PRUNE_LISTINGS = 2;

/**
 * Prunes the volume's stored snapshots by its keep policy, from a listing read after the
 * upload: never `stored` (what this backup just stored) nor anything `protect` keeps, with
 * every base they need. When the guard says the listing lacks the head (a holder paused past
 * its lease, a head moved meanwhile), it lists again once, then gives up until the next backup.
 * The removal itself is records.ts removeManifests.
 */
async function pruneStore(
  deps: BackupDeps,
  volume: Volume,
  stored: SnapshotManifest,
  log: Logger,
): Promise<string[]> {
  const policy = keepOf(volume.props, deps.defaultKeep, log);
  if (!policy) return [];
  for (let listing = 1;; listing++) {
    const read = await readManifests(deps.store, volume.volumeKey, log, deps.cache);
    const manifests = read.manifests.filter((m) => m.volumeUid === volume.uid);
    const guard = await deps.protect?.(volume.volumeKey, manifests) ?? { keep: new Set() };
    if ("skip" in guard) {
      if (guard.listAgain && listing < PRUNE_LISTINGS) continue;
      log.info("store not pruned", { reason: guard.skip });
      return [];
    }
    const kept = retained(manifests, policy, { protect: [stored.guid, ...guard.keep] });
    const doomed = pruneOrder(manifests, kept);
    if (doomed.length === 0) return [];
    const { removed, restored } = await removeManifests(deps.store, volume.volumeKey, doomed, log, {
      ...(deps.cache ? { cache: deps.cache } : {}),
    });
    const pruned = removed.map((m) => m.guid);
    if (pruned.length > 0) log.info("store pruned", { guids: pruned });
    if (restored.length > 0) {
      log.warn("store prune kept snapshots another node based a backup on meanwhile", {
        guids: restored.map((m) => m.guid),
      });
    }
    return pruned;
  }
}
