import assert from "node:assert/strict";
import { Prng, seedFrom } from "./prng.ts";

Deno.test("Prng gives the same numbers for the same seed and others for another", () => {
  const a = new Prng(42);
  const b = new Prng(42);
  const seq = Array.from({ length: 20 }, () => a.next());
  assert.deepEqual(Array.from({ length: 20 }, () => b.next()), seq);
  assert.notDeepEqual(Array.from({ length: 20 }, () => new Prng(43).next()), seq);
  assert.ok(seq.every((x) => x >= 0 && x < 1));
  assert.ok(new Set(seq).size > 15, "numbers vary");
});

Deno.test("Prng.int stays in its range and reaches both ends", () => {
  const r = new Prng(7);
  const seen = new Set(Array.from({ length: 500 }, () => r.int(1, 4)));
  assert.deepEqual([...seen].sort(), [1, 2, 3, 4]);
  assert.equal(new Prng(1).bytes(16).length, 16);
  assert.throws(() => new Prng(1).pick([]), RangeError);
});

Deno.test("seedFrom reads a number, random, or the fallback, and refuses anything else", () => {
  assert.equal(seedFrom(undefined, 5), 5);
  assert.equal(seedFrom("", 5), 5);
  assert.equal(seedFrom("123", 5), 123);
  const r = seedFrom("random", 5);
  assert.ok(Number.isInteger(r) && r >= 0 && r < 2 ** 32);
  for (const bad of ["-1", "1.5", "abc", "4294967296"]) {
    assert.throws(() => seedFrom(bad, 5), RangeError, bad);
  }
  assert.throws(() => new Prng(-1), RangeError);
});
