/**
 * The ordinary volume kind: a dataset below this node's parent dataset, made empty, as a clone
 * of a snapshot or volume here, or restored from a snapshot in the store (stored.ts), and set
 * aside when deleted (src/volume/trash.ts). Every call reads the current state from zfs first
 * and then acts, so a repeated call answers as the first did.
 */

import { Code, CsiError, ZfsError } from "../../errors.ts";
import { withLock } from "../../lock.ts";
import { resolveSnapshot, snapshotIdOf, volumeIdFor } from "../../zfs/ids.ts";
import {
  childDataset,
  encodeComponent,
  MANAGED_PROPERTY,
  MANAGED_VALUE,
  NAME_PROPERTY,
} from "../../zfs/names.ts";
import { hasOwnMarker, parseBytes, type PropertyMap } from "../../zfs/parse.ts";
import { fittedSnapshotName, fittedVolumeName, isFormOf } from "../../zfs/fit.ts";
import {
  PARAMETERS_PROPERTY,
  readCatalog,
  SOURCE_PROPERTY,
  volumeRecord,
} from "../../volume/catalog.ts";
import { checkOwned, checkOwnedVolume } from "../../volume/datasets.ts";
import { checkRecordedName, checkRetry } from "../../volume/tenancy.ts";
import { obstacleMessage } from "../../volume/subtree.ts";
import { type Capacity, planSize } from "../../volume/sizing.ts";
import { checkRequisite } from "../../volume/topology.ts";
import {
  BACKUP_PARAMETERS,
  checkSizes,
  parseParameters,
  type VolumeParameters,
} from "../../parameters.ts";
import { isStoredSnapshotId } from "../../store/snapshot_ids.ts";
import { BACKUP_INTERVAL_PROPERTY, BACKUP_KEEP_PROPERTY } from "../../replicate/backup.ts";
import { formatKeepPolicy } from "../../store/policy.ts";
import { MIN_VOLUME_BYTES } from "../../size.ts";
import type { CreateVolumeRequest } from "../types.ts";
import { checkCapacity } from "../validate.ts";
import { checkCapabilities, type KindCommon, VOLUME_STATE } from "./common.ts";
import type { SnapshotRequest, VolumeKind } from "./kind.ts";
import type { StoredKind } from "./stored.ts";
import { cloneFrom, contentSource } from "./sources.ts";

/** Ordinary volumes: datasets on this node. */
export class OrdinaryVolumes implements VolumeKind {
  readonly #c: KindCommon;
  readonly #stored: StoredKind;

  constructor(common: KindCommon, stored: StoredKind) {
    this.#c = common;
    this.#stored = stored;
  }

  async create(
    req: CreateVolumeRequest,
    requested: string,
    parameters: Record<string, string>,
  ): Promise<unknown> {
    // The name as used: the requested one, or its shortened form when it does not fit.
    const name = fittedVolumeName(
      requested,
      this.#c.d.config.parentDataset,
      this.#c.d.config.nodeId,
    );
    const id = volumeIdFor(name, this.#c.scope);
    const dataset = childDataset(this.#c.d.config.parentDataset, "Volume name", name);
    checkCapabilities(req.volume_capabilities);
    const capacity = checkCapacity(req.capacity_range);
    const params = parseParameters(parameters, this.#c.d.config.parameterPolicy, {
      restoring: isStoredSnapshotId(req.volume_content_source?.snapshot?.snapshot_id ?? ""),
    });
    checkRequisite(
      req.accessibility_requirements,
      this.#c.d.config.topology,
      this.#c.d.config.nodeId,
    );
    let size = capacity.requiredBytes > 0 ? capacity.requiredBytes : capacity.limitBytes;
    if (size > 0) size = Math.max(size, MIN_VOLUME_BYTES);
    if (capacity.limitBytes > 0 && size > capacity.limitBytes) {
      throw new CsiError(
        Code.OUT_OF_RANGE,
        `capacity_range.limit_bytes ${capacity.limitBytes} is below the smallest volume, ` +
          `${MIN_VOLUME_BYTES} bytes`,
      );
    }
    const source = contentSource(this.#c, this.#stored, req.volume_content_source);
    checkSizes(params, size);
    // A stored snapshot is recorded as a snapshot source, as Nomad named it.
    const sourceText = source
      ? `${source.kind === "stored" ? "snapshot" : source.kind}:${source.id}`
      : "";
    const want = { name: requested, capacity, params, source: sourceText };
    const keys = source && source.kind !== "stored" ? [dataset, source.dataset] : [dataset];
    return await withLock(this.#c.d.locks, keys, async () => {
      // A plain create goes straight to `zfs create`: zfs refuses a name that exists without
      // changing it, and the refusal leads to the repeat check below, so a new volume costs one
      // process. A clone looks first, since its hidden snapshot would be a change.
      if (source) {
        const existing = await this.#c.d.zfs.getProperties(dataset, VOLUME_STATE);
        if (existing) return this.#answerRepeat(id, dataset, existing, want);
      }
      await this.#c.checkSupported(params);
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
          this.#c.sizeProps(props, params, size);
          await this.#c.d.zfs.create(dataset, props);
        } else if (source.kind === "stored") {
          refquota = await this.#stored.restoreFrom(source.ref, dataset, props, params, size);
        } else {
          refquota = await cloneFrom(this.#c, source, { dataset, props, params, size });
        }
      } catch (err) {
        if (!(err instanceof ZfsError && err.kind === "exists")) throw err;
        // A repeat, or a dataset made by someone else: judge it like any repeat.
        const made = await this.#c.d.zfs.getProperties(dataset, VOLUME_STATE);
        if (!made) throw new CsiError(Code.INTERNAL, `Dataset "${dataset}" vanished`);
        return this.#answerRepeat(id, dataset, made, want);
      }
      this.#c.d.log.info("volume created", { volumeId: id, dataset, refquota });
      // Everything the answer needs was just set with the create: no need to read it back.
      return {
        volume: this.#c.volumeMessage(id, {
          dataset,
          name,
          refquota,
          parameters: params.canonical,
          source: sourceText,
        }),
      };
    });
  }

  /** DeleteVolume: the dataset is set aside (trash.ts), refused while in use or in the way. */
  async delete(id: string, dataset: string): Promise<unknown> {
    return await withLock(this.#c.d.locks, [dataset], async () => {
      // Both reads at once: a delete waits for one process fewer (a repeat for a volume already
      // gone reads the mount table in vain, which is cheap). The dataset's whole subtree is
      // read: nothing in it that the plugin did not make is ever destroyed.
      const [found, table] = await Promise.all([
        this.#c.d.trash.inspect(dataset),
        this.#c.d.mounter.table(),
      ]);
      if (!found) return {};
      const { props, check } = found;
      checkOwned(dataset, props);
      const mountpoint = props.get("mountpoint")?.value ?? "";
      // Judged by the filesystem type of the ZFS that runs here: a user's FUSE mount named
      // like the dataset never holds a volume "in use".
      const judge = this.#c.d.mounter.judge();
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
        .map((n) => snapshotIdOf(n, this.#c.scope))
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
      await this.#stored.keepBackups(id, dataset);
      await this.#c.d.trash.removeVolume(dataset, found);
      return {};
    });
  }

  async checkExists(id: string, dataset: string): Promise<void> {
    const props = await this.#c.d.zfs.getProperties(dataset, VOLUME_STATE);
    if (!props) throw new CsiError(Code.NOT_FOUND, `Volume "${id}" not found`);
    checkOwned(dataset, props);
  }

  async get(id: string, dataset: string): Promise<unknown> {
    const props = await this.#c.d.zfs.getProperties(dataset, VOLUME_STATE);
    const record = props && volumeRecord(this.#c.d.config.parentDataset, dataset, props);
    if (!record) throw new CsiError(Code.NOT_FOUND, `Volume "${id}" not found`);
    return {
      volume: this.#c.volumeMessage(this.#c.volumeId(record), record),
      status: this.#c.status(dataset),
    };
  }

  /** ControllerExpandVolume: the refquota (and sizes that follow it) reconciled. */
  async expand(id: string, dataset: string, capacity: Capacity): Promise<unknown> {
    return await withLock(this.#c.d.locks, [dataset], async () => {
      const props = await this.#c.d.zfs.getProperties(dataset, VOLUME_STATE);
      if (!props) throw new CsiError(Code.NOT_FOUND, `Volume "${id}" not found`);
      checkOwned(dataset, props);
      // Reconciled on every call, "already at size" too: a call that failed half way (no room
      // for the refreservation) is finished by its retry, and a repeat sets nothing.
      const plan = planSize(id, props, capacity);
      if (plan.changes.length > 0) {
        await this.#c.d.zfs.setProperties(dataset, plan.changes);
        this.#c.d.log.info("volume sized", {
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

  /** CreateSnapshot: a zfs snapshot of the dataset, or a snapshot in the store. */
  async snapshot(req: SnapshotRequest): Promise<unknown> {
    const { sourceId, dataset, requested, toStore } = req;
    const volumeName = this.#c.nameOf(dataset);
    // The name as used: its id and ZFS name fit their limits (fittedSnapshotName sees to both).
    const name = fittedSnapshotName(volumeName, dataset, requested, this.#c.d.config.nodeId);
    if (toStore) {
      const props = await this.#c.d.zfs.getProperties(dataset, ["type", MANAGED_PROPERTY]);
      if (!props) throw new CsiError(Code.NOT_FOUND, `Source volume "${sourceId}" not found`);
      checkOwned(dataset, props);
      const entry = await toStore.create(dataset, volumeName, requested, name);
      return { snapshot: this.#c.storedMessage(entry) };
    }
    const component = encodeComponent("Snapshot name", name);
    const snapshot = `${dataset}@${component}`;
    // Locked by the requested name: its shortened form can differ between volumes.
    return await withLock(this.#c.d.locks, [dataset, `snapshot:${requested}`], async () => {
      const catalog = await readCatalog(this.#c.d.zfs, this.#c.d.config.parentDataset, {
        snapshots: true,
      });
      if (!catalog.volumes.some((v) => v.dataset === dataset)) {
        const props = await this.#c.d.zfs.getProperties(dataset, ["type", MANAGED_PROPERTY]);
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
            `("${this.#c.volumeIdOfName(same.volumeName)}")`,
        );
      }
      if (same) return { snapshot: this.#c.snapshotMessage(same) };
      try {
        await this.#c.d.zfs.snapshot(snapshot);
      } catch (err) {
        if (!(err instanceof ZfsError && err.kind === "exists")) throw err;
      }
      const props = await this.#c.d.zfs.getProperties(snapshot, ["creation", "referenced"]);
      if (!props) {
        throw new CsiError(Code.INTERNAL, `Snapshot "${snapshot}" vanished after creation`);
      }
      this.#c.d.log.info("snapshot created", { snapshot });
      return {
        snapshot: this.#c.snapshotMessage({
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

  /** DeleteSnapshot of a snapshot on this node (an id that is not the store's). */
  async deleteSnapshot(id: string): Promise<unknown> {
    let ref;
    try {
      ref = resolveSnapshot(id, this.#c.scope, { mutating: true });
    } catch (err) {
      // An id this plugin could never have made names nothing: deleting nothing succeeds.
      if (err instanceof CsiError && err.code === Code.INVALID_ARGUMENT) return {};
      throw err;
    }
    const { dataset, component, snapshot } = ref;
    return await withLock(this.#c.d.locks, [dataset, `snapshot:${component}`], async () => {
      const tree = await this.#c.d.zfs.getTree(dataset, 1, ["type", MANAGED_PROPERTY]);
      const props = tree?.get(dataset);
      if (!tree || !props || !tree.has(snapshot)) return {};
      // A zvol's snapshots are deleted alike (volume_kinds/zvol.ts).
      checkOwnedVolume(dataset, props);
      await this.#c.d.trash.removeSnapshot(snapshot);
      return {};
    });
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
    const record = volumeRecord(this.#c.d.config.parentDataset, dataset, props);
    if (!record || record.content !== undefined) {
      throw conflict(`as dataset "${dataset}", which is not a filesystem`);
    }
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
    this.#c.d.log.info("CreateVolume repeated: answered with the volume it made", { volumeId: id });
    return { volume: this.#c.volumeMessage(id, record) };
  }

  /** Backup parameters need a store. */
  #checkBackupParameters(params: VolumeParameters): void {
    if (params.backup && !this.#c.d.config.store) {
      throw new CsiError(
        Code.INVALID_ARGUMENT,
        `Parameters ${BACKUP_PARAMETERS.interval} and ${BACKUP_PARAMETERS.keep} need a store, ` +
          `and this plugin has none (start it with --store)`,
      );
    }
  }

  /**
   * The dataset properties of the volume's backups: only what its parameters ask for (an
   * explicit 0 too). Never the plugin's defaults: written here they would become the volume's
   * own setting, and a later --backup-interval would not reach it (the scheduler applies the
   * default to every volume without one; scheduler.ts effectiveSchedule).
   */
  #backupProps(params: VolumeParameters): Record<string, string> {
    if (!this.#c.d.config.store) return {};
    const props: Record<string, string> = {};
    const interval = params.backup?.intervalSeconds;
    if (interval !== undefined) props[BACKUP_INTERVAL_PROPERTY] = String(interval);
    if (params.backup?.keep) props[BACKUP_KEEP_PROPERTY] = formatKeepPolicy(params.backup.keep);
    return props;
  }
}
