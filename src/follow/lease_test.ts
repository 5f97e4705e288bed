import assert from "node:assert/strict";
import {
  createFollowOwner,
  FaultyStore,
  holdAs,
  settle,
  VirtualTime,
} from "../../tests/support/follow_harness.ts";
import { MemoryStore } from "../../tests/support/memory_store.ts";
import { Logger } from "../log.ts";
import { ownerKey } from "../store/layout.ts";
import { BoundedStore, StoreWaitError } from "../store/wait.ts";
import { LeaseKeeper, renewalLimitMs } from "./lease.ts";
import { readOwner } from "./owner.ts";

const TTL_S = 30;

Deno.test("renewalLimitMs is shorter than the renewal period, so a hung renewal never blocks the next", () => {
  for (const ttl of [3, 30, 300]) {
    assert.ok(renewalLimitMs(ttl) < (ttl * 1000) / 3, `TTL ${ttl}s`);
    assert.ok(renewalLimitMs(ttl) > 0);
  }
});

Deno.test("LeaseKeeper gives up a renewal the store never answers and sends the next on time", async () => {
  const vt = new VirtualTime();
  const store = new MemoryStore();
  await createFollowOwner(store);
  const held = await holdAs(store, "n1");
  const faulty = new FaultyStore(store);
  faulty.inject(
    (c) => c.op === "putBytes" && c.key === ownerKey("pg"),
    { kind: "hold", until: new Promise<void>(() => {}) },
    1,
  );
  const lines: string[] = [];
  const lease = new LeaseKeeper(faulty, "pg", held, {
    ttlSeconds: TTL_S,
    clocks: { now: vt.now, monotonic: vt.monotonic },
    timers: vt.timers,
    log: new Logger("debug", {}, (l) => lines.push(l)),
  });
  const puts = () => faulty.calls.filter((c) => c.op === "putBytes").length;
  await vt.advance(TTL_S * 1000 / 3);
  assert.equal(puts(), 1, "the first renewal went out, and hangs");
  await vt.advance(TTL_S * 1000 / 3);
  assert.equal(puts(), 2, "the hung renewal was given up, and the next one sent");
  await settle();
  assert.notEqual((await readOwner(store, "pg"))!.etag, held.etag, "the next one landed");
  assert.ok(lines.some((l) => /did not answer within/.test(l)), lines.join("\n"));
  const last = await lease.stop();
  assert.equal(last.etag, (await readOwner(store, "pg"))!.etag);
});

Deno.test("LeaseKeeper renews outside the store wait of the call it was started in: a spent --store-wait does not stop it", async () => {
  const vt = new VirtualTime();
  const store = new MemoryStore();
  await createFollowOwner(store);
  const held = await holdAs(store, "n1");
  const faulty = new FaultyStore(store);
  faulty.inject((c) => c.key === "stalls", { kind: "hold", until: new Promise<void>(() => {}) });
  // Every request runs for one NodeStage, whose budget a stalled read spends.
  const ctx = { operation: 'NodeStageVolume "pg"', signal: new AbortController().signal };
  const bounded = new BoundedStore(faulty, { limitMs: 20, call: () => ctx });
  await assert.rejects(() => bounded.getBytes("stalls"), StoreWaitError);
  const lease = new LeaseKeeper(bounded, "pg", held, {
    ttlSeconds: TTL_S,
    clocks: { now: vt.now, monotonic: vt.monotonic },
    timers: vt.timers,
    log: new Logger("error", {}, () => {}),
  });
  await vt.advance(TTL_S * 1000 / 3);
  await settle();
  assert.notEqual((await readOwner(store, "pg"))!.etag, held.etag, "the renewal landed");
  await lease.stop();
});
