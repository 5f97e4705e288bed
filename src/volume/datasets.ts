/**
 * The datasets behind volumes: find, create and check ownership. A dataset is used only if it
 * carries our marker property; a same-named foreign dataset is never adopted silently.
 */

import { Code, CsiError, ZfsError } from "../errors.ts";
import type { Mounter } from "../mount/mounter.ts";
import { describeMount, type MountEntry, mountsAt } from "../mount/mountinfo.ts";
import { MANAGED_PROPERTY, MANAGED_VALUE, STAGED_PROPERTY } from "../zfs/names.ts";
import { hasOwnMarker, parseBytes, type PropertyMap } from "../zfs/parse.ts";
import type { Zfs } from "../zfs/zfs.ts";

/** Properties read for every volume dataset. */
export const VOLUME_PROPERTIES = [
  "type",
  "mountpoint",
  "mounted",
  "refquota",
  "used",
  "available",
  MANAGED_PROPERTY,
  STAGED_PROPERTY,
] as const;

/** A dataset known to be mounted, with the mount table that showed it. */
export interface MountedDataset extends VolumeDataset {
  /** The mount table as read to verify the mount; callers reuse it rather than read it again. */
  readonly table: readonly MountEntry[];
  /** The dataset's {@linkcode VOLUME_PROPERTIES}, as read before it was mounted. */
  readonly props: PropertyMap;
}

/** What the node needs to know about a volume's dataset. */
export interface VolumeDataset {
  readonly dataset: string;
  readonly mountpoint: string;
  readonly mounted: boolean;
  /** 0 when no refquota is set. */
  readonly refquota: number;
}

function toVolumeDataset(dataset: string, props: PropertyMap): VolumeDataset {
  return {
    dataset,
    mountpoint: props.get("mountpoint")?.value ?? "",
    mounted: props.get("mounted")?.value === "yes",
    refquota: parseBytes(props.get("refquota")?.value ?? "0"),
  };
}

/**
 * Checks that `props` describe a filesystem we own.
 * @throws {CsiError} FAILED_PRECONDITION saying how to adopt a foreign dataset
 */
export function checkOwned(dataset: string, props: PropertyMap): void {
  if (!hasOwnMarker(props, MANAGED_PROPERTY, MANAGED_VALUE)) {
    throw new CsiError(
      Code.FAILED_PRECONDITION,
      `Dataset "${dataset}" exists but is not managed by zfs-csi; to hand it over, run ` +
        `"zfs set ${MANAGED_PROPERTY}=${MANAGED_VALUE} ${dataset}"`,
    );
  }
  if (props.get("type")?.value !== "filesystem") {
    throw new CsiError(Code.FAILED_PRECONDITION, `Dataset "${dataset}" is not a filesystem`);
  }
}

/**
 * Checks that `dataset` is ours and a filesystem or a zvol: for what both kinds of volume share
 * (their snapshots).
 * @throws {CsiError} FAILED_PRECONDITION otherwise
 */
export function checkOwnedVolume(dataset: string, props: PropertyMap): void {
  if (
    props.get("type")?.value === "volume" && hasOwnMarker(props, MANAGED_PROPERTY, MANAGED_VALUE)
  ) {
    return;
  }
  checkOwned(dataset, props);
}

/** Finds, creates and mounts volume datasets. */
export class Datasets {
  readonly #zfs: Zfs;
  readonly #mounter: Mounter;

  constructor(zfs: Zfs, mounter: Mounter) {
    this.#zfs = zfs;
    this.#mounter = mounter;
  }

  /** Properties of a volume's dataset, or undefined when it does not exist. */
  inspect(dataset: string): Promise<PropertyMap | undefined> {
    return this.#zfs.getProperties(dataset, VOLUME_PROPERTIES);
  }

  /**
   * The owned dataset of a volume.
   * @throws {CsiError} NOT_FOUND if missing, FAILED_PRECONDITION if not ours
   */
  async get(volumeId: string, dataset: string): Promise<VolumeDataset> {
    const props = await this.inspect(dataset);
    if (!props) {
      throw new CsiError(
        Code.NOT_FOUND,
        `Volume "${volumeId}" not found (no dataset "${dataset}")`,
      );
    }
    checkOwned(dataset, props);
    return toVolumeDataset(dataset, props);
  }

  /**
   * The dataset of a volume, created if missing (with `sizeBytes` as refquota), mounted at its
   * own mountpoint, visible in this mount namespace, and the top mount there (what a bind mount
   * of the mountpoint takes).
   * @throws {CsiError} NOT_FOUND if missing without a size, FAILED_PRECONDITION if not ours, not
   *   mountable here, or covered by another mount
   */
  async ensureMounted(
    volumeId: string,
    dataset: string,
    sizeBytes?: number,
  ): Promise<MountedDataset> {
    // The mount table is read alongside the properties: for a volume that is already mounted
    // (the usual case) both answers come from one round of processes instead of two.
    const propsRead = this.inspect(dataset);
    let tableRead: Promise<MountEntry[]> | undefined = this.#mounter.table();
    // Awaited below, or dropped when a check fails first: never an unhandled rejection.
    tableRead.catch(() => {});
    let props = await propsRead;
    if (!props) {
      // Read before the dataset existed: read again once it is created and mounted.
      tableRead = undefined;
      if (sizeBytes === undefined) {
        throw new CsiError(
          Code.NOT_FOUND,
          `Volume "${volumeId}" not found: dataset "${dataset}" does not exist and the volume ` +
            `context has no "size" to create it with`,
        );
      }
      try {
        await this.#zfs.create(dataset, {
          refquota: String(sizeBytes),
          [MANAGED_PROPERTY]: MANAGED_VALUE,
        });
      } catch (err) {
        // Created meanwhile by someone else: fall through to the ownership check.
        if (!(err instanceof ZfsError && err.kind === "exists")) throw err;
      }
      props = await this.inspect(dataset);
      if (!props) throw new CsiError(Code.INTERNAL, `Dataset "${dataset}" vanished after creation`);
    }
    checkOwned(dataset, props);
    let ds = toVolumeDataset(dataset, props);
    // Where a volume is mounted is the plugin's choice (inherited from the parent) or the
    // operator's (set locally); never a stream's. The receive paths refuse such streams already
    // (src/replicate/stream_properties.ts); this holds for a dataset received any other way.
    const source = props.get("mountpoint")?.source ?? "";
    if (source.startsWith("received")) {
      throw new CsiError(
        Code.FAILED_PRECONDITION,
        `Dataset "${dataset}" has mountpoint "${ds.mountpoint}" from a received stream (source ` +
          `"${source}"), which zfs-csi never mounts: run "zfs inherit mountpoint ${dataset}" ` +
          `once you know the dataset's data is what you expect`,
      );
    }
    if (!ds.mountpoint.startsWith("/")) {
      throw new CsiError(
        Code.FAILED_PRECONDITION,
        `Dataset "${dataset}" has mountpoint "${ds.mountpoint}"; zfs-csi needs it mounted by zfs ` +
          `(run "zfs inherit mountpoint ${dataset}")`,
      );
    }
    if (!ds.mounted) {
      await this.#zfs.mount(dataset);
      ds = { ...ds, mounted: true };
      tableRead = undefined;
    }
    const table = await (tableRead ?? this.#mounter.table());
    this.#mounter.learnZfsType(table, dataset, ds.mountpoint);
    const judge = this.#mounter.judge();
    const here = mountsAt(table, ds.mountpoint);
    if (!here.some((e) => judge.isMountOf(e, dataset))) {
      throw new CsiError(
        Code.FAILED_PRECONDITION,
        `Dataset "${dataset}" is mounted at "${ds.mountpoint}" but the plugin cannot see it there: ` +
          `bind-mount the parent dataset's mountpoint into the plugin task with shared propagation`,
      );
    }
    // A bind mount of the mountpoint takes what a process sees there: the top mount. Anything
    // stacked on the dataset (an admin's bind mount, a user's FUSE mount, another dataset with
    // the same mountpoint) would be handed to the job instead of the volume.
    const top = here.at(-1)!;
    if (!judge.isMountOf(top, dataset)) {
      throw new CsiError(
        Code.FAILED_PRECONDITION,
        `Dataset "${dataset}" is mounted at "${ds.mountpoint}", but another mount lies on top ` +
          `of it there: ${describeMount(top)}; unmount that (umount "${ds.mountpoint}") and retry`,
      );
    }
    return { ...ds, table, props };
  }
}
