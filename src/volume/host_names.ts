/**
 * Where a host volume lives and what marks it. A host volume is a direct child of the same parent
 * dataset as the CSI volumes, named `.host-<namespace>_<encoded volume name>`. The leading "."
 * keeps it out of CSI's reach: a CSI volume id never encodes to a name starting with "."
 * (names.ts escapes it), so no CSI call can name, list or delete a host volume, and this module
 * never computes a CSI volume's name. Its user properties record Nomad's volume id and namespace
 * (which DHV sends, unlike CSI), so a dataset is one volume of one namespace.
 */

import { Code, CsiError } from "../errors.ts";
import { byteLength, encodeComponent, encodeName, MAX_DATASET_NAME } from "../zfs/names.ts";

/** User property: the Nomad volume id a host volume's dataset belongs to. Marks the DHV kind. */
export const HOST_VOLUME_ID_PROPERTY = "org.zfs-csi:host-volume-id";
/** User property: the Nomad namespace of the host volume. */
export const HOST_NAMESPACE_PROPERTY = "org.zfs-csi:host-namespace";
/** Prefix of every host volume's dataset component. */
export const HOST_PREFIX = ".host-";

/**
 * The dataset of host volume `name` in `namespace` below `parent`. The namespace (Nomad allows
 * only letters, digits and "-" in it) ends at the first "_", so no two pairs share a name.
 * @throws {CsiError} INVALID_ARGUMENT for names that cannot be encoded or would be too long
 */
export function hostDataset(parent: string, namespace: string, name: string): string {
  if (!/^[a-zA-Z0-9-]{1,128}$/.test(namespace)) {
    throw new CsiError(Code.INVALID_ARGUMENT, `Namespace "${namespace}" is not a Nomad namespace`);
  }
  const dataset = `${parent}/${HOST_PREFIX}${namespace}_${encodeName("Volume name", name)}`;
  if (byteLength(dataset) > MAX_DATASET_NAME) {
    throw new CsiError(
      Code.INVALID_ARGUMENT,
      `Volume name "${name}" in namespace "${namespace}" is too long: dataset "${dataset}" ` +
        `would exceed ${MAX_DATASET_NAME} bytes; choose a shorter name`,
    );
  }
  return dataset;
}

/** Whether `dataset` is named like a host volume's (a direct child of `parent`). */
export function isHostDataset(parent: string, dataset: string): boolean {
  const prefix = `${parent}/${HOST_PREFIX}`;
  return dataset.startsWith(prefix) && !dataset.slice(prefix.length).includes("/");
}

/**
 * The name a host volume's backups are recorded under in the store: its dataset component
 * (`.host-<namespace>_<encoded name>`), whose store key is that name encoded as any volume
 * name is (`:2ehost-…`: the leading "." escaped, as the store allows no key segment starting
 * with "."). A CSI volume named `pgdata` has key `pgdata`, so a host volume and a CSI volume of
 * the same name never share a key; only a CSI volume literally named `.host-…` could, and the
 * record's uid check then refuses the second writer (nothing is overwritten).
 * @throws {CsiError} INVALID_ARGUMENT when `dataset` is not a host volume's, or its name is too
 *   long for a store key
 */
export function hostStoreName(parent: string, dataset: string): string {
  if (!isHostDataset(parent, dataset)) {
    throw new CsiError(
      Code.INVALID_ARGUMENT,
      `"${dataset}" is not a host volume below "${parent}"`,
    );
  }
  const name = dataset.slice(parent.length + 1);
  encodeComponent("Host volume's store name", name);
  return name;
}
