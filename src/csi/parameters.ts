/**
 * CreateVolume parameters: ZFS properties from an allowlist, plus user properties. Nothing
 * else reaches zfs: an unknown key is INVALID_ARGUMENT, so a typo never creates a volume that
 * silently lacks what was asked for, and no request can set a mountpoint or a share. On top of
 * that, the operator's {@linkcode ParameterPolicy} says which of them volume creators may use;
 * by default nothing that loosens what the parent sets for the host or costs the whole pool.
 */

import { Code, CsiError } from "../errors.ts";
import { parseSize } from "../size.ts";
import { checkProperty } from "../zfs/args.ts";
import { MANAGED_PROPERTY } from "../zfs/names.ts";
import type { KeepPolicy } from "../store/layout.ts";
import { parseInterval, parseKeepPolicy } from "../store/policy.ts";

/** How a parameter is checked. */
export interface ParameterRule {
  /** Values accepted (checked case-sensitively, as zfs does); omitted: zfs checks the value. */
  readonly values?: RegExp;
  /** Only OpenZFS knows it; zfs-fuse and old releases refuse it. */
  readonly openzfsOnly?: boolean;
  /** Changing it later would not affect existing data (or zfs refuses to). */
  readonly createOnly?: boolean;
}

const ON_OFF = /^(on|off)$/;
const SIZE = /^\d+(\.\d+)?[KMGTP]?i?B?$|^\d+$/i;

/** The ZFS properties a volume may be created with. */
export const ZFS_PARAMETERS: Readonly<Record<string, ParameterRule>> = {
  aclinherit: { values: /^(discard|noallow|restricted|passthrough|passthrough-x)$/ },
  acltype: { values: /^(off|noacl|nfsv4|posix|posixacl)$/, openzfsOnly: true },
  atime: { values: ON_OFF },
  casesensitivity: { values: /^(sensitive|insensitive|mixed)$/, createOnly: true },
  checksum: { values: /^(on|off|fletcher2|fletcher4|sha256|noparity|sha512|skein|edonr|blake3)$/ },
  compression: {
    values: /^(on|off|lzjb|gzip|gzip-[1-9]|zle|lz4|zstd|zstd-\d{1,2}|zstd-fast(-\d+)?)$/,
  },
  copies: { values: /^[123]$/ },
  dedup: {
    values:
      /^(on|off|verify|sha256(,verify)?|sha512(,verify)?|skein(,verify)?|edonr,verify|blake3(,verify)?)$/,
  },
  devices: { values: ON_OFF },
  dnodesize: { values: /^(legacy|auto|1k|2k|4k|8k|16k)$/, openzfsOnly: true },
  encryption: {
    values: /^(on|off|aes-128-ccm|aes-192-ccm|aes-256-ccm|aes-128-gcm|aes-192-gcm|aes-256-gcm)$/,
    openzfsOnly: true,
    createOnly: true,
  },
  exec: { values: ON_OFF },
  keyformat: { values: /^(raw|hex|passphrase)$/, openzfsOnly: true, createOnly: true },
  // The plugin has no terminal: keys must come from a file or a URL, never a prompt.
  keylocation: { values: /^(file:\/\/\/[^,]+|https?:\/\/[^,]+)$/, openzfsOnly: true },
  logbias: { values: /^(latency|throughput)$/ },
  normalization: { values: /^(none|formC|formD|formKC|formKD)$/, createOnly: true },
  pbkdf2iters: { values: /^\d+$/, openzfsOnly: true, createOnly: true },
  primarycache: { values: /^(all|none|metadata)$/ },
  recordsize: { values: SIZE },
  redundant_metadata: { values: /^(all|most|some|none)$/, openzfsOnly: true },
  relatime: { values: ON_OFF, openzfsOnly: true },
  secondarycache: { values: /^(all|none|metadata)$/ },
  setuid: { values: ON_OFF },
  snapdir: { values: /^(hidden|visible|disabled)$/ },
  special_small_blocks: { values: SIZE, openzfsOnly: true },
  sync: { values: /^(standard|always|disabled)$/ },
  utf8only: { values: ON_OFF, createOnly: true },
  xattr: { values: /^(on|off|sa|dir)$/ },
};

/**
 * Parameters the plugin interprets itself. Both are ZFS properties whose value may also be
 * `capacity`, meaning "the volume's capacity", which then follows the volume when it grows.
 */
export const SIZE_PARAMETERS = {
  /** Bounds the volume's data plus its snapshots; at least the capacity. */
  quota: "quota",
  /** Space guaranteed to the volume (thick provisioning); at most the capacity. */
  refreservation: "refreservation",
} as const;

/**
 * Parameters of the volume's backups to the store (the plugin's `--store`), which the plugin
 * records on the dataset for its backup scheduler.
 */
export const BACKUP_PARAMETERS = {
  /** How often: a duration such as 15m or 1h; 0 turns scheduled backups off for the volume. */
  interval: "backup_interval",
  /** What to keep, e.g. `last=4,hourly=24,daily=14` (src/store/policy.ts). */
  keep: "backup_keep",
} as const;

/** The backup parameters of a volume, as given. */
export interface BackupSettings {
  /** Seconds between scheduled backups (0: none); absent: the plugin's default. */
  readonly intervalSeconds?: number;
  readonly keep?: KeepPolicy;
}

/** A size parameter: the volume's capacity, or a fixed number of bytes. */
export type SizeSetting = { readonly kind: "capacity" } | {
  readonly kind: "bytes";
  readonly bytes: number;
};

/** Checked CreateVolume parameters. */
export interface VolumeParameters {
  /** ZFS and user properties to set at creation, by name. */
  readonly properties: Readonly<Record<string, string>>;
  /** The `quota` parameter, which the plugin sets itself. */
  readonly quota?: SizeSetting;
  /** The `refreservation` parameter, which the plugin sets itself. */
  readonly refreservation?: SizeSetting;
  /** The backup parameters, when any was given. */
  readonly backup?: BackupSettings;
  /** Names among `properties` that only OpenZFS knows. */
  readonly openzfsOnly: readonly string[];
  /** The parameters in a canonical form, stored on the dataset to recognise a repeat. */
  readonly canonical: string;
}

/** User properties: `module:name`, as ZFS defines them. Our own namespace is off limits. */
const USER_PROPERTY = /^[a-z0-9_.+-]+:[a-z0-9_.:+-]+$/;
/** The module of a user property, as a `--allow-parameter`/`--deny-parameter` pattern names it. */
const MODULE = /^[a-z0-9_.+-]+$/;
const OWN_MODULE = MANAGED_PROPERTY.split(":")[0]!;
const MAX_VALUE_BYTES = 1024;

function invalid(message: string): CsiError {
  return new CsiError(Code.INVALID_ARGUMENT, message);
}

function sizeSetting(key: string, value: string): SizeSetting {
  if (value === "capacity") return { kind: "capacity" };
  try {
    return { kind: "bytes", bytes: parseSize(value) };
  } catch {
    throw invalid(`Parameter ${key}="${value}" must be a size such as 20GiB, or "capacity"`);
  }
}

/** Whether `key` is a parameter this plugin accepts (for ValidateVolumeCapabilities too). */
export function isKnownParameter(key: string): boolean {
  // Own keys only: `in` would also find "constructor" and the other Object.prototype names.
  return Object.hasOwn(ZFS_PARAMETERS, key) || Object.hasOwn(SIZE_PARAMETERS, key) ||
    key === BACKUP_PARAMETERS.interval || key === BACKUP_PARAMETERS.keep ||
    (USER_PROPERTY.test(key) && !key.startsWith(OWN_MODULE + ":"));
}

/**
 * Checks the form of one value of a known parameter: what zfs would accept, nothing about
 * whether volume creators may use it.
 * @throws {CsiError} INVALID_ARGUMENT naming the key and value
 */
function checkValue(key: string, value: string): void {
  if (value === "" || new TextEncoder().encode(value).length > MAX_VALUE_BYTES) {
    throw invalid(`Parameter "${key}" must have a value of 1 to ${MAX_VALUE_BYTES} bytes`);
  }
  try {
    checkProperty(key, value);
  } catch (err) {
    throw invalid(`Parameter "${key}": ${(err as Error).message}`);
  }
  if (Object.hasOwn(SIZE_PARAMETERS, key)) {
    sizeSetting(key, value);
    return;
  }
  if (key === BACKUP_PARAMETERS.interval || key === BACKUP_PARAMETERS.keep) {
    try {
      if (key === BACKUP_PARAMETERS.interval) parseInterval(value);
      else parseKeepPolicy(value);
    } catch (err) {
      throw invalid(`Parameter ${key}="${value}": ${(err as Error).message}`);
    }
    return;
  }
  const rule = Object.hasOwn(ZFS_PARAMETERS, key) ? ZFS_PARAMETERS[key] : undefined;
  if (rule?.values && !rule.values.test(value)) {
    throw invalid(`Parameter ${key}="${value}" is not a value zfs accepts for ${key}`);
  }
}

// ---------------------------------------------------------------------------------------------
// The operator's policy: which parameters and values volume creators may use

/** What the operator said about the parameters a name pattern covers. */
export type OperatorRule =
  | { readonly kind: "deny" }
  | {
    readonly kind: "allow";
    /** The values accepted as written, or "any" for every value zfs accepts. */
    readonly values: "any" | readonly string[];
  };

/**
 * Which parameters and values volume creators may use: the operator's rules on top of the
 * defaults ({@linkcode DEFAULT_LIMITS}, {@linkcode DEFAULT_DENIED_MODULES}). Plain frozen data,
 * resolved once at start-up by {@linkcode resolveParameterPolicy}.
 */
export interface ParameterPolicy {
  /**
   * The operator's rules by name pattern: a parameter name, `module:*` (every user property of
   * that module) or `*` (everything). The most specific pattern that covers a name decides.
   */
  readonly rules: Readonly<Record<string, OperatorRule>>;
  /** keylocation may name files strictly below this directory; undefined: none. */
  readonly keyDir: string | undefined;
}

/** A default limit on the values of one parameter, which `--allow-parameter` replaces. */
export interface DefaultLimit {
  /** Whether volume creators may use `value` (one zfs accepts) by default. */
  readonly accepts: (value: string) => boolean;
  /** What is accepted, for the message, e.g. `only "off"`. */
  readonly accepted: string;
  /** Why the other values are refused. */
  readonly why: string;
}

function onlyValue(value: string, why: string): DefaultLimit {
  return { accepts: (v) => v === value, accepted: `only "${value}"`, why };
}

/** Most PBKDF2 iterations a passphrase key may ask for by default. */
export const MAX_DEFAULT_PBKDF2_ITERS = 10_000_000;

/**
 * Values volume creators may use when the operator says nothing else: none that loosens what
 * the operator set on the parent for the host, or that costs the whole pool. keylocation has its
 * own default (files below --key-dir only), and other parameters take any value zfs accepts.
 */
export const DEFAULT_LIMITS: Readonly<Record<string, DefaultLimit>> = {
  setuid: onlyValue(
    "off",
    "on would let setuid programs and file capabilities written in a container run for host " +
      "users from the dataset's own mount, even where the parent turned it off",
  ),
  devices: onlyValue(
    "off",
    "on would let device nodes created in a container open host devices through the " +
      "dataset's own mount, even where the parent turned it off",
  ),
  exec: onlyValue(
    "off",
    "on would let host users run programs written in a container from the dataset's own " +
      "mount, even where the parent turned it off",
  ),
  dedup: onlyValue(
    "off",
    "the dedup table costs memory and I/O of the whole pool",
  ),
  special_small_blocks: onlyValue(
    "0",
    "it moves data onto the special vdev, small fast storage that holds every dataset's metadata",
  ),
  snapdir: {
    accepts: (v) => v !== "visible",
    accepted: `"hidden" or "disabled"`,
    why: "visible would make host tools that walk the tree (backups, updatedb, du) descend " +
      "into, and mount, every snapshot",
  },
  pbkdf2iters: {
    accepts: (v) => Number(v) <= MAX_DEFAULT_PBKDF2_ITERS,
    accepted: `at most ${MAX_DEFAULT_PBKDF2_ITERS}`,
    why: "every key load would hold a CPU for seconds to minutes",
  },
};

/**
 * Modules of user properties that tools on the host act on, refused unless the operator allows
 * them: a volume creator could otherwise make those tools act for them.
 */
export const DEFAULT_DENIED_MODULES: Readonly<Record<string, string>> = {
  "com.sun": "zfs-auto-snapshot takes and keeps snapshots of datasets that set " +
    "com.sun:auto-snapshot, at the pool's cost",
  "org.openzfs.systemd": "zfs-mount-generator turns these into systemd dependencies of the " +
    "host's boot (Requires=, WantedBy=, Before=)",
  "com.ubuntu.zsys": "zsys manages system and user datasets by these properties",
  "org.zfsbootmenu": "ZFSBootMenu reads its boot settings from these properties",
};

/** No operator rules: the defaults alone. */
export const DEFAULT_PARAMETER_POLICY: ParameterPolicy = Object.freeze({
  rules: Object.freeze({}),
  keyDir: undefined,
});

/**
 * Every parameter and value zfs accepts: for reading back the parameters recorded on a volume,
 * which were judged when it was made (by the policy of that time).
 */
export const UNRESTRICTED_POLICY: ParameterPolicy = Object.freeze({
  rules: Object.freeze({ "*": Object.freeze({ kind: "allow" as const, values: "any" as const }) }),
  keyDir: undefined,
});

function moduleOf(key: string): string | undefined {
  return USER_PROPERTY.test(key) ? key.slice(0, key.indexOf(":")) : undefined;
}

/** The operator's rule for `key` and the pattern it was given for, most specific first. */
function ruleFor(
  policy: ParameterPolicy,
  key: string,
): { readonly pattern: string; readonly rule: OperatorRule } | undefined {
  const module = moduleOf(key);
  const patterns = [key, ...(module === undefined ? [] : [`${module}:*`]), "*"];
  for (const pattern of patterns) {
    if (Object.hasOwn(policy.rules, pattern)) return { pattern, rule: policy.rules[pattern]! };
  }
  return undefined;
}

/**
 * Whether a keylocation names a file strictly below `keyDir`. A path with a `.` or `..`
 * component is never below it: the kernel resolves `..` after following symlinks, so the text
 * alone cannot tell where it leads. `//` is read as `/`, as the kernel does. `%` is refused in
 * case a zfs release ever decodes URIs.
 */
export function isKeyFileBelow(keylocation: string, keyDir: string): boolean {
  const m = /^file:\/\/(\/[^%]*)$/.exec(keylocation);
  if (!m || m[1]!.endsWith("/")) return false;
  const parts = m[1]!.split("/").filter((p) => p !== "");
  if (parts.some((p) => p === "." || p === "..")) return false;
  return ("/" + parts.join("/")).startsWith(keyDir + "/");
}

const quoted = (values: readonly string[]) => values.map((v) => `"${v}"`).join(", ");

/**
 * Why the policy refuses `key`=`value` (a known key, a well-formed value), or undefined when
 * volume creators may use it. Each refusal names the parameter, the value and the flag that
 * would allow it.
 */
function policyRefusal(policy: ParameterPolicy, key: string, value: string): string | undefined {
  if (key === "keylocation" && policy.keyDir && isKeyFileBelow(value, policy.keyDir)) {
    return undefined;
  }
  const head = `Parameter ${key}="${value}" is not allowed on this node`;
  // A value with "|" cannot be listed in the flag: only NAME=* would allow it.
  const allowIt = `the operator can allow it with --allow-parameter ${key}=${
    value.includes("|") ? "*" : value
  }`;
  const given = ruleFor(policy, key);
  if (given?.rule.kind === "deny") {
    return given.pattern === key
      ? `${head}: the operator refuses it (--deny-parameter ${key})`
      : `${head}: the operator refuses it (--deny-parameter ${given.pattern}); ${allowIt}`;
  }
  if (given) {
    const values = given.rule.values;
    if (values === "any" || values.includes(value)) return undefined;
    return `${head}: volume creators may only use ${quoted(values)} ` +
      `(--allow-parameter ${given.pattern}=${values.join("|")}); ${allowIt}`;
  }
  if (key === "keylocation") {
    const where = policy.keyDir
      ? `key locations must be files below --key-dir "${policy.keyDir}"`
      : "key locations are refused unless the operator gives --key-dir DIR (files below DIR)";
    return `${head}: ${where}; ${allowIt}`;
  }
  const limit = Object.hasOwn(DEFAULT_LIMITS, key) ? DEFAULT_LIMITS[key] : undefined;
  if (limit && !limit.accepts(value)) {
    return `${head}: ${limit.accepted} by default, as ${limit.why}; ${allowIt}`;
  }
  const module = moduleOf(key);
  if (module !== undefined && Object.hasOwn(DEFAULT_DENIED_MODULES, module)) {
    return `${head}: user properties of ${module} are refused by default, as ` +
      `${DEFAULT_DENIED_MODULES[module]}; ${allowIt}`;
  }
  return undefined;
}

/** The command-line flags a {@linkcode ParameterPolicy} is resolved from. */
export interface ParameterPolicyFlags {
  /** `--allow-parameter` values: `NAME=VALUE[|VALUE...]` or `NAME=*`. */
  readonly allow: readonly string[];
  /** `--deny-parameter` values: names. */
  readonly deny: readonly string[];
  /** `--key-dir`, absolute and normalised (no `.`, `..`, `//` or trailing `/`), if given. */
  readonly keyDir?: string | undefined;
}

/** Checks a name pattern of a flag: a known parameter, `module:*` or `*`. */
function checkPattern(flag: string, given: string, pattern: string): void {
  if (pattern === "*") return;
  if (pattern.endsWith(":*")) {
    const module = pattern.slice(0, -2);
    if (MODULE.test(module) && module !== OWN_MODULE) return;
  } else if (isKnownParameter(pattern)) {
    return;
  }
  throw new TypeError(
    `${flag} "${given}": "${pattern}" is not a parameter zfs-csi accepts ` +
      `(a ZFS property of the list in docs/parameters.md, quota, refreservation, backup_interval, ` +
      `backup_keep, module:name, module:* or *)`,
  );
}

/**
 * Resolves the operator's flags into a policy.
 * @throws {TypeError} naming the flag and value: a malformed flag, an unknown parameter, a value
 *   zfs would not accept, or a name both allowed and denied
 */
export function resolveParameterPolicy(flags: ParameterPolicyFlags): ParameterPolicy {
  const allowed = new Map<string, Set<string> | "any">();
  for (const item of flags.allow) {
    const eq = item.indexOf("=");
    if (eq <= 0) {
      throw new TypeError(
        `--allow-parameter "${item}" is not of the form NAME=VALUE[|VALUE...] or NAME=*`,
      );
    }
    const pattern = item.slice(0, eq);
    checkPattern("--allow-parameter", item, pattern);
    const values = item.slice(eq + 1).split("|");
    let set = allowed.get(pattern) ?? new Set<string>();
    if (values.length === 1 && values[0] === "*") {
      set = "any";
    } else {
      for (const value of values) {
        if (value === "*") {
          throw new TypeError(`--allow-parameter "${item}": "*" stands alone (NAME=*)`);
        }
        // Values of a pattern are checked against each parameter it covers when used.
        if (!pattern.endsWith("*")) {
          try {
            checkValue(pattern, value);
          } catch (err) {
            throw new TypeError(`--allow-parameter "${item}": ${(err as Error).message}`);
          }
        } else if (value === "") {
          throw new TypeError(`--allow-parameter "${item}": a value is empty`);
        }
        if (set !== "any") set.add(value);
      }
    }
    allowed.set(pattern, set);
  }
  const rules: Record<string, OperatorRule> = {};
  for (const [pattern, values] of allowed) {
    rules[pattern] = Object.freeze({
      kind: "allow",
      values: values === "any" ? "any" : Object.freeze([...values]),
    });
  }
  for (const pattern of flags.deny) {
    checkPattern("--deny-parameter", pattern, pattern);
    if (allowed.has(pattern)) {
      throw new TypeError(`--allow-parameter and --deny-parameter both name "${pattern}"`);
    }
    rules[pattern] = Object.freeze({ kind: "deny" });
  }
  if (flags.keyDir !== undefined && rules.keylocation?.kind === "deny") {
    throw new TypeError(`--key-dir is given, but --deny-parameter keylocation refuses every key`);
  }
  return Object.freeze({ rules: Object.freeze(rules), keyDir: flags.keyDir });
}

/** How parameters are used. */
export interface ParseOptions {
  /**
   * The volume is restored from the store: an encrypted one arrives encrypted (sent raw), so
   * `keylocation` alone, without `encryption`, is how its key is named.
   */
  readonly restoring?: boolean;
}

/**
 * Checks CreateVolume parameters: known names, values zfs accepts, and what `policy` lets volume
 * creators use. Nothing here runs zfs: a refused request never reaches it.
 * @throws {CsiError} INVALID_ARGUMENT naming the key for unknown keys, malformed values and
 *   values the policy refuses (with the flag that would allow them)
 */
export function parseParameters(
  params: Readonly<Record<string, string>> | null | undefined,
  policy: ParameterPolicy,
  options: ParseOptions = {},
): VolumeParameters {
  const entries = Object.entries(params ?? {}).sort(([a], [b]) => (a < b ? -1 : a > b ? 1 : 0));
  const properties: Record<string, string> = {};
  const openzfsOnly: string[] = [];
  let quota: SizeSetting | undefined;
  let refreservation: SizeSetting | undefined;
  let backup: BackupSettings | undefined;
  for (const [key, value] of entries) {
    if (!isKnownParameter(key)) {
      throw invalid(
        `Parameter "${key}" is not supported; use ZFS properties such as ` +
          `compression, recordsize, atime, quota or a user property (module:name)`,
      );
    }
    checkValue(key, value);
    const refusal = policyRefusal(policy, key, value);
    if (refusal !== undefined) throw invalid(refusal);
    if (key === SIZE_PARAMETERS.quota) {
      quota = sizeSetting(key, value);
      continue;
    }
    if (key === SIZE_PARAMETERS.refreservation) {
      refreservation = sizeSetting(key, value);
      continue;
    }
    if (key === BACKUP_PARAMETERS.interval) {
      backup = { ...backup, intervalSeconds: parseInterval(value) };
      continue;
    }
    if (key === BACKUP_PARAMETERS.keep) {
      backup = { ...backup, keep: parseKeepPolicy(value) };
      continue;
    }
    if (Object.hasOwn(ZFS_PARAMETERS, key) && ZFS_PARAMETERS[key]?.openzfsOnly) {
      openzfsOnly.push(key);
    }
    properties[key] = value;
  }
  if (
    properties.keylocation !== undefined && properties.encryption === undefined &&
    !options.restoring
  ) {
    throw invalid(`Parameter "keylocation" needs "encryption"`);
  }
  // zfs would prompt for the key, and the plugin has no terminal: the create would fail late.
  if (properties.keyformat !== undefined && properties.keylocation === undefined) {
    throw invalid(
      `Parameter "keyformat" needs "keylocation" (file:///path or https://...): ` +
        `the plugin cannot prompt for a key`,
    );
  }
  return {
    properties,
    ...(quota ? { quota } : {}),
    ...(refreservation ? { refreservation } : {}),
    ...(backup ? { backup } : {}),
    openzfsOnly,
    canonical: JSON.stringify(Object.fromEntries(entries)),
  };
}

/**
 * Why `params` would not be accepted under `policy`, or undefined when they would: for
 * ValidateVolumeCapabilities, which answers with a message rather than an error.
 */
export function parametersRefusal(
  params: Readonly<Record<string, string>> | null | undefined,
  policy: ParameterPolicy,
): string | undefined {
  try {
    parseParameters(params, policy);
    return undefined;
  } catch (err) {
    if (err instanceof CsiError && err.code === Code.INVALID_ARGUMENT) return err.message;
    throw err;
  }
}

/** The bytes a size setting stands for, given the volume's capacity. */
export function sizeOf(setting: SizeSetting, capacityBytes: number): number {
  return setting.kind === "capacity" ? capacityBytes : setting.bytes;
}

/**
 * Checks the size parameters against a capacity (0: unlimited).
 * @throws {CsiError} INVALID_ARGUMENT when quota is below or refreservation above the capacity
 */
export function checkSizes(p: VolumeParameters, capacityBytes: number): void {
  if (p.quota && capacityBytes > 0 && sizeOf(p.quota, capacityBytes) < capacityBytes) {
    throw invalid(`Parameter quota is below the volume's capacity of ${capacityBytes} bytes`);
  }
  if (p.refreservation) {
    if (p.refreservation.kind === "capacity" && capacityBytes === 0) {
      throw invalid(`Parameter refreservation="capacity" needs a capacity`);
    }
    if (capacityBytes > 0 && sizeOf(p.refreservation, capacityBytes) > capacityBytes) {
      throw invalid(
        `Parameter refreservation is above the volume's capacity of ${capacityBytes} bytes`,
      );
    }
  }
}
