/**
 * Pure argv builders for the block tools a zvol volume needs on a node (docs/block-volumes.md):
 * blkid to find a filesystem signature, wipefs to clear a half-made one, mkfs.ext4/mkfs.xfs to
 * make one, resize2fs/xfs_growfs to grow one. Each returns the whole argv (program first),
 * never a shell line. Only a zvol's own device, `/dev/zd<N>`, is ever given to them.
 */

import type { ZvolFsType } from "../volume/zvol.ts";

/** The programs this module runs, by name (src/permissions.ts allows them with --block-volumes). */
export const BLOCK_PROGRAMS = [
  "blkid",
  "wipefs",
  "mkfs.ext4",
  "mkfs.xfs",
  "resize2fs",
  "xfs_growfs",
] as const;

/** A zvol's device node, as the kernel names it. */
const ZVOL_DEVICE = /^\/dev\/zd\d+$/;

/**
 * Checks that `device` is a zvol's device node before it reaches an argv.
 * @throws {TypeError} for anything else
 */
export function checkZvolDevice(device: string): string {
  if (!ZVOL_DEVICE.test(device)) throw new TypeError(`"${device}" is not a zvol device (/dev/zdN)`);
  return device;
}

/**
 * `blkid -p -o export <device>`: a low-level probe of the device itself (`-p`: no cache, so a
 * signature written a moment ago is seen), one KEY=value per line. Exit 2: nothing found.
 */
export function blkidArgs(device: string): string[] {
  return ["blkid", "-p", "-o", "export", checkZvolDevice(device)];
}

/** `wipefs -a <device>`: erases every signature blkid can see (a half-made filesystem's). */
export function wipefsArgs(device: string): string[] {
  return ["wipefs", "-a", checkZvolDevice(device)];
}

/**
 * The mkfs of `fsType` on `device`, quiet, without discarding (a fresh zvol has nothing to
 * discard, and a discard of a large one is slow). Never forced: both refuse, or ask, when they
 * find a filesystem, and the plugin formats only a device it found blank or wiped itself.
 */
export function mkfsArgs(fsType: ZvolFsType, device: string): string[] {
  checkZvolDevice(device);
  return fsType === "ext4"
    ? ["mkfs.ext4", "-q", "-E", "nodiscard", device]
    : ["mkfs.xfs", "-q", "-K", device];
}

/**
 * Grows the filesystem to the device's size: resize2fs takes the device (ext4 grows online,
 * mounted), xfs_growfs the mount point (xfs grows only mounted).
 */
export function growArgs(fsType: ZvolFsType, device: string, mountPoint: string): string[] {
  checkZvolDevice(device);
  if (!mountPoint.startsWith("/")) throw new TypeError(`"${mountPoint}" is not absolute`);
  return fsType === "ext4" ? ["resize2fs", device] : ["xfs_growfs", mountPoint];
}

/** What blkid found on a device. */
export interface Signature {
  /** The filesystem (or other) type, e.g. "ext4", "xfs", "LVM2_member". */
  readonly type?: string;
  /** A partition table's type, e.g. "dos", "gpt". */
  readonly ptType?: string;
}

/**
 * Reads `blkid -p -o export` output (and its exit code: 2 is "nothing found").
 * @returns the signature, or undefined when the device has none
 * @throws {SyntaxError} for output that is not KEY=value lines
 */
export function parseBlkid(stdout: string, code: number): Signature | undefined {
  if (code === 2) return undefined;
  const values = new Map<string, string>();
  for (const line of stdout.split("\n")) {
    if (line.trim() === "") continue;
    const eq = line.indexOf("=");
    if (eq <= 0 || !/^[A-Z_]+$/.test(line.slice(0, eq))) {
      throw new SyntaxError(`blkid printed ${JSON.stringify(line)}`);
    }
    values.set(line.slice(0, eq), line.slice(eq + 1));
  }
  const type = values.get("TYPE");
  const ptType = values.get("PTTYPE");
  if (type === undefined && ptType === undefined) return undefined;
  return { ...(type === undefined ? {} : { type }), ...(ptType === undefined ? {} : { ptType }) };
}
