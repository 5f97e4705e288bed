/**
 * One simulated node's file system as the node service sees it through lstat, realpath and
 * mkdir: directories (device 1, each with its inode), and a mount table of ZFS datasets (their
 * own mounts at their mountpoints, and bind mounts of them). A path with a mount on it shows the
 * dataset's device and root inode, as Linux shows the root of a mount; a bind shows what it
 * binds. Commands that change mounts (`zfs mount`, `mount --bind`, `umount`) are the pool
 * model's (pool_model.ts); this module answers the questions.
 *
 * One shortcut: a target directory below `per-alloc/` leaves the file system when its mount is
 * removed. The plugin removes an unmounted target with node:fs rmdir, which it imports as a
 * binding the simulation cannot replace (and which would be real I/O); Nomad removes a leftover
 * target itself afterwards, so the end state is the same.
 */

/** One mount of a dataset. */
export interface Mount {
  /** The dataset object (pool_model.ts ZObject.oid), which keeps its mounts across a rename. */
  readonly oid: number;
  readonly mountPoint: string;
  /** The dataset's own mount (zfs mount), not a bind. */
  readonly own: boolean;
  /** Mounted read-only (zfs-fuse: the dataset was read-only when mounted; or remounted ro). */
  ro: boolean;
}

/** The inode every dataset's root shows. */
const ROOT_INO = 4;
/** The device of the host's own directories. */
const HOST_DEV = 1;

/** A node's directories and mounts; see the module doc. */
export class HostFs {
  readonly #dirs = new Map<string, number>([["/", 2]]);
  #nextIno = 100;
  /** Mounts, oldest first: the last one at a path is its top. */
  readonly mounts: Mount[] = [];

  /** Creates a directory and its parents (mkdir -p). */
  mkdirp(path: string): void {
    let at = "";
    for (const part of path.split("/").filter((p) => p !== "")) {
      at = `${at}/${part}`;
      if (!this.#dirs.has(at)) this.#dirs.set(at, this.#nextIno++);
    }
  }

  /** Whether a directory (or a mount point) is at `path`. */
  exists(path: string): boolean {
    return this.#dirs.has(path) || this.top(path) !== undefined;
  }

  /** The top mount at `path`. */
  top(path: string): Mount | undefined {
    for (let i = this.mounts.length - 1; i >= 0; i--) {
      if (this.mounts[i]!.mountPoint === path) return this.mounts[i];
    }
    return undefined;
  }

  /** Adds a mount at `path` (its directory made if missing, as zfs mount does). */
  mount(m: Mount): void {
    this.mkdirp(m.mountPoint);
    this.mounts.push(m);
  }

  /** Removes the top mount at `path`; a target directory goes with it (module doc). */
  unmount(path: string): Mount | undefined {
    const m = this.top(path);
    if (!m) return undefined;
    this.mounts.splice(this.mounts.lastIndexOf(m), 1);
    if (/\/per-alloc\//.test(path) && !this.top(path)) this.#dirs.delete(path);
    return m;
  }

  /** lstat(2) of `path`, as Deno answers it. */
  lstat(path: string): Deno.FileInfo {
    const m = this.top(path);
    if (m) return fileInfo(100 + m.oid, ROOT_INO);
    const ino = this.#dirs.get(path);
    if (ino === undefined) throw notFound("lstat", path);
    return fileInfo(HOST_DEV, ino);
  }

  /** realpath(3): no symlinks here, so the path itself when it exists. */
  realPath(path: string): string {
    if (!this.exists(path)) throw notFound("realpath", path);
    return path;
  }

  /** Deno.mkdir. */
  mkdir(path: string, recursive: boolean): void {
    if (this.exists(path)) {
      if (recursive) return;
      throw new Deno.errors.AlreadyExists(`File exists (os error 17): mkdir '${path}'`);
    }
    const parent = path.slice(0, path.lastIndexOf("/")) || "/";
    if (!recursive && !this.exists(parent)) {
      throw notFound("mkdir", path);
    }
    this.mkdirp(path);
  }
}

/**
 * ENOENT as Deno throws it. Made once per call and path and kept: an error's stack trace costs
 * more than the rest of a simulated lstat, and the plugin only tests what kind it is.
 */
const notFounds = new Map<string, Error>();
function notFound(call: string, path: string): Error {
  const key = `${call} '${path}'`;
  let err = notFounds.get(key);
  if (!err) {
    err = new Deno.errors.NotFound(`No such file or directory (os error 2): ${key}`);
    if (notFounds.size > 10_000) notFounds.clear();
    notFounds.set(key, err);
  }
  return err;
}

/** A directory's FileInfo with the fields the plugin reads (the rest as Deno leaves them). */
function fileInfo(dev: number, ino: number): Deno.FileInfo {
  return {
    isFile: false,
    isDirectory: true,
    isSymlink: false,
    isBlockDevice: false,
    isCharDevice: false,
    isFifo: false,
    isSocket: false,
    size: 4096,
    mtime: null,
    atime: null,
    birthtime: null,
    ctime: null,
    dev,
    ino,
    mode: 0o40700,
    nlink: 2,
    uid: 0,
    gid: 0,
    rdev: 0,
    blksize: 4096,
    blocks: 8,
  };
}
