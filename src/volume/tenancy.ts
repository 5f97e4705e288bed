/**
 * When a repeated CreateVolume is the same volume. CSI makes CreateVolume idempotent by name so
 * that a client can retry a create whose answer it lost. Nomad sends only the volume's `name`
 * (never its id or namespace), and names repeat across namespaces: `postgres` in `staging` and
 * `postgres` in `prod` with the same parameters look the same to the plugin. A repeat is taken
 * for a retry only while it could still be one:
 *
 * - the dataset records the name asked for (`org.zfs-csi:name`, set at create), so it was made
 *   by this version for this very name;
 * - it has never been staged (`org.zfs-csi:staged-at`, set by the node at the first stage):
 *   a volume in use is someone's data, and a job writes only through a staged mount;
 * - it was created less than {@linkcode RETRY_WINDOW_SECONDS} ago: Nomad gives CreateVolume
 *   2 minutes and never retries it itself, so a real repeat is an operator running
 *   `nomad volume create` again soon after a failure.
 *
 * Anything else is ALREADY_EXISTS, with a message that says what to do.
 */

import { Code, CsiError } from "../errors.ts";
import { NAME_PROPERTY, STAGED_PROPERTY } from "../zfs/names.ts";
import type { PropertyMap } from "../zfs/parse.ts";

/** How long after its creation an unstaged volume answers a repeated CreateVolume: 10 min. */
export const RETRY_WINDOW_SECONDS = 600;

/** A user property's value when set on the dataset itself (or received), not inherited. */
function ownValue(props: PropertyMap, name: string): string | undefined {
  const v = props.get(name);
  if (!v || v.value === "-" || !(v.source === "local" || v.source.startsWith("received"))) {
    return undefined;
  }
  return v.value;
}

/** When a node first staged the volume (unix seconds), or undefined if none ever did. */
export function stagedAt(props: PropertyMap): number | undefined {
  const value = ownValue(props, STAGED_PROPERTY);
  // Any value marks the volume as used; one that is not a time counts as time 0.
  if (value === undefined) return undefined;
  return /^\d{1,12}$/.test(value) ? Number(value) : 0;
}

/** The name recorded at create, or undefined for volumes made before names were recorded. */
export function recordedName(props: PropertyMap): string | undefined {
  return ownValue(props, NAME_PROPERTY);
}

/** A time for messages: `2025-06-01T10:00:00Z`. */
function when(seconds: number): string {
  return seconds > 0 ? new Date(seconds * 1000).toISOString().replace(".000Z", "Z") : "unknown";
}

/**
 * Refuses a repeated CreateVolume of `name` that is not a retry, as described above. The caller
 * has already checked that the dataset is a volume of ours whose parameters, source and
 * capacity fit the request.
 * @param id the volume's id, for the message
 * @param props the dataset's properties, with `creation`, the name and the staged marker
 * @param nowSeconds the current time (unix seconds)
 * @throws {CsiError} ALREADY_EXISTS naming the volume, when it was created, whether it was
 *   staged, and what to do
 */
export function checkRetry(
  id: string,
  name: string,
  props: PropertyMap,
  nowSeconds: number,
): void {
  const created = Number(props.get("creation")?.value ?? "0") || 0;
  const staged = stagedAt(props);
  const recorded = recordedName(props);
  let why: string | undefined;
  if (recorded === undefined) {
    why = `created ${when(created)} by an earlier zfs-csi, which did not record the name ` +
      `asked for, so it cannot be told from a volume of another namespace`;
  } else if (staged !== undefined) {
    why = `created ${when(created)} and staged since ${when(staged)}, so it holds data`;
  } else if (!(created > 0 && nowSeconds - created < RETRY_WINDOW_SECONDS)) {
    why = `created ${when(created)}, more than ${RETRY_WINDOW_SECONDS / 60} minutes ago ` +
      `(never staged)`;
  }
  if (why === undefined) return;
  throw new CsiError(
    Code.ALREADY_EXISTS,
    `Volume "${id}" already exists: ${why}; a CreateVolume of its name is a retry only within ` +
      `${RETRY_WINDOW_SECONDS / 60} minutes of its creation and before it is staged. Nomad ` +
      `sends the plugin only a volume's name, not its id or namespace, so give each volume a ` +
      `name of its own across all namespaces (e.g. "${name}-prod" rather than "${name}")`,
  );
}

/**
 * Refuses a repeated CreateVolume of `name` whose dataset records another name: the dataset of a
 * shortened name whose prefix and hash another name shares.
 * @throws {CsiError} ALREADY_EXISTS naming both names
 */
export function checkRecordedName(
  id: string,
  dataset: string,
  name: string,
  props: PropertyMap,
): void {
  const recorded = recordedName(props);
  if (recorded === undefined || recorded === name) return;
  throw new CsiError(
    Code.ALREADY_EXISTS,
    `Volume "${id}" already exists for another name: dataset "${dataset}" was created for ` +
      `"${recorded}", not "${name}"; choose another name`,
  );
}
