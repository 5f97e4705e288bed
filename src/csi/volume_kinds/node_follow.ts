/**
 * NodeStage and NodeUnstage of a volume that follows its job (src/follow/mover.ts does the
 * work): the stage acquires the volume in the store and brings this node's copy up to the
 * store's head, then mounts it; the unstage releases it once no bind on this node uses the copy.
 */

import { Code, CsiError } from "../../errors.ts";
import { withLock } from "../../lock.ts";
import { MANAGED_PROPERTY, MANAGED_VALUE, volumeForDataset } from "../../zfs/names.ts";
import { FOLLOW_GENERATION_PROPERTY } from "../../follow/copy.ts";
import type { FollowVolume, FollowVolumes } from "../../follow/mover.ts";
import { DEFAULT_FOLLOW_INTERVAL_SECONDS } from "../../follow/volume.ts";
import { BACKUP_INTERVAL_PROPERTY, BACKUP_KEEP_PROPERTY } from "../../replicate/backup.ts";
import { formatKeepPolicy } from "../../store/policy.ts";
import type { NodeDeps } from "../node.ts";
import type { NodeKind, StageRequest } from "./node_kind.ts";

/**
 * The node's follow side, for a stage of the follow volume `id`.
 * @throws {CsiError} FAILED_PRECONDITION when this plugin has no store
 */
export function followVolumesOf(d: NodeDeps, id: string): FollowVolumes {
  if (d.follow) return d.follow;
  throw new CsiError(
    Code.FAILED_PRECONDITION,
    `Volume "${id}" follows its job through a store, and this plugin has none: start it ` +
      `with --store (the same store on every node)`,
  );
}

/** The node's side of volumes that follow their job. */
export class FollowStaging implements NodeKind {
  readonly #d: NodeDeps;

  constructor(deps: NodeDeps) {
    this.#d = deps;
  }

  /**
   * NodeStage of a volume that follows its job: acquire it and bring the copy here up to the
   * store's head (src/follow/mover.ts), then `mount` it. A registered volume (context
   * `follow = "true"`) gets its owner object at its first stage, with the size and backups its
   * context gives.
   * @throws {CsiError} FAILED_PRECONDITION without a store, or when another node holds it
   */
  async stage(v: StageRequest, mount: () => Promise<unknown>): Promise<unknown> {
    const { id, dataset, ctx, created } = v;
    const follow = followVolumesOf(this.#d, id);
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
   * The follow volume to release after an unstage: one whose copy here is a follow copy of a
   * ZFS dataset (it carries a generation; a zvol's copy is node_follow_zvol.ts's, judged by
   * what uses its device) and that no other bind on this node still uses.
   */
  async #toRelease(dataset: string): Promise<FollowVolume | undefined> {
    if (!this.#d.follow) return undefined;
    const props = await this.#d.zfs.getProperties(dataset, [
      "type",
      FOLLOW_GENERATION_PROPERTY,
    ]);
    if (props?.get(FOLLOW_GENERATION_PROPERTY)?.source !== "local") return undefined;
    if (props.get("type")?.value !== "filesystem") return undefined;
    const users = await this.#users(dataset);
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
  async #users(dataset: string, mountpoint?: string): Promise<string[]> {
    mountpoint ??= (await this.#d.zfs.getProperties(dataset, ["mountpoint"]))?.get("mountpoint")
      ?.value;
    const judge = this.#d.mounter.judge();
    return (await this.#d.mounter.table()).filter((e) =>
      judge.isMountOf(e, dataset) && e.mountPoint !== mountpoint
    ).map((e) => e.mountPoint);
  }

  /**
   * After an unstage, under the volume's lock: the release of a follow copy no bind uses any
   * more, to run outside the lock, since the final snapshot's upload takes the lock only for
   * its zfs steps. A NodeStage of the volume may come meanwhile (Nomad before 1.11): in the
   * volume's turn, the release looks again, under the lock, whether a bind uses the copy (see
   * FollowVolumes.stage).
   */
  async unstaged(dataset: string): Promise<(() => Promise<void>) | undefined> {
    const release = await this.#toRelease(dataset);
    if (!release) return undefined;
    return () =>
      this.#d.follow!.release(release, {
        inUse: () =>
          withLock(
            this.#d.locks,
            [dataset],
            async () => (await this.#users(dataset)).length > 0,
          ),
      });
  }
}
