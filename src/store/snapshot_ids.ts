/**
 * Ids of snapshots kept in the store: `store:<volume key>:<guid as 16 hex digits>`, e.g.
 * `store:pg-data:00a1b2c3d4e5f607`. They hold no "@", so they never parse as a snapshot on a node
 * (`<volume>@<snapshot>[@<node>]`, src/zfs/ids.ts), and they name no node: any node with the
 * store restores them. Pure.
 */

import { decodeComponent, encodeComponent } from "../zfs/names.ts";
import { guidFromHex, guidHex } from "./layout.ts";

/** What a stored snapshot id names. */
export interface StoredSnapshotRef {
  readonly id: string;
  /** The volume's name, and its key in the store. */
  readonly volume: string;
  readonly volumeKey: string;
  /** The snapshot's ZFS guid (decimal). */
  readonly guid: string;
}

const PREFIX = "store:";

/** Whether `id` has the shape of a stored snapshot id (it may still be malformed). */
export function isStoredSnapshotId(id: string): boolean {
  return id.startsWith(PREFIX) && !id.includes("@");
}

/** The id of snapshot `guid` of volume `volume` in the store. */
export function storedSnapshotId(volume: string, guid: string): string {
  return `${PREFIX}${encodeComponent("Volume name", volume)}:${guidHex(guid)}`;
}

/** Reads a stored snapshot id, or undefined when it is not one this plugin makes. */
export function parseStoredSnapshotId(id: string): StoredSnapshotRef | undefined {
  if (!isStoredSnapshotId(id)) return undefined;
  const rest = id.slice(PREFIX.length);
  const cut = rest.lastIndexOf(":");
  if (cut <= 0) return undefined;
  const volumeKey = rest.slice(0, cut);
  const hex = rest.slice(cut + 1);
  const volume = decodeComponent(volumeKey);
  if (volume === undefined || !/^[0-9a-f]{16}$/.test(hex)) return undefined;
  return { id, volume, volumeKey, guid: guidFromHex(hex) };
}
