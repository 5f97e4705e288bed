import assert from "node:assert/strict";
import { type CallContext, runInCall } from "../call_context.ts";
import { type FakeRequest, FakeS3 } from "../../tests/support/fake_s3.ts";
import { Code, toGrpcStatus } from "../errors.ts";
import { FileStore } from "./file_store.ts";
import { S3Store } from "./s3_store.ts";
import type { Store } from "./store.ts";
import {
  BoundedStore,
  outsideStoreWait,
  StoreWait,
  StoreWaitError,
  withOwnStoreWait,
  withStoreWait,
} from "./wait.ts";

const encoder = new TextEncoder();

function fakeStore(fake: FakeS3, requestTimeoutMs = 60_000): S3Store {
  return new S3Store({
    endpoint: new URL("http://s3.test:9000"),
    region: "us-east-1",
    bucket: "b",
    prefix: "p",
    pathStyle: true,
    credentials: { accessKeyId: "AKID", secretAccessKey: "secret-key-value" },
    partSizeBytes: 1024,
    allowSmallParts: true,
    retry: { baseDelayMs: 1, maxDelayMs: 2 },
    requestTimeoutMs,
    fetch: fake.fetch,
  });
}

/** A call as the gRPC layer makes one. */
function call(operation = 'NodeStageVolume "v"'): CallContext {
  return { operation, signal: new AbortController().signal };
}

/** An answer that never comes: rejects once the request's signal aborts. */
function never(r: FakeRequest): Promise<Response> {
  return new Promise((_, reject) => {
    if (r.signal?.aborted) reject(r.signal.reason);
    r.signal?.addEventListener("abort", () => reject(r.signal?.reason));
  });
}

async function rejection(p: Promise<unknown>): Promise<unknown> {
  return await p.then(() => assert.fail("expected a rejection"), (e: unknown) => e);
}

Deno.test("BoundedStore gives up a request the store never answers once the call's budget is spent", async () => {
  const fake = new FakeS3("b");
  fake.intercept = never;
  const store = new BoundedStore(fakeStore(fake), { limitMs: 200 });
  const ctx = call();
  const err = await runInCall(ctx, () => rejection(store.getBytes("v1/volumes/v/owner.json")));
  assert.ok(err instanceof StoreWaitError, String(err));
  assert.equal(err.kind, "unavailable");
  assert.equal(err.waitedMs, 200, "the whole budget, as the message says");
  const status = toGrpcStatus(err);
  assert.equal(status.code, Code.UNAVAILABLE);
  assert.match(
    status.details,
    /^Reading "v1\/volumes\/v\/owner\.json" from s3:\/\/b\/p \(http:\/\/s3\.test:9000\) failed: .*waited 0\.2 s/,
  );
  // The S3 request itself was aborted (its socket closed), not left running, and not retried.
  assert.equal(fake.requests.length, 1);
  assert.equal(fake.requests[0]!.signal?.aborted, true);
  // Every later request of the same call fails at once, without reaching the store.
  const again = await runInCall(ctx, () => rejection(store.list("v1/")));
  assert.ok(again instanceof StoreWaitError);
  assert.match(again.message, /^Listing "v1\/" in .*waited 0\.2 s/);
  assert.equal(fake.requests.length, 1);
  // Another call has its own budget.
  fake.intercept = () => undefined;
  assert.deepEqual(await runInCall(call(), () => store.list("v1/")), []);
});

Deno.test("BoundedStore leaves work outside any call to the store's own time limits", async () => {
  const fake = new FakeS3("b");
  fake.intercept = never;
  const store = new BoundedStore(fakeStore(fake, 100), { limitMs: 60_000 });
  const err = await rejection(store.getBytes("k"));
  assert.ok(!(err instanceof StoreWaitError), String(err));
  assert.match(String(err), /did not answer in time/);
  // Code inside a call may opt out, or choose a budget of its own.
  const out = await runInCall(call(), () => outsideStoreWait(() => rejection(store.getBytes("k"))));
  assert.ok(!(out instanceof StoreWaitError), String(out));
  const own = new StoreWait(50);
  const chosen = await withStoreWait(own, () => rejection(store.getBytes("k")));
  assert.ok(chosen instanceof StoreWaitError, String(chosen));
  assert.ok(own.spent);
  // Clean-up after a call's budget is spent gets a budget of its own, as long as a call's.
  const bounded = new BoundedStore(fakeStore(fake), { limitMs: 80 });
  const ctx = call();
  await runInCall(ctx, () => rejection(bounded.getBytes("k")));
  assert.ok(runInCall(ctx, () => bounded.current())?.spent);
  const sent = fake.requests.length;
  const cleanup = await runInCall(
    ctx,
    () => withOwnStoreWait(() => rejection(bounded.delete("k"))),
  );
  assert.ok(cleanup instanceof StoreWaitError, String(cleanup));
  assert.equal(fake.requests.length, sent + 1, "the clean-up's request went out");
});

Deno.test("StoreWait takes only the time requests wait, once for requests side by side", async () => {
  let now = 0;
  const wait = new StoreWait(60_000, () => now);
  const step = (ms: number) => () => {
    now += ms;
    return Promise.resolve();
  };
  await wait.request("a", step(300));
  assert.equal(wait.waitedMs, 300);
  now += 1000; // no request waits: nothing taken
  assert.equal(wait.waitedMs, 300);
  // Two at once over the same 200 ms: taken once.
  let release = () => {};
  const held = new Promise<void>((r) => release = r);
  const both = Promise.all([wait.request("b", () => held), wait.request("c", () => held)]);
  now += 200;
  release();
  await both;
  assert.equal(wait.waitedMs, 500);
  // While a transfer runs, requests beside it (a lease renewed meanwhile) take nothing.
  const transfer = wait.transfer('Reading "s"');
  transfer.begin();
  await wait.request("d", step(400));
  transfer.end();
  assert.equal(wait.waitedMs, 500);
});

Deno.test("BoundedStore fails a download that stalls, without spending the call's budget", async () => {
  const fake = new FakeS3("b");
  let cancelled = false;
  fake.intercept = (r) =>
    r.operation === "GetObject"
      ? new Response(
        new ReadableStream<Uint8Array>({
          start(c) {
            c.enqueue(new Uint8Array(10));
          },
          cancel() {
            cancelled = true;
          },
        }),
      )
      : undefined;
  const store = new BoundedStore(fakeStore(fake), { limitMs: 150 });
  const ctx = call();
  await runInCall(ctx, async () => {
    const stream = await store.getStream("v1/volumes/v/streams/s.zfs");
    const reader = stream.getReader();
    assert.equal((await reader.read()).value?.length, 10);
    const err = await rejection(reader.read());
    assert.ok(err instanceof StoreWaitError, String(err));
    assert.match(
      err.message,
      /^Reading "v1\/volumes\/v\/streams\/s\.zfs" .*stalled; it waited 0\.1 s/,
    );
    assert.ok(cancelled, "the store's stream was cancelled (its connection closed)");
    // The budget was not taken by the transfer: a request of the call still goes out.
    assert.deepEqual(await store.list("v1/"), []);
  });
});

Deno.test("BoundedStore counts an upload's wait for its source as the source's, not the store's", async () => {
  const fake = new FakeS3("b");
  const store = new BoundedStore(fakeStore(fake), { limitMs: 100 });
  // A byte stream (as a command's stdout is) that takes longer than the limit per chunk;
  // byte i is i / 700 + 1.
  const total = 3500;
  let produced = 0;
  const source: UnderlyingByteSource = {
    type: "bytes",
    async pull(c: ReadableByteStreamController) {
      if (produced === total) {
        c.close();
        return c.byobRequest?.respond(0);
      }
      await new Promise((r) => setTimeout(r, 150));
      const view = c.byobRequest?.view;
      const n = Math.min(700, total - produced, view?.byteLength ?? 700);
      const chunk = Uint8Array.from({ length: n }, (_, i) => Math.floor((produced + i) / 700) + 1);
      if (view) {
        new Uint8Array(view.buffer, view.byteOffset, view.byteLength).set(chunk);
        c.byobRequest!.respond(n);
      } else c.enqueue(chunk);
      produced += n;
    },
  };
  const body = new ReadableStream(source);
  const put = await runInCall(call(), () => store.putStream("v1/s.zfs", body));
  assert.equal(put.size, 3500);
  const stored = fake.objects.get("p/v1/s.zfs")!.bytes;
  assert.deepEqual([...new Set(stored)], [1, 2, 3, 4, 5]);
  assert.equal(stored.length, 3500);
});

Deno.test("BoundedStore fails an upload the store stops taking", async () => {
  const fake = new FakeS3("b");
  let aborted = () => {};
  const uploadAborted = new Promise<void>((r) => aborted = r);
  fake.intercept = (r) => {
    if (r.operation === "AbortMultipartUpload") aborted();
    return r.operation === "UploadPart" ? never(r) : undefined;
  };
  const store = new BoundedStore(fakeStore(fake), { limitMs: 150 });
  const body = ReadableStream.from([new Uint8Array(5000)]);
  const err = await runInCall(call(), () => rejection(store.putStream("v1/s.zfs", body)));
  assert.ok(err instanceof StoreWaitError, String(err));
  assert.match(err.message, /^Writing "v1\/s\.zfs" to .*stalled/);
  // The answer does not wait for the clean-up, which goes on: the upload is aborted.
  await uploadAborted;
  assert.equal(fake.objects.size, 0);
});

Deno.test("BoundedStore stops a directory store's wait for a lock held elsewhere", async () => {
  const dir = await Deno.makeTempDir({ dir: "/tmp", prefix: "zfs-csi-wait-" });
  try {
    const inner = new FileStore(dir, { waitMs: 60_000, staleMs: 60_000 });
    const store: Store = new BoundedStore(inner, { limitMs: 200 });
    const put = await inner.putBytes("v1/owner.json", encoder.encode("1"));
    // Another writer holds the key's lock (as file_store_test.ts makes one).
    const { createHash } = await import("node:crypto");
    const lock = createHash("sha256").update("v1/owner.json").digest("hex").slice(0, 32);
    await Deno.mkdir(`${dir}/.locks/${lock}`, { recursive: true });
    const err = await runInCall(
      call(),
      () => rejection(store.putBytes("v1/owner.json", encoder.encode("2"), { ifMatch: put.etag })),
    );
    assert.ok(err instanceof StoreWaitError, String(err));
    assert.match(err.message, /^Writing "v1\/owner\.json" to file:\/\/.*waited 0\.2 s/);
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
});

Deno.test("BoundedStore takes a download's wait for its answer from the call's budget", async () => {
  const fake = new FakeS3("b");
  fake.intercept = (r) => r.operation === "GetObject" ? never(r) : undefined;
  const store = new BoundedStore(fakeStore(fake), { limitMs: 150 });
  const ctx = call();
  const err = await runInCall(ctx, () => rejection(store.getStream("v1/s.zfs")));
  assert.ok(err instanceof StoreWaitError, String(err));
  assert.match(err.message, /^Reading "v1\/s\.zfs" from .*this call waited 0\.1 s for the store/);
  assert.ok(runInCall(ctx, () => store.current())?.spent, "the call's budget is spent");
  assert.equal(fake.requests[0]!.signal?.aborted, true);
});
