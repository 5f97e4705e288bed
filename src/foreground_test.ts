import assert from "node:assert/strict";
import { runInCall } from "./call_context.ts";
import {
  CallsInFlight,
  servingOthers,
  STEP_ASIDE_BYTES_PER_SECOND,
  stepAside,
} from "./foreground.ts";

Deno.test("CallsInFlight is busy for a call only while another one is in flight", () => {
  const calls = new CallsInFlight();
  const [stage, publish] = [{}, {}];
  assert.equal(calls.busyBesides(undefined), false);
  const endStage = calls.begin(stage);
  // The stage's own work (a follow volume's receive) does not wait for the stage itself.
  assert.equal(calls.busyBesides(stage), false);
  assert.equal(calls.busyBesides(undefined), true);
  assert.equal(calls.busyBesides(publish), true);
  const endPublish = calls.begin(publish);
  assert.equal(calls.busyBesides(stage), true);
  endPublish();
  endPublish();
  assert.equal(calls.busyBesides(stage), false);
  endStage();
  assert.equal(calls.busyBesides(undefined), false);
});

/** Calls that stay busy until `end()`. */
function busyCalls() {
  let busy = true;
  return { busyBesides: () => busy, end: () => busy = false };
}

Deno.test("stepAside does not pause, nor set a timer, while no other volume call is served", async () => {
  const calls = new CallsInFlight();
  // Resolved before a timer of 0 ms fires: no timer was set.
  const first = await Promise.race([
    stepAside(1024 ** 3, calls).then((paused) => `stepAside ${paused}`),
    new Promise((r) => setTimeout(() => r("timer"), 0)),
  ]);
  assert.equal(first, "stepAside false");
});

Deno.test("stepAside pauses as long as the bytes take at the slow rate while a call is served", async () => {
  const calls = busyCalls();
  const bytes = STEP_ASIDE_BYTES_PER_SECOND / 20; // 50 ms at the slow rate
  const t0 = performance.now();
  assert.equal(await stepAside(bytes, calls), true);
  assert.ok(performance.now() - t0 >= 45, `paused ${performance.now() - t0} ms`);
});

Deno.test("stepAside ends its pause soon after the calls end", async () => {
  const calls = busyCalls();
  setTimeout(calls.end, 20);
  const t0 = performance.now();
  // 64 s at the slow rate, were the call not to end.
  assert.equal(await stepAside(STEP_ASIDE_BYTES_PER_SECOND * 64, calls), true);
  assert.ok(performance.now() - t0 < 5_000, `paused ${performance.now() - t0} ms`);
});

Deno.test("servingOthers is false for the call's own work and true for another's", () => {
  const calls = new CallsInFlight();
  const stage = { operation: "NodeStageVolume", signal: new AbortController().signal };
  const end = calls.begin(stage);
  assert.equal(servingOthers(calls), true);
  assert.equal(runInCall(stage, () => servingOthers(calls)), false);
  end();
  assert.equal(servingOthers(calls), false);
});
