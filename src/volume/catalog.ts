/**
 * The volumes and snapshots below the parent dataset, read with one `zfs get -r` however many
 * there are. A volume is a direct child that carries our marker and whose name decodes to an
 * id; a snapshot is a snapshot of a volume whose name decodes. Hidden names (set aside by a
 * delete, or made for a clone) are neither.
 */

import { hasOwnMarker, parseBytes, type PropertyMap } from "../zfs/parse.ts";
import {
  decodeComponent,
  MANAGED_PROPERTY,
  MANAGED_VALUE,
  volumeForDataset,
} from "../zfs/names.ts";
import type { Zfs } from "../zfs/zfs.ts";
import { isZvolContent, ZVOL_CONTENT_PROPERTY, type ZvolContent } from "./zvol.ts";

/** User property holding a volume's CreateVolume parameters, in canonical form. */
export const PARAMETERS_PROPERTY = "org.zfs-csi:parameters";
/** User property holding what a volume was created from: `snapshot:<id>` or `volume:<id>`. */
export const SOURCE_PROPERTY = "org.zfs-csi:source";

/** Properties the catalog reads. */
export const CATALOG_PROPERTIES = [
  "type",
  "creation",
  "referenced",
  "refquota",
  MANAGED_PROPERTY,
  PARAMETERS_PROPERTY,
  SOURCE_PROPERTY,
] as const;

/** What the catalog reads of zvols besides: their size and what they hold (zvol.ts). */
export const ZVOL_CATALOG_PROPERTIES = ["volsize", ZVOL_CONTENT_PROPERTY] as const;

/** Everything the catalog reads of each dataset. */
export const CATALOG_READ = [...CATALOG_PROPERTIES, ...ZVOL_CATALOG_PROPERTIES] as const;

/** A volume's dataset as the catalog sees it. */
export interface VolumeRecord {
  readonly dataset: string;
  /** The volume's name (its decoded component). */
  readonly name: string;
  /** 0 when unlimited; a zvol's volsize. */
  readonly refquota: number;
  /** For a zvol, what it holds; undefined for a filesystem. */
  readonly content?: ZvolContent;
  /** Canonical parameters ("{}" when none were recorded). */
  readonly parameters: string;
  /** `snapshot:<id>`, `volume:<id>` or "". */
  readonly source: string;
}

/** A CSI snapshot as the catalog sees it. */
export interface SnapshotRecord {
  /** Full ZFS name, `<dataset>@<component>`. */
  readonly snapshot: string;
  readonly dataset: string;
  /** The volume's name. */
  readonly volumeName: string;
  /** The snapshot's component and its decoded name. */
  readonly component: string;
  readonly name: string;
  /** Unix seconds. */
  readonly creation: number;
  /** Bytes the snapshot refers to: what a volume restored from it holds. */
  readonly referenced: number;
}

/** Everything below the parent. */
export interface Catalog {
  readonly volumes: readonly VolumeRecord[];
  readonly snapshots: readonly SnapshotRecord[];
}

/** A user property's value, or "" when unset ("-"). */
export function userValue(props: PropertyMap, name: string): string {
  const v = props.get(name);
  return !v || v.source === "-" || v.value === "-" ? "" : v.value;
}

/** Reads a volume record from a dataset's properties, or undefined if it holds no volume. */
export function volumeRecord(
  parent: string,
  dataset: string,
  props: PropertyMap,
): VolumeRecord | undefined {
  const type = props.get("type")?.value;
  if (type !== "filesystem" && type !== "volume") return undefined;
  const name = volumeForDataset(parent, dataset);
  if (name === undefined || !hasOwnMarker(props, MANAGED_PROPERTY, MANAGED_VALUE)) {
    return undefined;
  }
  // A zvol counts as a volume only with what it holds recorded: one made by hand does not.
  const content = userValue(props, ZVOL_CONTENT_PROPERTY);
  if (type === "volume" && !isZvolContent(content)) return undefined;
  return {
    dataset,
    name,
    refquota: parseBytes(props.get(type === "volume" ? "volsize" : "refquota")?.value ?? "0"),
    ...(type === "volume" && isZvolContent(content) ? { content } : {}),
    parameters: userValue(props, PARAMETERS_PROPERTY) || "{}",
    source: userValue(props, SOURCE_PROPERTY),
  };
}

/** Builds the catalog from `zfs get -r` output of the parent. */
export function catalogOf(parent: string, tree: ReadonlyMap<string, PropertyMap>): Catalog {
  const volumes = new Map<string, VolumeRecord>();
  for (const [name, props] of tree) {
    const v = volumeRecord(parent, name, props);
    if (v) volumes.set(name, v);
  }
  const snapshots: SnapshotRecord[] = [];
  for (const [name, props] of tree) {
    const at = name.indexOf("@");
    if (at < 0 || props.get("type")?.value !== "snapshot") continue;
    const volume = volumes.get(name.slice(0, at));
    const component = name.slice(at + 1);
    const snapName = decodeComponent(component);
    if (!volume || snapName === undefined) continue;
    snapshots.push({
      snapshot: name,
      dataset: volume.dataset,
      volumeName: volume.name,
      component,
      name: snapName,
      creation: Number(props.get("creation")?.value ?? "0") || 0,
      referenced: parseBytes(props.get("referenced")?.value ?? "0"),
    });
  }
  return { volumes: [...volumes.values()], snapshots };
}

/**
 * Reads the catalog of `parent`: with snapshots (depth 2) or volumes only (depth 1).
 * @throws {ZfsError} when zfs fails; a missing parent reads as empty
 */
export async function readCatalog(
  zfs: Zfs,
  parent: string,
  opts: { readonly snapshots: boolean },
): Promise<Catalog> {
  const tree = await zfs.getTree(parent, opts.snapshots ? 2 : 1, CATALOG_READ);
  return tree ? catalogOf(parent, tree) : { volumes: [], snapshots: [] };
}
