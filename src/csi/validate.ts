/**
 * Checks of request fields shared by the CSI handlers. Each throws CsiError(INVALID_ARGUMENT)
 * with a message that names the field.
 */

import { Code, CsiError } from "../errors.ts";
import type { CapacityRange, VolumeCapability } from "./types.ts";
import type { Capacity } from "../volume/sizing.ts";
import { isZvolFsType, type ZvolFsType } from "../volume/zvol.ts";

function invalid(message: string): CsiError {
  return new CsiError(Code.INVALID_ARGUMENT, message);
}

/** Returns `value` if it is a non-empty string. */
export function required(field: string, value: unknown): string {
  if (typeof value !== "string" || value === "") throw invalid(`${field} is required`);
  return value;
}

/** Access modes this plugin serves; all place a node-local filesystem on one node. */
const ACCESS_MODES = new Set([
  "SINGLE_NODE_WRITER",
  "SINGLE_NODE_READER_ONLY",
  "SINGLE_NODE_SINGLE_WRITER",
  "SINGLE_NODE_MULTI_WRITER",
  "MULTI_NODE_READER_ONLY",
  "MULTI_NODE_SINGLE_WRITER",
  "MULTI_NODE_MULTI_WRITER",
]);

const READ_ONLY_MODES = new Set(["SINGLE_NODE_READER_ONLY", "MULTI_NODE_READER_ONLY"]);

/** Per-mount flags that a bind mount can carry; anything else is refused, not passed on. */
const MOUNT_FLAGS = new Set([
  "ro",
  "rw",
  "nosuid",
  "nodev",
  "noexec",
  "noatime",
  "nodiratime",
  "relatime",
  "strictatime",
]);
/** Flags that ask for the default and so need no remount. */
const DEFAULT_FLAGS = new Set(["defaults", "suid", "dev", "exec", "atime", "diratime"]);

/** A checked filesystem capability. */
export interface MountCapability {
  readonly accessMode: string;
  /** Extra per-mount flags, deduplicated, in request order (never "rw"). */
  readonly flags: readonly string[];
  /** True when the access mode only allows reading. */
  readonly readOnlyMode: boolean;
}

/**
 * A checked capability, by what it asks for: a ZFS dataset mounted (`zfs`), a filesystem made
 * on a zvol and mounted (`fs`), or the zvol's raw device (`block`).
 */
export type CheckedCapability =
  | ({ readonly kind: "zfs" } & MountCapability)
  | ({ readonly kind: "fs"; readonly fsType: ZvolFsType } & MountCapability)
  /** A raw device takes no mount flags: `flags` is always empty. */
  | ({ readonly kind: "block" } & MountCapability);

/** What the operator allows of capabilities (config.ts). */
export interface CapabilityOptions {
  /** `--block-volumes`: zvols may be asked for (raw block, or ext4/xfs). */
  readonly blockVolumes: boolean;
}

const BLOCK_VOLUMES_OFF: CapabilityOptions = { blockVolumes: false };

/** The refusal of a zvol capability by a plugin started without --block-volumes. */
export const BLOCK_VOLUMES_OFF_MESSAGE =
  "Block volumes are not supported by this plugin as started: zvols (raw block devices, or " +
  "ext4/xfs on a zvol) need the plugin to be started with --block-volumes";

/**
 * Checks a volume capability: a known access mode, and a mount of a ZFS dataset, or (with
 * --block-volumes) a mount of ext4/xfs on a zvol or the zvol's raw device.
 */
export function checkCapability(
  cap: VolumeCapability | null | undefined,
  opts: CapabilityOptions = BLOCK_VOLUMES_OFF,
): CheckedCapability {
  if (!cap) throw invalid("volume_capability is required");
  const block = Boolean(cap.block) || cap.access_type === "block";
  if (block && !opts.blockVolumes) throw invalid(BLOCK_VOLUMES_OFF_MESSAGE);
  if (block && cap.mount) {
    throw invalid("volume_capability has both a block and a mount access type");
  }
  if (!block && !cap.mount) throw invalid("volume_capability needs a mount access type");
  const mode = cap.access_mode?.mode ?? "";
  if (!ACCESS_MODES.has(mode)) {
    throw invalid(`volume_capability.access_mode "${mode || "UNKNOWN"}" is not supported`);
  }
  const readOnlyMode = READ_ONLY_MODES.has(mode);
  if (block || !cap.mount) return { kind: "block", accessMode: mode, flags: [], readOnlyMode };
  const fsType = cap.mount.fs_type ?? "";
  if (isZvolFsType(fsType)) {
    if (!opts.blockVolumes) {
      throw invalid(`fs_type "${fsType}" is made on a zvol: ${BLOCK_VOLUMES_OFF_MESSAGE}`);
    }
  } else if (fsType !== "" && fsType !== "zfs") {
    throw invalid(
      `fs_type "${fsType}" is not supported: volumes are ZFS filesystems (use "zfs" or leave ` +
        `it empty)${opts.blockVolumes ? ', or "ext4" or "xfs" on a zvol' : ""}`,
    );
  }
  if ((cap.mount.volume_mount_group ?? "") !== "") {
    throw invalid("volume_mount_group is not supported");
  }
  const flags: string[] = [];
  for (const raw of cap.mount.mount_flags ?? []) {
    for (const flag of raw.split(",").map((f) => f.trim()).filter((f) => f !== "")) {
      if (DEFAULT_FLAGS.has(flag) || flag === "rw") continue;
      if (!MOUNT_FLAGS.has(flag)) {
        throw invalid(
          `Mount flag "${flag}" is not supported; allowed: ${[...MOUNT_FLAGS].join(", ")}`,
        );
      }
      if (!flags.includes(flag)) flags.push(flag);
    }
  }
  const mount = { accessMode: mode, flags, readOnlyMode };
  return isZvolFsType(fsType) ? { kind: "fs", fsType, ...mount } : { kind: "zfs", ...mount };
}

/** Bytes from an int64 field (a decimal string); 0 when unset. */
export function int64Field(field: string, value: string | number | undefined | null): number {
  if (value === undefined || value === null || value === "") return 0;
  const text = String(value);
  if (!/^-?\d+$/.test(text)) throw invalid(`${field} "${text}" is not a whole number`);
  const n = Number(text);
  if (n < 0) throw invalid(`${field} must not be negative`);
  if (!Number.isSafeInteger(n)) {
    throw new CsiError(Code.OUT_OF_RANGE, `${field} ${text} is larger than this plugin supports`);
  }
  return n;
}

/** Checks a capacity range (required ≤ limit when both are set). */
export function checkCapacity(range: CapacityRange | null | undefined): Capacity {
  const requiredBytes = int64Field("capacity_range.required_bytes", range?.required_bytes);
  const limitBytes = int64Field("capacity_range.limit_bytes", range?.limit_bytes);
  if (limitBytes > 0 && requiredBytes > limitBytes) {
    throw invalid("capacity_range.required_bytes is larger than limit_bytes");
  }
  return { requiredBytes, limitBytes };
}
