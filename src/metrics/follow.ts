/**
 * The self-fencing state of this node's writable copies of follow volumes (src/follow/
 * selffence.ts) as gauges: whether each is suspended (read-only because its lease could not be
 * renewed in time), and how old the last write of its owner object that landed is. A metric
 * source of the collection (collector.ts): it reads the plugin's memory only, no command.
 */

import type { FenceState } from "../follow/selffence.ts";
import type { MetricSource } from "./collector.ts";
import { gauge, type MetricFamily, type Sample } from "./exposition.ts";

/** The source, reading `state` (FollowVolumes.fenceState) at each collection. */
export function followFenceSource(state: () => readonly FenceState[]): MetricSource {
  return {
    name: "follow",
    collect: () => Promise.resolve(fenceFamilies(state())),
  };
}

/** The gauges of `copies`. */
export function fenceFamilies(copies: readonly FenceState[]): MetricFamily[] {
  const suspended: Sample[] = [];
  const age: Sample[] = [];
  for (const c of copies) {
    const labels = { volume: c.volume, dataset: c.dataset };
    suspended.push({ labels, value: c.suspended ? 1 : 0 });
    if (c.sinceWriteMs !== undefined) age.push({ labels, value: c.sinceWriteMs / 1000 });
  }
  return [
    gauge(
      "zfs_csi_follow_suspended",
      "1 while this node's copy of a follow volume it holds is read-only because its lease " +
        "could not be renewed in time (self-fencing, with --takeover-after), 0 while writable.",
      suspended,
    ),
    gauge(
      "zfs_csi_follow_lease_write_age_seconds",
      "Seconds since the last write of the follow volume's owner object that landed was sent, " +
        "by this node's monotonic clock (a promising copy is suspended at 3/4 of its lease TTL).",
      age,
    ),
  ];
}
