/**
 * The explicit takeover, for `zfs-csi takeover <volume>`: an operator who knows a holder is
 * lost (its node is gone, or will be wiped) releases the volume on its behalf, so that the next
 * NodeStage on any node takes it over from the store's head, at once, whatever
 * `--takeover-after` says. The old holder is fenced: its next write to the store is refused,
 * and its copy, should it come back, is set aside there and never published.
 *
 * It can lose data (what the holder wrote after the store's head), so it is planned first
 * ({@linkcode planTakeover}) and acts only on that plan ({@linkcode takeover}). The plan watches
 * the owner object for a few seconds on this node's monotonic clock, as the takeover rule does
 * (rule.ts): a holder that is alive renews every TTL/3 and changes the etag, so a watch shorter
 * than that is itself a reason to refuse. The holder's
 * `renewedAt` is its own wall clock; it is compared with this node's clock only to refuse (a
 * stamp younger than the TTL by this node's clock: the holder may be alive, or the clocks
 * disagree), never to allow: acting needs the watch to have seen the object unchanged too.
 */

import { Code, CsiError } from "../errors.ts";
import { ownerKey } from "../store/layout.ts";
import { type Store, StoreError } from "../store/store.ts";
import { encodeComponent } from "../zfs/names.ts";
import { encodeOwner, type Holding, type OwnerRecord, readOwner, takenOver } from "./owner.ts";
import { ageText } from "./rule.ts";

/** Why a takeover would be refused without `--force`. */
export type FreshReason =
  /** The owner object changed while it was watched: the holder renews it. */
  | "changed"
  /** The holder's own stamp is younger than its TTL by this node's clock. */
  | "stamp"
  /** The holder is the node this runs on (its --node-id). */
  | "here"
  /** The store holds no copy: the next stage starts empty. */
  | "no-copy"
  /** Watched for less than the holder renews within: a live holder may not have shown. */
  | "short-watch";

/** What a takeover of a volume would do, as watched from this node. */
export interface TakeoverPlan {
  readonly volume: string;
  /** The owner object's key and the store, for the operator. */
  readonly key: string;
  readonly store: string;
  /** The record and etag as last seen. */
  readonly seen: Holding;
  /** How long the object was watched (this node's monotonic clock), and whether it changed. */
  readonly watchedMs: number;
  readonly changed: boolean;
  /** This node's wall clock minus the holder's `renewedAt` (its clock): clocks may differ. */
  readonly stampAgeMs: number;
  /** This node's wall clock minus `headAt` (the holder's clock), when there is a head. */
  readonly headAgeMs?: number;
  /**
   * `renewedAt - headAt`, both by the holder's clock: the holder was alive at least this long
   * after the store's last copy, and may have written in that time.
   */
  readonly aliveAfterHeadMs?: number;
  /** Why it is refused without `--force`; empty when a takeover may go ahead. */
  readonly refusals: readonly FreshReason[];
}

/** How {@linkcode planTakeover} watches. */
export interface WatchOptions {
  /** The node this runs on (--node-id). */
  readonly node: string;
  /** How long to watch the owner object; default {@linkcode defaultWatchMs} of its TTL. */
  readonly watchMs?: number;
  /** Time between two reads while watching (default 1 s). */
  readonly pollMs?: number;
  /** Wall clock, ms since the epoch: only to say how old stamps look from here. */
  readonly now?: () => number;
  /** A clock that never jumps, in ms (default `performance.now()`). */
  readonly monotonic?: () => number;
  /** Waits `ms` (default a timer); replaceable in tests. */
  readonly sleep?: (ms: number) => Promise<void>;
  /** Called once before watching, with how long it will watch. */
  readonly onWatch?: (ms: number) => void;
}

/** Least watch that can see a live holder renew: it renews every TTL/3; 1 s more for the read. */
export function renewalWatchMs(ttlSeconds: number): number {
  return Math.ceil((ttlSeconds * 1000) / 3) + 1000;
}

/**
 * How long to watch a lease of `ttlSeconds` by default: TTL + 1 s, which sees a live holder
 * renew (every TTL/3) and lets its stamp age past the TTL, but at most 15 s, and never less
 * than one renewal period.
 */
export function defaultWatchMs(ttlSeconds: number): number {
  return Math.max(Math.min((ttlSeconds + 1) * 1000, 15_000), renewalWatchMs(ttlSeconds));
}

function notFollow(store: Store, name: string, key: string): CsiError {
  return new CsiError(
    Code.NOT_FOUND,
    `${store.description} has no follow volume "${name}" ("${key}"): takeover is for volumes ` +
      `that follow their job`,
  );
}

/**
 * Reads the owner object of volume `name` (its CSI name) and, while a node holds it, watches it
 * for `watchMs`, stopping early once it changes.
 * @throws {CsiError} NOT_FOUND when the store has no such follow volume
 * @throws {StoreError} when the store fails
 */
export async function planTakeover(
  store: Store,
  name: string,
  opts: WatchOptions,
): Promise<TakeoverPlan> {
  const volumeKey = encodeComponent("Volume name", name);
  const key = ownerKey(volumeKey);
  const mono = opts.monotonic ?? (() => performance.now());
  const now = opts.now ?? Date.now;
  const sleep = opts.sleep ?? ((ms: number) => new Promise<void>((r) => setTimeout(r, ms)));
  const first = await readOwner(store, volumeKey);
  if (!first) throw notFollow(store, name, key);
  let seen = first;
  let changed = false;
  const started = mono();
  if (first.record.state === "held") {
    const watchMs = opts.watchMs ?? defaultWatchMs(first.record.ttlSeconds);
    opts.onWatch?.(watchMs);
    while (mono() - started < watchMs) {
      await sleep(Math.min(opts.pollMs ?? 1000, Math.max(0, watchMs - (mono() - started))));
      const again = await readOwner(store, volumeKey);
      if (!again) throw notFollow(store, name, key);
      if (again.etag !== seen.etag) {
        changed = true;
        seen = again;
        break;
      }
    }
  }
  const watchedMs = mono() - started;
  const r = seen.record;
  const nowMs = now();
  const stampAgeMs = nowMs - Date.parse(r.renewedAt);
  const headMs = r.headAt === null ? NaN : Date.parse(r.headAt);
  const refusals: FreshReason[] = [];
  if (r.state === "held") {
    if (changed) refusals.push("changed");
    // A stamp that does not read counts as fresh: refusing is the safe side.
    if (!(stampAgeMs >= r.ttlSeconds * 1000)) refusals.push("stamp");
    if (r.holder === opts.node) refusals.push("here");
    if (r.head === null) refusals.push("no-copy");
    if (!changed && watchedMs < renewalWatchMs(r.ttlSeconds)) refusals.push("short-watch");
  }
  return {
    volume: r.volume,
    key,
    store: store.description,
    seen,
    watchedMs,
    changed,
    stampAgeMs,
    ...(Number.isFinite(headMs)
      ? { headAgeMs: nowMs - headMs, aliveAfterHeadMs: Date.parse(r.renewedAt) - headMs }
      : {}),
    refusals,
  };
}

/** Why a fresh lease is refused, in words. */
export function refusalText(plan: TakeoverPlan, reason: FreshReason): string {
  const r = plan.seen.record;
  switch (reason) {
    case "changed":
      return `the owner object changed while it was watched: node "${r.holder}" renews its lease`;
    case "stamp":
      return `node "${r.holder}" renewed it ${ageText(plan.stampAgeMs)} ago (its stamp against ` +
        `this node's clock), within its TTL of ${r.ttlSeconds}s: it may be alive, or the two ` +
        `clocks disagree`;
    case "here":
      return `node "${r.holder}" is this node (--node-id): the volume is held here, not lost`;
    case "no-copy":
      return `the store holds no copy of it: the next stage would start it EMPTY`;
    case "short-watch":
      return `it was watched for ${ageText(plan.watchedMs)} only, less than the ` +
        `${ageText(renewalWatchMs(r.ttlSeconds))} a live holder renews within (--watch)`;
  }
}

/** The plan in lines for people: holder, lease, head, what would be lost, the verdict. */
export function planLines(plan: TakeoverPlan): string[] {
  const r = plan.seen.record;
  const lines = [`Volume "${plan.volume}" (${plan.key} in ${plan.store}):`];
  if (r.state !== "held") {
    lines.push(
      `  state         ${r.state === "deleted" ? "deleted" : "released"}, held by no node`,
    );
    return lines;
  }
  const holder = `node "${r.holder}"`;
  lines.push(
    `  holder        ${holder}, generation ${r.generation}`,
    `  lease         renewed at ${r.renewedAt} by the holder's clock, TTL ${r.ttlSeconds}s ` +
      `(renewed every ${ageText((r.ttlSeconds * 1000) / 3)}); that stamp is ` +
      `${ageText(plan.stampAgeMs)} old by this node's clock (clocks may differ)`,
    `  watched       ${ageText(plan.watchedMs)} from this node: ` +
      (plan.changed ? "it CHANGED (the holder is renewing it)" : "unchanged"),
  );
  if (r.head === null) {
    lines.push(
      "  store's copy  none: the store holds no copy of this volume",
      `  would lose    everything ${holder} holds: the next stage starts the volume empty`,
    );
  } else {
    lines.push(
      `  store's copy  taken at ${r.headAt ?? "an unknown time"} by the holder's clock` +
        (plan.headAgeMs === undefined
          ? ""
          : ` (${ageText(plan.headAgeMs)} old by this node's clock)`),
      `  would lose    what ${holder} wrote after that copy` +
        (plan.aliveAfterHeadMs !== undefined && plan.aliveAfterHeadMs > 0
          ? `: it was alive at least ${ageText(plan.aliveAfterHeadMs)} after it (its last ` +
            `renewal, by its own clock), and any writes since`
          : ""),
    );
  }
  return lines;
}

/** What {@linkcode takeover} did. */
export interface TakeoverOutcome {
  readonly changed: boolean;
  readonly message: string;
  /** The record written (or the one seen, when nothing changed). */
  readonly record: OwnerRecord;
}

/**
 * Releases the volume of `plan` on behalf of its holder: the generation is bumped (fencing the
 * holder), `head` stays. The write is conditional on the etag the plan saw last, so a holder
 * that renewed since, or another takeover, makes it refuse and change nothing.
 * @param by who asks, recorded in the owner object (e.g. "zfs-csi takeover on node x")
 * @throws {CsiError} FAILED_PRECONDITION when the plan has refusals and `force` is not set, or
 *   the object changed since it was watched
 * @throws {StoreError} when the store fails
 */
export async function takeover(
  store: Store,
  plan: TakeoverPlan,
  opts: { readonly by: string; readonly nowMs: number; readonly force?: boolean },
): Promise<TakeoverOutcome> {
  const r = plan.seen.record;
  if (r.state !== "held") {
    return {
      changed: false,
      record: r,
      message: `Volume "${r.volume}" is not held (${
        r.state === "deleted" ? "deleted" : "released"
      }): nothing to take over; the next stage on any node takes it`,
    };
  }
  if (plan.refusals.length > 0 && opts.force !== true) {
    throw new CsiError(
      Code.FAILED_PRECONDITION,
      `Refused to take volume "${r.volume}" from node "${r.holder}": ` +
        plan.refusals.map((reason) => refusalText(plan, reason)).join("; ") +
        `. Nothing was changed. If node "${r.holder}" is truly lost, run again with --force`,
    );
  }
  const next = takenOver(r, opts);
  try {
    await store.putBytes(plan.key, encodeOwner(next), { ifMatch: plan.seen.etag });
  } catch (err) {
    if (!(err instanceof StoreError && err.kind === "precondition_failed")) throw err;
    throw new CsiError(
      Code.FAILED_PRECONDITION,
      `The owner object of volume "${r.volume}" changed since it was watched (node ` +
        `"${r.holder}" renewed it, or another takeover ran): nothing was changed; run again`,
      { cause: err },
    );
  }
  const copy = r.head === null
    ? "the store holds no copy of it: the next stage starts it empty"
    : `the next stage on any node receives the store's last copy, from ${r.headAt}`;
  return {
    changed: true,
    record: next,
    message: `Volume "${r.volume}" was taken from node "${r.holder}" (generation ` +
      `${r.generation}, last renewed at ${r.renewedAt} by its clock); ${copy}. What ` +
      `node "${r.holder}" wrote after that copy is not the volume's: if it comes back, its ` +
      `copy is set aside there, never published`,
  };
}
