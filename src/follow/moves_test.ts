/**
 * A follow volume moved between nodes with the real stage, release and backup code, on model
 * pools (tests/support/follow_nodes.ts): what the store keeps must stay receivable whatever the
 * nodes' clocks say, however fast the volume moves, and whatever a paused holder does late.
 */

import assert from "node:assert/strict";

import { forceRelease, readOwner } from "./owner.ts";
import { chainTo, parseManifest } from "../store/chain.ts";
import { manifestsPrefix, type SnapshotManifest } from "../store/layout.ts";
import { BACKUP_KEEP_PROPERTY } from "../replicate/backup.ts";
import { Cluster, type ModelNode, VOLUME } from "../../tests/support/follow_nodes.ts";

const SECOND = 1000;
const MINUTE = 60 * SECOND;

function manifests(c: Cluster): SnapshotManifest[] {
  return c.store.keys().filter((k) => k.startsWith(manifestsPrefix(VOLUME)))
    .map((k) => parseManifest(c.store.peek(k)!, { key: k }));
}

/** The store's head can be received: its chain is whole, every stream there. */
async function assertHeadReceivable(c: Cluster, what: string): Promise<void> {
  const head = (await readOwner(c.store, VOLUME))?.record.head;
  assert.ok(head, `${what}: the store has a head`);
  const all = manifests(c);
  let chain: SnapshotManifest[];
  try {
    chain = chainTo(all, head);
  } catch (err) {
    return assert.fail(`${what}: the head's chain is broken: ${(err as Error).message}`);
  }
  for (const m of chain) assert.ok(c.store.peek(m.stream), `${what}: stream of ${m.guid} is gone`);
}

/** A stage, a write and an unstage on `node`. */
async function cycle(node: ModelNode, data: string): Promise<void> {
  await node.stage();
  node.write(data);
  await node.unstage();
}

Deno.test("a node whose clock is behind stores its final backup and the volume stays stageable", async () => {
  for (const behindMs of [5 * MINUTE, 10 * MINUTE]) {
    const c = new Cluster();
    await c.createVolume({ [BACKUP_KEEP_PROPERTY]: "last=1" });
    const a = c.node("a");
    const b = c.node("b", { offsetMs: -behindMs });
    await a.stage();
    for (let i = 1; i <= 5; i++) {
      c.time.ms += MINUTE;
      a.write(`a${i}`);
      assert.equal((await a.backup()).status, "stored");
    }
    c.time.ms += 20 * SECOND;
    await a.unstage();
    c.time.ms += 5 * SECOND;
    await b.stage();
    assert.equal(b.data(), "a5");
    b.write("b1");
    c.time.ms += 30 * SECOND;
    await b.unstage();
    const what = `B ${behindMs / MINUTE} min behind`;
    await assertHeadReceivable(c, what);
    // Every later stage, on a node with a copy or without, gets what B's job wrote last.
    const fresh = c.node("c");
    await fresh.stage();
    assert.equal(fresh.data(), "b1", what);
    await fresh.unstage();
    await a.stage();
    assert.equal(a.data(), "b1", what);
    c.assertNoUnexpected();
  }
});

Deno.test("a node whose clock steps back keeps the volume stageable", async () => {
  const c = new Cluster();
  await c.createVolume({ [BACKUP_KEEP_PROPERTY]: "last=1" });
  const a = c.node("a");
  await a.stage();
  for (let i = 1; i <= 3; i++) {
    c.time.ms += MINUTE;
    a.write(`a${i}`);
    await a.backup();
  }
  // NTP steps the clock back an hour: the next backups look older than the ones before.
  a.offsetMs = -60 * MINUTE;
  for (let i = 4; i <= 6; i++) {
    c.time.ms += MINUTE;
    a.write(`a${i}`);
    const out = await a.backup();
    assert.equal(out.status, "stored");
    await assertHeadReceivable(c, `backup a${i}`);
    const head = (await readOwner(c.store, VOLUME))!.record.head;
    assert.equal(head, out.status === "stored" ? out.manifest.guid : "", `a${i} is the head`);
  }
  await a.unstage();
  await assertHeadReceivable(c, "after the release");
  const b = c.node("b");
  await b.stage();
  assert.equal(b.data(), "a6");
  c.assertNoUnexpected();
});

Deno.test("six moves within two seconds leave a chain a node without a copy receives", async () => {
  const c = new Cluster();
  await c.createVolume({ [BACKUP_KEEP_PROPERTY]: "last=2" });
  const a = c.node("a");
  const b = c.node("b");
  for (let i = 1; i <= 6; i++) {
    await cycle(i % 2 === 1 ? a : b, `w${i}`);
    c.time.ms += 300;
  }
  await assertHeadReceivable(c, "after six moves");
  const head = (await readOwner(c.store, VOLUME))!.record.head!;
  const names = chainTo(manifests(c), head).map((m) => m.snapshot);
  const fresh = c.node("c");
  await fresh.stage();
  assert.equal(fresh.data(), "w6");
  assert.deepEqual(fresh.snapshots(), names, "the whole chain, received into one dataset");
  assert.equal(new Set(names).size, names.length, `one name per snapshot: ${names.join(", ")}`);
  c.assertNoUnexpected();
});

Deno.test("six stage/write/unstage cycles on one node within two seconds stay receivable", async () => {
  const c = new Cluster();
  await c.createVolume({ [BACKUP_KEEP_PROPERTY]: "last=3" });
  const a = c.node("a");
  for (let i = 1; i <= 6; i++) {
    await cycle(a, `w${i}`);
    c.time.ms += 300;
  }
  const head = (await readOwner(c.store, VOLUME))!.record.head!;
  const names = chainTo(manifests(c), head).map((m) => m.snapshot);
  const fresh = c.node("c");
  await fresh.stage();
  assert.equal(fresh.data(), "w6");
  assert.equal(new Set(names).size, names.length, `one name per snapshot: ${names.join(", ")}`);
  // The backup log lines name the snapshots each backup really took.
  const taken = c.logs.filter((l) => l.msg === "backup stored").map((l) => l.snapshot);
  assert.equal(new Set(taken).size, 6, `six distinct snapshots: ${taken.join(", ")}`);
  c.assertNoUnexpected();
});

Deno.test("a holder paused past its lease never prunes the chain the new holder's head needs", async () => {
  for (const keep of ["last=1", "hourly=1"]) {
    const c = new Cluster();
    await c.createVolume({ [BACKUP_KEEP_PROPERTY]: keep });
    // A starts a new full stream every other backup; B extends the chain it received.
    const a = c.node("a", { maxChainLength: 2 });
    const b = c.node("b");
    await a.stage();
    for (let i = 1; i <= 2; i++) {
      c.time.ms += MINUTE;
      a.write(`a${i}`);
      await a.backup();
    }
    // A's third backup (a full stream) stops in its upload: A is paused past its lease.
    const paused = Promise.withResolvers<void>();
    const reached = Promise.withResolvers<void>();
    a.onSend = async () => {
      a.onSend = undefined;
      reached.resolve();
      await paused.promise;
    };
    c.time.ms += MINUTE;
    a.write("a3");
    const late = a.backup();
    await reached.promise;
    // Meanwhile the operator takes the volume over and B holds it, its head on A's chain.
    c.time.ms += 5 * MINUTE;
    await forceRelease(c.store, VOLUME, { by: "operator", nowMs: c.time.ms });
    await b.stage();
    assert.equal(b.data(), "a2");
    b.write("b1");
    c.time.ms += MINUTE;
    assert.equal((await b.backup()).status, "stored");
    // A resumes: its upload lands, then its backup prunes with what it listed before.
    paused.resolve();
    await late;
    await assertHeadReceivable(c, keep);
    const fresh = c.node("c");
    await b.unstage();
    await fresh.stage();
    assert.equal(fresh.data(), "b1", keep);
    c.assertNoUnexpected();
  }
});

Deno.test("the head follows the holder onto its new full stream: a lost holder loses one interval", async () => {
  const c = new Cluster();
  await c.createVolume({ [BACKUP_KEEP_PROPERTY]: "last=1" });
  // A new full stream every other backup (every 48th by default).
  const a = c.node("a", { maxChainLength: 2 });
  await a.stage();
  for (let i = 1; i <= 5; i++) {
    c.time.ms += MINUTE;
    a.write(`a${i}`);
    const out = await a.backup();
    assert.equal(out.status, "stored");
    const head = (await readOwner(c.store, VOLUME))!.record.head;
    assert.equal(
      head,
      out.status === "stored" ? out.manifest.guid : "",
      `backup a${i} is the head`,
    );
  }
  // A is lost; the operator takes the volume over: B gets what A stored last.
  a.write("a6, never stored");
  await forceRelease(c.store, VOLUME, { by: "operator", nowMs: c.time.ms });
  const b = c.node("b");
  await b.stage();
  assert.equal(b.data(), "a5");
  c.assertNoUnexpected();
});
