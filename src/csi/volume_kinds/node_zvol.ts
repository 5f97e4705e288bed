/**
 * The node's side of zvol volumes (docs/block-volumes.md). A raw zvol is staged by checking it
 * and waiting for its device, and published by binding the device onto a file at the target; an
 * ext4/xfs zvol is formatted once (src/block/format.ts), mounted at the staging path, and
 * published by binding that mount as a filesystem volume is. What the volume is comes from the
 * zvol's own record, checked against the capability and the context, never from them alone; the
 * device used is always `/dev/zvol/<dataset>` resolved to a `/dev/zdN` block device.
 */

import { Code, CsiError } from "../../errors.ts";
import { withLock } from "../../lock.ts";
import { type MountEntry, mountsAt } from "../../mount/mountinfo.ts";
import { checkPathInside } from "../../mount/paths.ts";
import { MANAGED_PROPERTY, STAGED_PROPERTY } from "../../zfs/names.ts";
import { parseBytes, type PropertyMap } from "../../zfs/parse.ts";
import { userValue } from "../../volume/catalog.ts";
import { stagedAt } from "../../volume/tenancy.ts";
import {
  ATTACHED_PROPERTY,
  FORMAT,
  FORMAT_PROPERTY,
  ZVOL_CONTENT_PROPERTY,
  type ZvolContent,
  type ZvolFsType,
} from "../../volume/zvol.ts";
import type { BlockTools } from "../../block/tools.ts";
import { formatStep } from "../../block/format.ts";
import type { BlockDevice } from "../../block/args.ts";
import {
  type DeviceProbe,
  resolveZvolDevice,
  waitForZvolDevice,
  zvolLink,
} from "../../block/device.ts";
import type { VolumeContext } from "../context.ts";
import { storageProblem } from "../health.ts";
import type { FsStats, NodeDeps } from "../node.ts";
import type { NodeMounts } from "../node_mounts.ts";
import type { CheckedCapability } from "../validate.ts";
import { capabilityMisfit } from "../zvol_request.ts";
import type { ZvolSupport } from "../zvol_support.ts";
import { checkOwnedZvol } from "./zvol.ts";

/** What the node reads of a zvol before acting on it. */
export const NODE_ZVOL_STATE = [
  "type",
  MANAGED_PROPERTY,
  ZVOL_CONTENT_PROPERTY,
  "volsize",
  FORMAT_PROPERTY,
  ATTACHED_PROPERTY,
  STAGED_PROPERTY,
] as const;

/** Per-mount flags a filesystem on a zvol is mounted with at the staging path. */
const STAGE_FLAGS = ["nosuid", "nodev"] as const;

/** A checked NodePublish of a zvol. */
export interface ZvolPublish {
  readonly id: string;
  readonly dataset: string;
  readonly targetArg: string;
  readonly stagingArg: string | undefined;
  readonly cap: CheckedCapability;
  /** The capability's fs_type as sent. */
  readonly fsTypeGiven: string;
  readonly ctx: VolumeContext;
  /** Mount flags for the bind (with "ro" when read-only). */
  readonly flags: readonly string[];
}

/** The node's side of zvols. */
export class NodeZvols {
  readonly #d: NodeDeps;
  readonly #m: NodeMounts;
  readonly #zvols: ZvolSupport;
  readonly #tools: BlockTools;
  readonly #probe: DeviceProbe;
  readonly #statfs: (path: string) => Promise<FsStats>;

  constructor(
    deps: NodeDeps,
    parts: {
      readonly mounts: NodeMounts;
      readonly zvols: ZvolSupport;
      readonly tools: BlockTools;
      readonly probe: DeviceProbe;
      readonly statfs: (path: string) => Promise<FsStats>;
    },
  ) {
    this.#d = deps;
    this.#m = parts.mounts;
    this.#zvols = parts.zvols;
    this.#tools = parts.tools;
    this.#probe = parts.probe;
    this.#statfs = parts.statfs;
  }

  /**
   * Whether `dataset` is a zvol: asked of zfs only when the plugin serves zvols (one `zfs get`);
   * without --block-volumes every volume is a dataset, and the ordinary path refuses a zvol.
   */
  async isZvol(dataset: string): Promise<boolean> {
    if (!this.#d.config.blockVolumes) return false;
    const props = await this.#d.zfs.getProperties(dataset, ["type"]);
    return props?.get("type")?.value === "volume";
  }

  /** NodeStage of a zvol. */
  async stage(
    v: { readonly id: string; readonly dataset: string; readonly stagingArg: string },
    cap: CheckedCapability,
    fsTypeGiven: string,
    ctx: VolumeContext,
  ): Promise<unknown> {
    await this.#zvols.check();
    const { id, dataset } = v;
    return await withLock(this.#d.locks, [dataset], async () => {
      const staging = await this.#path("staging_target_path", v.stagingArg);
      const props = await this.#state(id, dataset);
      const content = this.#checkFits(id, dataset, props, cap, fsTypeGiven, ctx);
      const device = (await waitForZvolDevice(dataset, this.#probe)).name;
      // Marked before anything is mounted: a DeleteVolume sees the zvol in use from here on.
      if (userValue(props, ATTACHED_PROPERTY) !== this.#d.config.nodeId) {
        await this.#d.zfs.set(dataset, ATTACHED_PROPERTY, this.#d.config.nodeId);
      }
      if (stagedAt(props) === undefined) {
        await this.#d.zfs.set(dataset, STAGED_PROPERTY, String(Math.floor(Date.now() / 1000)));
      }
      if (content === "block") {
        // Nothing is mounted for a raw device: each publish binds the device itself.
        await this.#m.ensureDirectory(staging, 0o700);
        return {};
      }
      const table = await this.#d.mounter.table();
      this.#m.refuseMountBetween("staging_target_path", staging, table);
      const top = mountsAt(table, staging).at(-1);
      if (top) {
        if (top.source === device) return {};
        throw new CsiError(
          Code.ALREADY_EXISTS,
          `staging_target_path "${staging}" already holds another mount ("${top.source}")`,
        );
      }
      // Mounted elsewhere on this node (another usage's staging): it is made, never to be made.
      const inUse = table.some((e) => e.source === device);
      await this.#formatOnce(
        id,
        dataset,
        device,
        content,
        userValue(props, FORMAT_PROPERTY),
        inUse,
      );
      await this.#m.ensureDirectory(staging, 0o700);
      // A clone of an xfs zvol has its source's UUID, and xfs refuses a second filesystem with
      // a UUID already mounted: nouuid lets a clone mount beside its source.
      const flags = content === "xfs" ? [...STAGE_FLAGS, "nouuid"] : STAGE_FLAGS;
      await this.#d.mounter.mountDevice(content, device, staging, flags);
      const after = mountsAt(await this.#d.mounter.table(), staging).at(-1);
      if (after?.source !== device) {
        await this.#m.undoMount(staging, "the mount did not land at the staging path");
        throw new CsiError(
          Code.INTERNAL,
          `Mounting ${device} at "${staging}" did not show there; undone`,
        );
      }
      this.#d.log.info("zvol staged", { volumeId: id, dataset, device, content });
      return {};
    });
  }

  /**
   * Makes the filesystem on the device unless it is there (format.ts says which): "begun" is
   * recorded before mkfs and "done" after, so a stage killed in between redoes it next time,
   * and a filesystem the plugin finished is never formatted again.
   */
  async #formatOnce(
    id: string,
    dataset: string,
    device: string,
    want: ZvolFsType,
    recorded: string,
    inUse: boolean,
  ): Promise<void> {
    const found = await this.#tools.signature(device);
    const step = formatStep(recorded, found, want);
    if (inUse && (step.kind === "format" || step.kind === "redo")) {
      throw new CsiError(
        Code.FAILED_PRECONDITION,
        `Volume "${id}" is not mounted: its device ${device} is mounted elsewhere on this node, ` +
          `and its format record says "${recorded || "none"}"; it is not formatted while mounted`,
      );
    }
    switch (step.kind) {
      case "mount":
        return;
      case "adopt":
        await this.#d.zfs.set(dataset, FORMAT_PROPERTY, FORMAT.done);
        this.#d.log.info("zvol's filesystem adopted", { volumeId: id, dataset, fsType: want });
        return;
      case "refuse":
        throw new CsiError(Code.FAILED_PRECONDITION, `Volume "${id}" is not mounted: ${step.why}`);
      case "format":
      case "redo": {
        if (step.kind === "format") await this.#d.zfs.set(dataset, FORMAT_PROPERTY, FORMAT.begun);
        else if (found) await this.#tools.wipe(device);
        await this.#tools.mkfs(want, device);
        await this.#d.zfs.set(dataset, FORMAT_PROPERTY, FORMAT.done);
        this.#d.log.info("zvol formatted", {
          volumeId: id,
          dataset,
          fsType: want,
          redo: step.kind,
        });
        return;
      }
    }
  }

  /** NodeUnstage of a zvol: its filesystem unmounted, the node's mark removed. */
  async unstage(id: string, dataset: string, stagingArg: string): Promise<unknown> {
    return await withLock(this.#d.locks, [dataset], async () => {
      const staging = await this.#path("staging_target_path", stagingArg);
      const props = await this.#d.zfs.getProperties(dataset, NODE_ZVOL_STATE);
      const content = props ? checkOwnedZvol(dataset, props) : undefined;
      const found = await resolveZvolDevice(dataset, this.#probe);
      const device = found?.name;
      let table = await this.#d.mounter.table();
      this.#m.refuseMountBetween("staging_target_path", staging, table);
      for (let top = mountsAt(table, staging).at(-1); top; top = mountsAt(table, staging).at(-1)) {
        if (device === undefined || top.source !== device) {
          throw new CsiError(
            Code.FAILED_PRECONDITION,
            `staging_target_path "${staging}" holds a mount that is not volume "${id}" ` +
              `("${top.source}"); left alone`,
          );
        }
        await this.#d.mounter.unmount(staging);
        table = await this.#d.mounter.table();
      }
      // Another staging of the same zvol here (Nomad stages once per usage) keeps the mark: its
      // filesystem mounted elsewhere, or its device still bound onto a target file.
      const stillMounted = found !== undefined &&
        (table.some((e) => e.source === found.name) || await this.#boundAnywhere(table, found));
      if (props && content && !stillMounted) {
        if (userValue(props, ATTACHED_PROPERTY) === this.#d.config.nodeId) {
          await this.#d.zfs.inherit(dataset, ATTACHED_PROPERTY);
        }
      }
      return {};
    });
  }

  /** NodePublish of a zvol. */
  async publish(p: ZvolPublish): Promise<unknown> {
    await this.#zvols.check();
    const { id, dataset } = p;
    return await withLock(this.#d.locks, [dataset], async () => {
      const target = await this.#path("target_path", p.targetArg);
      if (p.stagingArg === undefined) {
        throw new CsiError(Code.INVALID_ARGUMENT, "staging_target_path is required for a zvol");
      }
      const staging = await this.#path("staging_target_path", p.stagingArg);
      if (staging === target) {
        throw new CsiError(
          Code.INVALID_ARGUMENT,
          "target_path must differ from staging_target_path",
        );
      }
      const props = await this.#state(id, dataset);
      const content = this.#checkFits(id, dataset, props, p.cap, p.fsTypeGiven, p.ctx);
      // The kernel enforces a bind mount's read-only flag on files and directories, not on a
      // device node: writes through a read-only bind of /dev/zdN still reach the zvol.
      if (content === "block" && p.flags.includes("ro")) {
        throw new CsiError(
          Code.INVALID_ARGUMENT,
          `Volume "${id}" is a raw block volume, and a read-only claim of it is refused: a ` +
            "read-only bind of a device node does not stop writes. Claim it writable, or use " +
            'fs_type "ext4" or "xfs" for a volume that can be mounted read-only',
        );
      }
      if (userValue(props, ATTACHED_PROPERTY) !== this.#d.config.nodeId) {
        throw new CsiError(
          Code.FAILED_PRECONDITION,
          `Volume "${id}" is not staged on this node; call NodeStageVolume first`,
        );
      }
      const { name: device, rdev } = await this.#device(id, dataset);
      const table = await this.#d.mounter.table();
      this.#m.refuseMountBetween("target_path", target, table);
      const top = mountsAt(table, target).at(-1);
      if (content === "block") {
        if (top) {
          if (await this.#probe.rdev(target) === rdev) return {};
          throw new CsiError(
            Code.ALREADY_EXISTS,
            `target_path "${target}" already holds another mount ("${top.source}")`,
          );
        }
        await this.#ensureFile(target);
        await this.#d.mounter.bind(device, target, []);
        if (await this.#probe.rdev(target) !== rdev) {
          await this.#m.undoMount(target, "the bind does not show the zvol's device");
          throw new CsiError(Code.INTERNAL, `Binding ${device} onto "${target}" did not land`);
        }
        return {};
      }
      const staged = mountsAt(table, staging).at(-1);
      if (staged?.source !== device) {
        throw new CsiError(
          Code.FAILED_PRECONDITION,
          `Volume "${id}" is not staged at "${staging}"; call NodeStageVolume first`,
        );
      }
      if (top) {
        if (top.source === device) return {};
        throw new CsiError(
          Code.ALREADY_EXISTS,
          `target_path "${target}" already holds another mount ("${top.source}")`,
        );
      }
      await this.#m.ensureDirectory(target, 0o750);
      await this.#d.mounter.bind(staging, target, p.flags);
      const after = mountsAt(await this.#d.mounter.table(), target).at(-1);
      if (after?.source !== device) {
        await this.#m.undoMount(target, "the bind does not show the zvol's filesystem");
        throw new CsiError(Code.INTERNAL, `Binding "${staging}" onto "${target}" did not land`);
      }
      return {};
    });
  }

  /** NodeUnpublish of a zvol: its binds at the target unmounted, the target removed. */
  async unpublish(id: string, dataset: string, targetArg: string): Promise<unknown> {
    return await withLock(this.#d.locks, [dataset], async () => {
      const target = await this.#path("target_path", targetArg);
      const found = await resolveZvolDevice(dataset, this.#probe);
      const device = found?.name;
      const rdev = found?.rdev;
      let table = await this.#d.mounter.table();
      this.#m.refuseMountBetween("target_path", target, table);
      for (let top = mountsAt(table, target).at(-1); top; top = mountsAt(table, target).at(-1)) {
        const ours = device !== undefined &&
          (top.source === device ||
            (rdev !== undefined && await this.#probe.rdev(target) === rdev));
        if (!ours) {
          throw new CsiError(
            Code.FAILED_PRECONDITION,
            `target_path "${target}" holds a mount that is not volume "${id}" ` +
              `("${top.source}"); left alone`,
          );
        }
        await this.#d.mounter.unmount(target);
        table = await this.#d.mounter.table();
      }
      await this.#removeTarget(target);
      this.#m.forget(target);
      return {};
    });
  }

  /** NodeGetVolumeStats of a zvol: its size (raw), or its filesystem's statfs. */
  async stats(id: string, dataset: string, path: string): Promise<unknown> {
    const props = await this.#state(id, dataset);
    const content = checkOwnedZvol(dataset, props);
    const device = await this.#device(id, dataset);
    await this.#checkHolds(id, path, device, content);
    const storage = storageProblem(this.#d.health.last);
    const condition = {
      abnormal: storage !== undefined,
      message: storage ?? "Volume is healthy",
    };
    if (content === "block") {
      const volsize = parseBytes(props.get("volsize")?.value ?? "0");
      return { usage: [{ unit: "BYTES", total: volsize }], volume_condition: condition };
    }
    const s = await this.#statfs(path);
    const total = s.blocks * s.bsize;
    return {
      usage: [
        { unit: "BYTES", total, available: s.bavail * s.bsize, used: total - s.bfree * s.bsize },
        { unit: "INODES", total: s.files, available: s.ffree, used: s.files - s.ffree },
      ],
      volume_condition: condition,
    };
  }

  /** NodeExpandVolume of a zvol: the filesystem grown to the zvol's size; a raw one reported. */
  async expand(id: string, dataset: string, path: string): Promise<unknown> {
    return await withLock(this.#d.locks, [dataset], async () => {
      const props = await this.#state(id, dataset);
      const content = checkOwnedZvol(dataset, props);
      const device = await this.#device(id, dataset);
      await this.#checkHolds(id, path, device, content);
      if (content !== "block") await this.#tools.grow(content, device.name, path);
      return { capacity_bytes: String(parseBytes(props.get("volsize")?.value ?? "0")) };
    });
  }

  /** Whether `device` is bound onto a file below the base directories (a raw publish). */
  async #boundAnywhere(table: readonly MountEntry[], device: BlockDevice): Promise<boolean> {
    return (await this.#boundAt(table, device, true)).length > 0;
  }

  /** Where `device` is bound onto a file below the base directories (the first only, if `one`). */
  async #boundAt(
    table: readonly MountEntry[],
    device: BlockDevice,
    one = false,
  ): Promise<string[]> {
    const found: string[] = [];
    for (const e of table) {
      const below = this.#d.config.stagePublishDirs.some((d) => e.mountPoint.startsWith(`${d}/`));
      if (
        below && e.source !== device.name && await this.#probe.rdev(e.mountPoint) === device.rdev
      ) {
        found.push(e.mountPoint);
        if (one) break;
      }
    }
    return found;
  }

  /**
   * What on this node still uses the zvol, in words (empty: nothing): a stage's mark
   * (`org.zfs-csi:attached`, which NodeUnstage removes only once nothing else uses it), a mount
   * of its device anywhere, its device bound onto a file below the base directories. A zvol has
   * no mountpoint of its own, so this, not a dataset's mount test, says whether a follow zvol's
   * copy may be released.
   */
  async users(dataset: string): Promise<string[]> {
    const props = await this.#d.zfs.getProperties(dataset, [ATTACHED_PROPERTY]);
    if (!props) return [];
    const attached = userValue(props, ATTACHED_PROPERTY);
    const out = attached === "" ? [] : [`staged on node "${attached}" (${ATTACHED_PROPERTY})`];
    const device = await resolveZvolDevice(dataset, this.#probe);
    if (device === undefined) return out;
    const table = await this.#d.mounter.table();
    out.push(...table.filter((e) => e.source === device.name).map((e) => e.mountPoint));
    out.push(...await this.#boundAt(table, device));
    return out;
  }

  /** The zvol's state, or NOT_FOUND. */
  async #state(id: string, dataset: string): Promise<PropertyMap> {
    const props = await this.#d.zfs.getProperties(dataset, NODE_ZVOL_STATE);
    if (!props) throw new CsiError(Code.NOT_FOUND, `Volume "${id}" not found`);
    return props;
  }

  /** The zvol's device now, or FAILED_PRECONDITION when it has none. */
  async #device(id: string, dataset: string): Promise<BlockDevice> {
    const device = await resolveZvolDevice(dataset, this.#probe);
    if (device === undefined) {
      throw new CsiError(
        Code.FAILED_PRECONDITION,
        `Volume "${id}" has no device (${zvolLink(dataset)}); call NodeStageVolume first`,
      );
    }
    return device;
  }

  /** What the zvol holds, after checking that the capability and the context fit it. */
  #checkFits(
    id: string,
    dataset: string,
    props: PropertyMap,
    cap: CheckedCapability,
    fsTypeGiven: string,
    ctx: VolumeContext,
  ): ZvolContent {
    const content = checkOwnedZvol(dataset, props);
    if (ctx.zvol !== undefined && ctx.zvol !== content) {
      throw new CsiError(
        Code.INVALID_ARGUMENT,
        `volume_context says fs_type "${ctx.zvol}", and volume "${id}" is a zvol holding ` +
          `${content}`,
      );
    }
    const misfit = capabilityMisfit(cap, fsTypeGiven, content);
    if (misfit !== undefined) throw new CsiError(Code.INVALID_ARGUMENT, misfit);
    return content;
  }

  /** Refuses a volume_path that does not hold the zvol (NOT_FOUND, as for datasets). */
  async #checkHolds(
    id: string,
    path: string,
    device: BlockDevice,
    content: ZvolContent,
  ): Promise<void> {
    const holds = content === "block"
      ? (await this.#probe.rdev(path)) === device.rdev
      : (await this.#m.topMount(path))?.source === device.name;
    if (!holds) {
      throw new CsiError(Code.NOT_FOUND, `volume_path "${path}" does not hold volume "${id}"`);
    }
  }

  #path(field: string, path: string): Promise<string> {
    return checkPathInside(field, path, this.#d.config.stagePublishDirs);
  }

  /** Creates the target as an empty file for a device to be bound onto; nothing else is used. */
  async #ensureFile(target: string): Promise<void> {
    try {
      const info = await Deno.lstat(target);
      if (info.isFile) return;
      throw new CsiError(
        Code.INVALID_ARGUMENT,
        `target_path "${target}" exists and is not a file (a raw block volume is bound onto a file)`,
      );
    } catch (err) {
      if (!(err instanceof Deno.errors.NotFound)) throw err;
    }
    await Deno.writeFile(target, new Uint8Array(), { createNew: true, mode: 0o640 });
  }

  /** Removes an unmounted target: an empty file (raw) or an empty directory; nothing else. */
  async #removeTarget(target: string): Promise<void> {
    let info: Deno.FileInfo;
    try {
      info = await Deno.lstat(target);
    } catch (err) {
      if (err instanceof Deno.errors.NotFound) return;
      throw err;
    }
    if (info.isFile && info.size === 0) {
      await Deno.remove(target);
      return;
    }
    if (info.isDirectory) await this.#m.removeTarget(target);
  }
}
