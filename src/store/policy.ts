/**
 * How much history a volume keeps in the store, and when a backup starts a new full stream.
 * Pure.
 *
 * Which snapshot is newer is decided by the chains and their sequence numbers
 * (src/store/chain.ts oldestFirst), never by comparing the `createdAt` of two nodes: a node
 * whose clock is behind, or stepped back, stores backups that are newer than the ones before
 * them all the same. Whatever the policy, and whatever any clock says, the newest snapshot and
 * the snapshots the caller protects (the one a backup just stored, the head's chain of a volume
 * that follows its job) are kept, with every base they need.
 *
 * Retention is count-based, per bucket that has a snapshot: `hourly=24` keeps the newest
 * snapshot of each of the 24 most recent hours (UTC) that have one, not of the 24 hours before
 * now, so a volume whose node was down for a week still keeps its history instead of shrinking
 * to one snapshot. The rules add up (a snapshot kept by one rule counts for the others too).
 * The buckets are the one place a clock counts: a snapshot's hour, day and week are those of
 * its `createdAt` (the sending node's clock). They only choose which older snapshots to keep
 * besides the ones above: going from the newest backwards in chain order, the first snapshot
 * met in each bucket is kept, until as many buckets as the policy names were met. A skewed
 * clock thus shifts which older snapshots stay, never what must stay.
 *
 * Why new full streams: an incremental needs its base, and that base its own, back to the full
 * stream; pruning keeps every base a kept snapshot needs, so a chain can only be dropped from
 * its oldest end once no kept snapshot lies on it. Were every backup an incremental of the one
 * before, the newest snapshot (always kept) would keep the whole history alive and the store
 * would never shrink. {@linkcode needsFull} starts a new chain when the current one reaches
 * {@linkcode DEFAULT_MAX_CHAIN} streams or its full stream is older than
 * {@linkcode DEFAULT_MAX_CHAIN_AGE_MS} (by this node's clock against the full stream's
 * `createdAt`: a clock that is off only makes the new chain come earlier or later). The
 * trade-off: each full stream moves and stores the whole volume again; longer chains cost less
 * upload but keep more old data in the store and make a restore read (and check) more streams.
 */

import { depths, oldestFirst } from "./chain.ts";
import type { KeepPolicy, SnapshotManifest } from "./layout.ts";

const KEEP_KEYS = ["last", "hourly", "daily", "weekly"] as const;
/** The most of any one kind a policy may keep (a typo such as 1000000 is refused). */
export const MAX_KEEP = 100_000;

/**
 * Reads a keep policy such as `last=4,hourly=24,daily=14,weekly=8`. Kinds not named keep
 * none; at least one must keep some.
 * @throws {SyntaxError} for an unknown or repeated kind, a count that is not a non-negative
 *   integer, or a policy that keeps nothing
 */
export function parseKeepPolicy(text: string): KeepPolicy {
  const counts: Record<string, number> = { last: 0, hourly: 0, daily: 0, weekly: 0 };
  const seen = new Set<string>();
  const want = `"kind=count" pairs separated by "," with kinds ${KEEP_KEYS.join(", ")}`;
  if (text.trim() === "") throw new SyntaxError(`Keep policy is empty: give ${want}`);
  for (const part of text.split(",")) {
    const m = /^\s*([a-z]+)\s*=\s*(\S*)\s*$/.exec(part);
    if (!m) throw new SyntaxError(`Keep policy "${text}": "${part}" is not "kind=count"`);
    const [, key, value] = m as unknown as [string, string, string];
    if (!(KEEP_KEYS as readonly string[]).includes(key)) {
      throw new SyntaxError(`Keep policy "${text}": unknown kind "${key}" (use ${want})`);
    }
    if (seen.has(key)) throw new SyntaxError(`Keep policy "${text}": "${key}" is given twice`);
    seen.add(key);
    if (!/^\d+$/.test(value) || Number(value) > MAX_KEEP) {
      throw new SyntaxError(
        `Keep policy "${text}": ${key} must be a whole number from 0 to ${MAX_KEEP}, ` +
          `got "${value}"`,
      );
    }
    counts[key] = Number(value);
  }
  const policy: KeepPolicy = {
    last: counts.last!,
    hourly: counts.hourly!,
    daily: counts.daily!,
    weekly: counts.weekly!,
  };
  if (KEEP_KEYS.every((k) => policy[k] === 0)) {
    throw new SyntaxError(`Keep policy "${text}" keeps nothing: at least one count must be > 0`);
  }
  return policy;
}

/** A keep policy as {@linkcode parseKeepPolicy} reads it, every kind named. */
export function formatKeepPolicy(policy: KeepPolicy): string {
  return KEEP_KEYS.map((k) => `${k}=${policy[k]}`).join(",");
}

const UNIT_SECONDS: Readonly<Record<string, number>> = { s: 1, m: 60, h: 3600, d: 86400 };
/** The longest interval accepted: a year. */
export const MAX_INTERVAL_SECONDS = 366 * 86400;

/**
 * Reads a backup interval: plain seconds (`900`), or numbers with units s, m, h, d (`15m`,
 * `1h30m`, `900s`). `0` means no scheduled backups.
 * @returns seconds
 * @throws {SyntaxError} for anything else, or more than a year
 */
export function parseInterval(text: string): number {
  const t = text.trim();
  let seconds: number;
  if (/^\d+$/.test(t)) {
    seconds = Number(t);
  } else if (/^(?:\d+[smhd])+$/.test(t)) {
    seconds = 0;
    for (const [, n, unit] of t.matchAll(/(\d+)([smhd])/g)) {
      seconds += Number(n) * UNIT_SECONDS[unit!]!;
    }
  } else {
    throw new SyntaxError(
      `Backup interval "${text}" is not valid: give seconds ("900") or a duration such as ` +
        `"15m", "1h", "1d" ("0" turns scheduled backups off)`,
    );
  }
  if (!Number.isSafeInteger(seconds) || seconds > MAX_INTERVAL_SECONDS) {
    throw new SyntaxError(`Backup interval "${text}" is longer than a year`);
  }
  return seconds;
}

const HOUR_MS = 3_600_000;
const DAY_MS = 86_400_000;

/** Bucket numbers (UTC): hours, days, and ISO weeks (Monday to Sunday) since the epoch. */
const BUCKETS: ReadonlyArray<readonly ["hourly" | "daily" | "weekly", (ms: number) => number]> = [
  ["hourly", (ms) => Math.floor(ms / HOUR_MS)],
  ["daily", (ms) => Math.floor(ms / DAY_MS)],
  // 1970-01-01 was a Thursday: three days later a Monday starts week 1.
  ["weekly", (ms) => Math.floor((Math.floor(ms / DAY_MS) + 3) / 7)],
];

/** Options of {@linkcode retained}. */
export interface RetainOptions {
  /**
   * Guids kept whatever the policy says, with every base they need: the snapshot a backup just
   * stored, the head's chain of a volume that follows its job. Guids not among the manifests
   * are ignored.
   */
  readonly protect?: Iterable<string>;
}

/**
 * The guids the policy keeps among one volume's manifests: always the newest of all (chain
 * order, see the module doc) and every guid in `options.protect`; the newest `last`; the
 * newest of each of the most recent hourly, daily and weekly buckets that have one (see the
 * module doc); every snapshot of kind "requested" (a user asked for it: only DeleteSnapshot
 * removes it); every snapshot whose chain is already broken (not counted; for the operator to
 * look at: the plugin never deletes what it cannot judge); then every base a kept snapshot
 * needs.
 */
export function retained(
  manifests: readonly SnapshotManifest[],
  policy: KeepPolicy,
  options: RetainOptions = {},
): Set<string> {
  const byGuid = new Map(manifests.map((m) => [m.guid, m]));
  const complete = completeChains(manifests);
  const newestFirst = oldestFirst(manifests).reverse();
  const counted = newestFirst.filter((m) => complete.has(m.guid));
  const kept = new Set<string>();
  const newest = newestFirst[0];
  if (newest) kept.add(newest.guid);
  for (const guid of options.protect ?? []) if (byGuid.has(guid)) kept.add(guid);
  for (const m of counted.slice(0, policy.last)) kept.add(m.guid);
  for (const [kind, bucketOf] of BUCKETS) {
    const buckets = new Set<number>();
    for (const m of counted) {
      if (buckets.size >= policy[kind]) break;
      const b = bucketOf(Date.parse(m.createdAt));
      if (buckets.has(b)) continue;
      buckets.add(b);
      kept.add(m.guid);
    }
  }
  for (const m of manifests) {
    if (m.kind === "requested" || !complete.has(m.guid)) kept.add(m.guid);
  }
  const todo = [...kept];
  for (let guid = todo.pop(); guid !== undefined; guid = todo.pop()) {
    const base = byGuid.get(guid)?.baseGuid;
    if (base != null && byGuid.has(base) && !kept.has(base)) {
      kept.add(base);
      todo.push(base);
    }
  }
  return kept;
}

/** The guids whose chain reaches a full stream within the set. */
function completeChains(manifests: readonly SnapshotManifest[]): Set<string> {
  const byGuid = new Map(manifests.map((m) => [m.guid, m]));
  const ok = new Set<string>();
  const bad = new Set<string>();
  for (const start of manifests) {
    const path: string[] = [];
    let m: SnapshotManifest | undefined = start;
    let good = false;
    while (m) {
      if (ok.has(m.guid)) {
        good = true;
        break;
      }
      if (bad.has(m.guid) || path.includes(m.guid)) break;
      path.push(m.guid);
      if (m.baseGuid === null) {
        good = true;
        break;
      }
      m = byGuid.get(m.baseGuid);
    }
    for (const g of path) (good ? ok : bad).add(g);
  }
  return ok;
}

/**
 * What to delete, in an order that never leaves a manifest whose base is gone: every manifest
 * not in `kept`, each one after all those based on it (leaves first).
 * @throws {Error} when a kept manifest's base is not kept (a bug in the caller)
 */
export function pruneOrder(
  manifests: readonly SnapshotManifest[],
  kept: ReadonlySet<string>,
): SnapshotManifest[] {
  const doomed = manifests.filter((m) => !kept.has(m.guid));
  const doomedGuids = new Set(doomed.map((m) => m.guid));
  for (const m of manifests) {
    if (kept.has(m.guid) && m.baseGuid !== null && doomedGuids.has(m.baseGuid)) {
      throw new Error(`Cannot prune ${m.baseGuid}: kept snapshot ${m.guid} is based on it`);
    }
  }
  // A manifest is one deeper than its base, so deepest first is leaves first.
  const depth = depths(manifests);
  const newestFirst = oldestFirst(doomed).reverse();
  const rank = new Map(newestFirst.map((m, i) => [m.guid, i]));
  return newestFirst.sort((a, b) =>
    depth.get(b.guid)! - depth.get(a.guid)! || rank.get(a.guid)! - rank.get(b.guid)!
  );
}

/** Most streams in one chain before a new full stream (at 15-minute backups, 12 hours). */
export const DEFAULT_MAX_CHAIN = 48;
/** Oldest a chain's full stream may be before a new full stream: 7 days. */
export const DEFAULT_MAX_CHAIN_AGE_MS = 7 * DAY_MS;

/** Options of {@linkcode needsFull}. */
export interface NeedsFullOptions {
  /** Now, in milliseconds since the epoch. */
  readonly nowMs: number;
  /** Longest chain to extend ({@linkcode DEFAULT_MAX_CHAIN}). */
  readonly maxLength?: number;
  /** Oldest full stream to extend from ({@linkcode DEFAULT_MAX_CHAIN_AGE_MS}). */
  readonly maxAgeMs?: number;
}

/**
 * Whether the next backup should be a full stream rather than an incremental on `chain` (as
 * {@linkcode chainTo} returns it, full first): when there is no chain, it already has
 * `maxLength` streams, or its full stream is `maxAgeMs` old. See the module doc for why.
 */
export function needsFull(chain: readonly SnapshotManifest[], opts: NeedsFullOptions): boolean {
  const full = chain[0];
  if (!full || full.baseGuid !== null) return true;
  if (chain.length >= (opts.maxLength ?? DEFAULT_MAX_CHAIN)) return true;
  return opts.nowMs - Date.parse(full.createdAt) >= (opts.maxAgeMs ?? DEFAULT_MAX_CHAIN_AGE_MS);
}
