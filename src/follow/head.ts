/**
 * What the store must keep of a volume that follows its job, whose next holder receives exactly
 * the owner object's head and its chain:
 * - {@linkcode headGuard}, before a backup prunes (src/replicate/backup.ts `protect`): only the
 *   node that holds the volume prunes its store, and never the head's chain. A holder that was
 *   paused past its lease and resumes mid-backup is no longer the holder: it prunes nothing,
 *   whatever it listed before. A listing that lacks the head is listed again, or the prune
 *   waits for the next backup.
 * - {@linkcode keptByHead}, before DeleteSnapshot removes a stored snapshot (snapshots.ts): the
 *   head's chain, and every snapshot newer than the head (the holder's upload that the head is
 *   about to move to), are only unpinned, never removed.
 * - {@linkcode movesForward}, before the holder moves the head to a snapshot it stored: only to
 *   a newer one (also on a new full stream), whose chain is whole.
 * Snapshots off the chain and older than the head (a fenced holder's late uploads, streams of a
 * copy set aside) are ordinary stored snapshots: the keep policy prunes them, or the store's
 * deleted retention with the volume.
 */

import { chainTo, isNewer, oldestFirst, sequenceOf } from "../store/chain.ts";
import type { SnapshotManifest } from "../store/layout.ts";
import type { Store } from "../store/store.ts";
import type { PruneGuard } from "../replicate/backup.ts";
import { describeOwner, readOwner } from "./owner.ts";

/**
 * Whether and with what kept `node` may prune a volume's store: anything goes for a volume that
 * does not follow its job (no owner object); a follow volume is pruned only by its holder
 * (state held, holder `node`), keeping its head's chain, and only from a listing that holds the
 * head (else "list again").
 * @throws {StoreError} when the store fails (the prune then does not run)
 */
export async function headGuard(
  store: Store,
  node: string,
  volumeKey: string,
  manifests: readonly SnapshotManifest[],
): Promise<PruneGuard> {
  const record = (await readOwner(store, volumeKey))?.record;
  if (!record) return { keep: new Set() };
  if (record.state !== "held" || record.holder !== node) {
    return {
      skip: `only the node that holds a volume that follows its job prunes its store (the ` +
        `store says: ${describeOwner(record)})`,
      listAgain: false,
    };
  }
  if (record.head === null) return { keep: new Set() };
  if (!manifests.some((m) => m.guid === record.head)) {
    return {
      skip: `the store's head (snapshot guid ${record.head}) is not in the listing`,
      listAgain: true,
    };
  }
  return { keep: chainOf(manifests, record.head) };
}

/**
 * The guids DeleteSnapshot must not remove from a follow volume's store: the head's chain and
 * every snapshot newer than the head (src/store/chain.ts order); empty for a volume without an
 * owner object or a head.
 * @throws {StoreError} when the store fails
 */
export async function keptByHead(
  store: Store,
  volumeKey: string,
  manifests: readonly SnapshotManifest[],
): Promise<ReadonlySet<string>> {
  const head = (await readOwner(store, volumeKey))?.record.head;
  if (!head) return new Set();
  const kept = chainOf(manifests, head);
  const order = oldestFirst(manifests);
  const at = order.findIndex((m) => m.guid === head);
  // A head the listing lacks (moved meanwhile): everything may be on its way to it.
  for (const m of at < 0 ? order : order.slice(at + 1)) kept.add(m.guid);
  return kept;
}

/**
 * The guids of `head`'s chain in `manifests`. A broken chain gives what of it is there: nothing
 * on it is removed either way.
 */
export function chainOf(manifests: readonly SnapshotManifest[], head: string): Set<string> {
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

/**
 * Whether the head may move from `head` to `guid`: `guid`'s chain is whole in `manifests`, and
 * `guid` is after `head` on it, or on another chain that is newer (src/store/chain.ts order)
 * and numbered (a `sequence`, as this version writes: the holder's new full stream). A chain
 * without numbers could only be told newer by a clock: the head does not move onto it. Never
 * backwards, whatever the clocks.
 */
export function movesForward(
  manifests: readonly SnapshotManifest[],
  guid: string,
  head: string,
): boolean {
  let chain: SnapshotManifest[];
  try {
    chain = chainTo(manifests, guid);
  } catch {
    return false;
  }
  if (chain.some((m) => m.guid === head)) return guid !== head;
  return sequenceOf(chain.at(-1)!) !== undefined && isNewer(manifests, guid, head);
}
