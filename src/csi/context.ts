/**
 * The volume context: what a node needs to know about a volume beyond its id. Written by an
 * operator in `nomad volume register` (`context { size = "10GiB" }`) or returned by CreateVolume.
 */

import { Code, CsiError } from "../errors.ts";
import { MIN_VOLUME_BYTES, parseSize } from "../size.ts";
import type { KeepPolicy } from "../store/layout.ts";
import { parseInterval, parseKeepPolicy } from "../store/policy.ts";
import { isZvolContent, type ZvolContent } from "../volume/zvol.ts";

/** Keys the plugin reads from a volume context. */
export const CONTEXT_KEYS = {
  /** Size of a dataset created at first stage, e.g. "10GiB"; becomes its refquota. */
  size: "size",
  /**
   * The dataset that holds the volume, as CreateVolume reports it. Informative; a node checks
   * that it names the dataset the volume id maps to, so a stale context cannot mislead it.
   */
  dataset: "dataset",
  /**
   * Backups of a registered volume (as the CreateVolume parameters of the same names): how
   * often, e.g. "15m" ("0": none), and what to keep, e.g. "last=4,hourly=24,daily=14".
   */
  backupInterval: "backup_interval",
  backupKeep: "backup_keep",
  /**
   * What a zvol holds, as CreateVolume reports it: "block", "ext4" or "xfs" (absent: a ZFS
   * dataset). A node checks it against the zvol's own record, never trusts it alone.
   */
  fsType: "fs_type",
} as const;

/** A checked volume context. */
export interface VolumeContext {
  /** Quota for a dataset created at stage, if given. */
  readonly sizeBytes?: number;
  /** The dataset the context says holds the volume, if it says. */
  readonly dataset?: string;
  /** Seconds between scheduled backups, if the context says (0: none). */
  readonly backupIntervalSeconds?: number;
  readonly backupKeep?: KeepPolicy;
  /** What the context says the volume is: a zvol holding this; absent: a ZFS dataset. */
  readonly zvol?: ZvolContent;
}

/**
 * Checks a volume context. Unknown keys are refused so that a typo does not silently create a
 * volume without its quota.
 * @throws {CsiError} INVALID_ARGUMENT naming the key
 */
export function parseVolumeContext(
  ctx: Readonly<Record<string, string>> | null | undefined,
): VolumeContext {
  const known = new Set<string>(Object.values(CONTEXT_KEYS));
  for (const key of Object.keys(ctx ?? {})) {
    if (!known.has(key)) {
      throw new CsiError(
        Code.INVALID_ARGUMENT,
        `volume_context key "${key}" is not known; known keys: ${[...known].join(", ")}`,
      );
    }
  }
  const dataset = ctx?.[CONTEXT_KEYS.dataset];
  const fsType = ctx?.[CONTEXT_KEYS.fsType] ?? "";
  if (fsType !== "" && fsType !== "zfs" && !isZvolContent(fsType)) {
    throw new CsiError(
      Code.INVALID_ARGUMENT,
      `volume_context fs_type "${fsType}" is not one of block, ext4, xfs, zfs`,
    );
  }
  const base = {
    ...(dataset ? { dataset } : {}),
    ...(isZvolContent(fsType) ? { zvol: fsType } : {}),
    ...backupOf(ctx),
  };
  const size = ctx?.[CONTEXT_KEYS.size];
  if (size === undefined || size === "") return base;
  if (base.zvol !== undefined) {
    // A dataset made at first stage is a filesystem: a zvol is made by CreateVolume only.
    throw new CsiError(
      Code.INVALID_ARGUMENT,
      `volume_context size and fs_type "${base.zvol}" do not go together: a zvol is made by ` +
        `CreateVolume (nomad volume create), never at first stage`,
    );
  }
  let sizeBytes: number;
  try {
    sizeBytes = parseSize(size);
  } catch (err) {
    throw new CsiError(Code.INVALID_ARGUMENT, `volume_context size: ${(err as Error).message}`);
  }
  if (sizeBytes < MIN_VOLUME_BYTES) {
    throw new CsiError(
      Code.OUT_OF_RANGE,
      `volume_context size "${size}" is below the smallest volume, ${MIN_VOLUME_BYTES} bytes`,
    );
  }
  return { ...base, sizeBytes };
}

/** The backup keys of a context, checked. */
function backupOf(
  ctx: Readonly<Record<string, string>> | null | undefined,
): Pick<VolumeContext, "backupIntervalSeconds" | "backupKeep"> {
  const interval = ctx?.[CONTEXT_KEYS.backupInterval];
  const keep = ctx?.[CONTEXT_KEYS.backupKeep];
  try {
    return {
      ...(interval ? { backupIntervalSeconds: parseInterval(interval) } : {}),
      ...(keep ? { backupKeep: parseKeepPolicy(keep) } : {}),
    };
  } catch (err) {
    throw new CsiError(Code.INVALID_ARGUMENT, `volume_context: ${(err as Error).message}`);
  }
}
