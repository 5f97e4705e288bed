/**
 * The zvol volume kind (docs/block-volumes.md): a ZFS volume `<parent>/<name>` made with
 * `zfs create -V`, holding a raw device or an ext4/xfs filesystem the node makes on it. It has
 * the marker, name and tenancy checks, set-aside delete and snapshots of an ordinary volume;
 * its size is its volsize, grown and never shrunk. Every call reads the current state from zfs
 * first and then acts, so a repeated call answers as the first did.
 */

import { Code, CsiError, ZfsError } from "../../errors.ts";
import { withLock } from "../../lock.ts";
import { volumeIdFor } from "../../zfs/ids.ts";
import {
  byteLength,
  childDataset,
  cloneSnapshotComponent,
  MANAGED_PROPERTY,
  MANAGED_VALUE,
  MAX_DATASET_NAME,
  NAME_PROPERTY,
} from "../../zfs/names.ts";
import { hasOwnMarker, parseBytes, type PropertyMap } from "../../zfs/parse.ts";
import { fittedSnapshotName, fittedVolumeName } from "../../zfs/fit.ts";
import {
  PARAMETERS_PROPERTY,
  SOURCE_PROPERTY,
  userValue,
  volumeRecord,
} from "../../volume/catalog.ts";
import { checkRecordedName, checkRetry } from "../../volume/tenancy.ts";
import { obstacleMessage } from "../../volume/subtree.ts";
import type { Capacity } from "../../volume/sizing.ts";
import { checkRequisite } from "../../volume/topology.ts";
import {
  ATTACHED_PROPERTY,
  parseZvolParameters,
  planZvolGrowth,
  planZvolSize,
  ZVOL_CONTENT_PROPERTY,
  type ZvolContent,
} from "../../volume/zvol.ts";
import { BACKUP_PARAMETERS, parseParameters, type VolumeParameters } from "../../parameters.ts";
import { BACKUP_INTERVAL_PROPERTY, BACKUP_KEEP_PROPERTY } from "../../replicate/backup.ts";
import { formatKeepPolicy } from "../../store/policy.ts";
import { MIN_VOLUME_BYTES } from "../../size.ts";
import { snapshotIdOf } from "../../zfs/ids.ts";
import type { CreateVolumeRequest } from "../types.ts";
import { checkCapacity } from "../validate.ts";
import { type KindCommon, requiredCapabilities, VOLUME_STATE } from "./common.ts";
import type { SnapshotRequest, VolumeKind } from "./kind.ts";
import type { OrdinaryVolumes } from "./ordinary.ts";
import { contentSource, type Source } from "./sources.ts";
import type { StoredKind } from "./stored.ts";

/** What the zvol kind reads of a zvol before acting on it. */
export const ZVOL_STATE = [...VOLUME_STATE, "volblocksize", ATTACHED_PROPERTY] as const;

/**
 * Checks that `props` are of a zvol this plugin made.
 * @returns what it holds
 * @throws {CsiError} FAILED_PRECONDITION for a dataset not ours, or not a zvol we made
 */
export function checkOwnedZvol(dataset: string, props: PropertyMap): ZvolContent {
  if (!hasOwnMarker(props, MANAGED_PROPERTY, MANAGED_VALUE)) {
    throw new CsiError(
      Code.FAILED_PRECONDITION,
      `Dataset "${dataset}" exists but is not managed by zfs-csi`,
    );
  }
  const content = props.get("type")?.value === "volume"
    ? userValue(props, ZVOL_CONTENT_PROPERTY)
    : "";
  if (content !== "block" && content !== "ext4" && content !== "xfs") {
    throw new CsiError(
      Code.FAILED_PRECONDITION,
      `Dataset "${dataset}" is not a zvol made by zfs-csi (no ${ZVOL_CONTENT_PROPERTY})`,
    );
  }
  return content;
}

/**
 * The zvol's backup properties: only what its parameters ask for, as for a dataset (ordinary.ts:
 * the plugin's defaults are never written, so a later --backup-interval reaches it).
 */
function backupProperties(store: boolean, params: VolumeParameters): Record<string, string> {
  if (!store) return {};
  const props: Record<string, string> = {};
  const interval = params.backup?.intervalSeconds;
  if (interval !== undefined) props[BACKUP_INTERVAL_PROPERTY] = String(interval);
  if (params.backup?.keep) props[BACKUP_KEEP_PROPERTY] = formatKeepPolicy(params.backup.keep);
  return props;
}

/** Zvol volumes on this node. */
export class ZvolVolumes implements VolumeKind {
  readonly #c: KindCommon;
  readonly #stored: StoredKind;
  readonly #ordinary: OrdinaryVolumes;

  constructor(common: KindCommon, stored: StoredKind, ordinary: OrdinaryVolumes) {
    this.#c = common;
    this.#stored = stored;
    this.#ordinary = ordinary;
  }

  async create(
    req: CreateVolumeRequest,
    requested: string,
    parameters: Record<string, string>,
  ): Promise<unknown> {
    const config = this.#c.d.config;
    const content = this.#c.zvols.requested(requiredCapabilities(req.volume_capabilities), {
      ...parameters,
    });
    if (content === undefined) throw new Error("ZvolVolumes.create of a request for a dataset");
    await this.#c.zvols.check();
    const name = fittedVolumeName(requested, config.parentDataset, config.nodeId);
    const id = volumeIdFor(name, this.#c.scope);
    const dataset = childDataset(config.parentDataset, "Volume name", name);
    const capacity = checkCapacity(req.capacity_range);
    const zvol = parseZvolParameters(parameters, { allowSparse: config.allowSparseZvols });
    const params = parseParameters(zvol.rest, config.parameterPolicy);
    if (params.backup && !config.store) {
      throw new CsiError(
        Code.INVALID_ARGUMENT,
        `Parameters ${BACKUP_PARAMETERS.interval} and ${BACKUP_PARAMETERS.keep} need a store, ` +
          `and this plugin has none (start it with --store)`,
      );
    }
    checkRequisite(req.accessibility_requirements, config.topology, config.nodeId);
    const source = contentSource(this.#c, this.#stored, req.volume_content_source);
    if (source && zvol.volblocksize !== undefined) {
      throw new CsiError(
        Code.INVALID_ARGUMENT,
        `Parameter volblocksize does not apply to a clone or a restore: it keeps its source's`,
      );
    }
    const asked = capacity.requiredBytes > 0 || capacity.limitBytes > 0;
    const size = planZvolSize(capacity, content, MIN_VOLUME_BYTES);
    const canonical = JSON.stringify(
      Object.fromEntries(Object.entries(parameters).sort(([a], [b]) => (a < b ? -1 : 1))),
    );
    const sourceText = source ? `${source.kind}:${source.id}` : "";
    const want = { name: requested, capacity, canonical, source: sourceText, content };
    const keys = source && source.kind !== "stored" ? [dataset, source.dataset] : [dataset];
    return await withLock(this.#c.d.locks, keys, async () => {
      if (source) {
        const existing = await this.#c.d.zfs.getProperties(dataset, VOLUME_STATE);
        if (existing) return this.#answerRepeat(id, dataset, existing, want);
      }
      await this.#c.checkSupported(params);
      const props: Record<string, string> = {
        ...params.properties,
        ...(zvol.volblocksize ? { volblocksize: zvol.volblocksize } : {}),
        [MANAGED_PROPERTY]: MANAGED_VALUE,
        [NAME_PROPERTY]: requested,
        [PARAMETERS_PROPERTY]: canonical,
        [ZVOL_CONTENT_PROPERTY]: content,
        ...(source ? { [SOURCE_PROPERTY]: sourceText } : {}),
        ...backupProperties(config.store !== undefined, params),
      };
      let made = size;
      try {
        if (!source) {
          await this.#c.d.zfs.createVolume(
            dataset,
            { sizeBytes: size, sparse: zvol.sparse },
            props,
          );
        } else if (source.kind === "stored") {
          made = await this.#stored.restoreZvolFrom(source.ref, {
            dataset,
            props,
            params,
            content,
            size: asked ? size : 0,
            sparse: zvol.sparse,
          });
        } else {
          made = await this.#cloneFrom(source, {
            dataset,
            props,
            content,
            ...(asked ? { size } : {}),
            sparse: zvol.sparse,
          });
        }
      } catch (err) {
        if (!(err instanceof ZfsError && err.kind === "exists")) throw err;
        const found = await this.#c.d.zfs.getProperties(dataset, VOLUME_STATE);
        if (!found) throw new CsiError(Code.INTERNAL, `Dataset "${dataset}" vanished`);
        return this.#answerRepeat(id, dataset, found, want);
      }
      this.#c.d.log.info("zvol created", { volumeId: id, dataset, volsize: made, content });
      return {
        volume: this.#c.volumeMessage(id, {
          dataset,
          name,
          refquota: made,
          parameters: canonical,
          source: sourceText,
          content,
        }),
      };
    });
  }

  /** DeleteVolume: the zvol is set aside (trash.ts), refused while a node has it staged. */
  async delete(id: string, dataset: string): Promise<unknown> {
    return await withLock(this.#c.d.locks, [dataset], async () => {
      const [found, props, table] = await Promise.all([
        this.#c.d.trash.inspect(dataset),
        this.#c.d.zfs.getProperties(dataset, [
          "type",
          MANAGED_PROPERTY,
          ZVOL_CONTENT_PROPERTY,
          ATTACHED_PROPERTY,
        ]),
        this.#c.d.mounter.table(),
      ]);
      if (!found || !props) return {};
      checkOwnedZvol(dataset, props);
      const attached = userValue(props, ATTACHED_PROPERTY);
      if (attached !== "") {
        throw new CsiError(
          Code.FAILED_PRECONDITION,
          `Volume "${id}" is in use: staged on node "${attached}"; stop the jobs using it ` +
            `first (if that node is gone for good: zfs inherit ${ATTACHED_PROPERTY} ${dataset})`,
        );
      }
      const device = `/dev/zvol/${dataset}`;
      const users = table.filter((e) => e.source === device).map((e) => e.mountPoint);
      if (users.length > 0) {
        throw new CsiError(
          Code.FAILED_PRECONDITION,
          `Volume "${id}" is in use: mounted at ${users.map((u) => `"${u}"`).join(", ")}; ` +
            `stop the jobs using it first`,
        );
      }
      const snapshots = found.check.csiSnapshots
        .map((n) => snapshotIdOf(n, this.#c.scope))
        .filter((s): s is string => s !== undefined);
      if (snapshots.length > 0) {
        throw new CsiError(
          Code.FAILED_PRECONDITION,
          `Volume "${id}" has snapshots (${snapshots.map((s) => `"${s}"`).join(", ")}); ` +
            `delete them first (nomad volume snapshot delete)`,
        );
      }
      if (found.check.obstacles.length > 0) {
        throw new CsiError(
          Code.FAILED_PRECONDITION,
          obstacleMessage(`Volume "${id}" is not deleted`, dataset, found.check.obstacles),
        );
      }
      await this.#stored.keepBackups(id, dataset);
      await this.#c.d.trash.removeVolume(dataset, found);
      return {};
    });
  }

  async checkExists(id: string, dataset: string): Promise<void> {
    await this.contentOf(id, dataset);
  }

  /**
   * What the zvol holds, as recorded on it.
   * @throws {CsiError} NOT_FOUND when it does not exist; FAILED_PRECONDITION when not ours
   */
  async contentOf(id: string, dataset: string): Promise<ZvolContent> {
    const props = await this.#c.d.zfs.getProperties(dataset, VOLUME_STATE);
    if (!props) throw new CsiError(Code.NOT_FOUND, `Volume "${id}" not found`);
    return checkOwnedZvol(dataset, props);
  }

  get(id: string, dataset: string): Promise<unknown> {
    return this.#c.getVolume(id, dataset);
  }

  /**
   * ControllerExpandVolume: volsize grown to the capacity asked for, never shrunk. A filesystem
   * on the zvol is grown by the node (NodeExpandVolume).
   */
  async expand(id: string, dataset: string, capacity: Capacity): Promise<unknown> {
    return await withLock(this.#c.d.locks, [dataset], async () => {
      const props = await this.#c.d.zfs.getProperties(dataset, ZVOL_STATE);
      if (!props) throw new CsiError(Code.NOT_FOUND, `Volume "${id}" not found`);
      const content = checkOwnedZvol(dataset, props);
      const current = parseBytes(props.get("volsize")?.value ?? "0");
      const size = planZvolGrowth(id, current, capacity);
      if (size > current) {
        await this.#c.d.zfs.setProperties(dataset, [["volsize", String(size)]]);
        this.#c.d.log.info("zvol grown", { volumeId: id, from: current, to: size });
      }
      return {
        capacity_bytes: String(size),
        // A filesystem on the zvol is grown where it is mounted; a raw device is its size.
        node_expansion_required: content !== "block",
      };
    });
  }

  /**
   * CreateSnapshot: a zfs snapshot of the zvol here, or in the store (its manifest records
   * that it is a zvol's, and what it holds: backup.ts).
   */
  async snapshot(req: SnapshotRequest): Promise<unknown> {
    const { sourceId, dataset, requested, toStore } = req;
    if (!toStore) return await this.#ordinary.snapshot(req);
    await this.contentOf(sourceId, dataset);
    const volumeName = this.#c.nameOf(dataset);
    const name = fittedSnapshotName(volumeName, dataset, requested, this.#c.d.config.nodeId);
    const entry = await toStore.create(dataset, volumeName, requested, name);
    return { snapshot: this.#c.storedMessage(entry) };
  }

  /**
   * Clones a snapshot of a zvol, or a zvol through a hidden snapshot, into `dataset`; grows it
   * to `size` when that is larger. Returns its volsize.
   */
  async #cloneFrom(
    source: Exclude<Source, { readonly kind: "stored" }>,
    into: {
      readonly dataset: string;
      readonly props: Record<string, string>;
      readonly content: ZvolContent;
      readonly size?: number;
      readonly sparse: boolean;
    },
  ): Promise<number> {
    const { dataset, props, content } = into;
    const what = source.kind === "snapshot" ? "Snapshot" : "Volume";
    const src = await this.#c.d.zfs.getProperties(source.dataset, VOLUME_STATE);
    if (!src) throw new CsiError(Code.NOT_FOUND, `${what} "${source.id}" not found`);
    if (src.get("type")?.value === "filesystem") {
      throw new CsiError(
        Code.INVALID_ARGUMENT,
        `${what} "${source.id}" is of a ZFS dataset: a zvol is made only from a zvol`,
      );
    }
    const had = checkOwnedZvol(source.dataset, src);
    if (had !== content) {
      throw new CsiError(
        Code.INVALID_ARGUMENT,
        `${what} "${source.id}" holds ${had}, and the request asks for ${content}`,
      );
    }
    const volsize = parseBytes(src.get("volsize")?.value ?? "0");
    const size = into.size ?? volsize;
    if (size < volsize) {
      throw new CsiError(
        Code.OUT_OF_RANGE,
        `The source is ${volsize} bytes, more than the requested capacity of ${size} bytes ` +
          `(a zvol is never shrunk)`,
      );
    }
    let snapshot: string;
    if (source.kind === "snapshot") {
      snapshot = source.snapshot;
    } else {
      snapshot = `${source.dataset}@${
        cloneSnapshotComponent(dataset, Math.floor(Date.now() / 1000))
      }`;
      if (byteLength(snapshot) > MAX_DATASET_NAME) {
        throw new CsiError(
          Code.INVALID_ARGUMENT,
          `Volume "${source.id}" has too long a name to clone from: snapshot it with a short ` +
            `name and create from that`,
        );
      }
      try {
        await this.#c.d.zfs.snapshot(snapshot);
      } catch (err) {
        if (!(err instanceof ZfsError && err.kind === "exists")) throw err;
      }
    }
    // A clone reserves nothing of its own; a volume that is not sparse gets its full size.
    await this.#c.d.zfs.clone(snapshot, dataset, {
      ...props,
      ...(into.sparse ? {} : { refreservation: "auto" }),
    });
    if (size > volsize) await this.#c.d.zfs.setProperties(dataset, [["volsize", String(size)]]);
    if (source.kind === "volume") {
      try {
        await this.#c.d.zfs.destroy(snapshot, { deferred: true });
      } catch (err) {
        this.#c.d.log.warn("could not mark a clone's snapshot for deferred destroy", {
          snapshot,
          error: err,
        });
      }
    }
    return size;
  }

  /** Answers a CreateVolume whose zvol exists: the same volume again, or ALREADY_EXISTS. */
  #answerRepeat(
    id: string,
    dataset: string,
    props: PropertyMap,
    want: {
      readonly name: string;
      readonly capacity: Capacity;
      readonly canonical: string;
      readonly source: string;
      readonly content: ZvolContent;
    },
  ): unknown {
    const conflict = (why: string) =>
      new CsiError(Code.ALREADY_EXISTS, `Volume "${id}" already exists ${why}`);
    if (!hasOwnMarker(props, MANAGED_PROPERTY, MANAGED_VALUE)) {
      throw conflict(`as dataset "${dataset}", which zfs-csi does not manage`);
    }
    const record = volumeRecord(this.#c.d.config.parentDataset, dataset, props);
    if (!record || record.content === undefined) {
      throw conflict(`as dataset "${dataset}", which is not a zvol`);
    }
    if (record.content !== want.content) throw conflict(`holding ${record.content}`);
    checkRecordedName(id, dataset, want.name, props);
    if (record.parameters !== want.canonical) {
      throw conflict(`with other parameters (${record.parameters})`);
    }
    if (record.source !== want.source) {
      throw conflict(`with another content source (${record.source || "none"})`);
    }
    const { requiredBytes, limitBytes } = want.capacity;
    const r = record.refquota;
    if ((requiredBytes > 0 && r < requiredBytes) || (limitBytes > 0 && r > limitBytes)) {
      throw conflict(`with another capacity (${r} bytes)`);
    }
    checkRetry(id, want.name, props, Math.floor(Date.now() / 1000));
    this.#c.d.log.info("CreateVolume repeated: answered with the zvol it made", { volumeId: id });
    return { volume: this.#c.volumeMessage(id, record) };
  }
}
