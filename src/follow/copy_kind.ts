/**
 * What differs between the copies of a follow volume that is a ZFS dataset and of one that is a
 * zvol (docs/block-volumes.md), for everything src/follow/ does to a copy. A zvol has no mount
 * of its own and takes no dataset-only property (OpenZFS refuses `canmount`, `mountpoint`,
 * `quota` and `refquota` on a volume, and `zfs unmount` of one), so it is never unmounted and its
 * only lock is `readonly=on`, which makes its block device read-only on OpenZFS; its size is its
 * `volsize`; a copy received from the store gets its reservation anew (a stream carries none)
 * and its format record from the head's manifest; and it is in use on a node while that node's
 * stage marks it `org.zfs-csi:attached` (a device bound onto a file shows in no mount table as
 * the zvol). Pure.
 */

import { Code, CsiError } from "../errors.ts";
import type { SnapshotManifest } from "../store/layout.ts";
import type { PropertyList } from "../zfs/args.ts";
import type { PropertyMap } from "../zfs/parse.ts";
import { SIZE_PROPERTIES } from "../volume/sizing.ts";
import { ATTACHED_PROPERTY, FORMAT, FORMAT_PROPERTY, type ZvolContent } from "../volume/zvol.ts";
import type { FollowSettings } from "./owner.ts";

/** What a volume's copies are: ZFS datasets, or zvols (`zfs get type` says the same words). */
export type CopyKind = "filesystem" | "volume";

/** What the copies of the volume with these settings are. */
export function kindOf(settings: FollowSettings): CopyKind {
  return settings.zvol ? "volume" : "filesystem";
}

/** What a copy is as zfs reads it (`type`); undefined when it is neither. */
export function kindOfCopy(props: PropertyMap | undefined): CopyKind | undefined {
  const type = props?.get("type")?.value;
  return type === "filesystem" || type === "volume" ? type : undefined;
}

/** What opens a copy for its holder: writable, and a dataset mountable again. */
export function openProperties(kind: CopyKind): PropertyList {
  return kind === "volume" ? [["readonly", "off"]] : [["readonly", "off"], ["canmount", "on"]];
}

/** What locks a copy nothing may write to: read-only, and a dataset not mounted at boot. */
export function lockDownProperties(kind: CopyKind): PropertyList {
  return kind === "volume" ? [["readonly", "on"]] : [["readonly", "on"], ["canmount", "noauto"]];
}

/** The size properties to read of a copy, to give it the size the store records. */
export function sizeProperties(kind: CopyKind): readonly string[] {
  return kind === "volume" ? ["volsize"] : SIZE_PROPERTIES;
}

/**
 * What a zvol copy received from the store is given besides the settings' properties: its
 * reservation (a received zvol reserves nothing; a full one reserves its size again, as a
 * clone does), and the format record `done` only when the head's manifest says the filesystem
 * was made before the head was taken, as a restore from the store does (stored.ts): otherwise
 * none, and the first stage decides by what the device holds. Never `begun`, which would wipe it.
 */
export function receivedZvolProperties(
  settings: FollowSettings,
  head: SnapshotManifest | undefined,
): Record<string, string> {
  const z = settings.zvol;
  if (!z) return {};
  return {
    refreservation: z.sparse ? "none" : "auto",
    ...(z.content !== "block" && head?.zvol?.formatted === true
      ? { [FORMAT_PROPERTY]: FORMAT.done }
      : {}),
  };
}

/**
 * Checks, before anything is received, that the stored chain makes a copy of this volume: a
 * zvol's streams holding its content for a follow zvol, a dataset's for a follow dataset. The
 * plugin never stores one for the other (a volume's kind is fixed at CreateVolume), so a chain
 * that does not fit was written by someone else.
 * @throws {CsiError} DATA_LOSS naming what the chain holds and what the volume is
 */
export function checkChainFits(
  volume: string,
  settings: FollowSettings,
  chain: readonly SnapshotManifest[],
): void {
  const want: ZvolContent | undefined = settings.zvol?.content;
  const misfit = chain.find((m) => m.zvol?.content !== want);
  if (!misfit) return;
  const what = (c: ZvolContent | undefined) =>
    c === undefined ? "a ZFS dataset" : `a zvol holding ${c}`;
  throw new CsiError(
    Code.DATA_LOSS,
    `The store's copy of volume "${volume}" cannot be received: snapshot "${misfit.snapshot}" ` +
      `is of ${what(misfit.zvol?.content)}, and the volume is ${what(want)}`,
  );
}

/**
 * Whether a node's stage marks the zvol copy in use (`org.zfs-csi:attached`, set at NodeStage
 * and removed at the NodeUnstage that leaves nothing using it): the node's id, or undefined.
 */
export function attachedTo(props: PropertyMap | undefined): string | undefined {
  const mark = props?.get(ATTACHED_PROPERTY);
  return mark?.source === "local" && mark.value !== "" ? mark.value : undefined;
}
