import assert from "node:assert/strict";
import { formatStep } from "./format.ts";

Deno.test("formatStep formats only a blank device the plugin has no record of", () => {
  assert.deepEqual(formatStep("", undefined, "ext4"), { kind: "format" });
  assert.deepEqual(formatStep("", undefined, "xfs"), { kind: "format" });
});

Deno.test("formatStep never formats a device recorded as done: mounts it, or refuses", () => {
  assert.deepEqual(formatStep("done", { type: "ext4" }, "ext4"), { kind: "mount" });
  for (const found of [undefined, { type: "xfs" }, { ptType: "gpt" }]) {
    const step = formatStep("done", found, "ext4");
    assert.equal(step.kind, "refuse", JSON.stringify(found));
  }
});

Deno.test("formatStep redoes a format the plugin began and never finished, whatever is there", () => {
  // Killed during mkfs: a half-made ext4, a whole one not yet recorded, or still nothing.
  for (const found of [undefined, { type: "ext4" }, { type: "xfs" }]) {
    assert.deepEqual(formatStep("begun", found, "ext4"), { kind: "redo" });
  }
});

Deno.test("formatStep adopts a filesystem of the wanted type it did not make, refuses any other", () => {
  assert.deepEqual(formatStep("", { type: "xfs" }, "xfs"), { kind: "adopt" });
  const other = formatStep("", { type: "ext4" }, "xfs");
  assert.equal(other.kind, "refuse");
  assert.match(other.kind === "refuse" ? other.why : "", /holds ext4, not xfs/);
  assert.equal(formatStep("", { ptType: "dos" }, "ext4").kind, "refuse");
  assert.equal(formatStep("", { type: "LVM2_member" }, "ext4").kind, "refuse");
  assert.equal(formatStep("maybe", undefined, "ext4").kind, "refuse");
});
