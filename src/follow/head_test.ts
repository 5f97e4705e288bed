import assert from "node:assert/strict";
import { backupHarness } from "../../tests/support/backup_harness.ts";
import { parseManifest } from "../store/chain.ts";
import { manifestsPrefix } from "../store/layout.ts";
import { BACKUP_KEEP_PROPERTY, backupVolume } from "../replicate/backup.ts";
import { headChain } from "./head.ts";
import { acquire, createOwner, moveHead } from "./owner.ts";

const never = () => ({ ok: false as const, message: "held" });

Deno.test("the keep policy never prunes the head's chain of a follow volume", async () => {
  // The harness makes the store: the protection reads it once the harness exists.
  const ref: { store?: Parameters<typeof headChain>[0] } = {};
  const h = backupHarness({
    // A new full stream every other backup, so that old chains can go.
    maxChainLength: 2,
    protect: (key, manifests) => headChain(ref.store!, key, manifests),
  });
  ref.store = h.store;
  const ds = h.volume("pg", { [BACKUP_KEEP_PROPERTY]: "last=1" });
  const first = await backupVolume(h.deps, ds);
  assert.equal(first.status, "stored");
  if (first.status !== "stored") return;
  await createOwner(h.store, "pg", {
    volume: "pg",
    uid: first.manifest.volumeUid,
    ttlSeconds: 30,
    settings: { capacityBytes: 0, properties: {} },
    nowMs: h.clock.ms,
  });
  let held = (await acquire(h.store, "pg", {
    node: "n1",
    nowMs: h.clock.ms,
    ttlSeconds: 30,
    mayTakeOver: never,
  })).holding;
  held = await moveHead(h.store, "pg", held, {
    guid: first.manifest.guid,
    createdAt: first.manifest.createdAt,
  }, h.clock.ms);
  // Three more backups that do not move the head (a fenced holder's late uploads, say).
  for (let i = 0; i < 3; i++) {
    h.clock.ms += 3_600_000;
    assert.equal((await backupVolume(h.deps, ds)).status, "stored");
  }
  const guids = h.store.keys().filter((k) => k.startsWith(manifestsPrefix("pg")))
    .map((k) => parseManifest(h.store.peek(k)!, { key: k }).guid);
  assert.ok(guids.includes(first.manifest.guid), "the head survived last=1");
  assert.ok(guids.length < 4, `the others were pruned by the keep policy: ${guids.length} left`);
  // Without the protection the head goes like any old backup.
  const h2 = backupHarness({ maxChainLength: 2 });
  const ds2 = h2.volume("pg", { [BACKUP_KEEP_PROPERTY]: "last=1" });
  const gone = await backupVolume(h2.deps, ds2);
  for (let i = 0; i < 3; i++) {
    h2.clock.ms += 3_600_000;
    await backupVolume(h2.deps, ds2);
  }
  const left = h2.store.keys().filter((k) => k.startsWith(manifestsPrefix("pg")))
    .map((k) => parseManifest(h2.store.peek(k)!, { key: k }).guid);
  assert.ok(gone.status === "stored" && !left.includes(gone.manifest.guid));
});

Deno.test("headChain is empty without an owner object or a head", async () => {
  const h = backupHarness();
  assert.equal((await headChain(h.store, "pg", [])).size, 0);
});
