import assert from "node:assert/strict";
import { CopyGate } from "./gate.ts";

Deno.test("CopyGate: a stage aborts a background run of the same dataset and waits for its end", async () => {
  const gate = new CopyGate();
  const order: string[] = [];
  let started!: () => void;
  const running = new Promise<void>((r) => started = r);
  const background = gate.background("tank/a", (signal) =>
    new Promise<string>((_, reject) => {
      started();
      signal.addEventListener("abort", () =>
        setTimeout(() => {
          order.push("background ended");
          reject(signal.reason);
        }, 20));
    }));
  await running;
  const stage = gate.exclusive("tank/a", () => {
    order.push("stage");
    return Promise.resolve("staged");
  });
  assert.equal(await stage, "staged");
  await assert.rejects(
    background,
    (e: unknown) => e instanceof DOMException && e.name === "AbortError",
  );
  assert.deepEqual(order, ["background ended", "stage"]);
});

Deno.test("CopyGate: no background run while a stage works on the dataset; others go on", async () => {
  const gate = new CopyGate();
  let finish!: () => void;
  const stage = gate.exclusive("tank/a", () => new Promise<void>((r) => finish = r));
  assert.equal(gate.isBusy("tank/a"), true);
  assert.deepEqual(await gate.background("tank/a", () => Promise.resolve(1)), { ran: false });
  assert.deepEqual(await gate.background("tank/b", () => Promise.resolve(2)), {
    ran: true,
    value: 2,
  });
  finish();
  await stage;
  assert.equal(gate.isBusy("tank/a"), false);
  assert.deepEqual(await gate.background("tank/a", () => Promise.resolve(3)), {
    ran: true,
    value: 3,
  });
});
