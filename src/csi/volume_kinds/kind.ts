/**
 * One kind of volume as the controller serves it: a handler in controller.ts checks what a
 * call means and hands the work to the kind the volume is (ordinary.ts: a dataset on this node;
 * follow.ts: a volume that follows its job through the store). A new kind (block volumes) is a
 * new file implementing this, not a branch in every handler. Snapshots kept in the store are a
 * content source and a snapshot target of either kind, not a volume kind: stored.ts.
 */

import type { Capacity } from "../../volume/sizing.ts";
import type { StoredSnapshots } from "../stored_snapshots.ts";
import type { CreateVolumeRequest } from "../types.ts";

/** A CreateSnapshot, checked: which volume, which name, and whether it goes to the store. */
export interface SnapshotRequest {
  /** The source volume's id as the request gave it. */
  readonly sourceId: string;
  /** Its dataset on this node (a follow volume's name is its last component). */
  readonly dataset: string;
  /** The snapshot name as requested (not shortened). */
  readonly requested: string;
  /** The request's parameters (only `store` is accepted). */
  readonly parameters: Readonly<Record<string, string>> | null | undefined;
  /** The store's snapshots when the snapshot goes to the store (stored.ts storeParameter). */
  readonly toStore: StoredSnapshots | undefined;
}

/** What the controller's handlers ask of a volume kind; every method answers the CSI message. */
export interface VolumeKind {
  /** CreateVolume; `parameters` are the request's, less the one that chose the kind. */
  create(
    req: CreateVolumeRequest,
    requested: string,
    parameters: Record<string, string>,
  ): Promise<unknown>;
  /** DeleteVolume of the volume `id`, whose dataset on this node is `dataset`. */
  delete(id: string, dataset: string): Promise<unknown>;
  /**
   * That the volume exists, for ValidateVolumeCapabilities.
   * @throws {CsiError} NOT_FOUND when it does not
   */
  checkExists(id: string, dataset: string): Promise<void>;
  /** ControllerGetVolume. */
  get(id: string, dataset: string): Promise<unknown>;
  /** ControllerExpandVolume to a checked capacity. */
  expand(id: string, dataset: string, capacity: Capacity): Promise<unknown>;
  /** CreateSnapshot of the volume. */
  snapshot(req: SnapshotRequest): Promise<unknown>;
}
