/**
 * The bind mounts of the node service (node.ts), checked: staging and publishing bind-mount, then
 * make sure the mount landed where it was meant to and shows the volume's dataset; unstaging and
 * unpublishing unmount only the volume's own mounts. Whether something is mounted is read from
 * the mount table, or from lstat where what this process learned from the table lets lstat
 * decide (the fast paths; docs/security.md, "Threat model"). Nothing needs to survive a restart:
 * the first calls after one read the table.
 */

import { rmdir } from "node:fs/promises";
import { Code, CsiError } from "../errors.ts";
import { describeMount, type MountEntry, mountsAt } from "../mount/mountinfo.ts";
import {
  denoLstat,
  look,
  type LstatFn,
  type RootIdentity,
  sameFile,
  showsRoot,
  type Walk,
  walkToParent,
} from "../mount/identity.ts";
import { mountBetween } from "../mount/paths.ts";
import type { PropertyMap } from "../zfs/parse.ts";
import { checkOwned } from "../volume/datasets.ts";
import { RecentMap } from "./recent_map.ts";
import type { NodeDeps } from "./node.ts";

/**
 * How many directories the node service remembers as plain (see #plainDirs) at most: a few per
 * volume a node's allocations use at once. Every allocation brings new directories and Nomad
 * removes them without telling the plugin, so only the newest are kept (a 20,000 limit cleared
 * when full held about 5 MiB of live heap at its peak in the soak).
 */
const MAX_REMEMBERED_DIRS = 2_048;
/**
 * How many datasets' root identities (see #anchors) the node service keeps at most: every new
 * volume adds one and a deleted volume's is never told to go, so only the newest are kept.
 */
const MAX_ANCHORS = 1_024;

/** How many mounts stacked at one path an unmount loop removes at most. */
const MAX_STACKED_MOUNTS = 16;

/** The node's checked bind mounts, and what it learned of them for the fast paths. */
export class NodeMounts {
  readonly #d: NodeDeps;
  readonly #lstat: LstatFn;
  readonly #realPath: (path: string) => Promise<string>;
  /**
   * Per dataset, the device and root inode its bind mounts show, as last confirmed by the mount
   * table (see {@linkcode NodeMounts.readTableAndLearn}). Only the fast paths read it; every
   * doubt removes the entry and sends the call to the mount table.
   */
  readonly #anchors = new RecentMap<string, RootIdentity>(MAX_ANCHORS);
  /**
   * Directories below the base directories (staging and target paths and the directories on
   * their way) as last seen with nothing mounted on them: device and inode. A mount on one, even
   * a bind mount of a directory of the same filesystem (which lstat alone cannot tell from a
   * plain directory), shows another inode there.
   */
  readonly #plainDirs = new RecentMap<string, RootIdentity>(MAX_REMEMBERED_DIRS);

  constructor(deps: NodeDeps) {
    this.#d = deps;
    this.#lstat = deps.lstat ?? denoLstat;
    this.#realPath = deps.realPath ?? ((p) => Deno.realPath(p));
  }

  /** Forgets `path` as a plain directory (it was removed). */
  forget(path: string): void {
    this.#plainDirs.delete(path);
  }

  /**
   * NodeStage without reading the mount table, at a staging path this process staged the
   * volume at before (Nomad's staging path of a volume stays the same), for a dataset whose root
   * identity it has confirmed. What the table answered, and how instead:
   * - nothing mounted at the staging path or on the way: each is the same device and inode as
   *   when the table last showed nothing mounted there (a mount, even a bind mount of a directory
   *   of the same filesystem, shows another inode);
   * - the dataset is ours, a filesystem, mounted at an absolute mountpoint: the one `zfs get`;
   * - the dataset is the top mount at its mountpoint, visible here (what the bind takes): after
   *   the bind the staging path shows the dataset's root identity, on another device than its
   *   parent, with the way unchanged. Anything stacked on the mountpoint has a device of its own;
   *   then the bind is undone and `ensureMounted` reads the table to name what is there.
   * Anything else returns false before anything changed: the table path decides.
   * @returns whether the volume is staged
   */
  async stageFast(
    id: string,
    dataset: string,
    staging: string,
    prepare: (props: PropertyMap) => Promise<void>,
  ): Promise<boolean> {
    const anchor = this.#anchors.get(dataset);
    const own = this.#plainDirs.get(staging);
    if (!anchor || !own) return false;
    const [walk, here] = await Promise.all([
      walkToParent(staging, this.#d.config.stagePublishDirs, this.#lstat),
      look(this.#lstat, staging),
    ]);
    if (walk.crosses !== false || !this.sameAsSeen(walk) || !sameFile(here, own)) return false;
    const props = await this.#d.datasets.inspect(dataset);
    // Missing (to be created) or not mounted: the table path, which handles both.
    if (!props) return false;
    checkOwned(dataset, props);
    const mountpoint = props.get("mountpoint")?.value ?? "";
    if (props.get("mounted")?.value !== "yes" || !mountpoint.startsWith("/")) return false;
    await prepare(props);
    await this.#d.mounter.bind(mountpoint, staging);
    if (await this.landed(staging, anchor)) return true;
    this.#anchors.delete(dataset);
    try {
      await this.verifyBind("staging_target_path", staging, { id, dataset });
    } catch (err) {
      // The bind was undone. What lies on the mountpoint (or that the dataset is not visible
      // here) is named by the check the table path makes first; else this error stands.
      await this.#d.datasets.ensureMounted(id, dataset);
      throw err;
    }
    return true;
  }

  /**
   * Whether a bind to `path` landed there and shows `root`: every directory on the way is still
   * the one remembered before the bind (a symlink swapped in meanwhile is no directory, and lstat
   * would follow it), and `path` shows the root's device and inode, on another device than its
   * parent.
   */
  async landed(path: string, root: RootIdentity): Promise<boolean> {
    const [walk, here] = await Promise.all([
      walkToParent(path, this.#d.config.stagePublishDirs, this.#lstat),
      look(this.#lstat, path),
    ]);
    return walk.crosses === false && this.sameAsSeen(walk) &&
      showsRoot(here, walk.parent, root);
  }

  /**
   * NodePublish from a staging path without reading the mount table, for a dataset whose root
   * identity this process has confirmed before. What the table answered, and how instead:
   * - the volume is staged: the staging path shows the dataset's device and root inode, on
   *   another device than its parent, so its top mount is the dataset (anything stacked on it,
   *   such as a user's FUSE mount, has a device of its own);
   * - nothing mounted between the base directory and the target: every directory on the way
   *   is the same device and inode as when the table last showed nothing mounted on it. A
   *   directory never seen (Nomad's new per-allocation directory) sends the call to the table:
   *   lstat cannot tell it from a bind mount of a directory of the same filesystem;
   * - nothing mounted at the target: it does not exist (a mount point always does), or it is
   *   the plain directory this process saw there before;
   * - the bind landed at the target and shows the volume: the target shows the dataset's
   *   device and root inode afterwards. Flags are applied by `mount -o remount`, which fails
   *   (and undoes the bind) when it cannot apply them.
   * A target that already holds a mount (a repeated or interrupted publish) returns false
   * before anything changed: the table path judges it, read-only setting included.
   * @returns whether the volume is published
   */
  async publishFast(
    id: string,
    dataset: string,
    staging: string,
    target: string,
    flags: readonly string[],
  ): Promise<boolean> {
    const anchor = this.#anchors.get(dataset);
    if (!anchor) return false;
    const dirs = this.#d.config.stagePublishDirs;
    const [stagingWalk, staged, targetWalk, here] = await Promise.all([
      walkToParent(staging, dirs, this.#lstat),
      look(this.#lstat, staging),
      walkToParent(target, dirs, this.#lstat),
      look(this.#lstat, target),
    ]);
    if (!showsRoot(staged, stagingWalk.parent, anchor)) return false;
    if (targetWalk.crosses !== false || !this.sameAsSeen(targetWalk)) return false;
    if (here !== "missing" && !sameFile(here, this.#plainDirs.get(target))) return false;
    await this.ensureDirectory(target, 0o750);
    await this.remember(target);
    await this.#d.mounter.bind(staging, target, flags);
    if (await this.landed(target, anchor)) return true;
    this.#anchors.delete(dataset);
    await this.verifyBind("target_path", target, { id, dataset });
    return true;
  }

  /**
   * Unpublish or unstage without reading the mount table, at a path this process staged or
   * published the volume at (so it knows the directory there and on the way), for a dataset
   * whose root identity it has confirmed. What the table answered, and how instead:
   * - nothing mounted between the base directory and the path: every directory on the way is
   *   the same device and inode as when the table last showed nothing mounted on it (so the
   *   directory removed afterwards is on the base directory's filesystem);
   * - the top mount at the path is the volume's: it shows the dataset's device and root inode,
   *   on another device than its parent; then it is unmounted (no -l, no -f);
   * - nothing is left at the path: it shows the plain directory seen before the bind again, or
   *   it does not exist (a mount point always does).
   * Anything else (a foreign or unreadable mount, a second mount of the volume stacked below,
   * a directory not seen before) returns false: the mount table decides, as it did before.
   * @returns whether nothing of the volume is mounted at `path` any more
   */
  async unmountFast(path: string, dataset: string): Promise<boolean> {
    const anchor = this.#anchors.get(dataset);
    const own = this.#plainDirs.get(path);
    if (!anchor || !own) return false;
    const [walk, here] = await Promise.all([
      walkToParent(path, this.#d.config.stagePublishDirs, this.#lstat),
      look(this.#lstat, path),
    ]);
    if (walk.crosses !== false || !this.sameAsSeen(walk)) return false;
    if (here === "missing" || sameFile(here, own)) return true;
    if (!showsRoot(here, walk.parent, anchor)) return false;
    await this.#d.mounter.unmount(path);
    const after = await look(this.#lstat, path);
    return after === "missing" || sameFile(after, own);
  }

  /**
   * Whether every directory of `walk` was seen with nothing mounted on it, and is still the
   * same device and inode.
   */
  sameAsSeen(walk: Walk): boolean {
    return walk.dirs.every(([dir, now]) => sameFile(now, this.#plainDirs.get(dir)));
  }

  /**
   * Remembers `path` and the directories on its way as plain directories, right after the
   * mount table (or, on the publish fast path, lstat) showed nothing mounted on them.
   */
  async remember(path: string): Promise<void> {
    const [walk, here] = await Promise.all([
      walkToParent(path, this.#d.config.stagePublishDirs, this.#lstat),
      look(this.#lstat, path),
    ]);
    // A cache, not a record: forgetting sends a call to the mount table, nothing worse.
    for (const [dir, seen] of walk.dirs) this.#plainDirs.set(dir, { dev: seen.dev, ino: seen.ino });
    if (typeof here !== "string") this.#plainDirs.set(path, { dev: here.dev, ino: here.ino });
  }

  /**
   * Refuses a path below another mount inside the base directory (a tmpfs, a bind mount of a
   * directory elsewhere, a volume's own mount): directories made or removed there would be on
   * that filesystem, possibly outside the base directory.
   * @throws {CsiError} INVALID_ARGUMENT naming the mount
   */
  refuseMountBetween(field: string, path: string, table: readonly MountEntry[]): void {
    const between = mountBetween(
      path,
      this.#d.config.stagePublishDirs,
      table.map((e) => e.mountPoint),
    );
    if (between !== undefined) {
      throw new CsiError(
        Code.INVALID_ARGUMENT,
        `${field} "${path}" lies below another mount ("${between}"); it must be a directory ` +
          `of the base directory's own filesystem`,
      );
    }
  }

  /** The mount a process sees at `path`, if any. */
  async topMount(path: string): Promise<MountEntry | undefined> {
    return mountsAt(await this.#d.mounter.table(), path).at(-1);
  }

  /** Unmounts every mount of `dataset` stacked at `path`; refuses to touch anything else. */
  async unmountAll(
    path: string,
    id: string,
    dataset: string,
    table?: readonly MountEntry[],
  ): Promise<void> {
    // The first round may use a table the caller just read.
    let known = table;
    for (let i = 0; i < MAX_STACKED_MOUNTS; i++) {
      const stack = mountsAt(known ?? await this.#d.mounter.table(), path);
      known = undefined;
      const top = stack.at(-1);
      if (!top) return;
      if (!this.#d.mounter.judge().isMountOf(top, dataset)) {
        throw new CsiError(
          Code.FAILED_PRECONDITION,
          `"${path}" holds a mount of "${top.source}", not of volume "${id}"; leaving it alone`,
        );
      }
      await this.#d.mounter.unmount(path);
      // It was the only mount there: nothing is left to look for, so no second table read.
      // With more, the table is read again: with shared propagation one umount can remove two.
      if (stack.length === 1) return;
    }
    throw new CsiError(
      Code.INTERNAL,
      `"${path}" still holds mounts after ${MAX_STACKED_MOUNTS} unmounts`,
    );
  }

  /**
   * Bind-mounts `source` at `target` (applying `flags`), then reads the mount table to make sure
   * the mount landed at `target` and shows the volume's dataset. The kernel follows a symlink
   * that was swapped into the path after it was checked, and a bind takes whatever lies on top
   * of `source` by then; either way the new mount is unmounted again and the call fails.
   * @throws {CsiError} INVALID_ARGUMENT when the mount landed elsewhere, FAILED_PRECONDITION
   *   when it shows another filesystem
   */
  async bindChecked(
    field: string,
    source: string,
    target: string,
    flags: readonly string[],
    volume: { id: string; dataset: string; before: readonly MountEntry[] },
  ): Promise<void> {
    await this.#d.mounter.bind(source, target, flags);
    // The dataset's root identity, once confirmed, tells that the bind landed and shows the
    // volume without the table (see publishFast); any doubt and the table decides.
    const anchor = this.#anchors.get(volume.dataset);
    if (anchor && await this.landed(target, anchor)) return;
    await this.verifyBind(field, target, volume);
  }

  /**
   * Reads the mount table after a bind to `target` and makes sure it landed there and shows the
   * volume's dataset; otherwise undoes it and fails, as {@linkcode NodeMounts.bindChecked}
   * says. Without the table from before the bind (a fast path's bind), a mount that landed
   * elsewhere is looked for where `target` leads now.
   */
  async verifyBind(
    field: string,
    target: string,
    volume: { id: string; dataset: string; before?: readonly MountEntry[] },
  ): Promise<void> {
    const { id, dataset, before } = volume;
    const after = await this.readTableAndLearn(target, dataset);
    const judge = this.#d.mounter.judge();
    const here = mountsAt(after, target);
    const top = here.at(-1);
    if (top && judge.isMountOf(top, dataset)) return;
    if (top) {
      // Nothing was mounted at the target before (the callers check), so a single mount there
      // is the one just made: it took another filesystem than the volume's.
      if (here.length === 1) await this.undoMount(target, "it shows another filesystem");
      throw new CsiError(
        Code.FAILED_PRECONDITION,
        `The bind mount of volume "${id}" at ${field} "${target}" shows ${describeMount(top)}, ` +
          `not dataset "${dataset}"${here.length === 1 ? "; it was unmounted again" : ""}`,
      );
    }
    // Nothing at the target: the kernel put the mount wherever a swapped-in symlink led.
    const added = before ? addedMounts(before, after) : await this.mountsWhereLeads(target, after);
    const strays = added.filter((e) =>
      judge.isMountOf(e, dataset) && e.mountPoint !== target &&
      mountsAt(after, e.mountPoint).at(-1) === e
    );
    for (const stray of strays) {
      await this.undoMount(stray.mountPoint, `it was meant for ${field} "${target}"`);
    }
    const where = strays.length > 0
      ? `at ${strays.map((e) => `"${e.mountPoint}"`).join(", ")} and was unmounted again`
      : "elsewhere";
    throw new CsiError(
      Code.INVALID_ARGUMENT,
      `${field} "${target}" changed while volume "${id}" was being mounted there: the mount ` +
        `landed ${where} (is a directory on the way a symbolic link now?)`,
    );
  }

  /**
   * The top mount where `path` leads now, when a symlink was swapped into it: where a bind to
   * `path` landed. None when it leads to itself or cannot be resolved.
   */
  async mountsWhereLeads(path: string, table: readonly MountEntry[]): Promise<MountEntry[]> {
    const real = await this.#realPath(path).catch(() => undefined);
    if (real === undefined || real === path) return [];
    const top = mountsAt(table, real).at(-1);
    return top ? [top] : [];
  }

  /**
   * Reads the mount table; when its top mount at `path` is `dataset`'s and lstat shows the same
   * device and inode at `path` before and after the read, on another device than its parent,
   * remembers them as the dataset's root identity for the fast paths. The table says which
   * filesystem is on top there; lstat on both sides of the read ties that to the device number
   * (a mount changed in between shows another device or inode, and nothing is learned). The
   * directories on the way must be the ones remembered before the bind: lstat follows a symlink
   * swapped in among them, the table does not.
   */
  async readTableAndLearn(path: string, dataset: string): Promise<MountEntry[]> {
    const before = await look(this.#lstat, path);
    const table = await this.#d.mounter.table();
    const [after, walk] = await Promise.all([
      look(this.#lstat, path),
      walkToParent(path, this.#d.config.stagePublishDirs, this.#lstat),
    ]);
    const top = mountsAt(table, path).at(-1);
    if (
      top && this.#d.mounter.judge().isMountOf(top, dataset) && typeof before !== "string" &&
      typeof after !== "string" && before.dev === after.dev && before.ino === after.ino &&
      walk.crosses === false && this.sameAsSeen(walk) && showsRoot(after, walk.parent, after)
    ) {
      this.#anchors.set(dataset, { dev: after.dev, ino: after.ino });
    } else {
      this.#anchors.delete(dataset);
    }
    return table;
  }

  /** Unmounts a mount the plugin just made by mistake; a failure is logged, not thrown. */
  async undoMount(path: string, reason: string): Promise<void> {
    this.#d.log.error("undoing a mount made in error", { path, reason });
    await this.#d.mounter.unmount(path).catch((err) =>
      this.#d.log.error("cannot undo a mount", { path, error: err })
    );
  }

  /**
   * Removes the target directory once nothing is mounted there, only if it is an empty
   * directory: a regular file, a symlink or a directory with content is never deleted, only
   * logged (Nomad removes a leftover target directory itself).
   */
  async removeTarget(target: string): Promise<void> {
    let info: Deno.FileInfo;
    try {
      info = await Deno.lstat(target);
    } catch (err) {
      if (!(err instanceof Deno.errors.NotFound)) {
        this.#d.log.warn("target path left in place", { targetPath: target, error: err });
      }
      return;
    }
    if (!info.isDirectory) {
      this.#d.log.warn("target path is not a directory; left in place", {
        targetPath: target,
        kind: info.isFile ? "regular file" : info.isSymlink ? "symbolic link" : "special file",
      });
      return;
    }
    try {
      // rmdir(2) removes an empty directory and nothing else, even if the path was swapped for a
      // file since the lstat.
      await rmdir(target);
    } catch (err) {
      if ((err as { code?: unknown }).code === "ENOENT") return;
      this.#d.log.warn("target path left in place", { targetPath: target, error: err });
    }
  }

  /** Creates `path` as a directory if missing; refuses anything that is not a directory. */
  async ensureDirectory(path: string, mode: number): Promise<void> {
    try {
      await Deno.mkdir(path, { recursive: true, mode });
    } catch (err) {
      if (!(err instanceof Deno.errors.AlreadyExists)) throw err;
    }
    const info = await Deno.lstat(path);
    if (!info.isDirectory) {
      throw new CsiError(Code.INVALID_ARGUMENT, `"${path}" exists and is not a directory`);
    }
  }
}

/** The entries of `after` that `before` did not have (each entry counted as often as listed). */
function addedMounts(before: readonly MountEntry[], after: readonly MountEntry[]): MountEntry[] {
  const key = (e: MountEntry) => `${e.mountPoint}\0${e.source}\0${e.fsType}`;
  const seen = new Map<string, number>();
  for (const e of before) seen.set(key(e), (seen.get(key(e)) ?? 0) + 1);
  return after.filter((e) => {
    const n = seen.get(key(e)) ?? 0;
    if (n === 0) return true;
    seen.set(key(e), n - 1);
    return false;
  });
}
