import assert from "node:assert/strict";
import { RecentMap } from "./recent_map.ts";

Deno.test("RecentMap keeps the newest entries up to its limit", () => {
  const m = new RecentMap<string, number>(3);
  for (let i = 0; i < 10; i++) m.set(`k${i}`, i);
  assert.equal(m.size, 3);
  assert.deepEqual(["k6", "k7", "k8", "k9"].map((k) => m.get(k)), [undefined, 7, 8, 9]);
});

Deno.test("RecentMap: setting an entry again makes it the newest", () => {
  const m = new RecentMap<string, number>(2);
  m.set("a", 1).set("b", 2).set("a", 3).set("c", 4);
  assert.equal(m.get("a"), 3, "a was set again after b, so b went first");
  assert.equal(m.get("b"), undefined);
  assert.equal(m.get("c"), 4);
});

Deno.test("RecentMap.delete forgets an entry; a bad limit is refused", () => {
  const m = new RecentMap<string, number>(2);
  m.set("a", 1);
  assert.equal(m.delete("a"), true);
  assert.equal(m.get("a"), undefined);
  assert.equal(m.size, 0);
  assert.throws(() => new RecentMap(0), RangeError);
  assert.throws(() => new RecentMap(1.5), RangeError);
});
