/**
 * Self-fencing (issue 21, the holder cut off from the store): on virtual time, with the store in
 * front of one node made to fail (FaultyStore), the real FollowVolumes of a holder and of a
 * taker over one MemoryStore, each on its own fake pool. "Read-only" here is the dataset's
 * `readonly` property, as zfs reports it: OpenZFS remounts a mounted filesystem read-only when it
 * is set, zfs-fuse does not (there the job's open files stay writable; the integration test
 * samples the property for that reason, and the VM run shows the remount).
 */

import assert from "node:assert/strict";
import {
  createFollowOwner,
  DATASET as DS,
  FaultyStore,
  type FollowHarness,
  followHarness,
  holdAs,
  settle,
  VirtualTime,
} from "../../tests/support/follow_harness.ts";
import type { MemoryStore } from "../../tests/support/memory_store.ts";
import { ownerKey } from "../store/layout.ts";
import { BoundedStore, StoreWaitError } from "../store/wait.ts";
import { FOLLOW_GENERATION_PROPERTY, FOLLOW_RELEASED_PROPERTY } from "./copy.ts";
import { type FollowDeps, FollowVolumes } from "./mover.ts";
import { forceRelease, type Holding, readOwner } from "./owner.ts";
import { FOLLOW_SUSPENDED_PROPERTY } from "./selffence.ts";

const TTL_MS = 30_000;
const TAKEOVER_AFTER_MS = 5_000;

/** Node `node` (default "n1") with volume "pg" released in `store` (or a new one). */
async function nodeOn(node = "n1", store?: MemoryStore): Promise<FollowHarness> {
  const h = followHarness({ node });
  if (store) {
    const deps = { ...h.deps, store, receive: { ...h.deps.receive, store } };
    return { ...h, store, deps, copyDeps: { ...h.copyDeps, store } };
  }
  await createFollowOwner(h.store);
  return h;
}

/** `h`'s FollowVolumes on `vt`, reaching the store through `store`, with `more` on top. */
function follow(
  h: FollowHarness,
  vt: VirtualTime,
  store: FollowDeps["store"],
  more: Partial<FollowDeps> = {},
): FollowVolumes {
  return new FollowVolumes({
    ...h.deps,
    store,
    receive: { ...h.deps.receive, store },
    now: vt.now,
    monotonic: vt.monotonic,
    timers: vt.timers,
    ...more,
  });
}

/** `zfs create` of the copy succeeds on `h`'s pool (a volume with no head yet). */
function creates(h: FollowHarness): void {
  h.runner.on(["zfs", "create"], () => {
    h.pool.add(DS, { "org.zfs-csi:managed": "yes" });
    return { code: 0 };
  });
}

/** Every store call of `pg`'s owner object fails (503) from now on, until the returned heal. */
function cutOff(store: FaultyStore): () => void {
  return store.inject((c) => c.key === ownerKey("pg"), { kind: "unavailable" });
}

/** The lines logged at error level whose message matches `re`. */
function errors(h: FollowHarness, re: RegExp): string[] {
  return h.logs.filter((l) => l.includes('"level":"error"') && re.test(l));
}

/** This node's copy of "pg" as a restarted plugin finds it: held here under `held`, writable. */
function leftHeld(h: FollowHarness, held: Holding, more: Record<string, string> = {}): void {
  h.pool.add(DS, {
    "org.zfs-csi:managed": "yes",
    [FOLLOW_GENERATION_PROPERTY]: String(held.record.generation),
    [FOLLOW_RELEASED_PROPERTY]: "none",
    readonly: "off",
    ...more,
  });
}

Deno.test("self-fencing: the store down for 0.8 TTL makes the held copy read-only at 0.75 TTL, and writable again once a renewal lands", async () => {
  const vt = new VirtualTime();
  const h = await nodeOn();
  const faulty = new FaultyStore(h.store);
  const a = follow(h, vt, faulty, { takeoverAfterMs: TAKEOVER_AFTER_MS });
  creates(h);
  await a.prepareStage({ name: "pg", dataset: DS });
  assert.equal(h.pool.value(DS, "readonly"), "off");
  a.start();
  await settle();
  // The last write that landed was sent at `t0` (the first renewal of start()).
  const t0 = vt.mono;
  const heal = cutOff(faulty);
  await vt.advance(0.75 * TTL_MS - 100);
  assert.equal(h.pool.value(DS, "readonly"), "off", "writable until three quarters of the TTL");
  await vt.advance(100);
  assert.equal(h.pool.value(DS, "readonly"), "on", "read-only at 0.75 TTL after the last write");
  assert.equal(h.pool.value(DS, FOLLOW_SUSPENDED_PROPERTY), "on", "marked suspended");
  assert.equal(h.pool.value(DS, FOLLOW_RELEASED_PROPERTY), "none", "still held here, not fenced");
  assert.deepEqual(a.fenceState().map((f) => [f.volume, f.suspended]), [["pg", true]]);
  const line = errors(h, /not renewed in time/);
  assert.equal(line.length, 1, h.logs.join("\n"));
  assert.match(line[0]!, /"msSinceLastWrite":22500/);
  assert.match(line[0]!, /"volume":"pg"/);
  assert.match(line[0]!, /until a write to the store proves it still holds the volume/);
  // The store answers again at 0.8 TTL; the next renewal (every third of the TTL) lands.
  await vt.advance(0.8 * TTL_MS - (vt.mono - t0));
  heal();
  await vt.advance(TTL_MS - (vt.mono - t0));
  assert.equal(h.pool.value(DS, "readonly"), "off", "writable again after the renewal");
  assert.equal(h.pool.value(DS, FOLLOW_SUSPENDED_PROPERTY), "off");
  const r = (await readOwner(h.store, "pg"))!.record;
  assert.deepEqual([r.holder, r.generation, r.state], ["n1", 1, "held"]);
  assert.equal(r.selfFence, true, "the holder promised it in the owner object");
  assert.equal(errors(h, /later than the lease allows/).length, 0);
  a.stop();
});

Deno.test("self-fencing: a holder without --takeover-after keeps its copy writable through a store outage", async () => {
  const vt = new VirtualTime();
  const h = await nodeOn();
  const faulty = new FaultyStore(h.store);
  const a = follow(h, vt, faulty);
  creates(h);
  await a.prepareStage({ name: "pg", dataset: DS });
  assert.equal((await readOwner(h.store, "pg"))!.record.selfFence, undefined, "no promise");
  a.start();
  await settle();
  cutOff(faulty);
  await vt.advance(10 * TTL_MS);
  assert.equal(h.pool.value(DS, "readonly"), "off", "only an explicit takeover can take it");
  a.stop();
});

Deno.test("self-fencing: a taker with --takeover-after waits TTL + takeover-after, and the holder's copy is read-only before the taker's is writable", async () => {
  const vt = new VirtualTime();
  const ha = await nodeOn();
  const faulty = new FaultyStore(ha.store);
  const a = follow(ha, vt, faulty, { takeoverAfterMs: TAKEOVER_AFTER_MS });
  creates(ha);
  await a.prepareStage({ name: "pg", dataset: DS });
  a.start();
  await settle();
  const lastWrite = vt.mono;
  const healA = cutOff(faulty);
  // node-b reaches the store; at the instant it makes its copy writable, what is A's?
  const hb = await nodeOn("node-b", ha.store);
  creates(hb);
  let aWhenBOpened: string | undefined;
  let bOpenedAt: number | undefined;
  hb.pool.hook = (argv) => {
    if (argv[1] === "set" && argv.includes("readonly=off")) {
      aWhenBOpened = ha.pool.value(DS, "readonly");
      bOpenedAt = vt.mono;
    }
    return undefined;
  };
  const b = follow(hb, vt, ha.store, { takeoverAfterMs: TAKEOVER_AFTER_MS });
  let refusals = 0;
  for (;;) {
    try {
      await b.prepareStage({ name: "pg", dataset: DS });
      break;
    } catch (err) {
      assert.match(String(err), /held by node "n1".*may be taken over once/s);
      refusals++;
    }
    assert.ok(vt.mono - lastWrite < 10 * TTL_MS, "node-b never took the volume over");
    await vt.advance(1_000);
  }
  assert.ok(refusals > 0);
  assert.ok(
    bOpenedAt! - lastWrite >= TTL_MS + TAKEOVER_AFTER_MS,
    `taken over ${bOpenedAt! - lastWrite} ms after the holder's last write`,
  );
  assert.equal(aWhenBOpened, "on", "the holder's copy was read-only when the taker's opened");
  assert.equal(hb.pool.value(DS, "readonly"), "off");
  assert.equal(ha.pool.value(DS, FOLLOW_RELEASED_PROPERTY), "none", "suspended, not fenced");
  // A reaches the store again: its next renewal is refused, and its copy is fenced.
  healA();
  await vt.advance(TTL_MS / 3);
  assert.equal(ha.pool.value(DS, FOLLOW_RELEASED_PROPERTY), "fenced");
  assert.equal(ha.pool.value(DS, "readonly"), "on");
  assert.equal(ha.pool.value(DS, FOLLOW_SUSPENDED_PROPERTY), "off", "no longer suspended");
  assert.deepEqual(a.fenceState(), [], "no longer watched");
  assert.equal(hb.pool.value(DS, "readonly"), "off", "B keeps the volume");
  a.stop();
  b.stop();
});

Deno.test("self-fencing: a holder whose owner object does not promise it is never taken over by the rule, only explicitly", async () => {
  const vt = new VirtualTime();
  const ha = await nodeOn();
  // n1 holds "pg" as a node without --takeover-after (or of an older version) writes it.
  await holdAs(ha.store, "n1");
  const hb = await nodeOn("node-b", ha.store);
  creates(hb);
  const b = follow(hb, vt, ha.store, { takeoverAfterMs: TAKEOVER_AFTER_MS });
  for (let i = 0; i < 24; i++) {
    await assert.rejects(b.prepareStage({ name: "pg", dataset: DS }), (err: unknown) => {
      assert.match(
        String(err),
        /node "n1" runs without --takeover-after and does not fence itself: take it over explicitly with "zfs-csi takeover pg" once it is gone/i,
      );
      return true;
    });
    await vt.advance(3_600_000);
  }
  assert.equal((await readOwner(ha.store, "pg"))!.record.holder, "n1", "a day later: still n1's");
  await forceRelease(ha.store, "pg", { by: "an operator", nowMs: vt.now() });
  await b.prepareStage({ name: "pg", dataset: DS });
  assert.equal((await readOwner(ha.store, "pg"))!.record.holder, "node-b");
});

Deno.test("self-fencing after a restart: a copy left writable stays so only if its first renewal lands within a quarter of the TTL; taken over, it is fenced at once", async (t) => {
  const cases = [
    { name: "store answers", store: "up", promised: true, atStart: "off", after: "off" },
    { name: "taken over meanwhile", store: "taken", promised: true, atStart: "on", after: "on" },
    { name: "store down, promised", store: "down", promised: true, atStart: "off", after: "on" },
    {
      name: "store stalls, promised",
      store: "stalls",
      promised: true,
      atStart: "off",
      after: "on",
    },
    {
      name: "store down, no promise",
      store: "down",
      promised: false,
      atStart: "off",
      after: "off",
    },
  ] as const;
  for (const c of cases) {
    await t.step(c.name, async () => {
      const vt = new VirtualTime();
      const h = await nodeOn();
      // The killed plugin held "pg" here; the job still runs on its copy.
      const held = await holdAs(h.store, "n1", { selfFence: c.promised });
      leftHeld(h, held);
      if (c.store === "taken") {
        await holdAs(h.store, "node-b", { mayTakeOver: () => ({ ok: true }) });
      }
      const faulty = new FaultyStore(h.store);
      if (c.store === "down") cutOff(faulty);
      // A store that accepts the requests and never answers.
      if (c.store === "stalls") {
        faulty.inject(() => true, { kind: "hold", until: new Promise(() => {}) });
      }
      // Started again, with the flags it had.
      const a = follow(h, vt, faulty, c.promised ? { takeoverAfterMs: TAKEOVER_AFTER_MS } : {});
      a.start();
      await settle();
      assert.equal(h.pool.value(DS, "readonly"), c.atStart, "at start, before any time passed");
      if (c.store === "taken") assert.equal(h.pool.value(DS, FOLLOW_RELEASED_PROPERTY), "fenced");
      await vt.advance(0.25 * TTL_MS - 1);
      assert.equal(h.pool.value(DS, "readonly"), c.atStart, "within the grace");
      await vt.advance(1);
      assert.equal(h.pool.value(DS, "readonly"), c.after, "a quarter of the TTL after the start");
      if (c.after === "on" && c.store !== "taken") {
        assert.equal(h.pool.value(DS, FOLLOW_SUSPENDED_PROPERTY), "on");
        assert.equal(h.pool.value(DS, FOLLOW_RELEASED_PROPERTY), "none", "still held here");
        assert.match(errors(h, /not renewed in time/)[0] ?? "", /none since this plugin started/);
      }
      if (c.store === "down" && !c.promised) {
        assert.equal(errors(h, /cannot renew its lease: the copy is left writable/).length, 1);
        assert.equal(errors(h, /not renewed in time/).length, 0);
      }
      if (c.store === "up") {
        // Watched from its first renewal: a later outage suspends it 0.75 TTL after that.
        cutOff(faulty);
        await vt.advance(0.5 * TTL_MS - 1);
        assert.equal(h.pool.value(DS, "readonly"), "off");
        await vt.advance(1);
        assert.equal(h.pool.value(DS, "readonly"), "on");
      }
      a.stop();
    });
  }
});

Deno.test("self-fencing after a restart: a copy left suspended is made writable again by the first renewal that lands, and kept read-only until then", async (t) => {
  // zfs-fuse reports a mounted copy's readonly as the mount's ("off") after `zfs set
  // readonly=on`, which it enforces: the marker is what says the copy is suspended.
  for (const readonly of ["on", "off"]) {
    await t.step(`readonly reads "${readonly}"`, async () => {
      const vt = new VirtualTime();
      const h = await nodeOn();
      const held = await holdAs(h.store, "n1", { selfFence: true });
      leftHeld(h, held, { readonly, [FOLLOW_SUSPENDED_PROPERTY]: "on" });
      const faulty = new FaultyStore(h.store);
      const heal = cutOff(faulty);
      const a = follow(h, vt, faulty, { takeoverAfterMs: TAKEOVER_AFTER_MS });
      a.start();
      await settle();
      assert.equal(
        h.pool.value(DS, "readonly"),
        "on",
        "read-only while nothing proves the holding",
      );
      assert.equal(h.pool.value(DS, FOLLOW_SUSPENDED_PROPERTY), "on");
      assert.deepEqual(a.fenceState().map((f) => f.suspended), [true]);
      heal();
      await vt.advance(TTL_MS / 3);
      assert.equal(h.pool.value(DS, "readonly"), "off");
      assert.equal(h.pool.value(DS, FOLLOW_SUSPENDED_PROPERTY), "off");
      a.stop();
    });
  }
});

Deno.test("self-fencing after a restart: a copy left read-only without the marker (a release cut short) is renewed, never made writable", async () => {
  const vt = new VirtualTime();
  const h = await nodeOn();
  const held = await holdAs(h.store, "n1", { selfFence: true });
  leftHeld(h, held, { readonly: "on" });
  const a = follow(h, vt, h.store, { takeoverAfterMs: TAKEOVER_AFTER_MS });
  a.start();
  await settle();
  assert.notEqual((await readOwner(h.store, "pg"))!.etag, held.etag, "its lease is renewed");
  assert.equal(h.pool.value(DS, "readonly"), "on");
  assert.deepEqual(a.fenceState(), []);
  a.stop();
});

Deno.test("self-fencing: a zfs set that ends past the TTL is logged as an error, and later suspensions start earlier", async () => {
  const vt = new VirtualTime();
  const h = await nodeOn();
  const faulty = new FaultyStore(h.store);
  const a = follow(h, vt, faulty, { takeoverAfterMs: TAKEOVER_AFTER_MS });
  creates(h);
  await a.prepareStage({ name: "pg", dataset: DS });
  a.start();
  await settle();
  let slow = true;
  h.pool.hook = (argv) => {
    // zfs takes 10 s to make the copy read-only (a busy pool): it ends at 32.5 s, past the TTL.
    if (slow && argv[1] === "set" && argv.includes("readonly=on")) {
      vt.mono += 10_000;
      vt.wall += 10_000;
    }
    return undefined;
  };
  const t0 = vt.mono;
  const heal = cutOff(faulty);
  await vt.advance(0.75 * TTL_MS);
  assert.equal(h.pool.value(DS, "readonly"), "on");
  const late = errors(h, /later than the lease allows/);
  assert.equal(late.length, 1, h.logs.join("\n"));
  assert.match(late[0]!, /"zfsSetMs":10000/);
  assert.match(late[0]!, /"msSinceLastWrite":32500/);
  // Writable again once the store answers; the next outage suspends it 7.5 s earlier (the
  // learnt lead is at most a quarter of the TTL).
  slow = false;
  heal();
  await vt.advance(TTL_MS / 3);
  assert.equal(h.pool.value(DS, "readonly"), "off");
  const state = a.fenceState()[0]!;
  const lastWrite = vt.mono - state.sinceWriteMs!;
  assert.ok(lastWrite > t0);
  cutOff(faulty);
  await vt.advance(lastWrite + 0.5 * TTL_MS - 1 - vt.mono);
  assert.equal(h.pool.value(DS, "readonly"), "off");
  await vt.advance(1);
  assert.equal(h.pool.value(DS, "readonly"), "on", "suspended at half the TTL now");
  a.stop();
});

Deno.test("self-fencing: a renewal answered later than a quarter of the TTL after it was sent is given up and does not make the copy writable again, even when its answer comes; the next one does", async () => {
  const vt = new VirtualTime();
  const h = await nodeOn();
  const faulty = new FaultyStore(h.store);
  const a = follow(h, vt, faulty, { takeoverAfterMs: TAKEOVER_AFTER_MS });
  creates(h);
  await a.prepareStage({ name: "pg", dataset: DS });
  a.start();
  await settle();
  const t0 = vt.mono;
  const heal = cutOff(faulty);
  await vt.advance(0.8 * TTL_MS);
  assert.equal(h.pool.value(DS, "readonly"), "on");
  heal();
  // The renewal sent at 1.0 TTL lands at once, and its answer comes 0.3 TTL later: within
  // the proof's margin (half the TTL), but past the renewal's own limit (a quarter).
  let answer = () => {};
  faulty.inject(
    (c) => c.op === "putBytes" && c.key === ownerKey("pg"),
    { kind: "late", until: new Promise<void>((r) => answer = r) },
    1,
  );
  await vt.advance(t0 + TTL_MS - vt.mono);
  await vt.advance(0.3 * TTL_MS - 10);
  answer();
  await settle();
  assert.equal(
    h.pool.value(DS, "readonly"),
    "on",
    "a renewal given up proves nothing, whenever its answer comes",
  );
  assert.equal(errors(h, /later than the lease allows/).length, 0);
  // The next round (every third of the TTL) lands and is answered at once.
  await vt.advance(t0 + TTL_MS + TTL_MS / 3 - vt.mono);
  assert.equal(h.pool.value(DS, "readonly"), "off");
  a.stop();
});

Deno.test("lease renewal: a renewal the store never answers is abandoned within a third of the TTL and the next one is sent, so the copy stays writable", async () => {
  const vt = new VirtualTime();
  const h = await nodeOn();
  const faulty = new FaultyStore(h.store);
  const a = follow(h, vt, faulty, { takeoverAfterMs: TAKEOVER_AFTER_MS });
  creates(h);
  await a.prepareStage({ name: "pg", dataset: DS });
  a.start();
  await settle();
  const t0 = vt.mono;
  const before = (await readOwner(h.store, "pg"))!.etag;
  // The next write of the owner object reaches a server that stalls for ever (no answer, not
  // landed); the S3 client's own limits are a minute per try, longer than the TTL.
  faulty.inject(
    (c) => c.op === "putBytes" && c.key === ownerKey("pg"),
    { kind: "hold", until: new Promise<void>(() => {}) },
    1,
  );
  const puts = () =>
    faulty.calls.filter((c) => c.op === "putBytes" && c.key === ownerKey("pg")).length;
  const sent = puts();
  await vt.advance(TTL_MS / 3);
  assert.equal(puts(), sent + 1, "the renewal at 1/3 TTL went out, and hangs");
  await vt.advance(TTL_MS / 3);
  assert.equal(puts(), sent + 2, "the hung renewal was given up, and the next one sent");
  assert.notEqual((await readOwner(h.store, "pg"))!.etag, before, "the next one landed");
  await vt.advance(2 * TTL_MS - (vt.mono - t0));
  assert.equal(h.pool.value(DS, "readonly"), "off", "never suspended");
  assert.equal(errors(h, /not renewed in time/).length, 0, h.logs.join("\n"));
  a.stop();
});

Deno.test("a stage whose --store-wait ran out hands the volume back with a budget of its own", async () => {
  const vt = new VirtualTime();
  const h = await nodeOn();
  const faulty = new FaultyStore(h.store);
  // The stage's proof (the second write of the owner object, after the acquire) stalls.
  let writes = 0;
  faulty.inject(
    (c) => c.op === "putBytes" && c.key === ownerKey("pg") && ++writes === 2,
    { kind: "hold", until: new Promise<void>(() => {}) },
    1,
  );
  const ctx = { operation: 'NodeStageVolume "pg"', signal: new AbortController().signal };
  const bounded = new BoundedStore(faulty, { limitMs: 20, call: () => ctx });
  const a = follow(h, vt, bounded, { takeoverAfterMs: TAKEOVER_AFTER_MS });
  creates(h);
  await assert.rejects(() => a.prepareStage({ name: "pg", dataset: DS }), StoreWaitError);
  const r = (await readOwner(h.store, "pg"))!.record;
  assert.deepEqual([r.holder, r.state], ["n1", "released"], "handed back, head unchanged");
  assert.notEqual(h.pool.value(DS, "readonly"), "off", "the copy was never made writable");
});
