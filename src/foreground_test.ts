import assert from "node:assert/strict";
import { CallsInFlight } from "./foreground.ts";

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
