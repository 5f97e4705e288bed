import assert from "node:assert/strict";
import { MemoryStore } from "../../tests/support/memory_store.ts";
import { Code, CsiError } from "../errors.ts";
import { acquire, createOwner, moveHead, readOwner, renew } from "./owner.ts";
import { FencedError } from "./owner.ts";
import { takeover } from "./takeover.ts";

const never = () => ({ ok: false as const, message: "held" });

Deno.test("takeover releases a lost holder's volume, fencing it, and the next acquirer gets the head", async () => {
  const store = new MemoryStore();
  await createOwner(store, "db:5b0:5d", {
    volume: "db[0]",
    uid: "a".repeat(32),
    ttlSeconds: 30,
    settings: { capacityBytes: 0, properties: {} },
    nowMs: 0,
  });
  let a = (await acquire(store, "db:5b0:5d", {
    node: "node-a",
    nowMs: 0,
    ttlSeconds: 30,
    mayTakeOver: never,
  })).holding;
  a = await moveHead(store, "db:5b0:5d", a, { guid: "9", createdAt: "2026-01-01T00:00:00Z" }, 0);
  const out = await takeover(store, "db[0]", { by: "operator", nowMs: 1 });
  assert.equal(out.changed, true);
  assert.match(out.message, /taken from node "node-a" \(generation 1/);
  assert.match(out.message, /receives the store's last copy, from 2026-01-01T00:00:00Z/);
  await assert.rejects(() => renew(store, "db:5b0:5d", a, 2), FencedError);
  const b = await acquire(store, "db:5b0:5d", {
    node: "node-b",
    nowMs: 3,
    ttlSeconds: 30,
    mayTakeOver: never,
  });
  assert.equal(b.holding.record.head, "9");
  assert.equal(b.holding.record.generation, 3);
  // Nothing held: nothing to do, said so.
  const idle = await takeover(store, "db[0]", { by: "operator", nowMs: 4 });
  assert.equal(idle.changed, true, "node-b held it");
  const again = await takeover(store, "db[0]", { by: "operator", nowMs: 5 });
  assert.equal(again.changed, false);
  assert.match(again.message, /is not held/);
  assert.equal((await readOwner(store, "db:5b0:5d"))!.record.generation, 4);
});

Deno.test("takeover of a volume the store does not know is NOT_FOUND", async () => {
  await assert.rejects(() => takeover(new MemoryStore(), "nope", { by: "x", nowMs: 0 }), (err) => {
    assert.ok(err instanceof CsiError);
    assert.equal(err.code, Code.NOT_FOUND);
    return true;
  });
});
