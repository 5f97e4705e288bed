/**
 * Human sizes such as "10GiB" for the volume context. A bare suffix (K, M, G, T, P) is binary,
 * as in zfs; "KB", "MB", ... are decimal and "KiB", "MiB", ... binary, as in Nomad.
 */

const UNITS: Record<string, number> = {
  "": 1,
  "b": 1,
  "k": 1024,
  "m": 1024 ** 2,
  "g": 1024 ** 3,
  "t": 1024 ** 4,
  "p": 1024 ** 5,
  "kib": 1024,
  "mib": 1024 ** 2,
  "gib": 1024 ** 3,
  "tib": 1024 ** 4,
  "pib": 1024 ** 5,
  "kb": 1000,
  "mb": 1000 ** 2,
  "gb": 1000 ** 3,
  "tb": 1000 ** 4,
  "pb": 1000 ** 5,
};

/**
 * Smallest volume: ZFS refuses a refquota below what an empty filesystem already uses (it says
 * "out of space", which would mislead), so no volume is made smaller than this.
 */
export const MIN_VOLUME_BYTES = 1024 * 1024;

/**
 * Parses a size into whole bytes (rounded up).
 * @throws {RangeError} for text that is not a positive size below 2^53 bytes
 */
export function parseSize(text: string): number {
  const m = /^\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*$/.exec(text);
  const unit = m ? UNITS[m[2]!.toLowerCase()] : undefined;
  if (!m || unit === undefined) {
    throw new RangeError(`Size "${text}" is not a size such as 10GiB, 500M or 1073741824`);
  }
  const bytes = Math.ceil(Number(m[1]) * unit);
  if (!Number.isSafeInteger(bytes) || bytes <= 0) {
    throw new RangeError(`Size "${text}" is out of range`);
  }
  return bytes;
}
