/**
 * What an ordinary volume is made from on this node (ordinary.ts): the content source a
 * CreateVolume names, checked and resolved, and the clone of a snapshot or volume here.
 */

import { Code, CsiError, ZfsError } from "../../errors.ts";
import { resolveSnapshot, resolveVolume } from "../../zfs/ids.ts";
import { byteLength, cloneSnapshotComponent, MAX_DATASET_NAME } from "../../zfs/names.ts";
import { parseBytes } from "../../zfs/parse.ts";
import { checkOwned } from "../../volume/datasets.ts";
import { checkSizes, type VolumeParameters } from "../../parameters.ts";
import {
  isStoredSnapshotId,
  parseStoredSnapshotId,
  type StoredSnapshotRef,
} from "../../store/snapshot_ids.ts";
import type { VolumeContentSource } from "../types.ts";
import { required } from "../validate.ts";
import { type KindCommon, VOLUME_STATE } from "./common.ts";
import type { StoredKind } from "./stored.ts";

/** A checked content source. */
export type Source =
  | {
    readonly kind: "snapshot";
    readonly id: string;
    readonly snapshot: string;
    readonly dataset: string;
  }
  | { readonly kind: "volume"; readonly id: string; readonly dataset: string }
  | { readonly kind: "stored"; readonly id: string; readonly ref: StoredSnapshotRef };

/** Checks a content source and resolves it on this node. */
export function contentSource(
  c: KindCommon,
  storedKind: StoredKind,
  src: VolumeContentSource | null | undefined,
): Source | undefined {
  if (!src) return undefined;
  if (src.snapshot) {
    const id = required("volume_content_source.snapshot.snapshot_id", src.snapshot.snapshot_id);
    if (isStoredSnapshotId(id)) {
      const stored = parseStoredSnapshotId(id);
      if (!stored) throw new CsiError(Code.NOT_FOUND, `Snapshot "${id}" not found`);
      storedKind.storeFor(id);
      return { kind: "stored", id, ref: stored };
    }
    let ref;
    try {
      ref = resolveSnapshot(id, c.scope, { mutating: true });
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
      dataset = resolveVolume(id, c.scope, { mutating: true }).dataset;
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
export async function cloneFrom(
  c: KindCommon,
  source: Exclude<Source, { readonly kind: "stored" }>,
  into: {
    readonly dataset: string;
    readonly props: Record<string, string>;
    readonly params: VolumeParameters;
    readonly size: number;
  },
): Promise<number> {
  const { dataset, props, params, size } = into;
  const src = await c.d.zfs.getProperties(source.dataset, VOLUME_STATE);
  const what = source.kind === "snapshot" ? "Snapshot" : "Volume";
  if (!src) throw new CsiError(Code.NOT_FOUND, `${what} "${source.id}" not found`);
  checkOwned(source.dataset, src);
  let snapshot: string;
  let referenced: number;
  if (source.kind === "snapshot") {
    snapshot = source.snapshot;
    const snap = await c.d.zfs.getProperties(snapshot, ["referenced"]);
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
  c.sizeProps(props, params, refquota);
  if (source.kind === "volume") {
    try {
      await c.d.zfs.snapshot(snapshot);
    } catch (err) {
      // Made within this second by an attempt that failed after it: as fresh, so use it.
      if (!(err instanceof ZfsError && err.kind === "exists")) throw err;
    }
  }
  await c.d.zfs.clone(snapshot, dataset, props);
  if (source.kind === "volume") {
    try {
      // Marked now, gone with the clone: ZFS destroys it when no clone needs it any more.
      await c.d.zfs.destroy(snapshot, { deferred: true });
    } catch (err) {
      c.d.log.warn("could not mark a clone's snapshot for deferred destroy", {
        snapshot,
        error: err,
      });
    }
  }
  return refquota;
}
