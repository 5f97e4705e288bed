/**
 * Where Nomad may place the job of a volume that follows it: the `standby_nodes` parameter and
 * the topologies CreateVolume answers with.
 *
 * Nomad stores the answer's `accessible_topology` as the volume's topologies once, at create,
 * and never updates them; its scheduler (scheduler/feasible/feasible.go, CSIVolumeChecker)
 * places an alloc only on a node whose plugin's NodeGetInfo topology contains every segment of
 * at least one of them (structs.CSITopology MatchFound/Contains), and with none, on any node
 * running the plugin. It has no "preferred" topology for placement. So:
 *
 * - without standbys, the answer is no topology (any node), or the request's requisite
 *   topologies when it names some (the operator's own restriction, kept);
 * - with standbys, one topology per standby node (its node segment, combined with each
 *   requisite topology it does not contradict): the job lands only where a warm copy is kept.
 *   If every standby node is down the job cannot be placed: the operator names enough nodes,
 *   or names none to allow any node.
 */

import { TOPOLOGY_NAME } from "../config.ts";
import { Code, CsiError } from "../errors.ts";
import { NODE_TOPOLOGY_KEY } from "../version.ts";
import type { Topology, TopologyRequirement } from "../volume/topology.ts";

/** The CreateVolume parameter naming the standby nodes, comma-separated. */
export const STANDBY_KEY = "standby_nodes";

/** At most this many standby nodes (each one downloads every increment). */
export const MAX_STANDBYS = 16;

/**
 * Takes `standby_nodes` out of parameters: the node names (sorted, without repeats) and the
 * rest.
 * @throws {CsiError} INVALID_ARGUMENT for an empty or invalid name, or too many
 */
export function splitStandbys(
  values: Readonly<Record<string, string>>,
): { standbys: string[]; rest: Record<string, string> } {
  const { [STANDBY_KEY]: value, ...rest } = values;
  if (value === undefined) return { standbys: [], rest };
  const names = value.split(",").map((s) => s.trim());
  for (const n of names) {
    if (!TOPOLOGY_NAME.test(n)) {
      throw new CsiError(
        Code.INVALID_ARGUMENT,
        `"${STANDBY_KEY}" must be a comma-separated list of node ids (as each plugin's ` +
          `--node-id), not ${JSON.stringify(value)}: ${JSON.stringify(n)} is not one`,
      );
    }
  }
  const standbys = [...new Set(names)].sort();
  if (standbys.length > MAX_STANDBYS) {
    throw new CsiError(
      Code.INVALID_ARGUMENT,
      `"${STANDBY_KEY}" names ${standbys.length} nodes; at most ${MAX_STANDBYS}`,
    );
  }
  return { standbys, rest };
}

/**
 * The topologies a follow volume is created with (see the module doc).
 * @throws {CsiError} RESOURCE_EXHAUSTED when the requisite topologies exclude every standby
 */
export function followTopologies(
  standbys: readonly string[],
  req: TopologyRequirement | null | undefined,
): { segments: Record<string, string> }[] {
  const requisite = (req?.requisite ?? []).map((t: Topology) => ({ ...(t.segments ?? {}) }));
  if (standbys.length === 0) return requisite.map((segments) => ({ segments }));
  if (requisite.length === 0) {
    return standbys.map((node) => ({ segments: { [NODE_TOPOLOGY_KEY]: node } }));
  }
  const out: { segments: Record<string, string> }[] = [];
  const seen = new Set<string>();
  for (const node of standbys) {
    for (const segments of requisite) {
      const other = segments[NODE_TOPOLOGY_KEY];
      if (other !== undefined && other !== node) continue;
      const t = { ...segments, [NODE_TOPOLOGY_KEY]: node };
      const key = JSON.stringify(Object.entries(t).sort());
      if (!seen.has(key)) out.push({ segments: t });
      seen.add(key);
    }
  }
  if (out.length === 0) {
    throw new CsiError(
      Code.RESOURCE_EXHAUSTED,
      `The requested topology excludes every standby node (${standbys.join(", ")}): name ` +
        `standby nodes inside it, or leave "${STANDBY_KEY}" out`,
    );
  }
  return out;
}
