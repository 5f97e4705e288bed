/**
 * The zfs side of a backup: the volume's dataset and snapshots as read under its lock, its
 * store uid, the `.backup-*` snapshots the plugin takes (named so that no chain ever holds two
 * of one name) and destroys, the choice of the base of an incremental, and the backup
 * properties the operator (or CreateVolume) sets.
 */

import { Code, CsiError, ZfsError } from "../errors.ts";
import type { Logger } from "../log.ts";
import { PARAMETERS_PROPERTY } from "../volume/catalog.ts";
import { chainTo } from "../store/chain.ts";
import {
  type KeepPolicy,
  type SnapshotManifest,
  type StoredZvol,
  type VolumeRecord,
} from "../store/layout.ts";
import { needsFull, parseInterval, parseKeepPolicy } from "../store/policy.ts";
import {
  decodeComponent,
  encodeComponent,
  MANAGED_PROPERTY,
  MANAGED_VALUE,
  STORED_PREFIX,
  volumeForDataset,
} from "../zfs/names.ts";
import { hasOwnMarker, type PropertyMap } from "../zfs/parse.ts";
import { hostStoreName, isHostDataset } from "../volume/host_names.ts";
import { BACKUP_PREFIX, backupSequenceOf, isBackupComponent } from "../volume/backup_names.ts";
import type { Zfs } from "../zfs/zfs.ts";
import { FORMAT, FORMAT_PROPERTY, ZVOL_CONTENT_PROPERTY } from "../volume/zvol.ts";

/** What the zfs side works with (a part of backup.ts BackupDeps). */
export interface LocalDeps {
  readonly zfs: Zfs;
  readonly parentDataset: string;
  readonly log: Logger;
  /** Random lowercase hex of `bytes` bytes; replaceable in tests. */
  readonly randomHex?: (bytes: number) => string;
}

/** Seconds between scheduled backups; its presence turns them on (see DESIGN-store.md). */
export const BACKUP_INTERVAL_PROPERTY = "org.zfs-csi:backup-interval";

/** The volume's keep policy, as {@linkcode parseKeepPolicy} reads it. */
export const BACKUP_KEEP_PROPERTY = "org.zfs-csi:backup-keep";

/** The uid of the store record this dataset writes under (32 hex digits). */
export const STORE_UID_PROPERTY = "org.zfs-csi:store-uid";

/** Unix seconds of the last successful scheduled backup. */
export const BACKUP_LAST_PROPERTY = "org.zfs-csi:backup-last";

const UID = /^[0-9a-f]{32}$/;
const SNAPSHOT_PROPS = ["type", "guid", "createtxg", "creation", "referenced"] as const;
const VOLUME_PROPS = [
  ...SNAPSHOT_PROPS,
  "refquota",
  MANAGED_PROPERTY,
  STORE_UID_PROPERTY,
  BACKUP_INTERVAL_PROPERTY,
  BACKUP_KEEP_PROPERTY,
  PARAMETERS_PROPERTY,
  // A zvol's (docs/block-volumes.md); "-" or absent for a dataset.
  "volsize",
  "volblocksize",
  ZVOL_CONTENT_PROPERTY,
  FORMAT_PROPERTY,
] as const;

/** OpenZFS only: zfs-fuse refuses it, and then has no encrypted datasets. */
const ENCRYPTION = "encryption";

/** A snapshot of the volume as `zfs get` showed it. */
export interface LocalSnapshot {
  /** `<dataset>@<component>`. */
  readonly name: string;
  readonly component: string;
  readonly guid: string;
  readonly createtxg: number;
  /** Unix seconds. */
  readonly creation: number;
  /** Its `referenced` bytes (its size: the manifest records it), when zfs told them. */
  readonly referenced?: number;
}

/** A volume as read under its lock. */
export interface Volume {
  readonly dataset: string;
  readonly name: string;
  readonly volumeKey: string;
  readonly uid: string;
  readonly props: PropertyMap;
  readonly snapshots: readonly LocalSnapshot[];
  readonly raw: boolean;
  /**
   * For a zvol: what it holds, as its manifests record it. `formatted` is the format record
   * as read here, before any snapshot this backup takes (the record only ever goes to done).
   */
  readonly zvol?: StoredZvol;
  /** What the store records as its size: a zvol's volsize, a dataset's refquota (0: none). */
  readonly capacityBytes: number;
}

/** Reads the volume and its snapshots; gives it a store uid if it has none yet. */
export async function readVolume(deps: LocalDeps, dataset: string): Promise<Volume> {
  const name = volumeNameOf(deps.parentDataset, dataset);
  if (name === undefined) {
    throw new CsiError(
      Code.INVALID_ARGUMENT,
      `"${dataset}" is not a volume below "${deps.parentDataset}"`,
    );
  }
  const tree = await readTree(deps.zfs, dataset);
  const props = tree?.get(dataset);
  if (!tree || !props) throw new CsiError(Code.NOT_FOUND, `Volume dataset "${dataset}" is gone`);
  const zvol = type(props) === "volume" ? zvolOf(props) : undefined;
  if (
    !hasOwnMarker(props, MANAGED_PROPERTY, MANAGED_VALUE) ||
    (type(props) !== "filesystem" && !zvol)
  ) {
    throw new CsiError(
      Code.FAILED_PRECONDITION,
      `"${dataset}" is not a volume of zfs-csi (no ${MANAGED_PROPERTY}=${MANAGED_VALUE} of its own)`,
    );
  }
  const snapshots: LocalSnapshot[] = [];
  for (const [n, p] of tree) {
    const local = localSnapshot(dataset, n, p);
    if (local) snapshots.push(local);
  }
  const encryption = props.get(ENCRYPTION)?.value;
  return {
    dataset,
    name,
    volumeKey: encodeComponent("Volume name", name),
    uid: await storeUid(deps, dataset, props),
    props,
    snapshots,
    raw: encryption !== undefined && encryption !== "off" && encryption !== "-",
    ...(zvol ? { zvol } : {}),
    capacityBytes: safeCount(props.get(zvol ? "volsize" : "refquota")?.value),
  };
}

/** What a zvol of the plugin holds, from its records; undefined for one without them. */
function zvolOf(props: PropertyMap): StoredZvol | undefined {
  const own = (name: string) => {
    const p = props.get(name);
    return p && p.source === "local" ? p.value : undefined;
  };
  const content = own(ZVOL_CONTENT_PROPERTY);
  if (content !== "block" && content !== "ext4" && content !== "xfs") return undefined;
  return {
    content,
    volblocksize: safeCount(props.get("volblocksize")?.value),
    formatted: content !== "block" && own(FORMAT_PROPERTY) === FORMAT.done,
  };
}

/**
 * The name a volume's backups are recorded under: a CSI volume's name, or a host volume's
 * dataset component (src/volume/host_names.ts: its own store key); undefined for any other child.
 */
function volumeNameOf(parent: string, dataset: string): string | undefined {
  if (isHostDataset(parent, dataset)) return hostStoreName(parent, dataset);
  if (dataset.slice(parent.length + 1).startsWith(".")) return undefined;
  return volumeForDataset(parent, dataset);
}

/**
 * Checks, under the lock again, that the dataset still is the volume read before (a delete and
 * a create of the same name meanwhile would give another uid, or none).
 * @throws {CsiError} NOT_FOUND when it is gone; ABORTED when it is another volume now
 */
export async function checkSameVolume(deps: LocalDeps, volume: Volume): Promise<void> {
  const p = await deps.zfs.getProperties(volume.dataset, [STORE_UID_PROPERTY]);
  if (!p) throw new CsiError(Code.NOT_FOUND, `Volume dataset "${volume.dataset}" is gone`);
  if (p.get(STORE_UID_PROPERTY)?.value !== volume.uid) {
    throw new CsiError(
      Code.ABORTED,
      `Volume dataset "${volume.dataset}" was replaced while its backup started; retrying later`,
    );
  }
}

/** Whether zfs knows `encryption`, per Zfs; learnt on first refusal (see trash.ts clones). */
const knowsEncryption = new WeakMap<Zfs, boolean>();

async function readTree(zfs: Zfs, dataset: string) {
  if (knowsEncryption.get(zfs) !== false) {
    try {
      return await zfs.getTree(dataset, 1, [...VOLUME_PROPS, ENCRYPTION]);
    } catch (err) {
      if (!(err instanceof ZfsError && err.kind === "invalid")) throw err;
      if (!(await zfs.unknownProperties(dataset, [ENCRYPTION])).includes(ENCRYPTION)) throw err;
      knowsEncryption.set(zfs, false);
    }
  }
  return await zfs.getTree(dataset, 1, VOLUME_PROPS);
}

function type(p: PropertyMap): string | undefined {
  return p.get("type")?.value;
}

/** A snapshot of exactly `dataset` with a readable guid and createtxg, else undefined. */
export function localSnapshot(
  dataset: string,
  name: string,
  p: PropertyMap,
): LocalSnapshot | undefined {
  if (!name.startsWith(`${dataset}@`) || type(p) !== "snapshot") return undefined;
  const guid = p.get("guid")?.value ?? "";
  const createtxg = Number(p.get("createtxg")?.value);
  const creation = Number(p.get("creation")?.value);
  if (!/^\d{1,20}$/.test(guid) || !Number.isSafeInteger(createtxg)) return undefined;
  if (!Number.isSafeInteger(creation)) return undefined;
  const bytes = p.get("referenced")?.value ?? "";
  const referenced = /^\d+$/.test(bytes) ? Number(bytes) : NaN;
  return {
    name,
    component: name.slice(dataset.length + 1),
    guid,
    createtxg,
    creation,
    ...(Number.isSafeInteger(referenced) ? { referenced } : {}),
  };
}

/** The dataset's store uid; a new one is set on the dataset first (see DESIGN-store.md). */
async function storeUid(deps: LocalDeps, dataset: string, props: PropertyMap): Promise<string> {
  const v = props.get(STORE_UID_PROPERTY);
  if (v && (v.source === "local" || v.source.startsWith("received"))) {
    if (!UID.test(v.value)) {
      throw new CsiError(
        Code.FAILED_PRECONDITION,
        `Dataset "${dataset}" has ${STORE_UID_PROPERTY}="${v.value}", which is not 32 hex ` +
          `digits: set it back to the uid in its store record, or remove it to start anew`,
      );
    }
    return v.value;
  }
  // Set before the record is written: a crash between leaves a uid whose record is created
  // next time, never a record this dataset cannot claim.
  const uid = (deps.randomHex ?? randomHex)(16);
  await deps.zfs.set(dataset, STORE_UID_PROPERTY, uid);
  return uid;
}

/**
 * Takes `<dataset>@.backup-<seconds>-<sequence>` and reads it back; the next sequence number
 * if that name is taken (the sequence, not the clock, makes names unique: a chain never holds
 * two snapshots of one name, however many backups a second sees and whatever the clock does).
 * Give a `sequence` above every backup snapshot's on the dataset and every stored one's
 * ({@linkcode nextBackupSequence}).
 */
export async function takeSnapshot(
  deps: LocalDeps,
  dataset: string,
  at: { readonly seconds: number; readonly sequence: number },
): Promise<LocalSnapshot> {
  for (let attempt = 0;; attempt++) {
    const name = `${dataset}@${BACKUP_PREFIX}${at.seconds}-${at.sequence + attempt}`;
    try {
      await deps.zfs.snapshot(name);
    } catch (err) {
      if (err instanceof ZfsError && err.kind === "exists" && attempt < 5) continue;
      throw err;
    }
    const p = await deps.zfs.getProperties(name, SNAPSHOT_PROPS);
    const snap = p && localSnapshot(dataset, name, p);
    if (!snap) throw new Error(`Snapshot "${name}" was taken but cannot be read back`);
    return snap;
  }
}

/**
 * The sequence number of the next backup of a volume: above every one the store holds of it
 * (`stored`, as chain.ts nextSequence gives it) and every backup snapshot on the dataset.
 */
export function nextBackupSequence(local: readonly LocalSnapshot[], stored: number): number {
  let next = stored;
  for (const s of local) next = Math.max(next, (backupSequenceOf(s.component) ?? 0) + 1);
  return next;
}

/** Options of {@linkcode pickBase}. */
export interface PickBaseOptions {
  /** Only snapshots older than this one (its createtxg) can be the base. */
  readonly before: number;
  readonly nowMs: number;
  readonly maxChainLength?: number;
  readonly maxChainAgeMs?: number;
  /**
   * The name (after "@") of the snapshot to be sent: never based on a chain that already holds
   * a snapshot of that name (a CSI snapshot name used again after a DeleteSnapshot whose
   * snapshot stayed as a base), which a full receive of the chain could not take.
   */
  readonly name?: string;
}

/**
 * The base of the next incremental: the newest local `.backup-*` or CSI snapshot older than
 * `before` whose guid the store holds with a whole chain that a full receive can take (no name
 * twice, none named `opts.name`); undefined for a full stream (none, or its chain is due for a
 * new full stream, see policy.ts needsFull).
 */
export function pickBase(
  local: readonly LocalSnapshot[],
  manifests: readonly SnapshotManifest[],
  opts: PickBaseOptions,
): LocalSnapshot | undefined {
  const stored = new Set(manifests.map((m) => m.guid));
  const candidates = local
    .filter((s) => s.createtxg < opts.before && stored.has(s.guid))
    .filter((s) =>
      isBackupComponent(s.component) || decodeComponent(s.component) !== undefined ||
      // A snapshot CreateSnapshot stored (stored_snapshots.ts), or one a restore received.
      (s.component.startsWith(STORED_PREFIX) &&
        decodeComponent(s.component.slice(STORED_PREFIX.length)) !== undefined)
    )
    .sort((a, b) => b.createtxg - a.createtxg);
  for (const s of candidates) {
    let chain;
    try {
      chain = chainTo(manifests, s.guid);
    } catch {
      continue;
    }
    // A chain a full receive could not take (an earlier version's names) is not extended.
    const names = new Set(chain.map((m) => m.snapshot));
    if (names.size !== chain.length || (opts.name !== undefined && names.has(opts.name))) continue;
    const full = needsFull(chain, {
      nowMs: opts.nowMs,
      ...(opts.maxChainLength === undefined ? {} : { maxLength: opts.maxChainLength }),
      ...(opts.maxChainAgeMs === undefined ? {} : { maxAgeMs: opts.maxChainAgeMs }),
    });
    return full ? undefined : s;
  }
  return undefined;
}

/** Destroys the `.backup-*` snapshots of `dataset` older than `keep`; the caller holds the lock. */
export function pruneLocal(
  deps: LocalDeps,
  dataset: string,
  keep: LocalSnapshot,
): Promise<string[]> {
  return destroyBackups(deps, dataset, (s) => s.createtxg < keep.createtxg);
}

/**
 * Destroys the `.backup-*` snapshots of `dataset` that `which` picks. The dataset is read again
 * right before: only a snapshot of exactly this dataset, named as the plugin names its backups,
 * is ever destroyed. A snapshot zfs refuses to destroy (a clone made of it) is logged and kept.
 */
export async function destroyBackups(
  deps: LocalDeps,
  dataset: string,
  which: (s: LocalSnapshot) => boolean,
): Promise<string[]> {
  const tree = await deps.zfs.getTree(dataset, 1, SNAPSHOT_PROPS);
  const destroyed: string[] = [];
  for (const [name, p] of tree ?? []) {
    const s = localSnapshot(dataset, name, p);
    if (!s || !isBackupComponent(s.component) || !which(s)) continue;
    if (name !== `${dataset}@${s.component}`) continue;
    try {
      await deps.zfs.destroy(name);
      destroyed.push(name);
    } catch (err) {
      deps.log.warn("backup could not destroy a backup snapshot", { snapshot: name, error: err });
    }
  }
  return destroyed;
}

/** The keep policy of the volume, or the default; none (logged) when it cannot be read. */
export function keepOf(props: PropertyMap, fallback: KeepPolicy | undefined, log?: Logger) {
  const text = props.get(BACKUP_KEEP_PROPERTY)?.value;
  if (text === undefined || text === "-" || text === "") return fallback;
  try {
    return parseKeepPolicy(text);
  } catch (err) {
    log?.warn("volume's keep policy cannot be read: nothing is pruned", {
      property: BACKUP_KEEP_PROPERTY,
      error: err,
    });
    return undefined;
  }
}

/** The schedule recorded in the store: the interval and keep policy, when both are set. */
export function scheduleOf(
  props: PropertyMap,
  fallback: KeepPolicy | undefined,
): VolumeRecord["schedule"] {
  const text = props.get(BACKUP_INTERVAL_PROPERTY)?.value;
  const keep = keepOf(props, fallback);
  if (text === undefined || text === "-" || !keep) return undefined;
  try {
    const intervalSeconds = parseInterval(text);
    return intervalSeconds > 0 ? { intervalSeconds, keep } : undefined;
  } catch {
    return undefined;
  }
}

/** The recorded CreateVolume parameters (canonical JSON on the dataset), or none. */
export function parametersOf(props: PropertyMap): Record<string, string> {
  try {
    const v: unknown = JSON.parse(props.get(PARAMETERS_PROPERTY)?.value ?? "{}");
    if (v && typeof v === "object" && !Array.isArray(v)) {
      return Object.fromEntries(
        Object.entries(v).filter((e): e is [string, string] => typeof e[1] === "string"),
      );
    }
  } catch {
    // Not JSON (a dataset made by hand): nothing recorded.
  }
  return {};
}

/** A property's value as a non-negative integer, 0 when it is not one ("none", "-"). */
export function safeCount(value: string | undefined): number {
  const n = Number(value);
  return Number.isSafeInteger(n) && n >= 0 ? n : 0;
}

/** `bytes` random bytes as lowercase hex. */
export function randomHex(bytes: number): string {
  return [...crypto.getRandomValues(new Uint8Array(bytes))]
    .map((b) => b.toString(16).padStart(2, "0")).join("");
}
