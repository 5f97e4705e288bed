import assert from "node:assert/strict";
import { readAll } from "./child_output.ts";

function streamOf(chunks: readonly Uint8Array[]): ReadableStream<Uint8Array> {
  return new ReadableStream({
    start(controller) {
      for (const c of chunks) controller.enqueue(c);
      controller.close();
    },
  });
}

Deno.test("readAll: no output is an empty array", async () => {
  assert.deepEqual(await readAll(streamOf([])), new Uint8Array(0));
});

Deno.test("readAll: chunks come back joined in order", async () => {
  const got = await readAll(
    streamOf([
      new Uint8Array([1, 2]),
      new Uint8Array([]),
      new Uint8Array([3]),
      new Uint8Array([4, 5]),
    ]),
  );
  assert.deepEqual(got, new Uint8Array([1, 2, 3, 4, 5]));
});

Deno.test("readAll: output larger than one pipe read arrives whole", async () => {
  const big = Array.from({ length: 40 }, (_, i) => new Uint8Array(4096).fill(i));
  const got = await readAll(streamOf(big));
  assert.equal(got.length, 40 * 4096);
  assert.equal(got[0], 0);
  assert.equal(got[39 * 4096], 39);
  assert.equal(got.at(-1), 39);
});

Deno.test("readAll: a failing stream rejects and the stream is released", async () => {
  const stream = new ReadableStream<Uint8Array>({
    pull(controller) {
      controller.error(new Error("pipe broke"));
    },
  });
  await assert.rejects(readAll(stream), /pipe broke/);
  assert.equal(stream.locked, false);
});
