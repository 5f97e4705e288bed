import assert from "node:assert/strict";
import { createHash } from "node:crypto";
import { followFile } from "./file_stream.ts";

async function tempFile(): Promise<{ path: string } & AsyncDisposable> {
  const dir = await Deno.makeTempDir({ dir: "/tmp", prefix: "zfs-csi-follow-" });
  return { path: `${dir}/f`, [Symbol.asyncDispose]: () => Deno.remove(dir, { recursive: true }) };
}

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

Deno.test("followFile hashes what a writer appends, through pauses, until it ended", async () => {
  await using f = await tempFile();
  const file = await Deno.open(f.path, { write: true, createNew: true });
  const chunks = Array.from({ length: 12 }, (_, i) => new Uint8Array(7000 + i).fill(i * 17));
  let ended = () => {};
  const writerEnded = new Promise<void>((r) => ended = r);
  const writer = (async () => {
    for (const chunk of chunks) {
      for (let at = 0; at < chunk.length;) at += await file.write(chunk.subarray(at));
      // Pauses longer than the follower's poll: it reaches the end of the file many times.
      await sleep(15);
    }
    file.close();
    ended();
  })();
  // A buffer smaller than a chunk: reads end mid-chunk too.
  const digest = await followFile(f.path, writerEnded, {
    chunkBytes: 4096,
    writeBackEvery: 10_000,
  });
  await writer;
  const all = new Uint8Array(chunks.reduce((n, c) => n + c.length, 0));
  chunks.reduce((at, c) => (all.set(c, at), at + c.length), 0);
  assert.equal(digest.size, all.length);
  assert.equal(digest.sha256, createHash("sha256").update(all).digest("hex"));
});

Deno.test("followFile reads to the end of what the writer wrote before a failed exit", async () => {
  await using f = await tempFile();
  await Deno.writeFile(f.path, new Uint8Array(10_000).fill(5));
  const digest = await followFile(f.path, Promise.reject(new Error("killed")), {
    chunkBytes: 1024,
  });
  assert.equal(digest.size, 10_000);
});
