/**
 * What makes a volume a zvol (docs/block-volumes.md), as pure functions: which requests ask for
 * one, the CreateVolume parameters only zvols take, the size a zvol is made with, and the user
 * properties a zvol carries beside the ones every volume has.
 */

import { Code, CsiError } from "../errors.ts";
import { BACKUP_PARAMETERS, SIZE_PARAMETERS } from "../parameters.ts";

/** Filesystems the plugin makes on a zvol. */
export const ZVOL_FS_TYPES = ["ext4", "xfs"] as const;
/** One of {@linkcode ZVOL_FS_TYPES}. */
export type ZvolFsType = typeof ZVOL_FS_TYPES[number];

/** Whether `value` names a filesystem the plugin makes on a zvol. */
export function isZvolFsType(value: string): value is ZvolFsType {
  return (ZVOL_FS_TYPES as readonly string[]).includes(value);
}

/** What a zvol holds: its raw device is the volume (`block`), or a filesystem made on it. */
export type ZvolContent = "block" | ZvolFsType;

/** Whether `value` names what a zvol holds. */
export function isZvolContent(value: string): value is ZvolContent {
  return value === "block" || isZvolFsType(value);
}

/**
 * User property recording what a zvol holds ({@linkcode ZvolContent}), set when it is made:
 * a node checks the volume context and the capability against it, never trusts them alone.
 */
export const ZVOL_CONTENT_PROPERTY = "org.zfs-csi:fs-type";

/**
 * User property recording the plugin's own progress formatting an ext4/xfs zvol: "begun" is set
 * before mkfs runs, "done" after it succeeded (node side, src/block/). A zvol the plugin began
 * formatting and never finished was never mounted, so it holds no data and may be formatted
 * again; one it finished is never formatted again.
 */
export const FORMAT_PROPERTY = "org.zfs-csi:format";
/** Values of {@linkcode FORMAT_PROPERTY}. */
export const FORMAT = { begun: "begun", done: "done" } as const;

/**
 * User property a node sets to its id while it has the zvol staged, and removes at unstage:
 * a raw device bound onto a file does not show in the mount table as the zvol, so this is how
 * a DeleteVolume tells that a zvol is in use.
 */
export const ATTACHED_PROPERTY = "org.zfs-csi:attached";

/** The CreateVolume parameters that only zvols take. */
export const ZVOL_PARAMETERS = {
  fsType: "fs_type",
  volblocksize: "volblocksize",
  sparse: "sparse",
} as const;

/**
 * ZFS properties (CreateVolume parameters) that apply to a zvol; the others in the allowlist
 * (recordsize, atime, acltype, ...) are for filesystems only, and zfs would refuse them.
 */
const ZVOL_ZFS_PARAMETERS = new Set([
  "checksum",
  "compression",
  "copies",
  "dedup",
  "encryption",
  "keyformat",
  "keylocation",
  "pbkdf2iters",
  "logbias",
  "primarycache",
  "secondarycache",
  "sync",
  "redundant_metadata",
]);

/** Smallest and largest volblocksize accepted (powers of two between). */
const MIN_VOLBLOCKSIZE = 4096;
const MAX_VOLBLOCKSIZE = 128 * 1024;
/** A zvol's size is rounded up to a multiple of this: a multiple of every volblocksize. */
export const ZVOL_SIZE_STEP = MAX_VOLBLOCKSIZE;
/** Size of a zvol when the request asks for none. */
export const DEFAULT_ZVOL_BYTES = 1024 * 1024 * 1024;
/** mkfs.xfs (xfsprogs 5.19 and later) refuses filesystems below 300 MiB. */
export const MIN_XFS_BYTES = 300 * 1024 * 1024;

function invalid(message: string): CsiError {
  return new CsiError(Code.INVALID_ARGUMENT, message);
}

/** The zvol parameters of a CreateVolume, checked. */
export interface ZvolParameters {
  /** volblocksize as given (e.g. "16K"), when given. */
  readonly volblocksize?: string;
  readonly volblocksizeBytes?: number;
  /** Thin (no refreservation). */
  readonly sparse: boolean;
  /** The other parameters, for parseParameters. */
  readonly rest: Readonly<Record<string, string>>;
}

/**
 * Takes the zvol parameters out of `parameters` and checks them and what is left for a zvol.
 * `fs_type` is taken out too (requestedContent read it).
 * @throws {CsiError} INVALID_ARGUMENT naming the parameter
 */
export function parseZvolParameters(
  parameters: Readonly<Record<string, string>>,
  opts: { readonly allowSparse: boolean },
): ZvolParameters {
  const rest: Record<string, string> = {};
  let volblocksize: string | undefined;
  let volblocksizeBytes: number | undefined;
  let sparse = false;
  for (const [key, value] of Object.entries(parameters)) {
    if (key === ZVOL_PARAMETERS.fsType) continue;
    if (key === ZVOL_PARAMETERS.volblocksize) {
      volblocksizeBytes = parseVolblocksize(value);
      volblocksize = value;
      continue;
    }
    if (key === ZVOL_PARAMETERS.sparse) {
      if (value !== "true" && value !== "false") {
        throw invalid(`Parameter sparse="${value}" must be "true" or "false"`);
      }
      sparse = value === "true";
      if (sparse && !opts.allowSparse) {
        throw invalid(
          `Parameter sparse="true" is not allowed on this node: a thin zvol can fail writes ` +
            `when the pool is full; the operator can allow it with --allow-sparse-zvols`,
        );
      }
      continue;
    }
    if (Object.hasOwn(SIZE_PARAMETERS, key)) {
      throw invalid(
        `Parameter "${key}" does not apply to a zvol: its size is its capacity, reserved in ` +
          `full unless sparse="true"`,
      );
    }
    if (
      !key.includes(":") && key !== BACKUP_PARAMETERS.interval &&
      key !== BACKUP_PARAMETERS.keep && !ZVOL_ZFS_PARAMETERS.has(key)
    ) {
      throw invalid(
        `Parameter "${key}" does not apply to a zvol (it is a filesystem property); zvols ` +
          `take ${[...ZVOL_ZFS_PARAMETERS].sort().join(", ")}, volblocksize, sparse, fs_type ` +
          `and user properties`,
      );
    }
    rest[key] = value;
  }
  return {
    ...(volblocksize === undefined || volblocksizeBytes === undefined
      ? {}
      : { volblocksize, volblocksizeBytes }),
    sparse,
    rest,
  };
}

/**
 * A volblocksize parameter in bytes: a power of two from 4K to 128K.
 * @throws {CsiError} INVALID_ARGUMENT otherwise
 */
export function parseVolblocksize(value: string): number {
  // zfs's own spelling: bytes, or a number of K (1024) or M; nothing else.
  const m = /^(\d{1,7})([KkMm]?)$/.exec(value);
  const unit = m?.[2]?.toUpperCase();
  const bytes = m ? Number(m[1]) * (unit === "K" ? 1024 : unit === "M" ? 1024 * 1024 : 1) : NaN;
  const powerOfTwo = Number.isSafeInteger(bytes) && bytes > 0 && (bytes & (bytes - 1)) === 0;
  if (!powerOfTwo || bytes < MIN_VOLBLOCKSIZE || bytes > MAX_VOLBLOCKSIZE) {
    throw invalid(
      `Parameter volblocksize="${value}" must be a power of two from 4K to 128K, e.g. "16K"`,
    );
  }
  return bytes;
}

/**
 * The size to make a zvol: what the range asks for (the default when nothing), at least the
 * smallest the content allows, rounded up to a multiple of {@linkcode ZVOL_SIZE_STEP}.
 * @throws {CsiError} OUT_OF_RANGE when that exceeds limit_bytes
 */
export function planZvolSize(
  capacity: { readonly requiredBytes: number; readonly limitBytes: number },
  content: ZvolContent,
  minBytes: number,
): number {
  const floor = Math.max(minBytes, content === "xfs" ? MIN_XFS_BYTES : 0);
  const asked = capacity.requiredBytes > 0
    ? capacity.requiredBytes
    : capacity.limitBytes > 0
    ? Math.min(capacity.limitBytes, DEFAULT_ZVOL_BYTES)
    : DEFAULT_ZVOL_BYTES;
  const size = Math.ceil(Math.max(asked, floor) / ZVOL_SIZE_STEP) * ZVOL_SIZE_STEP;
  if (capacity.limitBytes > 0 && size > capacity.limitBytes) {
    throw new CsiError(
      Code.OUT_OF_RANGE,
      `capacity_range.limit_bytes ${capacity.limitBytes} is below the smallest ${content} zvol ` +
        `this plugin makes for the request, ${size} bytes (at least ${floor}, in steps of ` +
        `${ZVOL_SIZE_STEP})`,
    );
  }
  return size;
}

/**
 * The volsize a zvol of `current` bytes (volume `id`) grows to for `capacity`: what it asks for
 * (required_bytes, else limit_bytes) rounded up to a multiple of {@linkcode ZVOL_SIZE_STEP}, or
 * the largest such multiple within limit_bytes when that is not one; never less than `current`
 * (a zvol is never shrunk). An ordinary zvol's ControllerExpandVolume and a follow zvol's record
 * in the store grow by this one rule.
 * @throws {CsiError} OUT_OF_RANGE when the zvol is above limit_bytes already, or when no
 *   multiple of the step lies between required_bytes and limit_bytes
 */
export function planZvolGrowth(
  id: string,
  current: number,
  capacity: { readonly requiredBytes: number; readonly limitBytes: number },
): number {
  if (capacity.limitBytes > 0 && current > capacity.limitBytes) {
    throw new CsiError(
      Code.OUT_OF_RANGE,
      `Volume "${id}" is ${current} bytes already, above limit_bytes ` +
        `${capacity.limitBytes}: a zvol is never shrunk`,
    );
  }
  const asked = capacity.requiredBytes > 0 ? capacity.requiredBytes : capacity.limitBytes;
  const target = Math.ceil(asked / ZVOL_SIZE_STEP) * ZVOL_SIZE_STEP;
  if (target <= current) return current;
  // The largest whole step within limit_bytes, when the asked size is not one.
  const fit = capacity.limitBytes > 0 && target > capacity.limitBytes
    ? Math.floor(capacity.limitBytes / ZVOL_SIZE_STEP) * ZVOL_SIZE_STEP
    : target;
  if (fit < capacity.requiredBytes) {
    throw new CsiError(
      Code.OUT_OF_RANGE,
      `No size in steps of ${ZVOL_SIZE_STEP} bytes lies between required_bytes ` +
        `${capacity.requiredBytes} and limit_bytes ${capacity.limitBytes}`,
    );
  }
  return Math.max(fit, current);
}
