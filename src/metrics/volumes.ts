/**
 * Per-volume and parent-dataset gauges, built from one `zfs get -r` of the parent (depth 2, so
 * snapshots are counted) and one read of the mount table. Pure: the collector does the I/O.
 */

import { volumeRecord } from "../volume/catalog.ts";
import type { MountEntry, MountJudge } from "../mount/mountinfo.ts";
import { BACKUP_LAST_PROPERTY } from "../replicate/local.ts";
import { MANAGED_PROPERTY } from "../zfs/names.ts";
import { parseBytes, type PropertyMap } from "../zfs/parse.ts";
import { gauge, type MetricFamily, type Sample } from "./exposition.ts";

/** The properties one scrape reads, for the parent and every dataset and snapshot below it. */
export const VOLUME_PROPERTIES = [
  "type",
  "used",
  "referenced",
  "available",
  "quota",
  "refquota",
  "compressratio",
  MANAGED_PROPERTY,
  BACKUP_LAST_PROPERTY,
] as const;

/** Depth of the `zfs get -r`: the parent's children and their snapshots. */
export const TREE_DEPTH = 2;

/** Where a node mounts volumes: the staging/target base directories and how to tell ZFS mounts. */
export interface MountView {
  readonly table: readonly MountEntry[];
  readonly judge: MountJudge;
  /** The --stage-publish-base-dir directories. */
  readonly dirs: readonly string[];
}

/**
 * A compressratio as a number: `-p` prints "1.50" on OpenZFS, "1.50x" on older releases.
 * Undefined when it is not a ratio.
 */
export function parseRatio(value: string): number | undefined {
  const m = /^(\d+(?:\.\d+)?)x?$/.exec(value);
  return m ? Number(m[1]) : undefined;
}

function bytesOf(props: PropertyMap, name: string): number | undefined {
  const v = props.get(name)?.value;
  if (v === undefined) return undefined;
  try {
    return parseBytes(v);
  } catch {
    return undefined;
  }
}

/**
 * How `dataset` is mounted below the base directories. Nomad stages at
 * `<base>/staging/<namespace>/<volume>/<usage>` and publishes at `<base>/per-alloc/...`, so a
 * mount below `<base>/staging/` is a staging mount and any other below a base dir a target.
 */
export function mountState(
  view: MountView,
  dataset: string,
): { staged: boolean; published: boolean } {
  let staged = false;
  let published = false;
  for (const e of view.table) {
    if (!view.judge.isMountOf(e, dataset)) continue;
    for (const dir of view.dirs) {
      const base = dir.endsWith("/") ? dir : `${dir}/`;
      if (!e.mountPoint.startsWith(base)) continue;
      if (e.mountPoint.startsWith(`${base}staging/`)) staged = true;
      else published = true;
    }
  }
  return { staged, published };
}

/**
 * The volume and parent gauges. `mounts` is absent when the mount table was not read (a
 * controller-only plugin, or `mount` failed): the staged and published gauges are left out.
 */
export function volumeFamilies(
  parent: string,
  tree: ReadonlyMap<string, PropertyMap>,
  mounts: MountView | undefined,
): MetricFamily[] {
  const snapshots = new Map<string, number>();
  for (const [name, props] of tree) {
    const at = name.indexOf("@");
    if (at < 0 || props.get("type")?.value !== "snapshot") continue;
    const of = name.slice(0, at);
    snapshots.set(of, (snapshots.get(of) ?? 0) + 1);
  }
  const columns = {
    referenced: [] as Sample[],
    used: [] as Sample[],
    available: [] as Sample[],
    quota: [] as Sample[],
    refquota: [] as Sample[],
    ratio: [] as Sample[],
    snapshots: [] as Sample[],
    staged: [] as Sample[],
    published: [] as Sample[],
    lastBackup: [] as Sample[],
  };
  const push = (list: Sample[], labels: Record<string, string>, value: number | undefined) => {
    if (value !== undefined) list.push({ labels, value });
  };
  for (const [dataset, props] of tree) {
    const volume = volumeRecord(parent, dataset, props);
    if (!volume) continue;
    const labels = { volume: volume.name, dataset };
    push(columns.referenced, labels, bytesOf(props, "referenced"));
    push(columns.used, labels, bytesOf(props, "used"));
    push(columns.available, labels, bytesOf(props, "available"));
    push(columns.quota, labels, bytesOf(props, "quota"));
    push(columns.refquota, labels, bytesOf(props, "refquota"));
    push(columns.ratio, labels, parseRatio(props.get("compressratio")?.value ?? ""));
    push(columns.snapshots, labels, snapshots.get(dataset) ?? 0);
    const last = props.get(BACKUP_LAST_PROPERTY)?.value ?? "";
    if (/^\d{1,12}$/.test(last)) push(columns.lastBackup, labels, Number(last));
    if (mounts) {
      const state = mountState(mounts, dataset);
      push(columns.staged, labels, state.staged ? 1 : 0);
      push(columns.published, labels, state.published ? 1 : 0);
    }
  }
  const own = tree.get(parent);
  const parentLabels = { dataset: parent };
  const families = [
    gauge(
      "zfs_csi_volume_referenced_bytes",
      "Bytes the volume's dataset refers to (its live data).",
      columns.referenced,
    ),
    gauge(
      "zfs_csi_volume_used_bytes",
      "Bytes the volume's dataset uses, snapshots and reservations included.",
      columns.used,
    ),
    gauge(
      "zfs_csi_volume_available_bytes",
      "Bytes the volume's dataset may still write (within its quotas and the pool's space).",
      columns.available,
    ),
    gauge(
      "zfs_csi_volume_quota_bytes",
      "The volume's quota (data and snapshots) in bytes; 0: none.",
      columns.quota,
    ),
    gauge(
      "zfs_csi_volume_refquota_bytes",
      "The volume's refquota (its capacity, live data only) in bytes; 0: none.",
      columns.refquota,
    ),
    gauge(
      "zfs_csi_volume_compression_ratio",
      "The volume's compressratio (1 without compression).",
      columns.ratio,
    ),
    gauge("zfs_csi_volume_snapshots", "ZFS snapshots of the volume's dataset.", columns.snapshots),
    ...(mounts
      ? [
        gauge(
          "zfs_csi_volume_staged",
          "1 when the volume is mounted at a staging path on this node, else 0.",
          columns.staged,
        ),
        gauge(
          "zfs_csi_volume_published",
          "1 when the volume is mounted at a job's target path on this node, else 0.",
          columns.published,
        ),
      ]
      : []),
    gauge(
      "zfs_csi_volume_last_backup_timestamp_seconds",
      "Creation time (unix seconds) of the snapshot the last successful scheduled backup stored.",
      columns.lastBackup,
    ),
  ];
  if (own) {
    families.push(
      gauge("zfs_csi_parent_used_bytes", "Bytes the parent dataset uses, all volumes included.", [
        { labels: parentLabels, value: bytesOf(own, "used") ?? 0 },
      ]),
      gauge(
        "zfs_csi_parent_available_bytes",
        "Bytes still available to the parent dataset for new and growing volumes.",
        [{ labels: parentLabels, value: bytesOf(own, "available") ?? 0 }],
      ),
    );
  }
  return families;
}
