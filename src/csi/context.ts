/**
 * The volume context: what a node needs to know about a volume beyond its id. Written by an
 * operator in `nomad volume register` (`context { size = "10GiB" }`) or returned by CreateVolume.
 */

import { Code, CsiError } from "../errors.ts";
import { parseSize } from "../size.ts";

/** Keys the plugin reads from a volume context. */
export const CONTEXT_KEYS = {
  /** Size of a dataset created at first stage, e.g. "10GiB"; becomes its refquota. */
  size: "size",
} as const;

/** A checked volume context. */
export interface VolumeContext {
  /** Quota for a dataset created at stage, if given. */
  readonly sizeBytes?: number;
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
  const size = ctx?.[CONTEXT_KEYS.size];
  if (size === undefined || size === "") return {};
  try {
    return { sizeBytes: parseSize(size) };
  } catch (err) {
    throw new CsiError(Code.INVALID_ARGUMENT, `volume_context size: ${(err as Error).message}`);
  }
}
