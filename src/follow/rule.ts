/**
 * The takeover rule: when a node may take a follow volume from a holder that stopped renewing.
 * Wall clocks of different nodes are never compared: the taker watches the owner object itself
 * and counts, on its own monotonic clock, how long the object has stayed exactly as it was (the
 * same etag). A holder that renews changes the etag at least every TTL, so an object unchanged
 * for TTL + `--takeover-after` means the holder is gone, or cut off from the store: then only a
 * holder that promised to fence itself (`selfFence` in the owner object, written by a node that
 * runs with `--takeover-after`) has made its copy read-only by then (lease.ts SelfFence), and
 * only such a holder's volume is taken over by the rule. With `--takeover-after` off, or a
 * holder that did not promise, only an explicit takeover (takeover.ts) releases a lost
 * holder's volume.
 */

import type { Holding } from "./owner.ts";

/** When this node first saw an owner object with a given etag. */
interface Sighting {
  readonly etag: string;
  /** Monotonic ms at first sight. */
  readonly since: number;
}

/**
 * Remembers, per volume, since when the owner object has been seen unchanged. Entries are
 * replaced when the etag changes and dropped by {@linkcode forget}.
 */
export class LeaseObserver {
  readonly #seen = new Map<string, Sighting>();
  readonly #mono: () => number;

  /** @param monotonic ms by a clock that never jumps (default `performance.now()`) */
  constructor(monotonic: () => number = () => performance.now()) {
    this.#mono = monotonic;
  }

  /** Records a sighting; returns how long (ms) the object has been seen with this etag. */
  observe(volumeKey: string, etag: string): number {
    const now = this.#mono();
    const seen = this.#seen.get(volumeKey);
    if (seen?.etag === etag) return now - seen.since;
    this.#seen.set(volumeKey, { etag, since: now });
    return 0;
  }

  /** Forgets a volume (once it was acquired or released). */
  forget(volumeKey: string): void {
    this.#seen.delete(volumeKey);
  }
}

/** The operator's rule. */
export interface TakeoverRule {
  /** How long after the lease's TTL a silent holder's volume may be taken; undefined: never. */
  readonly takeoverAfterMs?: number;
}

/** The verdict on one attempt to take a held volume. */
export type Verdict = { ok: true } | { ok: false; message: string };

/**
 * Judges a volume another node holds: allowed once the object has been seen unchanged for its
 * TTL plus the rule's wait, and only when its holder promised to fence itself; otherwise a
 * message naming the holder, when it last renewed (by its clock, and how long it has looked
 * silent from here), how old the last copy in the store is, and what will allow the takeover.
 */
export function judgeTakeover(
  current: Holding,
  opts: {
    readonly volumeKey: string;
    readonly observer: LeaseObserver;
    readonly rule: TakeoverRule;
    /** Wall clock now, only to say how old the store's last copy is. */
    readonly nowMs: number;
  },
): Verdict {
  const r = current.record;
  const unchangedMs = opts.observer.observe(opts.volumeKey, current.etag);
  // A holder that does not fence itself may still write to its copy whenever it is taken.
  const byRule = opts.rule.takeoverAfterMs !== undefined && r.selfFence === true;
  const needMs = opts.rule.takeoverAfterMs === undefined
    ? undefined
    : r.ttlSeconds * 1000 + opts.rule.takeoverAfterMs;
  if (byRule && needMs !== undefined && unchangedMs >= needMs) return { ok: true };
  const copy = r.head === null
    ? "the store holds no copy of it yet"
    : `the last copy in the store is from ${r.headAt ?? "an unknown time"}` +
      (r.headAt ? ` (${ageText(opts.nowMs - Date.parse(r.headAt))} old)` : "");
  const when = needMs === undefined
    ? `It is taken over only explicitly: if node "${r.holder}" is lost, run ` +
      `"zfs-csi takeover ${r.volume}" (it then loses what it wrote after that copy)`
    : !byRule
    ? `Node "${r.holder}" runs without --takeover-after and does not fence itself: take it ` +
      `over explicitly with "zfs-csi takeover ${r.volume}" once it is gone (it then loses what ` +
      `it wrote after that copy)`
    : `It may be taken over once its lease has been unchanged for ${
      ageText(needMs)
    } as seen from this node (the holder's TTL ${r.ttlSeconds}s plus --takeover-after), ` +
      `in ${ageText(needMs - unchangedMs)}; or at once with "zfs-csi takeover ${r.volume}"`;
  return {
    ok: false,
    message: `Volume "${r.volume}" is held by node "${r.holder}" (generation ` +
      `${r.generation}), which last renewed its lease at ${r.renewedAt} by its own clock; ` +
      `this node has seen the lease unchanged for ${ageText(unchangedMs)}; ${copy}. ${when}`,
  };
}

/** A duration for people: "42s", "3m05s", "2h10m". */
export function ageText(ms: number): string {
  const s = Math.max(0, Math.round(ms / 1000));
  if (s < 60) return `${s}s`;
  if (s < 3600) return `${Math.floor(s / 60)}m${String(s % 60).padStart(2, "0")}s`;
  return `${Math.floor(s / 3600)}h${String(Math.floor(s / 60) % 60).padStart(2, "0")}m`;
}
