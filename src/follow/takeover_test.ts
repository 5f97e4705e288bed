import assert from "node:assert/strict";
import { MemoryStore } from "../../tests/support/memory_store.ts";
import { memoryIo } from "../cli/test_io.ts";
import { Code, CsiError } from "../errors.ts";
import { FileStore } from "../store/file_store.ts";
import type { Store } from "../store/store.ts";
import { acquire, createOwner, moveHead, readOwner, renew } from "./owner.ts";
import { FencedError } from "./owner.ts";
import { defaultWatchMs, planLines, planTakeover, takeover } from "./takeover.ts";
import { run } from "./takeover_command.ts";

const never = () => ({ ok: false as const, message: "held" });
const KEY = "db:5b0:5d";
const MINUTE = 60_000;

/** A follow volume held by node-a since `renewedMs` (its clock), head taken at `headMs` if any. */
async function held(store: Store, renewedMs: number, headMs?: number) {
  await createOwner(store, KEY, {
    volume: "db[0]",
    uid: "a".repeat(32),
    ttlSeconds: 30,
    settings: { capacityBytes: 0, properties: {} },
    nowMs: renewedMs,
  });
  let a = (await acquire(store, KEY, {
    node: "node-a",
    nowMs: renewedMs,
    ttlSeconds: 30,
    mayTakeOver: never,
  })).holding;
  if (headMs !== undefined) {
    a = await moveHead(store, KEY, a, {
      guid: "9",
      createdAt: new Date(headMs).toISOString(),
    }, renewedMs);
  }
  return a;
}

/** Watch options for a test: a clock the sleeps move, no real waiting. */
function clocks(nowMs: number, onSleep: () => Promise<void> = async () => {}) {
  let mono = 0;
  return {
    node: "node-b",
    now: () => nowMs + mono,
    monotonic: () => mono,
    sleep: async (ms: number) => {
      mono += ms;
      await onSleep();
    },
  };
}

Deno.test("takeover of a silent lease with a copy: planned, then taken, fencing the holder", async () => {
  const store = new MemoryStore();
  const T = Date.parse("2026-01-01T00:10:00Z");
  const a = await held(store, T - 5 * MINUTE, T - 8 * MINUTE);
  const plan = await planTakeover(store, "db[0]", clocks(T));
  assert.equal(plan.watchedMs, defaultWatchMs(30));
  assert.equal(plan.changed, false);
  assert.deepEqual(plan.refusals, []);
  assert.equal(plan.aliveAfterHeadMs, 3 * MINUTE);
  const text = planLines(plan).join("\n");
  assert.match(text, /holder {8}node "node-a", generation 1/);
  assert.match(text, /renewed at 2026-01-01T00:05:00.000Z by the holder's clock, TTL 30s/);
  assert.match(text, /5m\d\ds old by this node's clock/);
  assert.match(text, /taken at 2026-01-01T00:02:00.000Z by the holder's clock \(8m\d\ds old/);
  assert.match(text, /alive at least 3m00s after it/);
  const out = await takeover(store, plan, { by: "operator", nowMs: T });
  assert.equal(out.changed, true);
  assert.match(out.message, /taken from node "node-a" \(generation 1/);
  assert.match(out.message, /receives the store's last copy, from 2026-01-01T00:02:00.000Z/);
  await assert.rejects(() => renew(store, KEY, a, T + 1), FencedError);
  const b = await acquire(store, KEY, {
    node: "node-b",
    nowMs: T,
    ttlSeconds: 30,
    mayTakeOver: never,
  });
  assert.equal(b.holding.record.head, "9");
  assert.equal(b.holding.record.generation, 3);
});

Deno.test("takeover refuses a lease that changes while watched, whatever the stamps say", async () => {
  const store = new MemoryStore();
  const T = Date.parse("2026-01-01T00:10:00Z");
  // The holder's clock is an hour behind: by stamps alone it looks long gone.
  let a = await held(store, T - 60 * MINUTE, T - 61 * MINUTE);
  let renewals = 0;
  const plan = await planTakeover(
    store,
    "db[0]",
    clocks(T, async () => {
      if (++renewals === 3) a = await renew(store, KEY, a, T - 60 * MINUTE + 10_000);
    }),
  );
  assert.equal(plan.changed, true);
  assert.deepEqual(plan.refusals, ["changed"]);
  assert.equal(plan.watchedMs, 3000, "it stops watching once it saw a change");
  await assert.rejects(
    () => takeover(store, plan, { by: "operator", nowMs: T }),
    (err) =>
      err instanceof CsiError && err.code === Code.FAILED_PRECONDITION &&
      /changed while it was watched: node "node-a" renews its lease.*--force/.test(err.message),
  );
  assert.equal((await readOwner(store, KEY))!.record.state, "held");
});

Deno.test("takeover refuses a fresh stamp, this node's own volume, and a volume with no copy", async () => {
  const T = Date.parse("2026-01-01T00:10:00Z");
  const fresh = new MemoryStore();
  await held(fresh, T - 200, T - MINUTE);
  const p1 = await planTakeover(fresh, "db[0]", clocks(T));
  assert.deepEqual(p1.refusals, ["stamp"]);
  const here = new MemoryStore();
  await held(here, T - 5 * MINUTE, T - 6 * MINUTE);
  const p2 = await planTakeover(here, "db[0]", { ...clocks(T), node: "node-a" });
  assert.deepEqual(p2.refusals, ["here"]);
  const empty = new MemoryStore();
  await held(empty, T - 5 * MINUTE);
  const p3 = await planTakeover(empty, "db[0]", clocks(T));
  assert.deepEqual(p3.refusals, ["no-copy"]);
  assert.match(planLines(p3).join("\n"), /next stage starts the volume empty/);
  for (const [store, plan] of [[fresh, p1], [here, p2], [empty, p3]] as const) {
    await assert.rejects(() => takeover(store, plan, { by: "op", nowMs: T }), /--force/);
    assert.equal((await readOwner(store, KEY))!.record.state, "held");
  }
  // --force takes it.
  assert.equal((await takeover(empty, p3, { by: "op", nowMs: T, force: true })).changed, true);
});

Deno.test("takeover acts only on the etag it watched: a renewal after the plan changes nothing", async () => {
  const store = new MemoryStore();
  const T = Date.parse("2026-01-01T00:10:00Z");
  const a = await held(store, T - 5 * MINUTE, T - 6 * MINUTE);
  const plan = await planTakeover(store, "db[0]", clocks(T));
  assert.deepEqual(plan.refusals, []);
  await renew(store, KEY, a, T);
  await assert.rejects(
    () => takeover(store, plan, { by: "operator", nowMs: T }),
    /changed since it was watched.*nothing was changed/,
  );
  assert.equal((await readOwner(store, KEY))!.record.generation, 1);
});

Deno.test("takeover of a released volume changes nothing; of an unknown one is NOT_FOUND", async () => {
  const store = new MemoryStore();
  await createOwner(store, KEY, {
    volume: "db[0]",
    uid: "a".repeat(32),
    ttlSeconds: 30,
    settings: { capacityBytes: 0, properties: {} },
    nowMs: 0,
  });
  const plan = await planTakeover(store, "db[0]", clocks(0));
  assert.equal(plan.watchedMs, 0, "nothing to watch");
  const out = await takeover(store, plan, { by: "operator", nowMs: 1 });
  assert.equal(out.changed, false);
  assert.match(out.message, /is not held/);
  await assert.rejects(() => planTakeover(new MemoryStore(), "nope", clocks(0)), (err) => {
    assert.ok(err instanceof CsiError);
    assert.equal(err.code, Code.NOT_FOUND);
    return true;
  });
});

/** The command's watch on a monotonic clock its sleeps move: the default watch, no real wait. */
function fastWatch() {
  let mono = 0;
  const wall = Date.now();
  return {
    now: () => wall + mono,
    monotonic: () => mono,
    sleep: (ms: number) => {
      mono += ms;
      return Promise.resolve();
    },
  };
}

/** A directory store in /tmp with db[0] held by node-a, renewed `ageMs` ago by this clock. */
async function fileStore(ageMs: number) {
  const dir = await Deno.makeTempDir({ dir: "/tmp", prefix: "zfs-csi-takeover-" });
  const store = new FileStore(dir);
  await held(store, Date.now() - ageMs, Date.now() - ageMs - MINUTE);
  const flags = [
    "--parent-dataset",
    "tank/nomad",
    "--node-id",
    "node-b",
    "--store",
    `file://${dir}`,
  ];
  return { dir, store, flags, [Symbol.asyncDispose]: () => Deno.remove(dir, { recursive: true }) };
}

Deno.test("zfs-csi takeover is a dry run without --yes: it shows the plan and changes nothing", async () => {
  await using s = await fileStore(5 * MINUTE);
  const io = memoryIo();
  assert.equal(await run([...s.flags, "db[0]"], io, fastWatch()), 0);
  const text = io.stdout.join("\n");
  assert.match(text, /holder {8}node "node-a"/);
  assert.match(text, /Dry run: nothing was changed\. To take it: .* --yes$/m);
  const owner = (await readOwner(s.store, KEY))!.record;
  assert.equal(owner.state, "held");
  assert.equal(owner.generation, 1);
  // With --yes it takes it.
  const yes = memoryIo();
  assert.equal(await run([...s.flags, "db[0]", "--yes"], yes, fastWatch()), 0);
  assert.match(yes.stdout.join("\n"), /was taken from node "node-a"/);
  assert.equal((await readOwner(s.store, KEY))!.record.state, "released");
});

Deno.test("zfs-csi takeover --yes refuses a lease renewed within its TTL unless --force", async () => {
  await using s = await fileStore(200);
  const io = memoryIo();
  await assert.rejects(() => run([...s.flags, "db[0]", "--yes"], io, fastWatch()), /--force/);
  assert.equal((await readOwner(s.store, KEY))!.record.state, "held");
  const forced = memoryIo();
  assert.equal(await run([...s.flags, "db[0]", "--yes", "--force"], forced, fastWatch()), 0);
  assert.equal((await readOwner(s.store, KEY))!.record.state, "released");
});

Deno.test("takeover refuses a watch shorter than the holder's renewal period unless --force", async () => {
  const store = new MemoryStore();
  const T = Date.parse("2026-01-01T00:10:00Z");
  await held(store, T - 60 * MINUTE, T - 61 * MINUTE);
  const short = await planTakeover(store, "db[0]", { ...clocks(T), watchMs: 2000 });
  assert.deepEqual(short.refusals, ["short-watch"]);
  await assert.rejects(
    () => takeover(store, short, { by: "op", nowMs: T }),
    /watched for 2s only, less than the 11s a live holder renews within/,
  );
  assert.equal(defaultWatchMs(30), 15_000);
  assert.equal(defaultWatchMs(3), 4_000);
  assert.equal(defaultWatchMs(90), 31_000, "at least one renewal period of a long TTL");
});
