/**
 * What a node does with its own copy of a follow volume once it holds the volume: use it as it
 * is, receive the increments up to the store's head on top of it, or set it aside and receive
 * the head's chain in full. Pure: the judgement of the facts read from zfs and the store.
 *
 * A copy is "clean" when this node released it at a snapshot, or a standby receive here left it
 * at one (standby.ts; either way the release marker names that snapshot's guid), and it is still
 * that snapshot (its newest snapshot, `readonly=on` since, and OpenZFS's `written` is 0 where it
 * exists), so nothing was written after what the store got.
 * Only a clean copy whose snapshot is on the head's chain receives incrementally; any other copy
 * (a lost holder's, one written after its release, one off the chain, one of the other kind: a
 * zvol where the volume is a dataset, or the reverse) has diverged and is set aside, never
 * destroyed and never published.
 */

import type { CopyKind } from "./copy_kind.ts";

/** The property that names the generation under which this node last made its copy writable. */
export const FOLLOW_GENERATION_PROPERTY = "org.zfs-csi:follow-generation";
/**
 * The guid of the snapshot at which this node released its copy (or up to which a standby
 * receive brought it); "none" while writable.
 */
export const FOLLOW_RELEASED_PROPERTY = "org.zfs-csi:follow-released";

/** The local copy as read from zfs. */
export interface LocalCopy {
  /** A ZFS dataset or a zvol, as zfs says (`type`); undefined when unknown. */
  readonly kind?: CopyKind;
  /** Generation it was last made writable under, if it says. */
  readonly generation?: number;
  /** Guid its release marker names, if any. */
  readonly releasedAt?: string;
  /** Guid of its newest snapshot, if it has one. */
  readonly newestGuid?: string;
  readonly readonly: boolean;
  /** OpenZFS's `written` (bytes since the newest snapshot); undefined where zfs lacks it. */
  readonly written?: number;
}

/** What the owner object said, and whether this node just acquired it or held it already. */
export interface OwnerView {
  /** The generation this node holds now. */
  readonly generation: number;
  /** Whether this node already held the volume before (a repeated stage, a restart). */
  readonly heldBefore: boolean;
  /** The head's chain, full stream first, as guids; empty when the store has no head. */
  readonly chain: readonly string[];
  /** What the volume's copies are (its settings say); undefined: not checked. */
  readonly kind?: CopyKind;
}

/** The plan for the local copy. */
export type CopyPlan =
  /** The copy is current: nothing to receive. */
  | { readonly kind: "current" }
  /** Receive the chain's snapshots after `from` (a guid of the chain) on top of the copy. */
  | { readonly kind: "increment"; readonly from: string }
  /** Receive the whole chain into a fresh dataset (after setting the copy aside, if any). */
  | { readonly kind: "full"; readonly setAside: boolean; readonly why: string }
  /** No data anywhere yet: create an empty dataset (after setting the copy aside, if any). */
  | { readonly kind: "create"; readonly setAside: boolean; readonly why: string };

/** Decides what to do with the local copy (undefined: there is none). */
export function planCopy(local: LocalCopy | undefined, owner: OwnerView): CopyPlan {
  const head = owner.chain.at(-1);
  const fresh = (setAside: boolean, why: string): CopyPlan =>
    head === undefined ? { kind: "create", setAside, why } : { kind: "full", setAside, why };
  if (!local) return fresh(false, "this node has no copy");
  if (owner.kind !== undefined && local.kind !== undefined && local.kind !== owner.kind) {
    const what = (k: CopyKind) => k === "volume" ? "a zvol" : "a ZFS dataset";
    return fresh(
      true,
      `its copy is ${what(local.kind)}, and the volume is ${what(owner.kind)} (a volume of the ` +
        `same name made anew)`,
    );
  }
  if (owner.heldBefore) {
    // This node held it all along: its copy is the volume, writes after the head included.
    if (local.generation === owner.generation) return { kind: "current" };
    return fresh(
      true,
      `its copy was made writable under generation ${local.generation ?? "unknown"}, not ` +
        `${owner.generation}`,
    );
  }
  // Strict on purpose, and measured on OpenZFS 2.3: a released copy keeps `written` = 0 through
  // `readonly=on`, the final snapshot, the marker, `canmount=noauto`, the unmount and later txg
  // syncs, so none of these facts moves by itself. The way found for a cleanly released copy
  // to fail the rule was the plugin's own: a scheduled backup running alongside the release
  // could snapshot it after its final snapshot (mover.ts scheduledBackup now keeps them apart).
  // A mount would change it (OpenZFS may write to a filesystem as it mounts it, even read-only):
  // released copies stay unmounted (`canmount=noauto`) until their next stage.
  const clean = local.releasedAt !== undefined && local.releasedAt === local.newestGuid &&
    local.readonly && (local.written === undefined || local.written === 0);
  if (!clean) {
    return fresh(
      true,
      local.releasedAt === undefined
        ? "its copy was never released here (a lost holder's copy, or an unfinished release): " +
          "it may hold writes the store never got"
        : `its copy changed after it was released here (${changes(local).join("; ")})`,
    );
  }
  if (local.releasedAt === head) return { kind: "current" };
  if (owner.chain.includes(local.releasedAt!)) {
    return { kind: "increment", from: local.releasedAt! };
  }
  return fresh(
    true,
    `its copy (released at snapshot guid ${local.releasedAt}) is not on the chain of the ` +
      `store's head${head === undefined ? "" : ` (guid ${head})`}`,
  );
}

/** What makes a released copy unclean, in words (for the log and the error). */
function changes(local: LocalCopy): string[] {
  const out: string[] = [];
  if (local.newestGuid !== local.releasedAt) {
    out.push(
      `its newest snapshot is guid ${local.newestGuid ?? "none"}, not the released ` +
        `${local.releasedAt}`,
    );
  }
  if (!local.readonly) out.push("it is writable again");
  if (local.written !== undefined && local.written !== 0) {
    out.push(`${local.written} bytes written since its newest snapshot`);
  }
  return out;
}
