/**
 * `zfs-csi list`: the volumes below the parent dataset with their node, size, use, where they
 * are staged and published on this node, and their last backup; `--deleted` lists what deletes
 * set aside instead. One `zfs get -r` and one `mount`, whatever the number of volumes.
 */

import { ConfigError } from "../config.ts";
import type { MountEntry, MountJudge } from "../mount/mountinfo.ts";
import { BACKUP_INTERVAL_PROPERTY, BACKUP_LAST_PROPERTY } from "../replicate/local.ts";
import { deletedMarks } from "../csi/subtree.ts";
import { qualifiedVolumeId } from "../zfs/ids.ts";
import {
  DELETED_AT_PROPERTY,
  DELETED_NAME_PROPERTY,
  isDeletedComponent,
  MANAGED_PROPERTY,
  MANAGED_VALUE,
  volumeForDataset,
} from "../zfs/names.ts";
import { hasOwnMarker, parseBytes, type PropertyMap } from "../zfs/parse.ts";
import { type CliIo, formatTable, humanBytes, isoSeconds, printJson } from "./io.ts";
import { buildTools, checkPrograms, resolveConfig, splitArgs, type ToolOptions } from "./setup.ts";

/** Properties `list` reads of every child of the parent (and, with `--deleted`, snapshots). */
export const LIST_PROPERTIES = [
  "type",
  "used",
  "referenced",
  "refquota",
  "available",
  "mountpoint",
  "mounted",
  MANAGED_PROPERTY,
  BACKUP_LAST_PROPERTY,
  BACKUP_INTERVAL_PROPERTY,
  DELETED_AT_PROPERTY,
  DELETED_NAME_PROPERTY,
] as const;

/** One volume as `list` shows it. */
export interface VolumeRow {
  readonly name: string;
  /** Its CSI id, `<name>@<node>`. */
  readonly volumeId: string;
  readonly node: string;
  readonly dataset: string;
  /** Its refquota; 0 when unlimited. */
  readonly sizeBytes: number;
  readonly usedBytes: number;
  readonly availableBytes: number;
  readonly mounted: boolean;
  /** Staging paths it is bind-mounted at on this node. */
  readonly staged: readonly string[];
  /** Target paths it is published at on this node. */
  readonly published: readonly string[];
  /** Other mounts of it (neither its own mountpoint nor Nomad's paths). */
  readonly otherMounts: readonly string[];
  /** Unix seconds of its last successful scheduled backup, if any. */
  readonly lastBackup?: number;
  /** Seconds between its scheduled backups, when it has a schedule. */
  readonly backupIntervalSeconds?: number;
}

/** Something a delete set aside, as `list --deleted` shows it. */
export interface DeletedRow {
  /** Its hidden name now. */
  readonly hidden: string;
  /** The name it had (from org.zfs-csi:deleted-name). */
  readonly deletedName: string;
  /** Unix seconds it was deleted at. */
  readonly deletedAt: number;
  readonly kind: "volume" | "snapshot";
  readonly usedBytes: number;
}

/** An optional number property (a user property unset reads "-"). */
function userNumber(props: PropertyMap, name: string): number | undefined {
  const v = props.get(name);
  if (!v || v.source === "-" || !/^\d{1,15}$/.test(v.value)) return undefined;
  return Number(v.value);
}

/**
 * Nomad's paths: `<base>/staging/...` for a staged volume, `<base>/per-alloc/...` for a
 * published one (see docs on stage_publish_base_dir); anything else is another mount.
 */
function mountRole(path: string, bases: readonly string[]): "staged" | "published" | "other" {
  for (const base of bases) {
    if (path.startsWith(`${base}/staging/`)) return "staged";
    if (path.startsWith(`${base}/per-alloc/`)) return "published";
  }
  return "other";
}

/** What {@linkcode volumeRows} reads. */
export interface RowsInput {
  readonly parent: string;
  readonly nodeId: string;
  readonly stagePublishDirs: readonly string[];
  readonly tree: ReadonlyMap<string, PropertyMap>;
  readonly table: readonly MountEntry[];
  readonly judge: MountJudge;
}

/** The volumes of a `zfs get -r` of the parent, with their mounts, sorted by name. */
export function volumeRows(input: RowsInput): VolumeRow[] {
  const rows: VolumeRow[] = [];
  for (const [dataset, props] of input.tree) {
    if (props.get("type")?.value !== "filesystem") continue;
    const name = volumeForDataset(input.parent, dataset);
    if (name === undefined || !hasOwnMarker(props, MANAGED_PROPERTY, MANAGED_VALUE)) continue;
    const mountpoint = props.get("mountpoint")?.value ?? "";
    const staged: string[] = [];
    const published: string[] = [];
    const otherMounts: string[] = [];
    for (const e of input.table) {
      if (!input.judge.isMountOf(e, dataset) || e.mountPoint === mountpoint) continue;
      const role = mountRole(e.mountPoint, input.stagePublishDirs);
      (role === "staged" ? staged : role === "published" ? published : otherMounts).push(
        e.mountPoint,
      );
    }
    const lastBackup = userNumber(props, BACKUP_LAST_PROPERTY);
    const interval = userNumber(props, BACKUP_INTERVAL_PROPERTY);
    rows.push({
      name,
      volumeId: qualifiedVolumeId(name, input.nodeId),
      node: input.nodeId,
      dataset,
      sizeBytes: parseBytes(props.get("refquota")?.value ?? "0"),
      usedBytes: parseBytes(props.get("used")?.value ?? "0"),
      availableBytes: parseBytes(props.get("available")?.value ?? "0"),
      mounted: props.get("mounted")?.value === "yes",
      staged,
      published,
      otherMounts,
      ...(lastBackup === undefined ? {} : { lastBackup }),
      ...(interval === undefined ? {} : { backupIntervalSeconds: interval }),
    });
  }
  return rows.sort((a, b) => (a.name < b.name ? -1 : a.name > b.name ? 1 : 0));
}

/** What deletes set aside below the parent (marked as the purge wants it), oldest first. */
export function deletedRows(
  parent: string,
  tree: ReadonlyMap<string, PropertyMap>,
): DeletedRow[] {
  const rows: DeletedRow[] = [];
  for (const [name, props] of tree) {
    const at = name.indexOf("@");
    const component = at >= 0 ? name.slice(at + 1) : name.slice(parent.length + 1);
    const container = at >= 0 ? name.slice(0, at) : parent;
    if (at < 0 && !name.startsWith(`${parent}/`)) continue;
    if (at < 0 && component.includes("/")) continue;
    if (!isDeletedComponent(component)) continue;
    if (at >= 0 && container !== parent && !container.startsWith(`${parent}/`)) continue;
    const marks = deletedMarks(props);
    if (!marks) continue;
    rows.push({
      hidden: name,
      deletedName: marks.name,
      deletedAt: marks.at,
      kind: at >= 0 ? "snapshot" : "volume",
      usedBytes: parseBytes(props.get("used")?.value ?? "0"),
    });
  }
  return rows.sort((a, b) => a.deletedAt - b.deletedAt || (a.hidden < b.hidden ? -1 : 1));
}

/** Where a volume is in use on this node, in a few words. */
export function stateText(row: VolumeRow): string {
  const parts: string[] = [];
  if (row.published.length > 0) parts.push(`published x${row.published.length}`);
  if (row.staged.length > 0) parts.push(`staged x${row.staged.length}`);
  if (row.otherMounts.length > 0) parts.push(`mounted elsewhere x${row.otherMounts.length}`);
  if (parts.length === 0) parts.push(row.mounted ? "idle" : "not mounted");
  return parts.join(", ");
}

/** The table people read. */
export function volumeTable(rows: readonly VolumeRow[]): string[] {
  return formatTable(
    ["NAME", "NODE", "SIZE", "USED", "STATE", "LAST BACKUP"],
    rows.map((r) => [
      r.name,
      r.node,
      r.sizeBytes === 0 ? "unlimited" : humanBytes(r.sizeBytes),
      humanBytes(r.usedBytes),
      stateText(r),
      r.lastBackup !== undefined
        ? isoSeconds(r.lastBackup)
        : r.backupIntervalSeconds !== undefined
        ? "none yet"
        : "-",
    ]),
  );
}

/** The table of what is set aside. */
export function deletedTable(rows: readonly DeletedRow[]): string[] {
  return formatTable(
    ["DELETED AT", "KIND", "USED", "NAME", "SET ASIDE AS"],
    rows.map((r) => [
      isoSeconds(r.deletedAt),
      r.kind,
      humanBytes(r.usedBytes),
      r.deletedName,
      r.hidden,
    ]),
  );
}

/** Usage of `list`. */
export const usage =
  `Usage: zfs-csi list --parent-dataset NAME --node-id ID [plugin flags] [--deleted] [--json]

Lists the volumes below the parent dataset: node, size (refquota), used, whether they are
staged or published on this node (mounts below --stage-publish-base-dir), and the time of the
last scheduled backup (org.zfs-csi:backup-last). With --deleted, lists instead what deletes set
aside (undelete or purge them). --json prints the rows as JSON.`;

/** Runs `list`; `opts` replace the real runner in tests. */
export async function run(
  args: readonly string[],
  io: CliIo,
  opts: ToolOptions = {},
): Promise<number> {
  const split = splitArgs(args, { json: { type: "boolean" }, deleted: { type: "boolean" } });
  if (split.positionals.length > 0) {
    throw new ConfigError(`list takes no arguments, got "${split.positionals[0]}"`);
  }
  const config = resolveConfig(split.configArgs);
  if (!opts.runner) checkPrograms([config.zfsPath, config.mountPath]);
  const tools = buildTools(config, { level: "warn", ...opts });
  const parent = config.parentDataset;
  const json = split.own.json === true;
  if (split.own.deleted === true) {
    const tree = await tools.zfs.getTree(parent, 2, LIST_PROPERTIES) ?? new Map();
    const rows = deletedRows(parent, tree);
    if (json) printJson(io, rows);
    else if (rows.length === 0) io.out(`Nothing is set aside below ${parent}.`);
    else for (const line of deletedTable(rows)) io.out(line);
    return 0;
  }
  const [tree, table] = await Promise.all([
    tools.zfs.getTree(parent, 1, LIST_PROPERTIES),
    tools.mounter.table(),
  ]);
  // Once one volume shows its own mount, only mounts of that filesystem type count.
  for (const [dataset, props] of tree ?? []) {
    if (props.get("mounted")?.value !== "yes") continue;
    tools.mounter.learnZfsType(table, dataset, props.get("mountpoint")?.value ?? "");
  }
  const rows = volumeRows({
    parent,
    nodeId: config.nodeId,
    stagePublishDirs: config.stagePublishDirs,
    tree: tree ?? new Map(),
    table,
    judge: tools.mounter.judge(),
  });
  if (json) printJson(io, rows);
  else if (rows.length === 0) io.out(`No volumes below ${parent}.`);
  else for (const line of volumeTable(rows)) io.out(line);
  return 0;
}
