/**
 * What a received stream may decide about the dataset it lands in: nothing. The plugin's own
 * sends carry no properties (no `-p`, no `-R`), so a stored stream that does was made by someone
 * else who could write the store, and every property it carries would otherwise take effect
 * where it was not set locally: a `mountpoint` under a host path, `setuid`/`devices`/`exec`, a
 * `keylocation` to load a key from, a share, a reservation of the whole pool, the plugin's own
 * `org.zfs-csi:*` markers (the plugin sets those itself, after the receive), or another tool's
 * user property that makes it act on the dataset (snapshots, systemd mount units).
 *
 * Two layers, so the rule holds on any zfs:
 * - where `zfs receive` takes `-x` (OpenZFS; learnt once per Zfs by a dry run, zfs.ts
 *   `receiveOverrides`), the properties below are excluded as the stream lands: not even a
 *   reboot between the receive and the check mounts the dataset where the stream says;
 * - after every receive, on any zfs (zfs-fuse has no `-x`), no property of the dataset or its
 *   snapshots may have source `received` any more, except one its caller sets locally before
 *   the dataset is used (a local value wins). Otherwise the result is refused (ReplicateError
 *   "properties", answered DATA_LOSS) before it is renamed into place or used, and what the
 *   stream set is overridden (`zfs inherit`) whatever becomes of the dataset.
 *
 * One more effect of such a stream, on OpenZFS as on zfs-fuse and whatever `-x` says: the first
 * stream with properties that an existing dataset receives clears all its local properties (the
 * plugin's markers, `readonly`, `canmount`, the size and the volume's parameters). A receive into
 * an existing copy reads them first and sets them back (receive.ts), refused or not.
 *
 * The check is of what takes effect, not of what the stream holds: a stream whose properties
 * were all overridden, by `-x` or on a copy by an earlier refusal of the same values (zfs keeps
 * received values only on record, and a copy's explicit `inherit` stays), decides nothing and is
 * received like any stream. Its data is the store's, as every stored stream's is.
 */

import type { Logger } from "../log.ts";
import type { SnapshotManifest } from "../store/layout.ts";
import type { PropertyMap } from "../zfs/parse.ts";
import type { Zfs } from "../zfs/zfs.ts";
import { ZfsError } from "../errors.ts";
import { ReplicateError } from "../replicate_errors.ts";

/**
 * The user property a restore marks its temporary dataset with as zfs creates it (restore.ts),
 * with a value that is new for each restore: proof that the dataset is that restore's own.
 */
export const RESTORE_TOKEN_PROPERTY = "org.zfs-csi:restore-token";

/**
 * The plugin's own markers (the `org.zfs-csi:` user properties it sets and reads). A test keeps
 * this list and the constants in src/ the same.
 */
export const OWN_PROPERTIES: readonly string[] = [
  "org.zfs-csi:backup-interval",
  "org.zfs-csi:backup-keep",
  "org.zfs-csi:attached",
  "org.zfs-csi:backup-last",
  "org.zfs-csi:deleted-at",
  "org.zfs-csi:deleted-name",
  "org.zfs-csi:deleted-refreservation",
  "org.zfs-csi:follow-generation",
  "org.zfs-csi:follow-released",
  "org.zfs-csi:follow-suspended",
  "org.zfs-csi:format",
  "org.zfs-csi:fs-type",
  "org.zfs-csi:host-namespace",
  "org.zfs-csi:host-volume-id",
  "org.zfs-csi:managed",
  "org.zfs-csi:name",
  "org.zfs-csi:parameters",
  RESTORE_TOKEN_PROPERTY,
  "org.zfs-csi:source",
  "org.zfs-csi:staged-at",
  "org.zfs-csi:store-uid",
  "org.zfs-csi:verify",
];

/**
 * User properties of other tools that make them act on a dataset that carries them: snapshot
 * schedulers (zfs-auto-snapshot and its kin) and OpenZFS's systemd mount generator. Any other
 * user property a stream carries is refused by the check after the receive.
 */
export const OTHER_TOOLS_PROPERTIES: readonly string[] = [
  "com.sun:auto-snapshot",
  "com.sun:auto-snapshot:frequent",
  "com.sun:auto-snapshot:hourly",
  "com.sun:auto-snapshot:daily",
  "com.sun:auto-snapshot:weekly",
  "com.sun:auto-snapshot:monthly",
  "org.openzfs.systemd:ignore",
  "org.openzfs.systemd:requires",
  "org.openzfs.systemd:requires-mounts-for",
  "org.openzfs.systemd:before",
  "org.openzfs.systemd:after",
  "org.openzfs.systemd:wanted-by",
  "org.openzfs.systemd:required-by",
  "org.openzfs.systemd:nofail",
];

/**
 * Native filesystem properties a stream must not decide: where and how the dataset is mounted
 * and shared, what it may hold and expose, the space it takes, and how its data is written (the
 * operator's parameter policy decides those). The names this zfs does not know are left out of
 * `-x` (zfs.ts `knownProperties`); the check after the receive covers everything anyway.
 */
export const NATIVE_PROPERTIES: readonly string[] = [
  "mountpoint",
  "canmount",
  "overlay",
  "zoned",
  "setuid",
  "devices",
  "exec",
  "readonly",
  "nbmand",
  "xattr",
  "acltype",
  "aclinherit",
  "aclmode",
  "context",
  "fscontext",
  "defcontext",
  "rootcontext",
  "snapdir",
  "sharenfs",
  "sharesmb",
  "vscan",
  "atime",
  "relatime",
  "quota",
  "refquota",
  "reservation",
  "refreservation",
  "filesystem_limit",
  "snapshot_limit",
  "compression",
  "checksum",
  "dedup",
  "copies",
  "recordsize",
  "sync",
  "logbias",
  "primarycache",
  "secondarycache",
  "redundant_metadata",
  "dnodesize",
  "special_small_blocks",
];

/**
 * The key properties of an encrypted dataset. Excluded from plain streams only: OpenZFS refuses
 * to set or exclude them for a raw stream, whose encryption comes with it; the restore of a raw
 * stream sets `keylocation` locally (the operator's, checked by the parameter policy), which then
 * wins over whatever the stream carries, and the check after it sees that.
 */
export const KEY_PROPERTIES: readonly string[] = ["keylocation", "keyformat", "pbkdf2iters"];

/**
 * The native properties of {@linkcode NATIVE_PROPERTIES} that apply to a zvol, and the two
 * only a zvol has (`volmode=none` would hide its device, `snapdev=visible` show its snapshots'
 * devices). Separate lists because OpenZFS refuses a whole (non-recursive) receive whose `-x`
 * names a property that does not apply to the stream's type ("property 'mountpoint' does not
 * apply to datasets of this type", libzfs_sendrecv.c zfs_setup_cmdline_props).
 */
export const ZVOL_NATIVE_PROPERTIES: readonly string[] = [
  "readonly",
  "reservation",
  "refreservation",
  "snapshot_limit",
  "compression",
  "checksum",
  "dedup",
  "copies",
  "sync",
  "logbias",
  "primarycache",
  "secondarycache",
  "redundant_metadata",
  "volmode",
  "snapdev",
];

/**
 * What a received zvol may show as `received` legitimately: its size and block size are the
 * shape of its data (zfs reports what the stream made), checked against the manifest by the
 * restore (restore.ts), not a decision about how the node treats the volume.
 */
export const ZVOL_SHAPE_PROPERTIES: ReadonlySet<string> = new Set(["volsize", "volblocksize"]);

/**
 * Every property a stream of this kind (raw or not; of a zvol or a dataset) is told to leave
 * alone with `-x`.
 */
export function excludedOnReceive(raw: boolean, zvol = false): string[] {
  return [
    ...(zvol ? ZVOL_NATIVE_PROPERTIES : NATIVE_PROPERTIES),
    ...(raw ? [] : KEY_PROPERTIES),
    ...OWN_PROPERTIES,
    ...OTHER_TOOLS_PROPERTIES,
  ];
}

/**
 * The `-x` list for a receive into `target` of a stream of this kind, or undefined when this zfs
 * takes no `-x` (then only the check after the receive holds the rule).
 * @throws {ZfsError} when zfs cannot be asked
 */
export async function receiveExclusions(
  zfs: Zfs,
  target: string,
  raw: boolean,
  zvol = false,
): Promise<readonly string[] | undefined> {
  if (!(await zfs.receiveOverrides(target))) return undefined;
  const parent = target.slice(0, Math.max(0, target.lastIndexOf("/")));
  return await zfs.knownProperties(parent || target, excludedOnReceive(raw, zvol));
}

/** One property a stream decided, on the dataset or snapshot `name`. */
export interface ReceivedProperty {
  readonly name: string;
  readonly property: string;
  readonly value: string;
}

/** At most this many properties are named in a refusal (the log has them all). */
const NAMED = 8;

/**
 * The refusal of what a receive from `manifest` left decided by the stream.
 * @param what what becomes of the received dataset, for the message (whole sentences)
 */
export function receivedPropertiesError(
  manifest: SnapshotManifest,
  store: string,
  found: readonly ReceivedProperty[],
  what: string,
): ReplicateError {
  const named = found.slice(0, NAMED).map((p) =>
    `${p.property}=${JSON.stringify(p.value.slice(0, 80))} on "${p.name}"`
  );
  const more = found.length > NAMED ? ` and ${found.length - NAMED} more` : "";
  return new ReplicateError(
    "properties",
    `Stored stream "${manifest.stream}" of snapshot "${manifest.snapshot}" of volume ` +
      `"${manifest.volume}" in ${store} carries properties that would decide what the plugin ` +
      `and the operator decide: ${named.join(", ")}${more}. The plugin never stores a stream ` +
      `with properties (its sends have no -p): someone else wrote this one into the store. ` +
      `${what} Replace the store's copy (or restore another snapshot)`,
  );
}

/** What {@linkcode checkStreamProperties} checks. */
export interface StreamPropertiesCheck {
  readonly manifest: SnapshotManifest;
  /** The store's description, for the message. */
  readonly store: string;
  /** The dataset the stream was received into (the snapshot it made is checked too). */
  readonly dataset: string;
  /** Properties the caller sets locally itself before the dataset is used (they win). */
  readonly settles: ReadonlySet<string>;
  /**
   * For a receive into an existing dataset: its local properties as read before the receive.
   * The first stream with properties that a dataset receives makes zfs clear every local
   * property of it (the plugin's markers, `readonly`, `canmount`, the volume's size and
   * parameters), on OpenZFS as on zfs-fuse and whatever `-x` says: they are set back.
   */
  readonly localBefore?: PropertyMap;
  /** Undoes the receive after a refusal (receive.ts), saying what it did for the message. */
  readonly undo?: () => Promise<string>;
}

/**
 * After a receive: sets back the local properties the stream cleared (`localBefore`), then
 * refuses what the stream decided, i.e. any property of the dataset or of the snapshot the
 * receive made with source `received`, except those the caller settles. What it finds is logged in full,
 * overridden where zfs allows ({@linkcode overrideReceived}), so that nothing it decided takes
 * effect whatever becomes of the dataset, and the receive undone (`undo`). A stream whose
 * properties were all overridden before (by `-x`, or on this dataset by an earlier refusal of
 * the same values) decides nothing, and passes.
 * @throws {ReplicateError} properties, naming them and the stream
 * @throws {ZfsError} when zfs cannot be asked
 */
export async function checkStreamProperties(
  zfs: Zfs,
  log: Logger,
  check: StreamPropertiesCheck,
): Promise<void> {
  const { dataset, localBefore } = check;
  // The dataset and the snapshot this receive made: earlier snapshots were checked when they
  // were received (zfs-fuse reads all properties of every snapshot a recursive get lists).
  const found = await zfs.propertiesFrom(
    [dataset, `${dataset}@${check.manifest.snapshot}`],
    localBefore ? ["local", "received"] : ["received"],
  );
  const local = new Map(
    [...found.get(dataset) ?? []].filter(([, v]) => v.source === "local"),
  );
  const setBack = localBefore
    ? await setBackLocal(zfs, dataset, localBefore, local, log)
    : new Set<string>();
  const decided: ReceivedProperty[] = [];
  const shape = check.manifest.zvol ? ZVOL_SHAPE_PROPERTIES : new Set<string>();
  for (const [name, props] of found) {
    for (const [property, v] of props) {
      if (!v.source.startsWith("received")) continue;
      if (shape.has(property)) continue;
      if (name === dataset && (check.settles.has(property) || setBack.has(property))) continue;
      decided.push({ name, property, value: v.value });
    }
  }
  if (decided.length === 0) return;
  log.warn("a stored stream decided properties: refused", {
    dataset,
    key: check.manifest.stream,
    received: decided.map((p) => `${p.name} ${p.property}=${p.value}`),
  });
  await overrideReceived(zfs, decided, log);
  const undone = check.undo ? ` ${await check.undo()}.` : "";
  throw receivedPropertiesError(
    check.manifest,
    check.store,
    decided,
    `Nothing received from it is used (what it set is overridden where zfs allows).${undone}`,
  );
}

/**
 * Sets back the local properties `before` that a receive cleared on `dataset` (`now`: its
 * local properties after the receive).
 * @returns the names set back
 */
async function setBackLocal(
  zfs: Zfs,
  dataset: string,
  before: PropertyMap,
  now: PropertyMap,
  log: Logger,
): Promise<Set<string>> {
  const setBack = new Set<string>();
  for (const [name, v] of before) {
    // Only what the receive cleared: a receive never changes a local value (a received value
    // is kept apart, and the local one wins), so one that changed was set by someone meanwhile.
    if (now.has(name)) continue;
    try {
      await zfs.set(dataset, name, v.value);
      setBack.add(name);
    } catch (err) {
      if (!(err instanceof ZfsError)) throw err;
      log.warn("a local property the receive cleared could not be set back", {
        dataset,
        property: name,
        value: v.value,
        error: err,
      });
    }
  }
  if (setBack.size > 0) {
    log.warn("a received stream cleared local properties: set back", {
      dataset,
      properties: [...setBack],
    });
  }
  return setBack;
}

/**
 * Makes the properties a stream decided on an existing copy ineffective, as `-x` would have
 * (`zfs inherit`: the inherited value or the default wins, the received one stays only on
 * record), where zfs can; what it cannot (a property that does not inherit, such as `canmount`)
 * is logged. For a copy that is not the plugin's to destroy and is refused all the same.
 */
export async function overrideReceived(
  zfs: Zfs,
  found: readonly ReceivedProperty[],
  log: Logger,
): Promise<void> {
  for (const p of found) {
    try {
      await zfs.inherit(p.name, p.property);
    } catch (err) {
      if (!(err instanceof ZfsError)) throw err;
      log.warn("a received property could not be overridden", {
        dataset: p.name,
        property: p.property,
        value: p.value,
        error: err,
      });
    }
  }
}
