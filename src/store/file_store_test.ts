import assert from "node:assert/strict";
import { createHash } from "node:crypto";
import { readSync, write } from "node:fs";
import {
  assertRejectsKind,
  INVALID_KEYS,
  storeContract,
} from "../../tests/support/store_contract.ts";
import { checkDeletedRetentionOnStoreClock } from "../../tests/support/deleted_retention.ts";
import { FileStore, type FileStoreOptions } from "./file_store.ts";
import { SMALL_OBJECT_BYTES } from "./file_etag.ts";
import { MAX_OBJECT_BYTES, StoreError } from "./store.ts";

const encoder = new TextEncoder();
const decoder = new TextDecoder();

/** A temporary directory under /tmp, removed with everything in it at the end of the scope. */
async function tempDir(): Promise<{ path: string } & AsyncDisposable> {
  const path = await Deno.makeTempDir({ dir: "/tmp", prefix: "zfs-csi-file-store-" });
  return { path, [Symbol.asyncDispose]: () => Deno.remove(path, { recursive: true }) };
}

async function names(dir: string): Promise<string[]> {
  const out: string[] = [];
  try {
    for await (const e of Deno.readDir(dir)) out.push(e.name);
  } catch (err) {
    if (!(err instanceof Deno.errors.NotFound)) throw err;
  }
  return out.sort();
}

function lockName(key: string): string {
  return createHash("sha256").update(key).digest("hex").slice(0, 32);
}

Deno.test("FileStore passes the store contract", async (t) => {
  await using dir = await tempDir();
  let n = 0;
  await storeContract(t, async () => {
    const root = `${dir.path}/store${n++}`;
    await Deno.mkdir(root);
    return new FileStore(root);
  });
});

Deno.test("FileStore: the store pruner ages a deleted volume by the files' mtimes, not by nodes' clocks", async () => {
  await using dir = await tempDir();
  await checkDeletedRetentionOnStoreClock(new FileStore(dir.path));
});

Deno.test("FileStore leaves no temporary file after finished, failed and aborted writes", async () => {
  await using dir = await tempDir();
  const store = new FileStore(dir.path);
  await store.putStream("a/s.zfs", ReadableStream.from([encoder.encode("ok")]));
  await store.putBytes("a/m.json", encoder.encode("{}"), { ifNoneMatch: "*" });
  await assertRejectsKind(
    store.putBytes("a/m.json", encoder.encode("{}"), { ifNoneMatch: "*" }),
    "precondition_failed",
  );
  await assertRejectsKind(
    store.putBytes("a/m.json", encoder.encode("{}"), { ifMatch: "stale" }),
    "precondition_failed",
  );
  const failing = new ReadableStream<Uint8Array>({
    start(c) {
      c.enqueue(new Uint8Array(1000));
      c.error(new Error("sender died"));
    },
  });
  await assert.rejects(store.putStream("a/f.zfs", failing), /sender died/);
  const controller = new AbortController();
  const stalled = new ReadableStream<Uint8Array>({
    pull(c) {
      c.enqueue(new Uint8Array(1000));
      controller.abort(new Error("stop"));
      return new Promise(() => {});
    },
  }, { highWaterMark: 0 });
  await assert.rejects(
    store.putStream("a/g.zfs", stalled, { signal: controller.signal }),
    /stop/,
  );
  assert.deepEqual(await names(`${dir.path}/.tmp`), []);
  assert.deepEqual(await names(`${dir.path}/.locks`), [], "every lock released");
  assert.deepEqual(await names(`${dir.path}/a`), ["m.json", "s.zfs"]);
});

Deno.test("FileStore.putStream cancels the body it cannot write, so the sender stops", async () => {
  await using dir = await tempDir();
  const refused = async (store: FileStore, key: string) => {
    let cancelled: unknown;
    const body = new ReadableStream<Uint8Array>({
      pull: (c) => c.enqueue(new Uint8Array(1)),
      cancel: (reason) => void (cancelled = reason),
    });
    const error = await assertRejectsKind(
      store.putStream(key, body),
      key === "../x" ? "invalid" : "unavailable",
    );
    assert.equal(cancelled, error, `the body of "${key}" is cancelled with the error`);
  };
  await refused(new FileStore(dir.path), "../x");
  await refused(new FileStore(`${dir.path}/missing`), "v1/a.zfs");
});

Deno.test("FileStore writes files 0600 in directories 0700", async () => {
  await using dir = await tempDir();
  const store = new FileStore(dir.path);
  await store.putStream("v1/s.zfs", ReadableStream.from([encoder.encode("data")]));
  await store.putBytes("v1/m.json", encoder.encode("{}"), { ifNoneMatch: "*" });
  assert.equal((await Deno.stat(`${dir.path}/v1/s.zfs`)).mode! & 0o777, 0o600);
  assert.equal((await Deno.stat(`${dir.path}/v1/m.json`)).mode! & 0o777, 0o600);
  assert.equal((await Deno.stat(`${dir.path}/v1`)).mode! & 0o777, 0o700);
});

Deno.test("FileStore.cleanTemp removes only temporary files and locks older than the age", async () => {
  await using dir = await tempDir();
  const store = new FileStore(dir.path);
  await store.putBytes("k", encoder.encode("x")); // makes .tmp and .locks
  const old = new Date(Date.now() - 2 * 24 * 3600_000);
  await Deno.writeTextFile(`${dir.path}/.tmp/old.part`, "left by a crash");
  await Deno.utime(`${dir.path}/.tmp/old.part`, old, old);
  await Deno.writeTextFile(`${dir.path}/.tmp/fresh.part`, "being written");
  await Deno.mkdir(`${dir.path}/.locks/oldlock`);
  await Deno.utime(`${dir.path}/.locks/oldlock`, old, old);
  await Deno.mkdir(`${dir.path}/.locks/freshlock`);
  assert.equal(await store.cleanTemp(), 2);
  assert.deepEqual(await names(`${dir.path}/.tmp`), ["fresh.part"]);
  assert.deepEqual(await names(`${dir.path}/.locks`), ["freshlock"]);
  assert.equal(await store.cleanTemp(-1000), 2, "a negative age takes everything");
  assert.equal(decoder.decode((await store.getBytes("k"))?.bytes), "x", "objects untouched");
});

Deno.test("FileStore conditional writes have one winner across store instances", async () => {
  await using dir = await tempDir();
  // Two instances share nothing but the directory, like two plugin processes.
  const stores = [new FileStore(dir.path), new FileStore(dir.path)];
  const writers = 16;
  for (let round = 0; round < 5; round++) {
    const key = `race/r${round}.json`;
    const created = await Promise.allSettled(
      Array.from(
        { length: writers },
        (_, i) => stores[i % 2]!.putBytes(key, encoder.encode(`w${i}`), { ifNoneMatch: "*" }),
      ),
    );
    assert.equal(created.filter((r) => r.status === "fulfilled").length, 1, `create ${round}`);
    const etag = (await stores[0]!.getBytes(key))!.etag;
    const replaced = await Promise.allSettled(
      Array.from(
        { length: writers },
        (_, i) => stores[i % 2]!.putBytes(key, encoder.encode(`u${i}`), { ifMatch: etag }),
      ),
    );
    assert.equal(replaced.filter((r) => r.status === "fulfilled").length, 1, `replace ${round}`);
  }
});

Deno.test("FileStore ifMatch read-modify-write loses no update under contention", async () => {
  await using dir = await tempDir();
  const stores = [new FileStore(dir.path), new FileStore(dir.path)];
  const key = "counter.json";
  await stores[0]!.putBytes(key, encoder.encode("0"), { ifNoneMatch: "*" });
  const increment = async (store: FileStore) => {
    for (;;) {
      const current = (await store.getBytes(key))!;
      const next = encoder.encode(String(Number(decoder.decode(current.bytes)) + 1));
      try {
        await store.putBytes(key, next, { ifMatch: current.etag });
        return;
      } catch (err) {
        if (!(err instanceof StoreError && err.kind === "precondition_failed")) throw err;
      }
    }
  };
  const writers = 8;
  const each = 5;
  await Promise.all(Array.from({ length: writers }, async (_, i) => {
    for (let j = 0; j < each; j++) await increment(stores[i % 2]!);
  }));
  assert.equal(decoder.decode((await stores[1]!.getBytes(key))!.bytes), String(writers * each));
});

Deno.test("FileStore refuses invalid and reserved keys before any file-system call", async () => {
  await using dir = await tempDir();
  // The root does not exist: any file-system call would fail with "unavailable".
  const store = new FileStore(`${dir.path}/missing`);
  const bytes = encoder.encode("x");
  for (const key of [...INVALID_KEYS, ".tmp/x", ".locks/abc", ".hidden", "v1/.nfs0001"]) {
    await assertRejectsKind(store.putBytes(key, bytes), "invalid", key);
    await assertRejectsKind(store.putStream(key, ReadableStream.from([bytes])), "invalid", key);
    await assertRejectsKind(store.getBytes(key), "invalid", key);
    await assertRejectsKind(store.getStream(key), "invalid", key);
    await assertRejectsKind(store.delete(key), "invalid", key);
  }
  assert.deepEqual(await store.list(".t"), [], "nothing of the store's own is listed");
  assert.deepEqual(await store.list("v1/.nfs"), []);
});

Deno.test("FileStore answers unavailable and creates nothing when its directory is missing", async () => {
  await using dir = await tempDir();
  const root = `${dir.path}/mnt/backup`;
  const store = new FileStore(root);
  const bytes = encoder.encode("x");
  const calls: Array<[string, () => Promise<unknown>]> = [
    ["putBytes", () => store.putBytes("v1/a.json", bytes)],
    ["putBytes ifNoneMatch", () => store.putBytes("v1/a.json", bytes, { ifNoneMatch: "*" })],
    ["putStream", () => store.putStream("v1/a.zfs", ReadableStream.from([bytes]))],
    ["getBytes", () => store.getBytes("v1/a.json")],
    ["getStream", () => store.getStream("v1/a.json")],
    ["list", () => store.list("v1/")],
    ["list all", () => store.list("")],
    ["delete", () => store.delete("v1/a.json")],
  ];
  for (const [label, call] of calls) {
    const error = await assertRejectsKind(call, "unavailable", label);
    assert.match(error.message, new RegExp(`${root} does not exist`), label);
  }
  assert.deepEqual(await names(dir.path), [], "the root was not created");
});

Deno.test("FileStore etags: content for small objects, stat for large, the same everywhere", async () => {
  await using dir = await tempDir();
  const store = new FileStore(dir.path);
  const small = encoder.encode("manifest");
  const a = await store.putBytes("a.json", small);
  const b = await store.putStream("b.json", ReadableStream.from([small]));
  assert.equal(a.etag, b.etag, "same small content, same etag");
  const big = new Uint8Array(SMALL_OBJECT_BYTES + 1).fill(7);
  const c = await store.putStream(
    "c.zfs",
    ReadableStream.from([big.subarray(0, 10), big.subarray(10)]),
  );
  const d = await store.putBytes("d.zfs", big);
  assert.notEqual(c.etag, d.etag, "large objects are told apart by their files");
  const listed = await store.list("");
  assert.deepEqual(listed.map((o) => [o.key, o.etag, o.size]), [
    ["a.json", a.etag, small.length],
    ["b.json", b.etag, small.length],
    ["c.zfs", c.etag, big.length],
    ["d.zfs", d.etag, big.length],
  ]);
  assert.equal((await store.getBytes("c.zfs"))?.etag, c.etag);
  assert.equal((await store.getBytes("d.zfs"))?.etag, d.etag);
  const e = await store.putBytes("d.zfs", big, { ifMatch: d.etag });
  assert.notEqual(e.etag, d.etag, "a large object rewritten with the same bytes is a new version");
  await assertRejectsKind(store.putBytes("d.zfs", big, { ifMatch: d.etag }), "precondition_failed");
});

Deno.test("FileStore.delete removes emptied directories up to the root, not further", async () => {
  await using dir = await tempDir();
  const store = new FileStore(dir.path);
  await store.putBytes("v1/volumes/a/snapshots/1.json", encoder.encode("1"));
  await store.putBytes("v1/volumes/a/volume.json", encoder.encode("r"));
  await store.delete("v1/volumes/a/snapshots/1.json");
  assert.deepEqual(await names(`${dir.path}/v1/volumes/a`), ["volume.json"]);
  await store.delete("v1/volumes/a/volume.json");
  assert.deepEqual((await names(dir.path)).filter((n) => !n.startsWith(".")), []);
  assert.ok((await Deno.stat(dir.path)).isDirectory, "the root stays");
  await store.putBytes("v1/volumes/a/volume.json", encoder.encode("again"), { ifNoneMatch: "*" });
  assert.equal(decoder.decode((await store.getBytes("v1/volumes/a/volume.json"))?.bytes), "again");
});

Deno.test("FileStore writes survive concurrent deletes emptying their directory", async () => {
  await using dir = await tempDir();
  const store = new FileStore(dir.path);
  for (let i = 0; i < 30; i++) {
    await store.putBytes(`d/e/old${i}`, encoder.encode("x"));
    await Promise.all([
      store.delete(`d/e/old${i}`),
      store.putBytes(`d/e/new${i}.json`, encoder.encode("y"), { ifNoneMatch: "*" }),
      store.putStream(`d/e/new${i}.zfs`, ReadableStream.from([encoder.encode("z")])),
    ]);
    assert.ok(await store.getBytes(`d/e/new${i}.json`), `manifest ${i}`);
    assert.ok(await store.getBytes(`d/e/new${i}.zfs`), `stream ${i}`);
  }
});

Deno.test("FileStore.list skips names that cannot be keys and non-files", async () => {
  await using dir = await tempDir();
  const store = new FileStore(dir.path);
  await store.putBytes("v1/ok.json", encoder.encode("x"));
  await Deno.mkdir(`${dir.path}/lost+found`);
  await Deno.writeTextFile(`${dir.path}/lost+found/x`, "y");
  await Deno.writeTextFile(`${dir.path}/v1/notes txt`, "operator's");
  await Deno.mkdir(`${dir.path}/v1/empty`);
  await Deno.writeTextFile(`${dir.path}/v1/.nfs000000000012abcd00000001`, "deleted while open");
  assert.deepEqual((await store.list("")).map((o) => o.key), ["v1/ok.json"]);
  assert.deepEqual(await store.list("v1/empty"), []);
  assert.equal(await store.getBytes("v1/empty"), undefined, "a directory is no object");
  await assertRejectsKind(store.getStream("v1/empty"), "not_found");
  await assertRejectsKind(store.putBytes("v1/empty", encoder.encode("x")), "invalid");
  await assertRejectsKind(store.putBytes("v1/ok.json/x", encoder.encode("x")), "invalid");
});

Deno.test("FileStore waits for a held key lock and breaks one left by a dead writer", async () => {
  await using dir = await tempDir();
  const options: FileStoreOptions = { staleMs: 300, holdMs: 100, waitMs: 5_000 };
  const store = new FileStore(dir.path, options);
  const first = await store.putBytes("k.json", encoder.encode("1"));
  // A writer that died holding the lock: the directory stays, unchanged.
  const lock = `${dir.path}/.locks/${lockName("k.json")}`;
  await Deno.mkdir(lock);
  const start = performance.now();
  await store.putBytes("k.json", encoder.encode("2"), { ifMatch: first.etag });
  const waited = performance.now() - start;
  assert.ok(waited >= 300, `waited ${waited} ms for the lock to go stale`);
  assert.equal(decoder.decode((await store.getBytes("k.json"))?.bytes), "2");
  assert.deepEqual(await names(`${dir.path}/.locks`), []);
});

Deno.test("FileStore gives up with unavailable naming the lock when it stays held", async () => {
  await using dir = await tempDir();
  const store = new FileStore(dir.path, { staleMs: 10_000, holdMs: 100, waitMs: 200 });
  await store.putBytes("k.json", encoder.encode("1"));
  const lock = `${dir.path}/.locks/${lockName("k.json")}`;
  await Deno.mkdir(lock);
  const error = await assertRejectsKind(
    store.putBytes("k.json", encoder.encode("2")),
    "unavailable",
  );
  assert.match(error.message, new RegExp(lock));
  assert.match(error.message, /"k\.json" in file:\/\//);
  await assertRejectsKind(store.delete("k.json"), "unavailable");
  assert.equal(decoder.decode((await store.getBytes("k.json"))?.bytes), "1");
  assert.deepEqual(await names(`${dir.path}/.tmp`), [], "the unused temporary file is removed");
});

Deno.test("FileStore rejects a root that is not an absolute path", () => {
  for (const root of ["relative/dir", "", "/", "/a/../b", "/a/./b"]) {
    assert.throws(() => new FileStore(root), TypeError, root);
  }
  const store = new FileStore("/mnt/backup/zfs-csi/");
  assert.equal(store.root, "/mnt/backup/zfs-csi");
  assert.equal(store.description, "file:///mnt/backup/zfs-csi");
});

Deno.test("FileStore.putWritten shows the object only once the writer is done, then as written", async () => {
  await using dir = await tempDir();
  const store = new FileStore(dir.path);
  const bytes = new Uint8Array(SMALL_OBJECT_BYTES + 5000).map((_, i) => i % 253);
  const put = await store.putWritten("v1/s/a.zfs", async (file) => {
    assert.ok(file.path.startsWith(`${dir.path}/.tmp/`), file.path);
    for (let at = 0; at < bytes.length;) {
      at += await new Promise<number>((resolve, reject) =>
        write(file.fd, bytes, at, bytes.length - at, null, (e, n) => e ? reject(e) : resolve(n))
      );
    }
    assert.deepEqual(await store.list("v1/"), [], "nothing visible while it is written");
    return "done";
  });
  assert.equal(put.value, "done");
  assert.equal(put.size, bytes.length);
  assert.deepEqual((await store.getBytes("v1/s/a.zfs"))?.bytes, bytes);
  const [listed] = await store.list("v1/");
  assert.equal(listed?.etag, put.etag, "the etag every reader computes");
  assert.deepEqual(await names(`${dir.path}/.tmp`), []);
  assert.equal((await Deno.stat(`${dir.path}/v1/s/a.zfs`)).mode! & 0o777, 0o600);

  // A small object is tagged by its content, as putBytes and list tag it.
  const small = await store.putWritten("v1/s/b.zfs", async (file) => {
    await Deno.writeFile(file.path, encoder.encode("tiny"));
  });
  assert.equal(small.etag, (await store.list("v1/s/b"))[0]?.etag);
  assert.equal(small.etag, (await store.putBytes("v1/s/c.zfs", encoder.encode("tiny"))).etag);
});

Deno.test("FileStore.putWritten keeps nothing when the writer fails or the write is aborted", async () => {
  await using dir = await tempDir();
  const store = new FileStore(dir.path);
  await assert.rejects(
    store.putWritten("v1/s/a.zfs", async (file) => {
      await Deno.writeFile(file.path, encoder.encode("half a stream"));
      throw new Error("zfs send failed");
    }),
    { message: "zfs send failed" },
  );
  const abort = new AbortController();
  await assert.rejects(
    store.putWritten("v1/s/a.zfs", async (file) => {
      await Deno.writeFile(file.path, encoder.encode("whole, but aborted"));
      abort.abort(new Error("stopped"));
    }, { signal: abort.signal }),
    { message: "stopped" },
  );
  assert.deepEqual(await store.list(""), []);
  assert.deepEqual(await names(`${dir.path}/.tmp`), []);
});

Deno.test("FileStore.openFile reads by position, keeps the descriptor at the start, and survives a replaced key", async () => {
  await using dir = await tempDir();
  const store = new FileStore(dir.path);
  const bytes = new Uint8Array(100_000).map((_, i) => (i * 7) % 251);
  await store.putBytes("v1/s/a.zfs", bytes);
  const file = await store.openFile("v1/s/a.zfs");
  try {
    // The key now names another file (a writer renames over it): the open one is unchanged.
    await store.putBytes("v1/s/a.zfs", encoder.encode("replaced"));
    const buf = new Uint8Array(60_000);
    assert.equal(await file.read(buf, 50_000), 50_000);
    assert.deepEqual(buf.subarray(0, 50_000), bytes.subarray(50_000));
    assert.equal(await file.read(buf, 100_000), 0, "0 at the end");
    // What a command given the descriptor reads: from its offset, still the start.
    const first = new Uint8Array(10);
    assert.equal(readSync(file.fd, first, 0, 10, null), 10);
    assert.deepEqual(first, bytes.subarray(0, 10));
  } finally {
    await file.close();
  }
  await assert.rejects(
    store.openFile("v1/s/missing.zfs"),
    (err) => err instanceof StoreError && err.kind === "not_found",
  );
  await assert.rejects(
    new FileStore(`${dir.path}/gone`).openFile("v1/s/a.zfs"),
    (err) => err instanceof StoreError && err.kind === "unavailable",
  );
});

Deno.test("FileStore.getBytes refuses an object over the cap, naming the key and the cap", async () => {
  await using dir = await tempDir();
  const store = new FileStore(dir.path);
  await Deno.mkdir(`${dir.path}/v1`);
  await Deno.writeFile(`${dir.path}/v1/big.json`, new Uint8Array(MAX_OBJECT_BYTES + 1));
  const err = await assertRejectsKind(() => store.getBytes("v1/big.json"), "invalid");
  assert.match(err.message, /"v1\/big\.json".* 1048576 bytes/);
  await Deno.writeFile(`${dir.path}/v1/big.json`, new Uint8Array(MAX_OBJECT_BYTES));
  assert.equal((await store.getBytes("v1/big.json"))?.bytes.length, MAX_OBJECT_BYTES);
});
