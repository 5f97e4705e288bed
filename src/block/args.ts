/**
 * Pure argv builders for the block tools a zvol volume needs on a node (docs/block-volumes.md):
 * blkid to find a filesystem signature, wipefs to clear a half-made one, mkfs.ext4/mkfs.xfs to
 * make one, resize2fs/xfs_growfs to grow one. Each returns the whole argv (program first),
 * never a shell line. Only a zvol's own device, `/dev/zd<N>`, is ever given to them.
 */

import type { ZvolFsType } from "../volume/zvol.ts";

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

/** A zvol's link as udev makes it: `/dev/zvol/<dataset>` (dataset names have no spaces). */
const ZVOL_LINK = /^\/dev\/zvol\/[A-Za-z0-9_.:\/-]+$/;

/**
 * `lsblk` of one path, following links, raw: `<kernel name> <major>:<minor> <type>`. How a node
 * finds where `/dev/zvol/<dataset>` leads: Deno lets no narrow build read below /dev (it asks
 * for --allow-all there), so the link is resolved by this util-linux tool, not by the plugin.
 * @throws {TypeError} for a path that is not a zvol's link
 */
export function lsblkArgs(link: string): string[] {
  if (!ZVOL_LINK.test(link) || link.includes("/../") || link.endsWith("/..")) {
    throw new TypeError(`"${link}" is not a zvol link (/dev/zvol/<dataset>)`);
  }
  return ["lsblk", "-adnrp", "-o", "NAME,MAJ:MIN,TYPE", link];
}

/** A block device as lsblk names it. */
export interface BlockDevice {
  /** The kernel's name, e.g. /dev/zd16. */
  readonly name: string;
  /** Its device number as stat(2) reports it (st_rdev). */
  readonly rdev: number;
}

/** st_rdev of `major`:`minor` as Linux encodes it (glibc's makedev). */
export function makedev(major: number, minor: number): number {
  return (minor & 0xff) + (major & 0xfff) * 0x100 + Math.floor(minor / 0x100) * 0x100000 +
    Math.floor(major / 0x1000) * 0x100000000000;
}

/**
 * Reads `lsblk -adnrp -o NAME,MAJ:MIN,TYPE` output of one device.
 * @throws {SyntaxError} for anything but one such line
 */
export function parseLsblk(stdout: string): BlockDevice {
  const lines = stdout.split("\n").filter((l) => l.trim() !== "");
  const m = lines.length === 1 ? /^(\S+) (\d+):(\d+) (\S+)$/.exec(lines[0]!.trim()) : null;
  if (!m) throw new SyntaxError(`lsblk printed ${JSON.stringify(stdout.slice(0, 200))}`);
  return { name: m[1]!, rdev: makedev(Number(m[2]), Number(m[3])) };
}

/**
 * `zvol_id <device>`: OpenZFS's udev helper, which asks the kernel (ioctl BLKZNAME) which
 * dataset a zvol device is and prints it: what udev names /dev/zvol/<dataset> by. A link can be
 * swapped by hand; this answer cannot.
 */
export function zvolIdArgs(device: string): string[] {
  return ["zvol_id", checkZvolDevice(device)];
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
