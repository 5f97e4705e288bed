/**
 * Where a volume that follows its job is, as ListVolumes and ControllerGetVolume show it (and
 * so `nomad volume status -verbose`): the holder as the published node, and a condition that
 * says who holds it, under which generation, and how old the last copy in the store is. Read
 * from the owner object alone: one store read per volume.
 */

import { NODE_TOPOLOGY_KEY } from "../version.ts";
import { FOLLOW_SUFFIX } from "../zfs/ids.ts";
import { type OwnerRecord } from "./owner.ts";
import { ageText } from "./rule.ts";
import type { StandbyState } from "./standby.ts";

/** The CSI Volume message of a follow volume. */
export function followVolumeMessage(r: OwnerRecord): Record<string, unknown> {
  const standbys = r.standbys ?? [];
  return {
    volume_id: `${r.volume}${FOLLOW_SUFFIX}`,
    capacity_bytes: String(r.settings.capacityBytes),
    // A follow zvol says what it holds, as any zvol's context does (csi/context.ts fs_type).
    volume_context: r.settings.zvol ? { fs_type: r.settings.zvol.content } : {},
    ...(standbys.length > 0
      ? {
        accessible_topology: standbys.map((node) => ({ segments: { [NODE_TOPOLOGY_KEY]: node } })),
      }
      : {}),
  };
}

/**
 * The CSI VolumeStatus of a follow volume: the holder as its published node while it is held,
 * and the condition in words. `standby` is this node's own standby state of the volume, if
 * this node is one of its standbys; a standby that cannot catch up makes the volume abnormal.
 */
export function followVolumeStatus(
  r: OwnerRecord,
  nowMs: number,
  standby?: StandbyState,
): { published_node_ids: string[]; volume_condition: { abnormal: boolean; message: string } } {
  const copy = r.head === null
    ? "the store holds no copy of it yet"
    : r.headAt
    ? `the last copy in the store is ${ageText(nowMs - Date.parse(r.headAt))} old (taken at ` +
      `${r.headAt}, snapshot guid ${r.head})`
    : `the last copy in the store is snapshot guid ${r.head}`;
  const where = r.state === "held"
    ? `Held by node "${r.holder}" (generation ${r.generation}; lease last renewed at ` +
      `${r.renewedAt} by that node's clock)`
    : r.state === "released"
    ? `Not staged on any node; ${
      r.holder === null
        ? "no node has held it yet"
        : `released by node "${r.holder}" at ${r.renewedAt} (generation ${r.generation}` +
          `${r.releasedBy ? `, ${r.releasedBy}` : ""})`
    }`
    : `Deleted at ${r.renewedAt}`;
  const standbys = (r.standbys ?? []).length > 0
    ? `; standby nodes: ${r.standbys!.join(", ")}`
    : "";
  const mine = standby === undefined ? "" : `; ${standbyText(standby, nowMs)}`;
  return {
    published_node_ids: r.state === "held" && r.holder !== null ? [r.holder] : [],
    volume_condition: {
      abnormal: r.state === "deleted" || standby?.error !== undefined,
      message: `${where}; ${copy}${standbys}${mine}`,
    },
  };
}

/** This node's standby state in words. */
function standbyText(s: StandbyState, nowMs: number): string {
  const ago = `${ageText(nowMs - s.checkedAt)} ago`;
  if (s.error !== undefined) {
    return `this node's standby copy cannot catch up (as of ${ago}): ${s.error}`;
  }
  if (s.current) return `this node's standby copy was at the store's head ${ago}`;
  return `this node's standby copy: ${s.note ?? "behind"} (as of ${ago})`;
}
