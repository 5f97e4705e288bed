/**
 * The CSI Controller service: create, delete, clone, snapshot and grow volumes, all on this
 * node's parent dataset. Every handler reads the current state from zfs first and then acts,
 * so a repeated call answers as the first did and nothing is kept in memory.
 */

import type { Config } from "../config.ts";
import { Code, CsiError, ZfsError } from "../errors.ts";
import { type KeyedLock, withLock } from "../lock.ts";
import type { Logger } from "../log.ts";
import type { Mounter } from "../mount/mounter.ts";
import {
  followVolumeId,
  type IdScope,
  qualifiedSnapshotId,
  qualifiedVolumeId,
  resolveSnapshot,
  resolveVolume,
  snapshotIdOf,
  volumeIdFor,
} from "../zfs/ids.ts";
import {
  byteLength,
  childDataset,
  cloneSnapshotComponent,
  encodeComponent,
  encodeName,
  MANAGED_PROPERTY,
  MANAGED_VALUE,
  MAX_DATASET_NAME,
  NAME_PROPERTY,
  STAGED_PROPERTY,
  volumeForDataset,
} from "../zfs/names.ts";
import { hasOwnMarker, parseBytes, type PropertyMap } from "../zfs/parse.ts";
import type { Zfs } from "../zfs/zfs.ts";
import {
  CATALOG_PROPERTIES,
  PARAMETERS_PROPERTY,
  readCatalog,
  type SnapshotRecord,
  SOURCE_PROPERTY,
  type VolumeRecord,
  volumeRecord,
} from "./catalog.ts";
import { CONTEXT_KEYS, parseVolumeContext } from "./context.ts";
import { checkOwned } from "./datasets.ts";
import { type HealthChecker, storageProblem } from "./health.ts";
import { paginate } from "./paging.ts";
import {
  BACKUP_PARAMETERS,
  checkSizes,
  parametersRefusal,
  parseParameters,
  sizeOf,
  type VolumeParameters,
  ZFS_PARAMETERS,
} from "./parameters.ts";
import { checkRecordedName, checkRetry } from "./tenancy.ts";
import { obstacleMessage } from "./subtree.ts";
import { planSize } from "./sizing.ts";
import { checkRequisite, nodeIsIn } from "./topology.ts";
import type { Trash } from "./trash.ts";
import { type StoredEntry, StoredSnapshots } from "./stored_snapshots.ts";
import {
  isStoredSnapshotId,
  parseStoredSnapshotId,
  storedSnapshotId,
  type StoredSnapshotRef,
} from "../store/snapshot_ids.ts";
import type { BackupScheduler } from "../replicate/scheduler.ts";
import {
  BACKUP_INTERVAL_PROPERTY,
  BACKUP_KEEP_PROPERTY,
  STORE_UID_PROPERTY,
} from "../replicate/backup.ts";
import { formatKeepPolicy } from "../store/policy.ts";
import { type Store, StoreError } from "../store/store.ts";
import {
  createFollowVolume,
  DEFAULT_FOLLOW_INTERVAL_SECONDS,
  deleteFollowVolume,
  splitFollow,
} from "../follow/volume.ts";
import { type OwnerRecord, readOwner } from "../follow/owner.ts";
import { FOLLOW_GENERATION_PROPERTY } from "../follow/copy.ts";
import { followVolumesPrefix, listMarked } from "../follow/markers.ts";
import { followTopologies, splitStandbys } from "../follow/placement.ts";
import { resizeFollowVolume } from "../follow/resize.ts";
import { FollowSnapshots } from "../follow/snapshots.ts";
import { seedFromSnapshot } from "../follow/seed.ts";
import type { StandbyState } from "../follow/standby.ts";
import { followVolumeMessage, followVolumeStatus } from "../follow/where.ts";
import type { PropertyList } from "../zfs/args.ts";
import type {
  ControllerExpandVolumeRequest,
  ControllerGetVolumeRequest,
  CreateSnapshotRequest,
  CreateVolumeRequest,
  DeleteSnapshotRequest,
  DeleteVolumeRequest,
  GetCapacityRequest,
  ListSnapshotsRequest,
  ListVolumesRequest,
  ValidateVolumeCapabilitiesRequest,
  VolumeCapability,
  VolumeContentSource,
} from "./types.ts";
import { type Capacity, checkCapability, checkCapacity, required } from "./validate.ts";
import { fittedSnapshotName, fittedVolumeName, isFormOf } from "../zfs/fit.ts";
import { MIN_VOLUME_BYTES } from "../size.ts";

/**
 * Controller capabilities; fixed for the life of the process. No PUBLISH_UNPUBLISH_VOLUME:
 * attaching a node-local dataset is a no-op, and the capability would cost a serialized
 * server round trip per claim in Nomad.
 */
export const CONTROLLER_CAPABILITIES = [
  "CREATE_DELETE_VOLUME",
  "CREATE_DELETE_SNAPSHOT",
  "LIST_SNAPSHOTS",
  "CLONE_VOLUME",
  "EXPAND_VOLUME",
  "LIST_VOLUMES",
  "GET_CAPACITY",
  "GET_VOLUME",
  "VOLUME_CONDITION",
] as const;

// Smaller requests get this much (CSI lets a volume be larger than required_bytes).
export { MIN_VOLUME_BYTES };

/** What the controller service works with. */
export interface ControllerDeps {
  readonly config: Config;
  readonly zfs: Zfs;
  readonly mounter: Mounter;
  readonly health: HealthChecker;
  readonly locks: KeyedLock;
  readonly trash: Trash;
  readonly log: Logger;
  /** The store's snapshots and restores, with `--store`. */
  readonly stored?: StoredSnapshots;
  /** The backup scheduler, with `--store`: its failures show as the volume's condition. */
  readonly scheduler?: BackupScheduler;
  /** Volumes that follow their job (src/follow/), with `--store`. */
  readonly follow?: {
    readonly store: Store;
    readonly ttlSeconds: number;
    /** This node's standby copies (src/follow/standby.ts), shown in their volumes' condition. */
    readonly standby?: { state(name: string): StandbyState | undefined };
    /**
     * Whether the store enforces conditional writes (src/store/conditional.ts): a new follow
     * volume is refused, before anything is written, on a store that does not.
     */
    readonly conditionalWrites?: { require(): Promise<void> };
  };
}

/** A checked content source. */
type Source =
  | {
    readonly kind: "snapshot";
    readonly id: string;
    readonly snapshot: string;
    readonly dataset: string;
  }
  | { readonly kind: "volume"; readonly id: string; readonly dataset: string }
  | { readonly kind: "stored"; readonly id: string; readonly ref: StoredSnapshotRef };

/** Properties read of a volume before acting on it. */
const VOLUME_STATE = [
  ...CATALOG_PROPERTIES,
  "quota",
  "refreservation",
  "mountpoint",
  // What tells a retried CreateVolume from a second volume of the same name (tenancy.ts).
  NAME_PROPERTY,
  STAGED_PROPERTY,
] as const;

/** The CSI Controller service handlers. */
export class ControllerService {
  readonly #d: ControllerDeps;
  readonly #scope: IdScope;
  /** Properties this node's zfs is known to support (asked once, then remembered). */
  readonly #supported = new Set<string>();
  /** Snapshots of follow volumes: their last copy in the store, pinned (src/follow/). */
  readonly #followSnapshots: FollowSnapshots | undefined;

  constructor(deps: ControllerDeps) {
    this.#d = deps;
    this.#followSnapshots = deps.follow && new FollowSnapshots(deps.follow.store, deps.log);
    this.#scope = {
      parentDataset: deps.config.parentDataset,
      nodeId: deps.config.nodeId,
      nodeLocal: deps.config.nodeLocalPluginId,
    };
  }

  ControllerGetCapabilities(): Promise<unknown> {
    return Promise.resolve({
      capabilities: CONTROLLER_CAPABILITIES.map((type) => ({ rpc: { type } })),
    });
  }

  async CreateVolume(req: CreateVolumeRequest): Promise<unknown> {
    const requested = required("name", req.name);
    const { follow, rest: parameters } = splitFollow(req.parameters);
    if (follow) return await this.#createFollow(req, requested, parameters);
    // The name as used: the requested one, or its shortened form when it does not fit.
    const name = fittedVolumeName(requested, this.#d.config.parentDataset, this.#d.config.nodeId);
    const id = volumeIdFor(name, this.#scope);
    const dataset = childDataset(this.#d.config.parentDataset, "Volume name", name);
    checkCapabilities(req.volume_capabilities);
    const capacity = checkCapacity(req.capacity_range);
    const params = parseParameters(parameters, this.#d.config.parameterPolicy, {
      restoring: isStoredSnapshotId(req.volume_content_source?.snapshot?.snapshot_id ?? ""),
    });
    checkRequisite(req.accessibility_requirements, this.#d.config.topology, this.#d.config.nodeId);
    let size = capacity.requiredBytes > 0 ? capacity.requiredBytes : capacity.limitBytes;
    if (size > 0) size = Math.max(size, MIN_VOLUME_BYTES);
    if (capacity.limitBytes > 0 && size > capacity.limitBytes) {
      throw new CsiError(
        Code.OUT_OF_RANGE,
        `capacity_range.limit_bytes ${capacity.limitBytes} is below the smallest volume, ` +
          `${MIN_VOLUME_BYTES} bytes`,
      );
    }
    const source = this.#source(req.volume_content_source);
    checkSizes(params, size);
    // A stored snapshot is recorded as a snapshot source, as Nomad named it.
    const sourceText = source
      ? `${source.kind === "stored" ? "snapshot" : source.kind}:${source.id}`
      : "";
    const want = { name: requested, capacity, params, source: sourceText };
    const keys = source && source.kind !== "stored" ? [dataset, source.dataset] : [dataset];
    return await withLock(this.#d.locks, keys, async () => {
      // A plain create goes straight to `zfs create`: zfs refuses a name that exists without
      // changing it, and the refusal leads to the repeat check below, so a new volume costs one
      // process. A clone looks first, since its hidden snapshot would be a change.
      if (source) {
        const existing = await this.#d.zfs.getProperties(dataset, VOLUME_STATE);
        if (existing) return this.#answerRepeat(id, dataset, existing, want);
      }
      await this.#checkSupported(params);
      this.#checkBackupParameters(params);
      const props: Record<string, string> = {
        ...this.#backupProps(params),
        ...params.properties,
        [MANAGED_PROPERTY]: MANAGED_VALUE,
        // The name in full: a repeat compares it, and a shortened dataset name keeps it readable.
        [NAME_PROPERTY]: requested,
        [PARAMETERS_PROPERTY]: params.canonical,
        ...(source ? { [SOURCE_PROPERTY]: sourceText } : {}),
      };
      let refquota = size;
      try {
        if (!source) {
          if (size > 0) props.refquota = String(size);
          this.#sizeProps(props, params, size);
          await this.#d.zfs.create(dataset, props);
        } else if (source.kind === "stored") {
          refquota = await this.#restoreFrom(source.ref, dataset, props, params, size);
        } else {
          refquota = await this.#cloneFrom(source, dataset, props, params, size);
        }
      } catch (err) {
        if (!(err instanceof ZfsError && err.kind === "exists")) throw err;
        // A repeat, or a dataset made by someone else: judge it like any repeat.
        const made = await this.#d.zfs.getProperties(dataset, VOLUME_STATE);
        if (!made) throw new CsiError(Code.INTERNAL, `Dataset "${dataset}" vanished`);
        return this.#answerRepeat(id, dataset, made, want);
      }
      this.#d.log.info("volume created", { volumeId: id, dataset, refquota });
      // Everything the answer needs was just set with the create: no need to read it back.
      return {
        volume: this.#volumeMessage(id, {
          dataset,
          name,
          refquota,
          parameters: params.canonical,
          source: sourceText,
        }),
      };
    });
  }

  async DeleteVolume(req: DeleteVolumeRequest): Promise<unknown> {
    const { id, dataset, follow } = resolveVolume(
      required("volume_id", req.volume_id),
      this.#scope,
      { mutating: true, follow: true },
    );
    // A follow volume goes in the store first (refused while a node holds it); this node's
    // copy, if it has one, is then set aside like any volume.
    if (follow) await this.#deleteFollow(id, dataset);
    return await withLock(this.#d.locks, [dataset], async () => {
      // Both reads at once: a delete waits for one process fewer (a repeat for a volume already
      // gone reads the mount table in vain, which is cheap). The dataset's whole subtree is
      // read: nothing in it that the plugin did not make is ever destroyed.
      const [found, table] = await Promise.all([
        this.#d.trash.inspect(dataset),
        this.#d.mounter.table(),
      ]);
      if (!found) return {};
      const { props, check } = found;
      checkOwned(dataset, props);
      const mountpoint = props.get("mountpoint")?.value ?? "";
      // Judged by the filesystem type of the ZFS that runs here: a user's FUSE mount named
      // like the dataset never holds a volume "in use".
      const judge = this.#d.mounter.judge();
      const users = table
        .filter((e) => judge.isMountOf(e, dataset) && e.mountPoint !== mountpoint)
        .map((e) => e.mountPoint);
      if (users.length > 0) {
        throw new CsiError(
          Code.FAILED_PRECONDITION,
          `Volume "${id}" is in use: mounted at ${users.map((u) => `"${u}"`).join(", ")}; ` +
            `stop the jobs using it first`,
        );
      }
      const snapshots = check.csiSnapshots
        .map((n) => snapshotIdOf(n, this.#scope))
        .filter((s): s is string => s !== undefined);
      if (snapshots.length > 0) {
        throw new CsiError(
          Code.FAILED_PRECONDITION,
          `Volume "${id}" has snapshots (${snapshots.map((s) => `"${s}"`).join(", ")}); ` +
            `delete them first (nomad volume snapshot delete)`,
        );
      }
      if (check.obstacles.length > 0) {
        throw new CsiError(
          Code.FAILED_PRECONDITION,
          obstacleMessage(`Volume "${id}" is not deleted`, dataset, check.obstacles),
        );
      }
      await this.#keepBackups(id, dataset);
      await this.#d.trash.removeVolume(dataset, found);
      return {};
    });
  }

  async ValidateVolumeCapabilities(req: ValidateVolumeCapabilitiesRequest): Promise<unknown> {
    const { id, dataset, follow } = resolveVolume(
      required("volume_id", req.volume_id),
      this.#scope,
      { follow: true },
    );
    const caps = requiredCapabilities(req.volume_capabilities);
    parseVolumeContext(splitFollow(req.volume_context).rest);
    if (follow) {
      // A volume that follows its job exists in the store, whichever node holds it.
      const owner = this.#d.follow &&
        await readOwner(
          this.#d.follow.store,
          encodeComponent("Volume name", this.#nameOf(dataset)),
        );
      if (!owner || owner.record.state === "deleted") {
        throw new CsiError(Code.NOT_FOUND, `Volume "${id}" not found`);
      }
    } else {
      const props = await this.#d.zfs.getProperties(dataset, VOLUME_STATE);
      if (!props) throw new CsiError(Code.NOT_FOUND, `Volume "${id}" not found`);
      checkOwned(dataset, props);
    }
    for (const cap of caps) {
      try {
        checkCapability(cap);
      } catch (err) {
        if (err instanceof CsiError) return { message: err.message };
        throw err;
      }
    }
    const refusal = parametersRefusal(req.parameters, this.#d.config.parameterPolicy);
    if (refusal !== undefined) return { message: refusal };
    return {
      confirmed: {
        volume_context: req.volume_context ?? {},
        // Rebuilt rather than echoed: decoded messages carry oneof names that do not encode.
        volume_capabilities: caps.map((cap) => ({
          access_mode: { mode: cap.access_mode?.mode },
          mount: {
            fs_type: cap.mount?.fs_type ?? "",
            mount_flags: cap.mount?.mount_flags ?? [],
            volume_mount_group: cap.mount?.volume_mount_group ?? "",
          },
        })),
        parameters: req.parameters ?? {},
      },
    };
  }

  async ListVolumes(req: ListVolumesRequest): Promise<unknown> {
    const catalog = await readCatalog(this.#d.zfs, this.#d.config.parentDataset, {
      snapshots: false,
    });
    // Volumes that follow their job are listed once each from the store (`<name>@*`), not as
    // this node's copies of them.
    const follow = this.#d.follow;
    const copies = follow ? await this.#followCopies() : new Set<string>();
    const marked = follow ? await this.#listFollow(follow.store) : [];
    const items: ({ id: string; v: VolumeRecord } | { id: string; volumeKey: string })[] = [
      ...catalog.volumes.filter((v) => !copies.has(v.dataset)).map((v) => ({
        id: this.#volumeId(v),
        v,
      })),
      ...marked.map((m) => ({ id: followVolumeId(m.name), volumeKey: m.volumeKey })),
    ];
    const page = paginate(items, (e) => e.id, {
      maxEntries: req.max_entries,
      startingToken: req.starting_token,
    });
    const entries: unknown[] = [];
    // One owner read per follow volume on the page, and only those.
    for (const e of page.entries) {
      if ("v" in e) {
        entries.push({ volume: this.#volumeMessage(e.id, e.v), status: this.#status(e.v.dataset) });
        continue;
      }
      let r: OwnerRecord | undefined;
      try {
        r = (await readOwner(follow!.store, e.volumeKey))?.record;
      } catch (err) {
        entries.push(unreadableFollowEntry(e.id, err));
        continue;
      }
      // A marker left by a crash, or of a volume deleted meanwhile: not a volume.
      if (r && r.state !== "deleted") entries.push(this.#followEntry(r));
    }
    return { entries, next_token: page.nextToken };
  }

  async ControllerGetVolume(req: ControllerGetVolumeRequest): Promise<unknown> {
    const { id, dataset, follow } = resolveVolume(
      required("volume_id", req.volume_id),
      this.#scope,
      { follow: true },
    );
    if (follow) {
      const r = this.#d.follow &&
        (await readOwner(
          this.#d.follow.store,
          encodeComponent("Volume name", this.#nameOf(dataset)),
        ))?.record;
      if (!r || r.state === "deleted") {
        throw new CsiError(Code.NOT_FOUND, `Volume "${id}" not found`);
      }
      return this.#followEntry(r);
    }
    const props = await this.#d.zfs.getProperties(dataset, VOLUME_STATE);
    const record = props && volumeRecord(this.#d.config.parentDataset, dataset, props);
    if (!record) throw new CsiError(Code.NOT_FOUND, `Volume "${id}" not found`);
    return {
      volume: this.#volumeMessage(this.#volumeId(record), record),
      status: this.#status(dataset),
    };
  }

  async GetCapacity(req: GetCapacityRequest): Promise<unknown> {
    // The size limits are Int64Value wrappers.
    const none = {
      available_capacity: "0",
      minimum_volume_size: { value: String(MIN_VOLUME_BYTES) },
    };
    for (const cap of req.volume_capabilities ?? []) {
      try {
        checkCapability(cap);
      } catch {
        return none;
      }
    }
    parseParameters(req.parameters, this.#d.config.parameterPolicy);
    if (req.accessible_topology && !nodeIsIn(req.accessible_topology, this.#d.config.topology)) {
      return none;
    }
    const props = await this.#d.zfs.getProperties(this.#d.config.parentDataset, ["available"]);
    if (!props) {
      throw new CsiError(
        Code.FAILED_PRECONDITION,
        `Parent dataset "${this.#d.config.parentDataset}" does not exist`,
      );
    }
    const available = parseBytes(props.get("available")?.value ?? "0");
    return {
      available_capacity: String(available),
      maximum_volume_size: { value: String(available) },
      minimum_volume_size: { value: String(MIN_VOLUME_BYTES) },
    };
  }

  async ControllerExpandVolume(req: ControllerExpandVolumeRequest): Promise<unknown> {
    const { id, dataset, follow } = resolveVolume(
      required("volume_id", req.volume_id),
      this.#scope,
      { mutating: true, follow: true },
    );
    if (!req.capacity_range) {
      throw new CsiError(Code.INVALID_ARGUMENT, "capacity_range is required");
    }
    const capacity = checkCapacity(req.capacity_range);
    if (req.volume_capability) checkCapability(req.volume_capability);
    if (follow) return await this.#expandFollow(id, dataset, capacity);
    return await withLock(this.#d.locks, [dataset], async () => {
      const props = await this.#d.zfs.getProperties(dataset, VOLUME_STATE);
      if (!props) throw new CsiError(Code.NOT_FOUND, `Volume "${id}" not found`);
      checkOwned(dataset, props);
      // Reconciled on every call, "already at size" too: a call that failed half way (no room
      // for the refreservation) is finished by its retry, and a repeat sets nothing.
      const plan = planSize(id, props, capacity);
      if (plan.changes.length > 0) {
        await this.#d.zfs.setProperties(dataset, plan.changes);
        this.#d.log.info("volume sized", {
          volumeId: id,
          set: Object.fromEntries(plan.changes),
        });
      }
      return {
        // Unlimited already holds any size (as far as the pool has room).
        capacity_bytes: String(
          plan.refquota || Math.max(capacity.requiredBytes, capacity.limitBytes),
        ),
        // A refquota applies at once on every node: there is nothing for a node to do.
        node_expansion_required: false,
      };
    });
  }

  async CreateSnapshot(req: CreateSnapshotRequest): Promise<unknown> {
    const sourceId = required("source_volume_id", req.source_volume_id);
    const requested = required("name", req.name);
    encodeName("Snapshot name", requested);
    const toStore = this.#storeParameter(req.parameters);
    const { dataset, follow } = resolveVolume(sourceId, this.#scope, {
      mutating: true,
      follow: true,
    });
    const volumeName = this.#nameOf(dataset);
    if (follow) {
      const local = req.parameters?.store === "false";
      return await this.#snapshotFollow(sourceId, volumeName, requested, local);
    }
    // The name as used: its id and ZFS name fit their limits (fittedSnapshotName sees to both).
    const name = fittedSnapshotName(volumeName, dataset, requested, this.#d.config.nodeId);
    if (toStore) {
      const props = await this.#d.zfs.getProperties(dataset, ["type", MANAGED_PROPERTY]);
      if (!props) throw new CsiError(Code.NOT_FOUND, `Source volume "${sourceId}" not found`);
      checkOwned(dataset, props);
      const entry = await toStore.create(dataset, volumeName, requested, name);
      return { snapshot: this.#storedMessage(entry) };
    }
    const component = encodeComponent("Snapshot name", name);
    const snapshot = `${dataset}@${component}`;
    // Locked by the requested name: its shortened form can differ between volumes.
    return await withLock(this.#d.locks, [dataset, `snapshot:${requested}`], async () => {
      const catalog = await readCatalog(this.#d.zfs, this.#d.config.parentDataset, {
        snapshots: true,
      });
      if (!catalog.volumes.some((v) => v.dataset === dataset)) {
        const props = await this.#d.zfs.getProperties(dataset, ["type", MANAGED_PROPERTY]);
        if (props) checkOwned(dataset, props);
        throw new CsiError(Code.NOT_FOUND, `Source volume "${sourceId}" not found`);
      }
      // Names are unique across the node's volumes, in full or shortened form.
      const same = catalog.snapshots.find((s) =>
        s.dataset === dataset ? s.component === component : isFormOf(s.name, requested)
      );
      if (same && same.dataset !== dataset) {
        throw new CsiError(
          Code.ALREADY_EXISTS,
          `A snapshot named "${requested}" already exists, of another volume ` +
            `("${this.#volumeIdOfName(same.volumeName)}")`,
        );
      }
      if (same) return { snapshot: this.#snapshotMessage(same) };
      try {
        await this.#d.zfs.snapshot(snapshot);
      } catch (err) {
        if (!(err instanceof ZfsError && err.kind === "exists")) throw err;
      }
      const props = await this.#d.zfs.getProperties(snapshot, ["creation", "referenced"]);
      if (!props) {
        throw new CsiError(Code.INTERNAL, `Snapshot "${snapshot}" vanished after creation`);
      }
      this.#d.log.info("snapshot created", { snapshot });
      return {
        snapshot: this.#snapshotMessage({
          snapshot,
          dataset,
          volumeName,
          component,
          name,
          creation: Number(props.get("creation")?.value ?? "0") || 0,
          referenced: parseBytes(props.get("referenced")?.value ?? "0"),
        }),
      };
    });
  }

  async DeleteSnapshot(req: DeleteSnapshotRequest): Promise<unknown> {
    const id = required("snapshot_id", req.snapshot_id);
    if (isStoredSnapshotId(id)) {
      const stored = parseStoredSnapshotId(id);
      // An id this plugin could never have made names nothing: deleting nothing succeeds.
      if (!stored) return {};
      // A follow volume's: never its head's chain, which its next stage receives.
      const followed = await this.#followSnapshots?.delete(stored);
      if (followed !== undefined) {
        this.#d.log.info("follow volume's stored snapshot deleted", {
          snapshotId: id,
          outcome: followed,
        });
        return {};
      }
      await this.#storeFor(id).delete(stored);
      return {};
    }
    let ref;
    try {
      ref = resolveSnapshot(id, this.#scope, { mutating: true });
    } catch (err) {
      // An id this plugin could never have made names nothing: deleting nothing succeeds.
      if (err instanceof CsiError && err.code === Code.INVALID_ARGUMENT) return {};
      throw err;
    }
    const { dataset, component, snapshot } = ref;
    return await withLock(this.#d.locks, [dataset, `snapshot:${component}`], async () => {
      const tree = await this.#d.zfs.getTree(dataset, 1, ["type", MANAGED_PROPERTY]);
      const props = tree?.get(dataset);
      if (!tree || !props || !tree.has(snapshot)) return {};
      checkOwned(dataset, props);
      await this.#d.trash.removeSnapshot(snapshot);
      return {};
    });
  }

  async ListSnapshots(req: ListSnapshotsRequest): Promise<unknown> {
    const empty = { entries: [], next_token: "" };
    let wantSnapshot: string | undefined;
    let wantDataset: string | undefined;
    let wantFollow = false;
    const wantStored = req.snapshot_id && isStoredSnapshotId(req.snapshot_id)
      ? req.snapshot_id
      : undefined;
    try {
      if (req.snapshot_id && !wantStored) {
        wantSnapshot = resolveSnapshot(req.snapshot_id, this.#scope).snapshot;
      }
      if (req.source_volume_id) {
        const source = resolveVolume(req.source_volume_id, this.#scope, { follow: true });
        wantDataset = source.dataset;
        // A follow volume's snapshots are in the store only.
        wantFollow = source.follow === true;
      }
    } catch (err) {
      // Ids that cannot name a snapshot or volume here match nothing.
      if (err instanceof CsiError) return empty;
      throw err;
    }
    const catalog = wantStored || wantFollow ? { snapshots: [] } : await readCatalog(
      this.#d.zfs,
      this.#d.config.parentDataset,
      { snapshots: true },
    );
    const local = catalog.snapshots.filter((s) =>
      (wantSnapshot === undefined || s.snapshot === wantSnapshot) &&
      (wantDataset === undefined || s.dataset === wantDataset)
    ).map((s) => ({ id: this.#snapshotId(s), message: () => this.#snapshotMessage(s) }));
    const storedEntries = this.#d.stored && !wantSnapshot
      ? (await this.#d.stored.list(wantDataset && this.#nameOf(wantDataset)))
        .filter((e) => wantStored === undefined || e.id === wantStored)
      : [];
    // Stored snapshots of follow volumes name their source `<name>@*` (one listing).
    const follows = this.#d.follow && storedEntries.length > 0
      ? new Set((await this.#listFollow(this.#d.follow.store)).map((m) => m.name))
      : new Set<string>();
    const stored = storedEntries.map((e) => ({
      id: e.id,
      message: () =>
        this.#storedMessage(e, follows.has(e.volume) ? followVolumeId(e.volume) : undefined),
    }));
    const page = paginate([...local, ...stored], (e) => e.id, {
      maxEntries: req.max_entries,
      startingToken: req.starting_token,
    });
    return {
      entries: page.entries.map((e) => ({ snapshot: e.message() })),
      next_token: page.nextToken,
    };
  }

  /**
   * Answers a CreateVolume whose dataset exists: the same volume again, or ALREADY_EXISTS. It is
   * the same volume only if it fits the request and the request can still be a retry of the
   * create that made it (tenancy.ts).
   */
  #answerRepeat(
    id: string,
    dataset: string,
    props: PropertyMap,
    want: {
      /** The name as requested (not shortened). */
      name: string;
      capacity: { requiredBytes: number; limitBytes: number };
      params: VolumeParameters;
      /** `snapshot:<id>`, `volume:<id>` or "". */
      source: string;
    },
  ): unknown {
    const conflict = (why: string) =>
      new CsiError(Code.ALREADY_EXISTS, `Volume "${id}" already exists ${why}`);
    if (!hasOwnMarker(props, MANAGED_PROPERTY, MANAGED_VALUE)) {
      throw conflict(`as dataset "${dataset}", which zfs-csi does not manage`);
    }
    const record = volumeRecord(this.#d.config.parentDataset, dataset, props);
    if (!record) throw conflict(`as dataset "${dataset}", which is not a filesystem`);
    checkRecordedName(id, dataset, want.name, props);
    if (record.parameters !== want.params.canonical) {
      throw conflict(`with other parameters (${record.parameters})`);
    }
    if (record.source !== want.source) {
      throw conflict(`with another content source (${record.source || "none"})`);
    }
    const { requiredBytes, limitBytes } = want.capacity;
    const r = record.refquota;
    if (
      (requiredBytes > 0 && (r === 0 || r < requiredBytes)) ||
      (limitBytes > 0 && (r === 0 || r > limitBytes))
    ) {
      throw conflict(`with another capacity (${r === 0 ? "unlimited" : `${r} bytes`})`);
    }
    checkRetry(id, want.name, props, Math.floor(Date.now() / 1000));
    this.#d.log.info("CreateVolume repeated: answered with the volume it made", { volumeId: id });
    return { volume: this.#volumeMessage(id, record) };
  }

  /** Checks a content source and resolves it on this node. */
  #source(src: VolumeContentSource | null | undefined): Source | undefined {
    if (!src) return undefined;
    if (src.snapshot) {
      const id = required("volume_content_source.snapshot.snapshot_id", src.snapshot.snapshot_id);
      if (isStoredSnapshotId(id)) {
        const stored = parseStoredSnapshotId(id);
        if (!stored) throw new CsiError(Code.NOT_FOUND, `Snapshot "${id}" not found`);
        this.#storeFor(id);
        return { kind: "stored", id, ref: stored };
      }
      let ref;
      try {
        ref = resolveSnapshot(id, this.#scope, { mutating: true });
      } catch (err) {
        if (err instanceof CsiError && err.code === Code.INVALID_ARGUMENT) {
          throw new CsiError(Code.NOT_FOUND, `Snapshot "${id}" not found: ${err.message}`);
        }
        throw err;
      }
      return { kind: "snapshot", id, snapshot: ref.snapshot, dataset: ref.dataset };
    }
    if (src.volume) {
      const id = required("volume_content_source.volume.volume_id", src.volume.volume_id);
      let dataset;
      try {
        dataset = resolveVolume(id, this.#scope, { mutating: true }).dataset;
      } catch (err) {
        if (err instanceof CsiError && err.code === Code.INVALID_ARGUMENT) {
          throw new CsiError(Code.NOT_FOUND, `Volume "${id}" not found: ${err.message}`);
        }
        throw err;
      }
      return { kind: "volume", id, dataset };
    }
    throw new CsiError(
      Code.INVALID_ARGUMENT,
      "volume_content_source names neither a snapshot nor a volume",
    );
  }

  /**
   * Clones the source into `dataset`; returns the refquota set (the source's when no size was
   * asked for). A volume source is cloned through a hidden snapshot that goes away with the
   * clone; one left by an attempt that failed before cloning is purged after an hour.
   */
  async #cloneFrom(
    source: Exclude<Source, { readonly kind: "stored" }>,
    dataset: string,
    props: Record<string, string>,
    params: VolumeParameters,
    size: number,
  ): Promise<number> {
    const src = await this.#d.zfs.getProperties(source.dataset, VOLUME_STATE);
    const what = source.kind === "snapshot" ? "Snapshot" : "Volume";
    if (!src) throw new CsiError(Code.NOT_FOUND, `${what} "${source.id}" not found`);
    checkOwned(source.dataset, src);
    let snapshot: string;
    let referenced: number;
    if (source.kind === "snapshot") {
      snapshot = source.snapshot;
      const snap = await this.#d.zfs.getProperties(snapshot, ["referenced"]);
      if (!snap) throw new CsiError(Code.NOT_FOUND, `Snapshot "${source.id}" not found`);
      referenced = parseBytes(snap.get("referenced")?.value ?? "0");
    } else {
      const now = Math.floor(Date.now() / 1000);
      snapshot = `${source.dataset}@${cloneSnapshotComponent(dataset, now)}`;
      if (byteLength(snapshot) > MAX_DATASET_NAME) {
        throw new CsiError(
          Code.INVALID_ARGUMENT,
          `Volume "${source.id}" has too long a name to clone from: its snapshot "${snapshot}" ` +
            `would exceed ${MAX_DATASET_NAME} bytes; snapshot it with a short name and create from that`,
        );
      }
      referenced = parseBytes(src.get("referenced")?.value ?? "0");
    }
    const refquota = size > 0 ? size : parseBytes(src.get("refquota")?.value ?? "0");
    if (refquota > 0 && refquota < referenced) {
      throw new CsiError(
        Code.OUT_OF_RANGE,
        `The source holds ${referenced} bytes, more than the requested capacity of ${refquota} bytes`,
      );
    }
    checkSizes(params, refquota);
    if (refquota > 0) props.refquota = String(refquota);
    this.#sizeProps(props, params, refquota);
    if (source.kind === "volume") {
      try {
        await this.#d.zfs.snapshot(snapshot);
      } catch (err) {
        // Made within this second by an attempt that failed after it: as fresh, so use it.
        if (!(err instanceof ZfsError && err.kind === "exists")) throw err;
      }
    }
    await this.#d.zfs.clone(snapshot, dataset, props);
    if (source.kind === "volume") {
      try {
        // Marked now, gone with the clone: ZFS destroys it when no clone needs it any more.
        await this.#d.zfs.destroy(snapshot, { deferred: true });
      } catch (err) {
        this.#d.log.warn("could not mark a clone's snapshot for deferred destroy", {
          snapshot,
          error: err,
        });
      }
    }
    return refquota;
  }

  /**
   * Restores the stored snapshot into `dataset` (stored_snapshots.ts); returns the refquota
   * set: the requested size, else the size the volume had when the snapshot was taken.
   */
  async #restoreFrom(
    ref: StoredSnapshotRef,
    dataset: string,
    props: Record<string, string>,
    params: VolumeParameters,
    size: number,
  ): Promise<number> {
    const createOnly = Object.keys(params.properties).filter((k) =>
      Object.hasOwn(ZFS_PARAMETERS, k) && ZFS_PARAMETERS[k]!.createOnly
    );
    if (createOnly.length > 0) {
      throw new CsiError(
        Code.INVALID_ARGUMENT,
        `Parameter ${createOnly.map((k) => `"${k}"`).join(", ")} cannot be given to a volume ` +
          `restored from the store: it is set when a dataset is made, and the restored one keeps ` +
          `the value of its backup`,
      );
    }
    const refquotaOf = (capacity: number) => (size > 0 ? size : capacity);
    const manifest = await this.#storeFor(ref.id).restore(ref, dataset, (m) => {
      checkRestoredKey(ref.id, m.raw, params);
      const refquota = refquotaOf(m.capacityBytes);
      const all = { ...props };
      // Restored under its own name (a delete undone), the volume continues its history in the
      // store: the same record, and increments on the snapshots just received.
      if (m.volume === this.#nameOf(dataset)) all[STORE_UID_PROPERTY] = m.volumeUid;
      if (refquota > 0) all.refquota = String(refquota);
      this.#sizeProps(all, params, refquota);
      return Object.entries(all) as PropertyList;
    });
    if (manifest.volume === this.#nameOf(dataset)) {
      try {
        await this.#storeFor(ref.id).volumeRestored(manifest.volume, manifest.volumeUid);
      } catch (err) {
        if (!(err instanceof StoreError)) throw err;
        // The next backup clears the mark too; until then the pruner waits out the retention.
        this.#d.log.warn("could not clear the restored volume's deletion mark in the store", {
          dataset,
          error: err,
        });
      }
    }
    return refquotaOf(manifest.capacityBytes);
  }

  /** The store's snapshots, or FAILED_PRECONDITION naming `id` when there is no store. */
  #storeFor(id: string): StoredSnapshots {
    if (this.#d.stored) return this.#d.stored;
    throw new CsiError(
      Code.FAILED_PRECONDITION,
      `Snapshot "${id}" is kept in a store, and this plugin has none (start it with --store)`,
    );
  }

  /**
   * Whether CreateSnapshot puts the snapshot in the store: parameter `store` ("true" or
   * "false"), by default whenever the plugin has a store.
   */
  #storeParameter(
    params: Readonly<Record<string, string>> | null | undefined,
  ): StoredSnapshots | undefined {
    const keys = Object.keys(params ?? {});
    const unknown = keys.filter((k) => k !== "store");
    if (unknown.length > 0) {
      throw new CsiError(
        Code.INVALID_ARGUMENT,
        `Snapshot parameter ${unknown.map((k) => `"${k}"`).join(", ")} is not supported ` +
          `(only "store": "true" or "false")`,
      );
    }
    const value = params?.store;
    if (value !== undefined && value !== "true" && value !== "false") {
      throw new CsiError(
        Code.INVALID_ARGUMENT,
        `Snapshot parameter store="${value}" must be "true" or "false"`,
      );
    }
    if (value === "true" && !this.#d.stored) {
      throw new CsiError(
        Code.INVALID_ARGUMENT,
        `Snapshot parameter store="true": this plugin has no store (start it with --store)`,
      );
    }
    return value === "false" ? undefined : this.#d.stored;
  }

  /** Backup parameters need a store. */
  #checkBackupParameters(params: VolumeParameters): void {
    if (params.backup && !this.#d.config.store) {
      throw new CsiError(
        Code.INVALID_ARGUMENT,
        `Parameters ${BACKUP_PARAMETERS.interval} and ${BACKUP_PARAMETERS.keep} need a store, ` +
          `and this plugin has none (start it with --store)`,
      );
    }
  }

  /**
   * CreateVolume of a volume that follows its job: its owner object and record go to the store,
   * with the dataset properties every node creates its copy with; no dataset here. Its topology
   * is its standby nodes, if it names some (src/follow/placement.ts), else none.
   */
  async #createFollow(
    req: CreateVolumeRequest,
    requested: string,
    parameters: Record<string, string>,
  ): Promise<unknown> {
    const follow = this.#d.follow;
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
    const name = fittedVolumeName(requested, this.#d.config.parentDataset, "*");
    const id = followVolumeId(name);
    checkCapabilities(req.volume_capabilities);
    const capacity = checkCapacity(req.capacity_range);
    const { standbys, rest } = splitStandbys(parameters);
    // Where Nomad may place its job: the standby nodes, or any node (src/follow/placement.ts).
    const topologies = followTopologies(standbys, req.accessibility_requirements);
    const params = parseParameters(rest, this.#d.config.parameterPolicy);
    let size = capacity.requiredBytes > 0 ? capacity.requiredBytes : capacity.limitBytes;
    if (size > 0) size = Math.max(size, MIN_VOLUME_BYTES);
    checkSizes(params, size);
    const interval = params.backup?.intervalSeconds ?? DEFAULT_FOLLOW_INTERVAL_SECONDS;
    if (interval === 0) {
      throw new CsiError(
        Code.INVALID_ARGUMENT,
        `Volume "${requested}" follows its job, so its data must reach the store: ` +
          `${BACKUP_PARAMETERS.interval} cannot be 0`,
      );
    }
    await this.#checkSupported(params);
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
      [PARAMETERS_PROPERTY]: params.canonical,
    };
    // Two nodes could hold one volume on a store that ignores conditional writes.
    await follow.conditionalWrites?.require();
    await withLock(this.#d.locks, [`follow:${name}`], async () => {
      // From a stored snapshot: its chain becomes the new volume's (src/follow/seed.ts), and
      // without a size asked for, the volume has the size it had when the snapshot was taken.
      const seed = source && await seedFromSnapshot(follow.store, {
        source,
        volume: name,
        node: this.#d.config.nodeId,
        log: this.#d.log,
      });
      if (seed && size === 0) size = seed.source.capacityBytes;
      if (size > 0) props.refquota = String(size);
      this.#sizeProps(props, params, size);
      await createFollowVolume(follow.store, {
        name,
        settings: { capacityBytes: size, properties: props },
        parameters: { ...parameters, follow: "true" },
        ttlSeconds: follow.ttlSeconds,
        standbys,
        node: this.#d.config.nodeId,
        ...(seed ? { seed: { uid: seed.uid, head: seed.head } } : {}),
        nowMs: Date.now(),
      });
    });
    this.#d.log.info("follow volume created in the store", {
      volumeId: id,
      store: follow.store.description,
    });
    return {
      volume: {
        volume_id: id,
        capacity_bytes: String(size),
        volume_context: {},
        ...(source ? { content_source: { snapshot: { snapshot_id: source.id } } } : {}),
        // None: any node running the plugin may stage it.
        ...(topologies.length > 0 ? { accessible_topology: topologies } : {}),
      },
    };
  }

  /**
   * CreateSnapshot of a follow volume: its last copy in the store, pinned (src/follow/snapshots.ts).
   * @throws {CsiError} FAILED_PRECONDITION without a store, INVALID_ARGUMENT for store = "false"
   */
  async #snapshotFollow(
    sourceId: string,
    volumeName: string,
    requested: string,
    local: boolean,
  ): Promise<unknown> {
    const snapshots = this.#followSnapshots;
    if (!snapshots || local) {
      throw new CsiError(
        snapshots ? Code.INVALID_ARGUMENT : Code.FAILED_PRECONDITION,
        `Volume "${sourceId}" follows its job: its snapshots are its copies in the store` +
          (snapshots ? `, so snapshot parameter store cannot be "false"` : `, and this plugin ` +
            `has none: start it with --store`),
      );
    }
    const m = await withLock(
      this.#d.locks,
      [`follow:${volumeName}`, `snapshot:${requested}`],
      () => snapshots.create(volumeName, sourceId, requested),
    );
    return {
      snapshot: this.#storedMessage({
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
   * ControllerExpandVolume of a follow volume: its size grows in the store (src/follow/resize.ts);
   * the holder, if a node holds it, grows its copy at NodeExpandVolume, any other copy at its
   * next stage.
   * @throws {CsiError} NOT_FOUND when the store has no such volume; OUT_OF_RANGE for a shrink
   */
  async #expandFollow(id: string, dataset: string, capacity: Capacity): Promise<unknown> {
    const follow = this.#d.follow;
    if (!follow) {
      throw new CsiError(
        Code.FAILED_PRECONDITION,
        `Volume "${id}" follows its job through a store, and this plugin has none: start it ` +
          `with --store`,
      );
    }
    const name = this.#nameOf(dataset);
    const key = encodeComponent("Volume name", name);
    const done = await withLock(
      this.#d.locks,
      [`follow:${name}`],
      () => resizeFollowVolume(follow.store, key, id, capacity),
    );
    if (done.changed) {
      this.#d.log.info("follow volume sized in the store", {
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
   * DeleteVolume of a follow volume, in the store: refused while a node holds it.
   * @throws {CsiError} FAILED_PRECONDITION naming the holder, or when there is no store
   */
  async #deleteFollow(id: string, dataset: string): Promise<void> {
    const follow = this.#d.follow;
    if (!follow) {
      throw new CsiError(
        Code.FAILED_PRECONDITION,
        `Volume "${id}" follows its job through a store, and this plugin has none: start it ` +
          `with --store`,
      );
    }
    const name = this.#nameOf(dataset);
    await withLock(
      this.#d.locks,
      [`follow:${name}`],
      () => deleteFollowVolume(follow.store, name, Date.now()),
    );
  }

  /**
   * The dataset properties of the volume's backups: only what its parameters ask for (an
   * explicit 0 too). Never the plugin's defaults: written here they would become the volume's
   * own setting, and a later --backup-interval would not reach it (the scheduler applies the
   * default to every volume without one; scheduler.ts effectiveSchedule).
   */
  #backupProps(params: VolumeParameters): Record<string, string> {
    if (!this.#d.config.store) return {};
    const props: Record<string, string> = {};
    const interval = params.backup?.intervalSeconds;
    if (interval !== undefined) props[BACKUP_INTERVAL_PROPERTY] = String(interval);
    if (params.backup?.keep) props[BACKUP_KEEP_PROPERTY] = formatKeepPolicy(params.backup.keep);
    return props;
  }

  /**
   * Before a volume goes: marks its backups in the store deleted, so they stay for the store's
   * deleted retention. A store that cannot be reached does not stop the delete (the backups
   * then stay until an operator removes them), but the log says so.
   */
  async #keepBackups(id: string, dataset: string): Promise<void> {
    const stored = this.#d.stored;
    if (!stored) return;
    const props = await this.#d.zfs.getProperties(dataset, [STORE_UID_PROPERTY]);
    const uid = props?.get(STORE_UID_PROPERTY);
    if (!uid || uid.source !== "local") return;
    try {
      await stored.volumeDeleted(this.#nameOf(dataset), uid.value);
    } catch (err) {
      if (!(err instanceof StoreError)) throw err;
      this.#d.log.warn("could not mark the volume's backups deleted; they stay in the store", {
        volumeId: id,
        store: stored.description,
        error: err,
      });
    }
  }

  #storedMessage(e: StoredEntry, sourceId?: string): Record<string, unknown> {
    return {
      size_bytes: String(e.sizeBytes),
      snapshot_id: e.id,
      source_volume_id: sourceId ?? StoredSnapshots.sourceVolumeId(e),
      creation_time: { seconds: String(e.creation), nanos: 0 },
      ready_to_use: e.ready,
    };
  }

  /** Adds quota and refreservation from the parameters for a volume of `size` bytes. */
  #sizeProps(props: Record<string, string>, params: VolumeParameters, size: number): void {
    if (params.quota) props.quota = String(sizeOf(params.quota, size));
    if (params.refreservation) props.refreservation = String(sizeOf(params.refreservation, size));
  }

  /** Refuses properties this node's zfs does not know, with a message saying so. */
  async #checkSupported(params: VolumeParameters): Promise<void> {
    const ask = params.openzfsOnly.filter((p) => !this.#supported.has(p));
    if (ask.length === 0) return;
    const unknown = await this.#d.zfs.unknownProperties(this.#d.config.parentDataset, ask);
    for (const p of ask) if (!unknown.includes(p)) this.#supported.add(p);
    if (unknown.length > 0) {
      throw new CsiError(
        Code.INVALID_ARGUMENT,
        `Parameter ${unknown.map((p) => `"${p}"`).join(", ")} is not supported by the ZFS on ` +
          `node "${this.#d.config.nodeId}" (it needs OpenZFS)`,
      );
    }
  }

  #nameOf(dataset: string): string {
    return volumeForDataset(this.#d.config.parentDataset, dataset) ?? dataset;
  }

  #volumeIdOfName(name: string): string {
    return qualifiedVolumeId(name, this.#d.config.nodeId);
  }

  #volumeId(v: VolumeRecord): string {
    return this.#volumeIdOfName(v.name);
  }

  #snapshotId(s: SnapshotRecord): string {
    return qualifiedSnapshotId(s.volumeName, s.name, this.#d.config.nodeId);
  }

  #volumeMessage(id: string, v: VolumeRecord): Record<string, unknown> {
    const source = contentSourceOf(v.source);
    return {
      volume_id: id,
      capacity_bytes: String(v.refquota),
      volume_context: { [CONTEXT_KEYS.dataset]: v.dataset },
      ...(source ? { content_source: source } : {}),
      accessible_topology: [{ segments: this.#d.config.topology }],
    };
  }

  /** A follow volume's ListVolumes entry (and ControllerGetVolume answer), from its owner. */
  #followEntry(r: OwnerRecord): Record<string, unknown> {
    return {
      volume: followVolumeMessage(r),
      status: followVolumeStatus(r, Date.now(), this.#d.follow?.standby?.state(r.volume)),
    };
  }

  /**
   * The follow volumes the store lists; none when the store cannot be reached (logged): this
   * node's own volumes are listed all the same.
   */
  async #listFollow(store: Store): Promise<{ name: string; volumeKey: string }[]> {
    try {
      return await listMarked(store, followVolumesPrefix());
    } catch (err) {
      if (!(err instanceof StoreError)) throw err;
      this.#d.log.warn("ListVolumes could not list the volumes that follow their job", {
        store: store.description,
        error: err,
      });
      return [];
    }
  }

  /** This node's copies of follow volumes (datasets marked with a follow generation). */
  async #followCopies(): Promise<Set<string>> {
    const tree = await this.#d.zfs.getTree(this.#d.config.parentDataset, 1, [
      FOLLOW_GENERATION_PROPERTY,
    ]);
    return new Set(
      [...tree ?? []].filter(([, p]) => p.get(FOLLOW_GENERATION_PROPERTY)?.source === "local")
        .map(([dataset]) => dataset),
    );
  }

  #snapshotMessage(s: SnapshotRecord): Record<string, unknown> {
    return {
      size_bytes: String(s.referenced),
      snapshot_id: this.#snapshotId(s),
      source_volume_id: this.#volumeIdOfName(s.volumeName),
      creation_time: { seconds: String(s.creation), nanos: 0 },
      ready_to_use: true,
    };
  }

  #status(dataset: string): Record<string, unknown> {
    const backup = this.#d.scheduler?.status(dataset);
    const problem = storageProblem(this.#d.health.last) ??
      (backup?.lastError === undefined
        ? undefined
        : `Backups to ${this.#d.stored?.description ?? "the store"} are failing ` +
          `(${backup.failures} in a row): ${backup.lastError}`);
    return {
      published_node_ids: [],
      volume_condition: {
        abnormal: problem !== undefined,
        message: problem ?? "Volume is healthy",
      },
    };
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
 * A snapshot of an encrypted volume arrives encrypted (sent raw) and needs its key named with
 * `keylocation`; an unencrypted one cannot take a key. Refused before anything is received.
 * @throws {CsiError} INVALID_ARGUMENT saying what to give or drop
 */
function checkRestoredKey(id: string, raw: boolean, params: VolumeParameters): void {
  const keylocation = params.properties.keylocation;
  if (raw && keylocation === undefined) {
    throw new CsiError(
      Code.INVALID_ARGUMENT,
      `Snapshot "${id}" is of an encrypted volume, stored encrypted: give parameter ` +
        `keylocation (file:///<a file below --key-dir> holding its key) to restore it`,
    );
  }
  if (!raw && keylocation !== undefined) {
    throw new CsiError(
      Code.INVALID_ARGUMENT,
      `Snapshot "${id}" is of an unencrypted volume: it takes no keylocation`,
    );
  }
}

/** The capabilities of a request, which must name at least one. */
function requiredCapabilities(
  caps: readonly VolumeCapability[] | null | undefined,
): readonly VolumeCapability[] {
  if (!caps || caps.length === 0) {
    throw new CsiError(Code.INVALID_ARGUMENT, "volume_capabilities is required");
  }
  return caps;
}

/** Checks the capabilities a volume is created with: at least one, each one we serve. */
function checkCapabilities(caps: readonly VolumeCapability[] | null | undefined): void {
  for (const cap of requiredCapabilities(caps)) checkCapability(cap);
}

/** The content source recorded on a dataset, as a CSI message. */
function contentSourceOf(source: string): Record<string, unknown> | undefined {
  if (source.startsWith("snapshot:")) return { snapshot: { snapshot_id: source.slice(9) } };
  if (source.startsWith("volume:")) return { volume: { volume_id: source.slice(7) } };
  return undefined;
}
