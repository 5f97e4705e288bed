/**
 * The CSI Controller service: create, delete, clone, snapshot and grow volumes, all on this
 * node's parent dataset. Every handler reads the current state from zfs first and then acts,
 * so a repeated call answers as the first did and nothing is kept in memory.
 */

import type { Config } from "../config.ts";
import { Code, CsiError } from "../errors.ts";
import type { KeyedLock } from "../lock.ts";
import type { Logger } from "../log.ts";
import type { Mounter } from "../mount/mounter.ts";
import { followVolumeId, resolveSnapshot, resolveVolume } from "../zfs/ids.ts";
import { encodeName } from "../zfs/names.ts";
import { parseBytes } from "../zfs/parse.ts";
import type { Zfs } from "../zfs/zfs.ts";
import { readCatalog, type VolumeRecord } from "../volume/catalog.ts";
import type { Trash } from "../volume/trash.ts";
import { nodeIsIn } from "../volume/topology.ts";
import { parametersRefusal, parseParameters } from "../parameters.ts";
import { isStoredSnapshotId, parseStoredSnapshotId } from "../store/snapshot_ids.ts";
import type { Store } from "../store/store.ts";
import type { BackupScheduler } from "../replicate/scheduler.ts";
import { splitFollow } from "../follow/volume.ts";
import type { StandbyState } from "../follow/standby.ts";
import { MIN_VOLUME_BYTES } from "../size.ts";
import { parseVolumeContext } from "./context.ts";
import type { HealthChecker } from "./health.ts";
import { paginate } from "./paging.ts";
import type { StoredSnapshots } from "./stored_snapshots.ts";
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
} from "./types.ts";
import { checkCapability, checkCapacity, required } from "./validate.ts";
import { KindCommon, requiredCapabilities } from "./volume_kinds/common.ts";
import { FollowKind } from "./volume_kinds/follow.ts";
import { FollowZvolKind } from "./volume_kinds/follow_zvol.ts";
import type { VolumeKind } from "./volume_kinds/kind.ts";
import { OrdinaryVolumes } from "./volume_kinds/ordinary.ts";
import { StoredKind } from "./volume_kinds/stored.ts";
import { ZvolVolumes } from "./volume_kinds/zvol.ts";
import { capabilityMisfit } from "./zvol_request.ts";
import { parseZvolParameters, type ZvolContent } from "../volume/zvol.ts";
import type { VolumeCapability } from "./types.ts";

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

/**
 * The CSI Controller service handlers: each checks what its call means, then hands the work to
 * the kind of volume it is about (volume_kinds/kind.ts).
 */
export class ControllerService {
  readonly #d: ControllerDeps;
  readonly #c: KindCommon;
  readonly #stored: StoredKind;
  readonly #ordinary: OrdinaryVolumes;
  readonly #follow: FollowKind;
  readonly #zvol: ZvolVolumes;
  readonly #followZvol: FollowZvolKind;

  constructor(deps: ControllerDeps) {
    this.#d = deps;
    this.#c = new KindCommon(deps);
    this.#stored = new StoredKind(this.#c);
    this.#ordinary = new OrdinaryVolumes(this.#c, this.#stored);
    this.#zvol = new ZvolVolumes(this.#c, this.#stored, this.#ordinary);
    this.#follow = new FollowKind(this.#c, this.#ordinary, this.#zvol);
    this.#followZvol = new FollowZvolKind(this.#c, this.#follow);
  }

  ControllerGetCapabilities(): Promise<unknown> {
    return Promise.resolve({
      capabilities: CONTROLLER_CAPABILITIES.map((type) => ({ rpc: { type } })),
    });
  }

  /** A volume that follows its job is made in the store; any other as a dataset here. */
  async CreateVolume(req: CreateVolumeRequest): Promise<unknown> {
    const requested = required("name", req.name);
    const { follow, rest } = splitFollow(req.parameters);
    // fs_type "zfs" (or none) is a dataset, as it always was: the parameter is not recorded.
    const { fs_type: fsType, ...others } = rest;
    const zvol = this.#c.zvols.requested(req.volume_capabilities, rest);
    if (zvol !== undefined && follow) {
      return await this.#followZvol.create(req, requested, rest, zvol);
    }
    if (zvol !== undefined) return await this.#zvol.create(req, requested, rest);
    const parameters = fsType === undefined || fsType === "" || fsType === "zfs" ? others : rest;
    return await this.#kind(follow).create(req, requested, parameters);
  }

  async DeleteVolume(req: DeleteVolumeRequest): Promise<unknown> {
    const { id, dataset, follow } = resolveVolume(
      required("volume_id", req.volume_id),
      this.#c.scope,
      { mutating: true, follow: true },
    );
    return await (await this.#kindOf(follow, dataset)).delete(id, dataset);
  }

  async ValidateVolumeCapabilities(req: ValidateVolumeCapabilitiesRequest): Promise<unknown> {
    const { id, dataset, follow } = resolveVolume(
      required("volume_id", req.volume_id),
      this.#c.scope,
      { follow: true },
    );
    const caps = requiredCapabilities(req.volume_capabilities);
    const ctx = parseVolumeContext(splitFollow(req.volume_context).rest);
    const kind = await this.#kindOf(follow, dataset);
    // What the volume really is decides what fits it, never the context alone.
    let content: ZvolContent | undefined;
    if (kind === this.#zvol) content = await this.#zvol.contentOf(id, dataset);
    else if (kind === this.#follow) content = await this.#follow.contentOf(id, dataset);
    else await kind.checkExists(id, dataset);
    if (ctx.zvol !== content) {
      return {
        message: `The volume context says fs_type "${ctx.zvol ?? "zfs"}", and the volume ` +
          `is ${content === undefined ? "a ZFS dataset" : `a zvol holding ${content}`}`,
      };
    }
    for (const cap of caps) {
      try {
        const misfit = capabilityMisfit(
          checkCapability(cap, this.#c.zvols.options),
          cap.mount?.fs_type ?? "",
          content,
        );
        if (misfit !== undefined) return { message: misfit };
      } catch (err) {
        if (err instanceof CsiError) return { message: err.message };
        throw err;
      }
    }
    // A follow volume's own keys (follow, standby_nodes) are not the dataset's or zvol's.
    const parameters = kind === this.#follow
      ? FollowKind.volumeParameters(req.parameters)
      : req.parameters ?? {};
    const refusal = content === undefined
      ? parametersRefusal(parameters, this.#d.config.parameterPolicy)
      : this.#zvolParametersRefusal(parameters);
    if (refusal !== undefined) return { message: refusal };
    return {
      confirmed: {
        volume_context: req.volume_context ?? {},
        // Rebuilt rather than echoed: decoded messages carry oneof names that do not encode.
        volume_capabilities: caps.map(confirmedCapability),
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
    const copies = follow ? await this.#follow.copies() : new Set<string>();
    const marked = follow ? await this.#follow.marked(follow.store) : [];
    const items: ({ id: string; v: VolumeRecord } | { id: string; volumeKey: string })[] = [
      ...catalog.volumes.filter((v) => !copies.has(v.dataset)).map((v) => ({
        id: this.#c.volumeId(v),
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
        entries.push({
          volume: this.#c.volumeMessage(e.id, e.v),
          status: this.#c.status(e.v.dataset),
        });
        continue;
      }
      const entry = await this.#follow.listEntry(e.id, e.volumeKey);
      if (entry) entries.push(entry);
    }
    return { entries, next_token: page.nextToken };
  }

  async ControllerGetVolume(req: ControllerGetVolumeRequest): Promise<unknown> {
    const { id, dataset, follow } = resolveVolume(
      required("volume_id", req.volume_id),
      this.#c.scope,
      { follow: true },
    );
    return await (await this.#kindOf(follow, dataset)).get(id, dataset);
  }

  async GetCapacity(req: GetCapacityRequest): Promise<unknown> {
    // The size limits are Int64Value wrappers.
    const none = {
      available_capacity: "0",
      minimum_volume_size: { value: String(MIN_VOLUME_BYTES) },
    };
    for (const cap of req.volume_capabilities ?? []) {
      try {
        if (checkCapability(cap, this.#c.zvols.options).kind !== "zfs") {
          await this.#c.zvols.check();
        }
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
      this.#c.scope,
      { mutating: true, follow: true },
    );
    if (!req.capacity_range) {
      throw new CsiError(Code.INVALID_ARGUMENT, "capacity_range is required");
    }
    const capacity = checkCapacity(req.capacity_range);
    if (req.volume_capability) checkCapability(req.volume_capability, this.#c.zvols.options);
    return await (await this.#kindOf(follow, dataset)).expand(id, dataset, capacity);
  }

  async CreateSnapshot(req: CreateSnapshotRequest): Promise<unknown> {
    const sourceId = required("source_volume_id", req.source_volume_id);
    const requested = required("name", req.name);
    encodeName("Snapshot name", requested);
    const toStore = this.#stored.storeParameter(req.parameters);
    const { dataset, follow } = resolveVolume(sourceId, this.#c.scope, {
      mutating: true,
      follow: true,
    });
    return await (await this.#kindOf(follow, dataset)).snapshot({
      sourceId,
      dataset,
      requested,
      parameters: req.parameters,
      toStore,
    });
  }

  async DeleteSnapshot(req: DeleteSnapshotRequest): Promise<unknown> {
    const id = required("snapshot_id", req.snapshot_id);
    if (!isStoredSnapshotId(id)) return await this.#ordinary.deleteSnapshot(id);
    const stored = parseStoredSnapshotId(id);
    // An id this plugin could never have made names nothing: deleting nothing succeeds.
    if (!stored) return {};
    const followed = await this.#follow.deleteSnapshot(stored);
    if (followed !== undefined) {
      this.#d.log.info("follow volume's stored snapshot deleted", {
        snapshotId: id,
        outcome: followed,
      });
      return {};
    }
    await this.#stored.storeFor(id).delete(stored);
    return {};
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
        wantSnapshot = resolveSnapshot(req.snapshot_id, this.#c.scope).snapshot;
      }
      if (req.source_volume_id) {
        const source = resolveVolume(req.source_volume_id, this.#c.scope, { follow: true });
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
    ).map((s) => ({ id: this.#c.snapshotId(s), message: () => this.#c.snapshotMessage(s) }));
    const storedEntries = this.#d.stored && !wantSnapshot
      ? (await this.#d.stored.list(wantDataset && this.#c.nameOf(wantDataset)))
        .filter((e) => wantStored === undefined || e.id === wantStored)
      : [];
    // Stored snapshots of follow volumes name their source `<name>@*` (one listing).
    const follows = this.#d.follow && storedEntries.length > 0
      ? new Set((await this.#follow.marked(this.#d.follow.store)).map((m) => m.name))
      : new Set<string>();
    const stored = storedEntries.map((e) => ({
      id: e.id,
      message: () =>
        this.#c.storedMessage(e, follows.has(e.volume) ? followVolumeId(e.volume) : undefined),
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

  /** Why a zvol would not be made with `parameters`, or undefined when it would. */
  #zvolParametersRefusal(parameters: Readonly<Record<string, string>>): string | undefined {
    try {
      const { rest } = parseZvolParameters(parameters, {
        allowSparse: this.#d.config.allowSparseZvols,
      });
      return parametersRefusal(rest, this.#d.config.parameterPolicy);
    } catch (err) {
      if (err instanceof CsiError) return err.message;
      throw err;
    }
  }

  /** The kind a volume is: resolveVolume says whether it follows its job. */
  #kind(follow: boolean | undefined): VolumeKind {
    return follow ? this.#follow : this.#ordinary;
  }

  /**
   * The kind an existing volume is: one that follows its job, a zvol (what zfs says it is, and
   * only with --block-volumes: one more `zfs get`), or an ordinary dataset (also when it does
   * not exist, which that kind answers).
   */
  async #kindOf(follow: boolean | undefined, dataset: string): Promise<VolumeKind> {
    if (follow || !this.#d.config.blockVolumes) return this.#kind(follow);
    const props = await this.#d.zfs.getProperties(dataset, ["type"]);
    return props?.get("type")?.value === "volume" ? this.#zvol : this.#ordinary;
  }
}

/** A capability as ValidateVolumeCapabilities confirms it: rebuilt, not echoed. */
function confirmedCapability(cap: VolumeCapability): Record<string, unknown> {
  const access_mode = { mode: cap.access_mode?.mode };
  // Decoded messages carry oneof names that do not encode.
  if (cap.block || cap.access_type === "block") return { access_mode, block: {} };
  return {
    access_mode,
    mount: {
      fs_type: cap.mount?.fs_type ?? "",
      mount_flags: cap.mount?.mount_flags ?? [],
      volume_mount_group: cap.mount?.volume_mount_group ?? "",
    },
  };
}
