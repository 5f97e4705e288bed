import assert from "node:assert/strict";
import { Code, CsiError } from "./errors.ts";
import { KeyedLock, withLock } from "./lock.ts";

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

Deno.test("withLock answers ABORTED at once while a key is held", async () => {
  const locks = new KeyedLock();
  const held = locks.tryAcquire(["tank/nomad/v1"])!;
  let ran = false;
  await assert.rejects(
    withLock(locks, ["tank/nomad/v1"], () => {
      ran = true;
      return Promise.resolve(1);
    }),
    (err: unknown) => {
      assert.ok(err instanceof CsiError);
      assert.equal(err.code, Code.ABORTED);
      assert.equal(
        err.message,
        'An operation is already in progress for "tank/nomad/v1"; retry later',
      );
      return true;
    },
  );
  assert.equal(ran, false);
  held.release();
  assert.equal(await withLock(locks, ["tank/nomad/v1"], () => Promise.resolve(7)), 7);
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
});

Deno.test("withLock lets a second caller in only after the first one finishes", async () => {
  const locks = new KeyedLock();
  const { promise, resolve } = Promise.withResolvers<string>();
  const first = withLock(locks, ["k"], () => promise);
  await assert.rejects(withLock(locks, ["k"], () => Promise.resolve("second")), CsiError);
  resolve("first");
  assert.equal(await first, "first");
  assert.equal(await withLock(locks, ["k"], () => Promise.resolve("second")), "second");
});
