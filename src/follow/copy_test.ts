import assert from "node:assert/strict";
import { type LocalCopy, planCopy } from "./copy.ts";

const chain = ["10", "20", "30"];
const clean = (at: string): LocalCopy => ({
  generation: 1,
  releasedAt: at,
  newestGuid: at,
  readonly: true,
});

Deno.test("planCopy: no local copy receives the chain in full, or creates with no head", () => {
  assert.deepEqual(planCopy(undefined, { generation: 2, heldBefore: false, chain }), {
    kind: "full",
    setAside: false,
    why: "this node has no copy",
  });
  assert.equal(planCopy(undefined, { generation: 1, heldBefore: false, chain: [] }).kind, "create");
});

Deno.test("planCopy: a clean copy at the head is current, one behind on the chain gets the increment", () => {
  assert.deepEqual(planCopy(clean("30"), { generation: 3, heldBefore: false, chain }), {
    kind: "current",
  });
  assert.deepEqual(planCopy(clean("10"), { generation: 3, heldBefore: false, chain }), {
    kind: "increment",
    from: "10",
  });
});

Deno.test("planCopy: a copy that diverged is set aside and the chain received in full", () => {
  const owner = { generation: 3, heldBefore: false, chain };
  const cases: [string, LocalCopy, RegExp][] = [
    ["lost holder", { generation: 1, newestGuid: "30", readonly: false }, /never released/],
    ["written after release", { ...clean("30"), written: 4096 }, /changed after/],
    ["writable again", { ...clean("30"), readonly: false }, /changed after/],
    ["snapshot after release", { ...clean("20"), newestGuid: "25" }, /changed after/],
    ["off the chain", clean("99"), /not on the chain/],
  ];
  for (const [name, local, why] of cases) {
    const plan = planCopy(local, owner);
    assert.equal(plan.kind, "full", name);
    assert.ok(plan.kind === "full" && plan.setAside, name);
    assert.match(plan.kind === "full" ? plan.why : "", why, name);
  }
});

Deno.test("planCopy: the holder's own copy is current only under its generation", () => {
  const mine = { generation: 4, heldBefore: true, chain };
  assert.deepEqual(planCopy({ generation: 4, readonly: false }, mine), { kind: "current" });
  const stale = planCopy({ generation: 2, readonly: false }, mine);
  assert.equal(stale.kind, "full");
  assert.ok(stale.kind === "full" && stale.setAside);
  // Nothing in the store and no copy: a new empty dataset.
  assert.equal(planCopy(undefined, { ...mine, chain: [] }).kind, "create");
});

Deno.test("planCopy: an unclean released copy says which fact moved", () => {
  const owner = { generation: 3, heldBefore: false, chain };
  const why = (local: LocalCopy) => {
    const plan = planCopy(local, owner);
    return plan.kind === "full" ? plan.why : `not set aside: ${plan.kind}`;
  };
  // A snapshot after the final one (a scheduled backup alongside the release): data unchanged,
  // still not the store's snapshot, so no increment can start from it.
  assert.match(
    why({ ...clean("20"), newestGuid: "25", written: 0 }),
    /newest snapshot is guid 25, not the released 20/,
  );
  assert.doesNotMatch(why({ ...clean("20"), newestGuid: "25" }), /writable|written/);
  assert.match(why({ ...clean("30"), readonly: false }), /writable again/);
  assert.match(why({ ...clean("30"), written: 8192 }), /8192 bytes written since/);
  const all = why({ ...clean("20"), newestGuid: "25", readonly: false, written: 1 });
  assert.match(all, /newest snapshot.*; it is writable again; 1 bytes written/);
});
