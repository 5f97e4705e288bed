/**
 * What stands in the way of destroying a dataset the plugin made: a volume being deleted, or one
 * a delete set aside. Read from one `zfs get -r -d 1` of the dataset (itself, its snapshots and
 * its direct children; anything deeper sits below a child, which is in the way already) and,
 * when its snapshots may have clones, the origins of the parent's children.
 *
 * In the way: any child dataset (filesystem or volume), any snapshot the plugin did not make
 * (sanoid's `autosnap_*`, zrepl's, an operator's), any hold, and any clone that is not one of
 * the plugin's own volumes. Such a dataset is refused or kept, never destroyed.
 */

import {
  CLONE_PREFIX,
  decodeComponent,
  DELETED_AT_PROPERTY,
  DELETED_NAME_PROPERTY,
  isDeletedComponent,
  MANAGED_PROPERTY,
  MANAGED_VALUE,
  parseDeletedAt,
  STORED_PREFIX,
  volumeForDataset,
} from "../zfs/names.ts";
import { hasOwnMarker, type PropertyMap } from "../zfs/parse.ts";
import { isBackupComponent } from "./backup_names.ts";

/** Properties read of a dataset's subtree before it is deleted or purged. */
export const SUBTREE_PROPERTIES = [
  "type",
  "mountpoint",
  MANAGED_PROPERTY,
  DELETED_AT_PROPERTY,
  DELETED_NAME_PROPERTY,
  "userrefs",
  "defer_destroy",
] as const;

/** OpenZFS's list of a snapshot's clones; zfs-fuse does not have it. */
export const CLONES_PROPERTY = "clones";

/** Properties read of the parent's children to find the clones of a subtree's snapshots. */
export const SIBLING_PROPERTIES = ["type", "origin", MANAGED_PROPERTY] as const;

/** The hidden snapshot CreateVolume clones a volume from (see cloneSnapshotComponent). */
const CLONE_COMPONENT = new RegExp(`^${CLONE_PREFIX.replace(".", "\\.")}[0-9a-f]{16}-\\d{1,12}$`);

/** Whether a snapshot component is one the plugin takes for the store (destroyed with it). */
export function isStoreComponent(component: string): boolean {
  // Scheduled backups (every version's name) and stored CSI snapshots.
  if (isBackupComponent(component)) return true;
  return component.startsWith(STORED_PREFIX) &&
    decodeComponent(component.slice(STORED_PREFIX.length)) !== undefined;
}

/** Why something is in the way. */
export type ObstacleKind =
  /** A dataset below the one to destroy. */
  | "child"
  /** A snapshot the plugin did not make. */
  | "snapshot"
  /** A snapshot with a set-aside name but without the plugin's markers. */
  | "unmarked"
  /** A snapshot with holds (`zfs hold`). */
  | "hold"
  /** A clone that is not one of the plugin's volumes. */
  | "clone";

/** One thing in the way. */
export interface Obstacle {
  readonly kind: ObstacleKind;
  /** The child, snapshot or clone. */
  readonly name: string;
  /** For a clone: the snapshot it was made from. */
  readonly of?: string;
}

/** What a subtree holds, judged. */
export interface SubtreeCheck {
  /** The dataset checked. */
  readonly root: string;
  /** Snapshots with CSI snapshot ids (only on a volume): DeleteVolume refuses these itself. */
  readonly csiSnapshots: readonly string[];
  /** The plugin's own hidden snapshots, destroyed one by one before the dataset. */
  readonly ownSnapshots: readonly string[];
  /** Own snapshots that own volumes are cloned from: the dataset must wait for those clones. */
  readonly clonedSnapshots: readonly string[];
  /** Everything in the way, in name order. */
  readonly obstacles: readonly Obstacle[];
}

/** What {@linkcode checkSubtree} judges. */
export interface SubtreeInput {
  /** The plugin's parent dataset. */
  readonly parent: string;
  /** The dataset to destroy: a volume or a set-aside one, a direct child of `parent`. */
  readonly root: string;
  /** `zfs get -r -d 1` of `root` with {@linkcode SUBTREE_PROPERTIES} (and clones if known). */
  readonly tree: ReadonlyMap<string, PropertyMap>;
  /** `zfs get -r -d 1` of `parent` with {@linkcode SIBLING_PROPERTIES}, when read. */
  readonly siblings?: ReadonlyMap<string, PropertyMap>;
}

/** The clones `clones` lists, or undefined when this ZFS did not report the property. */
export function listedClones(props: PropertyMap): string[] | undefined {
  const v = props.get(CLONES_PROPERTY);
  if (v === undefined) return undefined;
  return v.value.split(",").filter((c) => c !== "" && c !== "-");
}

/**
 * Whether judging `tree` needs the parent's children: when a snapshot may have clones that the
 * tree cannot name (no `clones` property, as on zfs-fuse) or does name (whose owner must be read).
 */
export function needsSiblings(tree: ReadonlyMap<string, PropertyMap>): boolean {
  for (const [name, props] of tree) {
    if (!name.includes("@")) continue;
    const clones = listedClones(props);
    if (clones === undefined || clones.length > 0) return true;
  }
  return false;
}

/** A property's value if it was set on the object itself (not inherited, not received). */
function localValue(props: PropertyMap, name: string): string | undefined {
  const v = props.get(name);
  return v !== undefined && v.source === "local" ? v.value : undefined;
}

/** The plugin's set-aside markers on one dataset or snapshot. */
export interface DeletedMarks {
  /** When it was set aside (unix seconds). */
  readonly at: number;
  /** Its name before, or "" if not recorded. */
  readonly name: string;
}

/**
 * The markers a delete sets on what it sets aside, or undefined unless both the plugin's own
 * marker and the deletion time are set locally on this very object (inherited or received
 * values do not count: a purge must never take a copy of someone else's marks).
 */
export function deletedMarks(props: PropertyMap): DeletedMarks | undefined {
  if (localValue(props, MANAGED_PROPERTY) !== MANAGED_VALUE) return undefined;
  const at = parseDeletedAt(localValue(props, DELETED_AT_PROPERTY) ?? "");
  if (at === undefined) return undefined;
  return { at, name: localValue(props, DELETED_NAME_PROPERTY) ?? "" };
}

/** Whether a snapshot component is one CreateVolume makes to clone a volume from. */
export function isCloneComponent(component: string): boolean {
  return CLONE_COMPONENT.test(component);
}

/** Whether `props` show holds on a snapshot. */
function held(props: PropertyMap): boolean {
  const refs = Number(props.get("userrefs")?.value ?? "0");
  return Number.isFinite(refs) && refs > 0;
}

/**
 * Judges the subtree of `root`: what the plugin made (its CSI snapshots, its hidden snapshots)
 * and what is in the way. A hidden `.deleted-*` snapshot counts as the plugin's only with its
 * markers; a `.clone-*` one only in the exact form CreateVolume gives it.
 */
export function checkSubtree(input: SubtreeInput): SubtreeCheck {
  const { parent, root, tree } = input;
  const isVolume = volumeForDataset(parent, root) !== undefined;
  const ownVolume = (name: string): boolean => {
    const props = input.siblings?.get(name);
    return name.startsWith(parent + "/") && !name.slice(parent.length + 1).includes("/") &&
      props !== undefined &&
      (props.get("type")?.value === "filesystem" || props.get("type")?.value === "volume") &&
      hasOwnMarker(props, MANAGED_PROPERTY, MANAGED_VALUE);
  };
  const csiSnapshots: string[] = [];
  const ownSnapshots: string[] = [];
  const clonedSnapshots: string[] = [];
  const obstacles: Obstacle[] = [];
  for (const name of [...tree.keys()].sort()) {
    const props = tree.get(name)!;
    if (name === root) continue;
    if (!name.startsWith(root + "@")) {
      if (name.startsWith(root + "/")) obstacles.push({ kind: "child", name });
      continue;
    }
    const component = name.slice(root.length + 1);
    if (held(props)) obstacles.push({ kind: "hold", name });
    // Clones named by `clones` (OpenZFS), and those below the parent found by their origin.
    const clones = new Set(listedClones(props) ?? []);
    for (const [sibling, p] of input.siblings ?? []) {
      if (p.get("origin")?.value === name) clones.add(sibling);
    }
    const foreign = [...clones].filter((c) => !ownVolume(c)).sort();
    for (const clone of foreign) obstacles.push({ kind: "clone", name: clone, of: name });
    if (isVolume && decodeComponent(component) !== undefined) {
      csiSnapshots.push(name);
    } else if (isDeletedComponent(component)) {
      if (deletedMarks(props) === undefined) {
        obstacles.push({ kind: "unmarked", name });
        continue;
      }
      ownSnapshots.push(name);
    } else if (isCloneComponent(component) || isStoreComponent(component)) {
      ownSnapshots.push(name);
    } else {
      obstacles.push({ kind: "snapshot", name });
      continue;
    }
    if (clones.size > foreign.length) clonedSnapshots.push(name);
  }
  return { root, csiSnapshots, ownSnapshots, clonedSnapshots, obstacles };
}

/** How many obstacles a message names before it says how many more there are. */
const MAX_LISTED = 5;

/** What to do about one obstacle. */
function remedy(o: Obstacle): string {
  switch (o.kind) {
    case "child":
      return `child dataset "${o.name}": move it out ("zfs rename ${o.name} <new name>") ` +
        `or destroy it ("zfs destroy -r ${o.name}")`;
    case "snapshot":
      return `snapshot "${o.name}", not made by zfs-csi: destroy it ("zfs destroy ${o.name}") ` +
        `and stop the tool that takes it (sanoid, zrepl, ...) from snapshotting this dataset`;
    case "unmarked":
      return `snapshot "${o.name}" has a set-aside name but not zfs-csi's marks (made by hand, ` +
        `by an older zfs-csi, or interrupted): destroy it ("zfs destroy ${o.name}") or rename it`;
    case "hold":
      return `snapshot "${o.name}" is held: list the holds ("zfs holds ${o.name}") and ` +
        `release them ("zfs release <tag> ${o.name}")`;
    case "clone":
      return `dataset "${o.name}", not a zfs-csi volume, is a clone of "${o.of}": make it ` +
        `independent ("zfs promote ${o.name}") or destroy it ("zfs destroy ${o.name}")`;
  }
}

/**
 * One message naming what is in the way (the first few) and how to remove or move each, after
 * `subject` (e.g. `Volume "pg@node-a" is not deleted`).
 */
export function obstacleMessage(
  subject: string,
  root: string,
  obstacles: readonly Obstacle[],
): string {
  const listed = obstacles.slice(0, MAX_LISTED).map(remedy).join("; ");
  const more = obstacles.length > MAX_LISTED
    ? `; and ${obstacles.length - MAX_LISTED} more ("zfs list -r -t all -o name,userrefs ${root}")`
    : "";
  return `${subject}: it holds what zfs-csi did not make, which it never destroys: ${listed}${more}`;
}
