/**
 * CSI volume and snapshot ids, and the node that holds them. Volumes made by CreateVolume get
 * ids that name their node (`pg-data@node-a`), so a plugin on another node, which Nomad may
 * ask (it sends controller calls to one controller per plugin id), can say where the volume
 * lives instead of acting on a dataset of the same name. Ids without a node (volumes an
 * operator registers) mean "on whichever node is asked": fine for node calls and for
 * controller calls that only read, but a controller call that changes, deletes or copies a
 * volume by such an id is refused, unless every node has its own plugin id
 * ({@linkcode IdScope.nodeLocal}), so that only this node is ever asked.
 *
 * - volume id:   `<name>` or `<name>@<node>` (or the full dataset name `<parent>/<child>`)
 * - a volume that follows its job (src/follow/): `<name>@*`, on whichever node holds it in the
 *   store. `*` is no node id (node ids start with a letter or digit), so no other id has this
 *   form, and a plugin that does not know it refuses it as malformed
 * - snapshot id: `<volume>@<snapshot>` or `<volume>@<snapshot>@<node>`
 */

import { TOPOLOGY_NAME } from "../config.ts";
import { Code, CsiError } from "../errors.ts";
import {
  byteLength,
  datasetForVolume,
  decodeComponent,
  encodeComponent,
  MAX_VOLUME_ID_BYTES,
  volumeForDataset,
} from "./names.ts";

/** Where ids are resolved: the parent dataset and this node's id. */
export interface IdScope {
  readonly parentDataset: string;
  readonly nodeId: string;
  /**
   * Whether this plugin's plugin id is used on this node only (`--node-local-plugin-id`), so
   * that an id without a node can only mean this node, even for calls that change a volume.
   */
  readonly nodeLocal?: boolean;
}

/** How an id is about to be used. */
export interface ResolveOptions {
  /**
   * The call changes, deletes or copies the volume or snapshot (DeleteVolume,
   * ControllerExpandVolume, CreateSnapshot, DeleteSnapshot, a CreateVolume source): an id
   * without a node is refused unless {@linkcode IdScope.nodeLocal}.
   */
  readonly mutating?: boolean;
  /** The call handles volumes that follow their job (`<name>@*`); others refuse their ids. */
  readonly follow?: boolean;
}

/** A volume id resolved on this node. */
export interface VolumeRef {
  /** The id as the client sent it. */
  readonly id: string;
  readonly dataset: string;
  /** The volume follows its job (its id is `<name>@*`). */
  readonly follow?: true;
}

/** A snapshot id resolved on this node. */
export interface SnapshotRef {
  readonly id: string;
  /** The dataset of the source volume. */
  readonly dataset: string;
  /** The snapshot's component (after "@"). */
  readonly component: string;
  /** The full ZFS snapshot name, `<dataset>@<component>`. */
  readonly snapshot: string;
}

function invalid(message: string): CsiError {
  return new CsiError(Code.INVALID_ARGUMENT, message);
}

/**
 * Refuses an id that names another node. Nothing is looked up: the dataset of the same name
 * on this node is a different volume, or none.
 */
function checkNode(kind: string, id: string, node: string, scope: IdScope): void {
  if (!TOPOLOGY_NAME.test(node)) {
    throw invalid(`${kind} id "${id}" names an invalid node "${node}"`);
  }
  if (node !== scope.nodeId) {
    throw new CsiError(
      Code.FAILED_PRECONDITION,
      `${kind} "${id}" lives on node "${node}", but this plugin runs on node "${scope.nodeId}": ` +
        `Nomad sends controller calls to one controller per plugin id, so give each node its ` +
        `own plugin id (see docs/volumes.md, "Modes and Nomad's controller routing")`,
    );
  }
}

/**
 * Refuses a mutating call on an id that names no node, unless the plugin id is node-local:
 * Nomad sends controller calls for a plugin id to one controller, the lowest node id's, so with
 * a plugin id shared by several nodes a node-less id could name another node's volume.
 */
function checkNodeless(kind: string, id: string, example: string, scope: IdScope): void {
  if (scope.nodeLocal) return;
  throw new CsiError(
    Code.FAILED_PRECONDITION,
    `${kind} id "${id}" names no node, and this plugin (node "${scope.nodeId}") changes, ` +
      `deletes or copies nothing by such an id: with a plugin id shared by several nodes, ` +
      `Nomad sends every controller call to one of them, which may not hold it. Use the id ` +
      `with the node that holds it, e.g. "${example}" (register the volume with that ` +
      `external_id), or, if each node runs its own plugin id, start the plugin with ` +
      `--node-local-plugin-id`,
  );
}

/**
 * The dataset of a volume id, after checking that the volume lives on this node.
 * @throws {CsiError} INVALID_ARGUMENT for malformed ids, FAILED_PRECONDITION for another node's,
 *   or for an id without a node in a mutating call (see {@linkcode ResolveOptions})
 */
export function resolveVolume(id: string, scope: IdScope, opts: ResolveOptions = {}): VolumeRef {
  if (id.length === 0) throw invalid("Volume id is empty");
  if (byteLength(id) > MAX_VOLUME_ID_BYTES) {
    throw invalid(`Volume id is longer than ${MAX_VOLUME_ID_BYTES} bytes`);
  }
  if (isFollowVolumeId(id)) {
    const name = id.slice(0, -FOLLOW_SUFFIX.length);
    if (!opts.follow) {
      throw new CsiError(
        Code.FAILED_PRECONDITION,
        `Volume "${id}" follows its job from node to node; this call does not support such ` +
          `volumes yet`,
      );
    }
    return { id, dataset: datasetForVolume(scope.parentDataset, name), follow: true };
  }
  const at = id.indexOf("@");
  if (at < 0) {
    const dataset = datasetForVolume(scope.parentDataset, id);
    if (opts.mutating) checkNodeless("Volume", id, `${id}@${scope.nodeId}`, scope);
    return { id, dataset };
  }
  const name = id.slice(0, at);
  const node = id.slice(at + 1);
  if (name === "" || node.includes("@")) {
    throw invalid(`Volume id "${id}" is not of the form name or name@node`);
  }
  checkNode("Volume", id, node, scope);
  return { id, dataset: datasetForVolume(scope.parentDataset, name) };
}

/**
 * The snapshot an id names, after checking that it lives on this node.
 * @throws {CsiError} INVALID_ARGUMENT for malformed ids, FAILED_PRECONDITION for another node's,
 *   or for an id without a node in a mutating call (see {@linkcode ResolveOptions})
 */
export function resolveSnapshot(
  id: string,
  scope: IdScope,
  opts: ResolveOptions = {},
): SnapshotRef {
  if (id.length === 0) throw invalid("Snapshot id is empty");
  if (byteLength(id) > MAX_VOLUME_ID_BYTES) {
    throw invalid(`Snapshot id is longer than ${MAX_VOLUME_ID_BYTES} bytes`);
  }
  const parts = id.split("@");
  if (parts.length !== 2 && parts.length !== 3) {
    throw invalid(`Snapshot id "${id}" is not of the form volume@snapshot@node`);
  }
  const [volume, snapshotName, node] = parts as [string, string, string | undefined];
  if (volume === "" || snapshotName === "") {
    throw invalid(`Snapshot id "${id}" is not of the form volume@snapshot@node`);
  }
  if (node !== undefined) checkNode("Snapshot", id, node, scope);
  const dataset = datasetForVolume(scope.parentDataset, volume);
  const component = encodeComponent("Snapshot name", snapshotName);
  if (node === undefined && opts.mutating) {
    checkNodeless("Snapshot", id, `${id}@${scope.nodeId}`, scope);
  }
  return { id, dataset, component, snapshot: `${dataset}@${component}` };
}

/**
 * The id CreateVolume returns for a new volume named `name` (as fitted: shortened names too)
 * on this node.
 * @throws {CsiError} INVALID_ARGUMENT when the name is invalid or the id would be too long
 */
export function volumeIdFor(name: string, scope: IdScope): string {
  encodeComponent("Volume name", name);
  const id = qualifiedVolumeId(name, scope.nodeId);
  if (byteLength(id) > MAX_VOLUME_ID_BYTES) {
    throw invalid(
      `Volume name "${name}" is too long: its id "${id}" would exceed ${MAX_VOLUME_ID_BYTES} bytes`,
    );
  }
  return id;
}

/**
 * The node-qualified id of the volume held by a child `dataset` of the parent, or undefined
 * for datasets that hold no volume (foreign names, hidden ones).
 */
export function volumeIdOfDataset(dataset: string, scope: IdScope): string | undefined {
  const name = volumeForDataset(scope.parentDataset, dataset);
  return name === undefined ? undefined : qualifiedVolumeId(name, scope.nodeId);
}

/**
 * The node-qualified id of ZFS snapshot `snapshot` (`<dataset>@<component>`), or undefined for
 * snapshots that are not CSI snapshots (hidden ones, foreign datasets).
 */
export function snapshotIdOf(snapshot: string, scope: IdScope): string | undefined {
  const at = snapshot.indexOf("@");
  if (at < 0) return undefined;
  const volume = volumeForDataset(scope.parentDataset, snapshot.slice(0, at));
  const name = decodeComponent(snapshot.slice(at + 1));
  if (volume === undefined || name === undefined) return undefined;
  return qualifiedSnapshotId(volume, name, scope.nodeId);
}

/** What ends the id of a volume that follows its job. */
export const FOLLOW_SUFFIX = "@*";

/** Whether `id` names a volume that follows its job: `<name>@*`, the name without "@". */
export function isFollowVolumeId(id: string): boolean {
  return id.endsWith(FOLLOW_SUFFIX) && id.indexOf("@") === id.length - FOLLOW_SUFFIX.length &&
    id.length > FOLLOW_SUFFIX.length;
}

/**
 * The id CreateVolume returns for a volume named `name` that follows its job.
 * @throws {CsiError} INVALID_ARGUMENT when the name is invalid or the id would be too long
 */
export function followVolumeId(name: string): string {
  encodeComponent("Volume name", name);
  if (name.includes("@")) throw invalid(`Volume name "${name}" must not contain "@"`);
  const id = `${name}${FOLLOW_SUFFIX}`;
  if (byteLength(id) > MAX_VOLUME_ID_BYTES) {
    throw invalid(
      `Volume name "${name}" is too long: its id "${id}" would exceed ${MAX_VOLUME_ID_BYTES} bytes`,
    );
  }
  return id;
}

/** The id of volume `name` on node `nodeId`: the one place that writes the id format. */
export function qualifiedVolumeId(name: string, nodeId: string): string {
  return `${name}@${nodeId}`;
}

/** The id of snapshot `name` of volume `volumeName` on node `nodeId`. */
export function qualifiedSnapshotId(volumeName: string, name: string, nodeId: string): string {
  return `${volumeName}@${name}@${nodeId}`;
}
