/**
 * Conditional writes of the directory store hold across processes, which share nothing but the
 * directory: of several processes creating the same key with ifNoneMatch exactly one wins, and
 * read-modify-write with ifMatch loses no increment. (The same holds over NFS, where link(2)
 * and mkdir(2) are decided by the server; that is not shown here.)
 */

import assert from "node:assert/strict";
import { FileStore } from "../../src/store/file_store.ts";

const WORKERS = 6;
const KEYS = 20;
const decoder = new TextDecoder();

Deno.test("FileStore conditional writes have exactly one winner across processes", async () => {
  const outer = await Deno.makeTempDir({ prefix: "zfs-csi-file-store-procs-" });
  try {
    const root = `${outer}/store`;
    await Deno.mkdir(root);
    const store = new FileStore(root);
    await store.putBytes("counter.json", new TextEncoder().encode("0"), { ifNoneMatch: "*" });
    const worker = new URL("../support/file_store_worker.ts", import.meta.url).pathname;
    const children = Array.from({ length: WORKERS }, (_, id) =>
      new Deno.Command(Deno.execPath(), {
        args: [
          "run",
          "--frozen",
          "--allow-read",
          `--allow-write=${outer}`,
          worker,
          root,
          String(id),
          String(KEYS),
        ],
        stdout: "piped",
        stderr: "piped",
      }).spawn());
    const ready = async () => {
      for (;;) {
        const names = [...Deno.readDirSync(outer)].filter((e) => e.name.startsWith("ready-"));
        if (names.length === WORKERS) return;
        await new Promise((resolve) => setTimeout(resolve, 20));
      }
    };
    await ready();
    await Deno.writeTextFile(`${outer}/go`, "");
    const results = await Promise.all(children.map((c) => c.output()));
    const wins = new Map<number, number[]>();
    for (const [id, out] of results.entries()) {
      assert.ok(out.success, `worker ${id}: ${decoder.decode(out.stderr)}`);
      const { won } = JSON.parse(decoder.decode(out.stdout));
      assert.ok(Array.isArray(won), `worker ${id}'s output`);
      for (const n of won) wins.set(n, [...wins.get(n) ?? [], id]);
    }
    for (let n = 0; n < KEYS; n++) {
      const winners = wins.get(n) ?? [];
      assert.equal(winners.length, 1, `race/${n}.json won by ${winners.join(", ") || "nobody"}`);
      const stored = await store.getBytes(`race/${n}.json`);
      assert.equal(decoder.decode(stored?.bytes), String(winners[0]), `race/${n}.json content`);
    }
    const counter = await store.getBytes("counter.json");
    assert.equal(decoder.decode(counter?.bytes), String(WORKERS * 10), "no increment lost");
    assert.deepEqual([...Deno.readDirSync(`${root}/.tmp`)], [], "no temporary file left");
    assert.deepEqual([...Deno.readDirSync(`${root}/.locks`)], [], "no lock left");
  } finally {
    await Deno.remove(outer, { recursive: true });
  }
});
