/**
 * Who holds a volume that follows its job, decided by the store alone: one object per volume,
 * `v1/volumes/<volume>/owner.json` ({@linkcode OwnerRecord}), changed only by conditional
 * writes (If-None-Match to create it, If-Match with the etag read to change it). Of two nodes
 * racing for it exactly one write wins; acquiring bumps the generation.
 *
 * Fencing: the holder keeps the etag of its last write ({@linkcode Holding}) and makes every
 * later change (renewal, moving `head`, release) with If-Match on it. Once another node took
 * the volume over (or an operator forced a takeover), the object's etag changed, so the old
 * holder's next write gets a precondition failure and it learns it lost the volume
 * ({@linkcode FencedError}): it can never move `head`, and a receiver follows only `head` and
 * its base chain, so streams it uploaded late are never received.
 */

import { Code, CsiError } from "../errors.ts";
import { ownerKey } from "../store/layout.ts";
import { type RequestOptions, type Store, StoreError } from "../store/store.ts";
import { isZvolContent, type ZvolContent } from "../volume/zvol.ts";

/** Whether a node holds the volume, none does, or it was deleted. */
export type OwnerState = "held" | "released" | "deleted";

/** What a volume's settings are, wherever it is staged: set once by CreateVolume. */
export interface FollowSettings {
  /** The volume's size (a dataset's refquota, 0 for none; a zvol's volsize). */
  readonly capacityBytes: number;
  /** The dataset properties a node creates (or completes) its copy with. */
  readonly properties: Readonly<Record<string, string>>;
  /** Present when the volume is a zvol (its copies are zvols); absent for a ZFS dataset. */
  readonly zvol?: FollowZvol;
}

/**
 * What every node makes its copy of a follow zvol as (docs/block-volumes.md): `zfs create -V`
 * with the settings' capacity as volsize, or a receive of the head's chain (a zvol's stream).
 */
export interface FollowZvol {
  /** What it holds: a raw device, or the filesystem the first stage makes on it. */
  readonly content: ZvolContent;
  /** Its volblocksize in bytes, when CreateVolume asked for one (a received copy keeps its stream's). */
  readonly volblocksize?: number;
  /** Thin: no refreservation (`zfs create -s`; `refreservation=none` on a received copy). */
  readonly sparse: boolean;
}

/** `v1/volumes/<volume>/owner.json`. */
export interface OwnerRecord {
  readonly format: 1;
  /** The CSI volume name. */
  readonly volume: string;
  /** The uid of the volume's record (volume.json), which its manifests carry. */
  readonly uid: string;
  /** The node that holds the volume (state held) or held it last; null before the first. */
  readonly holder: string | null;
  /** Bumped by every acquire: a copy made writable under an older generation is stale. */
  readonly generation: number;
  readonly state: OwnerState;
  /** Guid (decimal) of the newest snapshot of the authoritative chain; null before the first. */
  readonly head: string | null;
  /** When the head snapshot was taken (ISO 8601), for "how old is the last copy". */
  readonly headAt: string | null;
  /** The holder's wall clock at its last write (ISO 8601): for people, never for decisions. */
  readonly renewedAt: string;
  /** How often, at most, the holder promises to renew while it holds the volume. */
  readonly ttlSeconds: number;
  /**
   * Whether the holder promised to make its copy read-only by itself when it cannot renew in
   * time (it runs with `--takeover-after`; lease.ts SelfFence): only then may another node take
   * the volume over by the rule (rule.ts). Absent (records of older versions): false.
   */
  readonly selfFence?: boolean;
  /** Why the last release happened, when it was not the holder's own. */
  readonly releasedBy?: string;
  /**
   * The nodes that keep a warm copy in the background (src/follow/standby.ts), as CreateVolume
   * named them; absent when none were named.
   */
  readonly standbys?: readonly string[];
  readonly settings: FollowSettings;
}

/** The holder's handle: the record as it last wrote it, and that write's etag. */
export interface Holding {
  readonly record: OwnerRecord;
  readonly etag: string;
}

/**
 * What a holder promises with each write of the owner object: the lease it renews within, and
 * whether it fences itself (makes its copy read-only) when it cannot renew in time.
 */
export interface HolderTerms {
  readonly ttlSeconds: number;
  readonly selfFence: boolean;
}

/** `r` with the holder's terms written in (selfFence is left out when false, as before). */
function withTerms(r: OwnerRecord, terms: HolderTerms | undefined): OwnerRecord {
  if (!terms) return r;
  const { selfFence: _, ...rest } = r;
  return { ...rest, ttlSeconds: terms.ttlSeconds, ...(terms.selfFence ? { selfFence: true } : {}) };
}

/** The volume was taken over: this node's write was refused, and must not be retried. */
export class FencedError extends Error {
  /** The record as it is now, if it could be read. */
  readonly current: OwnerRecord | undefined;

  constructor(message: string, current: OwnerRecord | undefined) {
    super(message);
    this.name = "FencedError";
    this.current = current;
  }
}

/** Another node holds the volume, and the takeover rule does not allow taking it yet. */
export class HeldElsewhereError extends CsiError {
  readonly current: OwnerRecord;
  readonly etag: string;

  constructor(message: string, current: OwnerRecord, etag: string) {
    super(Code.FAILED_PRECONDITION, message);
    this.name = "HeldElsewhereError";
    this.current = current;
    this.etag = etag;
  }
}

const HEX32 = /^[0-9a-f]{32}$/;
const GUID = /^\d{1,20}$/;
/** Lost races in a row before a change gives up (each loser reads again). */
const ATTEMPTS = 5;

/**
 * Reads an owner object, checking every field.
 * @throws {SyntaxError} naming the first field that is wrong
 */
export function parseOwner(input: Uint8Array | string): OwnerRecord {
  const text = typeof input === "string" ? input : new TextDecoder().decode(input);
  let obj: unknown;
  try {
    obj = JSON.parse(text);
  } catch (err) {
    throw new SyntaxError("Owner object is not JSON", { cause: err });
  }
  if (!obj || typeof obj !== "object" || Array.isArray(obj)) {
    throw new SyntaxError("Owner object is not a JSON object");
  }
  const o = obj as Record<string, unknown>;
  const fail = (field: string, want: string): never => {
    throw new SyntaxError(`Owner object: field "${field}" must be ${want}`);
  };
  const str = (f: string) => typeof o[f] === "string" ? o[f] as string : fail(f, "a string");
  const strOrNull = (f: string) => o[f] === null ? null : str(f);
  const count = (f: string) =>
    Number.isSafeInteger(o[f]) && (o[f] as number) >= 0
      ? o[f] as number
      : fail(f, "a non-negative integer");
  if (o.format !== 1) fail("format", "1");
  const state = o.state;
  if (state !== "held" && state !== "released" && state !== "deleted") {
    fail("state", `"held", "released" or "deleted"`);
  }
  const uid = str("uid");
  if (!HEX32.test(uid)) fail("uid", "32 lowercase hex digits");
  const head = strOrNull("head");
  if (head !== null && !GUID.test(head)) fail("head", "a decimal guid or null");
  const s = o.settings;
  if (!s || typeof s !== "object" || Array.isArray(s)) fail("settings", "an object");
  const settings = s as Record<string, unknown>;
  const capacityBytes = settings.capacityBytes;
  if (!Number.isSafeInteger(capacityBytes) || (capacityBytes as number) < 0) {
    fail("settings.capacityBytes", "a non-negative integer");
  }
  const props = settings.properties;
  if (
    !props || typeof props !== "object" || Array.isArray(props) ||
    !Object.values(props).every((v) => typeof v === "string")
  ) {
    fail("settings.properties", "an object of strings");
  }
  const zvol = settings.zvol === undefined ? undefined : parseZvolSettings(settings.zvol, fail);
  if (zvol && (capacityBytes as number) <= 0) fail("settings.capacityBytes", "positive for a zvol");
  const releasedBy = o.releasedBy === undefined ? undefined : str("releasedBy");
  if (o.selfFence !== undefined && typeof o.selfFence !== "boolean") {
    fail("selfFence", "true or false");
  }
  const standbys = o.standbys;
  if (
    standbys !== undefined &&
    (!Array.isArray(standbys) || !standbys.every((n) => typeof n === "string"))
  ) {
    fail("standbys", "a list of node names");
  }
  return {
    format: 1,
    volume: str("volume"),
    uid,
    holder: strOrNull("holder"),
    generation: count("generation"),
    state: state as OwnerState,
    head,
    headAt: strOrNull("headAt"),
    renewedAt: str("renewedAt"),
    ttlSeconds: count("ttlSeconds"),
    ...(o.selfFence === true ? { selfFence: true } : {}),
    ...(releasedBy === undefined ? {} : { releasedBy }),
    ...(standbys === undefined ? {} : { standbys: [...standbys as string[]] }),
    settings: {
      capacityBytes: capacityBytes as number,
      properties: { ...(props as Record<string, string>) },
      ...(zvol ? { zvol } : {}),
    },
  };
}

/** Whether `v` is a volblocksize the plugin makes zvols with (volume/zvol.ts parseVolblocksize). */
function isVolblocksize(v: unknown): v is number {
  return typeof v === "number" && Number.isSafeInteger(v) && v >= 4096 && v <= 131072 &&
    (v & (v - 1)) === 0;
}

/** `settings.zvol` of an owner object, checked field by field with `fail`. */
function parseZvolSettings(
  value: unknown,
  fail: (field: string, want: string) => never,
): FollowZvol {
  if (!value || typeof value !== "object" || Array.isArray(value)) {
    fail("settings.zvol", "an object");
  }
  const z = value as Record<string, unknown>;
  const content = z.content;
  if (typeof content !== "string" || !isZvolContent(content)) {
    fail("settings.zvol.content", `"block", "ext4" or "xfs"`);
  }
  if (typeof z.sparse !== "boolean") fail("settings.zvol.sparse", "true or false");
  const volblocksize = z.volblocksize;
  if (volblocksize !== undefined && !isVolblocksize(volblocksize)) {
    fail("settings.zvol.volblocksize", "a power of two from 4096 to 131072");
  }
  return {
    content: content as ZvolContent,
    ...(volblocksize === undefined ? {} : { volblocksize: volblocksize as number }),
    sparse: z.sparse as boolean,
  };
}

/** The bytes an owner object is stored as: pretty JSON, for operators' cat and jq. */
export function encodeOwner(record: OwnerRecord): Uint8Array {
  return new TextEncoder().encode(JSON.stringify(record, null, 2) + "\n");
}

/**
 * The volume's owner object and its etag, or undefined when there is none.
 * @throws {CsiError} FAILED_PRECONDITION when it cannot be read (it is never overwritten then)
 * @throws {StoreError} when the store fails
 */
export async function readOwner(
  store: Store,
  volumeKey: string,
  options?: RequestOptions,
): Promise<Holding | undefined> {
  const key = ownerKey(volumeKey);
  const got = await store.getBytes(key, options);
  if (!got) return undefined;
  try {
    return { record: parseOwner(got.bytes), etag: got.etag };
  } catch (err) {
    throw new CsiError(
      Code.FAILED_PRECONDITION,
      `"${key}" in ${store.description} cannot be read (${(err as Error).message}); it is ` +
        `left as it is: repair or remove it`,
      { cause: err },
    );
  }
}

/** What a new follow volume's owner object starts with. */
export interface NewOwner {
  readonly volume: string;
  readonly uid: string;
  readonly ttlSeconds: number;
  readonly settings: FollowSettings;
  /** The standby nodes (none when empty or absent). */
  readonly standbys?: readonly string[];
  /** The head a volume made from a stored snapshot starts at (seed.ts); none otherwise. */
  readonly head?: NewHead;
  readonly nowMs: number;
}

/**
 * Creates the owner object, released and without a head unless one is given (If-None-Match). When one exists
 * already it is returned as it is: the caller decides whether it is the same volume.
 * @throws {StoreError} when the store fails
 */
export async function createOwner(
  store: Store,
  volumeKey: string,
  init: NewOwner,
): Promise<{ holding: Holding; created: boolean }> {
  const record: OwnerRecord = {
    format: 1,
    volume: init.volume,
    uid: init.uid,
    holder: null,
    generation: 0,
    state: "released",
    head: init.head?.guid ?? null,
    headAt: init.head?.createdAt ?? null,
    renewedAt: new Date(init.nowMs).toISOString(),
    ttlSeconds: init.ttlSeconds,
    ...(init.standbys && init.standbys.length > 0 ? { standbys: [...init.standbys] } : {}),
    settings: init.settings,
  };
  for (let attempt = 1;; attempt++) {
    try {
      const put = await store.putBytes(ownerKey(volumeKey), encodeOwner(record), {
        ifNoneMatch: "*",
      });
      return { holding: { record, etag: put.etag }, created: true };
    } catch (err) {
      if (!(err instanceof StoreError && err.kind === "precondition_failed")) throw err;
      const existing = await readOwner(store, volumeKey);
      // Removed between the two requests: try again.
      if (existing) return { holding: existing, created: false };
      if (attempt >= ATTEMPTS) throw err;
    }
  }
}

/** How {@linkcode acquire} decides about a volume another node holds. */
export interface AcquireOptions {
  readonly node: string;
  readonly nowMs: number;
  /** The lease this node promises to renew within. */
  readonly ttlSeconds: number;
  /** Whether this node fences itself when it cannot renew in time (see {@linkcode HolderTerms}). */
  readonly selfFence?: boolean;
  /**
   * Whether the volume may be taken from its current holder (see rule.ts): called with the
   * record and etag read; a refusal's message is the error's. Never called for a record this
   * node holds or one that is released.
   */
  readonly mayTakeOver: (current: Holding) => { ok: true } | { ok: false; message: string };
}

/**
 * Makes this node the holder: a released volume (or one the takeover rule lets it take) is
 * written held by this node with the generation bumped; a volume this node already holds is
 * renewed and returned with its generation unchanged (a repeated stage, a restarted plugin).
 * @throws {HeldElsewhereError} FAILED_PRECONDITION when another node holds it and may not be
 *   taken over yet
 * @throws {CsiError} NOT_FOUND when the volume has no owner object; FAILED_PRECONDITION when
 *   it was deleted
 * @throws {StoreError} when the store fails
 */
export async function acquire(
  store: Store,
  volumeKey: string,
  opts: AcquireOptions,
): Promise<{ holding: Holding; acquired: boolean; previous: OwnerRecord }> {
  for (let attempt = 1;; attempt++) {
    const current = await readOwner(store, volumeKey);
    if (!current) {
      throw new CsiError(
        Code.NOT_FOUND,
        `Volume "${volumeKey}" follows its job, but ${store.description} has no owner object ` +
          `for it ("${ownerKey(volumeKey)}"): create it with nomad volume create`,
      );
    }
    const r = current.record;
    if (r.state === "deleted") {
      throw new CsiError(
        Code.FAILED_PRECONDITION,
        `Volume "${r.volume}" was deleted; its data stays in ${store.description} until the ` +
          `store's retention ends`,
      );
    }
    const mine = r.state === "held" && r.holder === opts.node;
    if (r.state === "held" && !mine) {
      const verdict = opts.mayTakeOver(current);
      if (!verdict.ok) throw new HeldElsewhereError(verdict.message, r, current.etag);
    }
    const { releasedBy: _, ...rest } = r;
    const next: OwnerRecord = withTerms({
      ...rest,
      holder: opts.node,
      generation: mine ? r.generation : r.generation + 1,
      state: "held",
      renewedAt: new Date(opts.nowMs).toISOString(),
    }, { ttlSeconds: opts.ttlSeconds, selfFence: opts.selfFence === true });
    try {
      const put = await store.putBytes(ownerKey(volumeKey), encodeOwner(next), {
        ifMatch: current.etag,
      });
      return { holding: { record: next, etag: put.etag }, acquired: !mine, previous: r };
    } catch (err) {
      if (!(err instanceof StoreError && err.kind === "precondition_failed")) throw err;
      // Another node won this round: read again and judge what it wrote.
      if (attempt >= ATTEMPTS) throw lostRaces(store, volumeKey, err);
    }
  }
}

function lostRaces(store: Store, volumeKey: string, cause: unknown): StoreError {
  return new StoreError(
    "unavailable",
    `"${ownerKey(volumeKey)}" in ${store.description} kept changing; trying again later`,
    { cause },
  );
}

/**
 * Changes what this node holds with If-Match on its last write. A precondition failure means
 * someone else wrote the object: the record is read again, and unless it is still this node's
 * holding of the same generation (then the change is made on it), the node was fenced.
 * @throws {FencedError} when another node holds it now, or it was released or deleted meanwhile
 * @throws {StoreError} when the store fails
 */
async function change(
  store: Store,
  volumeKey: string,
  held: Holding,
  edit: (r: OwnerRecord) => OwnerRecord,
  options?: RequestOptions,
): Promise<Holding> {
  let base = held;
  for (let attempt = 1;; attempt++) {
    // A change given up (a renewal's time limit) sends nothing more.
    options?.signal?.throwIfAborted();
    const next = edit(base.record);
    try {
      const put = await store.putBytes(ownerKey(volumeKey), encodeOwner(next), {
        ifMatch: base.etag,
      }, options);
      return { record: next, etag: put.etag };
    } catch (err) {
      if (!(err instanceof StoreError && err.kind === "precondition_failed")) throw err;
      const now = await readOwner(store, volumeKey, options);
      const r = now?.record;
      if (
        !now || !r || r.state !== "held" || r.holder !== held.record.holder ||
        r.generation !== held.record.generation
      ) {
        throw new FencedError(
          `Volume "${held.record.volume}" is no longer held by node "${held.record.holder}" ` +
            `under generation ${held.record.generation}: ${describeOwner(r)}`,
          r,
        );
      }
      if (attempt >= ATTEMPTS) throw lostRaces(store, volumeKey, err);
      base = now;
    }
  }
}

/**
 * Renews the lease (a new renewedAt, hence a new etag that takers see change), with `terms`
 * written in when given (a holder restarted with another `--lease-ttl` or `--takeover-after`
 * promises what it keeps now).
 * `options` (a signal) go with each of its requests.
 * @throws {FencedError} when the volume was taken over; StoreError when the store fails
 */
export function renew(
  store: Store,
  volumeKey: string,
  held: Holding,
  nowMs: number,
  terms?: HolderTerms,
  options?: RequestOptions,
): Promise<Holding> {
  return change(store, volumeKey, held, (r) =>
    withTerms({
      ...r,
      renewedAt: new Date(nowMs).toISOString(),
    }, terms), options);
}

/** A stored snapshot that becomes the head. */
export interface NewHead {
  readonly guid: string;
  /** When it was taken (ISO 8601). */
  readonly createdAt: string;
}

/**
 * Moves `head` to a snapshot this node just stored (and renews, with `terms` as renew).
 * @throws {FencedError} when the volume was taken over: the snapshot never becomes the head
 * @throws {StoreError} when the store fails
 */
export function moveHead(
  store: Store,
  volumeKey: string,
  held: Holding,
  head: NewHead,
  nowMs: number,
  terms?: HolderTerms,
): Promise<Holding> {
  if (!GUID.test(head.guid)) throw new TypeError(`"${head.guid}" is not a ZFS guid`);
  return change(store, volumeKey, held, (r) =>
    withTerms({
      ...r,
      head: head.guid,
      headAt: head.createdAt,
      renewedAt: new Date(nowMs).toISOString(),
    }, terms));
}

/**
 * Releases the volume, moving `head` to its final snapshot in the same write, so that the next
 * holder receives exactly what this node left.
 * @throws {FencedError} when the volume was taken over meanwhile; StoreError when the store fails
 */
export function release(
  store: Store,
  volumeKey: string,
  held: Holding,
  head: NewHead | undefined,
  nowMs: number,
): Promise<Holding> {
  return change(store, volumeKey, held, (r) => ({
    ...r,
    state: "released",
    ...(head ? { head: head.guid, headAt: head.createdAt } : {}),
    renewedAt: new Date(nowMs).toISOString(),
  }));
}

/**
 * The owner record after an operator's takeover of `r` by `by` at `nowMs`: released in the
 * next generation (so the old holder is fenced), naming who took it from whom.
 */
export function takenOver(r: OwnerRecord, opts: { by: string; nowMs: number }): OwnerRecord {
  return {
    ...r,
    state: "released",
    generation: r.generation + 1,
    renewedAt: new Date(opts.nowMs).toISOString(),
    releasedBy: `takeover by ${opts.by} from node "${r.holder}"`,
  };
}

/**
 * Releases the volume on behalf of its holder, which is gone (an operator's explicit takeover):
 * the generation is bumped, so the old holder, should it come back, is fenced on its next
 * write and its copy is stale. `head` stays: the next holder receives the last copy the store
 * has. A released volume is left as it is.
 * @returns the record before, and after
 * @throws {CsiError} NOT_FOUND when there is no owner object
 * @throws {StoreError} when the store fails
 */
export async function forceRelease(
  store: Store,
  volumeKey: string,
  opts: { by: string; nowMs: number },
): Promise<{ before: OwnerRecord; after: OwnerRecord }> {
  for (let attempt = 1;; attempt++) {
    const current = await readOwner(store, volumeKey);
    if (!current) {
      throw new CsiError(
        Code.NOT_FOUND,
        `${store.description} has no follow volume "${volumeKey}" ("${ownerKey(volumeKey)}")`,
      );
    }
    const r = current.record;
    if (r.state !== "held") return { before: r, after: r };
    const next = takenOver(r, opts);
    try {
      await store.putBytes(ownerKey(volumeKey), encodeOwner(next), { ifMatch: current.etag });
      return { before: r, after: next };
    } catch (err) {
      if (!(err instanceof StoreError && err.kind === "precondition_failed")) throw err;
      if (attempt >= ATTEMPTS) throw lostRaces(store, volumeKey, err);
    }
  }
}

/**
 * Marks the volume deleted, only while no node holds it.
 * @throws {CsiError} FAILED_PRECONDITION naming the holder when it is held
 * @throws {StoreError} when the store fails
 */
export async function markDeleted(
  store: Store,
  volumeKey: string,
  nowMs: number,
): Promise<OwnerRecord | undefined> {
  for (let attempt = 1;; attempt++) {
    const current = await readOwner(store, volumeKey);
    if (!current) return undefined;
    const r = current.record;
    if (r.state === "deleted") return r;
    if (r.state === "held") {
      throw new CsiError(
        Code.FAILED_PRECONDITION,
        `Volume "${r.volume}" is in use: ${describeOwner(r)}; stop the job using it first`,
      );
    }
    const next: OwnerRecord = { ...r, state: "deleted", renewedAt: new Date(nowMs).toISOString() };
    try {
      await store.putBytes(ownerKey(volumeKey), encodeOwner(next), { ifMatch: current.etag });
      return next;
    } catch (err) {
      if (!(err instanceof StoreError && err.kind === "precondition_failed")) throw err;
      if (attempt >= ATTEMPTS) throw lostRaces(store, volumeKey, err);
    }
  }
}

/** The record in words, for messages: who holds it, since when, which generation. */
export function describeOwner(r: OwnerRecord | undefined): string {
  if (!r) return "its owner object is gone";
  const who = r.holder === null ? "no node" : `node "${r.holder}"`;
  switch (r.state) {
    case "held":
      return `held by ${who} (generation ${r.generation}, last renewed at ${r.renewedAt} by ` +
        `that node's clock)`;
    case "released":
      return `released by ${who} at ${r.renewedAt} (generation ${r.generation}` +
        `${r.releasedBy ? `, ${r.releasedBy}` : ""})`;
    case "deleted":
      return `deleted at ${r.renewedAt}`;
  }
}
