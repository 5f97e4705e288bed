import assert from "node:assert/strict";
import { MemoryStore } from "../../tests/support/memory_store.ts";
import { Code, CsiError } from "../errors.ts";
import { ownerKey } from "../store/layout.ts";
import { FileStore } from "../store/file_store.ts";
import type { Store } from "../store/store.ts";
import {
  acquire,
  type AcquireOptions,
  createOwner,
  FencedError,
  forceRelease,
  HeldElsewhereError,
  markDeleted,
  moveHead,
  parseOwner,
  readOwner,
  release,
  renew,
} from "./owner.ts";
import { judgeTakeover, LeaseObserver } from "./rule.ts";

const VOL = "pg-data";
const UID = "0123456789abcdef0123456789abcdef";
const T0 = Date.parse("2026-01-01T00:00:00Z");
const settings = { capacityBytes: 1 << 30, properties: { refquota: String(1 << 30) } };

/** Each test runs against the in-memory store and a directory store in /tmp. */
async function eachStore(
  t: Deno.TestContext,
  fn: (store: Store) => Promise<void>,
): Promise<void> {
  await t.step("memory store", () => fn(new MemoryStore()));
  await t.step("file store", async () => {
    const dir = await Deno.makeTempDir({ dir: "/tmp", prefix: "zfs-csi-owner-" });
    try {
      await fn(new FileStore(dir));
    } finally {
      await Deno.remove(dir, { recursive: true });
    }
  });
}

async function created(store: Store) {
  const { holding, created } = await createOwner(store, VOL, {
    volume: VOL,
    uid: UID,
    ttlSeconds: 30,
    settings,
    nowMs: T0,
  });
  assert.equal(created, true);
  return holding;
}

const never: AcquireOptions["mayTakeOver"] = () => ({ ok: false, message: "held elsewhere" });
const always: AcquireOptions["mayTakeOver"] = () => ({ ok: true });

function as(node: string, mayTakeOver = never, nowMs = T0): AcquireOptions {
  return { node, nowMs, ttlSeconds: 30, mayTakeOver };
}

Deno.test("createOwner writes a released record once and returns the existing one after", async (t) => {
  await eachStore(t, async (store) => {
    const first = await created(store);
    assert.equal(first.record.state, "released");
    assert.equal(first.record.generation, 0);
    assert.equal(first.record.head, null);
    const again = await createOwner(store, VOL, {
      volume: VOL,
      uid: "f".repeat(32),
      ttlSeconds: 30,
      settings,
      nowMs: T0 + 1,
    });
    assert.equal(again.created, false);
    assert.equal(again.holding.record.uid, UID, "the first record stands");
    const read = await readOwner(store, VOL);
    assert.deepEqual(read?.record, first.record);
  });
});

Deno.test("acquire bumps the generation; two racing acquirers: exactly one wins", async (t) => {
  await eachStore(t, async (store) => {
    await created(store);
    const results = await Promise.allSettled([
      acquire(store, VOL, as("node-a")),
      acquire(store, VOL, as("node-b")),
    ]);
    const won = results.filter((r) => r.status === "fulfilled");
    const lost = results.filter((r) => r.status === "rejected");
    assert.equal(won.length, 1, "one acquirer wins");
    assert.equal(lost.length, 1);
    const reason = (lost[0] as PromiseRejectedResult).reason;
    assert.ok(reason instanceof HeldElsewhereError, String(reason));
    assert.equal(reason.code, Code.FAILED_PRECONDITION);
    const winner = (won[0] as PromiseFulfilledResult<Awaited<ReturnType<typeof acquire>>>).value;
    assert.equal(winner.acquired, true);
    assert.equal(winner.holding.record.generation, 1);
    const stored = await readOwner(store, VOL);
    assert.equal(stored?.record.holder, winner.holding.record.holder);
    assert.equal(stored?.record.state, "held");
  });
});

Deno.test("acquire by the holder itself keeps the generation and renews", async (t) => {
  await eachStore(t, async (store) => {
    await created(store);
    const first = await acquire(store, VOL, as("node-a"));
    const again = await acquire(store, VOL, as("node-a", never, T0 + 5000));
    assert.equal(again.acquired, false);
    assert.equal(again.holding.record.generation, first.holding.record.generation);
    assert.equal(again.holding.record.renewedAt, new Date(T0 + 5000).toISOString());
    assert.notEqual(again.holding.etag, first.holding.etag);
  });
});

Deno.test("renew and moveHead change the etag; release hands over with the final head", async (t) => {
  await eachStore(t, async (store) => {
    await created(store);
    let held = (await acquire(store, VOL, as("node-a"))).holding;
    const before = held.etag;
    held = await renew(store, VOL, held, T0 + 10_000);
    assert.notEqual(held.etag, before);
    held = await moveHead(store, VOL, held, { guid: "111", createdAt: "2026-01-01T00:00:10Z" }, T0);
    assert.equal((await readOwner(store, VOL))?.record.head, "111");
    held = await release(
      store,
      VOL,
      held,
      { guid: "222", createdAt: "2026-01-01T00:01:00Z" },
      T0 + 60_000,
    );
    const r = (await readOwner(store, VOL))!.record;
    assert.equal(r.state, "released");
    assert.equal(r.head, "222");
    assert.equal(r.holder, "node-a");
    // The next holder takes it without any takeover rule, one generation up.
    const b = await acquire(store, VOL, as("node-b"));
    assert.equal(b.acquired, true);
    assert.equal(b.holding.record.generation, 2);
    assert.equal(b.holding.record.head, "222");
  });
});

Deno.test("a fenced old holder cannot renew, move the head or release", async (t) => {
  await eachStore(t, async (store) => {
    await created(store);
    const a = (await acquire(store, VOL, as("node-a"))).holding;
    // node-b takes it over (the rule allowed it), from head null.
    const b = await acquire(store, VOL, as("node-b", always));
    assert.equal(b.holding.record.generation, 2);
    await assert.rejects(() => renew(store, VOL, a, T0 + 1), FencedError);
    const late = moveHead(store, VOL, a, { guid: "999", createdAt: "2026-01-01T00:00:00Z" }, T0);
    await assert.rejects(late, (err: unknown) => {
      assert.ok(err instanceof FencedError);
      assert.match(err.message, /no longer held by node "node-a" under generation 1/);
      assert.match(err.message, /held by node "node-b" \(generation 2/);
      return true;
    });
    await assert.rejects(() => release(store, VOL, a, undefined, T0), FencedError);
    const r = (await readOwner(store, VOL))!.record;
    assert.equal(r.head, null, "the fenced holder never moved the head");
    assert.equal(r.holder, "node-b");
    assert.equal(r.state, "held");
  });
});

Deno.test("a holder's write racing with its own renewal is not mistaken for fencing", async (t) => {
  await eachStore(t, async (store) => {
    await created(store);
    const a = (await acquire(store, VOL, as("node-a"))).holding;
    // The same holding used twice (an old etag): the record is still node-a's, same generation.
    await renew(store, VOL, a, T0 + 1);
    const moved = await moveHead(
      store,
      VOL,
      a,
      { guid: "5", createdAt: "2026-01-01T00:00:00Z" },
      T0,
    );
    assert.equal(moved.record.head, "5");
    assert.equal((await readOwner(store, VOL))!.record.head, "5");
  });
});

Deno.test("forceRelease bumps the generation, keeps the head and fences the holder", async (t) => {
  await eachStore(t, async (store) => {
    await created(store);
    let a = (await acquire(store, VOL, as("node-a"))).holding;
    a = await moveHead(store, VOL, a, { guid: "77", createdAt: "2026-01-01T00:00:00Z" }, T0);
    const { before, after } = await forceRelease(store, VOL, { by: "operator", nowMs: T0 });
    assert.equal(before.state, "held");
    assert.equal(after.state, "released");
    assert.equal(after.generation, a.record.generation + 1);
    assert.equal(after.head, "77");
    assert.match(after.releasedBy ?? "", /takeover by operator from node "node-a"/);
    await assert.rejects(() => renew(store, VOL, a, T0), FencedError);
    const b = await acquire(store, VOL, as("node-b"));
    assert.equal(b.holding.record.generation, a.record.generation + 2);
    assert.equal(b.holding.record.head, "77");
    assert.equal(b.holding.record.releasedBy, undefined);
  });
});

Deno.test("markDeleted refuses a held volume, naming its holder", async (t) => {
  await eachStore(t, async (store) => {
    await created(store);
    const a = (await acquire(store, VOL, as("node-a"))).holding;
    await assert.rejects(() => markDeleted(store, VOL, T0), (err: unknown) => {
      assert.ok(err instanceof CsiError);
      assert.equal(err.code, Code.FAILED_PRECONDITION);
      assert.match(err.message, /held by node "node-a"/);
      return true;
    });
    await release(store, VOL, a, undefined, T0);
    assert.equal((await markDeleted(store, VOL, T0))?.state, "deleted");
    await assert.rejects(() => acquire(store, VOL, as("node-b")), (err: unknown) => {
      assert.ok(err instanceof CsiError);
      assert.equal(err.code, Code.FAILED_PRECONDITION);
      assert.match(err.message, /was deleted/);
      return true;
    });
  });
});

Deno.test("acquire of a volume without an owner object is NOT_FOUND", async () => {
  const store = new MemoryStore();
  await assert.rejects(() => acquire(store, VOL, as("node-a")), (err: unknown) => {
    assert.ok(err instanceof CsiError);
    assert.equal(err.code, Code.NOT_FOUND);
    return true;
  });
});

Deno.test("judgeTakeover: refused until the lease is seen unchanged for TTL + takeover-after", async () => {
  const store = new MemoryStore();
  await created(store);
  // node-a runs with --takeover-after: it promises to fence itself.
  await acquire(store, VOL, { ...as("node-a"), selfFence: true });
  let mono = 1_000;
  const observer = new LeaseObserver(() => mono);
  const rule = { takeoverAfterMs: 60_000 };
  const nowMs = T0 + 120_000;
  const tryB = () =>
    acquire(store, VOL, {
      ...as("node-b"),
      mayTakeOver: (cur) => judgeTakeover(cur, { volumeKey: VOL, observer, rule, nowMs }),
    });
  await assert.rejects(tryB, (err: unknown) => {
    assert.ok(err instanceof HeldElsewhereError);
    assert.match(err.message, /held by node "node-a" \(generation 1\)/);
    assert.match(err.message, /last renewed its lease at 2026-01-01T00:00:00.000Z/);
    assert.match(err.message, /the store holds no copy of it yet/);
    assert.match(err.message, /unchanged for 1m30s as seen from this node/);
    return true;
  });
  mono += 89_000;
  await assert.rejects(tryB, /in 1s/);
  // The holder renews: the clock starts again.
  const held = (await readOwner(store, VOL))!;
  await renew(store, VOL, held, T0 + 1, { ttlSeconds: 30, selfFence: true });
  mono += 5_000;
  await assert.rejects(tryB, /unchanged for 0s/);
  mono += 90_000;
  const b = await tryB();
  assert.equal(b.acquired, true);
  assert.equal(b.holding.record.holder, "node-b");
  assert.equal(b.holding.record.generation, 2);
});

Deno.test("judgeTakeover without takeover-after refuses forever and names the command", async () => {
  const store = new MemoryStore();
  await created(store);
  let a = (await acquire(store, VOL, as("node-a"))).holding;
  a = await moveHead(store, VOL, a, { guid: "42", createdAt: "2026-01-01T00:00:00Z" }, T0);
  let mono = 0;
  const observer = new LeaseObserver(() => mono);
  const judge = () =>
    judgeTakeover(a, { volumeKey: VOL, observer, rule: {}, nowMs: T0 + 3_600_000 + 65_000 });
  judge();
  mono += 10 * 86_400_000;
  const v = judge();
  assert.equal(v.ok, false);
  assert.ok(!v.ok);
  assert.match(v.message, /taken over only explicitly/);
  assert.match(v.message, /zfs-csi takeover pg-data/);
  assert.match(v.message, /last copy in the store is from 2026-01-01T00:00:00Z \(1h01m old\)/);
});

// Issue 21, self-fencing: only a holder that promised to make its copy read-only by itself is
// taken over by the rule.

Deno.test("judgeTakeover with takeover-after never takes a holder that did not promise to fence itself", async () => {
  const store = new MemoryStore();
  await created(store);
  // node-a runs without --takeover-after (or is older): its record has no selfFence.
  const a = (await acquire(store, VOL, as("node-a"))).holding;
  assert.equal(a.record.selfFence, undefined, "no promise written");
  let mono = 0;
  const observer = new LeaseObserver(() => mono);
  const tryB = () =>
    acquire(store, VOL, {
      ...as("node-b"),
      selfFence: true,
      mayTakeOver: (cur) =>
        judgeTakeover(cur, {
          volumeKey: VOL,
          observer,
          rule: { takeoverAfterMs: 5_000 },
          nowMs: T0 + 60_000,
        }),
    });
  await assert.rejects(tryB, HeldElsewhereError);
  // Silent for ten days as node-b sees it: still only an explicit takeover.
  mono += 10 * 86_400_000;
  await assert.rejects(tryB, (err: unknown) => {
    assert.ok(err instanceof HeldElsewhereError);
    assert.match(
      err.message,
      /node "node-a" runs without --takeover-after and does not fence itself: take it over explicitly with "zfs-csi takeover pg-data" once it is gone/i,
    );
    return true;
  });
  assert.equal((await readOwner(store, VOL))!.record.holder, "node-a");
  // node-a restarts with --takeover-after: its next renewal promises, and the rule applies.
  await renew(store, VOL, (await readOwner(store, VOL))!, T0 + 1, {
    ttlSeconds: 30,
    selfFence: true,
  });
  await assert.rejects(tryB, /may be taken over once its lease has been unchanged for 35s/);
  mono += 35_000;
  const b = await tryB();
  assert.equal(b.holding.record.holder, "node-b");
  assert.equal(b.holding.record.selfFence, true, "node-b promises in its turn");
});

Deno.test("the holder's terms: acquire and renew write its TTL and its promise; moveHead and release keep them", async (t) => {
  await eachStore(t, async (store) => {
    await created(store);
    let a = (await acquire(store, VOL, { ...as("node-a"), selfFence: true })).holding;
    assert.equal((await readOwner(store, VOL))!.record.selfFence, true);
    a = await moveHead(store, VOL, a, { guid: "7", createdAt: "2026-01-01T00:00:00Z" }, T0);
    assert.equal((await readOwner(store, VOL))!.record.selfFence, true, "kept by a head move");
    // Restarted with another --lease-ttl and without --takeover-after.
    a = await renew(store, VOL, a, T0 + 1, { ttlSeconds: 90, selfFence: false });
    const r = (await readOwner(store, VOL))!.record;
    assert.equal(r.ttlSeconds, 90, "takers count the lease the holder keeps now");
    assert.equal(r.selfFence, undefined, "no promise: the field is left out, as before");
    a = await renew(store, VOL, a, T0 + 2);
    assert.equal((await readOwner(store, VOL))!.record.ttlSeconds, 90, "no terms: kept");
  });
});

Deno.test("parseOwner reads selfFence as true or false, absent in older records", () => {
  const base = {
    format: 1,
    volume: VOL,
    uid: UID,
    holder: "node-a",
    generation: 1,
    state: "held",
    head: null,
    headAt: null,
    renewedAt: "2026-01-01T00:00:00.000Z",
    ttlSeconds: 30,
    settings,
  };
  assert.equal(parseOwner(JSON.stringify(base)).selfFence, undefined);
  assert.equal(parseOwner(JSON.stringify({ ...base, selfFence: true })).selfFence, true);
  assert.equal(parseOwner(JSON.stringify({ ...base, selfFence: false })).selfFence, undefined);
  assert.throws(
    () => parseOwner(JSON.stringify({ ...base, selfFence: "yes" })),
    /field "selfFence" must be true or false/,
  );
});

Deno.test("parseOwner refuses damaged records, naming the field", () => {
  const good = {
    format: 1,
    volume: VOL,
    uid: UID,
    holder: null,
    generation: 0,
    state: "released",
    head: null,
    headAt: null,
    renewedAt: "2026-01-01T00:00:00.000Z",
    ttlSeconds: 30,
    settings,
  };
  assert.deepEqual(parseOwner(JSON.stringify(good)), good);
  assert.throws(() => parseOwner(JSON.stringify({ ...good, state: "mine" })), /"state"/);
  assert.throws(() => parseOwner(JSON.stringify({ ...good, head: "x1" })), /"head"/);
  assert.throws(() => parseOwner(JSON.stringify({ ...good, generation: -1 })), /"generation"/);
  assert.throws(() => parseOwner("{"), /not JSON/);
});

Deno.test("readOwner refuses an unreadable owner object and leaves it", async () => {
  const store = new MemoryStore();
  store.poke(ownerKey(VOL), new TextEncoder().encode("garbage"));
  await assert.rejects(() => readOwner(store, VOL), (err: unknown) => {
    assert.ok(err instanceof CsiError);
    assert.equal(err.code, Code.FAILED_PRECONDITION);
    assert.match(err.message, /cannot be read/);
    return true;
  });
  assert.equal(new TextDecoder().decode(store.peek(ownerKey(VOL))), "garbage");
});
