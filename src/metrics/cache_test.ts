import assert from "node:assert/strict";
import { SharedCache } from "./cache.ts";

function clock() {
  let t = 1000;
  return { now: () => t, advance: (ms: number) => void (t += ms) };
}

Deno.test("SharedCache serves one load for its TTL, then loads again", async () => {
  const c = clock();
  let loads = 0;
  const cache = new SharedCache(() => Promise.resolve(++loads), { ttlMs: 5000, now: c.now });
  assert.equal(await cache.get(), 1);
  c.advance(4999);
  assert.equal(await cache.get(), 1);
  c.advance(1);
  assert.equal(await cache.get(), 2);
  assert.equal(loads, 2);
});

Deno.test("SharedCache gives concurrent callers the one load in flight", async () => {
  const c = clock();
  let loads = 0;
  const { promise: gate, resolve: open } = Promise.withResolvers<void>();
  const cache = new SharedCache(async () => {
    loads++;
    await gate;
    return `value ${loads}`;
  }, { ttlMs: 5000, now: c.now });
  const callers = [cache.get(), cache.get(), cache.get()];
  // Even past the TTL, a load in flight is shared rather than doubled.
  c.advance(10_000);
  callers.push(cache.get());
  open();
  assert.deepEqual(await Promise.all(callers), Array(4).fill("value 1"));
  assert.equal(loads, 1);
});

Deno.test("SharedCache keeps no failed load: the next caller tries again", async () => {
  const c = clock();
  let loads = 0;
  const cache = new SharedCache(() => {
    loads++;
    if (loads === 1) throw new Error("zfs is down");
    return Promise.resolve("ok");
  }, { ttlMs: 5000, now: c.now });
  const [a, b] = await Promise.allSettled([cache.get(), cache.get()]);
  assert.equal(a.status, "rejected");
  assert.equal(b.status, "rejected");
  assert.equal(loads, 1, "both callers shared the failed load");
  assert.equal(await cache.get(), "ok");
  assert.equal(loads, 2);
});
