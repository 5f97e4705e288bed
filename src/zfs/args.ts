/**
 * Pure argv builders for zfs and zpool. Each takes a small typed spec and returns the exact
 * argument list (without the program name). No shell, no joined strings.
 */

import { PLAIN_FORM, type StreamForm } from "./stream_form.ts";

/** ZFS properties to set, by name. */
export type Properties = Readonly<Record<string, string>>;

const PROPERTY_NAME = /^[a-z][a-z0-9_.:+-]*$/;

/**
 * Checks one property name and value before they reach an argv.
 * @throws {TypeError} for names outside the ZFS property syntax or values with control characters
 */
export function checkProperty(name: string, value: string): void {
  if (!PROPERTY_NAME.test(name)) throw new TypeError(`Invalid ZFS property name "${name}"`);
  // deno-lint-ignore no-control-regex
  if (/[\u0000-\u001f\u007f]/.test(value)) {
    throw new TypeError(`Value of ZFS property "${name}" contains control characters`);
  }
}

/** `-o name=value` pairs for `zfs create`, in a stable (sorted) order. */
export function propertyArgs(props: Properties): string[] {
  const out: string[] = [];
  for (const name of Object.keys(props).sort()) {
    const value = props[name]!;
    checkProperty(name, value);
    out.push("-o", `${name}=${value}`);
  }
  return out;
}

/** Machine-readable `zfs get` of some properties of some datasets. */
export function getArgs(datasets: readonly string[], props: readonly string[]): string[] {
  for (const p of props) checkProperty(p, "");
  return ["get", "-Hp", "-o", "name,property,value,source", props.join(","), ...datasets];
}

/**
 * Machine-readable `zfs get` of some properties of `root` and its descendants down to `depth`
 * (1: children; 2: children and their snapshots).
 */
export function getTreeArgs(root: string, depth: number, props: readonly string[]): string[] {
  for (const p of props) checkProperty(p, "");
  if (!Number.isInteger(depth) || depth < 1) throw new RangeError(`Invalid depth ${depth}`);
  return [
    "get",
    "-Hp",
    "-r",
    "-d",
    String(depth),
    "-o",
    "name,property,value,source",
    props.join(","),
    root,
  ];
}

/** `zfs create` of one filesystem; its parent must exist (no `-p`). */
export function createArgs(dataset: string, props: Properties = {}): string[] {
  return ["create", ...propertyArgs(props), dataset];
}

/** How a zvol is made, beyond its properties. */
export interface ZvolSpec {
  /** Its size (`volsize`) in bytes: a positive multiple of its volblocksize. */
  readonly sizeBytes: number;
  /** Thin: no refreservation (`-s`). */
  readonly sparse?: boolean;
}

/**
 * `zfs create -V` of one zvol (its parent must exist); `volblocksize` and the rest come in
 * `props`. Without `-s` zfs reserves the whole size (refreservation), as a disk would be.
 * @throws {RangeError} for a size that is not a positive whole number of bytes
 */
export function createVolumeArgs(
  dataset: string,
  spec: ZvolSpec,
  props: Properties = {},
): string[] {
  if (!Number.isSafeInteger(spec.sizeBytes) || spec.sizeBytes <= 0) {
    throw new RangeError(`Invalid zvol size ${spec.sizeBytes}`);
  }
  return [
    "create",
    "-V",
    String(spec.sizeBytes),
    ...(spec.sparse ? ["-s"] : []),
    ...propertyArgs(props),
    dataset,
  ];
}

/**
 * `zfs set volsize` of a zvol, to grow it. zfs also grows a non-sparse zvol's refreservation
 * with it when the refreservation was the whole size.
 * @throws {RangeError} for a size that is not a positive whole number of bytes
 */
export function setVolsizeArgs(dataset: string, sizeBytes: number): string[] {
  if (!Number.isSafeInteger(sizeBytes) || sizeBytes <= 0) {
    throw new RangeError(`Invalid zvol size ${sizeBytes}`);
  }
  return setArgs(dataset, "volsize", String(sizeBytes));
}

/** `zfs set` of one property (older ZFS accepts one per call). */
export function setArgs(dataset: string, name: string, value: string): string[] {
  checkProperty(name, value);
  return ["set", `${name}=${value}`, dataset];
}

/**
 * `zfs inherit` of one property: a user property set locally is removed (nothing to inherit
 * from the parent for the plugin's own marks).
 */
export function inheritArgs(dataset: string, name: string): string[] {
  checkProperty(name, "");
  return ["inherit", name, dataset];
}

/** ZFS properties to set, in the order they are to be set. */
export type PropertyList = ReadonlyArray<readonly [name: string, value: string]>;

/**
 * `zfs set` of several properties in one call, in the order given (OpenZFS; older releases
 * such as zfs-fuse take one per call and read the rest as dataset names).
 * @throws {RangeError} for an empty list or a property named twice
 * @throws {TypeError} for a name or value {@linkcode checkProperty} refuses
 */
export function setManyArgs(dataset: string, props: PropertyList): string[] {
  if (props.length === 0) throw new RangeError(`No properties to set on "${dataset}"`);
  const names = new Set<string>();
  for (const [name, value] of props) {
    checkProperty(name, value);
    if (names.has(name)) throw new RangeError(`Property "${name}" is set twice`);
    names.add(name);
  }
  return ["set", ...props.map(([name, value]) => `${name}=${value}`), dataset];
}

/** `zfs mount` of one filesystem at its own mountpoint. */
export function mountArgs(dataset: string): string[] {
  return ["mount", dataset];
}

/** `zfs snapshot` of one dataset (`snapshot` is `<dataset>@<name>`). */
export function snapshotArgs(snapshot: string): string[] {
  if (!snapshot.includes("@")) throw new TypeError(`"${snapshot}" is not a snapshot name`);
  return ["snapshot", snapshot];
}

/** `zfs clone` of a snapshot into a new filesystem, with properties set at creation. */
export function cloneArgs(snapshot: string, dataset: string, props: Properties = {}): string[] {
  if (!snapshot.includes("@")) throw new TypeError(`"${snapshot}" is not a snapshot name`);
  return ["clone", ...propertyArgs(props), snapshot, dataset];
}

/** How to destroy. */
export interface DestroyOptions {
  /** Also destroy the dataset's snapshots (`-r`); never its clones (`-R` is not offered). */
  readonly recursive?: boolean;
  /** For a snapshot: if clones depend on it, destroy it when the last one goes (`-d`). */
  readonly deferred?: boolean;
}

/** `zfs destroy` of one dataset or snapshot. No `-R`, no `-f`: clones and busy mounts stop it. */
export function destroyArgs(name: string, opts: DestroyOptions = {}): string[] {
  if (opts.deferred && !name.includes("@")) {
    throw new TypeError(`Deferred destroy applies to snapshots, not "${name}"`);
  }
  return [
    "destroy",
    ...(opts.recursive ? ["-r"] : []),
    ...(opts.deferred ? ["-d"] : []),
    name,
  ];
}

/** `zfs rename` of a dataset, or of a snapshot within its dataset. */
export function renameArgs(from: string, to: string): string[] {
  if (from.includes("@") !== to.includes("@")) {
    throw new TypeError(`Cannot rename "${from}" to "${to}": both or neither must be snapshots`);
  }
  return ["rename", from, to];
}

/**
 * `zfs rollback` of a filesystem to its newest snapshot. Never `-r`/`-R`/`-f`: zfs refuses when
 * a later snapshot exists, instead of destroying it (or its clones).
 */
export function rollbackArgs(snapshot: string): string[] {
  if (!snapshot.includes("@")) throw new TypeError(`"${snapshot}" is not a snapshot name`);
  return ["rollback", snapshot];
}

/** `zfs unmount` of one filesystem (never `-f`). */
export function unmountArgs(dataset: string): string[] {
  return ["unmount", dataset];
}

/** `zfs load-key` of an encrypted filesystem from its own keylocation (OpenZFS). */
export function loadKeyArgs(dataset: string): string[] {
  return ["load-key", dataset];
}

/** `zpool list` of the name and health of one pool. */
export function poolHealthArgs(pool: string): string[] {
  return ["list", "-H", "-o", "name,health", pool];
}

/** `zfs version` (OpenZFS 0.8 and later; zfs-fuse does not know it). */
export function versionArgs(): string[] {
  return ["version"];
}

/**
 * `zpool get all <pool>`, in the table form every zpool prints (zfs-fuse's takes no `-H`, `-p`
 * or `-o`): its version and, on OpenZFS, each `feature@` state.
 */
export function poolPropertiesArgs(pool: string): string[] {
  // A pool's name begins with a letter (and may hold spaces): never an option.
  // deno-lint-ignore no-control-regex
  if (!/^[A-Za-z][^\u0000-\u001f\u007f/@]*$/.test(pool)) {
    throw new TypeError(`"${pool}" is not a pool name`);
  }
  return ["get", "all", pool];
}

/** What `zfs send` sends. */
export interface SendSpec {
  /** The snapshot to send, `<dataset>@<name>`. */
  readonly snapshot: string;
  /**
   * An earlier snapshot of the same dataset (or, on OpenZFS, a bookmark `<dataset>#<name>`): send
   * only the changes since it (`-i`).
   */
  readonly base?: string;
  /** Send an encrypted dataset's blocks as they are on disk (`-w`, OpenZFS only). */
  readonly raw: boolean;
  /**
   * `-c` (blocks as compressed on disk), `-L` (large blocks whole), `-e` (embedded blocks as
   * such), OpenZFS only (src/zfs/stream_form.ts chooses them); none when absent.
   */
  readonly form?: StreamForm;
}

/**
 * `zfs send [-w | -c -L -e] [-i <base>] <snapshot>`, the stream on stdout.
 * @throws {TypeError} when a name is not a snapshot, the base is of another dataset, or a raw
 *   send is given a form (`-w` already sends blocks as they are on disk)
 */
export function sendArgs(spec: SendSpec): string[] {
  const { snapshot, base, form = PLAIN_FORM } = spec;
  if (!snapshot.includes("@")) throw new TypeError(`"${snapshot}" is not a snapshot name`);
  const dataset = snapshot.slice(0, snapshot.indexOf("@"));
  if (base !== undefined && !base.startsWith(`${dataset}@`) && !base.startsWith(`${dataset}#`)) {
    throw new TypeError(`Base "${base}" is not a snapshot of the dataset of "${snapshot}"`);
  }
  if (spec.raw && (form.compressed || form.largeBlocks || form.embedded)) {
    throw new TypeError(`A raw send of "${snapshot}" takes no -c, -L or -e`);
  }
  return [
    "send",
    ...(spec.raw ? ["-w"] : []),
    ...(form.compressed ? ["-c"] : []),
    ...(form.largeBlocks ? ["-L"] : []),
    ...(form.embedded ? ["-e"] : []),
    ...(base !== undefined ? ["-i", base] : []),
    snapshot,
  ];
}

/** Where a property's value comes from, as `zfs get -s` selects it. */
export type PropertySource = "local" | "received";

/**
 * Machine-readable `zfs get` of every property of the datasets and snapshots `names` whose value
 * comes from one of `sources` (`-s`): `received` is what a `zfs send -p` stream decided.
 */
export function getBySourceArgs(
  names: readonly string[],
  sources: readonly PropertySource[],
): string[] {
  if (sources.length === 0) throw new RangeError("No property source to select");
  if (names.length === 0) throw new RangeError("No dataset to read");
  return [
    "get",
    "-Hp",
    "-s",
    sources.join(","),
    "-o",
    "name,property,value,source",
    "all",
    ...names,
  ];
}

/** Machine-readable `zfs get` of every property set locally on one dataset (`-s local`). */
export function getLocalArgs(dataset: string): string[] {
  return ["get", "-Hp", "-s", "local", "-o", "name,property,value,source", "all", dataset];
}

/** How `zfs receive` lands a stream. */
export interface ReceiveOptions {
  /** Leave the received filesystem unmounted (`-u`). */
  readonly unmounted: boolean;
  /**
   * Properties the stream must not decide (`-x`, OpenZFS): their effective value after the
   * receive is inherited (or the default, for those that do not inherit), whatever the stream
   * carries. In the order given.
   */
  readonly exclude?: readonly string[];
  /** Properties set locally on the received dataset as zfs creates it (`-o`, OpenZFS). */
  readonly override?: Properties;
  /**
   * Only check the options, receive nothing (`-n`): with an empty stdin, whether this zfs takes
   * them (zfs.ts `receiveOverrides`).
   */
  readonly dryRun?: boolean;
}

/**
 * `zfs receive [-n] [-u] [-x <property>]... [-o <property>=<value>]... <target>`, the stream on
 * stdin. Never `-F`: it would roll the target back to its newest snapshot or destroy snapshots
 * missing from the stream, and a restore must never lose data that is already there; a target
 * that changed makes zfs refuse instead. Never `-s` either: a killed receive then leaves nothing
 * behind rather than a resumable partial state.
 * @throws {TypeError} for a snapshot as target, or a property name or value
 *   {@linkcode checkProperty} refuses
 * @throws {RangeError} for a property both excluded and overridden, or named twice
 */
export function receiveArgs(target: string, opts: ReceiveOptions): string[] {
  if (target.includes("@")) throw new TypeError(`Receive into a dataset, not "${target}"`);
  const named = new Set<string>();
  const once = (name: string) => {
    if (named.has(name)) throw new RangeError(`Property "${name}" is named twice on receive`);
    named.add(name);
  };
  const exclude: string[] = [];
  for (const name of opts.exclude ?? []) {
    checkProperty(name, "");
    once(name);
    exclude.push("-x", name);
  }
  const override = propertyArgs(opts.override ?? {});
  for (const name of Object.keys(opts.override ?? {})) once(name);
  return [
    "receive",
    ...(opts.dryRun ? ["-n"] : []),
    ...(opts.unmounted ? ["-u"] : []),
    ...exclude,
    ...override,
    target,
  ];
}
