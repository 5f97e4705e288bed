import assert from "node:assert/strict";
import { createHash } from "node:crypto";
import { runInCall } from "../call_context.ts";
import { CallsInFlight } from "../foreground.ts";
import { HASH_SLICE_BYTES, updateInSlices } from "./hash_slices.ts";

Deno.test("updateInSlices gives the digest of the whole chunk, at every size around a slice", async () => {
  const bytes = new Uint8Array(3 * HASH_SLICE_BYTES + 17).map((_, i) => (i * 31 + 7) & 0xff);
  for (
    const n of [0, 1, HASH_SLICE_BYTES - 1, HASH_SLICE_BYTES, HASH_SLICE_BYTES + 1, bytes.length]
  ) {
    const chunk = bytes.subarray(0, n);
    const sliced = createHash("sha256");
    await updateInSlices(sliced, chunk);
    assert.equal(sliced.digest("hex"), createHash("sha256").update(chunk).digest("hex"), `${n}`);
  }
});

Deno.test("updateInSlices lets a timer run between the slices of one large chunk", async () => {
  const chunk = new Uint8Array(64 * HASH_SLICE_BYTES);
  let ticks = 0;
  const timer = setInterval(() => ticks++, 0);
  try {
    await updateInSlices(createHash("sha256"), chunk);
  } finally {
    clearInterval(timer);
  }
  // Hashed in one piece, the 8 MiB would let no timer run before the hash ends.
  assert.ok(ticks > 0, "no timer ran while 64 slices were hashed");
});

Deno.test("updateInSlices pauses before each slice while a volume call is in flight", async () => {
  const chunk = new Uint8Array(8 * HASH_SLICE_BYTES).map((_, i) => i & 0xff);
  const t0 = performance.now();
  const calm = createHash("sha256");
  await updateInSlices(calm, chunk, { busyBesides: () => false });
  const calmMs = performance.now() - t0;
  const t1 = performance.now();
  const stepping = createHash("sha256");
  await updateInSlices(stepping, chunk, { busyBesides: () => true });
  const steppingMs = performance.now() - t1;
  assert.equal(stepping.digest("hex"), calm.digest("hex"));
  // Eight pauses of at least a millisecond each.
  assert.ok(steppingMs >= 8, `hashed 8 slices in ${steppingMs.toFixed(1)} ms while busy`);
  assert.ok(steppingMs > calmMs, `${steppingMs} ms busy, ${calmMs} ms calm`);
});

Deno.test("updateInSlices does not pause for the call it runs for, only for others", async () => {
  const chunk = new Uint8Array(8 * HASH_SLICE_BYTES);
  const calls = new CallsInFlight();
  const stage = { operation: "NodeStageVolume", signal: new AbortController().signal };
  const end = calls.begin(stage);
  try {
    const time = async () => {
      const t0 = performance.now();
      await updateInSlices(createHash("sha256"), chunk, calls);
      return performance.now() - t0;
    };
    const own = await runInCall(stage, time);
    const others = await time();
    assert.ok(others >= 8, `hashed 8 slices in ${others.toFixed(1)} ms beside the stage`);
    assert.ok(own < others, `${own} ms within the stage, ${others} ms beside it`);
  } finally {
    end();
  }
});
