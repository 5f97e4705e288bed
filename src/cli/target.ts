/**
 * Which dataset an operator's VOLUME argument names below the parent: a CSI volume's name
 * (`pg-data`, `db[0]`), a host volume's dataset component (`.host-prod_cache`), or either one's
 * full dataset name. Pure.
 */

import { Code, CsiError } from "../errors.ts";
import { isHostDataset } from "../dhv/names.ts";
import { childDataset, volumeForDataset } from "../zfs/names.ts";

/** A volume an operator named. */
export interface NamedVolume {
  readonly dataset: string;
  /** Its name as the store and messages know it: the CSI name, or the host volume's component. */
  readonly name: string;
  readonly kind: "csi" | "host";
}

/**
 * The volume `arg` names below `parent`.
 * @throws {CsiError} INVALID_ARGUMENT when it cannot be a volume of this parent
 */
export function namedVolume(parent: string, arg: string): NamedVolume {
  const dataset = arg.startsWith(`${parent}/`)
    ? arg
    : arg.startsWith(".host-")
    ? `${parent}/${arg}`
    : childDataset(parent, "Volume name", arg);
  const component = dataset.slice(parent.length + 1);
  if (isHostDataset(parent, dataset)) return { dataset, name: component, kind: "host" };
  const name = volumeForDataset(parent, dataset);
  if (name === undefined || component.includes("/") || component.startsWith(".")) {
    throw new CsiError(
      Code.INVALID_ARGUMENT,
      `"${arg}" is not a volume below "${parent}": give a volume's name (zfs-csi list shows them)`,
    );
  }
  return { dataset, name, kind: "csi" };
}
