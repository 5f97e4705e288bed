/**
 * Names that fit. CSI lets a client send volume and snapshot names of up to 128 bytes, and
 * the ids we return must fit in 128 bytes too; ours also name the node (`<name>@<node>`,
 * `<volume>@<snapshot>@<node>`), and the dataset must stay within ZFS's 255 bytes. A name
 * that leaves no room is shortened, the same way every time: a prefix of it, "..", and 16 hex
 * digits of its SHA-256. Create calls stay idempotent (the same name gives the same dataset),
 * the prefix keeps datasets recognizable, and names that fit are used as they are. No client
 * name contains "..", so no name a client sends maps to another name's shortened dataset.
 *
 * Before ".." marked them, shortened names were `<prefix>-<hash>` (or the bare hash). Those
 * are ordinary names now: datasets made that way keep their ids, and {@linkcode isFormOf}
 * still knows them.
 */

import { createHash } from "node:crypto";
import {
  byteLength,
  encodeComponent,
  encodeName,
  MAX_DATASET_NAME,
  MAX_VOLUME_ID_BYTES,
  SHORTENED_SEPARATOR,
  splitShortened,
} from "./names.ts";
import { Code, CsiError } from "../errors.ts";

/** Hex digits of the hash in a shortened name: 64 bits, no collision in practice. */
const HASH_DIGITS = 16;

/**
 * Longest id of a volume with a shortened name: a shortened volume leaves this much of the
 * 128 bytes free, so its snapshots' ids can fit as well.
 */
const SHORTENED_VOLUME_ID_BYTES = 96;

function hashOf(name: string): string {
  return createHash("sha256").update(name).digest("hex").slice(0, HASH_DIGITS);
}

/**
 * The longest `<prefix of name>..<hash>` that `fits`, or undefined when not even one character
 * of prefix does. Prefixes are cut at whole characters. The prefix is never empty: a name
 * starting with "." is hidden, and a bare hash is a name a client could send.
 */
function shorten(name: string, fits: (candidate: string) => boolean): string | undefined {
  const hash = hashOf(name);
  const chars = [...name];
  for (let n = chars.length - 1; n >= 1; n--) {
    const candidate = `${chars.slice(0, n).join("")}${SHORTENED_SEPARATOR}${hash}`;
    if (fits(candidate)) return candidate;
  }
  return undefined;
}

/**
 * Whether `candidate` is `name` itself or a shortened form of it: today's
 * (`<prefix>..<hash>`) or the earlier one (`<prefix>-<hash>`, or the bare hash), which
 * snapshots made before the change still carry.
 */
export function isFormOf(candidate: string, name: string): boolean {
  if (candidate === name) return true;
  const hash = hashOf(name);
  const short = splitShortened(candidate);
  if (short) return short.hash === hash && name.startsWith(short.prefix);
  if (candidate === hash) return true;
  const suffix = `-${hash}`;
  return candidate.endsWith(suffix) && name.startsWith(candidate.slice(0, -suffix.length));
}

/**
 * The volume name to use for CreateVolume's `name` below `parent` on `nodeId`: the name
 * itself when its id and dataset fit, else its shortened form.
 * @throws {CsiError} INVALID_ARGUMENT for names that cannot be volume names at all
 */
export function fittedVolumeName(name: string, parent: string, nodeId: string): string {
  encodeName("Volume name", name);
  const fits = (candidate: string, idBytes: number) =>
    byteLength(`${candidate}@${nodeId}`) <= idBytes &&
    byteLength(`${parent}/${encodeComponent("Volume name", candidate)}`) <= MAX_DATASET_NAME;
  if (fits(name, MAX_VOLUME_ID_BYTES)) return name;
  const short = shorten(name, (c) => fits(c, SHORTENED_VOLUME_ID_BYTES));
  if (short === undefined) {
    throw new CsiError(
      Code.INVALID_ARGUMENT,
      `Volume name "${name}" cannot be made to fit below parent dataset "${parent}"`,
    );
  }
  return short;
}

/**
 * The snapshot name to use for CreateSnapshot's `name` of volume `volumeName` (dataset
 * `dataset`) on `nodeId`: the name itself when its id and ZFS name fit, else its shortened form.
 * @throws {CsiError} INVALID_ARGUMENT for names that cannot be snapshot names, or when the
 * volume's own name leaves no room
 */
export function fittedSnapshotName(
  volumeName: string,
  dataset: string,
  name: string,
  nodeId: string,
): string {
  encodeName("Snapshot name", name);
  const fits = (candidate: string) =>
    byteLength(`${volumeName}@${candidate}@${nodeId}`) <= MAX_VOLUME_ID_BYTES &&
    byteLength(`${dataset}@${encodeComponent("Snapshot name", candidate)}`) <= MAX_DATASET_NAME;
  if (fits(name)) return name;
  const short = shorten(name, fits);
  if (short === undefined) {
    throw new CsiError(
      Code.INVALID_ARGUMENT,
      `Snapshot name "${name}" is too long for volume "${volumeName}": the volume's name ` +
        `leaves no room in a ${MAX_VOLUME_ID_BYTES}-byte snapshot id`,
    );
  }
  return short;
}
