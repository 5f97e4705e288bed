/**
 * The zfs and mount wrappers a resolved Config describes, built one way for every entry point
 * (the CSI server, the operator CLI, the host volume plugin): same programs, same timeout, same
 * anchor.
 */

import type { Config } from "./config.ts";
import type { Logger } from "./log.ts";
import { Mounter } from "./mount/mounter.ts";
import type { CommandRunner } from "./run.ts";
import { Zfs } from "./zfs/zfs.ts";

/** The part of a Config that {@linkcode zfsFor} reads. */
export type ZfsConfig = Pick<
  Config,
  "zfsPath" | "zpoolPath" | "commandTimeoutMs" | "parentDataset"
>;

/** The part of a Config that {@linkcode mounterFor} reads. */
export type MountConfig = Pick<Config, "mountPath" | "umountPath" | "commandTimeoutMs">;

/** zfs and zpool as `config` names them, run through `runner`. */
export function zfsFor(config: ZfsConfig, runner: CommandRunner, log: Logger): Zfs {
  return new Zfs(runner, {
    zfsPath: config.zfsPath,
    zpoolPath: config.zpoolPath,
    timeoutMs: config.commandTimeoutMs,
    log,
    // "Does not exist" below the parent counts only while the parent is visible.
    anchor: config.parentDataset,
  });
}

/** mount and umount as `config` names them, run through `runner`. */
export function mounterFor(config: MountConfig, runner: CommandRunner, log: Logger): Mounter {
  return new Mounter(runner, {
    mountPath: config.mountPath,
    umountPath: config.umountPath,
    timeoutMs: config.commandTimeoutMs,
    log,
  });
}
