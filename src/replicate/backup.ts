/**
 * One volume's backup, the whole step: take `<dataset>@.backup-<unix seconds>`, send it to the
 * store (incrementally from the newest local snapshot the store already holds), write its
 * manifest last, then prune the store by the volume's keep policy and destroy the older
 * `.backup-*` snapshots the plugin made. {@linkcode backupSnapshot} stores a snapshot a user
 * asked for (CreateSnapshot) the same way, and prunes nothing.
 *
 * The volume's lock is held only around the zfs steps (reading the dataset, the snapshot, the
 * properties, the local prune), never during the upload: stage and publish of the volume wait
 * at most for one short zfs command. Backups of one node run one at a time (scheduler.ts).
 */

import { Code, CsiError } from "../errors.ts";
import { type KeyedLock, LockTimeoutError } from "../lock.ts";
import type { Logger } from "../log.ts";
import { encodeJson, parseManifest } from "../store/chain.ts";
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
import type { Zfs } from "../zfs/zfs.ts";
import {
  BACKUP_LAST_PROPERTY,
  checkSameVolume,
  destroyBackups,
  keepOf,
  type LocalSnapshot,
  parametersOf,
  pickBase,
  pruneLocal,
  randomHex,
  readVolume,
  safeCount,
  scheduleOf,
  takeSnapshot,
  type Volume,
} from "./local.ts";
import { ensureRecord, type ManifestCache, readManifests, removeStored } from "./records.ts";
import type { SendToStoreSpec, SentStream } from "./send.ts";

export {
  BACKUP_INTERVAL_PROPERTY,
  BACKUP_KEEP_PROPERTY,
  BACKUP_LAST_PROPERTY,
  BACKUP_PREFIX,
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
   * Guids the keep policy must never prune, whatever their age: a volume that follows its job
   * keeps its head's chain (src/follow/head.ts). Called before each prune; a closed set (every
   * base of a guid in it is in it).
   */
  readonly protect?: (
    volumeKey: string,
    manifests: readonly SnapshotManifest[],
  ) => Promise<ReadonlySet<string>>;
  /** Milliseconds since the epoch; replaceable in tests. */
  readonly now?: () => number;
  /** Random lowercase hex of `bytes` bytes; replaceable in tests. */
  readonly randomHex?: (bytes: number) => string;
}

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
  const snap = await underLock(deps, dataset, options, async () => {
    await checkSameVolume(deps, volume);
    await dropUnstored(deps, dataset, stored);
    return await takeSnapshot(deps, dataset, Math.floor(now() / 1000));
  });
  if (!snap) return { status: "busy" };
  const { manifest, sent, manifests } = await sendAndRecord(
    deps,
    volume,
    stored.mine,
    snap,
    "scheduled",
    options,
  );
  // The upload is done: wait for the lock, however busy the volume is meanwhile.
  const destroyed = await underLock(deps, dataset, {}, async () => {
    await deps.zfs.set(dataset, BACKUP_LAST_PROPERTY, String(snap.creation));
    return await pruneLocal(deps, dataset, snap);
  });
  if (!destroyed) {
    log.warn("backup stored, but the volume stayed busy: its local prune waits for the next one");
  }
  const pruned = await pruneStore(deps, volume, manifests, log);
  return { status: "stored", manifest, sent, pruned, destroyed: destroyed ?? [] };
}

/** A snapshot a user asked to store, and how CreateSnapshot named it. */
export interface SnapshotToStore {
  readonly dataset: string;
  /** `<dataset>@<component>`. */
  readonly snapshot: string;
  /** The CSI snapshot name. */
  readonly csiName: string;
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
  const volume = await underLock(deps, dataset, options, () => readVolume(deps, dataset));
  if (!volume) return { status: "busy" };
  const snap = volume.snapshots.find((s) => s.name === snapshot);
  if (!snap) throw new CsiError(Code.NOT_FOUND, `Snapshot "${snapshot}" does not exist`);
  const { mine } = await prepareStore(deps, volume);
  const { manifest, sent } = await sendAndRecord(
    deps,
    volume,
    mine,
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
}

/** Puts the volume's record right, then reads its manifests. */
async function prepareStore(deps: BackupDeps, volume: Volume): Promise<StoredState> {
  const now = deps.now ?? Date.now;
  const schedule = scheduleOf(volume.props, deps.defaultKeep);
  await ensureRecord(deps.store, volume.volumeKey, {
    name: volume.name,
    uid: volume.uid,
    capacityBytes: safeCount(volume.props.get("refquota")?.value),
    parameters: parametersOf(volume.props),
    ...(schedule ? { schedule } : {}),
    node: deps.node,
    nowMs: now(),
  });
  const read = await readManifests(deps.store, volume.volumeKey, deps.log, deps.cache);
  const guidHexes = new Set(read.manifests.map((m) => guidHex(m.guid)));
  for (const key of read.unreadable) guidHexes.add(key.slice(key.lastIndexOf("/") + 1, -5));
  return { mine: read.manifests.filter((m) => m.volumeUid === volume.uid), guidHexes };
}

/**
 * Destroys the `.backup-*` snapshots of `dataset` the store has no manifest for: left by a
 * backup whose upload failed, they can never be a base. At most one is then left behind by a
 * store that stays down. The caller holds the lock.
 */
async function dropUnstored(deps: BackupDeps, dataset: string, stored: StoredState) {
  await destroyBackups(deps, dataset, (s) => !stored.guidHexes.has(guidHex(s.guid)));
}

/**
 * Sends `snap` (incrementally where it can) and writes its manifest last (If-None-Match).
 * Returns the volume's manifests of its uid, the new one included.
 */
async function sendAndRecord(
  deps: BackupDeps,
  volume: Volume,
  mine: SnapshotManifest[],
  snap: LocalSnapshot,
  kind: SnapshotKind,
  options: BackupOptions,
  csiName?: string,
): Promise<{ manifest: SnapshotManifest; sent: boolean; manifests: SnapshotManifest[] }> {
  const now = deps.now ?? Date.now;
  const log = deps.log.child({ dataset: volume.dataset, snapshot: snap.name });
  const { volumeKey, uid } = volume;
  const capacityBytes = safeCount(volume.props.get("refquota")?.value);
  const stored = mine.find((m) => m.guid === snap.guid);
  if (stored) return { manifest: stored, sent: false, manifests: mine };
  const base = pickBase(volume.snapshots, mine, {
    before: snap.createtxg,
    nowMs: now(),
    ...(deps.maxChainLength === undefined ? {} : { maxChainLength: deps.maxChainLength }),
    ...(deps.maxChainAgeMs === undefined ? {} : { maxChainAgeMs: deps.maxChainAgeMs }),
  });
  const key = streamKey(volumeKey, snap.guid, (deps.randomHex ?? randomHex)(16));
  const started = now();
  const sent = await deps.send({
    snapshot: snap.name,
    ...(base ? { base: base.name } : {}),
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
    stream: key,
    size: sent.size,
    sha256: sent.sha256,
    raw: volume.raw,
    node: deps.node,
    capacityBytes,
  };
  const written = await writeManifest(deps.store, volumeKey, manifest);
  log.info("backup stored", {
    guid: snap.guid,
    base: base?.name ?? null,
    bytes: sent.size,
    ms: now() - started,
    ...(written === manifest ? {} : { alreadyStored: true }),
  });
  return { manifest: written, sent: written === manifest, manifests: [...mine, written] };
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

/** Prunes the volume's stored snapshots by its keep policy: manifest first, then stream. */
async function pruneStore(
  deps: BackupDeps,
  volume: Volume,
  manifests: readonly SnapshotManifest[],
  log: Logger,
): Promise<string[]> {
  const policy = keepOf(volume.props, deps.defaultKeep, log);
  if (!policy) return [];
  const pruned: string[] = [];
  const kept = new Set(retained(manifests, policy));
  for (const guid of await deps.protect?.(volume.volumeKey, manifests) ?? []) kept.add(guid);
  for (const m of pruneOrder(manifests, kept)) {
    await removeStored(deps.store, volume.volumeKey, m);
    pruned.push(m.guid);
  }
  if (pruned.length > 0) log.info("store pruned", { guids: pruned });
  return pruned;
}
