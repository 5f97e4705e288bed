/**
 * A stored snapshot's size, as CSI's `size_bytes` means it: "how much space is needed to create
 * a volume from this snapshot", which Nomad shows as the snapshot's size. That is the volume's
 * `referenced` at the snapshot (what refquota bounds, and what a local snapshot answers), which
 * a backup records in the manifest (`referencedBytes`). Never a stream's bytes: an increment
 * holds only the changes since its base (624 bytes for a 300 MiB volume). Pure.
 *
 * A manifest written before `referencedBytes` existed has no exact answer; its size is bounded
 * from above by two things the store does know, and the smaller is answered:
 * - the bytes of its chain's streams (what a restore receives): every block the snapshot refers
 *   to was sent in one of them, so they come to about its size or more (more by what was
 *   overwritten or deleted along the chain, or compressed on disk but sent uncompressed);
 * - the volume's refquota at the snapshot (`capacityBytes`; 0 when unlimited), which its
 *   `referenced` could not exceed.
 * Neither known (a broken chain of an unlimited volume): 0, which CSI reads as "unspecified".
 */

import { ChainError, chainTo } from "./chain.ts";
import type { SnapshotManifest } from "./layout.ts";

/**
 * The size of stored snapshot `manifest` (see the module doc); `manifests` are its volume's
 * (any uid: only its own uid's are followed), read only when the manifest lacks its size.
 */
export function storedSnapshotSize(
  manifest: SnapshotManifest,
  manifests: readonly SnapshotManifest[],
): number {
  if (manifest.referencedBytes !== undefined) return manifest.referencedBytes;
  const bounds: number[] = [];
  if (manifest.capacityBytes > 0) bounds.push(manifest.capacityBytes);
  try {
    const chain = chainTo(
      manifests.filter((m) => m.volumeUid === manifest.volumeUid),
      manifest.guid,
    );
    bounds.push(chain.reduce((n, m) => n + m.size, 0));
  } catch (err) {
    if (!(err instanceof ChainError)) throw err;
  }
  return bounds.length > 0 ? Math.min(...bounds) : 0;
}
