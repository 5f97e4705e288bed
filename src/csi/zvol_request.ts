/**
 * Which kind of volume a CreateVolume asks for: a ZFS dataset, or a zvol holding raw data or
 * ext4/xfs (docs/block-volumes.md).
 */

import { Code, CsiError } from "../errors.ts";
import { isZvolFsType, ZVOL_PARAMETERS, type ZvolContent } from "../volume/zvol.ts";
import type { VolumeCapability } from "./types.ts";
import {
  BLOCK_VOLUMES_OFF_MESSAGE,
  type CapabilityOptions,
  checkCapability,
  type CheckedCapability,
} from "./validate.ts";

function invalid(message: string): CsiError {
  return new CsiError(Code.INVALID_ARGUMENT, message);
}

/**
 * What a CreateVolume asks for: a ZFS dataset (undefined), or a zvol holding what it says. A
 * block capability asks for a raw zvol; an ext4/xfs mount capability or the `fs_type` parameter
 * for a filesystem on one. Requests that ask for two different things are refused.
 * @throws {CsiError} INVALID_ARGUMENT for a mix, and for zvols without --block-volumes
 */
export function requestedContentOf(
  caps: readonly VolumeCapability[] | null | undefined,
  parameters: Readonly<Record<string, string>>,
  opts: CapabilityOptions,
): ZvolContent | undefined {
  const asked = new Set<ZvolContent | "zfs">();
  for (const cap of caps ?? []) {
    const checked = checkCapability(cap, opts);
    asked.add(checked.kind === "fs" ? checked.fsType : checked.kind);
  }
  const param = parameters[ZVOL_PARAMETERS.fsType];
  if (param !== undefined && param !== "" && param !== "zfs") {
    if (!isZvolFsType(param)) {
      throw invalid(
        `Parameter fs_type="${param}" is not supported: use "ext4" or "xfs" (a filesystem on ` +
          `a zvol), or "zfs" or nothing (a ZFS dataset)`,
      );
    }
    if (!opts.blockVolumes) {
      throw invalid(`Parameter fs_type="${param}" is made on a zvol: ${BLOCK_VOLUMES_OFF_MESSAGE}`);
    }
    // A mount capability with no fs_type takes the parameter's.
    if (asked.has("zfs")) asked.delete("zfs");
    asked.add(param);
  }
  if (asked.size > 1) {
    throw invalid(
      `The request asks for more than one kind of volume (${[...asked].sort().join(", ")}): ` +
        `a volume is a ZFS dataset, a raw zvol (block) or ext4/xfs on a zvol`,
    );
  }
  const [only] = asked;
  return only === undefined || only === "zfs" ? undefined : only;
}

/**
 * Why a checked capability does not fit a volume that is a ZFS dataset (`content` undefined)
 * or a zvol holding `content`, or undefined when it fits. `fsTypeGiven` is the capability's
 * fs_type as sent: an empty one fits any mounted volume, "zfs" only a dataset.
 */
export function capabilityMisfit(
  cap: CheckedCapability,
  fsTypeGiven: string,
  content: ZvolContent | undefined,
): string | undefined {
  if (content === undefined) {
    if (cap.kind === "zfs") return undefined;
    return cap.kind === "block"
      ? `The volume is a ZFS dataset, not a block device: use attachment_mode = "file-system"`
      : `The volume is a ZFS dataset: fs_type "${cap.fsType}" does not fit it (use "zfs" or none)`;
  }
  if (content === "block") {
    return cap.kind === "block" ? undefined : `The volume is a raw zvol (a block device): use ` +
      `attachment_mode = "block-device", without fs_type`;
  }
  if (cap.kind === "fs" && cap.fsType === content) return undefined;
  if (cap.kind === "zfs" && fsTypeGiven === "") return undefined;
  return cap.kind === "block"
    ? `The volume holds ${content}: use attachment_mode = "file-system" (a raw device bound ` +
      `under a mounted filesystem would corrupt it)`
    : `The volume holds ${content}: fs_type "${fsTypeGiven}" does not fit it (use ` +
      `"${content}" or none)`;
}
