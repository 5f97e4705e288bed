/**
 * Small index objects in the store that say which volumes follow their job, and which of them a
 * node keeps a warm copy of, so that neither question costs a listing of `v1/volumes/` (every
 * object of every volume: its manifests and streams too):
 *
 * - `v1/follow/volumes/<volume>`: one per follow volume (ListVolumes lists these, then reads
 *   each one's owner object);
 * - `v1/follow/standby/<node>/<volume>`: one per standby node of a volume (a standby node
 *   lists its own prefix once per tick, then reads the owner object of each volume listed).
 *
 * The owner object stays the truth: a marker only says where to look, so a marker left behind
 * (a crash between two writes) costs one read that finds the volume deleted or not naming the
 * node, never a wrong action.
 */

import { LAYOUT_PREFIX } from "../store/layout.ts";
import type { Store } from "../store/store.ts";
import { decodeComponent } from "../zfs/names.ts";

/** Prefix of the follow volumes' markers (ends with "/"). */
export function followVolumesPrefix(): string {
  return `${LAYOUT_PREFIX}/follow/volumes/`;
}

/** Prefix of the markers of the volumes `node` stands by for (ends with "/"). */
export function standbyPrefix(node: string): string {
  return `${LAYOUT_PREFIX}/follow/standby/${node}/`;
}

/** What a marker holds: the volume's name, for people reading the store. */
function body(volume: string): Uint8Array {
  return new TextEncoder().encode(JSON.stringify({ volume }) + "\n");
}

/**
 * Writes the markers of a follow volume (idempotent: a repeat writes the same bytes).
 * @throws {StoreError} when the store fails
 */
export async function writeMarkers(
  store: Store,
  volumeKey: string,
  volume: string,
  standbys: readonly string[],
): Promise<void> {
  await store.putBytes(`${followVolumesPrefix()}${volumeKey}`, body(volume));
  for (const node of standbys) {
    await store.putBytes(`${standbyPrefix(node)}${volumeKey}`, body(volume));
  }
}

/**
 * Removes the markers of a deleted follow volume (absent ones are fine).
 * @throws {StoreError} when the store fails
 */
export async function removeMarkers(
  store: Store,
  volumeKey: string,
  standbys: readonly string[],
): Promise<void> {
  for (const node of standbys) await store.delete(`${standbyPrefix(node)}${volumeKey}`);
  await store.delete(`${followVolumesPrefix()}${volumeKey}`);
}

/** A volume a listing found: its key in the store and its CSI name. */
export interface MarkedVolume {
  readonly volumeKey: string;
  readonly name: string;
}

/**
 * The volumes whose markers are under `prefix`, sorted by name; keys that are not a single
 * encoded name (nothing this plugin writes) are skipped.
 * @throws {StoreError} when the store fails
 */
export async function listMarked(store: Store, prefix: string): Promise<MarkedVolume[]> {
  const out: MarkedVolume[] = [];
  for (const obj of await store.list(prefix)) {
    const volumeKey = obj.key.slice(prefix.length);
    if (volumeKey.includes("/")) continue;
    const name = decodeComponent(volumeKey);
    if (name !== undefined) out.push({ volumeKey, name });
  }
  return out.sort((x, y) => x.name < y.name ? -1 : x.name > y.name ? 1 : 0);
}
