/**
 * mount and umount for the node service, through the same command runner as zfs. Bind mounts
 * only; never a lazy or forced unmount, so a busy filesystem is an error, not a surprise.
 *
 * Every path is passed with `-c` (--no-canonicalize; util-linux has it, 2.38 in Debian bookworm
 * too): mount and umount then hand the exact path the plugin checked to the kernel, rather than
 * resolving symlinks in it themselves first and acting on wherever it led by then. The kernel
 * still follows a symlink swapped into the path meanwhile; the node service checks afterwards
 * that a mount landed where it was asked for (see docs/security.md, "Threat model").
 */

import { Code, CsiError } from "../errors.ts";
import type { Logger } from "../log.ts";
import type { CommandRunner } from "../run.ts";
import {
  type MountEntry,
  MountJudge,
  parseMountList,
  type ZfsFsType,
  zfsTypeAt,
} from "./mountinfo.ts";

/** Bind-mount `source` onto `target`. */
export function bindArgs(source: string, target: string): string[] {
  return ["-c", "--bind", source, target];
}

/**
 * Mounts a filesystem on a zvol's device: `-c -t <fsType> [-o flags] <device> <target>`, the
 * paths taken as given (`-c`).
 * @throws {TypeError} for a device that is not `/dev/zdN`
 */
export function mountDeviceArgs(
  fsType: "ext4" | "xfs",
  device: string,
  target: string,
  flags: readonly string[],
): string[] {
  if (!/^\/dev\/zd\d+$/.test(device)) throw new TypeError(`"${device}" is not a zvol device`);
  return ["-c", "-t", fsType, ...(flags.length > 0 ? ["-o", flags.join(",")] : []), device, target];
}

/** Re-applies per-mount flags (ro, nosuid, ...) to an existing bind mount. */
export function remountArgs(target: string, flags: readonly string[]): string[] {
  return ["-c", "-o", ["remount", "bind", ...flags].join(","), target];
}

/** Unmount one mount at `target`: no -l, no -f. */
export function umountArgs(target: string): string[] {
  return ["-c", target];
}

/** Where mount, umount and the mount table are. */
export interface MounterOptions {
  readonly mountPath: string;
  readonly umountPath: string;
  readonly timeoutMs: number;
  readonly log: Logger;
}

/** Performs and inspects mounts. */
export class Mounter {
  readonly #runner: CommandRunner;
  readonly #opts: MounterOptions;
  #judge = new MountJudge();

  constructor(runner: CommandRunner, opts: MounterOptions) {
    this.#runner = runner;
    this.#opts = opts;
  }

  /** The current mount table of this process's mount namespace. */
  async table(): Promise<MountEntry[]> {
    return parseMountList(await this.#exec(this.#opts.mountPath, [], "list mounts"));
  }

  /**
   * Which entries of a mount table are ZFS mounts: of the type the running ZFS mounts as once
   * {@linkcode learnZfsType} has seen it, and before that "zfs" or a "fuse.zfs" made by root.
   */
  judge(): MountJudge {
    return this.#judge;
  }

  /**
   * Learns the type the running ZFS mounts as from `dataset`, which zfs has just reported
   * mounted at `mountpoint` (see {@linkcode zfsTypeAt}). Once learned, it stays for the life of
   * the process: the ZFS in use does not change under a running plugin.
   */
  learnZfsType(table: readonly MountEntry[], dataset: string, mountpoint: string): void {
    if (this.#judge.fsType !== undefined) return;
    const fsType: ZfsFsType | undefined = zfsTypeAt(table, dataset, mountpoint);
    if (fsType === undefined) return;
    this.#judge = new MountJudge(fsType);
    this.#opts.log.info("ZFS mounts datasets with this filesystem type", {
      fsType,
      dataset,
      mountpoint,
    });
  }

  /** Runs mount or umount; returns stdout, or throws a CsiError naming what failed. */
  async #exec(program: string, args: readonly string[], what: string): Promise<string> {
    const argv = [program, ...args];
    this.#opts.log.debug("exec", { argv });
    const res = await this.#runner.run(argv, { timeoutMs: this.#opts.timeoutMs });
    if (res.code === 0 && !res.timedOut) return res.stdout;
    const detail = res.timedOut
      ? `timed out after ${this.#opts.timeoutMs}ms${res.code === -1 ? `; ${res.stderr}` : ""}`
      : (res.stderr.trim().split("\n")[0] ?? "").slice(0, 300);
    const code = /busy/i.test(res.stderr) ? Code.FAILED_PRECONDITION : Code.INTERNAL;
    throw new CsiError(code, `Cannot ${what}: ${detail || `exit code ${res.code}`}`);
  }

  /**
   * Mounts the filesystem of `fsType` on a zvol's `device` (`/dev/zdN`) at `target`, with
   * `flags`: `mount -c -t <fsType> [-o flags] <device> <target>`.
   */
  async mountDevice(
    fsType: "ext4" | "xfs",
    device: string,
    target: string,
    flags: readonly string[] = [],
  ): Promise<void> {
    await this.#exec(
      this.#opts.mountPath,
      mountDeviceArgs(fsType, device, target, flags),
      `mount ${fsType} on "${target}"`,
    );
  }

  /** Bind-mounts `source` at `target`, then applies `flags` (for example ["ro"]). */
  async bind(source: string, target: string, flags: readonly string[] = []): Promise<void> {
    await this.#exec(this.#opts.mountPath, bindArgs(source, target), `bind-mount "${target}"`);
    await this.applyFlags(target, flags);
  }

  /**
   * Applies `flags` to the bind mount at `target`; when that fails the mount is undone, so no
   * writable mount stays where a read-only one was asked for.
   */
  async applyFlags(target: string, flags: readonly string[]): Promise<void> {
    if (flags.length === 0) return;
    try {
      await this.#exec(
        this.#opts.mountPath,
        remountArgs(target, flags),
        `apply mount flags ${JSON.stringify(flags.join(","))} to "${target}"`,
      );
    } catch (err) {
      // Never leave a writable mount where a read-only one was asked for.
      await this.unmount(target).catch((e) =>
        this.#opts.log.error("cannot undo bind mount", { target, error: e })
      );
      throw err;
    }
  }

  /**
   * Unmounts the top mount at `target`.
   * @throws {CsiError} FAILED_PRECONDITION when the filesystem is busy
   */
  async unmount(target: string): Promise<void> {
    await this.#exec(this.#opts.umountPath, umountArgs(target), `unmount "${target}"`);
  }
}
