/**
 * The checks every {@linkcode Store} backend must pass, run as test steps against any of them:
 * the file store's unit test and the S3 store's integration test (against a real server) call
 * {@linkcode storeContract} with a factory of their backend.
 *
 * Each step calls `makeStore()` once and works under its own random key prefix, so the factory
 * may hand out fresh empty stores or views of one shared store (a bucket); each step deletes
 * what it wrote, also when it fails.
 */

import assert from "node:assert/strict";
import { createHash } from "node:crypto";
import {
  MAX_OBJECT_BYTES,
  type Store,
  type StoredObject,
  StoreError,
  type StoreErrorKind,
} from "../../src/store/store.ts";
import { clockProbeKey, readStoreClock } from "../../src/store/store_clock.ts";
import { joinChunks } from "./fake_stream_runner.ts";

const MiB = 1024 * 1024;
/** Longer than one S3 part (8 MiB) and not a multiple of any chunk size. */
const BIG_STREAM_BYTES = 9 * MiB + 12_345;
/** A step that takes longer than this hangs (an abort that is never noticed, say). */
const STEP_TIMEOUT_MS = 30_000;
const WRITERS = 8;
/**
 * How far an object's listed time may be from the test's clock when written: the store runs
 * on this machine, so on the same clock, but S3 gives whole seconds and a file system's clock
 * ticks coarsely. A time in seconds read as ms, or in another zone, is far outside.
 */
const CLOCK_WINDOW_MS = 10_000;

const encoder = new TextEncoder();
const decoder = new TextDecoder();

/**
 * Runs the shared store checks as steps of `t`.
 * @param makeStore called once per step; see the module doc
 */
export async function storeContract(
  t: Deno.TestContext,
  makeStore: () => Promise<Store>,
): Promise<void> {
  for (const [name, check] of CHECKS) {
    await t.step(name, async () => {
      const store = await makeStore();
      const base = `contract-${crypto.randomUUID()}/`;
      try {
        await withTimeout(check(store, base), `${name} (${store.description})`);
      } finally {
        await removeAll(store, base);
      }
    });
  }
}

type Check = (store: Store, base: string) => Promise<void>;

const CHECKS: ReadonlyArray<readonly [string, Check]> = [
  ["putStream then getStream and getBytes give the same bytes", streamRoundTrip],
  ["putBytes then getBytes give the same bytes, and etags agree", bytesRoundTrip],
  ["an empty object round-trips", emptyObject],
  ["a multi-MiB stream round-trips (SHA-256)", bigStream],
  ["putStream whose body errors midway leaves nothing", bodyErrorLeavesNothing],
  ["putStream aborted by its signal leaves nothing", abortLeavesNothing],
  ["an unfinished putStream is not listed", unfinishedNotListed],
  ["getStream stops when its signal aborts", getStreamAbort],
  ["ifNoneMatch: exactly one of concurrent writers wins", ifNoneMatchOneWinner],
  ["ifMatch: a stale etag is refused, the current one accepted", ifMatchChecks],
  ["ifMatch: exactly one of concurrent writers wins", ifMatchOneWinner],
  ["etag changes when the content changes", etagChanges],
  ["a missing key: getBytes undefined, getStream not_found", missingKey],
  ["getBytes refuses an object over MAX_OBJECT_BYTES, naming the key", tooLargeForBytes],
  ["list filters by prefix and sorts by key", listPrefixAndOrder],
  ["list gives each object's time on the store's clock, as the clock probe reads it", listTimes],
  ["delete removes and is idempotent", deleteIdempotent],
  ["invalid keys and prefixes are refused as invalid", invalidKeys],
];

async function streamRoundTrip(store: Store, base: string): Promise<void> {
  const key = `${base}streams/0011223344556677-abcdef01.zfs`;
  const parts = ["first chunk,", " second,", "", " and the last"].map((s) => encoder.encode(s));
  const put = await store.putStream(key, streamOf(parts));
  const expected = joinChunks(parts);
  assert.equal(put.size, expected.length);
  assert.deepEqual(await readAll(await store.getStream(key)), expected);
  const got = await store.getBytes(key);
  assert.ok(got !== undefined, "getBytes finds the streamed object");
  assert.deepEqual(got.bytes, expected);
  assert.equal(got.etag, put.etag, "getBytes gives the etag putStream returned");
  const listed = await listUntimed(store, base);
  assert.deepEqual(listed, [{ key, size: expected.length, etag: put.etag }]);
}

async function bytesRoundTrip(store: Store, base: string): Promise<void> {
  const key = `${base}snapshots/0011223344556677.json`;
  const bytes = encoder.encode(JSON.stringify({ format: 1, guid: "4822678189205111" }, null, 2));
  const put = await store.putBytes(key, bytes);
  assert.equal(put.size, bytes.length);
  const got = await store.getBytes(key);
  assert.ok(got !== undefined);
  assert.deepEqual(got.bytes, bytes);
  assert.equal(got.etag, put.etag);
  assert.equal((await store.getBytes(key))?.etag, put.etag, "the etag is stable across reads");
  assert.deepEqual(await readAll(await store.getStream(key)), bytes);
  assert.deepEqual(await listUntimed(store, base), [{ key, size: bytes.length, etag: put.etag }]);
}

async function emptyObject(store: Store, base: string): Promise<void> {
  const streamed = `${base}empty-stream`;
  const put = await store.putStream(streamed, streamOf([]));
  assert.equal(put.size, 0);
  assert.deepEqual(await readAll(await store.getStream(streamed)), new Uint8Array(0));
  const written = `${base}empty-bytes`;
  const putBytes = await store.putBytes(written, new Uint8Array(0), { ifNoneMatch: "*" });
  assert.equal(putBytes.size, 0);
  const got = await store.getBytes(written);
  assert.ok(got !== undefined, "an empty object exists");
  assert.equal(got.bytes.length, 0);
  assert.deepEqual(
    (await store.list(base)).map((o) => [o.key, o.size]),
    [[written, 0], [streamed, 0]],
  );
}

async function bigStream(store: Store, base: string): Promise<void> {
  const key = `${base}big.zfs`;
  const sent = createHash("sha256");
  const put = await store.putStream(key, generated(BIG_STREAM_BYTES, 0x5eed, sent));
  assert.equal(put.size, BIG_STREAM_BYTES);
  const received = createHash("sha256");
  let size = 0;
  for await (const chunk of await store.getStream(key)) {
    received.update(chunk);
    size += chunk.length;
  }
  assert.equal(size, BIG_STREAM_BYTES);
  assert.equal(received.digest("hex"), sent.digest("hex"));
  assert.deepEqual(await listUntimed(store, base), [
    { key, size: BIG_STREAM_BYTES, etag: put.etag },
  ]);
}

async function bodyErrorLeavesNothing(store: Store, base: string): Promise<void> {
  const fresh = `${base}fresh.zfs`;
  await assert.rejects(store.putStream(fresh, failingAfter(3 * MiB)), "a failing body rejects");
  assert.equal(await store.getBytes(fresh), undefined, "nothing at the key");
  await assertRejectsKind(store.getStream(fresh), "not_found");
  assert.deepEqual(await store.list(base), [], "nothing listed");

  const kept = `${base}kept.zfs`;
  const earlier = encoder.encode("earlier content");
  await store.putBytes(kept, earlier);
  await assert.rejects(store.putStream(kept, failingAfter(MiB)));
  assert.deepEqual((await store.getBytes(kept))?.bytes, earlier, "the earlier object stays");
  assert.deepEqual((await store.list(base)).map((o) => o.key), [kept]);
}

async function abortLeavesNothing(store: Store, base: string): Promise<void> {
  const key = `${base}aborted.zfs`;
  const controller = new AbortController();
  const body = stalling(4, () => controller.abort(new Error("stop the upload")));
  await assert.rejects(store.putStream(key, body.stream, { signal: controller.signal }));
  assert.ok(body.pulled() >= 4, "the body was read before the abort");
  assert.equal(await store.getBytes(key), undefined, "nothing at the key");
  assert.deepEqual(await store.list(base), []);

  const early = AbortSignal.abort(new Error("aborted before the start"));
  await assert.rejects(store.putStream(key, streamOf([encoder.encode("x")]), { signal: early }));
  assert.equal(await store.getBytes(key), undefined, "an aborted signal writes nothing");
  assert.deepEqual(await store.list(base), []);
}

async function unfinishedNotListed(store: Store, base: string): Promise<void> {
  const key = `${base}slow.zfs`;
  let release = () => {};
  const released = new Promise<void>((resolve) => release = resolve);
  let sent = 0;
  let firstPulled = () => {};
  const started = new Promise<void>((resolve) => firstPulled = resolve);
  const body = new ReadableStream<Uint8Array>({
    async pull(c) {
      if (sent === 1) {
        firstPulled();
        await released;
      }
      if (sent === 2) return c.close();
      sent++;
      c.enqueue(new Uint8Array(64 * 1024).fill(sent));
    },
  }, { highWaterMark: 0 });
  const put = store.putStream(key, body);
  await started;
  assert.deepEqual(await store.list(base), [], "not listed while the body is being read");
  assert.equal(await store.getBytes(key), undefined, "not readable while the body is being read");
  release();
  assert.equal((await put).size, 2 * 64 * 1024);
  assert.deepEqual((await store.list(base)).map((o) => o.key), [key]);
}

async function getStreamAbort(store: Store, base: string): Promise<void> {
  const key = `${base}download.zfs`;
  await store.putStream(key, generated(4 * MiB, 7));
  const controller = new AbortController();
  const reader = (await store.getStream(key, { signal: controller.signal })).getReader();
  const first = await reader.read();
  assert.equal(first.done, false);
  controller.abort(new Error("stop the download"));
  await assert.rejects(
    (async () => {
      for (;;) if ((await reader.read()).done) return;
    })(),
    "reading on after the abort fails instead of ending as if complete",
  );
  reader.releaseLock();
}

async function ifNoneMatchOneWinner(store: Store, base: string): Promise<void> {
  const key = `${base}snapshots/race.json`;
  const contents = Array.from({ length: WRITERS }, (_, i) => encoder.encode(`writer ${i}\n`));
  const results = await Promise.allSettled(
    contents.map((bytes) => store.putBytes(key, bytes, { ifNoneMatch: "*" })),
  );
  const winner = await oneWinner(results);
  const got = await store.getBytes(key);
  assert.ok(got !== undefined);
  assert.deepEqual(got.bytes, contents[winner.index], "the winner's bytes are stored");
  assert.equal(got.etag, winner.etag);
  await assertRejectsKind(
    store.putBytes(key, encoder.encode("late"), { ifNoneMatch: "*" }),
    "precondition_failed",
  );
  assert.deepEqual((await store.getBytes(key))?.bytes, contents[winner.index]);
}

async function ifMatchChecks(store: Store, base: string): Promise<void> {
  const key = `${base}volume.json`;
  const first = await store.putBytes(key, encoder.encode("generation 1"));
  const second = await store.putBytes(key, encoder.encode("generation 2"));
  await assertRejectsKind(
    store.putBytes(key, encoder.encode("from a stale read"), { ifMatch: first.etag }),
    "precondition_failed",
  );
  assert.equal(decoder.decode((await store.getBytes(key))?.bytes), "generation 2");
  const third = await store.putBytes(key, encoder.encode("generation 3"), { ifMatch: second.etag });
  const got = await store.getBytes(key);
  assert.equal(decoder.decode(got?.bytes), "generation 3");
  assert.equal(got?.etag, third.etag);
  await assertRejectsKind(
    store.putBytes(`${base}absent.json`, encoder.encode("x"), { ifMatch: third.etag }),
    "precondition_failed",
  );
  assert.equal(await store.getBytes(`${base}absent.json`), undefined, "ifMatch never creates");
}

async function ifMatchOneWinner(store: Store, base: string): Promise<void> {
  const key = `${base}lease.json`;
  const start = await store.putBytes(key, encoder.encode("holder none"), { ifNoneMatch: "*" });
  const contents = Array.from({ length: WRITERS }, (_, i) => encoder.encode(`holder ${i}`));
  const results = await Promise.allSettled(
    contents.map((bytes) => store.putBytes(key, bytes, { ifMatch: start.etag })),
  );
  const winner = await oneWinner(results);
  const got = await store.getBytes(key);
  assert.deepEqual(got?.bytes, contents[winner.index], "the winner's bytes are stored");
  assert.equal(got?.etag, winner.etag);
}

async function etagChanges(store: Store, base: string): Promise<void> {
  const key = `${base}changing.json`;
  const a = await store.putBytes(key, encoder.encode("content A"));
  const b = await store.putBytes(key, encoder.encode("content B"));
  assert.notEqual(a.etag, b.etag, "putBytes with other content");
  const c = await store.putStream(key, streamOf([encoder.encode("content C")]));
  assert.notEqual(c.etag, b.etag, "putStream replacing, same size");
  const big = `${base}big-changing.zfs`;
  const d = await store.putStream(big, generated(2 * MiB, 1));
  const e = await store.putStream(big, generated(2 * MiB, 2));
  assert.notEqual(d.etag, e.etag, "a large stream replaced by another of the same size");
  // Listed, not read whole: getBytes refuses objects over MAX_OBJECT_BYTES.
  assert.equal((await store.list(big)).find((o) => o.key === big)?.etag, e.etag);
}

async function tooLargeForBytes(store: Store, base: string): Promise<void> {
  const key = `${base}streams/big-for-bytes.zfs`;
  await store.putStream(key, generated(MAX_OBJECT_BYTES + 1, 3));
  const err = await assertRejectsKind(() => store.getBytes(key), "invalid");
  assert.ok(err.message.includes(`"${key}"`), err.message);
  assert.ok(err.message.includes(`${MAX_OBJECT_BYTES} bytes`), err.message);
  assert.equal((await readAll(await store.getStream(key))).length, MAX_OBJECT_BYTES + 1);
}

async function missingKey(store: Store, base: string): Promise<void> {
  assert.equal(await store.getBytes(`${base}missing.json`), undefined);
  await assertRejectsKind(store.getStream(`${base}missing.zfs`), "not_found");
  await assertRejectsKind(store.getStream(`${base}no/such/dir.zfs`), "not_found");
  assert.deepEqual(await store.list(`${base}missing`), []);
}

async function listPrefixAndOrder(store: Store, base: string): Promise<void> {
  const keys = ["a/b", "a/bc", "a/b2/x", "a/c/d:e.json", "a-", "z", "a/c/d_f"];
  for (const [i, k] of keys.entries()) {
    await store.putBytes(`${base}${k}`, encoder.encode("x".repeat(i)));
  }
  const listed = async (prefix: string) =>
    (await store.list(`${base}${prefix}`)).map((o) => o.key.slice(base.length));
  const sorted = (ks: string[]) => [...ks].sort((x, y) => x < y ? -1 : x > y ? 1 : 0);
  assert.deepEqual(await listed(""), sorted(keys));
  assert.deepEqual(await listed("a/b"), ["a/b", "a/b2/x", "a/bc"]);
  assert.deepEqual(await listed("a/bc"), ["a/bc"]);
  assert.deepEqual(await listed("a/b/"), []);
  assert.deepEqual(await listed("a/"), ["a/b", "a/b2/x", "a/bc", "a/c/d:e.json", "a/c/d_f"]);
  assert.deepEqual(await listed("a"), sorted(keys.filter((k) => k.startsWith("a"))));
  assert.deepEqual(await listed("a/c/d"), ["a/c/d:e.json", "a/c/d_f"]);
  assert.deepEqual(await listed("nothing"), []);
  const sizes = await store.list(base);
  for (const o of sizes) assert.equal(o.size, keys.indexOf(o.key.slice(base.length)), o.key);
}

async function listTimes(store: Store, base: string): Promise<void> {
  const timeOf = (o: StoredObject | undefined): number => {
    assert.ok(o?.lastModifiedMs !== undefined, `"${o?.key}" is listed without a time`);
    return o.lastModifiedMs;
  };
  const near = (ms: number, from: number, to: number, what: string) =>
    assert.ok(
      ms >= from - CLOCK_WINDOW_MS && ms <= to + CLOCK_WINDOW_MS,
      `${what}: ${new Date(ms).toISOString()} is not between ${new Date(from).toISOString()} ` +
        `and ${new Date(to).toISOString()} (the test's clock, give or take ${CLOCK_WINDOW_MS} ms)`,
    );
  const before = Date.now();
  await store.putBytes(`${base}v/volume.json`, encoder.encode("{}"));
  await store.putStream(`${base}v/streams/s.zfs`, streamOf([encoder.encode("stream")]));
  const listed = await store.list(base);
  const after = Date.now();
  assert.equal(listed.length, 2);
  for (const o of listed) near(timeOf(o), before, after, o.key);
  // The clock probe: on the same clock, never before what was written before it, and gone.
  const node = `contract-${crypto.randomUUID()}`;
  const now = await readStoreClock(store, node);
  assert.ok(now !== undefined, "the clock probe read no time");
  near(now, before, Date.now(), "the store's clock");
  assert.ok(now >= Math.max(...listed.map(timeOf)), "the probe is older than what came before");
  assert.deepEqual(await store.list(clockProbeKey(node)), []);
  // A rewrite is stamped again, never earlier.
  await store.putBytes(`${base}v/volume.json`, encoder.encode("{ }"));
  const [again] = await store.list(`${base}v/volume.json`);
  assert.ok(timeOf(again) >= timeOf(listed.find((o) => o.key === again?.key)));
}

async function deleteIdempotent(store: Store, base: string): Promise<void> {
  const key = `${base}v/snapshots/gone.json`;
  const other = `${base}v/volume.json`;
  await store.putBytes(key, encoder.encode("x"));
  await store.putBytes(other, encoder.encode("y"));
  await store.delete(key);
  assert.equal(await store.getBytes(key), undefined);
  assert.deepEqual((await store.list(base)).map((o) => o.key), [other]);
  await store.delete(key);
  await store.delete(`${base}never/was.json`);
  await store.putBytes(key, encoder.encode("again"), { ifNoneMatch: "*" });
  assert.equal(decoder.decode((await store.getBytes(key))?.bytes), "again", "re-creatable");
}

/** Keys every backend must refuse (see checkKey). */
export const INVALID_KEYS: readonly string[] = [
  "",
  "../x",
  "a/../../x",
  "a//b",
  "/a",
  "a/",
  ".",
  "a/./b",
  "a b",
  "a\\b",
  "x".repeat(513),
];

async function invalidKeys(store: Store, _base: string): Promise<void> {
  const bytes = encoder.encode("x");
  for (const key of INVALID_KEYS) {
    const label = JSON.stringify(key.slice(0, 20));
    const calls: Array<() => Promise<unknown>> = [
      () => store.putStream(key, streamOf([bytes])),
      () => store.putBytes(key, bytes),
      () => store.putBytes(key, bytes, { ifNoneMatch: "*" }),
      () => store.putBytes(key, bytes, { ifMatch: "e" }),
      () => store.getStream(key),
      () => store.getBytes(key),
      () => store.delete(key),
    ];
    for (const [i, call] of calls.entries()) {
      await assertRejectsKind(call, "invalid", `${label}, call ${i}`);
    }
  }
  for (const prefix of ["../", "a//", "/", "a b"]) {
    await assertRejectsKind(() => store.list(prefix), "invalid", JSON.stringify(prefix));
  }
}

// --- helpers ---

/**
 * Asserts that `call` rejects with a StoreError of `kind`. Given a function, also asserts that it
 * returns a rejected promise rather than throwing (a Store method always returns a promise).
 */
export async function assertRejectsKind(
  call: Promise<unknown> | (() => Promise<unknown>),
  kind: StoreErrorKind,
  label?: string,
): Promise<StoreError> {
  const where = label === undefined ? "" : ` (${label})`;
  let p: Promise<unknown>;
  if (typeof call === "function") {
    try {
      p = call();
    } catch (err) {
      assert.fail(`expected a rejected promise${where}, the call threw synchronously: ${err}`);
    }
  } else {
    p = call;
  }
  let error: unknown;
  try {
    await p;
  } catch (err) {
    error = err;
  }
  assert.ok(error !== undefined, `expected a StoreError "${kind}"${where}, nothing was thrown`);
  assert.ok(error instanceof StoreError, `expected a StoreError${where}, got ${error}`);
  assert.equal(error.kind, kind, `${error.message}${where}`);
  return error;
}

/** The one fulfilled result among `results`; every other one is precondition_failed. */
async function oneWinner(
  results: PromiseSettledResult<{ etag: string }>[],
): Promise<{ index: number; etag: string }> {
  const won = results.flatMap((r, index) =>
    r.status === "fulfilled" ? [{ index, etag: r.value.etag }] : []
  );
  assert.equal(won.length, 1, `exactly one writer wins, ${won.length} did`);
  for (const r of results) {
    if (r.status === "rejected") {
      await assertRejectsKind(Promise.reject(r.reason), "precondition_failed");
    }
  }
  return won[0]!;
}

/** A listing without its times (listTimes looks at those). */
async function listUntimed(store: Store, prefix: string): Promise<StoredObject[]> {
  return (await store.list(prefix)).map(({ lastModifiedMs: _, ...o }) => o);
}

function streamOf(chunks: readonly Uint8Array[]): ReadableStream<Uint8Array> {
  return ReadableStream.from(chunks.map((c) => c.slice()));
}

async function readAll(stream: ReadableStream<Uint8Array>): Promise<Uint8Array> {
  const chunks: Uint8Array[] = [];
  for await (const c of stream) chunks.push(c);
  return joinChunks(chunks);
}

/** `size` pseudo-random bytes from `seed`, in chunks of uneven sizes, hashed into `hash`. */
function generated(
  size: number,
  seed: number,
  hash?: ReturnType<typeof createHash>,
): ReadableStream<Uint8Array> {
  let state = seed >>> 0 || 1;
  let left = size;
  let n = 0;
  return new ReadableStream<Uint8Array>({
    pull(c) {
      if (left === 0) return c.close();
      const length = Math.min(left, [65_536, 1_000, 131_073][n++ % 3]!);
      const words = new Uint32Array(Math.ceil(length / 4));
      for (let i = 0; i < words.length; i++) {
        state ^= state << 13;
        state ^= state >>> 17;
        state ^= state << 5;
        words[i] = state >>> 0;
      }
      const chunk = new Uint8Array(words.buffer, 0, length);
      hash?.update(chunk);
      left -= length;
      c.enqueue(chunk);
    },
  }, { highWaterMark: 0 });
}

/** A body that gives `bytes` and then errors. */
function failingAfter(bytes: number): ReadableStream<Uint8Array> {
  let sent = 0;
  return new ReadableStream<Uint8Array>({
    pull(c) {
      if (sent >= bytes) return c.error(new Error("the sender died midway"));
      const chunk = new Uint8Array(Math.min(256 * 1024, bytes - sent)).fill(0xab);
      sent += chunk.length;
      c.enqueue(chunk);
    },
  }, { highWaterMark: 0 });
}

/** A body that gives `chunks` chunks, calls `onStall` and then never gives another. */
function stalling(
  chunks: number,
  onStall: () => void,
): { stream: ReadableStream<Uint8Array>; pulled: () => number } {
  let pulled = 0;
  const stream = new ReadableStream<Uint8Array>({
    pull(c) {
      if (pulled++ < chunks) return c.enqueue(new Uint8Array(64 * 1024).fill(pulled));
      onStall();
      return new Promise<void>(() => {});
    },
  }, { highWaterMark: 0 });
  return { stream, pulled: () => pulled };
}

async function withTimeout(p: Promise<void>, label: string): Promise<void> {
  let timer: ReturnType<typeof setTimeout> | undefined;
  const timeout = new Promise<never>((_, reject) => {
    timer = setTimeout(
      () => reject(new Error(`${label}: no answer after ${STEP_TIMEOUT_MS} ms`)),
      STEP_TIMEOUT_MS,
    );
  });
  try {
    await Promise.race([p, timeout]);
  } finally {
    clearTimeout(timer);
  }
}

/** Deletes every object under `base` (best effort: cleanup must not hide the step's failure). */
async function removeAll(store: Store, base: string): Promise<void> {
  try {
    for (const o of await store.list(base)) await store.delete(o.key);
  } catch {
    // The step's own result is what matters.
  }
}
