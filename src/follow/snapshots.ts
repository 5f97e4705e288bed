/**
 * CSI snapshots of volumes that follow their job. Such a volume's data is in the store, up to
 * its owner object's head, whichever node holds it; so a snapshot of it is the head's stored
 * snapshot, pinned: its manifest becomes kind "requested" with the CSI name, which the keep
 * policy never prunes, nor its chain (src/store/policy.ts). Nothing is sent and no node is
 * asked: the snapshot is ready at once, and as old as the last copy in the store (the head's
 * `createdAt`: at most one backup_interval plus an upload while a node holds the volume; the
 * release at NodeUnstage stores a final one).
 *
 * DeleteSnapshot of one of them unpins it (kind "scheduled" again) while it is on the head's
 * chain, which the next stage anywhere receives, or newer than the head (the holder's upload
 * the head is about to move to): those are never removed by a delete (head.ts keptByHead). Off
 * the chain and older than the head it goes as any stored snapshot does (records.ts
 * releaseStored).
 */

import { Code, CsiError } from "../errors.ts";
import type { Logger } from "../log.ts";
import {
  type ManifestCache,
  readManifest,
  readManifests,
  type ReleaseOutcome,
  releaseStored,
} from "../replicate/records.ts";
import { encodeJson, parseManifest } from "../store/chain.ts";
import { manifestKey, type SnapshotManifest, volumesPrefix } from "../store/layout.ts";
import type { StoredSnapshotRef } from "../store/snapshot_ids.ts";
import { storedSnapshotSize } from "../store/snapshot_size.ts";
import { type Store, StoreError } from "../store/store.ts";
import { encodeComponent } from "../zfs/names.ts";
import { keptByHead } from "./head.ts";
import { readOwner } from "./owner.ts";

/** Lost races in a row before a change gives up (each loser reads again). */
const ATTEMPTS = 5;

/** What DeleteSnapshot did to a follow volume's stored snapshot. */
export type FollowSnapshotDeleted = ReleaseOutcome | "unpinned";

/** See the module doc. */
export class FollowSnapshots {
  readonly #store: Store;
  readonly #log: Logger;
  /** Manifests read before, by etag (a name check lists every volume's). */
  readonly #cache: ManifestCache = new Map();

  constructor(store: Store, log: Logger) {
    this.#store = store;
    this.#log = log;
  }

  /**
   * CreateSnapshot of follow volume `volume` named `csiName`: pins the head's stored snapshot
   * (see the module doc). A repeat answers the snapshot of that name, wherever the head is now.
   * @returns the pinned manifest
   * @throws {CsiError} NOT_FOUND for a volume the store does not have (or deleted);
   *   ALREADY_EXISTS when another volume has a snapshot of this name; FAILED_PRECONDITION when
   *   the store has no copy yet, or its last copy already is a snapshot of another name
   * @throws {StoreError} when the store fails
   */
  async create(volume: string, volumeId: string, csiName: string): Promise<SnapshotManifest> {
    const volumeKey = encodeComponent("Volume name", volume);
    const named = await this.#named(csiName);
    const other = named.find((m) => m.volume !== volume);
    if (other) {
      throw new CsiError(
        Code.ALREADY_EXISTS,
        `A snapshot named "${csiName}" already exists in ${this.#store.description}, of ` +
          `another volume ("${other.volume}")`,
      );
    }
    const same = named.find((m) => m.volume === volume);
    if (same) return same;
    for (let attempt = 1;; attempt++) {
      const r = (await readOwner(this.#store, volumeKey))?.record;
      if (!r || r.state === "deleted") {
        throw new CsiError(Code.NOT_FOUND, `Source volume "${volumeId}" not found`);
      }
      if (r.head === null) {
        throw new CsiError(
          Code.FAILED_PRECONDITION,
          `Volume "${volumeId}" has no copy in ${this.#store.description} yet (no node has ` +
            `staged and stored it): there is nothing to snapshot`,
        );
      }
      const key = manifestKey(volumeKey, r.head);
      const got = await this.#store.getBytes(key);
      if (!got) {
        throw new CsiError(
          Code.DATA_LOSS,
          `Volume "${volumeId}": the store's head (snapshot guid ${r.head}) has no manifest`,
        );
      }
      const head = parseManifest(got.bytes, { key });
      if (head.kind === "requested" && head.csiName !== undefined) {
        throw new CsiError(
          Code.FAILED_PRECONDITION,
          `Volume "${volumeId}": its last copy in the store (taken at ${head.createdAt}) already ` +
            `is snapshot "${head.csiName}"; a snapshot named "${csiName}" would hold the same ` +
            `data. Use that one, or snapshot again once a newer copy is stored (after the next ` +
            `backup_interval, or a move or NodeUnstage)`,
        );
      }
      const pinned: SnapshotManifest = { ...head, kind: "requested", csiName };
      try {
        await this.#store.putBytes(key, encodeJson(pinned), { ifMatch: got.etag });
        this.#log.info("follow volume's last copy in the store pinned as a snapshot", {
          volume,
          snapshot: csiName,
          guid: head.guid,
          createdAt: head.createdAt,
        });
        return pinned;
      } catch (err) {
        if (!(err instanceof StoreError && err.kind === "precondition_failed")) throw err;
        if (attempt >= ATTEMPTS) throw err;
      }
    }
  }

  /**
   * The size CSI answers for stored snapshot `m` (src/store/snapshot_size.ts): recorded in its
   * manifest, else bounded by its chain, which only then is read.
   * @throws {StoreError} when the store fails
   */
  async sizeOf(m: SnapshotManifest): Promise<number> {
    if (m.referencedBytes !== undefined) return m.referencedBytes;
    const volumeKey = encodeComponent("Volume name", m.volume);
    const { manifests } = await readManifests(this.#store, volumeKey, this.#log, this.#cache);
    return storedSnapshotSize(m, manifests);
  }

  /**
   * DeleteSnapshot of a stored snapshot of a follow volume (see the module doc).
   * @returns undefined when `ref` is not of a volume that follows its job (no owner object)
   * @throws {StoreError} when the store fails
   */
  async delete(ref: StoredSnapshotRef): Promise<FollowSnapshotDeleted | undefined> {
    if (!await readOwner(this.#store, ref.volumeKey)) return undefined;
    const key = manifestKey(ref.volumeKey, ref.guid);
    for (let attempt = 1;; attempt++) {
      const got = await this.#store.getBytes(key);
      if (!got) return "absent";
      const manifest = parseManifest(got.bytes, { key });
      const { manifests } = await readManifests(this.#store, ref.volumeKey, this.#log, this.#cache);
      const kept = await keptByHead(this.#store, ref.volumeKey, manifests);
      if (!kept.has(ref.guid)) {
        return await releaseStored(this.#store, ref.volumeKey, ref.guid, this.#log);
      }
      if (manifest.kind !== "requested") return "released";
      const { csiName: _, ...rest } = manifest;
      try {
        await this.#store.putBytes(key, encodeJson({ ...rest, kind: "scheduled" }), {
          ifMatch: got.etag,
        });
        return "unpinned";
      } catch (err) {
        if (!(err instanceof StoreError && err.kind === "precondition_failed")) throw err;
        if (attempt >= ATTEMPTS) throw err;
      }
    }
  }

  /** Every stored snapshot named `csiName`, of any volume (CSI names are unique). */
  async #named(csiName: string): Promise<SnapshotManifest[]> {
    const out: SnapshotManifest[] = [];
    for (const obj of await this.#store.list(volumesPrefix())) {
      if (!/\/snapshots\/[0-9a-f]{16}\.json$/.test(obj.key)) continue;
      const m = await readManifest(this.#store, obj, this.#log, this.#cache);
      if (m && m !== "unreadable" && m.csiName === csiName) out.push(m);
    }
    return out;
  }
}
