/**
 * The head's chain of a volume that follows its job: what the keep policy must never prune
 * (src/replicate/backup.ts `protect`), since the next holder receives exactly that chain.
 * Snapshots off it (a fenced holder's late uploads, streams of a copy set aside) are ordinary
 * stored snapshots: the keep policy prunes them, or the store's deleted retention with the
 * volume.
 */

import { chainTo } from "../store/chain.ts";
import type { SnapshotManifest } from "../store/layout.ts";
import type { Store } from "../store/store.ts";
import { readOwner } from "./owner.ts";

/**
 * The guids of the head's chain (empty for a volume without an owner object or a head). A head
 * whose chain is broken protects what of it is there: nothing on it is pruned either way.
 * @throws {StoreError} when the store fails (the prune then does not run)
 */
export async function headChain(
  store: Store,
  volumeKey: string,
  manifests: readonly SnapshotManifest[],
): Promise<ReadonlySet<string>> {
  const head = (await readOwner(store, volumeKey))?.record.head;
  if (!head) return new Set();
  try {
    return new Set(chainTo(manifests, head).map((m) => m.guid));
  } catch {
    const byGuid = new Map(manifests.map((m) => [m.guid, m]));
    const out = new Set<string>();
    for (let m = byGuid.get(head); m && !out.has(m.guid);) {
      out.add(m.guid);
      m = m.baseGuid === null ? undefined : byGuid.get(m.baseGuid);
    }
    return out;
  }
}
