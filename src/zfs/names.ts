/**
 * Volume ids and ZFS dataset names. A CSI volume id maps to exactly one child of the parent
 * dataset and back; nothing a client sends can name a dataset anywhere else.
 */

import { Code, CsiError } from "../errors.ts";

/** User property that marks a dataset as created (or adopted) by this plugin. */
export const MANAGED_PROPERTY = "org.zfs-csi:managed";
/** Value of {@linkcode MANAGED_PROPERTY} on datasets we own. */
export const MANAGED_VALUE = "yes";
/**
 * User property holding the name CreateVolume was asked for, in full (a shortened dataset name
 * keeps only a prefix of it). A repeated CreateVolume compares it with the name it is given.
 */
export const NAME_PROPERTY = "org.zfs-csi:name";
/**
 * User property a node sets, to the unix seconds of the moment, the first time it stages a
 * volume: a volume that has been in use is never handed out again by a repeated CreateVolume.
 */
export const STAGED_PROPERTY = "org.zfs-csi:staged-at";

/** ZFS refuses names of 256 bytes or more. */
export const MAX_DATASET_NAME = 255;
/** CSI asks plugins to accept ids of up to 128 bytes; we accept no more. */
export const MAX_VOLUME_ID_BYTES = 128;

/** Characters kept as they are in a dataset component; all others are escaped. */
const PLAIN = /^[A-Za-z0-9_.-]$/;
/** Characters a ZFS dataset component may hold (zfs-fuse and OpenZFS agree on this set). */
const COMPONENT = /^[A-Za-z0-9_.:-]+$/;
const encoder = new TextEncoder();

/** The length of `s` in UTF-8 bytes, as ZFS and CSI count names and ids. */
export function byteLength(s: string): number {
  return encoder.encode(s).length;
}

/**
 * Checks a dataset name given by the operator (the parent dataset).
 * @throws {TypeError} with a message that names the problem
 */
export function checkDatasetName(name: string): void {
  if (name.length === 0) throw new TypeError("Dataset name is empty");
  if (encoder.encode(name).length > MAX_DATASET_NAME) {
    throw new TypeError(`Dataset name "${name}" is longer than ${MAX_DATASET_NAME} bytes`);
  }
  const parts = name.split("/");
  for (const part of parts) {
    if (part === "" || part === "." || part === ".." || !COMPONENT.test(part)) {
      throw new TypeError(
        `Dataset name "${name}" is not valid: each "/"-separated part must be made of ` +
          `letters, digits and "_.:-"`,
      );
    }
  }
  if (!/^[A-Za-z]/.test(parts[0] ?? "")) {
    throw new TypeError(
      `Dataset name "${name}" must start with a pool name beginning with a letter`,
    );
  }
}

/** The pool a dataset lives in. */
export function poolOf(dataset: string): string {
  return dataset.split("/")[0] ?? dataset;
}

function invalid(message: string): CsiError {
  return new CsiError(Code.INVALID_ARGUMENT, message);
}

/**
 * Turns a volume id into the name of one component below the parent dataset. Letters, digits
 * and "_.-" stay; anything else is written as ":" and two hex digits per UTF-8 byte, so
 * `db[0]` becomes `db:5b0:5d`. The mapping is reversible with {@linkcode decodeComponent}.
 * @throws {CsiError} INVALID_ARGUMENT for ids that are empty, too long or could escape
 */
export function encodeVolumeId(id: string): string {
  return encodeName("Volume id", id);
}

/**
 * Separates the prefix of a shortened name from its hash (see fit.ts). No name a client sends
 * contains it ({@linkcode encodeName} refuses ".."), so a shortened name never equals one.
 */
export const SHORTENED_SEPARATOR = "..";
/** The shortened shape: a prefix, the separator, and 16 hex digits. */
const SHORTENED = /^(.+)\.\.([0-9a-f]{16})$/s;

/** The prefix and hash of a name in the shortened shape, or undefined for any other name. */
export function splitShortened(name: string): { prefix: string; hash: string } | undefined {
  const m = SHORTENED.exec(name);
  return m ? { prefix: m[1]!, hash: m[2]! } : undefined;
}

/**
 * Encodes any name given by a client (a volume id, a volume name, a snapshot name) as one
 * dataset or snapshot component, as {@linkcode encodeVolumeId} describes. `what` starts the
 * error messages. Names in the shortened shape are refused with every other name holding "..":
 * only the plugin makes them.
 * @throws {CsiError} INVALID_ARGUMENT for names that are empty, too long or could escape
 */
export function encodeName(what: string, id: string): string {
  return encodeChecked(what, id, false);
}

/**
 * Encodes a name the plugin may have made itself: anything {@linkcode encodeName} takes, and a
 * shortened name (`<prefix>..<16 hex digits>`, the prefix a valid name), whose component is the
 * encoded prefix, ".." and the hash. For ids, which carry the names the plugin answered with.
 * @throws {CsiError} INVALID_ARGUMENT as {@linkcode encodeName}
 */
export function encodeComponent(what: string, name: string): string {
  return encodeChecked(what, name, true);
}

function encodeChecked(what: string, id: string, shortened: boolean): string {
  if (id.length === 0) throw invalid(`${what} is empty`);
  if (encoder.encode(id).length > MAX_VOLUME_ID_BYTES) {
    throw invalid(`${what} is longer than ${MAX_VOLUME_ID_BYTES} bytes`);
  }
  // deno-lint-ignore no-control-regex
  if (/[\u0000-\u001f\u007f]/.test(id)) {
    throw invalid(`${what} ${JSON.stringify(id)} contains control characters`);
  }
  for (const bad of ["/", "@", "%"]) {
    if (id.includes(bad)) throw invalid(`${what} "${id}" must not contain "${bad}"`);
  }
  const short = shortened ? splitShortened(id) : undefined;
  const body = short ? short.prefix : id;
  if (body.includes("..")) throw invalid(`${what} "${id}" must not contain ".."`);
  let out = "";
  let first = true;
  for (const ch of body) {
    // A leading "." is escaped too, so names beginning with "." stay free for our own use.
    if (PLAIN.test(ch) && !(first && ch === ".")) {
      out += ch;
    } else {
      for (const byte of encoder.encode(ch)) out += ":" + byte.toString(16).padStart(2, "0");
    }
    first = false;
  }
  return short ? `${out}${SHORTENED_SEPARATOR}${short.hash}` : out;
}

/**
 * Reverses {@linkcode encodeComponent} (and so {@linkcode encodeVolumeId}). Returns undefined
 * for a component that no id encodes to (so foreign datasets are never mistaken for volumes).
 */
export function decodeComponent(component: string): string | undefined {
  if (!COMPONENT.test(component)) return undefined;
  const bytes: number[] = [];
  for (let i = 0; i < component.length;) {
    const ch = component[i]!;
    if (ch === ":") {
      const hex = component.slice(i + 1, i + 3);
      if (!/^[0-9a-f]{2}$/.test(hex)) return undefined;
      bytes.push(parseInt(hex, 16));
      i += 3;
    } else {
      bytes.push(ch.charCodeAt(0));
      i += 1;
    }
  }
  let id: string;
  try {
    id = new TextDecoder("utf-8", { fatal: true }).decode(new Uint8Array(bytes));
  } catch {
    return undefined;
  }
  try {
    return encodeComponent("Volume id", id) === component ? id : undefined;
  } catch {
    return undefined;
  }
}

/**
 * The dataset that holds volume `id` below `parent`. An id that already is the full name of
 * a direct child of `parent` (as an operator may register with `external_id`) names that child.
 * @throws {CsiError} INVALID_ARGUMENT for ids that cannot name a child of `parent`
 */
export function datasetForVolume(parent: string, id: string): string {
  const prefix = parent + "/";
  if (id.startsWith(prefix) && byteLength(id) <= MAX_VOLUME_ID_BYTES) {
    const rest = id.slice(prefix.length);
    if (decodeComponent(rest) !== undefined) return id;
  }
  return childDataset(parent, "Volume id", id);
}

/**
 * The child of `parent` that `name` encodes to (see {@linkcode encodeComponent}: shortened
 * names too); `what` starts the error messages. Unlike {@linkcode datasetForVolume}, a full dataset name is no alias here.
 * @throws {CsiError} INVALID_ARGUMENT for names that cannot be encoded or would be too long
 */
export function childDataset(parent: string, what: string, name: string): string {
  const dataset = `${parent}/${encodeComponent(what, name)}`;
  if (byteLength(dataset) > MAX_DATASET_NAME) {
    throw invalid(
      `${what} "${name}" is too long: dataset "${dataset}" would exceed ${MAX_DATASET_NAME} bytes`,
    );
  }
  return dataset;
}

/** The volume id of a direct child of `parent`, or undefined for anything else. */
export function volumeForDataset(parent: string, dataset: string): string | undefined {
  const prefix = parent + "/";
  if (!dataset.startsWith(prefix)) return undefined;
  return decodeComponent(dataset.slice(prefix.length));
}

/** Prefix of datasets and snapshots set aside by a delete; they are kept for the retention. */
export const DELETED_PREFIX = ".deleted-";
/**
 * User property set locally on what a delete set aside: when, in unix seconds by the wall clock
 * of the plugin that set it aside. The purge destroys nothing without it (a hidden name alone
 * is not enough), and reads the time from here, never from the name.
 */
export const DELETED_AT_PROPERTY = "org.zfs-csi:deleted-at";
/**
 * User property set locally on what a delete set aside: its full name before (`<parent>/<name>`
 * or `<dataset>@<name>`). The hidden name may be cut to fit ZFS's limit; this is the way back.
 */
export const DELETED_NAME_PROPERTY = "org.zfs-csi:deleted-name";
/** Prefix of the hidden snapshot a volume is cloned from when its source is another volume. */
export const CLONE_PREFIX = ".clone-";

/**
 * Prefix of the local snapshot a CSI snapshot kept in the store is taken as:
 * `<dataset>@.stored-<encoded snapshot name>`. Hidden, the plugin's own: the stored copy is
 * what the snapshot's id names.
 */
export const STORED_PREFIX = ".stored-";

/**
 * The component a deleted dataset or snapshot is renamed to: `.deleted-<unix seconds>-<old>`,
 * cut to `maxBytes` (the full old name is kept in {@linkcode DELETED_NAME_PROPERTY}). It starts
 * with "." so no volume or snapshot id ever maps to it.
 */
export function deletedComponent(component: string, atSeconds: number, maxBytes: number): string {
  const name = `${DELETED_PREFIX}${Math.floor(atSeconds)}-${component}`;
  // Encoded components are ASCII, so characters are bytes.
  return name.slice(0, Math.max(maxBytes, DELETED_PREFIX.length + 12));
}

/**
 * Whether a component has the form {@linkcode deletedComponent} writes. The name says only where
 * to look: what was set aside carries {@linkcode DELETED_AT_PROPERTY}, and the time is read there.
 */
export function isDeletedComponent(component: string): boolean {
  return /^\.deleted-\d{1,12}-/.test(component);
}

/**
 * Reads a {@linkcode DELETED_AT_PROPERTY} value: unix seconds as plain digits, else undefined.
 */
export function parseDeletedAt(value: string): number | undefined {
  return /^\d{1,12}$/.test(value) ? Number(value) : undefined;
}

/**
 * The hidden snapshot of a source volume that `target` is cloned from at `atSeconds`:
 * `.clone-<hash of target>-<unix seconds>`. The time keeps a later clone to the same name from
 * reusing an older snapshot; the hash says which clone it was made for.
 */
export function cloneSnapshotComponent(target: string, atSeconds: number): string {
  // FNV-1a, 64 bit: short, stable, and no async crypto needed for a name.
  let h = 0xcbf29ce484222325n;
  for (const byte of encoder.encode(target)) {
    h ^= BigInt(byte);
    h = (h * 0x100000001b3n) & 0xffffffffffffffffn;
  }
  return `${CLONE_PREFIX}${h.toString(16).padStart(16, "0")}-${Math.floor(atSeconds)}`;
}
