/**
 * A volume's size properties as its recorded parameters and capacity say they must be, and the
 * `zfs set` that gets them there. `refquota` is the capacity; `quota` and `refreservation`
 * follow the `quota` and `refreservation` parameters recorded at creation. Every target comes
 * from those and the capacity, never from the current values, so an expansion that failed half
 * way (no room for the refreservation, or a plugin that died between two sets) is finished by
 * the next call, and a repeat changes nothing.
 */

import { Code, CsiError } from "../errors.ts";
import type { PropertyList } from "../zfs/args.ts";
import { MANAGED_PROPERTY } from "../zfs/names.ts";
import { parseBytes, type PropertyMap } from "../zfs/parse.ts";
import { PARAMETERS_PROPERTY, userValue } from "./catalog.ts";
import {
  parseParameters,
  SIZE_PARAMETERS,
  sizeOf,
  UNRESTRICTED_POLICY,
  type VolumeParameters,
} from "../parameters.ts";

/** A checked capacity range (what a caller asked for); 0 means "not set". */
export interface Capacity {
  readonly requiredBytes: number;
  readonly limitBytes: number;
}

/** The properties that make a volume's size. */
export const SIZE_PROPERTIES = ["refquota", "quota", "refreservation"] as const;

/** One of {@linkcode SIZE_PROPERTIES}. */
export type SizeProperty = typeof SIZE_PROPERTIES[number];

/** What to read of a volume to plan its size: ownership, recorded parameters, sizes. */
export const SIZE_STATE = [
  "type",
  MANAGED_PROPERTY,
  PARAMETERS_PROPERTY,
  ...SIZE_PROPERTIES,
] as const;

/** Byte values of the size properties; 0 is "none" (unlimited, nothing reserved). */
export type Sizes = Readonly<Record<SizeProperty, number>>;

/** What an expansion does to a volume. */
export interface SizePlan {
  /** The volume's capacity once `changes` are made; 0: unlimited. */
  readonly refquota: number;
  /**
   * Properties that differ from their targets, in an order that is safe one at a time (zfs
   * refuses a refquota below the refreservation, and a quota below what is used and reserved);
   * empty when the volume is as it must be.
   */
  readonly changes: PropertyList;
}

/**
 * The `quota` and `refreservation` parameters recorded on a volume, or undefined when none
 * were (a volume made by NodeStageVolume from a volume context). Only these two are read:
 * what the other parameters mean to a newer plugin does not matter here.
 * @throws {CsiError} FAILED_PRECONDITION when the record cannot be read
 */
export function recordedSizeParameters(
  id: string,
  props: PropertyMap,
): VolumeParameters | undefined {
  const text = userValue(props, PARAMETERS_PROPERTY);
  if (text === "") return undefined;
  try {
    const record: unknown = JSON.parse(text);
    if (typeof record !== "object" || record === null || Array.isArray(record)) {
      throw new SyntaxError("not a JSON object");
    }
    const sizes: Record<string, string> = {};
    for (const key of Object.values(SIZE_PARAMETERS)) {
      const value: unknown = (record as Record<string, unknown>)[key];
      if (value === undefined) continue;
      if (typeof value !== "string") throw new SyntaxError(`"${key}" is not a string`);
      sizes[key] = value;
    }
    // Judged when the volume was made: whatever the policy says now, read them back.
    return parseParameters(sizes, UNRESTRICTED_POLICY);
  } catch (err) {
    throw new CsiError(
      Code.FAILED_PRECONDITION,
      `Volume "${id}" has unreadable recorded parameters (${PARAMETERS_PROPERTY}=` +
        `${JSON.stringify(text.slice(0, 200))}: ${(err as Error).message}), so its quota and ` +
        `refreservation cannot be sized; put back the parameters it was created with`,
      { cause: err },
    );
  }
}

/** The byte values of a volume's size properties as read. */
export function currentSizes(props: PropertyMap): Sizes {
  const read = (name: SizeProperty) => parseBytes(props.get(name)?.value ?? "0");
  return {
    refquota: read("refquota"),
    quota: read("quota"),
    refreservation: read("refreservation"),
  };
}

/**
 * Plans an expansion of volume `id` (its properties as read with {@linkcode SIZE_STATE}) to
 * `capacity`: never smaller than it is, and an unlimited volume stays unlimited. The size
 * properties are planned whether or not the volume grows, so a call that finds the capacity
 * reached still finishes what an earlier one left undone.
 *
 * A fixed `quota` (bytes) bounds data and snapshots together: it stays as recorded, and growing
 * the volume past it is refused rather than the quota silently moved. (A volume grown past it
 * by an older plugin, which moved the quota along, keeps the quota it has.)
 * @throws {CsiError} OUT_OF_RANGE for a shrink or growth past a fixed quota, FAILED_PRECONDITION
 *   when the recorded parameters cannot be read
 */
export function planSize(id: string, props: PropertyMap, capacity: Capacity): SizePlan {
  const current = currentSizes(props);
  const params = recordedSizeParameters(id, props);
  if (current.refquota > 0 && capacity.limitBytes > 0 && current.refquota > capacity.limitBytes) {
    throw new CsiError(
      Code.OUT_OF_RANGE,
      `Volume "${id}" has ${current.refquota} bytes; shrinking to ${capacity.limitBytes} is not ` +
        `supported`,
    );
  }
  const grows = current.refquota > 0 && capacity.requiredBytes > current.refquota;
  const refquota = grows ? capacity.requiredBytes : current.refquota;
  const target: Partial<Record<SizeProperty, number>> = { refquota };
  if (params?.quota) {
    const quota = sizeOf(params.quota, refquota);
    if (refquota > 0 && quota < refquota) {
      if (grows) {
        throw new CsiError(
          Code.OUT_OF_RANGE,
          `Volume "${id}" cannot grow to ${refquota} bytes: it was created with quota=${quota} ` +
            `bytes, which bounds its data and snapshots together; nothing was changed. Create a ` +
            `copy with a larger quota, or quota=capacity, from a snapshot of it`,
        );
      }
    } else {
      target.quota = quota;
    }
  }
  if (params?.refreservation) target.refreservation = sizeOf(params.refreservation, refquota);
  return { refquota, changes: orderedChanges(current, target) };
}

/**
 * The properties whose target differs from the current value, in an order in which each one
 * `zfs set` succeeds on its own whenever the end state is valid: a quota that rises first and
 * falls last, a refreservation that falls before the refquota and rises after it.
 */
export function orderedChanges(
  current: Sizes,
  target: Partial<Record<SizeProperty, number>>,
): PropertyList {
  const delta = (name: SizeProperty): number => {
    const want = target[name];
    return want === undefined ? 0 : Math.sign(want - current[name]);
  };
  const steps: ReadonlyArray<readonly [SizeProperty, (d: number) => boolean]> = [
    ["quota", (d) => d > 0],
    ["refreservation", (d) => d < 0],
    ["refquota", (d) => d !== 0],
    ["refreservation", (d) => d > 0],
    ["quota", (d) => d < 0],
  ];
  const out: Array<readonly [string, string]> = [];
  for (const [name, when] of steps) {
    if (when(delta(name))) out.push([name, sizeValue(target[name]!)]);
  }
  return out;
}

/** A size as `zfs set` takes it: bytes, or "none" for 0. */
function sizeValue(bytes: number): string {
  return bytes === 0 ? "none" : String(bytes);
}
