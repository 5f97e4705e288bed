/**
 * The mount table, as `mount` (util-linux, no arguments) lists it. The plugin keeps no state
 * of its own: whether a volume is staged or published is read from here on every call.
 *
 * Why not /proc/self/mountinfo: Deno refuses any read below /proc without --allow-all, and the
 * plugin must not run with all permissions. `mount` is already one of its four programs.
 */

/** One mounted filesystem. */
export interface MountEntry {
  /** For ZFS the dataset name. */
  readonly source: string;
  readonly mountPoint: string;
  readonly fsType: string;
  /** Options such as "ro", "nosuid". */
  readonly options: readonly string[];
}

const LINE = /^(.*?) on (.*) type (\S+) \((.*)\)$/;

/**
 * Parses the listing of `mount` without arguments, one `SRC on PATH type FS (OPTS)` per line.
 * @throws {SyntaxError} for a line without that layout
 */
export function parseMountList(text: string): MountEntry[] {
  const out: MountEntry[] = [];
  for (const line of text.split("\n")) {
    if (line === "") continue;
    const m = LINE.exec(line);
    if (!m) throw new SyntaxError(`Cannot parse mount line ${JSON.stringify(line)}`);
    out.push({ source: m[1]!, mountPoint: m[2]!, fsType: m[3]!, options: m[4]!.split(",") });
  }
  return out;
}

/** The filesystem type ZFS mounts datasets as: "zfs" on OpenZFS, "fuse.zfs" on zfs-fuse. */
export type ZfsFsType = "zfs" | "fuse.zfs";

/**
 * Whether `entry` was mounted by root, for a FUSE mount: fusermount, which mounts FUSE
 * filesystems for other users, always writes the caller's own user_id (and nosuid, nodev), so
 * user_id=0 marks a mount made by root, such as the zfs-fuse daemon's.
 */
function fuseMountedByRoot(entry: MountEntry): boolean {
  return entry.options.includes("user_id=0");
}

/**
 * Decides which entries of the mount table are mounts of ZFS datasets. Any user who can run
 * fusermount can mount a FUSE filesystem named like a dataset (`-o fsname=tank/v,subtype=zfs`
 * lists as "tank/v ... type fuse.zfs"); only the kernel module lists as "zfs", and only root can
 * write user_id=0 on a FUSE mount. So a FUSE entry counts only when made by root, and once the
 * running ZFS's own type is known, only that type counts.
 */
export class MountJudge {
  /** The type the running ZFS mounts as, when known. */
  readonly fsType: ZfsFsType | undefined;

  /** @param fsType the running ZFS's type; unknown accepts "zfs" and root's "fuse.zfs" */
  constructor(fsType?: ZfsFsType) {
    this.fsType = fsType;
  }

  /** Whether `entry` is a mount made by the running ZFS (or a bind mount of one). */
  isZfsMount(entry: MountEntry): boolean {
    if (entry.fsType === "zfs") return this.fsType !== "fuse.zfs";
    if (entry.fsType === "fuse.zfs") return this.fsType !== "zfs" && fuseMountedByRoot(entry);
    return false;
  }

  /** Whether `entry` is a mount of `dataset` (its own, or a bind mount of it). */
  isMountOf(entry: MountEntry, dataset: string): boolean {
    return this.isZfsMount(entry) && entry.source === dataset;
  }
}

/** The judge used before the running ZFS's type is known. */
const UNKNOWN_TYPE = new MountJudge();

/**
 * Whether `entry` can be a ZFS mount whatever ZFS runs: "zfs", or "fuse.zfs" mounted by root.
 * Prefer `Mounter.judge()`, which also knows the type the running ZFS mounts as.
 */
export function isZfsMount(entry: MountEntry): boolean {
  return UNKNOWN_TYPE.isZfsMount(entry);
}

/**
 * Whether `entry` can be a mount of `dataset` whatever ZFS runs (see {@linkcode isZfsMount}).
 * Prefer `Mounter.judge()`, which also knows the type the running ZFS mounts as.
 */
export function isMountOf(entry: MountEntry, dataset: string): boolean {
  return UNKNOWN_TYPE.isMountOf(entry, dataset);
}

/**
 * The type the running ZFS mounts as, read from a dataset that zfs reports mounted at
 * `mountpoint`: the oldest mount of `dataset` there is the one zfs made (anything mounted later
 * is stacked on top of it). Undefined when that mount is not visible, or is neither a kernel ZFS
 * mount nor a FUSE one made by root.
 */
export function zfsTypeAt(
  table: readonly MountEntry[],
  dataset: string,
  mountpoint: string,
): ZfsFsType | undefined {
  const own = table.find((e) => e.mountPoint === mountpoint && e.source === dataset);
  if (!own) return undefined;
  if (own.fsType === "zfs") return "zfs";
  if (own.fsType === "fuse.zfs" && fuseMountedByRoot(own)) return "fuse.zfs";
  return undefined;
}

/** A mount as error messages name it: its source, type and, for FUSE, who mounted it. */
export function describeMount(entry: MountEntry): string {
  const user = entry.fsType.startsWith("fuse")
    ? entry.options.find((o) => o.startsWith("user_id="))
    : undefined;
  return `"${entry.source}" (${entry.fsType}${user ? `, ${user}` : ""})`;
}

/** The mounts at one path, oldest first (the last one is what a process sees there). */
export function mountsAt(table: readonly MountEntry[], path: string): MountEntry[] {
  return table.filter((e) => e.mountPoint === path);
}
