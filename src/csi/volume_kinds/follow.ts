/**
 * The follow volume kind: a volume that follows its job through the store (src/follow/). The
 * controller's calls act on the store only: its owner object and record, its size, its pinned
 * copies as snapshots; nodes make and move the datasets (node.ts, src/follow/mover.ts).
 */

import { Code, CsiError } from "../../errors.ts";
import { withLock } from "../../lock.ts";
import { followVolumeId } from "../../zfs/ids.ts";
import {
  encodeComponent,
  MANAGED_PROPERTY,
  MANAGED_VALUE,
  NAME_PROPERTY,
} from "../../zfs/names.ts";
import { fittedVolumeName } from "../../zfs/fit.ts";
import { PARAMETERS_PROPERTY } from "../../volume/catalog.ts";
import type { Capacity } from "../../volume/sizing.ts";
import {
  BACKUP_PARAMETERS,
  checkSizes,
  parseParameters,
  type VolumeParameters,
  ZFS_PARAMETERS,
} from "../../parameters.ts";
import type { SnapshotManifest } from "../../store/layout.ts";
import type { ZvolContent } from "../../volume/zvol.ts";
import {
  parseStoredSnapshotId,
  storedSnapshotId,
  type StoredSnapshotRef,
} from "../../store/snapshot_ids.ts";
import { BACKUP_INTERVAL_PROPERTY, BACKUP_KEEP_PROPERTY } from "../../replicate/backup.ts";
import { formatKeepPolicy } from "../../store/policy.ts";
import { type Store, StoreError } from "../../store/store.ts";
import {
  createFollowVolume,
  DEFAULT_FOLLOW_INTERVAL_SECONDS,
  deleteFollowVolume,
  splitFollow,
} from "../../follow/volume.ts";
import { type FollowSettings, type OwnerRecord, readOwner } from "../../follow/owner.ts";
import { FOLLOW_GENERATION_PROPERTY } from "../../follow/copy.ts";
import { followVolumesPrefix, listMarked } from "../../follow/markers.ts";
import { followTopologies, splitStandbys } from "../../follow/placement.ts";
import { resizeFollowVolume } from "../../follow/resize.ts";
import { FollowSnapshots } from "../../follow/snapshots.ts";
import { seedFromSnapshot } from "../../follow/seed.ts";
import { followVolumeMessage, followVolumeStatus } from "../../follow/where.ts";
import { MIN_VOLUME_BYTES } from "../../size.ts";
import type { CreateVolumeRequest } from "../types.ts";
import { checkCapability, checkCapacity } from "../validate.ts";
import { type KindCommon, requiredCapabilities } from "./common.ts";
import type { SnapshotRequest, VolumeKind } from "./kind.ts";
import type { OrdinaryVolumes } from "./ordinary.ts";
import type { ControllerDeps } from "../controller.ts";

/** Volumes that follow their job. */
export class FollowKind implements VolumeKind {
  readonly #c: KindCommon;
  readonly #ordinary: OrdinaryVolumes;
  /** This node's copy of a follow zvol is set aside as a zvol is. */
  readonly #zvol: VolumeKind;
  /** Snapshots of follow volumes: their last copy in the store, pinned (src/follow/). */
  readonly #snapshots: FollowSnapshots | undefined;

  constructor(common: KindCommon, ordinary: OrdinaryVolumes, zvol: VolumeKind) {
    this.#c = common;
    this.#ordinary = ordinary;
    this.#zvol = zvol;
    const follow = common.d.follow;
    this.#snapshots = follow && new FollowSnapshots(follow.store, common.d.log);
  }

  /** A follow volume's parameters less its own keys (follow, standby_nodes). */
  static volumeParameters(
    parameters: Readonly<Record<string, string>> | null | undefined,
  ): Record<string, string> {
    return splitStandbys(splitFollow(parameters).rest).rest;
  }

  /**
   * CreateVolume of a volume that follows its job: its owner object and record go to the store,
   * with the dataset properties every node creates its copy with; no dataset here. Its topology
   * is its standby nodes, if it names some (src/follow/placement.ts), else none.
   */
  create(
    req: CreateVolumeRequest,
    requested: string,
    parameters: Record<string, string>,
  ): Promise<unknown> {
    return this.createShaped(req, requested, parameters, (rest) => datasetShape(this.#c, rest));
  }

  /**
   * CreateVolume of a follow volume of either kind: a ZFS dataset (`create`) or a zvol
   * (follow_zvol.ts), whose differences `shapeOf` gives from the parameters left once `follow`
   * and `standby_nodes` are out. Everything else is the same: the store, the sources, the name,
   * the sync interval, the owner object and record, the answer.
   */
  async createShaped(
    req: CreateVolumeRequest,
    requested: string,
    parameters: Record<string, string>,
    shapeOf: (rest: Record<string, string>) => Promise<FollowShape>,
  ): Promise<unknown> {
    const follow = this.#c.d.follow;
    if (!follow) {
      throw new CsiError(
        Code.FAILED_PRECONDITION,
        `Volume "${requested}" asks to follow its job (parameter follow = "true"), which needs ` +
          `a store shared by the nodes, and this plugin has none: start it with --store`,
      );
    }
    const sourceId = req.volume_content_source?.snapshot?.snapshot_id;
    const source = sourceId === undefined ? undefined : parseStoredSnapshotId(sourceId);
    if (req.volume_content_source && !source) {
      throw new CsiError(
        Code.INVALID_ARGUMENT,
        `Volume "${requested}": a volume that follows its job can be made from a snapshot in ` +
          `the store (an id store:…) only, not from a volume or a snapshot on a node yet`,
      );
    }
    const name = fittedVolumeName(requested, this.#c.d.config.parentDataset, "*");
    const id = followVolumeId(name);
    // Block and ext4/xfs capabilities only reach here for a zvol (controller.ts).
    for (const cap of requiredCapabilities(req.volume_capabilities)) {
      checkCapability(cap, this.#c.zvols.options);
    }
    const capacity = checkCapacity(req.capacity_range);
    const { standbys, rest } = splitStandbys(parameters);
    // Where Nomad may place its job: the standby nodes, or any node (src/follow/placement.ts).
    const topologies = followTopologies(standbys, req.accessibility_requirements);
    const shape = await shapeOf(rest);
    const params = parseParameters(shape.rest, this.#c.d.config.parameterPolicy);
    const asked = shape.size(capacity, params, source !== undefined);
    const interval = params.backup?.intervalSeconds ?? DEFAULT_FOLLOW_INTERVAL_SECONDS;
    if (interval === 0) {
      throw new CsiError(
        Code.INVALID_ARGUMENT,
        `Volume "${requested}" follows its job, so its data must reach the store: ` +
          `${BACKUP_PARAMETERS.interval} cannot be 0`,
      );
    }
    await this.#c.checkSupported(params);
    if (source) shape.checkSource?.();
    const createOnly = Object.keys(params.properties).filter((k) =>
      Object.hasOwn(ZFS_PARAMETERS, k) && ZFS_PARAMETERS[k]!.createOnly
    );
    if (source && createOnly.length > 0) {
      throw new CsiError(
        Code.INVALID_ARGUMENT,
        `Parameter ${createOnly.map((k) => `"${k}"`).join(", ")} cannot be given to a volume ` +
          `made from a stored snapshot: the received dataset keeps the snapshot's value`,
      );
    }
    const props: Record<string, string> = {
      [BACKUP_INTERVAL_PROPERTY]: String(interval),
      ...(params.backup?.keep
        ? { [BACKUP_KEEP_PROPERTY]: formatKeepPolicy(params.backup.keep) }
        : {}),
      ...params.properties,
      [MANAGED_PROPERTY]: MANAGED_VALUE,
      [NAME_PROPERTY]: requested,
      [PARAMETERS_PROPERTY]: shape.canonical(params),
    };
    // Two nodes could hold one volume on a store that ignores conditional writes.
    await follow.conditionalWrites?.require();
    let size = asked;
    await withLock(this.#c.d.locks, [`follow:${name}`], async () => {
      // From a stored snapshot: its chain becomes the new volume's (src/follow/seed.ts), and
      // without a size asked for, the volume has the size it had when the snapshot was taken.
      const seed = source && await seedFromSnapshot(follow.store, {
        source,
        volume: name,
        node: this.#c.d.config.nodeId,
        log: this.#c.d.log,
        check: (m) => shape.checkSeed(source.id, m, asked),
      });
      if (seed && size === 0) size = seed.source.capacityBytes;
      await createFollowVolume(follow.store, {
        name,
        settings: shape.settings(props, params, size),
        parameters: { ...parameters, follow: "true" },
        ttlSeconds: follow.ttlSeconds,
        standbys,
        node: this.#c.d.config.nodeId,
        ...(seed ? { seed: { uid: seed.uid, head: seed.head } } : {}),
        nowMs: Date.now(),
      });
    });
    this.#c.d.log.info("follow volume created in the store", {
      volumeId: id,
      store: follow.store.description,
      ...shape.context,
    });
    return {
      volume: {
        volume_id: id,
        capacity_bytes: String(size),
        volume_context: shape.context,
        ...(source ? { content_source: { snapshot: { snapshot_id: source.id } } } : {}),
        // None: any node running the plugin may stage it.
        ...(topologies.length > 0 ? { accessible_topology: topologies } : {}),
      },
    };
  }

  /**
   * DeleteVolume: the volume goes in the store first (refused while a node holds it); this
   * node's copy, if it has one, is then set aside like any volume.
   */
  async delete(id: string, dataset: string): Promise<unknown> {
    await this.#deleteInStore(id, dataset);
    const copy = await this.#c.d.zfs.getProperties(dataset, ["type"]);
    const local = copy?.get("type")?.value === "volume" ? this.#zvol : this.#ordinary;
    return await local.delete(id, dataset);
  }

  /** A volume that follows its job exists in the store, whichever node holds it. */
  async checkExists(id: string, dataset: string): Promise<void> {
    if (!(await this.#owner(dataset))) {
      throw new CsiError(Code.NOT_FOUND, `Volume "${id}" not found`);
    }
  }

  /**
   * What the follow volume is, as its settings in the store say: a zvol holding this, or a ZFS
   * dataset (undefined).
   * @throws {CsiError} NOT_FOUND when the store has no such volume
   */
  async contentOf(id: string, dataset: string): Promise<ZvolContent | undefined> {
    const r = await this.#owner(dataset);
    if (!r) throw new CsiError(Code.NOT_FOUND, `Volume "${id}" not found`);
    return r.settings.zvol?.content;
  }

  async get(id: string, dataset: string): Promise<unknown> {
    const r = await this.#owner(dataset);
    if (!r) throw new CsiError(Code.NOT_FOUND, `Volume "${id}" not found`);
    return this.entry(r);
  }

  /**
   * ControllerExpandVolume of a follow volume: its size grows in the store (src/follow/resize.ts);
   * the holder, if a node holds it, grows its copy at NodeExpandVolume, any other copy at its
   * next stage.
   * @throws {CsiError} NOT_FOUND when the store has no such volume; OUT_OF_RANGE for a shrink
   */
  async expand(id: string, dataset: string, capacity: Capacity): Promise<unknown> {
    const follow = this.#store(id);
    const name = this.#c.nameOf(dataset);
    const key = encodeComponent("Volume name", name);
    const done = await withLock(
      this.#c.d.locks,
      [`follow:${name}`],
      () => resizeFollowVolume(follow.store, key, id, capacity),
    );
    if (done.changed) {
      this.#c.d.log.info("follow volume sized in the store", {
        volumeId: id,
        capacityBytes: done.capacityBytes,
        held: done.held,
      });
    }
    return {
      capacity_bytes: String(
        done.capacityBytes || Math.max(capacity.requiredBytes, capacity.limitBytes),
      ),
      // The holder's copy grows by NodeExpandVolume; a released volume's copies at their stage.
      node_expansion_required: done.held,
    };
  }

  /**
   * CreateSnapshot of a follow volume: its last copy in the store, pinned (src/follow/snapshots.ts).
   * @throws {CsiError} FAILED_PRECONDITION without a store, INVALID_ARGUMENT for store = "false"
   */
  async snapshot(req: SnapshotRequest): Promise<unknown> {
    const { sourceId, requested } = req;
    const volumeName = this.#c.nameOf(req.dataset);
    const local = req.parameters?.store === "false";
    const snapshots = this.#snapshots;
    if (!snapshots || local) {
      throw new CsiError(
        snapshots ? Code.INVALID_ARGUMENT : Code.FAILED_PRECONDITION,
        `Volume "${sourceId}" follows its job: its snapshots are its copies in the store` +
          (snapshots ? `, so snapshot parameter store cannot be "false"` : `, and this plugin ` +
            `has none: start it with --store`),
      );
    }
    const m = await withLock(
      this.#c.d.locks,
      [`follow:${volumeName}`, `snapshot:${requested}`],
      () => snapshots.create(volumeName, sourceId, requested),
    );
    return {
      snapshot: this.#c.storedMessage({
        id: storedSnapshotId(m.volume, m.guid),
        volume: m.volume,
        node: m.node,
        // The copy's own time: the snapshot holds the volume as it was then.
        creation: Math.floor(Date.parse(m.createdAt) / 1000) || 0,
        sizeBytes: await snapshots.sizeOf(m),
        ready: true,
      }, followVolumeId(m.volume)),
    };
  }

  /**
   * DeleteSnapshot of a stored snapshot, when it is a follow volume's (never its head's chain,
   * which its next stage receives): the outcome, or undefined when it is not a follow volume's.
   */
  async deleteSnapshot(ref: StoredSnapshotRef): Promise<string | undefined> {
    return await this.#snapshots?.delete(ref);
  }

  /**
   * DeleteVolume of a follow volume, in the store: refused while a node holds it.
   * @throws {CsiError} FAILED_PRECONDITION naming the holder, or when there is no store
   */
  async #deleteInStore(id: string, dataset: string): Promise<void> {
    const follow = this.#store(id);
    const name = this.#c.nameOf(dataset);
    await withLock(
      this.#c.d.locks,
      [`follow:${name}`],
      () => deleteFollowVolume(follow.store, name, Date.now()),
    );
  }

  /** A follow volume's ListVolumes entry (and ControllerGetVolume answer), from its owner. */
  entry(r: OwnerRecord): Record<string, unknown> {
    return {
      volume: followVolumeMessage(r),
      status: followVolumeStatus(r, Date.now(), this.#c.d.follow?.standby?.state(r.volume)),
    };
  }

  /**
   * The follow volumes the store lists; none when the store cannot be reached (logged): this
   * node's own volumes are listed all the same.
   */
  async marked(store: Store): Promise<{ name: string; volumeKey: string }[]> {
    try {
      return await listMarked(store, followVolumesPrefix());
    } catch (err) {
      if (!(err instanceof StoreError)) throw err;
      this.#c.d.log.warn("ListVolumes could not list the volumes that follow their job", {
        store: store.description,
        error: err,
      });
      return [];
    }
  }

  /** This node's copies of follow volumes (datasets marked with a follow generation). */
  async copies(): Promise<Set<string>> {
    const tree = await this.#c.d.zfs.getTree(this.#c.d.config.parentDataset, 1, [
      FOLLOW_GENERATION_PROPERTY,
    ]);
    return new Set(
      [...tree ?? []].filter(([, p]) => p.get(FOLLOW_GENERATION_PROPERTY)?.source === "local")
        .map(([dataset]) => dataset),
    );
  }

  /**
   * The ListVolumes entry of the follow volume whose owner object is `volumeKey`; undefined for
   * a marker left by a crash, or of a volume deleted meanwhile (not a volume).
   */
  async listEntry(id: string, volumeKey: string): Promise<Record<string, unknown> | undefined> {
    let r: OwnerRecord | undefined;
    try {
      r = (await readOwner(this.#c.d.follow!.store, volumeKey))?.record;
    } catch (err) {
      return unreadableFollowEntry(id, err);
    }
    return r && r.state !== "deleted" ? this.entry(r) : undefined;
  }

  /**
   * The follow deps (the store), for an existing follow volume `id`.
   * @throws {CsiError} FAILED_PRECONDITION when this plugin has no store
   */
  #store(id: string): NonNullable<ControllerDeps["follow"]> {
    const follow = this.#c.d.follow;
    if (follow) return follow;
    throw new CsiError(
      Code.FAILED_PRECONDITION,
      `Volume "${id}" follows its job through a store, and this plugin has none: start it ` +
        `with --store`,
    );
  }

  /** The owner record of the follow volume of `dataset`; undefined when none or deleted. */
  async #owner(dataset: string): Promise<OwnerRecord | undefined> {
    const follow = this.#c.d.follow;
    if (!follow) return undefined;
    const r = (await readOwner(
      follow.store,
      encodeComponent("Volume name", this.#c.nameOf(dataset)),
    ))?.record;
    return r && r.state !== "deleted" ? r : undefined;
  }
}

/** A follow volume whose owner object cannot be read now: listed, its condition saying why. */
function unreadableFollowEntry(id: string, err: unknown): Record<string, unknown> {
  if (!(err instanceof StoreError || err instanceof CsiError)) throw err;
  return {
    volume: { volume_id: id, capacity_bytes: "0", volume_context: {} },
    status: {
      published_node_ids: [],
      volume_condition: {
        abnormal: true,
        message: `Where this volume is cannot be read from the store now: ${err.message}`,
      },
    },
  };
}

/**
 * What differs between the follow kinds' CreateVolume (FollowKind.createShaped): a ZFS
 * dataset's (here) and a zvol's (follow_zvol.ts). Every method may refuse with a CsiError,
 * before anything is written.
 */
export interface FollowShape {
  /** The parameters parseParameters checks, once the kind took out its own. */
  readonly rest: Record<string, string>;
  /** What the answer's volume_context says (a zvol's fs_type), also logged. */
  readonly context: Record<string, string>;
  /**
   * The size asked for, checked, from the capacity range (`fromSnapshot`: the volume is made
   * from a stored snapshot); 0: none (the snapshot's own size, or unlimited).
   */
  size(capacity: Capacity, params: VolumeParameters, fromSnapshot: boolean): number;
  /** The record's `org.zfs-csi:parameters`, by which a repeated CreateVolume is known. */
  canonical(params: VolumeParameters): string;
  /** Refuses what cannot be given to a volume made from a stored snapshot. */
  checkSource?(): void;
  /** Refuses a stored snapshot this volume cannot be made from, before it is copied. */
  checkSeed(id: string, snapshot: SnapshotManifest, asked: number): void;
  /** The settings every node makes its copy with, for a volume of `size` bytes (0: unlimited). */
  settings(props: Record<string, string>, params: VolumeParameters, size: number): FollowSettings;
}

/** A follow volume that is a ZFS dataset: refquota, quota and refreservation by its size. */
function datasetShape(c: KindCommon, rest: Record<string, string>): Promise<FollowShape> {
  return Promise.resolve({
    rest,
    context: {},
    size(capacity, params) {
      let size = capacity.requiredBytes > 0 ? capacity.requiredBytes : capacity.limitBytes;
      if (size > 0) size = Math.max(size, MIN_VOLUME_BYTES);
      checkSizes(params, size);
      return size;
    },
    canonical: (params) => params.canonical,
    checkSeed(id, snapshot) {
      if (snapshot.zvol) {
        throw new CsiError(
          Code.INVALID_ARGUMENT,
          `Snapshot "${id}" is of a zvol holding ${snapshot.zvol.content}: a volume that ` +
            `follows its job made from it is a zvol too (ask for ${
              snapshot.zvol.content === "block"
                ? "a block capability"
                : `fs_type "${snapshot.zvol.content}"`
            })`,
        );
      }
    },
    settings(props, params, size) {
      const all = { ...props };
      if (size > 0) all.refquota = String(size);
      c.sizeProps(all, params, size);
      return { capacityBytes: size, properties: all };
    },
  });
}
