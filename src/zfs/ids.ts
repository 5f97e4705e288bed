/**
 * CSI volume and snapshot ids, and the node that holds them. Volumes made by CreateVolume get
 * ids that name their node (`pg-data@node-a`), so a plugin on another node, which Nomad may
 * ask (it sends controller calls to one controller per plugin id), can say where the volume
 * lives instead of acting on a dataset of the same name. Ids without a node (volumes an
 * operator registers) mean "on whichever node is asked".
 *
 * - volume id:   `<name>` or `<name>@<node>` (or the full dataset name `<parent>/<child>`)
 * - snapshot id: `<volume>@<snapshot>` or `<volume>@<snapshot>@<node>`
 */

import { TOPOLOGY_NAME } from "../config.ts";
import { Code, CsiError } from "../errors.ts";
import {
  byteLength,
  datasetForVolume,
  decodeComponent,
  encodeName,
  MAX_VOLUME_ID_BYTES,
  volumeForDataset,
} from "./names.ts";

/** Where ids are resolved: the parent dataset and this node's id. */
export interface IdScope {
  readonly parentDataset: string;
  readonly nodeId: string;
}

/** A volume id resolved on this node. */
export interface VolumeRef {
  /** The id as the client sent it. */
  readonly id: string;
  readonly dataset: string;
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
        `own plugin id (see the README's controller section)`,
    );
  }
}

/**
 * The dataset of a volume id, after checking that the volume lives on this node.
 * @throws {CsiError} INVALID_ARGUMENT for malformed ids, FAILED_PRECONDITION for another node's
 */
export function resolveVolume(id: string, scope: IdScope): VolumeRef {
  if (id.length === 0) throw invalid("Volume id is empty");
  if (byteLength(id) > MAX_VOLUME_ID_BYTES) {
    throw invalid(`Volume id is longer than ${MAX_VOLUME_ID_BYTES} bytes`);
  }
  const at = id.indexOf("@");
  if (at < 0) return { id, dataset: datasetForVolume(scope.parentDataset, id) };
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
 * @throws {CsiError} INVALID_ARGUMENT for malformed ids, FAILED_PRECONDITION for another node's
 */
export function resolveSnapshot(id: string, scope: IdScope): SnapshotRef {
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
  const component = encodeName("Snapshot name", snapshotName);
  return { id, dataset, component, snapshot: `${dataset}@${component}` };
}

/**
 * The id CreateVolume returns for a new volume named `name` on this node.
 * @throws {CsiError} INVALID_ARGUMENT when the name is invalid or the id would be too long
 */
export function volumeIdFor(name: string, scope: IdScope): string {
  encodeName("Volume name", name);
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

/** The id of volume `name` on node `nodeId`: the one place that writes the id format. */
export function qualifiedVolumeId(name: string, nodeId: string): string {
  return `${name}@${nodeId}`;
}

/** The id of snapshot `name` of volume `volumeName` on node `nodeId`. */
export function qualifiedSnapshotId(volumeName: string, name: string, nodeId: string): string {
  return `${volumeName}@${name}@${nodeId}`;
}
