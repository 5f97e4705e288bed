/**
 * The form of a `zfs send` stream, pure: which flags a pool's zfs can send with, what a stream's
 * own header says it needs, and whether a pool can receive it.
 *
 * OpenZFS sends a dataset's blocks decompressed unless asked for `-c` (and splits blocks over
 * 128 KiB unless `-L`, and sends tiny embedded blocks as whole writes unless `-e`): a volume with
 * `compression=lz4` then costs the store and every move its logical size, and the node the CPU
 * to decompress on send and compress again on receive. So streams are sent `-c -L -e` where the
 * zfs and the pool have them ({@linkcode sendFormFor}); zfs-fuse (pool version 23, no feature
 * flags, no `-c`) keeps plain streams. Raw sends (`-w`, encrypted datasets) already carry the
 * blocks as they are on disk.
 *
 * A receiving pool needs the pool features the stream's header (its DRR_BEGIN record) names:
 * {@linkcode streamHeaderFeatures} reads them from the first bytes zfs send wrote, the manifest
 * records them, and {@linkcode missingForReceive} says what a pool lacks before anything is
 * received.
 */

/** The flags besides `-w` a stream was sent with. */
export interface StreamForm {
  /** `-c`: blocks as compressed on disk. */
  readonly compressed: boolean;
  /** `-L`: blocks over 128 KiB kept whole. */
  readonly largeBlocks: boolean;
  /** `-e`: blocks embedded in block pointers sent as such. */
  readonly embedded: boolean;
}

/** A stream's form as a manifest records it: the flags, and what its header says it needs. */
export interface RecordedForm extends StreamForm {
  /**
   * The stream's feature flags as its header states them ({@linkcode streamHeaderFeatures}),
   * e.g. `["compressed", "embed_data", "lz4", "sa_spill"]`; absent when not read.
   */
  readonly features?: readonly string[];
}

/** `zfs send` without `-c`, `-L` or `-e`: what every stream was before forms existed. */
export const PLAIN_FORM: StreamForm = { compressed: false, largeBlocks: false, embedded: false };

/** What one pool's zfs can send and receive, as read by Zfs.streamSupport. */
export interface PoolStreamSupport {
  readonly pool: string;
  /** zfs's userland version ("2.1.11"); undefined where `zfs version` is unknown (zfs-fuse). */
  readonly zfsVersion: string | undefined;
  /** The pool's version as `zpool get` shows it: "-" (5000) with feature flags, else a number. */
  readonly poolVersion: string;
  /** Pool feature states by name ("disabled", "enabled", "active"); empty without feature flags. */
  readonly features: ReadonlyMap<string, string>;
}

/** Whether the pool has feature flags (OpenZFS); zfs-fuse's pools are version 23. */
export function hasFeatureFlags(support: PoolStreamSupport): boolean {
  return support.poolVersion === "-" || support.poolVersion === "5000";
}

/** Whether a pool feature is enabled or active (usable). */
function usable(support: PoolStreamSupport, feature: string): boolean {
  const state = support.features.get(feature);
  return state === "enabled" || state === "active";
}

/**
 * Reads `zpool get all <pool>` (the four-column table every zpool prints, zfs-fuse's included):
 * the pool's version and its `feature@` states. The values read hold no spaces.
 * @throws {SyntaxError} when no version line of `pool` is there
 */
export function parsePoolStreamSupport(
  pool: string,
  stdout: string,
  zfsVersion: string | undefined,
): PoolStreamSupport {
  let poolVersion: string | undefined;
  const features = new Map<string, string>();
  for (const line of stdout.split("\n")) {
    // The name first (a pool's name may hold spaces), then the property and its value.
    if (!line.startsWith(pool) || !/^\s/.test(line.slice(pool.length))) continue;
    const [property, value] = line.slice(pool.length).trim().split(/\s+/);
    if (property === undefined || value === undefined) continue;
    if (property === "version") poolVersion = value;
    else if (property.startsWith("feature@")) features.set(property.slice(8), value);
  }
  if (poolVersion === undefined) {
    throw new SyntaxError(`zpool get all ${pool} printed no version of pool "${pool}"`);
  }
  return { pool, zfsVersion, poolVersion, features };
}

/**
 * The userland version in `zfs version`'s output ("zfs-2.1.11-1" on its first line).
 * @returns undefined for output of another shape
 */
export function parseZfsVersion(stdout: string): string | undefined {
  return /^zfs-(\d+\.\d+(?:\.\d+)?)/m.exec(stdout)?.[1];
}

/** What a send is: raw or not, and for an incremental, the form of its base's stream. */
export interface SendFormOptions {
  readonly raw: boolean;
  /** The form of the base's stream (PLAIN_FORM for a manifest without one); none: a full. */
  readonly base?: StreamForm;
}

/**
 * The flags to send with on a pool: `-c` and `-e` wherever its zfs and pool have them, and `-L`
 * chosen once per chain, by its full stream.
 *
 * Why `-L` follows the chain: OpenZFS refuses an incremental without `-L` on top of a dataset
 * that received large blocks ("incremental send stream requires -L (--large-block), to match
 * previous receive": ZFS_ERR_STREAM_LARGE_BLOCK_MISMATCH, dmu_recv.c), and an incremental with
 * `-L` on top of a chain received without it wrote split blocks over whole ones: receivers
 * before OpenZFS's SWITCH_TO_LARGE_BLOCKS stream feature can zero files that way (zfs_ioctl.h).
 * So a chain keeps the `-L` of its full stream; a plain chain (written before forms, or by a
 * node without the feature) stays without it until its next full stream. `-c` and `-e` change
 * only how blocks travel, not which blocks the receiver ends up with, and may change along a
 * chain.
 *
 * `-c` needs `zfs version` to answer (OpenZFS 0.8 and later: it has had `-c` since 0.7); `-e`
 * and `-L` need the pool's embedded_data and large_blocks features. A raw send (`-w`) already
 * carries blocks as on disk and takes none of them.
 */
export function sendFormFor(support: PoolStreamSupport, options: SendFormOptions): StreamForm {
  if (options.raw || !hasFeatureFlags(support) || support.zfsVersion === undefined) {
    return PLAIN_FORM;
  }
  return {
    compressed: true,
    largeBlocks: options.base ? options.base.largeBlocks : usable(support, "large_blocks"),
    embedded: usable(support, "embedded_data"),
  };
}

/** The `zfs send` flags of a form, as a person would type them ("-c -L -e", or "" for none). */
export function formFlags(form: StreamForm): string {
  return [form.compressed && "-c", form.largeBlocks && "-L", form.embedded && "-e"]
    .filter((f) => f !== false).join(" ");
}

/** The magic number that opens every stream's DRR_BEGIN record. */
const BACKUP_MAGIC = 0x2f5bacbacn;
/** Bytes {@linkcode streamHeaderFeatures} reads: drr_type, drr_payloadlen, magic, versioninfo. */
export const STREAM_HEADER_BYTES = 24;

/**
 * The stream feature flags (DMU_BACKUP_FEATURE_*, sys/zfs_ioctl.h), by bit, named as OpenZFS
 * names them. Bits not here are shown as `bit<n>`.
 */
const STREAM_FEATURES: ReadonlyMap<number, string> = new Map([
  [0, "dedup"],
  [1, "dedupprops"],
  [2, "sa_spill"],
  [16, "embed_data"],
  [17, "lz4"],
  [19, "large_blocks"],
  [20, "resuming"],
  [21, "redacted"],
  [22, "compressed"],
  [23, "large_dnode"],
  [24, "raw"],
  [25, "zstd"],
  [26, "holds"],
  [27, "switch_to_large_blocks"],
  [28, "blake3"],
]);

/**
 * The feature flags a stream's header states, from its first {@linkcode STREAM_HEADER_BYTES}
 * bytes (the DRR_BEGIN record, in the sender's byte order, told by its magic), sorted.
 * @returns undefined when the bytes are not the start of a single (not `-R`) stream
 */
export function streamHeaderFeatures(head: Uint8Array): string[] | undefined {
  if (head.length < STREAM_HEADER_BYTES) return undefined;
  const view = new DataView(head.buffer, head.byteOffset, STREAM_HEADER_BYTES);
  const little = view.getBigUint64(8, true) === BACKUP_MAGIC;
  if (!little && view.getBigUint64(8, false) !== BACKUP_MAGIC) return undefined;
  // DRR_BEGIN is record type 0.
  if (view.getUint32(0, little) !== 0) return undefined;
  const versionInfo = view.getBigUint64(16, little);
  // The low two bits: DMU_SUBSTREAM (1), one dataset's stream.
  if ((versionInfo & 3n) !== 1n) return undefined;
  const flags = Number((versionInfo >> 2n) & 0x3fffffffn);
  const out: string[] = [];
  for (let bit = 0; bit < 30; bit++) {
    if (flags & (1 << bit)) out.push(STREAM_FEATURES.get(bit) ?? `bit${bit}`);
  }
  return out.sort();
}

/**
 * The pool feature a receiving pool must have enabled for each stream feature, as OpenZFS's
 * receive checks them (recv_begin_check_feature_flags_impl, dmu_recv.c).
 */
const POOL_FEATURE_FOR: ReadonlyMap<string, string> = new Map([
  ["embed_data", "embedded_data"],
  ["lz4", "lz4_compress"],
  ["zstd", "zstd_compress"],
  ["large_blocks", "large_blocks"],
  ["large_dnode", "large_dnode"],
  ["redacted", "redacted_datasets"],
  ["raw", "encryption"],
]);

/** Pool version from which the SA_SPILL stream feature can be received (SPA_VERSION_SA). */
const SA_POOL_VERSION = 24;

/**
 * The stream features a recorded form stands for: its header's where read, else what its flags
 * may bring (a stream sent with `-c` is marked compressed; `-e` and `-L` may bring embedded data
 * and large blocks).
 */
export function neededFeatures(form: RecordedForm): readonly string[] {
  if (form.features !== undefined) return form.features;
  return [
    ...form.compressed ? ["compressed"] : [],
    ...form.embedded ? ["embed_data"] : [],
    ...form.largeBlocks ? ["large_blocks"] : [],
  ];
}

/**
 * What `support`'s pool lacks to receive a stream of this form, each as a short phrase; empty
 * when it lacks nothing this module knows of (zfs itself still decides).
 */
export function missingForReceive(support: PoolStreamSupport, form: RecordedForm): string[] {
  const needed = neededFeatures(form);
  if (!hasFeatureFlags(support)) {
    const version = Number(support.poolVersion);
    const beyond = needed.filter((f) =>
      !(f === "sa_spill" && Number.isInteger(version) && version >= SA_POOL_VERSION)
    );
    if (beyond.length === 0) return [];
    return [
      `pool feature flags (pool "${support.pool}" is version ${support.poolVersion}, as ` +
      `zfs-fuse's are: it cannot receive a stream with ${beyond.join(", ")})`,
    ];
  }
  const missing: string[] = [];
  for (const feature of needed) {
    const pool = POOL_FEATURE_FOR.get(feature);
    if (pool === undefined || usable(support, pool)) continue;
    const state = support.features.get(pool);
    missing.push(
      `feature@${pool} (${state === undefined ? "unknown to this zfs" : state}; the stream ` +
        `has ${feature})`,
    );
  }
  return missing;
}

/** A form in words, for messages: "compressed, large-block, embedded-data (zfs send -c -L -e)". */
export function describeForm(form: StreamForm, raw: boolean): string {
  const words = [
    ...raw ? ["raw"] : [],
    ...form.compressed ? ["compressed"] : [],
    ...form.largeBlocks ? ["large-block"] : [],
    ...form.embedded ? ["embedded-data"] : [],
  ];
  const flags = [...raw ? ["-w"] : [], formFlags(form)].filter((f) => f !== "").join(" ");
  return words.length === 0
    ? "plain stream (zfs send)"
    : `${words.join(", ")} stream (zfs send ${flags})`;
}
