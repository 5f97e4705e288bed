/**
 * Topology: every volume lives on the node that created it. A request may only ask for that
 * node; anything else is refused rather than served from the wrong place.
 */

import { Code, CsiError } from "../errors.ts";

/** A topology as CSI sends it. */
export interface Topology {
  readonly segments?: Readonly<Record<string, string>> | null;
}

/** CreateVolume's accessibility_requirements. */
export interface TopologyRequirement {
  readonly requisite?: readonly Topology[] | null;
  readonly preferred?: readonly Topology[] | null;
}

/** Whether this node (with `nodeTopology`) lies in `t`: every segment of `t` matches ours. */
export function nodeIsIn(t: Topology, nodeTopology: Readonly<Record<string, string>>): boolean {
  return Object.entries(t.segments ?? {}).every(([k, v]) => nodeTopology[k] === v);
}

/**
 * Checks that a volume may be created on this node. Preferred topologies only order choices,
 * and this plugin has one choice, so only requisite ones can refuse.
 * @throws {CsiError} RESOURCE_EXHAUSTED when requisite topologies exclude this node
 */
export function checkRequisite(
  req: TopologyRequirement | null | undefined,
  nodeTopology: Readonly<Record<string, string>>,
  nodeId: string,
): void {
  const requisite = req?.requisite ?? [];
  if (requisite.length === 0) return;
  if (requisite.some((t) => nodeIsIn(t, nodeTopology))) return;
  throw new CsiError(
    Code.RESOURCE_EXHAUSTED,
    `The requested topology excludes node "${nodeId}", where this plugin creates volumes: ` +
      `run a plugin with its own plugin id on the node you want, and create the volume there`,
  );
}
