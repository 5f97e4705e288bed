/**
 * A full store: on a 1 MiB tmpfs mounted for the test (needs root), writes fail with
 * "no_space", name the key and the store, and leave nothing at the key and no temporary file;
 * what was stored before stays, and once space is freed writes work again.
 */

import assert from "node:assert/strict";
import { FileStore } from "../../src/store/file_store.ts";
import { assertRejectsKind } from "../support/store_contract.ts";
import { sh } from "../support/zfs_pool.ts";

const MiB = 1024 * 1024;
const encoder = new TextEncoder();

/** `size` bytes in 64 KiB chunks. */
function body(size: number): ReadableStream<Uint8Array> {
  let left = size;
  return new ReadableStream<Uint8Array>({
    pull(c) {
      if (left === 0) return c.close();
      const n = Math.min(left, 64 * 1024);
      left -= n;
      c.enqueue(new Uint8Array(n).fill(0x5a));
    },
  }, { highWaterMark: 0 });
}

Deno.test("FileStore on a full file system fails with no_space and leaves nothing", async () => {
  const root = await Deno.makeTempDir({ prefix: "zfs-csi-file-store-full-" });
  await sh("mount", "-t", "tmpfs", "-o", "size=1m,mode=0700", "tmpfs", root);
  try {
    const store = new FileStore(root);
    const kept = await store.putBytes("v1/kept.json", encoder.encode('{"kept":true}\n'));

    const streamed = await assertRejectsKind(
      store.putStream("v1/big.zfs", body(4 * MiB)),
      "no_space",
    );
    assert.match(streamed.message, /"v1\/big\.zfs"/);
    assert.ok(streamed.message.includes(`file://${root}`), streamed.message);
    assert.match(streamed.message, /full or over quota/);
    assert.equal(await store.getBytes("v1/big.zfs"), undefined, "nothing at the key");

    const written = await assertRejectsKind(
      store.putBytes("v1/big.json", new Uint8Array(2 * MiB), { ifNoneMatch: "*" }),
      "no_space",
    );
    assert.match(written.message, /"v1\/big\.json"/);
    assert.equal(await store.getBytes("v1/big.json"), undefined, "nothing at the key");

    assert.deepEqual([...Deno.readDirSync(`${root}/.tmp`)], [], "no temporary file left");
    assert.deepEqual([...Deno.readDirSync(`${root}/.locks`)], [], "no lock left");
    const listed = (await store.list("")).map(({ lastModifiedMs: _, ...o }) => o);
    assert.deepEqual(listed, [{ key: "v1/kept.json", size: 14, etag: kept.etag }]);

    // The failed writes gave their space back: a stream that fits is stored whole.
    const fits = await store.putStream("v1/fits.zfs", body(512 * 1024));
    assert.equal(fits.size, 512 * 1024);
    assert.equal((await store.getBytes("v1/fits.zfs"))?.bytes.length, 512 * 1024);
  } finally {
    await sh("umount", root);
    await Deno.remove(root);
  }
});
