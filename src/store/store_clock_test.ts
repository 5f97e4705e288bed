import assert from "node:assert/strict";
import { MemoryStore } from "../../tests/support/memory_store.ts";
import { clockProbeKey, readStoreClock } from "./store_clock.ts";
import { StoreError } from "./store.ts";

Deno.test("readStoreClock gives the store's clock when its probe was written, and removes the probe", async () => {
  let storeMs = 5_000;
  const store = new MemoryStore({ clock: () => storeMs++ });
  await store.putBytes("v1/volumes/a/volume.json", new Uint8Array([1]));
  assert.equal(await readStoreClock(store, "n1"), 5_001);
  assert.equal(await readStoreClock(store, "n1"), 5_002);
  assert.deepEqual(store.keys(), ["v1/volumes/a/volume.json"]);
  // One probe per node, named after it: two nodes never share one.
  assert.equal(clockProbeKey("n1"), "v1/probe/clock-n1");
  assert.notEqual(clockProbeKey("n1"), clockProbeKey("n2"));
});

Deno.test("readStoreClock gives undefined for a store without times, and throws what the store throws", async () => {
  const store = new MemoryStore();
  assert.equal(await readStoreClock(store, "n1"), undefined);
  assert.deepEqual(store.keys(), []);
  store.putBytes = () => Promise.reject(new StoreError("unavailable", "down"));
  await assert.rejects(() => readStoreClock(store, "n1"), (err) => {
    assert.ok(err instanceof StoreError && err.kind === "unavailable");
    return true;
  });
});

Deno.test("readStoreClock reads only its own probe's time, not a longer key's", async () => {
  let storeMs = 1_000;
  const store = new MemoryStore({ clock: () => storeMs });
  await store.putBytes(clockProbeKey("n10"), new Uint8Array([1]));
  storeMs = 2_000;
  assert.equal(await readStoreClock(store, "n1"), 2_000);
  assert.deepEqual(store.keys(), [clockProbeKey("n10")]);
});

Deno.test("readStoreClock fails as unavailable when the probe it wrote is not listed, and leaves nothing", async () => {
  const store = new MemoryStore({ clock: () => 1_000 });
  const list = store.list.bind(store);
  // Another reader of the same node deletes the probe between the write and the listing.
  store.list = async (prefix, options) => {
    await store.delete(clockProbeKey("n1"));
    return await list(prefix, options);
  };
  await assert.rejects(() => readStoreClock(store, "n1"), (err) => {
    assert.ok(err instanceof StoreError && err.kind === "unavailable");
    assert.match(err.message, /did not list "v1\/probe\/clock-n1"/);
    return true;
  });
  assert.deepEqual(store.keys(), []);
});
