/**
 * The fault-schedule test's own parts (tests/faults/): the model pool receives streams by ZFS's
 * rules, and each invariant check fails when its invariant is broken. If these did not hold,
 * fault_schedule_test.ts could pass on a broken protocol.
 */

import assert from "node:assert/strict";
import { createHash } from "node:crypto";
import { encodeOwner, type OwnerRecord } from "./owner.ts";
import { encodeJson } from "../store/chain.ts";
import { manifestKey, ownerKey, type SnapshotManifest, streamKey } from "../store/layout.ts";
import { MemoryStore } from "../../tests/support/memory_store.ts";
import { VirtualTime } from "../../tests/faults/clock.ts";
import { Invariants } from "../../tests/faults/invariants.ts";
import { PoolModel, receiveInto } from "../../tests/faults/pool_model.ts";
import { CSI_BASE, PARENT, SimNode } from "../../tests/faults/sim_node.ts";
import { encodeStream, type SimStream } from "../../tests/faults/stream_codec.ts";

const START = Date.UTC(2026, 2, 1);

function pool(flavour: "openzfs" | "zfs-fuse" = "openzfs"): PoolModel {
  let guid = 0;
  const p = new PoolModel({
    flavour,
    parent: PARENT,
    wallSeconds: () => START / 1000,
    nextGuid: () => String(500 + ++guid),
    latency: () => 0,
    sleep: () => Promise.resolve(),
  });
  p.addFilesystem("tank");
  p.addFilesystem(PARENT);
  return p;
}

const full = (guid: string, name: string, data: string[]): SimStream => ({
  from: null,
  guid,
  name,
  creation: START / 1000,
  data,
});
const incr = (from: string, guid: string, name: string, data: string[]): SimStream => ({
  ...full(guid, name, data),
  from,
});

Deno.test("model pool: receive follows ZFS's rules", () => {
  const p = pool();
  const target = `${PARENT}/pg`;
  assert.equal(receiveInto(p, target, full("11", ".backup-1", ["w1"])), undefined);
  assert.match(receiveInto(p, target, full("12", ".backup-2", []))!, /destination .* exists/);
  assert.match(
    receiveInto(p, target, incr("99", "13", ".backup-3", ["w2"]))!,
    /does not\nmatch incremental source/,
  );
  assert.equal(receiveInto(p, target, incr("11", "13", ".backup-3", ["w2"])), undefined);
  assert.deepEqual(p.objects.get(target)!.data, ["w1", "w2"]);
  // A name the dataset has already: what defect 8 of issue 21 makes.
  assert.match(
    receiveInto(p, target, incr("13", "14", ".backup-1", ["w3"]))!,
    /destination already exists/,
  );
  p.objects.get(target)!.data = ["w1", "w2", "w9"];
  assert.match(
    receiveInto(p, target, incr("13", "15", ".backup-4", []))!,
    /has been modified\nsince most recent snapshot/,
  );
});

Deno.test("model pool: readonly=on stops writes at once on OpenZFS, at the next mount on zfs-fuse", () => {
  for (const flavour of ["openzfs", "zfs-fuse"] as const) {
    const p = pool(flavour);
    const ds = p.addFilesystem(`${PARENT}/pg`);
    const path = `${CSI_BASE}/staging/pg`;
    p.fs.mkdirp(path);
    p.fs.mount({ oid: ds.oid, mountPoint: path, own: false, ro: false });
    assert.equal(p.write(path, "w1").ok, true);
    ds.props.set("readonly", { value: "on", source: "local" });
    assert.equal(p.write(path, "w2").ok, flavour === "zfs-fuse", flavour);
  }
});

/** A world of two idle nodes and a bucket, for the invariant checks alone. */
function checks(flavour: "openzfs" | "zfs-fuse" = "openzfs") {
  const clock = new VirtualTime(START);
  const bucket = new MemoryStore();
  const nodes = ["n1", "n2"].map((name) =>
    new SimNode({
      name,
      pool: pool(flavour),
      clock,
      settings: { ttlSeconds: 30, takeoverAfterMs: 60_000, maxChainLength: 3 },
      store: () => {
        throw new Error("no plugin runs in these checks");
      },
      randomHex: () => "00",
      log: () => {},
    })
  );
  const inv = new Invariants({ clock, nodes, bucket, volumes: ["pg"] });
  return { clock, bucket, nodes, inv };
}

function owner(fields: Partial<OwnerRecord>): OwnerRecord {
  return {
    format: 1,
    volume: "pg",
    uid: "a".repeat(32),
    holder: "n1",
    generation: 1,
    state: "held",
    head: null,
    headAt: null,
    renewedAt: new Date(START).toISOString(),
    ttlSeconds: 30,
    settings: { capacityBytes: 0, properties: {} },
    ...fields,
  };
}

/** A writable copy of "pg" on `node` under `generation`, bound at its staging path. */
function writableCopy(node: SimNode, generation: number) {
  const ds = node.pool.addFilesystem(`${PARENT}/pg`, {
    "org.zfs-csi:follow-generation": String(generation),
  });
  const path = `${CSI_BASE}/staging/pg`;
  node.pool.fs.mkdirp(path);
  node.pool.fs.mount({ oid: ds.oid, mountPoint: path, own: false, ro: false });
  return { ds, path };
}

Deno.test("invariant 1: a copy a job can write while another node holds the volume fails", async () => {
  const { bucket, nodes, inv } = checks();
  await bucket.putBytes(ownerKey("pg"), encodeOwner(owner({ holder: "n1", generation: 2 })));
  inv.created("pg");
  writableCopy(nodes[0]!, 2);
  inv.poolChanged();
  assert.equal(inv.violations.length, 0, "the holder's copy is fine");
  writableCopy(nodes[1]!, 1);
  inv.madeWritable(nodes[1]!, `${PARENT}/pg`);
  inv.poolChanged();
  assert.equal(inv.violations[0]?.invariant, 1);
  assert.match(inv.violations[0]!.message, /n2's copy of volume "pg" .* while the store says/);
});

/** Stores a chain of streams and their manifests for "pg" in `bucket`; returns the head. */
async function storeChain(bucket: MemoryStore, streams: readonly SimStream[]): Promise<string> {
  for (const s of streams) {
    const bytes = encodeStream(s);
    const key = streamKey("pg", s.guid, "0123456789abcdef");
    await bucket.putBytes(key, bytes);
    const m: SnapshotManifest = {
      format: 1,
      volume: "pg",
      volumeUid: "a".repeat(32),
      guid: s.guid,
      baseGuid: s.from,
      snapshot: s.name,
      kind: "scheduled",
      createdAt: new Date(START).toISOString(),
      stream: key,
      size: bytes.length,
      sha256: createHash("sha256").update(bytes).digest("hex"),
      raw: false,
      node: "n1",
      capacityBytes: 0,
    };
    await bucket.putBytes(manifestKey("pg", s.guid), encodeJson(m));
  }
  return streams.at(-1)!.guid;
}

Deno.test("invariant 2: a head whose chain holds one name twice cannot be restored", async () => {
  const { bucket, inv } = checks();
  const good = [full("21", ".backup-1", ["w1"]), incr("21", "22", ".backup-2", ["w2"])];
  const head = await storeChain(bucket, good);
  assert.deepEqual(inv.restore("pg", head), { ok: true, head, data: new Set(["w1", "w2"]) });
  const dup = await storeChain(bucket, [incr("22", "23", ".backup-1", ["w3"])]);
  const r = inv.restore("pg", dup);
  assert.equal(r.ok, false);
  assert.match(!r.ok ? r.why : "", /destination already exists/);
  await bucket.delete(manifestKey("pg", "21"));
  const gone = inv.restore("pg", head);
  assert.match(!gone.ok ? gone.why : "", /needs base 21/);
});

Deno.test("invariant 3: a write acknowledged before a clean release must be in the head", async () => {
  const { bucket, nodes, inv } = checks();
  const n1 = nodes[0]!;
  const { ds, path } = writableCopy(n1, 1);
  const w = n1.pool.write(path, "w1");
  assert.ok(w.ok);
  inv.acked("pg", "n1", "w1", ds);
  // Released by n1 with a head that lacks w1.
  const head = await storeChain(bucket, [full("31", ".backup-1", [])]);
  await bucket.putBytes(
    ownerKey("pg"),
    encodeOwner(owner({ state: "released", head, headAt: new Date(START).toISOString() })),
  );
  inv.unstaged("pg", n1);
  inv.afterStep();
  assert.equal(inv.violations[0]?.invariant, 3);
  assert.match(inv.violations[0]!.message, /w1 on n1/);
});

Deno.test("invariant 4: a change outside the parent dataset fails", async () => {
  const p = pool();
  const touched: string[] = [];
  const q = new PoolModel({
    flavour: "openzfs",
    parent: PARENT,
    wallSeconds: () => 0,
    nextGuid: () => "7",
    latency: () => 0,
    sleep: () => Promise.resolve(),
    onTouch: (name) => touched.push(name),
  });
  q.objects.set("tank", p.objects.get("tank")!);
  await q.runner.run(["zfs", "set", "org.zfs-csi:x=1", "tank"]);
  assert.deepEqual(touched, ["tank"]);
});
