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

/** ZFS mounts report fsType "zfs" on OpenZFS and "fuse.zfs" on zfs-fuse. */
export function isZfsMount(entry: MountEntry): boolean {
  return entry.fsType === "zfs" || entry.fsType === "fuse.zfs";
}

/** The mounts at one path, oldest first (the last one is what a process sees there). */
export function mountsAt(table: readonly MountEntry[], path: string): MountEntry[] {
  return table.filter((e) => e.mountPoint === path);
}

/** Whether `entry` is a mount of `dataset` (its own, or a bind mount of it). */
export function isMountOf(entry: MountEntry, dataset: string): boolean {
  return isZfsMount(entry) && entry.source === dataset;
}
