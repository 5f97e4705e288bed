/**
 * One kind of volume as the node service stages it: NodeStage hands the volume to the kind its
 * request names (node_ordinary.ts: the dataset is here already; node_follow.ts: a volume that
 * follows its job, brought here first), and NodeUnstage asks each kind whether the copy it
 * unmounted is one of its own with work left. A new kind is a new file implementing this.
 */

import type { VolumeContext } from "../context.ts";

/** A NodeStage, checked. */
export interface StageRequest {
  /** The volume id as the request gave it. */
  readonly id: string;
  /** Its dataset on this node. */
  readonly dataset: string;
  /** Its checked volume context. */
  readonly ctx: VolumeContext;
  /** Whether CreateVolume made it as a volume of this kind (else it was registered so). */
  readonly created: boolean;
}

/** What the node service's handlers ask of a volume kind. */
export interface NodeKind {
  /** NodeStage: makes the volume's dataset ready here as the kind needs, then `mount`s it. */
  stage(v: StageRequest, mount: () => Promise<unknown>): Promise<unknown>;
  /**
   * NodeUnstage, under the volume's lock once nothing is mounted at the staging path: the work
   * left to do outside the lock when `dataset` is a copy of this kind, else undefined.
   */
  unstaged(dataset: string): Promise<(() => Promise<void>) | undefined>;
}
