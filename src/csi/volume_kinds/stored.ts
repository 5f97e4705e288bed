/**
 * Snapshots kept in the store, as the controller uses them (stored_snapshots.ts does the work):
 * where CreateSnapshot puts a snapshot, a volume restored from one, a deleted volume's backups
 * kept for the store's retention. Not a volume kind (kind.ts): a content source and a snapshot
 * target of the kinds that are.
 */

import { Code, CsiError } from "../../errors.ts";
import { STORE_UID_PROPERTY } from "../../replicate/backup.ts";
import type { StoredSnapshotRef } from "../../store/snapshot_ids.ts";
import type { SnapshotManifest } from "../../store/layout.ts";
import { StoreError } from "../../store/store.ts";
import type { PropertyList } from "../../zfs/args.ts";
import { parseBytes } from "../../zfs/parse.ts";
import { type VolumeParameters, ZFS_PARAMETERS } from "../../parameters.ts";
import type { StoredSnapshots } from "../stored_snapshots.ts";
import type { KindCommon } from "./common.ts";
import { FORMAT, FORMAT_PROPERTY, type ZvolContent } from "../../volume/zvol.ts";

/** How a request asks for a zvol holding `content`, for messages. */
function zvolRequestHint(content: ZvolContent): string {
  return content === "block" ? "a block capability" : `fs_type "${content}"`;
}

/** The controller's side of the store's snapshots. */
export class StoredKind {
  readonly #c: KindCommon;

  constructor(common: KindCommon) {
    this.#c = common;
  }

  /** The store's snapshots, or FAILED_PRECONDITION naming `id` when there is no store. */
  storeFor(id: string): StoredSnapshots {
    if (this.#c.d.stored) return this.#c.d.stored;
    throw new CsiError(
      Code.FAILED_PRECONDITION,
      `Snapshot "${id}" is kept in a store, and this plugin has none (start it with --store)`,
    );
  }

  /**
   * Whether CreateSnapshot puts the snapshot in the store: parameter `store` ("true" or
   * "false"), by default whenever the plugin has a store.
   */
  storeParameter(
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
    if (value === "true" && !this.#c.d.stored) {
      throw new CsiError(
        Code.INVALID_ARGUMENT,
        `Snapshot parameter store="true": this plugin has no store (start it with --store)`,
      );
    }
    return value === "false" ? undefined : this.#c.d.stored;
  }

  /**
   * Restores the stored snapshot into `dataset` (stored_snapshots.ts); returns the refquota
   * set: the requested size, else the size the volume had when the snapshot was taken.
   */
  async restoreFrom(
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
    const manifest = await this.storeFor(ref.id).restore(ref, dataset, (m) => {
      if (m.zvol) {
        throw new CsiError(
          Code.INVALID_ARGUMENT,
          `Snapshot "${ref.id}" is of a zvol holding ${m.zvol.content}: restore it as a ` +
            `zvol (${zvolRequestHint(m.zvol.content)}), not as a ZFS dataset`,
        );
      }
      checkRestoredKey(ref.id, m.raw, params);
      // CSI: a volume made from a snapshot holds at least the snapshot. Manifests from before
      // referencedBytes say nothing of it; the refquota then refuses what does not fit.
      if (size > 0 && m.referencedBytes !== undefined && size < m.referencedBytes) {
        throw new CsiError(
          Code.OUT_OF_RANGE,
          `Snapshot "${ref.id}" holds ${m.referencedBytes} bytes, more than the requested ` +
            `capacity of ${size} bytes`,
        );
      }
      const refquota = refquotaOf(m.capacityBytes);
      const all = { ...props };
      // Restored under its own name (a delete undone), the volume continues its history in the
      // store: the same record, and increments on the snapshots just received.
      if (m.volume === this.#c.nameOf(dataset)) all[STORE_UID_PROPERTY] = m.volumeUid;
      if (refquota > 0) all.refquota = String(refquota);
      this.#c.sizeProps(all, params, refquota);
      return Object.entries(all) as PropertyList;
    });
    await this.#clearDeletionMark(ref.id, manifest, dataset);
    return refquotaOf(manifest.capacityBytes);
  }

  /**
   * Restored under its own name (a delete undone): the store's mark that the volume was deleted
   * is cleared. A store error only warns: the next backup clears the mark too, and until then
   * the pruner waits out the retention.
   */
  async #clearDeletionMark(
    refId: string,
    manifest: SnapshotManifest,
    dataset: string,
  ): Promise<void> {
    if (manifest.volume !== this.#c.nameOf(dataset)) return;
    try {
      await this.storeFor(refId).volumeRestored(manifest.volume, manifest.volumeUid);
    } catch (err) {
      if (!(err instanceof StoreError)) throw err;
      this.#c.d.log.warn("could not clear the restored volume's deletion mark in the store", {
        dataset,
        error: err,
      });
    }
  }

  /**
   * Restores the stored snapshot of a zvol into `dataset` as a zvol holding `content`
   * (docs/block-volumes.md); returns its volsize: `size` when larger than the snapshot's,
   * else the snapshot's (a zvol is never shrunk). The restored zvol gets the plugin's records
   * anew (`props`: marker, name, fs-type, ...; a stream carries none, see
   * stream_properties.ts) and its format record from the manifest: done only when the source's
   * record said done before the snapshot was taken (then the snapshot holds the whole
   * filesystem the plugin made, and no stage ever formats it); otherwise none, so the first
   * stage decides by what the device holds, as for a clone: the filesystem made is mounted,
   * an empty device formatted, anything else refused. Never `begun`, which would wipe it.
   * @throws {CsiError} INVALID_ARGUMENT for a snapshot of a dataset or of a zvol holding
   *   something else, OUT_OF_RANGE for a size below the snapshot's volsize; before any receive
   */
  async restoreZvolFrom(
    ref: StoredSnapshotRef,
    into: {
      readonly dataset: string;
      readonly props: Record<string, string>;
      readonly params: VolumeParameters;
      readonly content: ZvolContent;
      /** The volsize asked for, 0 for the snapshot's own. */
      readonly size: number;
      readonly sparse: boolean;
    },
  ): Promise<number> {
    const { dataset, params, content, size } = into;
    const createOnly = Object.keys(params.properties).filter((k) =>
      Object.hasOwn(ZFS_PARAMETERS, k) && ZFS_PARAMETERS[k]!.createOnly
    );
    if (createOnly.length > 0) {
      throw new CsiError(
        Code.INVALID_ARGUMENT,
        `Parameter ${createOnly.map((k) => `"${k}"`).join(", ")} cannot be given to a volume ` +
          `restored from the store: the restored zvol keeps the value of its backup`,
      );
    }
    const manifest = await this.storeFor(ref.id).restore(ref, dataset, (m) => {
      checkZvolSource(ref.id, m, content, size);
      checkRestoredKey(ref.id, m.raw, params);
      const all: Record<string, string> = {
        ...into.props,
        // Received zvols reserve nothing: a full one reserves its size again, as a clone does.
        refreservation: into.sparse ? "none" : "auto",
      };
      if (m.zvol?.formatted && content !== "block") all[FORMAT_PROPERTY] = FORMAT.done;
      if (m.volume === this.#c.nameOf(dataset)) all[STORE_UID_PROPERTY] = m.volumeUid;
      return Object.entries(all) as PropertyList;
    });
    await this.#clearDeletionMark(ref.id, manifest, dataset);
    // What zfs made, not what the manifest says (untrusted; checked before the receive).
    const made = await this.#c.d.zfs.getProperties(dataset, ["volsize"]);
    const volsize = parseBytes(made?.get("volsize")?.value ?? "0");
    if (size > volsize) {
      // zfs grows a full refreservation with the volsize (as ControllerExpandVolume relies on).
      await this.#c.d.zfs.setProperties(dataset, [["volsize", String(size)]]);
      return size;
    }
    return volsize;
  }

  /**
   * Before a volume goes: marks its backups in the store deleted, so they stay for the store's
   * deleted retention. A store that cannot be reached does not stop the delete (the backups
   * then stay until an operator removes them), but the log says so.
   */
  async keepBackups(id: string, dataset: string): Promise<void> {
    const stored = this.#c.d.stored;
    if (!stored) return;
    const props = await this.#c.d.zfs.getProperties(dataset, [STORE_UID_PROPERTY]);
    const uid = props?.get(STORE_UID_PROPERTY);
    if (!uid || uid.source !== "local") return;
    try {
      await stored.volumeDeleted(this.#c.nameOf(dataset), uid.value);
    } catch (err) {
      if (!(err instanceof StoreError)) throw err;
      this.#c.d.log.warn("could not mark the volume's backups deleted; they stay in the store", {
        volumeId: id,
        store: stored.description,
        error: err,
      });
    }
  }
}

/**
 * Refuses a stored snapshot a zvol holding `content` of `size` bytes (0: the snapshot's own)
 * cannot be made from: a dataset's, a zvol's holding something else, or a larger zvol's (a zvol
 * is never shrunk). For a restore here and a follow zvol made from it, before anything is
 * received or copied.
 * @throws {CsiError} INVALID_ARGUMENT, OUT_OF_RANGE
 */
export function checkZvolSource(
  id: string,
  m: SnapshotManifest,
  content: ZvolContent,
  size: number,
): void {
  if (!m.zvol) {
    throw new CsiError(
      Code.INVALID_ARGUMENT,
      `Snapshot "${id}" is of a ZFS dataset: a zvol is restored only from a zvol's ` +
        `snapshot (ask for a filesystem volume without fs_type ext4/xfs or a block capability)`,
    );
  }
  if (m.zvol.content !== content) {
    throw new CsiError(
      Code.INVALID_ARGUMENT,
      `Snapshot "${id}" is of a zvol holding ${m.zvol.content}, and the request asks ` +
        `for ${content}`,
    );
  }
  if (size > 0 && size < m.capacityBytes) {
    throw new CsiError(
      Code.OUT_OF_RANGE,
      `Snapshot "${id}" is of a zvol of ${m.capacityBytes} bytes, more than the ` +
        `requested capacity of ${size} bytes (a zvol is never shrunk)`,
    );
  }
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
