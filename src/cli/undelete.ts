/**
 * `zfs-csi undelete`: undoes a DeleteVolume or DeleteSnapshot within the retention. The item
 * set aside goes back to the name it recorded (org.zfs-csi:deleted-name, complete even where
 * the hidden name was cut), its deletion marks are removed and a volume is mounted again: the
 * manual recipe of docs/deleting.md, with its checks made first.
 */

import { ConfigError } from "../config.ts";
import { deletedMarks } from "../volume/subtree.ts";
import { HOST_VOLUME_ID_PROPERTY, isHostDataset } from "../volume/host_names.ts";
import { Code, CsiError, ZfsError } from "../errors.ts";
import { qualifiedVolumeId } from "../zfs/ids.ts";
import {
  childDataset,
  decodeComponent,
  DELETED_AT_PROPERTY,
  DELETED_NAME_PROPERTY,
  isDeletedComponent,
  volumeForDataset,
} from "../zfs/names.ts";
import type { PropertyMap } from "../zfs/parse.ts";
import type { Zfs } from "../zfs/zfs.ts";
import {
  RESERVATION_PROPERTIES,
  RESERVATION_RECORD_PROPERTY,
  reservationPlan,
  restoreReservation,
} from "../volume/zvol_reservation.ts";
import { type CliIo, isoSeconds, printJson } from "./io.ts";
import { type DeletedRow, deletedRows, LIST_PROPERTIES } from "./list.ts";
import {
  buildTools,
  checkPrograms,
  readParentTree,
  resolveConfig,
  splitArgs,
  type ToolOptions,
} from "./setup.ts";

/** What was undeleted. */
export interface Undeleted {
  readonly kind: "volume" | "snapshot";
  /** The hidden name it had, and the name it has again. */
  readonly from: string;
  readonly to: string;
  /** Unix seconds it had been deleted at. */
  readonly deletedAt: number;
  /** For a volume: whether it is mounted again (the next stage mounts it otherwise). */
  readonly mounted?: boolean;
  /** For a volume: its CSI id on this node. */
  readonly volumeId?: string;
  /** For a host volume: true (Nomad gives it a new id when it is created again). */
  readonly hostVolume?: boolean;
}

/** Which set-aside item `target` names: its hidden name, a volume name, or `volume@snapshot`. */
export function findSetAside(
  parent: string,
  rows: readonly DeletedRow[],
  target: string,
): DeletedRow[] {
  if (target.startsWith(`${parent}/`)) return rows.filter((r) => r.hidden === target);
  const at = target.indexOf("@");
  if (at < 0) {
    return rows.filter((r) =>
      r.kind === "volume" &&
      (volumeForDataset(parent, r.deletedName) === target ||
        r.deletedName === `${parent}/${target}`)
    );
  }
  const [volume, snapshot] = [target.slice(0, at), target.slice(at + 1)];
  return rows.filter((r) => {
    if (r.kind !== "snapshot") return false;
    const sep = r.deletedName.indexOf("@");
    const dataset = r.deletedName.slice(0, sep);
    const component = r.deletedName.slice(sep + 1);
    return volumeForDataset(parent, dataset) === volume &&
      (decodeComponent(component) === snapshot || component === snapshot);
  });
}

/**
 * Where an item goes back to: its recorded name, or for a volume `<parent>/<as>`. Refuses a
 * destination that is not a visible volume (or snapshot of one) below the parent.
 * @throws {CsiError} INVALID_ARGUMENT naming why
 */
export function destinationOf(parent: string, row: DeletedRow, as?: string): string {
  if (row.kind === "volume") {
    // A host volume goes back to its own name only: its dataset name is its namespace and name.
    if (isHostDataset(parent, row.deletedName)) {
      if (as === undefined) return row.deletedName;
      throw new CsiError(
        Code.INVALID_ARGUMENT,
        `"${row.hidden}" was a host volume: it goes back to "${row.deletedName}" only (no --as)`,
      );
    }
    const dest = as === undefined ? row.deletedName : childDataset(parent, "Volume name", as);
    const name = volumeForDataset(parent, dest);
    if (name === undefined || dest.slice(parent.length + 1).includes("/")) {
      throw new CsiError(
        Code.INVALID_ARGUMENT,
        `"${row.hidden}" records the name "${dest}", which is not a volume below "${parent}": ` +
          `give one with --as NAME`,
      );
    }
    return dest;
  }
  if (as !== undefined) {
    throw new CsiError(Code.INVALID_ARGUMENT, "--as renames volumes only, not snapshots");
  }
  const container = row.hidden.slice(0, row.hidden.indexOf("@"));
  const dest = row.deletedName;
  const component = dest.slice(dest.indexOf("@") + 1);
  if (!dest.startsWith(`${container}@`) || component.startsWith(".") || component === "") {
    throw new CsiError(
      Code.INVALID_ARGUMENT,
      `"${row.hidden}" records the name "${dest}", which is not a snapshot of "${container}"`,
    );
  }
  if (isDeletedComponent(container.slice(parent.length + 1))) {
    throw new CsiError(
      Code.FAILED_PRECONDITION,
      `The volume of "${row.hidden}" is set aside too: undelete the volume first`,
    );
  }
  return dest;
}

/**
 * Renames `row.hidden` back to `dest`, removes its deletion marks and, for a volume, lets it
 * mount again and mounts it; a zvol first gets back the reservation it gave back when it was
 * set aside (src/volume/zvol_reservation.ts). Nothing is destroyed; a step that fails after the
 * rename says which commands finish the job.
 * @throws {CsiError} FAILED_PRECONDITION when `dest` exists or the item changed since it was
 *   read; RESOURCE_EXHAUSTED when the pool has no room for the zvol's reservation (it is left
 *   set aside, unchanged)
 */
export async function undelete(zfs: Zfs, row: DeletedRow, dest: string): Promise<boolean> {
  const taken = await zfs.getProperties(dest, ["type"]);
  if (taken) {
    throw new CsiError(
      Code.FAILED_PRECONDITION,
      `"${dest}" exists (made since the delete?); nothing was changed: undelete under another ` +
        `name with --as NAME, or move that one away first`,
    );
  }
  // Read again right before: it must still be the item listed, with the same marks.
  const now = await zfs.getProperties(row.hidden, [...LIST_PROPERTIES]);
  if (!now || deletedMarks(now)?.at !== row.deletedAt) {
    throw new CsiError(
      Code.FAILED_PRECONDITION,
      `"${row.hidden}" changed or went (purged?) since it was listed; nothing was changed`,
    );
  }
  // A zvol (a block volume) has no canmount and is not mounted by zfs. Its reservation, given
  // back at the delete, is put back first: where there is no room, it stays set aside as it was.
  const type = row.kind === "volume" ? now.get("type")?.value : undefined;
  const filesystem = type === "filesystem";
  const plan = type === "volume"
    ? reservationPlan(row.hidden, await zvolReservation(zfs, row.hidden))
    : { kind: "none" as const };
  await restoreReservation(zfs, row.hidden, dest, plan);
  await zfs.rename(row.hidden, dest);
  const recorded = plan.kind !== "none";
  const finish = [
    `zfs inherit ${DELETED_AT_PROPERTY} ${dest}`,
    `zfs inherit ${DELETED_NAME_PROPERTY} ${dest}`,
    ...(recorded ? [`zfs inherit ${RESERVATION_RECORD_PROPERTY} ${dest}`] : []),
    ...(filesystem ? [`zfs set canmount=on ${dest}`] : []),
  ];
  try {
    await zfs.inherit(dest, DELETED_AT_PROPERTY);
    await zfs.inherit(dest, DELETED_NAME_PROPERTY);
    if (recorded) await zfs.inherit(dest, RESERVATION_RECORD_PROPERTY);
    if (filesystem) await zfs.set(dest, "canmount", "on");
  } catch (err) {
    throw new Error(
      `"${row.hidden}" is back as "${dest}", but its marks could not all be removed ` +
        `(${err instanceof Error ? err.message : String(err)}); finish with: ${finish.join("; ")}`,
      { cause: err },
    );
  }
  if (!filesystem) return false;
  try {
    await zfs.mount(dest);
    return true;
  } catch (err) {
    if (err instanceof ZfsError) return false;
    throw err;
  }
}

/** A set-aside zvol's {@linkcode RESERVATION_PROPERTIES}. */
async function zvolReservation(zfs: Zfs, hidden: string): Promise<PropertyMap> {
  const props = await zfs.getProperties(hidden, RESERVATION_PROPERTIES);
  if (!props) {
    throw new CsiError(Code.FAILED_PRECONDITION, `"${hidden}" went since it was listed (purged?)`);
  }
  return props;
}

/** Usage of `undelete`. */
export const usage =
  `Usage: zfs-csi undelete --parent-dataset NAME --node-id ID [plugin flags] TARGET [--as NAME] [--json]

Undoes a delete within the retention. TARGET is a volume name (pg-data), a snapshot
(pg-data@nightly), a host volume's dataset name (.host-default_pg-data) or the hidden name of
what was set aside (zfs-csi list --deleted shows
them). It goes back to the name it recorded (org.zfs-csi:deleted-name); its deletion marks are
removed, and a volume may mount again and is mounted. Refused when that name is taken: --as
NAME gives a volume another name. Nomad may need the volume registered again
(nomad volume register, external_id = "<name>@<node>").`;

/** Runs `undelete`; `opts` replace the real runner in tests. */
export async function run(
  args: readonly string[],
  io: CliIo,
  opts: ToolOptions = {},
): Promise<number> {
  const split = splitArgs(args, { json: { type: "boolean" }, as: { type: "string" } });
  if (split.positionals.length !== 1) {
    throw new ConfigError("undelete takes one TARGET: a volume, volume@snapshot or hidden name");
  }
  const target = split.positionals[0]!;
  const as = typeof split.own.as === "string" ? split.own.as : undefined;
  const config = resolveConfig(split.configArgs);
  if (!opts.runner) checkPrograms([config.zfsPath]);
  const tools = buildTools(config, { level: "warn", ...opts });
  const { zfs } = tools;
  const parent = config.parentDataset;
  const rows = deletedRows(parent, await readParentTree(tools, 2, LIST_PROPERTIES));
  const found = findSetAside(parent, rows, target);
  if (found.length === 0) {
    throw new CsiError(
      Code.NOT_FOUND,
      `Nothing set aside below "${parent}" is "${target}" (purged already, or never deleted); ` +
        `zfs-csi list --deleted shows what is`,
    );
  }
  if (found.length > 1) {
    throw new CsiError(
      Code.FAILED_PRECONDITION,
      `"${target}" was deleted ${found.length} times: name one of ` +
        found.map((r) => `"${r.hidden}" (deleted ${isoSeconds(r.deletedAt)})`).join(", "),
    );
  }
  const row = found[0]!;
  const dest = destinationOf(parent, row, as);
  const mounted = await undelete(zfs, row, dest);
  const host = row.kind === "volume" && isHostDataset(parent, dest);
  const name = row.kind === "volume" && !host ? volumeForDataset(parent, dest) : undefined;
  const result: Undeleted = {
    kind: row.kind,
    from: row.hidden,
    to: dest,
    deletedAt: row.deletedAt,
    ...(row.kind === "volume" ? { mounted } : {}),
    ...(name === undefined ? {} : { volumeId: qualifiedVolumeId(name, config.nodeId) }),
    ...(host ? { hostVolume: true } : {}),
  };
  if (split.own.json === true) {
    printJson(io, result);
    return 0;
  }
  io.out(
    `Undeleted ${row.kind} "${dest}" (was "${row.hidden}", deleted ${isoSeconds(row.deletedAt)}).`,
  );
  if (host) {
    io.out(
      `It is a host volume: create it again with "nomad volume create" and the same spec. Nomad ` +
        `gives it a new id, and the plugin's create refuses once, printing the ` +
        `"zfs set ${HOST_VOLUME_ID_PROPERTY}=<new id> ${dest}" that hands this dataset to it; ` +
        `run that, then create again.`,
    );
  } else if (row.kind === "volume") {
    if (!mounted) io.out("It is not mounted yet; the next stage mounts it.");
    io.out(
      `If Nomad forgot it, register it again: nomad volume register (external_id = "${result.volumeId}").`,
    );
  }
  return 0;
}
