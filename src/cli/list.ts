/**
 * `zfs-csi list`: the volumes below the parent dataset (CSI volumes and host volumes) with
 * their node, size, use, where they are staged and published on this node, their backup
 * schedule and last backup; `--deleted` lists what deletes set aside instead, and the scratch
 * datasets interrupted verifies left. One `zfs get -r` and one `mount`, whatever the number of
 * volumes.
 *
 * Staged and published mounts are told by Nomad's paths below the plugin's
 * --stage-publish-base-dir, read from the flags as the plugin reads them. Where a mount has
 * Nomad's shape (`<base>/staging/<namespace>/<volume>/<mode>`,
 * `<base>/per-alloc/<alloc>/<volume>/<mode>`) below a base not given here, it is counted all the
 * same and the listing says which --stage-publish-base-dir is missing.
 */

import { ConfigError } from "../config.ts";
import type { MountEntry, MountJudge } from "../mount/mountinfo.ts";
import { BACKUP_INTERVAL_PROPERTY, BACKUP_LAST_PROPERTY } from "../replicate/local.ts";
import {
  effectiveSchedule,
  isScheduledKind,
  SCHEDULE_PROPS,
  type ScheduleSource,
} from "../replicate/scheduler.ts";
import { deletedMarks } from "../csi/subtree.ts";
import { HOST_NAMESPACE_PROPERTY, HOST_VOLUME_ID_PROPERTY, isHostDataset } from "../dhv/names.ts";
import { qualifiedVolumeId } from "../zfs/ids.ts";
import {
  DELETED_AT_PROPERTY,
  DELETED_NAME_PROPERTY,
  isDeletedComponent,
  MANAGED_PROPERTY,
  NAME_PROPERTY,
  volumeForDataset,
} from "../zfs/names.ts";
import { parseBytes, type PropertyMap } from "../zfs/parse.ts";
import { type CliIo, formatTable, humanBytes, isoSeconds, printJson } from "./io.ts";
import {
  type KernelClock,
  type ScratchRow,
  scratchRows,
  SYSTEM_CLOCK,
  VERIFY_PROPERTY,
} from "./scratch.ts";
import {
  buildTools,
  checkPrograms,
  readParentTree,
  resolveConfig,
  splitArgs,
  type ToolOptions,
} from "./setup.ts";

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
  NAME_PROPERTY,
  HOST_VOLUME_ID_PROPERTY,
  HOST_NAMESPACE_PROPERTY,
  VERIFY_PROPERTY,
  ...SCHEDULE_PROPS.filter((p) =>
    p !== "type" && p !== MANAGED_PROPERTY && p !== BACKUP_INTERVAL_PROPERTY &&
    p !== BACKUP_LAST_PROPERTY
  ),
] as const;

/** One volume as `list` shows it. */
export interface VolumeRow {
  /** Its name: the CSI volume's, or the host volume's name in Nomad. */
  readonly name: string;
  /** A CSI volume, or a Nomad dynamic host volume (src/dhv/). */
  readonly kind: "csi" | "host";
  /** Its CSI id, `<name>@<node>`; for a host volume, Nomad's volume id. */
  readonly volumeId: string;
  /** A host volume's Nomad namespace. */
  readonly namespace?: string;
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
  /**
   * Where its interval comes from (src/replicate/scheduler.ts): its own setting, its recorded
   * CreateVolume parameter, the plugin's --backup-interval (as given here), or none.
   */
  readonly backupSchedule: ScheduleSource;
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

/** Nomad's mode directory at the end of a staging or target path, e.g. rw-file-system-single-node-writer. */
const NOMAD_MODE = /^(ro|rw)-(file-system|block-device)-[a-z-]+$/;

/**
 * The base directory of a path shaped like Nomad's staging or target path, or undefined:
 * `<base>/staging/<namespace>/<volume>/<mode>` or `<base>/per-alloc/<alloc>/<volume>/<mode>`.
 */
export function nomadBase(
  path: string,
): { base: string; role: "staged" | "published" } | undefined {
  const parts = path.split("/");
  if (parts.length < 6 || !NOMAD_MODE.test(parts.at(-1)!)) return undefined;
  const kind = parts.at(-4);
  if (kind !== "staging" && kind !== "per-alloc") return undefined;
  const base = parts.slice(0, -4).join("/");
  if (!base.startsWith("/")) return undefined;
  return { base, role: kind === "staging" ? "staged" : "published" };
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
  /** The plugin's --backup-interval as given to this command, in seconds (0: none). */
  readonly defaultBackupSeconds?: number;
}

/** The volumes and host volumes of a `zfs get -r` of the parent, with their mounts. */
export interface Rows {
  /** Sorted: CSI volumes by name, then host volumes by namespace and name. */
  readonly rows: VolumeRow[];
  /**
   * Base directories of mounts shaped like Nomad's paths that no --stage-publish-base-dir given
   * here covers: the plugin has them, this command was not told.
   */
  readonly missingBaseDirs: string[];
}

/** The name and kind of a child of the parent that is a volume, or undefined. */
function volumeOf(
  parent: string,
  nodeId: string,
  dataset: string,
  props: PropertyMap,
): Pick<VolumeRow, "name" | "kind" | "volumeId" | "namespace"> | undefined {
  if (isHostDataset(parent, dataset)) {
    const id = props.get(HOST_VOLUME_ID_PROPERTY);
    if (!id || id.source !== "local") return undefined;
    const name = props.get(NAME_PROPERTY)?.value;
    const namespace = props.get(HOST_NAMESPACE_PROPERTY)?.value;
    return {
      name: name && name !== "-" ? name : dataset.slice(parent.length + 1),
      kind: "host",
      volumeId: id.value,
      ...(namespace && namespace !== "-" ? { namespace } : {}),
    };
  }
  const name = volumeForDataset(parent, dataset);
  if (name === undefined) return undefined;
  return { name, kind: "csi", volumeId: qualifiedVolumeId(name, nodeId) };
}

/** The volumes of a `zfs get -r` of the parent, with their mounts, sorted by name. */
export function volumeRows(input: RowsInput): Rows {
  const rows: VolumeRow[] = [];
  const missing = new Set<string>();
  for (const [dataset, props] of input.tree) {
    if (!isScheduledKind(input.parent, dataset, props)) continue;
    const who = volumeOf(input.parent, input.nodeId, dataset, props);
    if (who === undefined) continue;
    const mountpoint = props.get("mountpoint")?.value ?? "";
    const staged: string[] = [];
    const published: string[] = [];
    const otherMounts: string[] = [];
    for (const e of input.table) {
      if (!input.judge.isMountOf(e, dataset) || e.mountPoint === mountpoint) continue;
      let role = mountRole(e.mountPoint, input.stagePublishDirs);
      if (role === "other") {
        const shaped = nomadBase(e.mountPoint);
        if (shaped) {
          role = shaped.role;
          missing.add(shaped.base);
        }
      }
      (role === "staged" ? staged : role === "published" ? published : otherMounts).push(
        e.mountPoint,
      );
    }
    const lastBackup = userNumber(props, BACKUP_LAST_PROPERTY);
    const schedule = effectiveSchedule(props, input.defaultBackupSeconds ?? 0);
    rows.push({
      ...who,
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
      ...(schedule.intervalSeconds > 0 ? { backupIntervalSeconds: schedule.intervalSeconds } : {}),
      backupSchedule: schedule.source,
    });
  }
  const key = (r: VolumeRow) =>
    `${r.kind === "csi" ? 0 : 1}\u0000${r.namespace ?? ""}\u0000${r.name}`;
  rows.sort((a, b) => (key(a) < key(b) ? -1 : key(a) > key(b) ? 1 : 0));
  return { rows, missingBaseDirs: [...missing].sort() };
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

/** An interval as --backup-interval takes it: 90s, 15m, 1h30m, 1d. */
export function intervalText(seconds: number): string {
  const parts: string[] = [];
  let rest = seconds;
  for (const [unit, size] of [["d", 86400], ["h", 3600], ["m", 60], ["s", 1]] as const) {
    if (rest >= size) {
      parts.push(`${Math.floor(rest / size)}${unit}`);
      rest %= size;
    }
  }
  return parts.join("") || "0";
}

/** A volume's backup schedule in a few words. */
export function scheduleText(row: VolumeRow): string {
  const every = row.backupIntervalSeconds === undefined
    ? ""
    : `every ${intervalText(row.backupIntervalSeconds)}`;
  switch (row.backupSchedule) {
    case "own":
      return every || "off";
    case "parameter":
      return every || "off (CreateVolume)";
    case "default":
      return `${every} (default)`;
    case "follow":
      return "follows its job";
    case "none":
      return "none";
  }
}

/** The table people read. */
export function volumeTable(rows: readonly VolumeRow[]): string[] {
  return formatTable(
    ["NAME", "KIND", "NODE", "SIZE", "USED", "STATE", "BACKUPS", "LAST BACKUP"],
    rows.map((r) => [
      r.name,
      r.kind === "host" ? `host (${r.namespace ?? "?"})` : "csi",
      r.node,
      r.sizeBytes === 0 ? "unlimited" : humanBytes(r.sizeBytes),
      humanBytes(r.usedBytes),
      stateText(r),
      scheduleText(r),
      r.lastBackup !== undefined
        ? isoSeconds(r.lastBackup)
        : r.backupIntervalSeconds !== undefined
        ? "none yet"
        : "-",
    ]),
  );
}

/** The table of scratch datasets interrupted verifies left. */
export function scratchTable(rows: readonly ScratchRow[]): string[] {
  return formatTable(
    ["STATE", "USED", "DATASET", "WHY"],
    rows.map((r) => [r.state, humanBytes(r.usedBytes), r.dataset, r.reason]),
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

Lists the volumes below the parent dataset, CSI volumes and Nomad host volumes: node, size
(refquota), used, whether they are staged or published on this node (mounts below
--stage-publish-base-dir; give it as the plugin has it), their backup schedule (their own
interval, else the plugin's --backup-interval: give it as the plugin has it) and the time of
the last scheduled backup (org.zfs-csi:backup-last). Volumes with no schedule are named with the
command that gives them one. With --deleted, lists instead what deletes set aside (undelete or
purge them) and the scratch datasets interrupted verifies left (purge removes the stale ones).
--json prints the rows as JSON.`;

/** What `list` works with besides the runner: the kernel clock that judges verify's scratch. */
export interface ListOptions extends ToolOptions {
  readonly clock?: KernelClock;
}

/** Runs `list`; `opts` replace the real runner in tests. */
export async function run(
  args: readonly string[],
  io: CliIo,
  opts: ListOptions = {},
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
    const tree = await readParentTree(tools, 2, LIST_PROPERTIES);
    const rows = deletedRows(parent, tree);
    const scratch = scratchRows(parent, tree, opts.clock ?? SYSTEM_CLOCK);
    if (json) {
      printJson(io, [
        ...rows,
        ...scratch.map((r) => ({ kind: "verify-scratch", hidden: r.dataset, ...r })),
      ]);
      return 0;
    }
    if (rows.length === 0) io.out(`Nothing is set aside below ${parent}.`);
    else for (const line of deletedTable(rows)) io.out(line);
    if (scratch.length > 0) {
      io.out("");
      io.out("Scratch datasets of zfs-csi verify (zfs-csi purge --yes removes the stale ones):");
      for (const line of scratchTable(scratch)) io.out(line);
    }
    return 0;
  }
  const [tree, table] = await Promise.all([
    readParentTree(tools, 1, LIST_PROPERTIES),
    tools.mounter.table(),
  ]);
  // Once one volume shows its own mount, only mounts of that filesystem type count.
  for (const [dataset, props] of tree) {
    if (props.get("mounted")?.value !== "yes") continue;
    tools.mounter.learnZfsType(table, dataset, props.get("mountpoint")?.value ?? "");
  }
  const { rows, missingBaseDirs } = volumeRows({
    parent,
    nodeId: config.nodeId,
    stagePublishDirs: config.stagePublishDirs,
    tree,
    table,
    judge: tools.mounter.judge(),
    defaultBackupSeconds: config.store?.defaultBackupIntervalSeconds ?? 0,
  });
  if (json) {
    printJson(io, rows);
    return 0;
  }
  if (rows.length === 0) io.out(`No volumes below ${parent}.`);
  else for (const line of volumeTable(rows)) io.out(line);
  for (const base of missingBaseDirs) {
    io.err(
      `list: mounts below ${base} have Nomad's staging/publish shape, and ${base} is not a ` +
        `--stage-publish-base-dir here: they are counted as staged/published; give ` +
        `--stage-publish-base-dir ${base} as the plugin has it`,
    );
  }
  // Without --store this command cannot know the plugin's store nor its --backup-interval.
  const unscheduled = rows.filter((r) => r.backupSchedule === "none");
  if (config.store && unscheduled.length > 0) {
    io.err(
      `list: ${unscheduled.length} volume(s) have no backup schedule and are never backed up: ` +
        `${unscheduled.map((r) => (r.kind === "host" ? r.dataset : r.name)).join(", ")}; give ` +
        `each one with zfs-csi backup set VOLUME --interval 1h, or give the plugin ` +
        `--backup-interval`,
    );
  }
  return 0;
}
