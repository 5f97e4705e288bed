import assert from "node:assert/strict";
import { MemoryStore } from "../../tests/support/memory_store.ts";
import { Logger } from "../log.ts";
import { ProgressStore } from "./progress.ts";

Deno.test("ProgressStore passes downloads through and logs bytes, rate and estimate every interval", async () => {
  const inner = new MemoryStore({ chunkSize: 100 });
  await inner.putBytes("a/b", new Uint8Array(1000).fill(7));
  const lines: string[] = [];
  let mono = 0;
  const store = new ProgressStore(inner, new Logger("info", {}, (l) => lines.push(l)), {
    totalBytes: 4000,
    everyMs: 10_000,
    monotonic: () => mono,
  });
  const reader = (await store.getStream("a/b")).getReader();
  let got = 0;
  for (;;) {
    const { done, value } = await reader.read();
    if (done) break;
    got += value.length;
    // Each chunk takes 2 s: a line every 5 chunks.
    mono += 2_000;
  }
  assert.equal(got, 1000);
  assert.equal(store.bytes, 1000);
  const logged = lines.map((l) => JSON.parse(l));
  assert.ok(logged.length >= 1 && logged.length <= 2, `${logged.length} lines`);
  const first = logged[0];
  assert.equal(first.msg, "receiving from the store");
  assert.equal(first.totalBytes, 4000);
  assert.ok(first.bytes > 0 && first.bytes <= 1000);
  assert.equal(first.bytesPerSecond, Math.round(first.bytes / 10));
  assert.equal(first.etaSeconds, Math.round((4000 - first.bytes) / first.bytesPerSecond));
  // Everything else goes straight through.
  await store.putBytes("c/d", new Uint8Array([1]));
  assert.deepEqual(inner.peek("c/d"), new Uint8Array([1]));
  assert.equal(store.description, inner.description);
});
