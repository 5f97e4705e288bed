/**
 * Reading what the store holds, and chains of streams. Pure: parsers that accept exactly what
 * layout.ts describes (and refuse anything else with a SyntaxError that says what is wrong),
 * and the walk from a snapshot back to the full stream it needs.
 *
 * Fields a later version of the layout adds are kept as they are: a record rewritten by this
 * version (with If-Match) must not drop what a newer node wrote there.
 */

import { encodeComponent } from "../zfs/names.ts";
import type { RecordedForm } from "../zfs/stream_form.ts";
import {
  guidHex,
  type KeepPolicy,
  manifestKey,
  type SnapshotManifest,
  type StoredZvol,
  streamsPrefix,
  type VolumeRecord,
} from "./layout.ts";

const decoder = new TextDecoder("utf-8", { fatal: true });
const GUID = /^\d{1,20}$/;
const HEX32 = /^[0-9a-f]{32}$/;
const SHA256 = /^[0-9a-f]{64}$/;
/** ISO 8601 in UTC as `Date.prototype.toISOString` writes it (milliseconds optional). */
const ISO_UTC = /^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(?:\.\d{1,9})?Z$/;
/**
 * A snapshot's name after its "@", as the plugin makes them (`.backup-…`, `.stored-…`): the
 * characters src/zfs/names.ts allows in a dataset component, never "." or "..", and short
 * enough for some dataset (ZFS names are under 256 bytes). It reaches zfs as
 * `<dataset>@<snapshot>`, so anything else (a NUL, "/", "@", a space) is refused here.
 */
const SNAPSHOT_COMPONENT = /^[A-Za-z0-9_.:-]{1,255}$/;
// deno-lint-ignore no-control-regex
const CONTROL = /[\u0000-\u001f\u007f]/;
/** The last segment of a stream key: `<guid hex>-<upload>.zfs`. */
const STREAM_NAME = /^([0-9a-f]{16})-[0-9a-f]{8,32}\.zfs$/;

type Json = Record<string, unknown>;

/** Reads a JSON object from bytes or text; `what` names it in messages. */
function readObject(input: Uint8Array | string, what: string): Json {
  let text: string;
  try {
    text = typeof input === "string" ? input : decoder.decode(input);
  } catch {
    throw new SyntaxError(`${what} is not UTF-8 text`);
  }
  let value: unknown;
  try {
    value = JSON.parse(text);
  } catch (err) {
    throw new SyntaxError(`${what} is not JSON: ${(err as Error).message}`);
  }
  if (value === null || typeof value !== "object" || Array.isArray(value)) {
    throw new SyntaxError(`${what} is not a JSON object`);
  }
  return value as Json;
}

/** Field readers that throw a SyntaxError naming the field. */
class Fields {
  constructor(readonly obj: Json, readonly what: string) {}

  fail(field: string, want: string): never {
    const got = this.obj[field];
    const shown = got === undefined ? "missing" : `got ${JSON.stringify(got)?.slice(0, 80)}`;
    throw new SyntaxError(`${this.what}: field "${field}" must be ${want} (${shown})`);
  }

  format(): 1 {
    if (this.obj.format !== 1) this.fail("format", "1 (the only layout version this plugin reads)");
    return 1;
  }

  string(field: string): string {
    const v = this.obj[field];
    if (typeof v !== "string" || v === "") this.fail(field, "a non-empty string");
    return v;
  }

  optionalString(field: string): string | undefined {
    return this.obj[field] === undefined ? undefined : this.string(field);
  }

  /** A non-empty string without control characters (shown in messages and logs). */
  text(field: string): string {
    const v = this.string(field);
    if (CONTROL.test(v)) this.fail(field, "a name without control characters");
    return v;
  }

  optionalText(field: string): string | undefined {
    return this.obj[field] === undefined ? undefined : this.text(field);
  }

  /** A snapshot name as the plugin makes them (see SNAPSHOT_COMPONENT). */
  snapshotName(field: string): string {
    const v = this.obj[field];
    if (typeof v !== "string" || !SNAPSHOT_COMPONENT.test(v) || v === "." || v === "..") {
      this.fail(field, `a snapshot name of letters, digits and "_.:-" (at most 255)`);
    }
    return v;
  }

  matching(field: string, re: RegExp, want: string): string {
    const v = this.obj[field];
    if (typeof v !== "string" || !re.test(v)) this.fail(field, want);
    return v;
  }

  guid(field: string): string {
    const v = this.matching(field, GUID, "a ZFS guid in decimal digits");
    if (BigInt(v) >= 1n << 64n || BigInt(v) === 0n) this.fail(field, "a ZFS guid (64 bits, not 0)");
    return v;
  }

  time(field: string): string {
    const v = this.matching(field, ISO_UTC, "an ISO 8601 time in UTC");
    if (Number.isNaN(Date.parse(v))) this.fail(field, "an ISO 8601 time in UTC");
    return v;
  }

  optionalTime(field: string): string | undefined {
    return this.obj[field] === undefined ? undefined : this.time(field);
  }

  count(field: string): number {
    const v = this.obj[field];
    if (typeof v !== "number" || !Number.isSafeInteger(v) || v < 0) {
      this.fail(field, "a non-negative integer");
    }
    return v;
  }

  optionalCount(field: string): number | undefined {
    return this.obj[field] === undefined ? undefined : this.count(field);
  }

  boolean(field: string): boolean {
    const v = this.obj[field];
    if (typeof v !== "boolean") this.fail(field, "true or false");
    return v;
  }

  object(field: string): Json {
    const v = this.obj[field];
    if (v === null || typeof v !== "object" || Array.isArray(v)) this.fail(field, "an object");
    return v as Json;
  }
}

/** The key component of a volume name, as layout.ts keys use it. */
function volumeKeyOf(name: string, what: string): string {
  try {
    return encodeComponent("Volume name", name);
  } catch (err) {
    throw new SyntaxError(`${what}: field "volume" is not a valid volume name`, { cause: err });
  }
}

/** Options of {@linkcode parseManifest}. */
export interface ParseManifestOptions {
  /** The key the manifest was read from: it must be the key its guid and volume give. */
  readonly key?: string;
}

/**
 * Reads a snapshot manifest (`v1/volumes/<volume>/snapshots/<guid>.json`), checking every
 * field: format 1, guids in decimal, a 64-hex-digit SHA-256, sizes that are non-negative safe
 * integers, and a stream key under the same volume's `streams/` named after the same guid.
 * @throws {SyntaxError} naming the first field that is wrong
 */
export function parseManifest(
  input: Uint8Array | string,
  options: ParseManifestOptions = {},
): SnapshotManifest {
  const what = `Snapshot manifest${options.key ? ` "${options.key}"` : ""}`;
  const obj = readObject(input, what);
  const f: Fields = new Fields(obj, what);
  f.format();
  const volume = f.string("volume");
  const volumeKey = volumeKeyOf(volume, what);
  const guid = f.guid("guid");
  const baseGuid = obj.baseGuid === null ? null : f.guid("baseGuid");
  if (baseGuid === guid) f.fail("baseGuid", "another snapshot's guid, or null");
  const kind = obj.kind;
  if (kind !== "scheduled" && kind !== "requested") f.fail("kind", `"scheduled" or "requested"`);
  const stream = f.string("stream");
  const prefix = streamsPrefix(volumeKey);
  const name = stream.startsWith(prefix) ? STREAM_NAME.exec(stream.slice(prefix.length)) : null;
  if (!name) f.fail("stream", `a key "${prefix}<guid hex>-<upload>.zfs"`);
  if (name[1] !== guidHex(guid)) f.fail("stream", `named after the guid (${guidHex(guid)})`);
  if (options.key !== undefined && options.key !== manifestKey(volumeKey, guid)) {
    throw new SyntaxError(
      `${what}: describes guid ${guid} of volume "${volume}", whose manifest key is ` +
        `"${manifestKey(volumeKey, guid)}"`,
    );
  }
  const csiName = f.optionalText("csiName");
  const form = obj.form === undefined ? undefined : readForm(f.object("form"), `${what}: form`);
  const referencedBytes = f.optionalCount("referencedBytes");
  const zvol = obj.zvol === undefined ? undefined : readZvol(f.object("zvol"), `${what}: zvol`);
  const manifest: SnapshotManifest = {
    ...obj,
    format: 1,
    volume,
    volumeUid: f.matching("volumeUid", HEX32, "32 lowercase hex digits"),
    guid,
    baseGuid,
    snapshot: f.snapshotName("snapshot"),
    ...(csiName === undefined ? {} : { csiName }),
    kind,
    createdAt: f.time("createdAt"),
    stream,
    size: f.count("size"),
    sha256: f.matching("sha256", SHA256, "64 lowercase hex digits"),
    raw: f.boolean("raw"),
    ...(form === undefined ? {} : { form }),
    node: f.text("node"),
    capacityBytes: f.count("capacityBytes"),
    ...(zvol === undefined ? {} : { zvol }),
    ...(referencedBytes === undefined ? {} : { referencedBytes }),
  };
  return manifest;
}

/** Reads a manifest's `zvol`: what the stream holds, its volblocksize, whether formatted. */
function readZvol(obj: Json, what: string): StoredZvol {
  const f: Fields = new Fields(obj, what);
  const content = obj.content;
  if (content !== "block" && content !== "ext4" && content !== "xfs") {
    f.fail("content", `"block", "ext4" or "xfs"`);
  }
  const volblocksize = f.count("volblocksize");
  // What zfs allows: a power of two from 512 bytes to 16 MiB.
  if (volblocksize < 512 || volblocksize > 1 << 24 || (volblocksize & (volblocksize - 1)) !== 0) {
    f.fail("volblocksize", "a power of two from 512 to 16777216");
  }
  return { ...obj, content, volblocksize, formatted: f.boolean("formatted") };
}

/** A stream feature's name as stream_form.ts writes them ("lz4", "embed_data", "bit29"). */
const FEATURE_NAME = /^[a-z][a-z0-9_]{0,31}$/;
/** More feature names than a stream header has bits means the field was not written by zfs-csi. */
const MAX_FEATURES = 30;

/**
 * Reads a manifest's `form`: three booleans, and `features` when present (a short list of
 * feature names); fields a later version adds are kept.
 */
function readForm(obj: Json, what: string): RecordedForm {
  const f: Fields = new Fields(obj, what);
  let features: string[] | undefined;
  if (obj.features !== undefined) {
    const v = obj.features;
    if (
      !Array.isArray(v) || v.length > MAX_FEATURES ||
      !v.every((x) => typeof x === "string" && FEATURE_NAME.test(x)) || new Set(v).size !== v.length
    ) {
      f.fail("features", `a list of at most ${MAX_FEATURES} distinct feature names (a-z, 0-9, _)`);
    }
    features = v as string[];
  }
  return {
    ...obj,
    compressed: f.boolean("compressed"),
    largeBlocks: f.boolean("largeBlocks"),
    embedded: f.boolean("embedded"),
    ...(features === undefined ? {} : { features }),
  };
}

/** Reads a keep policy object (each count a non-negative integer). */
function readKeep(obj: Json, what: string): KeepPolicy {
  const f: Fields = new Fields(obj, what);
  return {
    last: f.count("last"),
    hourly: f.count("hourly"),
    daily: f.count("daily"),
    weekly: f.count("weekly"),
  };
}

/**
 * Reads a volume record (`v1/volumes/<volume>/volume.json`), checking every field; fields it
 * does not know are kept (see the module doc).
 * @throws {SyntaxError} naming the first field that is wrong
 */
export function parseVolumeRecord(input: Uint8Array | string): VolumeRecord {
  const what = "Volume record";
  const obj = readObject(input, what);
  const f: Fields = new Fields(obj, what);
  f.format();
  const name = f.string("name");
  volumeKeyOf(name, what);
  const parameters: Record<string, string> = {};
  for (const [k, v] of Object.entries(f.object("parameters"))) {
    if (typeof v !== "string") f.fail("parameters", "an object of strings");
    parameters[k] = v;
  }
  let schedule: VolumeRecord["schedule"];
  if (obj.schedule !== undefined) {
    const s: Fields = new Fields(f.object("schedule"), `${what}: schedule`);
    const intervalSeconds = s.count("intervalSeconds");
    if (intervalSeconds === 0) s.fail("intervalSeconds", "a positive integer");
    schedule = { intervalSeconds, keep: readKeep(s.object("keep"), `${what}: schedule.keep`) };
  }
  const deletedAt = f.optionalTime("deletedAt");
  return {
    ...obj,
    format: 1,
    name,
    uid: f.matching("uid", HEX32, "32 lowercase hex digits"),
    createdAt: f.time("createdAt"),
    capacityBytes: f.count("capacityBytes"),
    parameters,
    ...(schedule ? { schedule } : {}),
    node: f.string("node"),
    ...(deletedAt === undefined ? {} : { deletedAt }),
  } as VolumeRecord;
}

/** The bytes a manifest or record is stored as: pretty JSON, for operators' cat and jq. */
export function encodeJson(value: SnapshotManifest | VolumeRecord): Uint8Array {
  return new TextEncoder().encode(JSON.stringify(value, null, 2) + "\n");
}

/** A chain that cannot be followed back to a full stream. */
export class ChainError extends Error {
  /** The snapshot whose chain was asked for. */
  readonly guid: string;
  /** The guid that is missing (a base, or the snapshot itself). */
  readonly missing: string;

  constructor(guid: string, missing: string, message: string) {
    super(message);
    this.name = "ChainError";
    this.guid = guid;
    this.missing = missing;
  }
}

/**
 * The manifests a restore of `guid` receives, the full stream first, then each incremental up
 * to `guid` itself. Every stream of the chain must belong to the same volume uid.
 * @throws {ChainError} naming the missing snapshot or base (or the loop or foreign uid found)
 */
export function chainTo(
  manifests: readonly SnapshotManifest[],
  guid: string,
): SnapshotManifest[] {
  const byGuid = new Map(manifests.map((m) => [m.guid, m]));
  const chain: SnapshotManifest[] = [];
  const target = byGuid.get(guid);
  if (!target) throw new ChainError(guid, guid, `The store has no snapshot with guid ${guid}`);
  const seen = new Set<string>();
  for (let m: SnapshotManifest = target;;) {
    seen.add(m.guid);
    chain.push(m);
    if (m.baseGuid === null) break;
    const base = byGuid.get(m.baseGuid);
    const at = `snapshot ${guid} of volume "${target.volume}"`;
    if (!base) {
      throw new ChainError(
        guid,
        m.baseGuid,
        `Cannot restore ${at}: its chain needs base ${m.baseGuid} (of ${m.guid}), ` +
          `which the store does not hold`,
      );
    }
    if (seen.has(base.guid)) {
      throw new ChainError(
        guid,
        base.guid,
        `Cannot restore ${at}: its chain loops at ${base.guid}`,
      );
    }
    if (base.volumeUid !== target.volumeUid) {
      throw new ChainError(
        guid,
        base.guid,
        `Cannot restore ${at}: base ${base.guid} belongs to another volume (uid ${base.volumeUid})`,
      );
    }
    m = base;
  }
  return chain.reverse();
}

/**
 * How many ancestors of each manifest the set holds (0 for a full stream or one whose base is
 * missing): a manifest is always deeper than its base.
 */
export function depths(manifests: readonly SnapshotManifest[]): Map<string, number> {
  const byGuid = new Map(manifests.map((m) => [m.guid, m]));
  const out = new Map<string, number>();
  const depthOf = (start: SnapshotManifest): number => {
    const path: SnapshotManifest[] = [];
    const onPath = new Set<string>();
    let m: SnapshotManifest | undefined = start;
    let base = 0;
    while (m && !out.has(m.guid) && !onPath.has(m.guid)) {
      path.push(m);
      onPath.add(m.guid);
      m = m.baseGuid === null ? undefined : byGuid.get(m.baseGuid);
    }
    // A loop (never written by the plugin) counts as a missing base.
    if (m && out.has(m.guid)) base = out.get(m.guid)! + 1;
    for (let i = path.length - 1; i >= 0; i--, base++) out.set(path[i]!.guid, base);
    return out.get(start.guid)!;
  };
  for (const m of manifests) depthOf(m);
  return out;
}

/** The highest `sequence` a manifest may carry (15 digits, as snapshot names hold it). */
export const MAX_SEQUENCE = 999_999_999_999_999;

/**
 * A manifest's `sequence` when it is one (a whole number from 1 to {@linkcode MAX_SEQUENCE}),
 * else undefined: absent (written before the field existed) or not a number the plugin wrote.
 */
export function sequenceOf(manifest: SnapshotManifest): number | undefined {
  const v: unknown = manifest.sequence;
  return typeof v === "number" && Number.isSafeInteger(v) && v >= 1 && v <= MAX_SEQUENCE
    ? v
    : undefined;
}

/**
 * Where a manifest stands in its volume's order, oldest to newest: by era (0 for a chain that
 * has no sequence number anywhere down to its full stream, 1 otherwise), then by value (era 0:
 * its createdAt in ms, era 1: its sequence number), then by depth (how many ancestors the set
 * holds), then by guid. A value is never below its base's: era 1 takes at least the base's
 * sequence plus one, era 0 at least the base's time, so a snapshot is always newer than its base.
 */
interface Position {
  readonly era: 0 | 1;
  readonly value: number;
  readonly depth: number;
}

/** {@linkcode Position}s of every manifest, following base links (a loop counts as a root). */
function positions(manifests: readonly SnapshotManifest[]): Map<string, Position> {
  const byGuid = new Map(manifests.map((m) => [m.guid, m]));
  const out = new Map<string, Position>();
  for (const start of manifests) {
    // The path down to the first manifest with a known position (or a root), then back up.
    const path: SnapshotManifest[] = [];
    const onPath = new Set<string>();
    let m: SnapshotManifest | undefined = start;
    while (m && !out.has(m.guid) && !onPath.has(m.guid)) {
      path.push(m);
      onPath.add(m.guid);
      m = m.baseGuid === null ? undefined : byGuid.get(m.baseGuid);
    }
    let below = m && out.has(m.guid) ? out.get(m.guid) : undefined;
    for (let i = path.length - 1; i >= 0; i--) {
      const p = path[i]!;
      const sequence = sequenceOf(p);
      const time = Date.parse(p.createdAt);
      let here: Position;
      if (below?.era === 1 || sequence !== undefined) {
        const after = below?.era === 1 ? below.value + 1 : 1;
        here = { era: 1, value: Math.max(sequence ?? 0, after), depth: (below?.depth ?? -1) + 1 };
      } else {
        here = {
          era: 0,
          value: Math.max(time, below?.value ?? time),
          depth: (below?.depth ?? -1) + 1,
        };
      }
      out.set(p.guid, here);
      below = here;
    }
  }
  return out;
}

function compareGuids(a: string, b: string): number {
  return a.length - b.length || (a < b ? -1 : a > b ? 1 : 0);
}

/**
 * The manifests oldest first, by their chains and sequence numbers, never by comparing two
 * nodes' clocks:
 * - a snapshot is always after its base (an incremental is newer than what it is based on);
 * - manifests with a `sequence` (every one this version writes: one more than the highest its
 *   writer saw in the store) are ordered by it: a backup comes after everything its node had
 *   seen, whatever the clocks say; the same number twice (two writers that had not seen each
 *   other) is broken by depth, then guid;
 * - manifests written before sequence numbers existed come before every chain that has them
 *   (they were written before the first one), ordered among themselves as before: by
 *   createdAt, never before their base's, then depth, then guid. An old version's incremental
 *   on a numbered snapshot (a rolling upgrade) counts as its base's number plus one.
 * The order is total and the same on every node.
 */
export function oldestFirst(manifests: readonly SnapshotManifest[]): SnapshotManifest[] {
  const at = positions(manifests);
  return [...manifests].sort((a, b) => {
    const p = at.get(a.guid)!;
    const q = at.get(b.guid)!;
    return p.era - q.era || p.value - q.value || p.depth - q.depth || compareGuids(a.guid, b.guid);
  });
}

/** The newest manifest (see {@linkcode oldestFirst}), or undefined for none. */
export function latest(manifests: readonly SnapshotManifest[]): SnapshotManifest | undefined {
  return oldestFirst(manifests).at(-1);
}

/**
 * The `sequence` for a manifest written after reading `manifests`: one more than the highest
 * any of them has (counting an old version's incremental on a numbered one as its base's plus
 * one), and at least `atLeast`; 1 for a volume with none.
 * @throws {RangeError} past {@linkcode MAX_SEQUENCE} (only a store someone filled with
 *   hostile numbers gets there)
 */
export function nextSequence(manifests: readonly SnapshotManifest[], atLeast = 1): number {
  let next = atLeast;
  for (const p of positions(manifests).values()) {
    if (p.era === 1) next = Math.max(next, p.value + 1);
  }
  if (!(next <= MAX_SEQUENCE)) {
    throw new RangeError(
      `The store's sequence numbers of this volume reach ${next - 1}: no higher one can be ` +
        `written (the highest is ${MAX_SEQUENCE}); remove the manifest that carries it`,
    );
  }
  return next;
}

/**
 * Whether `guid` comes after `than` in {@linkcode oldestFirst}'s order of `manifests`; false
 * when either is not among them.
 */
export function isNewer(
  manifests: readonly SnapshotManifest[],
  guid: string,
  than: string,
): boolean {
  const order = oldestFirst(manifests);
  const a = order.findIndex((m) => m.guid === guid);
  const b = order.findIndex((m) => m.guid === than);
  return a >= 0 && b >= 0 && a > b;
}
