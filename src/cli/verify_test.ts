import assert from "node:assert/strict";
import { FakeRunner, fakeTools } from "../../tests/support/fake_runner.ts";
import { FakePool } from "../../tests/support/fake_pool.ts";
import { MemoryStore } from "../../tests/support/memory_store.ts";
import { encodeJson } from "../store/chain.ts";
import { manifestKey, type SnapshotManifest, streamKey } from "../store/layout.ts";
import {
  checkRestored,
  countingStore,
  createScratch,
  pickManifest,
  removeScratch,
  volumeManifests,
} from "./verify.ts";

const UID = "0123456789abcdef0123456789abcdef";

function manifest(guid: string, baseGuid: string | null, createdAt: string): SnapshotManifest {
  return {
    format: 1,
    volume: "pg",
    volumeUid: UID,
    guid,
    baseGuid,
    snapshot: `.backup-${guid}`,
    kind: "scheduled",
    createdAt,
    stream: streamKey("pg", guid, "00000001"),
    size: 10,
    sha256: "0".repeat(64),
    raw: false,
    node: "node-a",
    capacityBytes: 0,
  };
}

const FULL = manifest("11", null, "2026-01-01T00:00:00Z");
const INCR = manifest("22", "11", "2026-01-02T00:00:00Z");

Deno.test("volumeManifests reads a volume's manifests; pickManifest takes the newest or the one named", async () => {
  const store = new MemoryStore();
  for (const m of [FULL, INCR]) await store.putBytes(manifestKey("pg", m.guid), encodeJson(m));
  await store.putBytes(
    manifestKey("pg", "33"),
    new TextEncoder().encode("{"),
  );
  const got = await volumeManifests(store, "pg");
  assert.deepEqual(got.map((m) => m.guid).sort(), ["11", "22"]);
  assert.equal(pickManifest(got, "pg").guid, "22");
  assert.equal(pickManifest(got, "pg", "000000000000000b").guid, "11");
  assert.equal(pickManifest(got, "pg", "store:pg:000000000000000b").guid, "11");
  assert.throws(
    () => pickManifest(got, "pg", "ffffffffffffffff"),
    /no snapshot "ffffffffffffffff"/,
  );
  assert.throws(() => pickManifest([], "pg"), /holds no backup of volume "pg"/);
});

Deno.test("countingStore reports every byte of a download", async () => {
  const store = new MemoryStore({ chunkSize: 3 });
  await store.putBytes("a/b", new Uint8Array(10));
  let counted = 0;
  const counting = countingStore(store, (n) => (counted += n));
  const body = await new Response(await counting.getStream("a/b")).arrayBuffer();
  assert.equal(body.byteLength, 10);
  assert.equal(counted, 10);
});

Deno.test("createScratch marks the scratch dataset in its zfs create; data goes below it", async () => {
  const runner = new FakeRunner();
  const { zfs } = fakeTools(runner);
  runner.on(["zfs", "create"], {});
  const clock = { uptimeSeconds: () => 77 };
  const data = await createScratch(zfs, "tank/nomad/.verify-1", clock, 42);
  assert.equal(data, "tank/nomad/.verify-1/data");
  assert.deepEqual(runner.argvs, [[
    "zfs",
    "create",
    "-o",
    "canmount=off",
    "-o",
    "org.zfs-csi:verify=up=77 pid=42",
    "tank/nomad/.verify-1",
  ]]);
});

Deno.test("removeScratch destroys a scratch holding only the chain, and leaves anything else", async () => {
  const runner = new FakeRunner();
  const pool = new FakePool(runner);
  const { zfs } = fakeTools(runner);
  pool.add("tank/nomad/.verify-1");
  pool.add("tank/nomad/.verify-1/data");
  pool.add("tank/nomad/.verify-1/data@.backup-11", { guid: "11" });
  pool.add("tank/nomad/.verify-1/data@.backup-22", { guid: "22" });
  await removeScratch(zfs, "tank/nomad/.verify-1", [FULL, INCR]);
  assert.ok(!pool.has("tank/nomad/.verify-1"));
  // A receive stopped half way: data without a snapshot.
  pool.add("tank/nomad/.verify-3");
  pool.add("tank/nomad/.verify-3/data");
  await removeScratch(zfs, "tank/nomad/.verify-3", [FULL]);
  assert.ok(!pool.has("tank/nomad/.verify-3"));
  pool.add("tank/nomad/.verify-2");
  pool.add("tank/nomad/.verify-2/data");
  pool.add("tank/nomad/.verify-2/data@.backup-11", { guid: "11" });
  pool.add("tank/nomad/.verify-2/data@mine", { guid: "99" });
  await assert.rejects(
    () => removeScratch(zfs, "tank/nomad/.verify-2", [FULL]),
    /verify-2\/data@mine/,
  );
  assert.ok(pool.has("tank/nomad/.verify-2/data@mine"));
});

Deno.test("checkRestored wants every snapshot of the chain, and the node's own size where it has it", async () => {
  const runner = new FakeRunner();
  const pool = new FakePool(runner);
  const { zfs } = fakeTools(runner);
  pool.add("tank/nomad/pg", { "org.zfs-csi:managed": "yes" });
  pool.add("tank/nomad/pg@.backup-22", { guid: "22", referenced: "4096" });
  pool.add("tank/nomad/.verify-1");
  pool.add("tank/nomad/.verify-1@.backup-11", { guid: "11", referenced: "1024" });
  await assert.rejects(
    () => checkRestored(zfs, "tank/nomad/.verify-1", [FULL, INCR], "tank/nomad/pg"),
    /lacks \.backup-22/,
  );
  pool.add("tank/nomad/.verify-1@.backup-22", { guid: "22", referenced: "4096" });
  assert.deepEqual(
    await checkRestored(zfs, "tank/nomad/.verify-1", [FULL, INCR], "tank/nomad/pg"),
    { referencedBytes: 4096, localSnapshot: "same" },
  );
  // A receive may lay the same snapshot out in more or fewer blocks: the guid decides.
  pool.setValue("tank/nomad/pg@.backup-22", "referenced", "8192");
  assert.deepEqual(
    await checkRestored(zfs, "tank/nomad/.verify-1", [FULL, INCR], "tank/nomad/pg"),
    { referencedBytes: 4096, localSnapshot: "same" },
  );
  assert.deepEqual(
    await checkRestored(zfs, "tank/nomad/.verify-1", [FULL, INCR], "tank/nomad/gone"),
    { referencedBytes: 4096, localSnapshot: "absent" },
  );
});
