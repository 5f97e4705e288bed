/**
 * FollowVolumes' bookkeeping on a fake pool and the in-memory store: lease renewal, the head
 * moving only forward, fencing of a copy whose volume was taken over, and releases. The moves
 * with real receives run in tests/integration/follow_*_test.ts.
 */

import assert from "node:assert/strict";
import {
  alwaysTakeOver,
  createFollowOwner,
  DATASET as DS,
  FaultyStore,
  followHarness,
  type FollowHarnessOptions,
  followManifest as manifest,
  holdAs,
  PARENT,
  settle,
  settleUntil,
  storeManifests,
  VirtualTime,
} from "../../tests/support/follow_harness.ts";
import { gate } from "../../tests/support/fake_runner.ts";
import type { MemoryStore } from "../../tests/support/memory_store.ts";
import type { BackupOutcome } from "../replicate/backup.ts";
import type { SnapshotManifest } from "../store/layout.ts";
import { FOLLOW_GENERATION_PROPERTY, FOLLOW_RELEASED_PROPERTY } from "./copy.ts";
import { type FollowDeps, FollowVolumes } from "./mover.ts";
import {
  acquire,
  HeldElsewhereError,
  type Holding,
  moveHead,
  readOwner,
  release,
} from "./owner.ts";
import { judgeTakeover, LeaseObserver } from "./rule.ts";
import { ownerKey } from "../store/layout.ts";

/** Node "n1" and volume "pg", released, with stored snapshots 1 ← 2 and 3 (another chain). */
async function setup(opts: Pick<FollowHarnessOptions, "backup" | "ttlSeconds"> = {}) {
  const h = followHarness(opts);
  const follow = new FollowVolumes(h.deps);
  await createFollowOwner(h.store);
  await storeManifests(h.store, [manifest("1", null), manifest("2", "1"), manifest("3", null)]);
  return { ...h, follow };
}

/** This node holds "pg" under the generation acquire gives, its copy marked so. */
async function holdHere(s: Awaited<ReturnType<typeof setup>>): Promise<Holding> {
  const holding = await holdAs(s.store, "n1");
  s.pool.add(DS, {
    "org.zfs-csi:managed": "yes",
    [FOLLOW_GENERATION_PROPERTY]: String(holding.record.generation),
    [FOLLOW_RELEASED_PROPERTY]: "none",
    readonly: "off",
    "org.zfs-csi:backup-interval": "60",
  });
  return holding;
}

/** node-b takes "pg" over, as its rule allows. */
async function nodeBTakesOver(store: MemoryStore, nowMs: number): Promise<void> {
  await holdAs(store, "node-b", { nowMs, mayTakeOver: alwaysTakeOver });
}

const stored = (m: SnapshotManifest): BackupOutcome => ({
  status: "stored",
  manifest: m,
  sent: true,
  pruned: [],
  destroyed: [],
});

/** `deps` on virtual clocks and timers, with `more` replacing any of them. */
function onVirtualTime(
  deps: FollowDeps,
  vt: VirtualTime,
  more: Partial<FollowDeps> = {},
): FollowDeps {
  return { ...deps, now: vt.now, monotonic: vt.monotonic, timers: vt.timers, ...more };
}

/** A stage of "pg" with no head (the copy is created) whose `zfs create` waits for `created`. */
function slowCreate(s: Awaited<ReturnType<typeof setup>>, created: Promise<void>) {
  s.runner.on(["zfs", "create"], async () => {
    await created;
    s.pool.add(DS, { "org.zfs-csi:managed": "yes" });
    return { code: 0 };
  });
}

Deno.test("renewAll renews the lease of a copy this node holds", async () => {
  const s = await setup();
  const held = await holdHere(s);
  await s.follow.renewAll();
  const now = await readOwner(s.store, "pg");
  assert.notEqual(now!.etag, held.etag, "the lease changed: takers see the holder alive");
  assert.equal(now!.record.holder, "n1");
  assert.equal(s.pool.value(DS, "readonly"), "off");
});

Deno.test("renewAll fences a copy whose volume another node took over", async () => {
  const s = await setup();
  await holdHere(s);
  // node-b takes it over (its rule allowed it).
  await nodeBTakesOver(s.store, 1);
  const before = await readOwner(s.store, "pg");
  await s.follow.renewAll();
  assert.equal(s.pool.value(DS, FOLLOW_RELEASED_PROPERTY), "fenced");
  assert.equal(s.pool.value(DS, "readonly"), "on");
  assert.equal(s.pool.value(DS, "org.zfs-csi:backup-interval"), "0", "no more uploads of it");
  const after = await readOwner(s.store, "pg");
  assert.equal(after!.etag, before!.etag, "the fenced node wrote nothing to the store");
  // Fenced once: the next renewal leaves it alone.
  const calls = s.runner.calls.length;
  await s.follow.renewAll();
  assert.ok(
    !s.runner.calls.slice(calls).some((c) => c.argv.includes("set")),
    "no second fencing",
  );
});

Deno.test("afterBackup moves the head only forward, along its chain", async () => {
  const s = await setup();
  let held = await holdHere(s);
  held = await moveHead(s.store, "pg", held, { guid: "1", createdAt: "x" }, 0);
  await s.follow.afterBackup(DS, stored(manifest("2", "1")));
  assert.equal((await readOwner(s.store, "pg"))!.record.head, "2");
  // A full stream not after the head (another chain): the head stays.
  await s.follow.afterBackup(DS, stored(manifest("3", null)));
  assert.equal((await readOwner(s.store, "pg"))!.record.head, "2");
  // A dataset that does not follow its job: nothing.
  s.pool.add(`${PARENT}/plain`, { "org.zfs-csi:managed": "yes" });
  await s.follow.afterBackup(`${PARENT}/plain`, stored(manifest("3", null)));
  assert.equal((await readOwner(s.store, "pg"))!.record.head, "2");
});

Deno.test("afterBackup of a fenced holder never moves the head", async () => {
  const s = await setup();
  let held = await holdHere(s);
  held = await moveHead(s.store, "pg", held, { guid: "1", createdAt: "x" }, 0);
  await nodeBTakesOver(s.store, 1);
  await s.follow.afterBackup(DS, stored(manifest("2", "1")));
  const r = (await readOwner(s.store, "pg"))!.record;
  assert.equal(r.head, "1", "the late upload is not the head");
  assert.equal(r.holder, "node-b");
  assert.equal(s.pool.value(DS, FOLLOW_RELEASED_PROPERTY), "fenced");
});

Deno.test("release stores a final snapshot, marks the copy and releases with the head on it", async () => {
  const s = await setup({ backup: () => Promise.resolve(stored(manifest("2", "1"))) });
  await holdHere(s);
  await s.follow.release({ name: "pg", dataset: DS });
  assert.deepEqual(s.backups, [DS]);
  const r = (await readOwner(s.store, "pg"))!.record;
  assert.equal(r.state, "released");
  assert.equal(r.head, "2");
  assert.equal(s.pool.value(DS, FOLLOW_RELEASED_PROPERTY), "2");
  assert.equal(s.pool.value(DS, "readonly"), "on");
  assert.equal(s.pool.value(DS, "canmount"), "noauto");
  assert.equal(s.pool.value(DS, "org.zfs-csi:backup-interval"), "0");
});

Deno.test("release of a copy this node no longer holds stores nothing and locks it down", async () => {
  const s = await setup();
  await holdHere(s);
  await nodeBTakesOver(s.store, 1);
  await s.follow.release({ name: "pg", dataset: DS });
  assert.deepEqual(s.backups, [], "no upload from a copy that is not the volume");
  assert.equal(s.pool.value(DS, "readonly"), "on");
  assert.equal((await readOwner(s.store, "pg"))!.record.holder, "node-b");
});

Deno.test("release is skipped when, in its turn, something on this node uses the copy again", async () => {
  const s = await setup({ backup: () => Promise.resolve(stored(manifest("2", "1"))) });
  const held = await holdHere(s);
  let asked = 0;
  const inUse = () => {
    asked++;
    return Promise.resolve(true);
  };
  await s.follow.release({ name: "pg", dataset: DS }, { inUse });
  assert.equal(asked, 1);
  assert.deepEqual(s.backups, [], "no final upload");
  const now = await readOwner(s.store, "pg");
  assert.equal(now!.etag, held.etag, "the store is left as it was: held here");
  assert.equal(s.pool.value(DS, "readonly"), "off");
});

Deno.test("prepareStage hands the volume back when its copy cannot be brought to the head", async () => {
  const s = await setup();
  // Another node released it with a head whose chain the store lacks (a damaged store).
  const other = await holdAs(s.store, "node-b");
  await release(s.store, "pg", other, { guid: "9", createdAt: "x" }, 0);
  await assert.rejects(s.follow.prepareStage({ name: "pg", dataset: DS }), (err: unknown) => {
    assert.match(String(err), /cannot be received/);
    return true;
  });
  const r = (await readOwner(s.store, "pg"))!.record;
  assert.equal(r.state, "released", "not left held by a node that cannot use it");
  assert.equal(r.holder, "n1");
  assert.equal(r.head, "9", "the head stays");
  assert.equal(s.pool.has(DS), false, "nothing made here");
});

Deno.test("prepareStage refuses while another node holds the volume, naming it, and joins a running stage", async () => {
  const s = await setup();
  await holdAs(s.store, "node-b");
  const first = s.follow.prepareStage({ name: "pg", dataset: DS });
  const second = s.follow.prepareStage({ name: "pg", dataset: DS });
  assert.equal(first, second, "a repeated stage joins the running one");
  await assert.rejects(first, /held by node "node-b".*taken over only explicitly/s);
});

Deno.test("prepareStage leaves a node-local volume of the same name alone", async () => {
  const s = await setup();
  s.pool.add(DS, { "org.zfs-csi:managed": "yes", "org.zfs-csi:name": "pg" });
  await assert.rejects(s.follow.prepareStage({ name: "pg", dataset: DS }), (err: unknown) => {
    assert.match(String(err), /holds a volume of this node with the same name.*left alone/);
    return true;
  });
  assert.equal(s.pool.has(DS), true);
  assert.ok(
    !s.runner.calls.some((c) => ["set", "rename", "destroy"].includes(c.argv[1] ?? "")),
    "nothing changed on the dataset",
  );
  assert.equal((await readOwner(s.store, "pg"))!.record.state, "released", "handed back");
});

Deno.test("prepareStage renews the lease while it works, and fails if taken over meanwhile", async () => {
  const vt = new VirtualTime();
  const s = await setup({ ttlSeconds: 3 });
  const follow = new FollowVolumes(onVirtualTime(s.deps, vt));
  const created = gate();
  slowCreate(s, created.promise);
  const stage = follow.prepareStage({ name: "pg", dataset: DS });
  stage.catch(() => {});
  await settleUntil("the copy is being made", () => s.runner.argvs.some((a) => a[1] === "create"));
  const acquired = await readOwner(s.store, "pg");
  assert.equal(acquired?.record.holder, "n1");
  // A receive of a while: the lease is written every third of the TTL meanwhile.
  await vt.advance(1_000);
  const renewed = await readOwner(s.store, "pg");
  assert.notEqual(renewed!.etag, acquired!.etag, "renewed while the creation runs");
  assert.notEqual(renewed!.record.renewedAt, acquired!.record.renewedAt);
  // Another node takes it over meanwhile (its rule allowed it): the next renewal is refused,
  // and the stage must not go on.
  await nodeBTakesOver(s.store, 0);
  await vt.advance(1_000);
  created.open();
  await assert.rejects(stage, /taken over while this node received it/);
  assert.notEqual(s.pool.value(DS, "readonly"), "off", "the copy was not made writable");
  assert.equal((await readOwner(s.store, "pg"))!.record.holder, "node-b");
});

Deno.test("scheduledBackup stays out of a release: no snapshot after the final one", async () => {
  let letGo = () => {};
  const finalUpload = new Promise<void>((r) => (letGo = r));
  const s = await setup({
    backup: () => finalUpload.then(() => stored(manifest("2", "1"))),
  });
  await holdHere(s);
  const released = s.follow.release({ name: "pg", dataset: DS });
  for (let i = 0; i < 100 && s.backups.length === 0; i++) {
    await new Promise((r) => setTimeout(r, 10));
  }
  assert.deepEqual(s.backups, [DS], "the release's final backup is under way");
  let ran = 0;
  const outcome = await s.follow.scheduledBackup(DS, { skipIfBusy: true }, () => {
    ran++;
    return Promise.resolve(stored(manifest("3", "2")));
  });
  assert.deepEqual(outcome, { status: "busy" });
  assert.equal(ran, 0, "nothing snapshots the copy while its release runs");
  letGo();
  await released;
  // After the release the copy is not this node's volume any more: still nothing.
  const after = await s.follow.scheduledBackup(DS, { skipIfBusy: true }, () => {
    ran++;
    return Promise.resolve(stored(manifest("3", "2")));
  });
  assert.deepEqual(after, { status: "busy" });
  assert.equal(ran, 0);
  assert.equal((await readOwner(s.store, "pg"))!.record.head, "2");
  assert.equal(s.pool.value(DS, FOLLOW_RELEASED_PROPERTY), "2", "the copy is still clean");
});

Deno.test("a release stops a scheduled upload under way and stores its own snapshot last", async () => {
  const order: string[] = [];
  const s = await setup({
    backup: () => {
      order.push("final");
      return Promise.resolve(stored(manifest("2", "1")));
    },
  });
  await holdHere(s);
  let started = () => {};
  const uploading = new Promise<void>((r) => (started = r));
  const scheduled = s.follow.scheduledBackup(DS, { skipIfBusy: true }, (o) => {
    order.push("scheduled");
    started();
    // An upload that only ends when stopped.
    return new Promise((_, reject) =>
      o.signal?.addEventListener("abort", () => reject(o.signal?.reason))
    );
  });
  await uploading;
  await s.follow.release({ name: "pg", dataset: DS });
  assert.deepEqual(await scheduled, { status: "busy" }, "stopped, not failed");
  assert.deepEqual(order, ["scheduled", "final"]);
  assert.equal(s.pool.value(DS, FOLLOW_RELEASED_PROPERTY), "2");
});

Deno.test("scheduledBackup stores a held copy and moves the head; backs up other volumes as they are", async () => {
  const s = await setup();
  const held = await holdHere(s);
  await moveHead(s.store, "pg", held, { guid: "1", createdAt: "x" }, 0);
  const outcome = await s.follow.scheduledBackup(
    DS,
    { skipIfBusy: true },
    () => Promise.resolve(stored(manifest("2", "1"))),
  );
  assert.equal(outcome.status, "stored");
  assert.equal((await readOwner(s.store, "pg"))!.record.head, "2");
  const plain = `${PARENT}/plain`;
  s.pool.add(plain, { "org.zfs-csi:managed": "yes" });
  let ran = 0;
  const other = await s.follow.scheduledBackup(plain, { skipIfBusy: true }, () => {
    ran++;
    return Promise.resolve(stored(manifest("3", null)));
  });
  assert.equal(other.status, "stored");
  assert.equal(ran, 1);
  assert.equal((await readOwner(s.store, "pg"))!.record.head, "2");
});

Deno.test("a scheduled upload under way does not hold up the lease renewal", async () => {
  const s = await setup();
  const held = await holdHere(s);
  let letGo = () => {};
  const upload = new Promise<void>((r) => (letGo = r));
  const scheduled = s.follow.scheduledBackup(
    DS,
    { skipIfBusy: true },
    () => upload.then(() => stored(manifest("2", "1"))),
  );
  await s.follow.renewAll();
  assert.notEqual((await readOwner(s.store, "pg"))!.etag, held.etag, "renewed meanwhile");
  letGo();
  assert.equal((await scheduled).status, "stored");
});

Deno.test("scheduledBackup leaves a copy alone while a stage prepares it", async () => {
  const s = await setup();
  let letGo = () => {};
  const created = new Promise<void>((r) => (letGo = r));
  // The copy exists (with the volume's properties) before the stage makes it this node's.
  s.runner.on(["zfs", "create"], async () => {
    s.pool.add(DS, {
      "org.zfs-csi:managed": "yes",
      [FOLLOW_GENERATION_PROPERTY]: "1",
      [FOLLOW_RELEASED_PROPERTY]: "none",
    });
    await created;
    return { code: 0 };
  });
  const stage = s.follow.prepareStage({ name: "pg", dataset: DS });
  for (let i = 0; i < 100 && !s.pool.has(DS); i++) await new Promise((r) => setTimeout(r, 10));
  assert.ok(s.pool.has(DS), "the stage made the copy");
  let ran = 0;
  const outcome = await s.follow.scheduledBackup(DS, { skipIfBusy: true }, () => {
    ran++;
    return Promise.resolve(stored(manifest("3", null)));
  });
  assert.deepEqual(outcome, { status: "busy" });
  assert.equal(ran, 0, "no backup of a copy the stage has not finished");
  letGo();
  await stage;
  assert.equal(s.pool.value(DS, "readonly"), "off", "the stage went on");
});

// ---------------------------------------------------------------------------------------------
// Issue 21, defect 3: lease renewals must not queue behind another volume's release.

/** This node holds the follow volume `name` too, its copy marked so (as {@linkcode holdHere}). */
async function holdAlso(s: Awaited<ReturnType<typeof setup>>, name: string): Promise<Holding> {
  await createFollowOwner(s.store, { name });
  const holding = await holdAs(s.store, "n1", { name });
  s.pool.add(`${PARENT}/${name}`, {
    "org.zfs-csi:managed": "yes",
    [FOLLOW_GENERATION_PROPERTY]: String(holding.record.generation),
    [FOLLOW_RELEASED_PROPERTY]: "none",
    readonly: "off",
  });
  return holding;
}

/** The owner object's etag now. */
async function etagOf(store: MemoryStore, name: string): Promise<string> {
  return (await readOwner(store, name))!.etag;
}

Deno.test("renewAll renews every held volume while one's release uploads its final snapshot, that one too", async () => {
  const upload = gate();
  const s = await setup({ backup: () => upload.promise.then(() => stored(manifest("2", "1"))) });
  const pg = await holdHere(s);
  // "web" comes after "pg" in the node's list of copies.
  const web = await holdAlso(s, "web");
  const releasing = s.follow.release({ name: "pg", dataset: DS });
  await settleUntil("the final upload is under way", () => s.backups.length === 1);
  const renewing = s.follow.renewAll();
  await settle();
  try {
    assert.notEqual(await etagOf(s.store, "web"), web.etag, "web's lease renewed meanwhile");
    assert.notEqual(await etagOf(s.store, "pg"), pg.etag, "pg's lease renewed while it uploads");
  } finally {
    upload.open();
    await releasing;
    await renewing;
  }
  const r = (await readOwner(s.store, "pg"))!.record;
  assert.equal(r.state, "released", "the release went on after the renewal");
  assert.equal(r.head, "2");
});

Deno.test("with --takeover-after, no node takes over a volume while another volume's release uploads for longer than the rule", async () => {
  const vt = new VirtualTime();
  const upload = gate();
  const s = await setup({ backup: () => upload.promise.then(() => stored(manifest("2", "1"))) });
  const follow = new FollowVolumes(onVirtualTime(s.deps, vt));
  await holdHere(s);
  await holdAlso(s, "web");
  follow.start();
  const releasing = follow.release({ name: "pg", dataset: DS });
  await settleUntil("the final upload is under way", () => s.backups.length === 1);
  // node-b watches both owner objects by the takeover rule: TTL 30 s + 5 s.
  const observer = new LeaseObserver(vt.monotonic);
  const take = (name: string) =>
    acquire(s.store, name, {
      node: "node-b",
      nowMs: vt.now(),
      ttlSeconds: 30,
      mayTakeOver: (current) =>
        judgeTakeover(current, {
          volumeKey: name,
          observer,
          rule: { takeoverAfterMs: 5_000 },
          nowMs: vt.now(),
        }),
    });
  try {
    // A final upload of two minutes: every look of node-b finds both leases renewed.
    for (let t = 0; t <= 120_000; t += 5_000) {
      for (const name of ["pg", "web"]) {
        await assert.rejects(take(name), HeldElsewhereError, `${name} at ${t / 1000}s`);
      }
      await vt.advance(5_000);
    }
  } finally {
    upload.open();
    await releasing;
    follow.stop();
  }
  assert.equal((await readOwner(s.store, "web"))!.record.holder, "n1");
  assert.equal(vt.pending, 0, "stop() leaves no timer behind");
});

// ---------------------------------------------------------------------------------------------
// Issue 21, defect 4: a copy becomes writable only right after a write proving the holding.

Deno.test("prepareStage never makes the copy writable when the volume was taken over while it received, even if no renewal saw it", async () => {
  const vt = new VirtualTime();
  const s = await setup();
  const follow = new FollowVolumes(onVirtualTime(s.deps, vt));
  const created = gate();
  slowCreate(s, created.promise);
  const stage = follow.prepareStage({ name: "pg", dataset: DS });
  stage.catch(() => {});
  await settleUntil("the copy is being made", () => s.runner.argvs.some((a) => a[1] === "create"));
  // node-b takes it over meanwhile (an explicit takeover, or its rule), before any renewal.
  await nodeBTakesOver(s.store, 0);
  created.open();
  await assert.rejects(stage, /taken over|no longer held/);
  assert.notEqual(s.pool.value(DS, "readonly"), "off", "the copy was not made writable");
  assert.equal((await readOwner(s.store, "pg"))!.record.holder, "node-b");
});

Deno.test("prepareStage whose renewals fail with 503 while another node takes over never makes the copy writable", async () => {
  const vt = new VirtualTime();
  const s = await setup();
  const faulty = new FaultyStore(s.store);
  const follow = new FollowVolumes(onVirtualTime(s.deps, vt, { store: faulty }));
  const created = gate();
  slowCreate(s, created.promise);
  const stage = follow.prepareStage({ name: "pg", dataset: DS });
  stage.catch(() => {});
  await settleUntil("the copy is being made", () => s.runner.argvs.some((a) => a[1] === "create"));
  // From now on every write of this node's lease answers 503.
  const heal = faulty.inject(
    (c) => c.op === "putBytes" && c.key === ownerKey("pg"),
    { kind: "unavailable" },
  );
  const mark = faulty.calls.length;
  await vt.advance(60_000);
  const tried = faulty.calls.slice(mark).filter((c) =>
    c.op === "putBytes" && c.key === ownerKey("pg")
  );
  assert.ok(tried.length >= 3, `the stage kept trying to renew (${tried.length} writes)`);
  // node-b, which reaches the store, took it over by then.
  await nodeBTakesOver(s.store, vt.now());
  heal();
  created.open();
  await assert.rejects(stage, /taken over|no longer held/);
  assert.notEqual(s.pool.value(DS, "readonly"), "off", "the copy was not made writable");
  assert.equal((await readOwner(s.store, "pg"))!.record.holder, "node-b");
});

Deno.test("prepareStage fails and leaves the copy read-only when no write can prove the holding", async () => {
  const vt = new VirtualTime();
  const s = await setup();
  const faulty = new FaultyStore(s.store);
  const follow = new FollowVolumes(onVirtualTime(s.deps, vt, { store: faulty }));
  const created = gate();
  slowCreate(s, created.promise);
  const stage = follow.prepareStage({ name: "pg", dataset: DS });
  stage.catch(() => {});
  await settleUntil("the copy is being made", () => s.runner.argvs.some((a) => a[1] === "create"));
  // The store goes down for good: no renewal, no proof, no hand-back.
  faulty.inject(() => true, { kind: "unavailable" });
  created.open();
  await assert.rejects(stage, /503/);
  assert.notEqual(s.pool.value(DS, "readonly"), "off", "the copy was not made writable");
  const create = s.runner.argvs.find((a) => a[1] === "create") ?? [];
  assert.ok(create.includes("readonly=on"), `made read-only: ${create.join(" ")}`);
  assert.ok(create.includes("canmount=noauto"), "and not mounted at boot");
});

Deno.test("a copy made writable slower than half its lease after the proof is proved again, and locked down when taken over meanwhile", async (t) => {
  for (const takenOver of [false, true]) {
    await t.step(takenOver ? "taken over meanwhile" : "still held", async () => {
      const vt = new VirtualTime();
      const s = await setup();
      const follow = new FollowVolumes(onVirtualTime(s.deps, vt));
      s.runner.on(["zfs", "create"], () => {
        s.pool.add(DS, { "org.zfs-csi:managed": "yes" });
        return { code: 0 };
      });
      let slowSets = 0;
      s.pool.hook = async (argv) => {
        if (argv[1] !== "set" || !argv.includes("readonly=off")) return undefined;
        // zfs takes 20 s (a busy pool, a paused process): longer than half the 30 s lease.
        slowSets++;
        vt.mono += 20_000;
        vt.wall += 20_000;
        if (takenOver) await nodeBTakesOver(s.store, vt.now());
        return undefined;
      };
      const stage = follow.prepareStage({ name: "pg", dataset: DS });
      if (takenOver) {
        await assert.rejects(stage, /taken over|no longer held/);
        assert.equal(s.pool.value(DS, "readonly"), "on", "made read-only again");
        assert.equal((await readOwner(s.store, "pg"))!.record.holder, "node-b");
      } else {
        await stage;
        assert.equal(s.pool.value(DS, "readonly"), "off");
        assert.equal((await readOwner(s.store, "pg"))!.record.holder, "n1");
      }
      assert.equal(slowSets, 1);
    });
  }
});
