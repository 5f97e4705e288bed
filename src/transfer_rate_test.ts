import assert from "node:assert/strict";
import { transferRate } from "./transfer_rate.ts";

Deno.test("transferRate gives bytes per second and the seconds left at that rate", () => {
  assert.deepEqual(transferRate(250, 1000, 5000), { bytesPerSecond: 50, secondsLeft: 15 });
});

Deno.test("transferRate has no time left when nothing moved yet or everything is done", () => {
  assert.deepEqual(transferRate(0, 1000, 5000), { bytesPerSecond: 0, secondsLeft: undefined });
  assert.deepEqual(transferRate(1000, 1000, 2000), { bytesPerSecond: 500, secondsLeft: undefined });
});

Deno.test("transferRate counts a start less than a millisecond ago as one millisecond", () => {
  assert.deepEqual(transferRate(10, 20, 0), { bytesPerSecond: 10_000, secondsLeft: 0.001 });
});
