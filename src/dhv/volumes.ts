/**
 * Host volumes: the create and delete of Nomad's dynamic host volume contract, on the same
 * parent dataset, with the same safety as the CSI controller: the ownership marker, the parameter
 * allowlist and operator policy, quota from capacity, soft delete with its undo, subtree checks.
 *
 * Nomad runs create for a new volume, for every update (capacity changes), and again for every
 * volume at every agent start, which is how volumes come back after a reboot: create converges on
 * the volume as asked (exists, owned by this volume id, mounted at its path, at least as large as
 * asked) and changes only what differs. Delete is idempotent and sets the dataset aside.
 * With a store, backups are as a CSI volume's (backups.ts).
 */

import type { Config } from "../config.ts";
import { Code, CsiError, ZfsError } from "../errors.ts";
import type { Logger } from "../log.ts";
import { MIN_VOLUME_BYTES } from "../size.ts";
import { PARAMETERS_PROPERTY, userValue } from "../volume/catalog.ts";
import { checkOwned } from "../volume/datasets.ts";
import { checkSizes, parseParameters, sizeOf, type VolumeParameters } from "../parameters.ts";
import { planSize, SIZE_STATE } from "../volume/sizing.ts";
import { obstacleMessage } from "../volume/subtree.ts";
import type { Trash } from "../volume/trash.ts";
import {
  DELETED_NAME_PROPERTY,
  MANAGED_PROPERTY,
  MANAGED_VALUE,
  NAME_PROPERTY,
} from "../zfs/names.ts";
import type { PropertyMap } from "../zfs/parse.ts";
import type { Store } from "../store/store.ts";
import type { Zfs } from "../zfs/zfs.ts";
import { hostBackupProperties, keepHostBackups } from "./backups.ts";
import type { CreateRequest, DeleteRequest } from "./contract.ts";
import {
  HOST_NAMESPACE_PROPERTY,
  HOST_VOLUME_ID_PROPERTY,
  hostDataset,
  isHostDataset,
} from "../volume/host_names.ts";

/** What the host volume operations work with. */
export interface HostVolumeDeps {
  readonly config: Config;
  readonly zfs: Zfs;
  readonly trash: Trash;
  readonly log: Logger;
  /** Opens the config's store, for delete to keep the volume's backups (with `--store`). */
  readonly openStore?: () => Promise<Store>;
}

/** What create answers: the path Nomad bind-mounts and the size (0: unlimited). */
export interface CreatedVolume {
  readonly path: string;
  readonly bytes: number;
}

/** Properties read of a host volume before acting on it. */
const HOST_STATE = [
  ...SIZE_STATE,
  "mountpoint",
  "mounted",
  NAME_PROPERTY,
  HOST_VOLUME_ID_PROPERTY,
  HOST_NAMESPACE_PROPERTY,
] as const;

/** Creates and deletes host volumes. */
export class HostVolumes {
  readonly #d: HostVolumeDeps;

  constructor(deps: HostVolumeDeps) {
    this.#d = deps;
  }

  /**
   * Makes the volume exist as asked, or confirms it does: idempotent per volume id.
   * @throws {CsiError} INVALID_ARGUMENT / OUT_OF_RANGE for requests that cannot be had as
   *   asked (parameters, capacity, a shrink); FAILED_PRECONDITION / ALREADY_EXISTS when the
   *   dataset belongs to something else
   * @throws {ZfsError} when zfs fails
   */
  async create(req: CreateRequest): Promise<CreatedVolume> {
    const parent = this.#d.config.parentDataset;
    const dataset = hostDataset(parent, req.namespace, req.name);
    const params = parseParameters(req.parameters, this.#d.config.parameterPolicy);
    const backups = hostBackupProperties(this.#d.config, dataset, params);
    let size = req.minBytes > 0 ? req.minBytes : req.maxBytes;
    if (size > 0) size = Math.max(size, MIN_VOLUME_BYTES);
    if (req.maxBytes > 0 && size > req.maxBytes) {
      throw new CsiError(
        Code.OUT_OF_RANGE,
        `capacity_max (${req.maxBytes} bytes) is below the smallest volume, ` +
          `${MIN_VOLUME_BYTES} bytes (1MiB)`,
      );
    }
    checkSizes(params, size);
    const log = this.#d.log.child({ volumeId: req.id, dataset });
    const existing = await this.#d.zfs.getProperties(dataset, HOST_STATE);
    if (existing) return await this.#converge(req, dataset, existing, params, size);
    const props: Record<string, string> = {
      ...backups,
      ...params.properties,
      [MANAGED_PROPERTY]: MANAGED_VALUE,
      [NAME_PROPERTY]: req.name,
      [HOST_VOLUME_ID_PROPERTY]: req.id,
      [HOST_NAMESPACE_PROPERTY]: req.namespace,
      [PARAMETERS_PROPERTY]: params.canonical,
      mountpoint: req.path,
    };
    if (size > 0) props.refquota = String(size);
    if (params.quota) props.quota = String(sizeOf(params.quota, size));
    if (params.refreservation) props.refreservation = String(sizeOf(params.refreservation, size));
    try {
      await this.#d.zfs.create(dataset, props);
    } catch (err) {
      if (!(err instanceof ZfsError && err.kind === "exists")) throw err;
      // Made meanwhile (by hand, or a create Nomad did not serialize): judge it as found.
      const made = await this.#d.zfs.getProperties(dataset, HOST_STATE);
      if (!made) throw new CsiError(Code.INTERNAL, `Dataset "${dataset}" vanished`);
      return await this.#converge(req, dataset, made, params, size);
    }
    await this.#ensureMounted(dataset);
    log.info("host volume created", { path: req.path, refquota: size, namespace: req.namespace });
    return { path: req.path, bytes: size };
  }

  /**
   * Sets the volume aside (soft delete): idempotent, and a volume that is already gone is fine.
   * The dataset is found by the volume id it records, never by Nomad's created path.
   * @throws {CsiError} FAILED_PRECONDITION when something not made by zfs-csi is in the way
   * @throws {ZfsError} when zfs fails (busy: still mounted in a task)
   */
  async delete(req: DeleteRequest): Promise<void> {
    if (req.createdPath !== req.path) {
      // Nomad sends the volumes dir itself after a first create it failed to save.
      this.#d.log.warn("DHV_CREATED_PATH is not the volume's path; deleting by volume id", {
        volumeId: req.id,
        createdPath: req.createdPath,
        path: req.path,
      });
    }
    const dataset = await this.#findById(req);
    if (dataset === undefined) {
      this.#d.log.info("host volume already gone", { volumeId: req.id });
      return;
    }
    const found = await this.#d.trash.inspect(dataset);
    if (!found) return;
    checkOwned(dataset, found.props);
    if (found.check.obstacles.length > 0) {
      throw new CsiError(
        Code.FAILED_PRECONDITION,
        obstacleMessage(`Host volume "${req.id}" is not deleted`, dataset, found.check.obstacles),
      );
    }
    if (this.#d.config.store && this.#d.openStore) {
      await keepHostBackups({
        zfs: this.#d.zfs,
        parentDataset: this.#d.config.parentDataset,
        openStore: this.#d.openStore,
        log: this.#d.log,
      }, dataset);
    }
    await this.#d.trash.removeVolume(dataset, found);
    const hidden = await this.#hiddenNameOf(dataset);
    this.#d.log.info("host volume set aside", {
      volumeId: req.id,
      dataset,
      ...(hidden ? { deletedAs: hidden } : {}),
      retentionSeconds: this.#d.config.deletedRetentionSeconds,
      undo: hidden
        ? `zfs rename ${hidden} ${dataset} && zfs set canmount=on ${dataset}, then ` +
          `nomad volume create the same spec and follow what it says about the volume id`
        : undefined,
    });
  }

  /**
   * The host volume's dataset, if any: where its namespace and name put it (when Nomad sent
   * them), else any host volume below the parent recording this volume id.
   */
  async #findById(req: DeleteRequest): Promise<string | undefined> {
    const parent = this.#d.config.parentDataset;
    if (req.namespace !== "" && req.name !== "") {
      const dataset = hostDataset(parent, req.namespace, req.name);
      const props = await this.#d.zfs.getProperties(dataset, [HOST_VOLUME_ID_PROPERTY]);
      // Another volume of the same name (made after this one was set aside) is not this one.
      if (props && ownValue(props, HOST_VOLUME_ID_PROPERTY) === req.id) return dataset;
    }
    const tree = await this.#d.zfs.getTree(parent, 1, ["type", HOST_VOLUME_ID_PROPERTY]);
    for (const [name, props] of tree ?? []) {
      if (!isHostDataset(parent, name)) continue;
      if (ownValue(props, HOST_VOLUME_ID_PROPERTY) === req.id) return name;
    }
    return undefined;
  }

  /** Where the trash put `dataset` (the child recording it as its old name), for the undo. */
  async #hiddenNameOf(dataset: string): Promise<string | undefined> {
    try {
      const tree = await this.#d.zfs.getTree(this.#d.config.parentDataset, 1, [
        DELETED_NAME_PROPERTY,
      ]);
      for (const [name, props] of tree ?? []) {
        if (ownValue(props, DELETED_NAME_PROPERTY) === dataset) return name;
      }
    } catch {
      // Only for the log line.
    }
    return undefined;
  }

  /** Answers a create whose dataset exists: the same volume brought to what is asked, or a refusal. */
  async #converge(
    req: CreateRequest,
    dataset: string,
    props: PropertyMap,
    params: VolumeParameters,
    size: number,
  ): Promise<CreatedVolume> {
    checkOwned(dataset, props);
    const ownerId = ownValue(props, HOST_VOLUME_ID_PROPERTY);
    if (ownerId === undefined) {
      throw new CsiError(
        Code.FAILED_PRECONDITION,
        `Dataset "${dataset}" is not a host volume (it has no ${HOST_VOLUME_ID_PROPERTY}); ` +
          `zfs-csi never hands a dataset made another way to a host volume`,
      );
    }
    if (ownerId !== req.id) {
      throw new CsiError(
        Code.ALREADY_EXISTS,
        `Host volume "${req.name}" in namespace "${req.namespace}" already exists as dataset ` +
          `"${dataset}", for another volume id ("${ownerId}", not "${req.id}"). Delete that ` +
          `volume in Nomad first, or, to hand this dataset to the new volume (e.g. after undoing ` +
          `a delete), run "zfs set ${HOST_VOLUME_ID_PROPERTY}=${req.id} ${dataset}"`,
      );
    }
    const namespace = ownValue(props, HOST_NAMESPACE_PROPERTY);
    if (namespace !== req.namespace) {
      throw new CsiError(
        Code.ALREADY_EXISTS,
        `Dataset "${dataset}" records namespace "${namespace ?? ""}", not "${req.namespace}"`,
      );
    }
    const recorded = userValue(props, PARAMETERS_PROPERTY) || "{}";
    if (recorded !== params.canonical) {
      throw new CsiError(
        Code.INVALID_ARGUMENT,
        `Host volume "${req.id}" was created with parameters ${recorded}; they cannot change ` +
          `(asked: ${params.canonical})`,
      );
    }
    const plan = planSize(req.id, props, { requiredBytes: size, limitBytes: req.maxBytes });
    const changes = [...plan.changes];
    if (props.get("mountpoint")?.value !== req.path) changes.push(["mountpoint", req.path]);
    if (changes.length > 0) {
      await this.#d.zfs.setProperties(dataset, changes);
      this.#d.log.info("host volume updated", {
        volumeId: req.id,
        dataset,
        set: Object.fromEntries(changes),
      });
    }
    if (props.get("mounted")?.value !== "yes" || changes.some(([k]) => k === "mountpoint")) {
      await this.#ensureMounted(dataset);
    }
    return { path: req.path, bytes: plan.refquota };
  }

  /** Mounts the dataset at its mountpoint unless it is mounted. */
  async #ensureMounted(dataset: string): Promise<void> {
    const props = await this.#d.zfs.getProperties(dataset, ["mounted"]);
    if (props?.get("mounted")?.value === "yes") return;
    await this.#d.zfs.mount(dataset);
  }
}

/** A user property set on the dataset itself (not inherited), or undefined. */
function ownValue(props: PropertyMap, name: string): string | undefined {
  const v = props.get(name);
  if (!v || v.value === "-" || !(v.source === "local" || v.source.startsWith("received"))) {
    return undefined;
  }
  return v.value;
}
