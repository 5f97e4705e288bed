/**
 * CreateVolume parameters: ZFS properties from an allowlist, plus user properties. Nothing
 * else reaches zfs: an unknown key is INVALID_ARGUMENT, so a typo never creates a volume that
 * silently lacks what was asked for, and no request can set a mountpoint or a share.
 */

import { Code, CsiError } from "../errors.ts";
import { parseSize } from "../size.ts";
import { checkProperty } from "../zfs/args.ts";
import { MANAGED_PROPERTY } from "../zfs/names.ts";

/** How a parameter is checked. */
interface ParameterRule {
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

/** A size parameter: the volume's capacity, or a fixed number of bytes. */
export type SizeSetting = { readonly kind: "capacity" } | {
  readonly kind: "bytes";
  readonly bytes: number;
};

/** Checked CreateVolume parameters. */
export interface VolumeParameters {
  /** ZFS and user properties to set at creation, by name. */
  readonly properties: Readonly<Record<string, string>>;
  readonly quota?: SizeSetting;
  readonly refreservation?: SizeSetting;
  /** Names among `properties` that only OpenZFS knows. */
  readonly openzfsOnly: readonly string[];
  /** The parameters in a canonical form, stored on the dataset to recognise a repeat. */
  readonly canonical: string;
}

/** User properties: `module:name`, as ZFS defines them. Our own namespace is off limits. */
const USER_PROPERTY = /^[a-z0-9_.+-]+:[a-z0-9_.:+-]+$/;
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
    (USER_PROPERTY.test(key) && !key.startsWith(MANAGED_PROPERTY.split(":")[0]! + ":"));
}

/**
 * Checks CreateVolume parameters.
 * @throws {CsiError} INVALID_ARGUMENT naming the key for unknown keys and malformed values
 */
export function parseParameters(
  params: Readonly<Record<string, string>> | null | undefined,
): VolumeParameters {
  const entries = Object.entries(params ?? {}).sort(([a], [b]) => (a < b ? -1 : a > b ? 1 : 0));
  const properties: Record<string, string> = {};
  const openzfsOnly: string[] = [];
  let quota: SizeSetting | undefined;
  let refreservation: SizeSetting | undefined;
  for (const [key, value] of entries) {
    if (!isKnownParameter(key)) {
      throw invalid(
        `Parameter "${key}" is not supported; use ZFS properties such as ` +
          `compression, recordsize, atime, quota or a user property (module:name)`,
      );
    }
    if (value === "" || new TextEncoder().encode(value).length > MAX_VALUE_BYTES) {
      throw invalid(`Parameter "${key}" must have a value of 1 to ${MAX_VALUE_BYTES} bytes`);
    }
    try {
      checkProperty(key, value);
    } catch (err) {
      throw invalid(`Parameter "${key}": ${(err as Error).message}`);
    }
    if (key === SIZE_PARAMETERS.quota) {
      quota = sizeSetting(key, value);
      continue;
    }
    if (key === SIZE_PARAMETERS.refreservation) {
      refreservation = sizeSetting(key, value);
      continue;
    }
    const rule = Object.hasOwn(ZFS_PARAMETERS, key) ? ZFS_PARAMETERS[key] : undefined;
    if (rule?.values && !rule.values.test(value)) {
      throw invalid(`Parameter ${key}="${value}" is not a value zfs accepts for ${key}`);
    }
    if (rule?.openzfsOnly) openzfsOnly.push(key);
    properties[key] = value;
  }
  if (properties.keylocation !== undefined && properties.encryption === undefined) {
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
    openzfsOnly,
    canonical: JSON.stringify(Object.fromEntries(entries)),
  };
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
