/**
 * The explicit takeover, for `zfs-csi takeover <volume>`: an operator who knows a holder is
 * lost (its node is gone, or will be wiped) releases the volume on its behalf, so that the next
 * NodeStage on any node takes it over from the store's head, at once, whatever
 * `--takeover-after` says. The old holder is fenced: its next write to the store is refused,
 * and its copy, should it come back, is set aside there and never published.
 */

import type { Store } from "../store/store.ts";
import { encodeComponent } from "../zfs/names.ts";
import { describeOwner, forceRelease } from "./owner.ts";

/** What {@linkcode takeover} did, in words for the operator, and whether it changed anything. */
export interface TakeoverOutcome {
  readonly changed: boolean;
  readonly message: string;
}

/**
 * Releases volume `name` (its CSI name) on behalf of its holder.
 * @param by who asks, recorded in the owner object (e.g. "operator@host")
 * @throws {CsiError} NOT_FOUND when the store has no such follow volume
 * @throws {StoreError} when the store fails
 */
export async function takeover(
  store: Store,
  name: string,
  opts: { readonly by: string; readonly nowMs: number },
): Promise<TakeoverOutcome> {
  const { before, after } = await forceRelease(store, encodeComponent("Volume name", name), opts);
  if (before === after) {
    return {
      changed: false,
      message: `Volume "${name}" is not held (${describeOwner(before)}): nothing to take over`,
    };
  }
  const copy = after.head === null
    ? "the store holds no copy of it: the next stage starts it empty"
    : `the next stage on any node receives the store's last copy, from ${after.headAt}`;
  return {
    changed: true,
    message: `Volume "${name}" was taken from node "${before.holder}" (generation ` +
      `${before.generation}, last renewed at ${before.renewedAt} by its clock); ${copy}. What ` +
      `node "${before.holder}" wrote after that copy is not the volume's: if it comes back, its ` +
      `copy is set aside there, never published`,
  };
}
