/**
 * The CSI Node service. Staging bind-mounts a volume's dataset at the staging path; publishing
 * bind-mounts the staging path at the target. Whether something is staged or published is read
 * from the mount table, or from lstat where what this process learned from the table lets lstat
 * decide (the fast paths below; docs/security.md, "Threat model"). Nothing needs to survive a restart: the
 * first calls after one read the table.
 */

import { rmdir, statfs } from "node:fs/promises";
import type { Config } from "../config.ts";
import { Code, CsiError } from "../errors.ts";
import { KeyedLock, withLock } from "../lock.ts";
import type { Logger } from "../log.ts";
import type { Mounter } from "../mount/mounter.ts";
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
import { checkPathInside, mountBetween } from "../mount/paths.ts";
import { resolveVolume } from "../zfs/ids.ts";
import {
  MANAGED_PROPERTY,
  MANAGED_VALUE,
  STAGED_PROPERTY,
  volumeForDataset,
} from "../zfs/names.ts";
import { FOLLOW_GENERATION_PROPERTY } from "../follow/copy.ts";
import { type FollowVolume, FollowVolumes } from "../follow/mover.ts";
import { DEFAULT_FOLLOW_INTERVAL_SECONDS, splitFollow } from "../follow/volume.ts";
import type { Zfs } from "../zfs/zfs.ts";
import { parseVolumeContext, type VolumeContext } from "./context.ts";
import { BACKUP_INTERVAL_PROPERTY, BACKUP_KEEP_PROPERTY } from "../replicate/backup.ts";
import { formatKeepPolicy } from "../store/policy.ts";
import { checkOwned, type Datasets } from "./datasets.ts";
import { type HealthChecker, storageProblem } from "./health.ts";
import { RecentMap } from "./recent_map.ts";
import { planSize, SIZE_STATE } from "./sizing.ts";
import { stagedAt } from "./tenancy.ts";
import type {
  NodeExpandVolumeRequest,
  NodeGetVolumeStatsRequest,
  NodePublishVolumeRequest,
  NodeStageVolumeRequest,
  NodeUnpublishVolumeRequest,
  NodeUnstageVolumeRequest,
} from "./types.ts";
import { checkCapability, checkCapacity, required } from "./validate.ts";

/** Node capabilities; fixed for the life of the process, as Nomad expects. */
export const NODE_CAPABILITIES = [
  "STAGE_UNSTAGE_VOLUME",
  "GET_VOLUME_STATS",
  "EXPAND_VOLUME",
  "VOLUME_CONDITION",
] as const;

/** Filesystem statistics, as statfs reports them. */
export interface FsStats {
  readonly bsize: number;
  readonly blocks: number;
  readonly bfree: number;
  readonly bavail: number;
  readonly files: number;
  readonly ffree: number;
}

/** What the node service works with. */
export interface NodeDeps {
  readonly config: Config;
  readonly zfs: Zfs;
  readonly mounter: Mounter;
  readonly datasets: Datasets;
  readonly health: HealthChecker;
  readonly locks: KeyedLock;
  readonly log: Logger;
  /** statfs(2); replaceable in tests. */
  readonly statfs?: (path: string) => Promise<FsStats>;
  /** lstat(2), for the checks that need no mount table (src/mount/identity.ts); for tests. */
  readonly lstat?: LstatFn;
  /** realpath(3), to find where a bind landed when a symlink was swapped in; for tests. */
  readonly realPath?: (path: string) => Promise<string>;
  /** Volumes that follow their job (src/follow/), with `--store`. */
  readonly follow?: FollowVolumes;
}

/** Mount flags that the mount table lists whenever they are in effect. */
const SHOWN_FLAGS = new Set(["ro", "nosuid", "nodev", "noexec", "noatime", "nodiratime"]);

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

/** The CSI Node service handlers. */
export class NodeService {
  readonly #d: NodeDeps;
  readonly #statfs: (path: string) => Promise<FsStats>;
  readonly #lstat: LstatFn;
  readonly #realPath: (path: string) => Promise<string>;
  /**
   * Per dataset, the device and root inode its bind mounts show, as last confirmed by the mount
   * table (see {@linkcode NodeService.#readTableAndLearn}). Only the fast paths read it; every
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
    this.#statfs = deps.statfs ?? ((p) => statfs(p));
    this.#lstat = deps.lstat ?? denoLstat;
    this.#realPath = deps.realPath ?? ((p) => Deno.realPath(p));
  }

  #dataset(volumeId: unknown): { id: string; dataset: string; follow?: true } {
    const id = required("volume_id", volumeId);
    return resolveVolume(id, {
      parentDataset: this.#d.config.parentDataset,
      nodeId: this.#d.config.nodeId,
    }, { follow: true });
  }

  /** The checked context of a volume whose dataset is `dataset` (`follow` is taken out). */
  #context(ctx: Record<string, string> | null | undefined, dataset: string): VolumeContext {
    const parsed = parseVolumeContext(splitFollow(ctx).rest);
    if (parsed.dataset !== undefined && parsed.dataset !== dataset) {
      throw new CsiError(
        Code.INVALID_ARGUMENT,
        `volume_context names dataset "${parsed.dataset}", but the volume id maps to "${dataset}"`,
      );
    }
    return parsed;
  }

  #path(field: string, path: string): Promise<string> {
    return checkPathInside(field, path, this.#d.config.stagePublishDirs);
  }

  NodeGetInfo(): Promise<unknown> {
    return Promise.resolve({
      node_id: this.#d.config.nodeId,
      max_volumes_per_node: 0,
      accessible_topology: { segments: this.#d.config.topology },
    });
  }

  NodeGetCapabilities(): Promise<unknown> {
    return Promise.resolve({
      capabilities: NODE_CAPABILITIES.map((type) => ({ rpc: { type } })),
    });
  }

  async NodeStageVolume(req: NodeStageVolumeRequest): Promise<unknown> {
    const { id, dataset, follow } = this.#dataset(req.volume_id);
    const stagingArg = required("staging_target_path", req.staging_target_path);
    checkCapability(req.volume_capability);
    const ctx = this.#context(req.volume_context, dataset);
    const mount = () => this.#stage(id, dataset, stagingArg, ctx);
    if (follow || splitFollow(req.volume_context).follow) {
      // Acquire in the store and bring this node's copy to its head first: outside the
      // volume's lock, since a receive may take long (a repeated stage joins it); then mount,
      // the two as one claim that an overlapping NodeUnstage's release respects.
      return await this.#stageFollow(id, dataset, ctx, follow === true, mount);
    }
    return await mount();
  }

  /** NodeStage's mounts, under the volume's lock. */
  #stage(id: string, dataset: string, stagingArg: string, ctx: VolumeContext): Promise<unknown> {
    return withLock(this.#d.locks, [dataset], async () => {
      // Paths are checked under the lock, right before the mounts they guard.
      const staging = await this.#path("staging_target_path", stagingArg);
      if (await this.#stageFast(id, dataset, staging, ctx)) return {};
      // Also checks that the dataset itself is the top mount at its mountpoint: the bind below
      // takes whatever is on top there.
      const ds = await this.#d.datasets.ensureMounted(id, dataset, ctx.sizeBytes);
      this.#refuseMountBetween("staging_target_path", staging, ds.table);
      const top = mountsAt(ds.table, staging).at(-1);
      if (top) {
        if (this.#d.mounter.judge().isMountOf(top, dataset)) return {};
        throw new CsiError(
          Code.ALREADY_EXISTS,
          `staging_target_path "${staging}" already holds another mount ("${top.source}")`,
        );
      }
      await this.#applyBackupContext(id, dataset, ctx);
      // The first stage marks the volume as used: a CreateVolume of its name is then no retry
      // (tenancy.ts). Set before the bind, so that a failed set fails the stage, to be retried.
      if (stagedAt(ds.props) === undefined) {
        await this.#d.zfs.set(dataset, STAGED_PROPERTY, String(Math.floor(Date.now() / 1000)));
      }
      await this.#ensureDirectory(staging, 0o700);
      // The table has just shown nothing mounted there, nor on the way.
      await this.#remember(staging);
      await this.#bindChecked("staging_target_path", ds.mountpoint, staging, [], {
        id,
        dataset,
        before: ds.table,
      });
      return {};
    });
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
  async #stageFast(
    id: string,
    dataset: string,
    staging: string,
    ctx: VolumeContext,
  ): Promise<boolean> {
    const anchor = this.#anchors.get(dataset);
    const own = this.#plainDirs.get(staging);
    if (!anchor || !own) return false;
    const [walk, here] = await Promise.all([
      walkToParent(staging, this.#d.config.stagePublishDirs, this.#lstat),
      look(this.#lstat, staging),
    ]);
    if (walk.crosses !== false || !this.#sameAsSeen(walk) || !sameFile(here, own)) return false;
    const props = await this.#d.datasets.inspect(dataset);
    // Missing (to be created) or not mounted: the table path, which handles both.
    if (!props) return false;
    checkOwned(dataset, props);
    const mountpoint = props.get("mountpoint")?.value ?? "";
    if (props.get("mounted")?.value !== "yes" || !mountpoint.startsWith("/")) return false;
    await this.#applyBackupContext(id, dataset, ctx);
    if (stagedAt(props) === undefined) {
      await this.#d.zfs.set(dataset, STAGED_PROPERTY, String(Math.floor(Date.now() / 1000)));
    }
    await this.#d.mounter.bind(mountpoint, staging);
    if (await this.#landed(staging, anchor)) return true;
    this.#anchors.delete(dataset);
    try {
      await this.#verifyBind("staging_target_path", staging, { id, dataset });
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
  async #landed(path: string, root: RootIdentity): Promise<boolean> {
    const [walk, here] = await Promise.all([
      walkToParent(path, this.#d.config.stagePublishDirs, this.#lstat),
      look(this.#lstat, path),
    ]);
    return walk.crosses === false && this.#sameAsSeen(walk) &&
      showsRoot(here, walk.parent, root);
  }

  /**
   * A registered volume's backup settings, from its context, onto its dataset (where the
   * scheduler reads them); set only where they differ, so a repeated stage sets nothing.
   * @throws {CsiError} FAILED_PRECONDITION when the context asks for backups and the plugin has
   *   no store: a volume must not look backed up when it is not
   */
  async #applyBackupContext(id: string, dataset: string, ctx: VolumeContext): Promise<void> {
    const wanted: [string, string][] = [];
    if (ctx.backupIntervalSeconds !== undefined) {
      wanted.push([BACKUP_INTERVAL_PROPERTY, String(ctx.backupIntervalSeconds)]);
    }
    if (ctx.backupKeep) wanted.push([BACKUP_KEEP_PROPERTY, formatKeepPolicy(ctx.backupKeep)]);
    if (wanted.length === 0) return;
    if (!this.#d.config.store && (ctx.backupIntervalSeconds ?? 0) > 0) {
      throw new CsiError(
        Code.FAILED_PRECONDITION,
        `Volume "${id}" asks for backups (volume_context backup_interval), and this plugin has ` +
          `no store: start it with --store, or remove backup_interval from the volume`,
      );
    }
    const props = await this.#d.zfs.getProperties(dataset, wanted.map(([name]) => name));
    const changes = wanted.filter(([name, value]) => {
      const got = props?.get(name);
      return got?.value !== value || got.source !== "local";
    });
    if (changes.length > 0) await this.#d.zfs.setProperties(dataset, changes);
  }

  async NodeUnstageVolume(req: NodeUnstageVolumeRequest): Promise<unknown> {
    const { id, dataset } = this.#dataset(req.volume_id);
    const stagingArg = required("staging_target_path", req.staging_target_path);
    const release = await withLock(this.#d.locks, [dataset], async () => {
      const staging = await this.#path("staging_target_path", stagingArg);
      if (!(await this.#unmountFast(staging, dataset))) {
        await this.#unmountAll(staging, id, dataset);
      }
      return await this.#followToRelease(dataset);
    });
    // Outside the lock: the final snapshot's upload takes the lock only for its zfs steps. A
    // NodeStage of the volume may come meanwhile (Nomad before 1.11): in the volume's turn, the
    // release looks again, under the lock, whether a bind uses the copy (see FollowVolumes.stage).
    if (release) {
      await this.#d.follow!.release(release, {
        inUse: () =>
          withLock(
            this.#d.locks,
            [dataset],
            async () => (await this.#followUsers(dataset)).length > 0,
          ),
      });
    }
    return {};
  }

  /**
   * NodeStage of a volume that follows its job: acquire it and bring the copy here up to the
   * store's head (src/follow/mover.ts), then `mount` it. A registered volume (context
   * `follow = "true"`) gets its owner object at its first stage, with the size and backups its
   * context gives.
   * @throws {CsiError} FAILED_PRECONDITION without a store, or when another node holds it
   */
  async #stageFollow(
    id: string,
    dataset: string,
    ctx: VolumeContext,
    created: boolean,
    mount: () => Promise<unknown>,
  ): Promise<unknown> {
    const follow = this.#d.follow;
    if (!follow) {
      throw new CsiError(
        Code.FAILED_PRECONDITION,
        `Volume "${id}" follows its job through a store, and this plugin has none: start it ` +
          `with --store (the same store on every node)`,
      );
    }
    const name = volumeForDataset(this.#d.config.parentDataset, dataset) ?? id;
    const size = ctx.sizeBytes ?? 0;
    const interval = ctx.backupIntervalSeconds || DEFAULT_FOLLOW_INTERVAL_SECONDS;
    return await follow.stage({
      name,
      dataset,
      ...(created ? {} : {
        registered: {
          capacityBytes: size,
          properties: {
            [MANAGED_PROPERTY]: MANAGED_VALUE,
            [BACKUP_INTERVAL_PROPERTY]: String(interval),
            ...(size > 0 ? { refquota: String(size) } : {}),
            ...(ctx.backupKeep ? { [BACKUP_KEEP_PROPERTY]: formatKeepPolicy(ctx.backupKeep) } : {}),
          },
        },
      }),
    }, mount);
  }

  /**
   * The follow volume to release after an unstage: one whose copy here is a follow copy
   * (it carries a generation) and that no other bind on this node still uses.
   */
  async #followToRelease(dataset: string): Promise<FollowVolume | undefined> {
    if (!this.#d.follow) return undefined;
    const props = await this.#d.zfs.getProperties(dataset, [
      "mountpoint",
      FOLLOW_GENERATION_PROPERTY,
    ]);
    if (props?.get(FOLLOW_GENERATION_PROPERTY)?.source !== "local") return undefined;
    const users = await this.#followUsers(dataset, props.get("mountpoint")?.value);
    if (users.length > 0) {
      this.#d.log.info("follow volume still in use on this node: not released", {
        dataset,
        mounts: users,
      });
      return undefined;
    }
    const name = volumeForDataset(this.#d.config.parentDataset, dataset);
    return name === undefined ? undefined : { name, dataset };
  }

  /**
   * Where `dataset` is bound on this node: its mounts other than at its own `mountpoint` (read
   * when not given).
   */
  async #followUsers(dataset: string, mountpoint?: string): Promise<string[]> {
    mountpoint ??= (await this.#d.zfs.getProperties(dataset, ["mountpoint"]))?.get("mountpoint")
      ?.value;
    const judge = this.#d.mounter.judge();
    return (await this.#d.mounter.table()).filter((e) =>
      judge.isMountOf(e, dataset) && e.mountPoint !== mountpoint
    ).map((e) => e.mountPoint);
  }

  async NodePublishVolume(req: NodePublishVolumeRequest): Promise<unknown> {
    const { id, dataset } = this.#dataset(req.volume_id);
    const targetArg = required("target_path", req.target_path);
    const stagingArg = req.staging_target_path || undefined;
    const cap = checkCapability(req.volume_capability);
    const ctx = this.#context(req.volume_context, dataset);
    const readOnly = req.readonly === true || cap.readOnlyMode || cap.flags.includes("ro");
    const flags = [...(readOnly ? ["ro"] : []), ...cap.flags.filter((f) => f !== "ro")];
    return await withLock(this.#d.locks, [dataset], async () => {
      // Paths are checked under the lock, right before the mounts they guard.
      const target = await this.#path("target_path", targetArg);
      const staging = stagingArg === undefined
        ? undefined
        : await this.#path("staging_target_path", stagingArg);
      if (staging !== undefined && staging === target) {
        throw new CsiError(
          Code.INVALID_ARGUMENT,
          "target_path must differ from staging_target_path",
        );
      }
      if (staging !== undefined && await this.#publishFast(id, dataset, staging, target, flags)) {
        return {};
      }
      let source: string;
      let table: readonly MountEntry[];
      if (staging !== undefined) {
        table = await this.#d.mounter.table();
        const staged = mountsAt(table, staging).at(-1);
        if (!staged || !this.#d.mounter.judge().isMountOf(staged, dataset)) {
          throw new CsiError(
            Code.FAILED_PRECONDITION,
            `Volume "${id}" is not staged at "${staging}"; call NodeStageVolume first`,
          );
        }
        source = staging;
      } else {
        ({ mountpoint: source, table } = await this.#d.datasets.ensureMounted(
          id,
          dataset,
          ctx.sizeBytes,
        ));
      }
      this.#refuseMountBetween("target_path", target, table);
      // Asked after ensureMounted, which may just have learned the type ZFS mounts as.
      const judge = this.#d.mounter.judge();
      const top = mountsAt(table, target).at(-1);
      if (top) {
        if (judge.isMountOf(top, dataset) && (readOnly || !top.options.includes("ro"))) {
          // A publish interrupted (by a crash) between its bind and its remount left the bind
          // without its flags, read-only among them; finish it. Nomad's target path names the
          // ro/rw usage, so a read-write mount here was never meant to stay read-write.
          const missing = flags.filter((f) => SHOWN_FLAGS.has(f) && !top.options.includes(f));
          if (missing.length > 0) {
            this.#d.log.warn("finishing an interrupted publish: applying its mount flags", {
              targetPath: target,
              missing,
            });
            await this.#d.mounter.applyFlags(target, flags);
          }
          return {};
        }
        throw new CsiError(
          Code.ALREADY_EXISTS,
          `target_path "${target}" already holds ${
            judge.isMountOf(top, dataset)
              ? "this volume with a different read-only setting"
              : `another mount ("${top.source}")`
          }`,
        );
      }
      await this.#ensureDirectory(target, 0o750);
      await this.#remember(target);
      await this.#bindChecked("target_path", source, target, flags, { id, dataset, before: table });
      return {};
    });
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
  async #publishFast(
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
    if (targetWalk.crosses !== false || !this.#sameAsSeen(targetWalk)) return false;
    if (here !== "missing" && !sameFile(here, this.#plainDirs.get(target))) return false;
    await this.#ensureDirectory(target, 0o750);
    await this.#remember(target);
    await this.#d.mounter.bind(staging, target, flags);
    if (await this.#landed(target, anchor)) return true;
    this.#anchors.delete(dataset);
    await this.#verifyBind("target_path", target, { id, dataset });
    return true;
  }

  async NodeUnpublishVolume(req: NodeUnpublishVolumeRequest): Promise<unknown> {
    const { id, dataset } = this.#dataset(req.volume_id);
    const targetArg = required("target_path", req.target_path);
    return await withLock(this.#d.locks, [dataset], async () => {
      const target = await this.#path("target_path", targetArg);
      if (!(await this.#unmountFast(target, dataset))) {
        const table = await this.#d.mounter.table();
        // Checked before anything is unmounted or removed: the directory removed below could
        // otherwise be on someone else's filesystem.
        this.#refuseMountBetween("target_path", target, table);
        await this.#unmountAll(target, id, dataset, table);
      }
      await this.#removeTarget(target);
      this.#plainDirs.delete(target);
      return {};
    });
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
  async #unmountFast(path: string, dataset: string): Promise<boolean> {
    const anchor = this.#anchors.get(dataset);
    const own = this.#plainDirs.get(path);
    if (!anchor || !own) return false;
    const [walk, here] = await Promise.all([
      walkToParent(path, this.#d.config.stagePublishDirs, this.#lstat),
      look(this.#lstat, path),
    ]);
    if (walk.crosses !== false || !this.#sameAsSeen(walk)) return false;
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
  #sameAsSeen(walk: Walk): boolean {
    return walk.dirs.every(([dir, now]) => sameFile(now, this.#plainDirs.get(dir)));
  }

  /**
   * Remembers `path` and the directories on its way as plain directories, right after the
   * mount table (or, on the publish fast path, lstat) showed nothing mounted on them.
   */
  async #remember(path: string): Promise<void> {
    const [walk, here] = await Promise.all([
      walkToParent(path, this.#d.config.stagePublishDirs, this.#lstat),
      look(this.#lstat, path),
    ]);
    // A cache, not a record: forgetting sends a call to the mount table, nothing worse.
    for (const [dir, seen] of walk.dirs) this.#plainDirs.set(dir, { dev: seen.dev, ino: seen.ino });
    if (typeof here !== "string") this.#plainDirs.set(path, { dev: here.dev, ino: here.ino });
  }

  async NodeGetVolumeStats(req: NodeGetVolumeStatsRequest): Promise<unknown> {
    const { id, dataset } = this.#dataset(req.volume_id);
    const path = await this.#volumePath(req.volume_path, id);
    const props = await this.#d.datasets.inspect(dataset);
    if (!props) throw new CsiError(Code.NOT_FOUND, `Volume "${id}" not found`);
    checkOwned(dataset, props);
    const top = await this.#topMount(path);
    if (!top || !this.#d.mounter.judge().isMountOf(top, dataset)) {
      throw new CsiError(Code.NOT_FOUND, `volume_path "${path}" does not hold volume "${id}"`);
    }
    const s = await this.#statfs(path);
    const problems: string[] = [];
    if (props.get("mounted")?.value !== "yes") problems.push(`dataset "${dataset}" is not mounted`);
    const storage = storageProblem(this.#d.health.last);
    if (storage) problems.push(storage);
    const total = s.blocks * s.bsize;
    return {
      usage: [
        {
          unit: "BYTES",
          total,
          available: s.bavail * s.bsize,
          used: total - s.bfree * s.bsize,
        },
        { unit: "INODES", total: s.files, available: s.ffree, used: s.files - s.ffree },
      ],
      volume_condition: {
        abnormal: problems.length > 0,
        message: problems.length > 0 ? problems.join("; ") : "Volume is healthy",
      },
    };
  }

  async NodeExpandVolume(req: NodeExpandVolumeRequest): Promise<unknown> {
    const { id, dataset } = this.#dataset(req.volume_id);
    const path = await this.#volumePath(req.volume_path, id);
    if (req.volume_capability) checkCapability(req.volume_capability);
    // capacity_range is optional in CSI: without one the volume keeps its size, which is answered.
    const cap = checkCapacity(req.capacity_range);
    return await withLock(this.#d.locks, [dataset], async () => {
      const [props, top] = await Promise.all([
        this.#d.zfs.getProperties(dataset, SIZE_STATE),
        this.#topMount(path),
      ]);
      if (!props) {
        throw new CsiError(Code.NOT_FOUND, `Volume "${id}" not found (no dataset "${dataset}")`);
      }
      checkOwned(dataset, props);
      // The path names the volume's use on this node: grow nothing through a path of another.
      if (!top || !this.#d.mounter.judge().isMountOf(top, dataset)) {
        throw new CsiError(Code.NOT_FOUND, `volume_path "${path}" does not hold volume "${id}"`);
      }
      // The same targets as ControllerExpandVolume: quota and refreservation follow as well.
      const plan = planSize(id, props, cap);
      await this.#d.zfs.setProperties(dataset, plan.changes);
      return { capacity_bytes: plan.refquota };
    });
  }

  /**
   * The volume_path of a stats or expand call. A relative path cannot be where the volume is
   * staged or published, so it holds no volume: NOT_FOUND, like any other path without it.
   * An empty path, or one outside the base directories, is INVALID_ARGUMENT as elsewhere.
   */
  #volumePath(value: unknown, id: string): Promise<string> {
    const path = required("volume_path", value);
    if (!path.startsWith("/")) {
      throw new CsiError(
        Code.NOT_FOUND,
        `volume_path ${JSON.stringify(path.slice(0, 200))} is not absolute, so volume "${id}" ` +
          `is not there`,
      );
    }
    return this.#path("volume_path", path);
  }

  /**
   * Refuses a path below another mount inside the base directory (a tmpfs, a bind mount of a
   * directory elsewhere, a volume's own mount): directories made or removed there would be on
   * that filesystem, possibly outside the base directory.
   * @throws {CsiError} INVALID_ARGUMENT naming the mount
   */
  #refuseMountBetween(field: string, path: string, table: readonly MountEntry[]): void {
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
  async #topMount(path: string): Promise<MountEntry | undefined> {
    return mountsAt(await this.#d.mounter.table(), path).at(-1);
  }

  /** Unmounts every mount of `dataset` stacked at `path`; refuses to touch anything else. */
  async #unmountAll(
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
  async #bindChecked(
    field: string,
    source: string,
    target: string,
    flags: readonly string[],
    volume: { id: string; dataset: string; before: readonly MountEntry[] },
  ): Promise<void> {
    await this.#d.mounter.bind(source, target, flags);
    // The dataset's root identity, once confirmed, tells that the bind landed and shows the
    // volume without the table (see #publishFast); any doubt and the table decides.
    const anchor = this.#anchors.get(volume.dataset);
    if (anchor && await this.#landed(target, anchor)) return;
    await this.#verifyBind(field, target, volume);
  }

  /**
   * Reads the mount table after a bind to `target` and makes sure it landed there and shows the
   * volume's dataset; otherwise undoes it and fails, as {@linkcode NodeService.#bindChecked}
   * says. Without the table from before the bind (a fast path's bind), a mount that landed
   * elsewhere is looked for where `target` leads now.
   */
  async #verifyBind(
    field: string,
    target: string,
    volume: { id: string; dataset: string; before?: readonly MountEntry[] },
  ): Promise<void> {
    const { id, dataset, before } = volume;
    const after = await this.#readTableAndLearn(target, dataset);
    const judge = this.#d.mounter.judge();
    const here = mountsAt(after, target);
    const top = here.at(-1);
    if (top && judge.isMountOf(top, dataset)) return;
    if (top) {
      // Nothing was mounted at the target before (the callers check), so a single mount there
      // is the one just made: it took another filesystem than the volume's.
      if (here.length === 1) await this.#undoMount(target, "it shows another filesystem");
      throw new CsiError(
        Code.FAILED_PRECONDITION,
        `The bind mount of volume "${id}" at ${field} "${target}" shows ${describeMount(top)}, ` +
          `not dataset "${dataset}"${here.length === 1 ? "; it was unmounted again" : ""}`,
      );
    }
    // Nothing at the target: the kernel put the mount wherever a swapped-in symlink led.
    const added = before ? addedMounts(before, after) : await this.#mountsWhereLeads(target, after);
    const strays = added.filter((e) =>
      judge.isMountOf(e, dataset) && e.mountPoint !== target &&
      mountsAt(after, e.mountPoint).at(-1) === e
    );
    for (const stray of strays) {
      await this.#undoMount(stray.mountPoint, `it was meant for ${field} "${target}"`);
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
  async #mountsWhereLeads(path: string, table: readonly MountEntry[]): Promise<MountEntry[]> {
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
  async #readTableAndLearn(path: string, dataset: string): Promise<MountEntry[]> {
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
      walk.crosses === false && this.#sameAsSeen(walk) && showsRoot(after, walk.parent, after)
    ) {
      this.#anchors.set(dataset, { dev: after.dev, ino: after.ino });
    } else {
      this.#anchors.delete(dataset);
    }
    return table;
  }

  /** Unmounts a mount the plugin just made by mistake; a failure is logged, not thrown. */
  async #undoMount(path: string, reason: string): Promise<void> {
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
  async #removeTarget(target: string): Promise<void> {
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
  async #ensureDirectory(path: string, mode: number): Promise<void> {
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
