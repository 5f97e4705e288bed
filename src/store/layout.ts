/**
 * What the store holds and under which keys: the documented, versioned layout that lets an
 * operator restore by hand with ordinary tools (see docs/backups.md, "The store's layout"). Pure.
 *
 *   v1/volumes/<volume>/volume.json                 the volume's record ({@linkcode VolumeRecord})
 *   v1/volumes/<volume>/streams/<guid>-<upload>.zfs one `zfs send` stream, exactly as zfs wrote it
 *   v1/volumes/<volume>/snapshots/<guid>.json       the stream's manifest ({@linkcode SnapshotManifest})
 *   v1/volumes/<volume>/owner.json                  a volume that follows its job: who holds it
 *                                                   (src/follow/owner.ts)
 *
 * `<volume>` is the volume's name encoded as a dataset component (src/zfs/names.ts), `<guid>`
 * the snapshot's ZFS guid as 16 hex digits, `<upload>` a random id unique to one upload. A
 * stream is written first; its manifest, written last with If-None-Match, is what makes the
 * snapshot exist in the store: a stream without a manifest is an unfinished upload, never read,
 * and removed by the pruner once it is older than a day.
 */

import type { RecordedForm } from "../zfs/stream_form.ts";

/** The layout's version, the first key segment. */
export const LAYOUT_PREFIX = "v1";

/** How many of each kind of backup a volume keeps in the store (0 = none of that kind). */
export interface KeepPolicy {
  /** The newest N, whatever their age. */
  readonly last: number;
  /** The newest in each of the last N hours that have one. */
  readonly hourly: number;
  /** The newest in each of the last N days (UTC) that have one. */
  readonly daily: number;
  /** The newest in each of the last N ISO weeks that have one. */
  readonly weekly: number;
}

/** A volume's backup schedule. */
export interface BackupSchedule {
  /** Seconds between scheduled backups. */
  readonly intervalSeconds: number;
  readonly keep: KeepPolicy;
}

/** `v1/volumes/<volume>/volume.json`: who the volume is, rewritten as it changes. */
export interface VolumeRecord {
  readonly format: 1;
  /** The CSI volume name. */
  readonly name: string;
  /**
   * Random id (32 hex digits) given when the volume is first backed up; a dataset whose
   * recorded uid differs is another volume of the same name and never writes here.
   */
  readonly uid: string;
  /** When the record was first written (ISO 8601, UTC). */
  readonly createdAt: string;
  /** The volume's size (its refquota) at the last backup. */
  readonly capacityBytes: number;
  /** The CreateVolume parameters the plugin recorded (never secrets). */
  readonly parameters: Readonly<Record<string, string>>;
  readonly schedule?: BackupSchedule;
  /** The node that last wrote a backup. */
  readonly node: string;
  /**
   * Set by DeleteVolume (ISO 8601, the deleting node's wall clock): the pruner removes the
   * volume's backups once the store's deleted retention has passed both on the store's clock
   * since the record was written and on its own wall clock since this (src/replicate/prune.ts).
   * A later backup of the same uid clears it.
   */
  readonly deletedAt?: string;
}

/** Why a snapshot was stored. */
export type SnapshotKind = "scheduled" | "requested";

/** `v1/volumes/<volume>/snapshots/<guid>.json`: one stored stream and how to check it. */
export interface SnapshotManifest {
  readonly format: 1;
  /** The CSI volume name and the record's uid. */
  readonly volume: string;
  readonly volumeUid: string;
  /** The snapshot's ZFS guid (decimal, as `zfs get guid` prints it). */
  readonly guid: string;
  /** The guid of the snapshot the stream is incremental from, or null for a full stream. */
  readonly baseGuid: string | null;
  /** The snapshot's name on the node that sent it (the part after "@"). */
  readonly snapshot: string;
  /** The CSI snapshot name, for snapshots made by CreateSnapshot. */
  readonly csiName?: string;
  readonly kind: SnapshotKind;
  /** The snapshot's creation time (ISO 8601, UTC), by the sending node's clock. */
  readonly createdAt: string;
  /**
   * The snapshot's place among the volume's stored snapshots, with no clock involved: one more
   * than the highest the sending node saw in the store (so more than its base's). Absent in
   * manifests written before it existed; src/store/chain.ts orders those by their chain and
   * createdAt. Untrusted like every field: read it with `sequenceOf`.
   */
  readonly sequence?: number;
  /** Key of the stream object. */
  readonly stream: string;
  /** Bytes of the stream, and its SHA-256 (lowercase hex). */
  readonly size: number;
  readonly sha256: string;
  /** Sent with `zfs send --raw` (an encrypted dataset: the store holds ciphertext only). */
  readonly raw: boolean;
  /**
   * How the stream was sent besides `-w` (`-c`, `-L`, `-e`) and the feature flags its header
   * states, which a receiving pool needs (src/zfs/stream_form.ts). Absent in manifests written
   * before it existed: those streams are plain (`zfs send` with none of them). Untrusted like
   * every field: it lets a node refuse before receiving, zfs still checks the stream itself.
   */
  readonly form?: RecordedForm;
  /** The node that sent it. */
  readonly node: string;
  /** The volume's size when the snapshot was taken (a zvol's volsize, a dataset's refquota). */
  readonly capacityBytes: number;
  /**
   * Present when the stream is of a zvol (docs/block-volumes.md): what a restore makes of it.
   * Absent in manifests of datasets, and in every manifest written before zvols were stored.
   */
  readonly zvol?: StoredZvol;
  /**
   * The snapshot's `referenced` (what refquota bounds): its size, as CSI's size_bytes answers
   * it. Absent in manifests written before it existed (see snapshot_size.ts).
   */
  readonly referencedBytes?: number;
}

/** What a stored stream of a zvol holds, as the sending node recorded it. Untrusted. */
export interface StoredZvol {
  /** The zvol's `org.zfs-csi:fs-type`: a raw device, or the filesystem the plugin made on it. */
  readonly content: "block" | "ext4" | "xfs";
  /** Its volblocksize in bytes (kept by the stream: a restore cannot change it). */
  readonly volblocksize: number;
  /**
   * Whether the plugin had recorded its filesystem made (`org.zfs-csi:format` = done) before
   * the snapshot was taken: only then does the snapshot surely hold the whole filesystem.
   */
  readonly formatted: boolean;
}

/** 16 lowercase hex digits of a decimal guid. */
export function guidHex(guid: string): string {
  if (!/^\d{1,20}$/.test(guid)) throw new TypeError(`"${guid}" is not a ZFS guid`);
  const value = BigInt(guid);
  if (value >= 1n << 64n) throw new TypeError(`"${guid}" is not a ZFS guid`);
  return value.toString(16).padStart(16, "0");
}

/** The decimal guid of 16 hex digits. */
export function guidFromHex(hex: string): string {
  if (!/^[0-9a-f]{16}$/.test(hex)) throw new TypeError(`"${hex}" is not 16 hex digits`);
  return BigInt(`0x${hex}`).toString(10);
}

/** Prefix of everything of one volume (ends with "/"). */
export function volumePrefix(volumeKey: string): string {
  return `${LAYOUT_PREFIX}/volumes/${volumeKey}/`;
}

/** Prefix under which every volume lives (ends with "/"). */
export function volumesPrefix(): string {
  return `${LAYOUT_PREFIX}/volumes/`;
}

/** Key of a volume's record. */
export function volumeRecordKey(volumeKey: string): string {
  return `${volumePrefix(volumeKey)}volume.json`;
}

/** Key of a snapshot's manifest. */
export function manifestKey(volumeKey: string, guid: string): string {
  return `${volumePrefix(volumeKey)}snapshots/${guidHex(guid)}.json`;
}

/** Prefix of a volume's manifests. */
export function manifestsPrefix(volumeKey: string): string {
  return `${volumePrefix(volumeKey)}snapshots/`;
}

/** Key of one upload of a snapshot's stream; `upload` is random, unique to the upload. */
export function streamKey(volumeKey: string, guid: string, upload: string): string {
  if (!/^[0-9a-f]{8,32}$/.test(upload)) throw new TypeError(`"${upload}" is not an upload id`);
  return `${volumePrefix(volumeKey)}streams/${guidHex(guid)}-${upload}.zfs`;
}

/** Prefix of a volume's streams. */
export function streamsPrefix(volumeKey: string): string {
  return `${volumePrefix(volumeKey)}streams/`;
}

/** Key of a follow volume's owner object (src/follow/owner.ts): holder, generation, head. */
export function ownerKey(volumeKey: string): string {
  return `${volumePrefix(volumeKey)}owner.json`;
}
