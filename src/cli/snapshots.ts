/**
 * `zfs-csi snapshots VOLUME`: a volume's snapshots, the ones on this node (`zfs get -r -d 1` of
 * its dataset) and the ones in the store (its manifests, with --store), newest first, with their
 * size, age, and whether `zfs-csi restore` can restore each: a local snapshot is cloned as the
 * plugin's CreateVolume does; a stored one is received with its chain (chain.ts chainTo), so it
 * restores only when every stream back to a full one is there. A local snapshot and a stored one
 * of the same guid are one snapshot, shown once.
 */

import { ConfigError } from "../config.ts";
import { ChainError, chainTo } from "../store/chain.ts";
import type { SnapshotManifest } from "../store/layout.ts";
import { openStore } from "../store/open.ts";
import { storedSnapshotId } from "../store/snapshot_ids.ts";
import { storedSnapshotSize } from "../store/snapshot_size.ts";
import { storeGrants } from "../permissions.ts";
import { BACKUP_PREFIX } from "../replicate/local.ts";
import { decodeComponent, DELETED_PREFIX, STORED_PREFIX } from "../zfs/names.ts";
import { parseBytes } from "../zfs/parse.ts";
import { type CliIo, formatTable, humanBytes, humanSeconds, isoSeconds, printJson } from "./io.ts";
import {
  buildTools,
  checkPrograms,
  requireGrant,
  requireParent,
  resolveConfig,
  splitArgs,
  type ToolOptions,
  type Tools,
} from "./setup.ts";
import { type NamedVolume, namedVolume } from "./target.ts";
import { volumeManifests } from "./verify.ts";

/** One snapshot as `snapshots` shows it. */
export interface SnapshotRow {
  /** What `zfs-csi restore VOLUME@<this>` takes: the local name, else the stored id. */
  readonly name: string;
  /** Unix seconds it was taken at (the node's clock that took it). */
  readonly createdAt: number;
  /** On this node, in the store, or both. */
  readonly where: "local" | "store" | "both";
  /**
   * What it is: a snapshot named as a volume's snapshots are (a CSI snapshot, or another tool's
   * with such a name), a snapshot stored on request (`.stored-*`), a scheduled backup, or a
   * name zfs-csi would not make (such as sanoid's `autosnap_<date>_<time>_daily`).
   */
  readonly kind: "snapshot" | "stored" | "backup" | "other";
  /** Its `referenced` bytes: a stored one's as src/store/snapshot_size.ts reads it. */
  readonly sizeBytes: number;
  /** Whether `zfs-csi restore` can restore it, and if not why. */
  readonly restorable: boolean;
  readonly note: string;
  /** The ZFS guid (decimal). */
  readonly guid: string;
  /** Its stored snapshot id, when the store holds it. */
  readonly storedId?: string;
  /** Its full name on this node, when it is here. */
  readonly local?: string;
}

/** The local snapshots of `dataset`, but not what deletes set aside (list --deleted shows those). */
export async function localSnapshots(
  tools: Tools,
  dataset: string,
): Promise<SnapshotRow[]> {
  const tree = await tools.zfs.getTree(dataset, 1, ["type", "creation", "referenced", "guid"]);
  const rows: SnapshotRow[] = [];
  for (const [name, props] of tree ?? []) {
    if (!name.startsWith(`${dataset}@`) || props.get("type")?.value !== "snapshot") continue;
    const component = name.slice(dataset.length + 1);
    if (component.startsWith(DELETED_PREFIX)) continue;
    const kind: SnapshotRow["kind"] = component.startsWith(STORED_PREFIX)
      ? "stored"
      : component.startsWith(BACKUP_PREFIX)
      ? "backup"
      : !component.startsWith(".") && decodeComponent(component) !== undefined
      ? "snapshot"
      : "other";
    // Hidden snapshots the plugin makes for its own work (clones) are not the operator's.
    if (component.startsWith(".") && kind === "other") continue;
    rows.push({
      name: kind === "snapshot" ? decodeComponent(component)! : component,
      createdAt: Number(props.get("creation")?.value ?? "0") || 0,
      where: "local",
      kind,
      sizeBytes: parseBytes(props.get("referenced")?.value ?? "0"),
      restorable: true,
      note: "cloned on this node",
      guid: props.get("guid")?.value ?? "",
      local: name,
    });
  }
  return rows;
}

/** The stored snapshots of one volume, with whether each one's chain is whole. */
export function storedRows(manifests: readonly SnapshotManifest[]): SnapshotRow[] {
  return manifests.map((m) => {
    const id = storedSnapshotId(m.volume, m.guid);
    let chain: SnapshotManifest[] | undefined;
    let why = "";
    try {
      chain = chainTo(manifests.filter((x) => x.volumeUid === m.volumeUid), m.guid);
    } catch (err) {
      if (!(err instanceof ChainError)) throw err;
      why = err.message;
    }
    return {
      name: id,
      createdAt: Math.floor(Date.parse(m.createdAt) / 1000) || 0,
      where: "store" as const,
      kind: m.kind === "scheduled" ? "backup" as const : "stored" as const,
      sizeBytes: storedSnapshotSize(m, manifests),
      restorable: chain !== undefined,
      note: chain
        ? `received from the store: ${chain.length} stream(s)` + (m.raw ? ", encrypted (raw)" : "")
        : `not restorable: ${why}`,
      guid: m.guid,
      storedId: id,
    };
  });
}

/** Local and stored rows of one volume, merged by guid, newest first. */
export function mergeSnapshots(
  local: readonly SnapshotRow[],
  stored: readonly SnapshotRow[],
): SnapshotRow[] {
  const byGuid = new Map(stored.map((s) => [s.guid, s]));
  const rows: SnapshotRow[] = [];
  for (const l of local) {
    const s = byGuid.get(l.guid);
    if (!s) {
      rows.push(l);
      continue;
    }
    byGuid.delete(l.guid);
    rows.push({ ...l, where: "both", storedId: s.storedId!, note: `${l.note}; also ${s.note}` });
  }
  rows.push(...byGuid.values());
  return rows.sort((a, b) => b.createdAt - a.createdAt || (a.name < b.name ? -1 : 1));
}

/**
 * Every snapshot of `volume`: on this node, and in the store when the config has one.
 * @throws {StoreError} when the store cannot be listed
 */
export async function volumeSnapshots(
  tools: Tools,
  volume: NamedVolume,
): Promise<SnapshotRow[]> {
  const local = await localSnapshots(tools, volume.dataset);
  const store = tools.config.store;
  if (!store) return mergeSnapshots(local, []);
  const manifests = await volumeManifests(openStore(store), volume.name);
  return mergeSnapshots(local, storedRows(manifests));
}

/** The table people read. */
export function snapshotTable(rows: readonly SnapshotRow[], nowSeconds: number): string[] {
  return formatTable(
    ["SNAPSHOT", "CREATED", "AGE", "SIZE", "WHERE", "KIND", "RESTORE"],
    rows.map((r) => [
      r.name,
      isoSeconds(r.createdAt),
      humanSeconds(nowSeconds - r.createdAt),
      humanBytes(r.sizeBytes),
      r.where,
      r.kind,
      r.restorable ? `yes: ${r.note}` : r.note,
    ]),
  );
}

/** Usage of `snapshots`. */
export const usage =
  `Usage: zfs-csi snapshots --parent-dataset NAME --node-id ID [--store URL] [plugin flags] VOLUME
                         [--json]

Lists VOLUME's snapshots, newest first: the ones on this node (CSI snapshots, .stored-* copies
of snapshots in the store, .backup-* bases of scheduled backups, and other tools' snapshots)
and, with the plugin's --store, the ones in the store; one taken here and stored is one row
("both"). SIZE is the volume's referenced bytes at the snapshot (for a stored one written by
an older plugin, which did not record it: its streams' bytes, at most the volume's size). RESTORE says whether zfs-csi restore VOLUME@SNAPSHOT --to NAME can
restore it: a local snapshot is cloned; a stored one needs every stream back to a full one.`;

/** Runs `snapshots`; `opts` replace the real runner in tests. */
export async function run(
  args: readonly string[],
  io: CliIo,
  opts: ToolOptions = {},
): Promise<number> {
  const split = splitArgs(args, { json: { type: "boolean" } });
  if (split.positionals.length !== 1) throw new ConfigError("snapshots takes one VOLUME");
  const config = resolveConfig(split.configArgs);
  if (config.store) { for (const grant of storeGrants(config.store)) requireGrant(grant); }
  if (!opts.runner) checkPrograms([config.zfsPath]);
  const tools = buildTools(config, { level: "warn", ...opts });
  await requireParent(tools);
  const volume = namedVolume(config.parentDataset, split.positionals[0]!);
  const rows = await volumeSnapshots(tools, volume);
  if (split.own.json === true) {
    printJson(io, rows);
    return 0;
  }
  if (rows.length === 0) {
    io.out(
      `Volume "${volume.name}" has no snapshots on this node` +
        (config.store ? " nor in the store." : " (give --store to see the store's too)."),
    );
    return 0;
  }
  for (const line of snapshotTable(rows, Math.floor(Date.now() / 1000))) io.out(line);
  if (!config.store) io.err("snapshots: no --store given: the store's snapshots are not shown");
  return 0;
}
