/**
 * NodeStage, NodeUnstage and NodeExpandVolume of a volume that follows its job and is a zvol
 * (docs/block-volumes.md, docs/follow.md). The stage acquires the volume and brings this node's
 * copy to the store's head as for a dataset (src/follow/mover.ts: made with `zfs create -V`, or
 * the head's chain received, read-only until a conditional write proves the holding), then
 * goes on with the zvol's node path (node_zvol.ts: device, the format-once rule, the mount of
 * ext4/xfs at the staging path; nothing mounted for a raw one). The unstage releases it only
 * once nothing on this node uses the zvol any more (NodeZvols.users: a zvol has no mountpoint
 * to judge by). A follow zvol moves only when no node has it staged, as a follow dataset does.
 */

import { Code, CsiError } from "../../errors.ts";
import { withLock } from "../../lock.ts";
import { volumeForDataset } from "../../zfs/names.ts";
import { parseBytes } from "../../zfs/parse.ts";
import { FOLLOW_GENERATION_PROPERTY, FOLLOW_RELEASED_PROPERTY } from "../../follow/copy.ts";
import type { FollowVolume } from "../../follow/mover.ts";
import { planZvolGrowth, type ZvolContent } from "../../volume/zvol.ts";
import type { CapacityRange } from "../types.ts";
import type { NodeDeps } from "../node.ts";
import { checkCapacity, type CheckedCapability } from "../validate.ts";
import type { ZvolSupport } from "../zvol_support.ts";
import type { StageRequest } from "./node_kind.ts";
import type { NodeZvols } from "./node_zvol.ts";
import { followVolumesOf } from "./node_follow.ts";

/** The release marker of a copy this node holds (src/follow/mover.ts). */
const HELD = "none";

/** The node's side of follow zvols. */
export class FollowZvolStaging {
  readonly #d: NodeDeps;
  readonly #zvols: NodeZvols;
  readonly #support: ZvolSupport;

  constructor(deps: NodeDeps, zvols: NodeZvols, support: ZvolSupport) {
    this.#d = deps;
    this.#zvols = zvols;
    this.#support = support;
  }

  /**
   * NodeStage of a follow zvol: `mount` (node_zvol.ts's stage) once the copy here is the
   * store's head and writable. What the request stages it as (its context's fs_type, else its
   * capability) must be what the volume's settings say, checked before the copy is touched.
   * @throws {CsiError} INVALID_ARGUMENT where this plugin serves no zvols, or for a registered
   *   volume (a follow zvol is made by CreateVolume); FAILED_PRECONDITION without a store
   */
  async stage(
    v: StageRequest,
    cap: CheckedCapability,
    mount: () => Promise<unknown>,
  ): Promise<unknown> {
    const { id, dataset, ctx } = v;
    const follow = followVolumesOf(this.#d, id);
    // Before the store: a node that cannot make zvols must not take the volume.
    await this.#support.check();
    if (!v.created) {
      throw new CsiError(
        Code.INVALID_ARGUMENT,
        `Volume "${id}" is registered to follow its job as a zvol: a zvol that follows its ` +
          `job is made by CreateVolume (nomad volume create), which records its size and content ` +
          `in the store`,
      );
    }
    const content: ZvolContent | undefined = ctx.zvol ??
      (cap.kind === "block" ? "block" : cap.kind === "fs" ? cap.fsType : undefined);
    const name = volumeForDataset(this.#d.config.parentDataset, dataset) ?? id;
    return await follow.stage(
      { name, dataset, asZvol: content === undefined ? {} : { content } },
      mount,
    );
  }

  /**
   * After node_zvol.ts's unstage, under the volume's lock: the release of a follow zvol's copy
   * nothing on this node uses any more, to run outside the lock (as FollowStaging.unstaged); in
   * its turn the release looks again, under the lock, whether anything uses the zvol.
   */
  async unstaged(dataset: string): Promise<(() => Promise<void>) | undefined> {
    const follow = this.#d.follow;
    if (!follow) return undefined;
    const props = await this.#d.zfs.getProperties(dataset, ["type", FOLLOW_GENERATION_PROPERTY]);
    if (props?.get("type")?.value !== "volume") return undefined;
    if (props.get(FOLLOW_GENERATION_PROPERTY)?.source !== "local") return undefined;
    const users = await this.#zvols.users(dataset);
    if (users.length > 0) {
      this.#d.log.info("follow zvol still in use on this node: not released", {
        dataset,
        users,
      });
      return undefined;
    }
    const name = volumeForDataset(this.#d.config.parentDataset, dataset);
    if (name === undefined) return undefined;
    const volume: FollowVolume = { name, dataset };
    return () =>
      follow.release(volume, {
        inUse: () =>
          withLock(
            this.#d.locks,
            [dataset],
            async () => (await this.#zvols.users(dataset)).length > 0,
          ),
      });
  }

  /**
   * NodeExpandVolume of a follow zvol whose copy this node holds: its volsize grown to the
   * capacity asked for (in whole steps, never shrunk: the rule the store's record grew by),
   * before node_zvol.ts grows its filesystem. The store's record was grown by
   * ControllerExpandVolume; any other copy gets that size at its next stage.
   */
  async grow(id: string, dataset: string, range: CapacityRange | undefined): Promise<void> {
    if (!range) return;
    const capacity = checkCapacity(range);
    await withLock(this.#d.locks, [dataset], async () => {
      const props = await this.#d.zfs.getProperties(dataset, [
        "type",
        "volsize",
        FOLLOW_GENERATION_PROPERTY,
        FOLLOW_RELEASED_PROPERTY,
      ]);
      if (props?.get("type")?.value !== "volume") return;
      if (props.get(FOLLOW_GENERATION_PROPERTY)?.source !== "local") return;
      if (props.get(FOLLOW_RELEASED_PROPERTY)?.value !== HELD) {
        throw new CsiError(
          Code.FAILED_PRECONDITION,
          `Volume "${id}" is not held by this node: its copy here is not grown (the node that ` +
            `holds it grows its own, any other copy gets the size at its next stage)`,
        );
      }
      const current = parseBytes(props.get("volsize")?.value ?? "0");
      const size = planZvolGrowth(id, current, capacity);
      if (size <= current) return;
      await this.#d.zfs.setProperties(dataset, [["volsize", String(size)]]);
      this.#d.log.info("follow zvol's copy grown", { volumeId: id, from: current, to: size });
    });
  }
}
