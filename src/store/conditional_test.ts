import assert from "node:assert/strict";
import { MemoryStore } from "../../tests/support/memory_store.ts";
import { assertRejectsKind } from "../../tests/support/store_contract.ts";
import { Code, toGrpcStatus } from "../errors.ts";
import type { ConditionalVerdict } from "./check.ts";
import { ConditionalGuardStore, ConditionalWrites } from "./conditional.ts";
import { StoreError } from "./store.ts";

const encoder = new TextEncoder();

/** ConditionalWrites over a MemoryStore whose probe answers `verdicts` in turn, counted. */
function probed(verdicts: ConditionalVerdict[]) {
  const store = new MemoryStore();
  let probes = 0;
  const writes = new ConditionalWrites({
    store,
    probe: { node: "node-a" },
    check: () => Promise.resolve(verdicts[Math.min(probes++, verdicts.length - 1)]!),
  });
  return { store, writes, guarded: new ConditionalGuardStore(store, writes), probes: () => probes };
}

const IGNORED = "a write with If-None-Match: * to an object that exists was accepted (the " +
  "server answered success and wrote it) where S3 answers 412 Precondition Failed";

Deno.test("ConditionalGuardStore refuses conditional writes on a store that ignores them, naming its answer", async () => {
  const { store, guarded, probes } = probed([{ kind: "not_enforced", detail: IGNORED }]);
  for (const condition of [{ ifNoneMatch: "*" } as const, { ifMatch: "x" }]) {
    const err = await assertRejectsKind(
      () => guarded.putBytes("v1/volumes/v/owner.json", encoder.encode("{}"), condition),
      "misconfigured",
    );
    assert.match(err.message, /^Volumes that follow their job need a store that enforces/);
    assert.ok(err.message.includes(store.description), err.message);
    assert.ok(err.message.includes(IGNORED), err.message);
    const status = toGrpcStatus(err);
    assert.equal(status.code, Code.FAILED_PRECONDITION);
  }
  assert.deepEqual(store.keys(), [], "nothing written");
  // Everything else goes on: unconditional writes, reads, listings, deletes.
  await guarded.putBytes("v1/volumes/v/volume.json", encoder.encode("{}"));
  assert.ok(await guarded.getBytes("v1/volumes/v/volume.json"));
  assert.equal((await guarded.list("v1/")).length, 1);
  await guarded.delete("v1/volumes/v/volume.json");
  assert.equal(probes(), 1, "one probe, its verdict kept");
});

Deno.test("ConditionalGuardStore passes conditional writes once the store is known to enforce them", async () => {
  const { store, guarded, writes, probes } = probed([{ kind: "enforced" }]);
  const [a, b] = await Promise.all([
    guarded.putBytes("k1", encoder.encode("1"), { ifNoneMatch: "*" }),
    guarded.putBytes("k2", encoder.encode("2"), { ifNoneMatch: "*" }),
  ]);
  assert.ok(a.etag && b.etag);
  await assertRejectsKind(
    () => guarded.putBytes("k1", encoder.encode("again"), { ifNoneMatch: "*" }),
    "precondition_failed",
  );
  assert.deepEqual(store.keys(), ["k1", "k2"]);
  assert.equal(probes(), 1, "one probe for writes side by side");
  assert.deepEqual(writes.known, { kind: "enforced" });
  // The directory store's are enforced by construction: no probe at all.
  const local = new ConditionalWrites({
    store,
    probe: { node: "n" },
    enforced: true,
    check: () => Promise.reject(new Error("no probe expected")),
  });
  await local.require();
});

Deno.test("ConditionalWrites answers the store's error while it cannot tell, and probes again", async () => {
  const down = new StoreError("unavailable", 'Listing "v1/probe/" failed: unreachable');
  const { guarded, writes, probes } = probed([
    { kind: "unknown", error: down },
    { kind: "enforced" },
  ]);
  const err = await assertRejectsKind(
    () => guarded.putBytes("k", encoder.encode("1"), { ifNoneMatch: "*" }),
    "unavailable",
  );
  assert.equal(err, down);
  assert.equal(writes.known, undefined);
  await guarded.putBytes("k", encoder.encode("1"), { ifNoneMatch: "*" });
  assert.equal(probes(), 2);
});
