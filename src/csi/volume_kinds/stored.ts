/**
 * Snapshots kept in the store, as the controller uses them (stored_snapshots.ts does the work):
 * where CreateSnapshot puts a snapshot, a volume restored from one, a deleted volume's backups
 * kept for the store's retention. Not a volume kind (kind.ts): a content source and a snapshot
 * target of the kinds that are.
 */

import { Code, CsiError } from "../../errors.ts";
import { STORE_UID_PROPERTY } from "../../replicate/backup.ts";
import type { StoredSnapshotRef } from "../../store/snapshot_ids.ts";
import { StoreError } from "../../store/store.ts";
import type { PropertyList } from "../../zfs/args.ts";
import { type VolumeParameters, ZFS_PARAMETERS } from "../../parameters.ts";
import type { StoredSnapshots } from "../stored_snapshots.ts";
import type { KindCommon } from "./common.ts";

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
    if (manifest.volume === this.#c.nameOf(dataset)) {
      try {
        await this.storeFor(ref.id).volumeRestored(manifest.volume, manifest.volumeUid);
      } catch (err) {
        if (!(err instanceof StoreError)) throw err;
        // The next backup clears the mark too; until then the pruner waits out the retention.
        this.#c.d.log.warn("could not clear the restored volume's deletion mark in the store", {
          dataset,
          error: err,
        });
      }
    }
    return refquotaOf(manifest.capacityBytes);
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
