/**
 * What lstat(2) tells about the mounts at a path, without starting a process. The device
 * number (st_dev) is the filesystem a path shows: the root of a mount lies on another device
 * than its parent directory, and a bind mount shows the device and root inode of what it binds.
 * The node service decides from this where it can (src/csi/node.ts) and reads the mount table
 * where it cannot; see docs/security.md, "Threat model".
 *
 * Deno gives lstat but not statfs's filesystem id, and refuses reads under /proc, so the device
 * and inode numbers are all there is to go by.
 */

/** The part of lstat(2) that tells which filesystem shows at a path. */
export interface PathStat {
  readonly dev: number;
  readonly ino: number;
  readonly isDirectory: boolean;
}

/** lstat(2); replaceable in tests. */
export type LstatFn = (path: string) => Promise<PathStat>;

/** lstat(2) through Deno. */
export const denoLstat: LstatFn = async (path) => {
  const info = await Deno.lstat(path);
  return { dev: info.dev, ino: info.ino ?? Number.NaN, isDirectory: info.isDirectory };
};

/**
 * A path as lstat sees it: its stat, "missing" (ENOENT), or "unknown" for any other error
 * (EACCES from a FUSE mount of another user, ENOTCONN from a dead one) and for no answer in
 * time (a FUSE daemon that hangs), which decides nothing.
 */
export type Seen = PathStat | "missing" | "unknown";

/**
 * How long {@linkcode look} waits for lstat. A FUSE mount (zfs-fuse's, or a user's) answers
 * lstat from its daemon; one that hangs must not hold a call: the mount table, which `mount`
 * reads from the kernel under a time limit, decides instead.
 */
export const LOOK_TIMEOUT_MS = 2000;

/** Looks at `path` with `lstat`; never throws. */
export async function look(
  lstat: LstatFn,
  path: string,
  timeoutMs = LOOK_TIMEOUT_MS,
): Promise<Seen> {
  let timer: ReturnType<typeof setTimeout> | undefined;
  const late = new Promise<"unknown">((resolve) => {
    timer = setTimeout(() => resolve("unknown"), timeoutMs);
  });
  try {
    return await Promise.race([lstat(path), late]);
  } catch (err) {
    return err instanceof Deno.errors.NotFound ? "missing" : "unknown";
  } finally {
    clearTimeout(timer);
  }
}

/**
 * A file's identity: device and inode. For a volume, what a bind mount of its dataset shows at
 * its root. Device numbers are unique among mounted filesystems; one is given again only after
 * the filesystem holding it is gone (unmounted everywhere).
 */
export interface RootIdentity {
  readonly dev: number;
  readonly ino: number;
}

/**
 * Whether `here` is the top of a mount showing `root`: the same device and inode, on another
 * device than its parent directory (so it is a mount there, not the directory below it).
 */
export function showsRoot(here: Seen, parent: Seen, root: RootIdentity): boolean {
  return typeof here !== "string" && typeof parent !== "string" && here.isDirectory &&
    here.dev === root.dev && here.ino === root.ino && parent.dev !== root.dev;
}

/** What a walk from a base directory down to a path's parent found. */
export interface Walk {
  /**
   * Whether a directory strictly between the base directory and the path lies on another
   * device than the base directory ("unknown" when one could not be looked at, or is not a
   * directory): the table-based check `mountBetween` (paths.ts) asks the same, by name.
   */
  readonly crosses: boolean | "unknown";
  /** The path's parent directory, as lstat saw it. */
  readonly parent: Seen;
  /** Each directory below the base directory that was looked at, down to the parent. */
  readonly dirs: ReadonlyArray<readonly [string, PathStat]>;
}

/**
 * Walks from the base directory in `roots` that holds `path` down to the path's parent, looking
 * at each directory on the way. A missing directory ends the walk: nothing is mounted below it.
 */
export async function walkToParent(
  path: string,
  roots: readonly string[],
  lstat: LstatFn,
): Promise<Walk> {
  const dirs: [string, PathStat][] = [];
  const root = roots.find((r) => path.startsWith(r + "/"));
  if (root === undefined) return { crosses: "unknown", parent: "unknown", dirs };
  const base = await look(lstat, root);
  if (typeof base === "string" || !base.isDirectory) {
    return { crosses: "unknown", parent: "unknown", dirs };
  }
  let parent: Seen = base;
  let dir = root;
  for (const part of path.slice(root.length + 1).split("/").slice(0, -1)) {
    dir = `${dir}/${part}`;
    const seen = await look(lstat, dir);
    if (seen === "missing") return { crosses: false, parent: "missing", dirs };
    if (seen === "unknown" || !seen.isDirectory) return { crosses: "unknown", parent: seen, dirs };
    if (seen.dev !== base.dev) return { crosses: true, parent: seen, dirs };
    dirs.push([dir, seen]);
    parent = seen;
  }
  return { crosses: false, parent, dirs };
}

/** Whether two looks saw the same file: the same device and inode. */
export function sameFile(a: Seen, b: RootIdentity | undefined): boolean {
  return typeof a !== "string" && b !== undefined && a.dev === b.dev && a.ino === b.ino;
}
