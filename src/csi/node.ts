/**
 * The CSI Node service. Staging bind-mounts a volume's dataset at the staging path; publishing
 * bind-mounts the staging path at the target. Each handler checks what its call means; the
 * checked mounts and their fast paths are node_mounts.ts, and what a kind of volume does around
 * them (a follow volume is brought here first) is its file in volume_kinds/ (node_kind.ts).
 */

import { statfs } from "node:fs/promises";
import type { Config } from "../config.ts";
import { Code, CsiError } from "../errors.ts";
import { KeyedLock, withLock } from "../lock.ts";
import type { Logger } from "../log.ts";
import type { Mounter } from "../mount/mounter.ts";
import { type MountEntry, mountsAt } from "../mount/mountinfo.ts";
import type { LstatFn } from "../mount/identity.ts";
import { checkPathInside } from "../mount/paths.ts";
import { resolveVolume } from "../zfs/ids.ts";
import { STAGED_PROPERTY } from "../zfs/names.ts";
import type { PropertyMap } from "../zfs/parse.ts";
import type { FollowVolumes } from "../follow/mover.ts";
import { splitFollow } from "../follow/volume.ts";
import type { Zfs } from "../zfs/zfs.ts";
import { parseVolumeContext, type VolumeContext } from "./context.ts";
import { BACKUP_INTERVAL_PROPERTY, BACKUP_KEEP_PROPERTY } from "../replicate/backup.ts";
import { formatKeepPolicy } from "../store/policy.ts";
import { checkOwned, type Datasets } from "../volume/datasets.ts";
import { type HealthChecker, storageProblem } from "./health.ts";
import { planSize, SIZE_STATE } from "../volume/sizing.ts";
import { stagedAt } from "../volume/tenancy.ts";
import type {
  NodeExpandVolumeRequest,
  NodeGetVolumeStatsRequest,
  NodePublishVolumeRequest,
  NodeStageVolumeRequest,
  NodeUnpublishVolumeRequest,
  NodeUnstageVolumeRequest,
} from "./types.ts";
import { NodeMounts } from "./node_mounts.ts";
import type { NodeKind } from "./volume_kinds/node_kind.ts";
import { FollowStaging } from "./volume_kinds/node_follow.ts";
import { OrdinaryStaging } from "./volume_kinds/node_ordinary.ts";
import { checkCapability, checkCapacity, type CheckedCapability, required } from "./validate.ts";
import { BlockTools } from "../block/tools.ts";
import { type DeviceProbe, realDeviceProbe } from "../block/device.ts";
import { DenoCommandRunner } from "../run.ts";
import { NodeZvols } from "./volume_kinds/node_zvol.ts";
import { FollowZvolStaging } from "./volume_kinds/node_follow_zvol.ts";
import { ZvolSupport } from "./zvol_support.ts";
import type { VolumeCapability } from "./types.ts";

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
  /** blkid, mkfs and the rest for zvols (with --block-volumes); plugin.ts passes its runner. */
  readonly blockTools?: BlockTools;
  /** How a zvol's device node is found; for tests. */
  readonly deviceProbe?: DeviceProbe;
}

/** Mount flags that the mount table lists whenever they are in effect. */
const SHOWN_FLAGS = new Set(["ro", "nosuid", "nodev", "noexec", "noatime", "nodiratime"]);

/** The CSI Node service handlers. */
export class NodeService {
  readonly #d: NodeDeps;
  readonly #statfs: (path: string) => Promise<FsStats>;
  readonly #m: NodeMounts;
  /** The volume kinds, by what NodeStage says the volume is. */
  readonly #ordinary: NodeKind;
  readonly #follow: NodeKind;
  /** Zvols (docs/block-volumes.md), chosen by the capability, the context or what zfs says. */
  readonly #zvol: NodeZvols;
  readonly #zvols: ZvolSupport;
  /** Zvols that follow their job: brought here as follow volumes, then staged as zvols. */
  readonly #followZvol: FollowZvolStaging;

  constructor(deps: NodeDeps) {
    this.#d = deps;
    this.#statfs = deps.statfs ?? ((p) => statfs(p));
    this.#m = new NodeMounts(deps);
    this.#ordinary = new OrdinaryStaging();
    this.#follow = new FollowStaging(deps);
    this.#zvols = new ZvolSupport(deps.config.blockVolumes, deps.zfs);
    const tools = deps.blockTools ??
      new BlockTools(new DenoCommandRunner(deps.config.commandTimeoutMs), {
        timeoutMs: deps.config.commandTimeoutMs,
        log: deps.log,
      });
    this.#zvol = new NodeZvols(deps, {
      mounts: this.#m,
      zvols: this.#zvols,
      tools,
      probe: deps.deviceProbe ?? realDeviceProbe(tools),
      statfs: this.#statfs,
    });
    this.#followZvol = new FollowZvolStaging(deps, this.#zvol, this.#zvols);
  }

  /**
   * Whether a stage or publish is of a zvol: the capability asks for one (block, ext4, xfs), the
   * context says so, or, for a plain mount capability with --block-volumes, zfs says the volume
   * is one (each path then checks what the zvol really holds).
   */
  async #isZvolCall(
    cap: CheckedCapability,
    raw: VolumeCapability | null | undefined,
    ctx: VolumeContext,
    dataset: string,
  ): Promise<boolean> {
    if (cap.kind !== "zfs" || ctx.zvol !== undefined) return true;
    if ((raw?.mount?.fs_type ?? "") !== "") return false;
    return await this.#zvol.isZvol(dataset);
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
    const cap = checkCapability(req.volume_capability, this.#zvols.options);
    const ctx = this.#context(req.volume_context, dataset);
    if (await this.#isZvolCall(cap, req.volume_capability, ctx, dataset)) {
      const stageZvol = () =>
        this.#zvol.stage(
          { id, dataset, stagingArg },
          cap,
          req.volume_capability?.mount?.fs_type ?? "",
          ctx,
        );
      if (!(follow || splitFollow(req.volume_context).follow)) return await stageZvol();
      return await this.#followZvol.stage(
        { id, dataset, ctx, created: follow === true },
        cap,
        stageZvol,
      );
    }
    const mount = () => this.#stage(id, dataset, stagingArg, ctx);
    // A volume that follows its job: by its id, or registered with context follow = "true".
    const kind = follow || splitFollow(req.volume_context).follow ? this.#follow : this.#ordinary;
    return await kind.stage({ id, dataset, ctx, created: follow === true }, mount);
  }

  /** NodeStage's mounts, under the volume's lock. */
  #stage(id: string, dataset: string, stagingArg: string, ctx: VolumeContext): Promise<unknown> {
    return withLock(this.#d.locks, [dataset], async () => {
      // Paths are checked under the lock, right before the mounts they guard.
      const staging = await this.#path("staging_target_path", stagingArg);
      const prepare = async (props: PropertyMap) => {
        await this.#applyBackupContext(id, dataset, ctx);
        if (stagedAt(props) === undefined) {
          await this.#d.zfs.set(dataset, STAGED_PROPERTY, String(Math.floor(Date.now() / 1000)));
        }
      };
      if (await this.#m.stageFast(id, dataset, staging, prepare)) return {};
      // Also checks that the dataset itself is the top mount at its mountpoint: the bind below
      // takes whatever is on top there.
      const ds = await this.#d.datasets.ensureMounted(id, dataset, ctx.sizeBytes);
      this.#m.refuseMountBetween("staging_target_path", staging, ds.table);
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
      await this.#m.ensureDirectory(staging, 0o700);
      // The table has just shown nothing mounted there, nor on the way.
      await this.#m.remember(staging);
      await this.#m.bindChecked("staging_target_path", ds.mountpoint, staging, [], {
        id,
        dataset,
        before: ds.table,
      });
      return {};
    });
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
    if (await this.#zvol.isZvol(dataset)) {
      await this.#zvol.unstage(id, dataset, stagingArg);
      // A follow zvol's copy is released (outside the lock) once nothing here uses it.
      const release = await withLock(
        this.#d.locks,
        [dataset],
        () => this.#followZvol.unstaged(dataset),
      );
      if (release) await release();
      return {};
    }
    const finish = await withLock(this.#d.locks, [dataset], async () => {
      const staging = await this.#path("staging_target_path", stagingArg);
      if (!(await this.#m.unmountFast(staging, dataset))) {
        await this.#m.unmountAll(staging, id, dataset);
      }
      // The request does not say the kind (NodeUnstage has no context): each kind knows its
      // own copies by their dataset, and says what is left to do outside the lock.
      for (const kind of [this.#follow, this.#ordinary]) {
        const after = await kind.unstaged(dataset);
        if (after) return after;
      }
      return undefined;
    });
    // Outside the lock: the final snapshot's upload takes the lock only for its zfs steps. A
    // NodeStage of the volume may come meanwhile (Nomad before 1.11): in the volume's turn, the
    // release looks again, under the lock, whether a bind uses the copy (see FollowVolumes.stage).
    if (finish) await finish();
    return {};
  }

  async NodePublishVolume(req: NodePublishVolumeRequest): Promise<unknown> {
    const { id, dataset } = this.#dataset(req.volume_id);
    const targetArg = required("target_path", req.target_path);
    const stagingArg = req.staging_target_path || undefined;
    const cap = checkCapability(req.volume_capability, this.#zvols.options);
    const ctx = this.#context(req.volume_context, dataset);
    const readOnly = req.readonly === true || cap.readOnlyMode || cap.flags.includes("ro");
    const flags = [...(readOnly ? ["ro"] : []), ...cap.flags.filter((f) => f !== "ro")];
    if (await this.#isZvolCall(cap, req.volume_capability, ctx, dataset)) {
      return await this.#zvol.publish({
        id,
        dataset,
        targetArg,
        stagingArg,
        cap,
        fsTypeGiven: req.volume_capability?.mount?.fs_type ?? "",
        ctx,
        flags,
      });
    }
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
      if (staging !== undefined && await this.#m.publishFast(id, dataset, staging, target, flags)) {
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
      this.#m.refuseMountBetween("target_path", target, table);
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
      await this.#m.ensureDirectory(target, 0o750);
      await this.#m.remember(target);
      await this.#m.bindChecked("target_path", source, target, flags, {
        id,
        dataset,
        before: table,
      });
      return {};
    });
  }

  async NodeUnpublishVolume(req: NodeUnpublishVolumeRequest): Promise<unknown> {
    const { id, dataset } = this.#dataset(req.volume_id);
    const targetArg = required("target_path", req.target_path);
    if (await this.#zvol.isZvol(dataset)) return await this.#zvol.unpublish(id, dataset, targetArg);
    return await withLock(this.#d.locks, [dataset], async () => {
      const target = await this.#path("target_path", targetArg);
      if (!(await this.#m.unmountFast(target, dataset))) {
        const table = await this.#d.mounter.table();
        // Checked before anything is unmounted or removed: the directory removed below could
        // otherwise be on someone else's filesystem.
        this.#m.refuseMountBetween("target_path", target, table);
        await this.#m.unmountAll(target, id, dataset, table);
      }
      await this.#m.removeTarget(target);
      this.#m.forget(target);
      return {};
    });
  }

  async NodeGetVolumeStats(req: NodeGetVolumeStatsRequest): Promise<unknown> {
    const { id, dataset } = this.#dataset(req.volume_id);
    const path = await this.#volumePath(req.volume_path, id);
    if (await this.#zvol.isZvol(dataset)) return await this.#zvol.stats(id, dataset, path);
    const props = await this.#d.datasets.inspect(dataset);
    if (!props) throw new CsiError(Code.NOT_FOUND, `Volume "${id}" not found`);
    checkOwned(dataset, props);
    const top = await this.#m.topMount(path);
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
    const { id, dataset, follow } = this.#dataset(req.volume_id);
    const path = await this.#volumePath(req.volume_path, id);
    if (req.volume_capability) checkCapability(req.volume_capability, this.#zvols.options);
    if (await this.#zvol.isZvol(dataset)) {
      // A follow zvol's copy gets its volsize here; an ordinary zvol's, from the controller.
      if (follow) await this.#followZvol.grow(id, dataset, req.capacity_range ?? undefined);
      return await this.#zvol.expand(id, dataset, path);
    }
    // capacity_range is optional in CSI: without one the volume keeps its size, which is answered.
    const cap = checkCapacity(req.capacity_range);
    return await withLock(this.#d.locks, [dataset], async () => {
      const [props, top] = await Promise.all([
        this.#d.zfs.getProperties(dataset, SIZE_STATE),
        this.#m.topMount(path),
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
}
