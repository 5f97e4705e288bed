/**
 * The controller side of volumes that follow their job: CreateVolume writes the volume's owner
 * object and record to the store (no dataset on any node: the first stage anywhere creates it),
 * and DeleteVolume marks both deleted once no node holds the volume. Also the `follow` key,
 * which CreateVolume parameters and a registered volume's context may carry.
 */

import { Code, CsiError } from "../errors.ts";
import { ensureRecord } from "../replicate/records.ts";
import { encodeJson, parseVolumeRecord } from "../store/chain.ts";
import { volumeRecordKey } from "../store/layout.ts";
import { type Store, StoreError } from "../store/store.ts";
import { encodeComponent } from "../zfs/names.ts";
import { randomUid } from "./mover.ts";
import { removeMarkers, writeMarkers } from "./markers.ts";
import {
  createOwner,
  describeOwner,
  type FollowSettings,
  markDeleted,
  type NewHead,
} from "./owner.ts";

/** The parameter (and volume context key) that makes a volume follow its job. */
export const FOLLOW_KEY = "follow";

/** The default sync interval of a follow volume, in seconds (its `backup_interval`). */
export const DEFAULT_FOLLOW_INTERVAL_SECONDS = 60;

/**
 * Takes the `follow` key out of parameters or a context: whether it says "true", and the rest.
 * @throws {CsiError} INVALID_ARGUMENT for a value other than "true" or "false"
 */
export function splitFollow(
  values: Readonly<Record<string, string>> | null | undefined,
): { follow: boolean; rest: Record<string, string> } {
  const { [FOLLOW_KEY]: value, ...rest } = values ?? {};
  if (value !== undefined && value !== "true" && value !== "false") {
    throw new CsiError(
      Code.INVALID_ARGUMENT,
      `"${FOLLOW_KEY}" must be "true" or "false", not "${value}"`,
    );
  }
  return { follow: value === "true", rest };
}

/** A follow volume to create. */
export interface NewFollowVolume {
  /** The CSI volume name (as fitted). */
  readonly name: string;
  readonly settings: FollowSettings;
  /** The parameters recorded in the store's volume record (never secrets). */
  readonly parameters: Readonly<Record<string, string>>;
  readonly ttlSeconds: number;
  /** The nodes that keep a warm copy in the background (standby.ts); none when empty. */
  readonly standbys?: readonly string[];
  /** The node that answers the CreateVolume (recorded in volume.json). */
  readonly node: string;
  /**
   * A volume made from a stored snapshot: the uid its copied chain carries and the head it
   * starts at (seed.ts); none for an empty volume.
   */
  readonly seed?: { readonly uid: string; readonly head: NewHead };
  readonly nowMs: number;
}

/**
 * Writes the owner object (released, no head) and the volume record of a new follow volume. A
 * repeat with the same settings answers as the first did while no node has held the volume yet.
 * @throws {CsiError} ALREADY_EXISTS when a follow volume of this name exists with other settings,
 *   has been staged (it may hold data), or was deleted
 * @throws {StoreError} when the store fails
 */
export async function createFollowVolume(store: Store, spec: NewFollowVolume): Promise<void> {
  const volumeKey = encodeComponent("Volume name", spec.name);
  const { holding, created } = await createOwner(store, volumeKey, {
    volume: spec.name,
    uid: spec.seed?.uid ?? randomUid(),
    ttlSeconds: spec.ttlSeconds,
    settings: spec.settings,
    ...(spec.standbys ? { standbys: spec.standbys } : {}),
    ...(spec.seed ? { head: spec.seed.head } : {}),
    nowMs: spec.nowMs,
  });
  const r = holding.record;
  if (!created) {
    const same = JSON.stringify(sorted(r.settings)) === JSON.stringify(sorted(spec.settings)) &&
      JSON.stringify(r.standbys ?? []) === JSON.stringify(spec.standbys ?? []) &&
      r.head === (spec.seed?.head.guid ?? null);
    if (r.state === "deleted" || !same || r.generation > 0) {
      throw new CsiError(
        Code.ALREADY_EXISTS,
        `Volume "${spec.name}" already exists in ${store.description} as a volume that follows ` +
          `its job (${describeOwner(r)}${
            same ? "" : ", with other parameters, size, standby nodes or source"
          }); a ` +
          `CreateVolume of its name is a retry only before any node held it. Give each volume a ` +
          `name of its own`,
      );
    }
  }
  await ensureRecord(store, volumeKey, {
    name: spec.name,
    uid: r.uid,
    capacityBytes: r.settings.capacityBytes,
    parameters: spec.parameters,
    node: spec.node,
    nowMs: spec.nowMs,
  });
  // After the owner object: a marker always points at a volume that exists. The owner's list
  // of standbys is the one a retry keeps (its markers are written again).
  await writeMarkers(store, volumeKey, spec.name, r.standbys ?? []);
}

/**
 * Marks a follow volume deleted in the store (its owner object, then its record, whose
 * `deletedAt` starts the store's deleted retention), only while no node holds it.
 * @returns false when the store has no such volume
 * @throws {CsiError} FAILED_PRECONDITION naming the holder when a node holds it
 * @throws {StoreError} when the store fails
 */
export async function deleteFollowVolume(
  store: Store,
  name: string,
  nowMs: number,
): Promise<boolean> {
  const volumeKey = encodeComponent("Volume name", name);
  const owner = await markDeleted(store, volumeKey, nowMs);
  if (!owner) return false;
  // Nothing to list or follow any more (the owner object says deleted either way).
  await removeMarkers(store, volumeKey, owner.standbys ?? []);
  const key = volumeRecordKey(volumeKey);
  for (let attempt = 1;; attempt++) {
    const got = await store.getBytes(key);
    if (!got) return true;
    const record = parseVolumeRecord(got.bytes);
    if (record.uid !== owner.uid || record.deletedAt !== undefined) return true;
    try {
      const next = { ...record, deletedAt: new Date(nowMs).toISOString() };
      await store.putBytes(key, encodeJson(next), { ifMatch: got.etag });
      return true;
    } catch (err) {
      if (!(err instanceof StoreError && err.kind === "precondition_failed") || attempt >= 5) {
        throw err;
      }
    }
  }
}

function sorted(s: FollowSettings): unknown {
  return {
    capacityBytes: s.capacityBytes,
    properties: Object.fromEntries(Object.entries(s.properties).sort(([a], [b]) => a < b ? -1 : 1)),
    ...(s.zvol
      ? {
        zvol: {
          content: s.zvol.content,
          volblocksize: s.zvol.volblocksize ?? null,
          sparse: s.zvol.sparse,
        },
      }
      : {}),
  };
}
