import assert from "node:assert/strict";
import { relayStream } from "./relay.ts";

/** A byte stream of `chunks`, telling whether each read came with the reader's buffer. */
function byteSource(chunks: number[], seen: ("byob" | "default")[]): ReadableStream<Uint8Array> {
  let i = 0;
  return new ReadableStream({
    type: "bytes",
    pull(controller: ReadableByteStreamController) {
      if (i === chunks.length) {
        controller.close();
        controller.byobRequest?.respond(0);
        return;
      }
      const n = chunks[i]!;
      const fill = i++ + 1;
      const view = controller.byobRequest?.view;
      if (view) {
        seen.push("byob");
        const into = new Uint8Array(view.buffer, view.byteOffset, Math.min(n, view.byteLength));
        into.fill(fill);
        controller.byobRequest!.respond(into.length);
      } else {
        seen.push("default");
        controller.enqueue(new Uint8Array(n).fill(fill));
      }
    },
  });
}

const passing = () => ({ read: <T>(read: () => Promise<T>) => read() });

Deno.test("relayStream passes a BYOB reader's buffers down to a byte source", async () => {
  const seen: ("byob" | "default")[] = [];
  const relayed = relayStream(byteSource([1000, 1000], seen), passing, 4096);
  const reader = relayed.getReader({ mode: "byob" });
  let buffer = new Uint8Array(4096);
  const got: number[] = [];
  for (;;) {
    const r = await reader.read(buffer);
    if (r.done) break;
    assert.equal(r.value.buffer.byteLength, 4096, "the reader's own memory comes back");
    got.push(r.value.length, r.value[0]!);
    buffer = new Uint8Array(r.value.buffer);
  }
  assert.deepEqual(got, [1000, 1, 1000, 2]);
  assert.deepEqual(seen, ["byob", "byob"]);
});

Deno.test("relayStream gives a default reader of a byte source chunks holding only their bytes", async () => {
  const seen: ("byob" | "default")[] = [];
  const relayed = relayStream(byteSource([100, 3000], seen), passing, 4096);
  const chunks = [];
  for await (const chunk of relayed) chunks.push(chunk);
  assert.deepEqual(chunks.map((c) => [c.length, c[0]]), [[100, 1], [3000, 2]]);
  // The short read is copied out of the 4 KiB read buffer; the long one keeps it.
  assert.deepEqual(chunks.map((c) => c.buffer.byteLength), [100, 4096]);
});

Deno.test("relayStream passes a stream of chunks on as it is", async () => {
  const source = ReadableStream.from([new Uint8Array([1, 2]), new Uint8Array([3])]);
  const relayed = relayStream(source, passing, 4096);
  assert.throws(() => relayed.getReader({ mode: "byob" }), TypeError);
  const chunks = [];
  for await (const chunk of relayed) chunks.push([...chunk]);
  assert.deepEqual(chunks, [[1, 2], [3]]);
});

Deno.test("relayStream runs each read through its hook, ends the stream with what the hook throws, and tells the end once", async () => {
  for (const bytes of [true, false]) {
    const seen: ("byob" | "default")[] = [];
    const source = bytes
      ? byteSource([10, 10, 10], seen)
      : ReadableStream.from([new Uint8Array(10), new Uint8Array(10), new Uint8Array(10)]);
    let reads = 0;
    let ends = 0;
    let cancelled = 0;
    const relayed = relayStream(source, (cancel) => ({
      read: async <T>(read: () => Promise<T>) => {
        if (++reads === 2) {
          cancel();
          cancelled++;
          throw new RangeError("stalled");
        }
        return await read();
      },
      end: () => void ends++,
    }), 64);
    const reader = relayed.getReader();
    assert.equal((await reader.read()).value?.length, 10);
    await assert.rejects(reader.read(), RangeError);
    await assert.rejects(reader.read(), RangeError);
    assert.deepEqual([reads, ends, cancelled], [2, 1, 1], bytes ? "byte source" : "chunks");
  }
});

Deno.test("relayStream: cancelling the relayed stream cancels the source and tells the end", async () => {
  let reason: unknown;
  const source = new ReadableStream<Uint8Array>({
    pull: (c) => c.enqueue(new Uint8Array(1)),
    cancel: (r) => void (reason = r),
  });
  let ends = 0;
  const relayed = relayStream(source, () => ({ ...passing(), end: () => void ends++ }), 64);
  const reader = relayed.getReader();
  await reader.read();
  await reader.cancel("enough");
  assert.equal(reason, "enough");
  assert.equal(ends, 1);
});
