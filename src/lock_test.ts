import assert from "node:assert/strict";
import { runInCall } from "./call_context.ts";
import { Code, CsiError } from "./errors.ts";
import { KeyedLock, LockTimeoutError, withLock } from "./lock.ts";

/** A promise settled from outside, to hold a lock for exactly as long as a test wants. */
function gate(): { promise: Promise<void>; open: () => void } {
  const { promise, resolve } = Promise.withResolvers<void>();
  return { promise, open: () => resolve() };
}

function sleep(ms: number): Promise<void> {
  return new Promise((r) => setTimeout(r, ms));
}

/** Lets pending promise callbacks run (several rounds of them). */
async function settle(): Promise<void> {
  for (let i = 0; i < 10; i++) await Promise.resolve();
}

Deno.test("KeyedLock.tryAcquire takes every key or none", () => {
  const locks = new KeyedLock();
  const a = locks.tryAcquire(["a"]);
  assert.ok(a);
  assert.equal(locks.tryAcquire(["b", "a"]), undefined);
  assert.equal(locks.isHeld("b"), false, "a refused acquire must not keep any key");
  const bc = locks.tryAcquire(["b", "c", "b"]);
  assert.ok(bc);
  assert.equal(locks.isHeld("b"), true);
  assert.equal(locks.isHeld("c"), true);
});

Deno.test("KeyedLock release frees every key, and releasing twice is harmless", () => {
  const locks = new KeyedLock();
  const first = locks.tryAcquire(["a", "b"])!;
  first.release();
  assert.equal(locks.isHeld("a"), false);
  assert.equal(locks.isHeld("b"), false);
  const second = locks.tryAcquire(["a"]);
  assert.ok(second);
  first.release(); // must not free "a", which now belongs to `second`
  assert.equal(locks.isHeld("a"), true);
});

Deno.test("KeyedLock held keys are freed at the end of a using block", () => {
  const locks = new KeyedLock();
  {
    using held = locks.tryAcquire(["v"]);
    assert.ok(held);
    assert.equal(locks.isHeld("v"), true);
  }
  assert.equal(locks.isHeld("v"), false);
});

Deno.test("KeyedLock refuses a negative wait time", () => {
  assert.throws(() => new KeyedLock({ waitMs: -1 }), RangeError);
  assert.throws(() => new KeyedLock({ waitMs: Number.NaN }), RangeError);
});

Deno.test("KeyedLock.tryAcquire never jumps the line: a free key with waiters is refused", async () => {
  const locks = new KeyedLock();
  const b = locks.tryAcquire(["b"])!;
  const waiting = locks.acquire(["a", "b"]);
  assert.equal(locks.isHeld("a"), false);
  assert.equal(locks.waiting("a"), 1);
  assert.equal(locks.tryAcquire(["a"]), undefined, "the waiter for a and b comes first");
  b.release();
  const ab = await waiting;
  assert.ok(locks.isHeld("a") && locks.isHeld("b"));
  ab.release();
  assert.ok(locks.tryAcquire(["a"]));
});

Deno.test("withLock waits while a key is held, then runs once it is released", async () => {
  const locks = new KeyedLock();
  const held = locks.tryAcquire(["tank/nomad/v1"])!;
  let ran = false;
  const second = withLock(locks, ["tank/nomad/v1"], () => {
    ran = true;
    return Promise.resolve(7);
  });
  await sleep(20);
  assert.equal(ran, false, "it must not run while the key is held");
  assert.equal(locks.waiting("tank/nomad/v1"), 1);
  held.release();
  assert.equal(await second, 7);
  assert.equal(locks.isHeld("tank/nomad/v1"), false);
});

Deno.test("withLock lets a second caller in only after the first one finishes", async () => {
  const locks = new KeyedLock();
  const g = gate();
  const order: string[] = [];
  const first = withLock(locks, ["k"], async () => {
    order.push("first start");
    await g.promise;
    order.push("first end");
    return "first";
  });
  const second = withLock(locks, ["k"], () => {
    order.push("second");
    return Promise.resolve("second");
  });
  await sleep(10);
  g.open();
  assert.deepEqual(await Promise.all([first, second]), ["first", "second"]);
  assert.deepEqual(order, ["first start", "first end", "second"]);
});

Deno.test("withLock answers UNAVAILABLE naming the keys, the wait and the holder when the wait runs out", async () => {
  const locks = new KeyedLock({ waitMs: 30 });
  const held = locks.tryAcquire(["tank/nomad/v1"], 'NodeUnpublishVolume "v1@node-a"')!;
  let ran = false;
  const started = performance.now();
  await assert.rejects(
    withLock(locks, ["tank/nomad/v1"], () => {
      ran = true;
      return Promise.resolve();
    }),
    (err: unknown) => {
      assert.ok(err instanceof CsiError);
      assert.equal(err.code, Code.UNAVAILABLE);
      assert.match(
        err.message,
        /^Volume busy: waited \d+\.\d s for "tank\/nomad\/v1"; "tank\/nomad\/v1" is held by NodeUnpublishVolume "v1@node-a" \(for \d+\.\d s\)\. Retry later/,
      );
      assert.ok(err.cause instanceof LockTimeoutError);
      return true;
    },
  );
  assert.ok(performance.now() - started >= 25, "it waited for the bound");
  assert.equal(ran, false);
  assert.equal(locks.waiting("tank/nomad/v1"), 0, "a caller that gave up leaves the line");
  held.release();
  assert.equal(locks.isHeld("tank/nomad/v1"), false);
});

Deno.test("withLock takes the wait bound per call and the holder's name from the call it serves", async () => {
  const locks = new KeyedLock(); // default: a minute
  const g = gate();
  const abort = new AbortController();
  const holder = runInCall(
    { operation: 'NodeStageVolume "pg@node-a"', signal: abort.signal },
    () => withLock(locks, ["tank/nomad/pg"], () => g.promise),
  );
  await settle();
  assert.equal(locks.holder("tank/nomad/pg")?.label, 'NodeStageVolume "pg@node-a"');
  await assert.rejects(
    withLock(locks, ["tank/nomad/pg"], () => Promise.resolve(), { timeoutMs: 10 }),
    (err: unknown) =>
      err instanceof CsiError && err.code === Code.UNAVAILABLE &&
      err.message.includes('is held by NodeStageVolume "pg@node-a"'),
  );
  g.open();
  await holder;
});

Deno.test("withLock stops waiting when the call is cancelled, and the line moves on", async () => {
  const locks = new KeyedLock();
  const held = locks.tryAcquire(["k"])!;
  const abort = new AbortController();
  const cancelled = runInCall(
    { operation: "NodePublishVolume", signal: abort.signal },
    () => withLock(locks, ["k"], () => Promise.resolve("ran")),
  );
  const next = withLock(locks, ["k"], () => Promise.resolve("next"));
  await settle();
  assert.equal(locks.waiting("k"), 2);
  abort.abort(new Error("client went away"));
  await assert.rejects(cancelled, (err: unknown) => {
    assert.ok(err instanceof CsiError);
    assert.equal(err.code, Code.CANCELLED);
    assert.equal(err.message, 'Call cancelled while waiting for "k"');
    return true;
  });
  assert.equal(locks.waiting("k"), 1);
  held.release();
  assert.equal(await next, "next");
});

Deno.test("withLock with an already aborted signal does not wait", async () => {
  const locks = new KeyedLock();
  const held = locks.tryAcquire(["k"])!;
  await assert.rejects(
    withLock(locks, ["k"], () => Promise.resolve(), { signal: AbortSignal.abort() }),
    (err: unknown) => err instanceof CsiError && err.code === Code.CANCELLED,
  );
  assert.equal(locks.waiting("k"), 0);
  held.release();
});

Deno.test("withLock holds the keys while fn runs and releases them after a throw", async () => {
  const locks = new KeyedLock();
  await assert.rejects(
    withLock(locks, ["k"], () => {
      assert.equal(locks.isHeld("k"), true);
      return Promise.reject(new Error("boom"));
    }),
    { message: "boom" },
  );
  assert.equal(locks.isHeld("k"), false);
  // A waiter behind a call that throws gets its turn.
  const g = gate();
  const failing = withLock(locks, ["k"], async () => {
    await g.promise;
    throw new Error("late boom");
  });
  const behind = withLock(locks, ["k"], () => Promise.resolve("behind"));
  g.open();
  await assert.rejects(failing, { message: "late boom" });
  assert.equal(await behind, "behind");
});

Deno.test("withLock over several keys takes all or none and cannot deadlock", async () => {
  const locks = new KeyedLock({ waitMs: 2_000 });
  const a = gate();
  const b = gate();
  // Two holders, then two callers wanting both keys in opposite orders: a lock that took keys
  // one by one could leave each with one key, waiting for the other forever.
  const holdA = withLock(locks, ["a"], () => a.promise);
  const holdB = withLock(locks, ["b"], () => b.promise);
  const ab = withLock(locks, ["a", "b"], () => {
    assert.ok(locks.isHeld("a") && locks.isHeld("b"));
    return Promise.resolve("ab");
  });
  const ba = withLock(locks, ["b", "a"], () => Promise.resolve("ba"));
  await settle();
  a.open();
  await holdA;
  await settle();
  assert.equal(locks.isHeld("a"), false, "a caller wanting a and b must not sit on a alone");
  b.open();
  assert.deepEqual(await Promise.all([holdB, ab, ba]), [undefined, "ab", "ba"]);
});

Deno.test("withLock under many overlapping callers: one holder per key at a time, everyone finishes", async () => {
  const locks = new KeyedLock({ waitMs: 5_000 });
  const keys = ["v1", "v2", "v3", "snapshot:s"];
  const inside = new Map<string, number>(keys.map((k) => [k, 0]));
  let seed = 42;
  const random = () => {
    seed = (seed * 1103515245 + 12345) % 2 ** 31;
    return seed / 2 ** 31;
  };
  const calls = Array.from({ length: 200 }, (_, i) => {
    const want = keys.filter(() => random() < 0.4);
    if (want.length === 0) want.push(keys[i % keys.length]!);
    const shuffled = want.toSorted(() => random() - 0.5);
    const pause = Math.floor(random() * 3);
    return withLock(locks, shuffled, async () => {
      for (const k of want) inside.set(k, inside.get(k)! + 1);
      for (const k of want) assert.equal(inside.get(k), 1, `two holders of "${k}"`);
      await sleep(pause);
      for (const k of want) inside.set(k, inside.get(k)! - 1);
      return i;
    });
  });
  const done = await Promise.all(calls);
  assert.equal(done.length, 200);
  for (const k of keys) {
    assert.equal(locks.isHeld(k), false);
    assert.equal(locks.waiting(k), 0);
  }
});

Deno.test("withLock is fair: a caller waiting for two keys is not passed by later callers of one", async () => {
  const locks = new KeyedLock({ waitMs: 2_000 });
  const order: string[] = [];
  const b = gate();
  const holdB = withLock(locks, ["b"], () => b.promise);
  // Waits for b; "a" is free all along.
  const both = withLock(locks, ["a", "b"], () => {
    order.push("a+b");
    return Promise.resolve();
  });
  await settle();
  // A stream of later callers of "a" alone: each would find "a" free, but they queue behind.
  const stream = Array.from({ length: 5 }, (_, i) =>
    withLock(locks, ["a"], async () => {
      order.push(`a${i}`);
      await sleep(1);
    }));
  await sleep(20);
  assert.deepEqual(order, [], "no later caller passed the one waiting for a and b");
  b.open();
  await Promise.all([holdB, both, ...stream]);
  assert.deepEqual(order, ["a+b", "a0", "a1", "a2", "a3", "a4"]);
});

Deno.test("withLock: when the first in line gives up, those behind it go at once", async () => {
  const locks = new KeyedLock();
  const b = locks.tryAcquire(["b"])!;
  const first = withLock(locks, ["a", "b"], () => Promise.resolve("first"), { timeoutMs: 20 });
  let behindRan = false;
  const behind = withLock(locks, ["a"], () => {
    behindRan = true;
    return Promise.resolve("behind");
  });
  await settle();
  assert.equal(behindRan, false);
  await assert.rejects(
    first,
    (err: unknown) => err instanceof CsiError && err.code === Code.UNAVAILABLE,
  );
  assert.equal(await behind, "behind", "it went although b is still held");
  b.release();
});

Deno.test("withLock says so when a free key was kept by earlier callers still in line", async () => {
  const locks = new KeyedLock();
  const b = locks.tryAcquire(["b"])!;
  const first = withLock(locks, ["a", "b"], () => Promise.resolve(), { timeoutMs: 1_000 });
  await assert.rejects(
    withLock(locks, ["a"], () => Promise.resolve(), { timeoutMs: 10 }),
    (err: unknown) =>
      err instanceof CsiError && err.code === Code.UNAVAILABLE &&
      /for "a"; earlier calls for the same keys were still waiting\./.test(err.message),
  );
  b.release();
  await first;
});
