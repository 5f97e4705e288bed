/**
 * `zfs-csi adopt`: hands an existing dataset below the parent over to zfs-csi, docs/volumes.md's
 * `zfs set org.zfs-csi:managed=yes` recipe with its checks made first: a direct child of the
 * parent, a filesystem, named as a volume, not hidden, and not zfs-csi's already. The plugin
 * never adopts a dataset by itself (staging an unmarked one is refused, saying how).
 */

import { ConfigError } from "../config.ts";
import { Code, CsiError } from "../errors.ts";
import { qualifiedVolumeId } from "../zfs/ids.ts";
import { MANAGED_PROPERTY, MANAGED_VALUE, volumeForDataset } from "../zfs/names.ts";
import { hasOwnMarker } from "../zfs/parse.ts";
import type { Zfs } from "../zfs/zfs.ts";
import { type CliIo, printJson } from "./io.ts";
import { buildTools, checkPrograms, resolveConfig, splitArgs, type ToolOptions } from "./setup.ts";

/** What adopting did. */
export interface Adopted {
  readonly dataset: string;
  readonly volumeId: string;
  /** False when it was zfs-csi's already (nothing was changed). */
  readonly changed: boolean;
}

/**
 * The dataset `target` names below `parent` (its name, or its full dataset name), checked to be
 * one that can hold a volume.
 * @throws {CsiError} INVALID_ARGUMENT when it cannot be a volume of this parent
 */
export function adoptable(parent: string, target: string): { dataset: string; name: string } {
  const dataset = target.startsWith(`${parent}/`) ? target : `${parent}/${target}`;
  const component = dataset.slice(parent.length + 1);
  const name = volumeForDataset(parent, dataset);
  if (name === undefined || component.includes("/") || component.startsWith(".")) {
    throw new CsiError(
      Code.INVALID_ARGUMENT,
      `"${dataset}" cannot be a volume: adopt takes a direct child of "${parent}" whose name is ` +
        `a volume name (not hidden, not below another dataset)`,
    );
  }
  return { dataset, name };
}

/**
 * Sets the marker on `dataset` after reading it: it must exist and be a filesystem.
 * @returns whether it was set (false: the dataset carried its own marker already)
 * @throws {CsiError} NOT_FOUND, or FAILED_PRECONDITION for a snapshot or volume (zvol)
 */
export async function adopt(zfs: Zfs, dataset: string): Promise<boolean> {
  const props = await zfs.getProperties(dataset, ["type", MANAGED_PROPERTY]);
  if (!props) throw new CsiError(Code.NOT_FOUND, `No dataset "${dataset}"`);
  const type = props.get("type")?.value;
  if (type !== "filesystem") {
    throw new CsiError(
      Code.FAILED_PRECONDITION,
      `"${dataset}" is a ${
        type ?? "dataset of unknown type"
      }, not a filesystem: zfs-csi volumes are filesystems`,
    );
  }
  if (hasOwnMarker(props, MANAGED_PROPERTY, MANAGED_VALUE)) return false;
  await zfs.set(dataset, MANAGED_PROPERTY, MANAGED_VALUE);
  return true;
}

/** Usage of `adopt`. */
export const usage =
  `Usage: zfs-csi adopt --parent-dataset NAME --node-id ID [plugin flags] DATASET [--json]

Hands an existing filesystem below the parent dataset over to zfs-csi (sets
${MANAGED_PROPERTY}=${MANAGED_VALUE} on it, after checking that it is a direct child with a volume
name). DATASET is its name below the parent or its full name. Its data, size and mounts stay as
they are; register it with Nomad as a volume (external_id = "<name>@<node>"). Undo with
zfs inherit ${MANAGED_PROPERTY} <dataset>.`;

/** Runs `adopt`; `opts` replace the real runner in tests. */
export async function run(
  args: readonly string[],
  io: CliIo,
  opts: ToolOptions = {},
): Promise<number> {
  const split = splitArgs(args, { json: { type: "boolean" } });
  if (split.positionals.length !== 1) throw new ConfigError("adopt takes one DATASET");
  const config = resolveConfig(split.configArgs);
  if (!opts.runner) checkPrograms([config.zfsPath]);
  const { zfs } = buildTools(config, { level: "warn", ...opts });
  const { dataset, name } = adoptable(config.parentDataset, split.positionals[0]!);
  const changed = await adopt(zfs, dataset);
  const result: Adopted = { dataset, volumeId: qualifiedVolumeId(name, config.nodeId), changed };
  if (split.own.json === true) printJson(io, result);
  else if (!changed) io.out(`"${dataset}" is zfs-csi's already; nothing was changed.`);
  else {
    io.out(`Adopted "${dataset}": it is volume "${result.volumeId}" now.`);
    io.out(`Register it with Nomad: nomad volume register (external_id = "${result.volumeId}").`);
  }
  return 0;
}
