import assert from "node:assert/strict";
import { Prng, seedFrom } from "../../tests/support/prng.ts";
import { chainTo, latest, nextSequence } from "./chain.ts";
import type { KeepPolicy, SnapshotManifest } from "./layout.ts";
import {
  formatKeepPolicy,
  needsFull,
  parseInterval,
  parseKeepPolicy,
  pruneOrder,
  retained,
} from "./policy.ts";

const UID = "0123456789abcdef0123456789abcdef";
const HOUR = 3_600_000;
const DAY = 24 * HOUR;
/** Monday 2024-01-01 00:00 UTC. */
const T0 = Date.UTC(2024, 0, 1);

function manifest(
  guid: string,
  atMs: number,
  baseGuid: string | null = null,
  kind: SnapshotManifest["kind"] = "scheduled",
): SnapshotManifest {
  return {
    format: 1,
    volume: "v",
    volumeUid: UID,
    guid,
    baseGuid,
    snapshot: `.backup-${atMs / 1000}`,
    kind,
    createdAt: new Date(atMs).toISOString(),
    stream: `v1/volumes/v/streams/${guid}.zfs`,
    size: 1,
    sha256: "0".repeat(64),
    raw: false,
    node: "n",
    capacityBytes: 1,
  };
}

/** A chain of `n` backups every `stepMs` from `start`, guids from `first`, one full first. */
function chain(n: number, stepMs: number, start = T0, first = 1): SnapshotManifest[] {
  const out: SnapshotManifest[] = [];
  for (let i = 0; i < n; i++) {
    out.push(
      manifest(String(first + i), start + i * stepMs, i === 0 ? null : String(first + i - 1)),
    );
  }
  return out;
}

const keep = (p: Partial<KeepPolicy>): KeepPolicy => ({
  last: 0,
  hourly: 0,
  daily: 0,
  weekly: 0,
  ...p,
});

Deno.test("parseKeepPolicy reads counts; unnamed kinds keep none", () => {
  assert.deepEqual(parseKeepPolicy("last=4,hourly=24,daily=14,weekly=8"), {
    last: 4,
    hourly: 24,
    daily: 14,
    weekly: 8,
  });
  assert.deepEqual(parseKeepPolicy(" daily = 7 "), keep({ daily: 7 }));
  const text = "last=4,hourly=24,daily=14,weekly=0";
  assert.equal(formatKeepPolicy(parseKeepPolicy(text)), text);
});

Deno.test("parseKeepPolicy refuses unknown, repeated, negative and all-zero counts", () => {
  const cases: [string, RegExp][] = [
    ["", /is empty/],
    ["monthly=3", /unknown kind "monthly"/],
    ["last=-1", /last must be a whole number from 0/],
    ["last=1.5", /must be a whole number/],
    ["last=", /must be a whole number/],
    ["last=1000001", /must be a whole number from 0 to 100000/],
    ["last=1,last=2", /"last" is given twice/],
    ["last=1,,daily=2", /"" is not "kind=count"/],
    ["last", /"last" is not "kind=count"/],
    ["last=0,hourly=0,daily=0,weekly=0", /keeps nothing/],
  ];
  for (const [text, message] of cases) {
    assert.throws(
      () => parseKeepPolicy(text),
      (err: unknown) => err instanceof SyntaxError && message.test(err.message),
      text,
    );
  }
});

Deno.test("parseInterval reads seconds and durations; 0 is off", () => {
  const cases: [string, number][] = [
    ["900", 900],
    ["900s", 900],
    ["15m", 900],
    ["1h", 3600],
    ["1h30m", 5400],
    ["2d", 172800],
    ["0", 0],
  ];
  for (const [text, seconds] of cases) assert.equal(parseInterval(text), seconds, text);
  for (const text of ["", "-5", "1.5h", "15 m", "1w", "m", "999999999"]) {
    assert.throws(() => parseInterval(text), SyntaxError, text);
  }
});

Deno.test("retained keeps the newest last, and the newest per hour, day and ISO week", () => {
  // Every 15 minutes for 3 days.
  const ms = chain(3 * 96, 15 * 60_000);
  const newest = ms.at(-1)!.guid;
  const isKept = (p: Partial<KeepPolicy>) => retained(ms, keep(p));
  // The newest is kept, and with it its whole chain: one chain keeps everything.
  assert.equal(isKept({ last: 1 }).size, ms.length);
  // Separate full streams each time: nothing holds another.
  const fulls = ms.map((m) => ({ ...m, baseGuid: null }));
  const only = (p: Partial<KeepPolicy>) => [...retained(fulls, keep(p))].sort((a, b) => +a - +b);
  assert.deepEqual(only({ last: 3 }), [String(+newest - 2), String(+newest - 1), newest]);
  // The newest of each of the last 3 hours: the :45 backups.
  assert.deepEqual(only({ hourly: 3 }), [String(+newest - 8), String(+newest - 4), newest]);
  // The newest of each day: the 23:45 backups.
  assert.deepEqual(only({ daily: 2 }), ["192", "288"]);
  assert.deepEqual(only({ daily: 5 }), ["96", "192", "288"]);
  assert.deepEqual(only({ last: 1, daily: 2 }), ["192", "288"]);
});

Deno.test("retained buckets weeks from Monday (UTC), and always keeps the newest", () => {
  // Sunday 23:00 and Monday 01:00 of the next week, then Wednesday.
  const sun = T0 + 6 * DAY + 23 * HOUR;
  const ms = [manifest("1", sun), manifest("2", sun + 2 * HOUR), manifest("3", sun + 50 * HOUR)];
  assert.deepEqual([...retained(ms, keep({ weekly: 2 }))].sort(), ["1", "3"]);
  assert.deepEqual([...retained(ms, keep({ daily: 1 }))].sort(), ["3"]);
  // Hours with a backup count, not hours of the clock: a week without backups drops nothing.
  assert.deepEqual([...retained(ms, keep({ hourly: 3 }))].sort(), ["1", "2", "3"]);
});

Deno.test("retained keeps requested snapshots, broken chains, and every base they need", () => {
  const ms = chain(10, HOUR);
  ms[3] = { ...ms[3]!, kind: "requested" };
  // Based on a snapshot the store does not hold.
  ms.push(manifest("50", T0 - DAY, "49"));
  const kept = retained(ms.map((m) => (m.guid === "10" ? { ...m, baseGuid: null } : m)), {
    ...keep({ last: 1 }),
  });
  assert.deepEqual([...kept].sort((a, b) => +a - +b), ["1", "2", "3", "4", "10", "50"]);
});

Deno.test("pruneOrder deletes leaves first and refuses a kept snapshot's base", () => {
  const ms = [...chain(4, HOUR), ...chain(3, HOUR, T0 + DAY, 10)];
  const order = pruneOrder(ms, new Set(["10", "11", "12"]));
  assert.deepEqual(order.map((m) => m.guid), ["4", "3", "2", "1"]);
  assert.throws(() => pruneOrder(ms, new Set(["12"])), /Cannot prune 11: kept snapshot 12/);
  // Two incrementals on one base: both before the base.
  const fork = [
    manifest("1", T0),
    manifest("2", T0 + HOUR, "1"),
    manifest("3", T0 + 2 * HOUR, "1"),
  ];
  assert.equal(pruneOrder(fork, new Set()).at(-1)?.guid, "1");
});

Deno.test("needsFull: no chain, a chain of maxLength streams, or an old full stream", () => {
  const now = T0 + DAY;
  assert.equal(needsFull([], { nowMs: now }), true);
  assert.equal(needsFull(chain(3, HOUR), { nowMs: now }), false);
  assert.equal(needsFull(chain(48, 60_000), { nowMs: now }), true);
  assert.equal(needsFull(chain(47, 60_000), { nowMs: now }), false);
  assert.equal(needsFull(chain(3, HOUR), { nowMs: now, maxLength: 3 }), true);
  assert.equal(needsFull(chain(3, HOUR), { nowMs: T0 + 7 * DAY }), true);
  assert.equal(needsFull(chain(3, HOUR), { nowMs: now, maxAgeMs: DAY }), true);
  // A chain that does not start with a full stream cannot be extended.
  assert.equal(needsFull(chain(3, HOUR).slice(1), { nowMs: now }), true);
});

/**
 * Random histories as backups make them (an incremental on the newest, a new full stream when
 * needsFull says so, now and then a requested snapshot or an incremental on an older one),
 * pruned after each backup one deletion at a time: at no step is a manifest left whose base is
 * gone, and every kept snapshot restores.
 */
Deno.test("pruning random histories never deletes a base a kept snapshot needs", () => {
  const seed = seedFrom(Deno.env.get("ZFS_CSI_TEST_SEED"), 12);
  const rng = new Prng(seed);
  for (let trial = 0; trial < 40; trial++) {
    const policy = keep({
      last: rng.int(0, 5),
      hourly: rng.int(0, 6),
      daily: rng.int(0, 4),
      weekly: rng.int(0, 3),
    });
    const store = new Map<string, SnapshotManifest>();
    let now = T0 + rng.int(0, 7) * DAY;
    let guid = 100;
    const maxLength = rng.int(2, 10);
    for (let step = 0; step < 80; step++) {
      now += rng.pick([60_000, 15 * 60_000, HOUR, 5 * HOUR, DAY]);
      const all = [...store.values()];
      let base = latest(all);
      if (base && rng.chance(0.1)) base = rng.pick(all);
      const full = !base || needsFull(chainTo(all, base.guid), { nowMs: now, maxLength });
      const kind = rng.chance(0.05) ? "requested" : "scheduled";
      const m = manifest(String(++guid), now, full ? null : base!.guid, kind);
      store.set(m.guid, m);
      const kept = retained([...store.values()], policy);
      const ctx = `seed ${seed}, trial ${trial}, step ${step}`;
      assert.ok(kept.has(m.guid), `${ctx}: the newest is kept`);
      for (const gone of pruneOrder([...store.values()], kept)) {
        store.delete(gone.guid);
        for (const left of store.values()) {
          assert.ok(
            left.baseGuid === null || store.has(left.baseGuid),
            `${ctx}: ${left.guid} lost its base ${left.baseGuid}`,
          );
        }
      }
      for (const g of kept) assert.doesNotThrow(() => chainTo([...store.values()], g), ctx);
      for (const left of store.values()) {
        if (left.kind === "requested") assert.ok(kept.has(left.guid), ctx);
      }
    }
    // Retention bounds the store: with needsFull, at most what the rules keep and their chains.
    assert.ok(store.size < 80, `seed ${seed}, trial ${trial}: ${store.size} left`);
  }
});

/** `m` as this version writes it: with a sequence number. */
const numbered = (m: SnapshotManifest, sequence: number): SnapshotManifest => ({ ...m, sequence });

Deno.test("retained keeps the newest by the chain, not by a clock that is behind or stepped back", () => {
  // Node A backs up every minute; node B, 10 minutes behind, takes over and backs up twice.
  const a = chain(5, 60_000).map((m, i) => numbered(m, i + 1));
  const behind = T0 + 5 * 60_000 - 10 * 60_000;
  const b = [
    numbered(manifest("6", behind, "5"), 6),
    numbered(manifest("7", behind + 60_000, "6"), 7),
  ];
  const all = [...a, ...b];
  for (
    const p of [keep({ last: 1 }), keep({ hourly: 1 }), keep({ daily: 1 }), keep({ weekly: 1 })]
  ) {
    assert.ok(retained(all, p).has("7"), formatKeepPolicy(p));
  }
  // A new full stream from B (its chain reached its length): the old chain can go, B's stays.
  const restart = [
    ...a,
    numbered(manifest("8", behind), 6),
    numbered(manifest("9", behind + 60_000, "8"), 7),
  ];
  assert.deepEqual([...retained(restart, keep({ last: 1 }))].sort(), ["8", "9"]);
  // Old manifests (no numbers), B behind on A's chain: still newest by the chain.
  const old = [...chain(5, 60_000), manifest("6", behind, "5")];
  assert.ok(retained(old, keep({ hourly: 1 })).has("6"));
});

Deno.test("retained keeps what the caller protects, with its chain", () => {
  const ms = [...chain(3, HOUR), ...chain(3, HOUR, T0 + DAY, 10)];
  const kept = retained(ms, keep({ last: 1 }), { protect: ["2", "99"] });
  assert.deepEqual([...kept].sort((x, y) => +x - +y), ["1", "2", "10", "11", "12"]);
});

/**
 * Random histories of two nodes whose clocks disagree by up to two hours and now and then step
 * back, each backup numbered as this version numbers it and pruned by a random policy with the
 * head's chain protected: the backup just stored is always kept with its whole chain, and so is
 * the head; nothing kept ever loses its base.
 */
Deno.test("pruning random histories with skewed clocks keeps the new backup and the head", () => {
  const seed = seedFrom(Deno.env.get("ZFS_CSI_TEST_SEED"), 2121);
  const rng = new Prng(seed);
  for (let trial = 0; trial < 40; trial++) {
    const policy = keep({
      last: rng.int(0, 3),
      hourly: rng.int(0, 4),
      daily: rng.int(0, 2),
      weekly: rng.int(0, 2),
    });
    if (policy.last + policy.hourly + policy.daily + policy.weekly === 0) continue;
    const offsets = [0, rng.int(-120, 120) * 60_000];
    const store = new Map<string, SnapshotManifest>();
    let time = T0;
    let guid = 100;
    let head: string | undefined;
    for (let step = 0; step < 60; step++) {
      const ctx = `seed ${seed}, trial ${trial}, step ${step}, ${formatKeepPolicy(policy)}`;
      time += rng.pick([60_000, 15 * 60_000, HOUR, DAY]);
      const node = rng.int(0, 1);
      if (rng.chance(0.1)) offsets[node]! -= rng.int(1, 180) * 60_000;
      const all = [...store.values()];
      const base = head ?? latest(all)?.guid;
      const full = base === undefined ||
        needsFull(chainTo(all, base), { nowMs: time + offsets[node]!, maxLength: 6 });
      const m = numbered(
        manifest(String(++guid), time + offsets[node]!, full ? null : base),
        nextSequence(all),
      );
      store.set(m.guid, m);
      // The head moves to the new backup only now and then (a holder that is not the writer).
      const headChain = head === undefined
        ? []
        : chainTo([...store.values()], head).map((c) => c.guid);
      const kept = retained([...store.values()], policy, { protect: [m.guid, ...headChain] });
      for (const gone of pruneOrder([...store.values()], kept)) store.delete(gone.guid);
      assert.doesNotThrow(() => chainTo([...store.values()], m.guid), `${ctx}: the new one`);
      if (head !== undefined) assert.doesNotThrow(() => chainTo([...store.values()], head!), ctx);
      assert.equal(latest([...store.values()])?.guid, m.guid, `${ctx}: the newest is the new one`);
      if (rng.chance(0.7)) head = m.guid;
    }
  }
});
