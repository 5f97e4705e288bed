/**
 * Whether a zvol's filesystem is made, to be made, or must be left alone: the one rule that
 * keeps a stage from ever formatting a filesystem that holds data (docs/block-volumes.md,
 * "Formatting, once"). It weighs the plugin's own record on the zvol (`org.zfs-csi:format`:
 * "begun" before mkfs, "done" after) against the signature blkid finds on the device.
 */

import type { ZvolFsType } from "../volume/zvol.ts";
import type { Signature } from "./args.ts";

/** What a stage does about the filesystem. */
export type FormatStep =
  /** It is there and recorded: mount it. */
  | { readonly kind: "mount" }
  /** It is there, of the wanted type, but not recorded (a clone or copy of one): record it. */
  | { readonly kind: "adopt" }
  /** The device is blank: format it. */
  | { readonly kind: "format" }
  /**
   * The plugin began formatting and never recorded the end (killed during mkfs): whatever is
   * there was never mounted, so holds no data. Wipe it and format again.
   */
  | { readonly kind: "redo" }
  /** Anything else: touch nothing, and say why. */
  | { readonly kind: "refuse"; readonly why: string };

/**
 * The step for a zvol whose record says `recorded` ("", "begun" or "done"), on whose device
 * blkid found `found`, to hold `want`.
 */
export function formatStep(
  recorded: string,
  found: Signature | undefined,
  want: ZvolFsType,
): FormatStep {
  const what = found ? (found.type ?? `a ${found.ptType} partition table`) : "nothing";
  if (recorded === "begun") return { kind: "redo" };
  if (recorded === "done") {
    if (found?.type === want) return { kind: "mount" };
    return {
      kind: "refuse",
      why: `it was formatted as ${want} by zfs-csi, and now holds ${what}: it is not formatted ` +
        `again (its data may still be there); inspect it by hand`,
    };
  }
  if (recorded !== "") {
    return { kind: "refuse", why: `its format record "${recorded}" is not one zfs-csi writes` };
  }
  if (found === undefined) return { kind: "format" };
  if (found.type === want) return { kind: "adopt" };
  return {
    kind: "refuse",
    why: `it holds ${what}, not ${want}, and zfs-csi did not put it there: it is never ` +
      `formatted over`,
  };
}
