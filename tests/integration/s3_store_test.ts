/**
 * The S3 store against a real S3 server (versitygw, tests/support/s3_server.ts): the shared
 * store contract, multipart uploads, conditional writes, and failures injected by a proxy in
 * front of the server (tests/support/fault_proxy.ts).
 */

import assert from "node:assert/strict";
import { createHash } from "node:crypto";
import { codeName, toGrpcStatus } from "../../src/errors.ts";
import { S3Store, type S3StoreOptions } from "../../src/store/s3_store.ts";
import { BoundedStore } from "../../src/store/wait.ts";
import { runInCall } from "../../src/call_context.ts";
import { childrenNamed, childText, parseXml } from "../../src/store/s3_xml.ts";
import { FaultProxy } from "../support/fault_proxy.ts";
import { S3Server, signedFetch } from "../support/s3_server.ts";
import { assertRejectsKind, storeContract } from "../support/store_contract.ts";
import { checkDeletedRetentionOnStoreClock } from "../support/deleted_retention.ts";

const MiB = 1024 * 1024;
const encoder = new TextEncoder();

/** A store on the server's bucket (or through `endpoint`, a proxy), with fast retries. */
function storeOn(
  server: S3Server,
  options: Partial<S3StoreOptions> = {},
): S3Store {
  return new S3Store({
    endpoint: server.endpoint,
    region: server.region,
    bucket: server.bucket,
    prefix: "backups/zfs-csi",
    pathStyle: true,
    credentials: { accessKeyId: server.accessKeyId, secretAccessKey: server.secretAccessKey },
    retry: { baseDelayMs: 20, maxDelayMs: 100 },
    ...options,
  });
}

/** `size` pseudo-random bytes in uneven chunks, hashed into `hash` as they are read. */
function generated(size: number, hash: ReturnType<typeof createHash>): ReadableStream<Uint8Array> {
  let left = size;
  let n = 0;
  let state = 0x9e3779b9;
  return new ReadableStream<Uint8Array>({
    pull(c) {
      if (left === 0) return c.close();
      const chunk = new Uint8Array(Math.min(left, [65_536, 4_093, 300_007][n++ % 3]!));
      for (let i = 0; i < chunk.length; i++) {
        state = (state * 1103515245 + 12345) >>> 0;
        chunk[i] = state >>> 24;
      }
      hash.update(chunk);
      left -= chunk.length;
      c.enqueue(chunk);
    },
  }, { highWaterMark: 0 });
}

/** The server's unfinished multipart uploads (ListMultipartUploads), as keys. */
async function pendingUploads(server: S3Server): Promise<string[]> {
  const url = new URL(`/${server.bucket}?uploads`, server.endpoint);
  const r = await signedFetch(server, "GET", url);
  const xml = await r.text();
  assert.equal(r.status, 200, xml);
  return childrenNamed(parseXml(xml), "Upload").map((u) => childText(u, "Key") ?? "");
}

Deno.test("S3Store passes the store contract against versitygw", async (t) => {
  await using server = await S3Server.start();
  await storeContract(t, () => Promise.resolve(storeOn(server)));
  assert.deepEqual(await pendingUploads(server), [], "no multipart upload left behind");
});

Deno.test("S3Store: the store pruner ages a deleted volume by the server's LastModified, not by nodes' clocks", async () => {
  await using server = await S3Server.start();
  await checkDeletedRetentionOnStoreClock(
    storeOn(server, { prefix: `retention-${crypto.randomUUID()}` }),
  );
});

/** A body of `size` bytes that calls `onStall` once `stallAt` bytes are out, then waits forever. */
function stallingAt(
  size: number,
  stallAt: number,
  onStall: () => void,
): ReadableStream<Uint8Array> {
  let sent = 0;
  return new ReadableStream<Uint8Array>({
    pull(c) {
      if (sent >= size) return c.close();
      if (sent >= stallAt) {
        onStall();
        return new Promise<void>(() => {});
      }
      const chunk = new Uint8Array(Math.min(256 * 1024, size - sent)).fill(sent & 0xff);
      sent += chunk.length;
      c.enqueue(chunk);
    },
  }, { highWaterMark: 0 });
}

function isPart(r: Request): boolean {
  return r.method === "PUT" && new URL(r.url).searchParams.has("partNumber");
}

function isComplete(r: Request): boolean {
  return r.method === "POST" && new URL(r.url).searchParams.has("uploadId");
}

Deno.test("S3Store writes a 40 MiB stream as a multipart upload with the right bytes", async () => {
  await using server = await S3Server.start();
  await using proxy = new FaultProxy(server.endpoint);
  const store = storeOn(server, { endpoint: proxy.endpoint, partSizeBytes: 5 * MiB });
  const size = 40 * MiB + 123;
  const sent = createHash("sha256");
  const key = "v1/volumes/big/streams/00000000000000aa-0123abcd.zfs";
  const put = await store.putStream(key, generated(size, sent));
  assert.equal(put.size, size);
  assert.equal(proxy.seen.filter((s) => /[?&]partNumber=/.test(s.target)).length, 9, "9 parts");
  assert.match(put.etag, /-9$/, "a multipart etag");
  const received = createHash("sha256");
  let got = 0;
  for await (const chunk of await store.getStream(key)) {
    received.update(chunk);
    got += chunk.length;
  }
  assert.equal(got, size);
  assert.equal(received.digest("hex"), sent.digest("hex"));
  const listed = (await store.list("v1/")).map(({ lastModifiedMs: _, ...o }) => o);
  assert.deepEqual(listed, [{ key, size, etag: put.etag }]);
  // On disk, under the prefix: what an operator would find in the bucket.
  const stat = await Deno.stat(`${server.dir}/${server.bucket}/backups/zfs-csi/${key}`);
  assert.equal(stat.size, size);
  assert.deepEqual(await pendingUploads(server), []);
});

Deno.test("S3Store: an aborted or failed multipart putStream leaves no object and no upload", async () => {
  await using server = await S3Server.start();
  const store = storeOn(server, { partSizeBytes: 5 * MiB });
  const key = "v1/volumes/a/streams/00000000000000aa-0123abcd.zfs";

  const controller = new AbortController();
  const body = stallingAt(30 * MiB, 12 * MiB, () => controller.abort(new Error("stop")));
  await assert.rejects(store.putStream(key, body, { signal: controller.signal }), /stop/);
  assert.equal(await store.getBytes(key), undefined);
  assert.deepEqual(await pendingUploads(server), [], "the multipart upload was aborted");

  let sent = 0;
  const failing = new ReadableStream<Uint8Array>({
    pull(c) {
      if (sent >= 11 * MiB) return c.error(new Error("zfs send died"));
      sent += MiB;
      c.enqueue(new Uint8Array(MiB));
    },
  });
  await assert.rejects(store.putStream(key, failing), /zfs send died/);
  assert.equal(await store.getBytes(key), undefined);
  assert.deepEqual(await pendingUploads(server), []);
  assert.deepEqual(await store.list(""), []);
});

Deno.test("S3Store: a full store (507) fails a part upload with no_space and aborts", async () => {
  await using server = await S3Server.start();
  await using proxy = new FaultProxy(server.endpoint);
  const store = storeOn(server, { endpoint: proxy.endpoint, partSizeBytes: 5 * MiB });
  proxy.set({ kind: "error", status: 507, code: "InsufficientStorage", count: 1 }, isPart);
  const key = "v1/volumes/a/streams/00000000000000aa-0123abcd.zfs";
  const error = await assertRejectsKind(
    store.putStream(key, generated(12 * MiB, createHash("sha256"))),
    "no_space",
  );
  assert.match(error.message, /answered 507 InsufficientStorage/);
  assert.match(error.message, /Writing "v1\/volumes\/a\/streams\/.*" to s3:\/\/zfs-csi-test\//);
  assert.deepEqual(await pendingUploads(server), []);

  proxy.set({ kind: "error", status: 507, code: "InsufficientStorage", count: 1 });
  await assertRejectsKind(store.putBytes("v1/x.json", encoder.encode("{}")), "no_space");
});

Deno.test("S3Store: CompleteMultipartUpload answering 200 with an <Error> is a failure", async () => {
  await using server = await S3Server.start();
  await using proxy = new FaultProxy(server.endpoint);
  const store = storeOn(server, { endpoint: proxy.endpoint, partSizeBytes: 5 * MiB });
  const key = "v1/volumes/a/streams/00000000000000aa-0123abcd.zfs";

  // A transient error in the 200 answer: sent again, and the upload completes.
  proxy.set({ kind: "error", status: 200, code: "InternalError", count: 1 }, isComplete);
  const put = await store.putStream(key, generated(6 * MiB, createHash("sha256")));
  assert.equal(put.size, 6 * MiB);
  assert.equal(
    proxy.seen.filter((s) => s.method === "POST" && /uploadId=/.test(s.target)).length,
    2,
  );
  assert.equal((await store.list("v1/"))[0]?.size, 6 * MiB);

  // A permanent one: the write fails and the upload is aborted.
  const other = "v1/volumes/a/streams/00000000000000bb-0123abcd.zfs";
  proxy.set({ kind: "error", status: 200, code: "InvalidPart", count: 1 }, isComplete);
  const error = await assertRejectsKind(
    store.putStream(other, generated(6 * MiB, createHash("sha256"))),
    "invalid",
  );
  assert.match(error.message, /answered 200 InvalidPart/);
  assert.equal(await store.getBytes(other), undefined);
  assert.deepEqual(await pendingUploads(server), []);
});

Deno.test("S3Store: concurrent ifNoneMatch writers from two stores, exactly one wins", async () => {
  await using server = await S3Server.start();
  const a = storeOn(server);
  const b = storeOn(server);
  const key = "v1/volumes/a/snapshots/00000000000000aa.json";
  const results = await Promise.allSettled([
    a.putBytes(key, encoder.encode("from node a"), { ifNoneMatch: "*" }),
    b.putBytes(key, encoder.encode("from node b"), { ifNoneMatch: "*" }),
  ]);
  assert.equal(results.filter((r) => r.status === "fulfilled").length, 1);
  const lost = results.find((r) => r.status === "rejected");
  await assertRejectsKind(Promise.reject(lost?.reason), "precondition_failed");
  const stored = new TextDecoder().decode((await a.getBytes(key))?.bytes);
  assert.match(stored, /^from node [ab]$/);

  const first = await a.getBytes(key);
  await a.putBytes(key, encoder.encode("generation 2"), { ifMatch: first!.etag });
  const stale = await assertRejectsKind(
    b.putBytes(key, encoder.encode("stale"), { ifMatch: first!.etag }),
    "precondition_failed",
  );
  assert.match(stale.message, /answered 412 PreconditionFailed/);
  assert.match(stale.message, /snapshots\/00000000000000aa\.json/);
});

Deno.test("S3Store retries reads, listings and deletes on 500, 503 and SlowDown", async () => {
  await using server = await S3Server.start();
  await using proxy = new FaultProxy(server.endpoint);
  const store = storeOn(server, { endpoint: proxy.endpoint });
  await store.putBytes("v1/a.json", encoder.encode("a"));
  const gets = () => proxy.seen.filter((s) => s.method === "GET").length;

  proxy.set({ kind: "error", status: 500, code: "InternalError", count: 2 });
  assert.equal(new TextDecoder().decode((await store.getBytes("v1/a.json"))?.bytes), "a");
  assert.equal(gets(), 3, "two 500s, then the answer");

  proxy.set({ kind: "error", status: 503, code: "SlowDown", count: 3 });
  assert.deepEqual((await store.list("v1/")).map((o) => o.key), ["v1/a.json"]);
  assert.equal(gets(), 7);

  proxy.set({ kind: "error", status: 500, code: "InternalError", count: 1 });
  const stream = await store.getStream("v1/a.json");
  assert.equal(new TextDecoder().decode(await new Response(stream).arrayBuffer()), "a");

  proxy.set({ kind: "error", status: 503, code: "ServiceUnavailable", count: 2 });
  await store.delete("v1/a.json");
  assert.equal(await store.getBytes("v1/a.json"), undefined);

  // Four tries, then the caller hears why.
  proxy.set({ kind: "error", status: 500, code: "InternalError", count: 100 });
  const before = gets();
  const error = await assertRejectsKind(store.getBytes("v1/a.json"), "unavailable");
  assert.equal(gets() - before, 4);
  assert.match(error.message, /^Reading "v1\/a\.json" from s3:\/\/zfs-csi-test\/backups\/zfs-csi /);
  assert.match(error.message, /the store answered 500 InternalError/);
});

Deno.test("S3Store: a conditional write is never resent blindly", async () => {
  await using server = await S3Server.start();
  await using proxy = new FaultProxy(server.endpoint);
  const store = storeOn(server, { endpoint: proxy.endpoint });
  const puts = () => proxy.seen.filter((s) => s.method === "PUT").map((s) => s.outcome);
  const key = "v1/volumes/a/snapshots/00000000000000aa.json";

  // The write landed but its answer was lost: read back, it is ours, done (no second PUT).
  proxy.set({ kind: "lose", count: 1 }, (r) => r.method === "PUT");
  const put = await store.putBytes(key, encoder.encode("mine"), { ifNoneMatch: "*" });
  assert.deepEqual(puts(), ["lose"]);
  assert.equal((await store.getBytes(key))?.etag, put.etag);

  // It did not land (the proxy answered 500 itself): read back, absent, sent again.
  const other = "v1/volumes/a/snapshots/00000000000000bb.json";
  proxy.set(
    { kind: "error", status: 500, code: "InternalError", count: 1 },
    (r) => r.method === "PUT",
  );
  await store.putBytes(other, encoder.encode("mine too"), { ifNoneMatch: "*" });
  assert.deepEqual(puts(), ["lose", "error", "forwarded"]);

  // An If-Match write whose answer was lost, then found to be ours.
  proxy.set({ kind: "lose", count: 1 }, (r) => r.method === "PUT");
  const next = await store.putBytes(key, encoder.encode("generation 2"), { ifMatch: put.etag });
  assert.equal((await store.getBytes(key))?.etag, next.etag);

  // Another writer got there while the store did not answer: precondition_failed, no resend.
  const direct = storeOn(server);
  proxy.set({
    kind: "error",
    status: 503,
    code: "ServiceUnavailable",
    count: 1,
    meanwhile: () => direct.putBytes(key, encoder.encode("someone else")),
  }, (r) => r.method === "PUT");
  const before = puts().length;
  const error = await assertRejectsKind(
    store.putBytes(key, encoder.encode("generation 3"), { ifMatch: next.etag }),
    "precondition_failed",
  );
  assert.deepEqual(puts().slice(before), ["error"]);
  assert.match(error.message, /changed while the store did not answer/);
  assert.equal(new TextDecoder().decode((await store.getBytes(key))?.bytes), "someone else");
});

Deno.test("S3Store: an unreachable, slow or cut-off store is unavailable with a clear message", async () => {
  await using server = await S3Server.start();
  await using proxy = new FaultProxy(server.endpoint);
  const store = storeOn(server, { endpoint: proxy.endpoint, requestTimeoutMs: 300 });
  await store.putStream("v1/big.zfs", generated(4 * MiB, createHash("sha256")));

  // Cut off midway through a download: the stream fails, it does not just end early.
  proxy.set({ kind: "cut", afterBytes: MiB, count: 1 });
  const stream = await store.getStream("v1/big.zfs");
  const cut = await assertRejectsKind(new Response(stream).arrayBuffer(), "unavailable");
  assert.match(
    cut.message,
    /^Reading "v1\/big\.zfs" from s3:\/\/.* failed: the store is unreachable/,
  );

  // Slower than the time limit, every try.
  proxy.set({ kind: "delay", ms: 1000 });
  const slow = await assertRejectsKind(store.getBytes("v1/big.zfs"), "unavailable");
  assert.match(slow.message, /did not answer in time/);
  proxy.set({ kind: "pass" });

  await proxy.stop();
  for (
    const call of [
      () => store.getBytes("v1/big.zfs"),
      () => store.list("v1/"),
      () => store.putBytes("v1/x.json", encoder.encode("x"), { ifNoneMatch: "*" }),
      () => store.putStream("v1/y.zfs", generated(MiB, createHash("sha256"))),
    ]
  ) {
    const down = await assertRejectsKind(call, "unavailable");
    assert.match(down.message, /failed: the store is unreachable \(/);
    assert.match(
      down.message,
      /s3:\/\/zfs-csi-test\/backups\/zfs-csi \(http:\/\/127\.0\.0\.1:\d+\)/,
    );
  }
});

Deno.test("S3Store: a wrong secret is denied and the message shows no secret", async () => {
  await using server = await S3Server.start();
  const wrong = "wrong-secret-0123456789";
  const store = storeOn(server, {
    credentials: { accessKeyId: server.accessKeyId, secretAccessKey: wrong },
  });
  for (
    const call of [
      () => store.getBytes("v1/a.json"),
      () => store.list(""),
      () => store.putBytes("v1/a.json", encoder.encode("x"), { ifNoneMatch: "*" }),
      () => store.putStream("v1/a.zfs", generated(MiB, createHash("sha256"))),
      () => store.delete("v1/a.json"),
    ]
  ) {
    const error = await assertRejectsKind(call, "denied");
    assert.match(error.message, /answered 403 SignatureDoesNotMatch: check the access key/);
    for (const secret of [wrong, server.secretAccessKey, "Signature=", "AWS4-HMAC"]) {
      assert.ok(!error.message.includes(secret), error.message);
      assert.ok(!String(error.cause ?? "").includes(secret));
    }
  }
  const unknown = storeOn(server, {
    credentials: { accessKeyId: "nobody", secretAccessKey: server.secretAccessKey },
  });
  const error = await assertRejectsKind(unknown.getBytes("v1/a.json"), "denied");
  assert.match(error.message, /the access key is not known/);
});

Deno.test("S3Store: an empty prefix writes at the bucket's root; a missing bucket is named", async () => {
  await using server = await S3Server.start();
  const store = storeOn(server, { prefix: "" });
  assert.equal(store.description, `s3://${server.bucket}/ (${server.endpoint.origin})`);
  await store.putBytes("v1/volumes/a/volume.json", encoder.encode("{}"));
  assert.equal(
    (await Deno.stat(`${server.dir}/${server.bucket}/v1/volumes/a/volume.json`)).size,
    2,
  );
  assert.deepEqual((await store.list("v1/")).map((o) => o.key), ["v1/volumes/a/volume.json"]);
  const slashes = storeOn(server, { prefix: "/backups//zfs-csi/" });
  await slashes.putBytes("v1/b.json", encoder.encode("{}"));
  assert.deepEqual((await store.list("backups/")).map((o) => o.key), ["backups/zfs-csi/v1/b.json"]);

  const missing = storeOn(server, { bucket: "no-such-bucket" });
  const error = await assertRejectsKind(missing.list(""), "misconfigured");
  assert.match(error.message, /answered 404 NoSuchBucket.*the bucket "no-such-bucket" does not/);
});

Deno.test("S3Store answers FAILED_PRECONDITION naming a bucket that does not exist", async () => {
  await using server = await S3Server.start();
  const store = storeOn(server, { bucket: "no-such-bucket-here" });
  const calls: [string, () => Promise<unknown>][] = [
    ["list", () => store.list("v1/")],
    ["getBytes", () => store.getBytes("v1/x.json")],
    ["putBytes", () => store.putBytes("v1/x.json", encoder.encode("{}"))],
    ["putBytes if-none-match", () =>
      store.putBytes("v1/x.json", encoder.encode("{}"), {
        ifNoneMatch: "*",
      })],
    ["delete", () => store.delete("v1/x.json")],
  ];
  for (const [what, call] of calls) {
    const err = await call().then(() => undefined, (e: unknown) => e);
    const status = toGrpcStatus(err);
    assert.equal(codeName(status.code), "FAILED_PRECONDITION", `${what}: ${status.details}`);
    assert.match(status.details, /the bucket "no-such-bucket-here" does not exist/, what);
  }
});

Deno.test("S3Store: a download read with buffers of the reader's own, in a call's store wait, fills those buffers", async () => {
  // A restore reads into three buffers it takes in turn (src/replicate/receive.ts): every layer
  // between it and the socket (the wait's stall clock, the client's time limit, the HTTP/1.1
  // body) must pass its buffers down, or each read allocates a buffer of its own.
  await using server = await S3Server.start();
  const store = new BoundedStore(storeOn(server), { limitMs: 30_000 });
  const size = 6 * MiB + 77;
  const sent = createHash("sha256");
  const key = "v1/volumes/byob/streams/00000000000000aa-0123abcd.zfs";
  await store.putStream(key, generated(size, sent));
  const call = { operation: "CreateVolume byob", signal: new AbortController().signal };
  await runInCall(call, async () => {
    const reader = (await store.getStream(key)).getReader({ mode: "byob" });
    const received = createHash("sha256");
    const buffers = [new Uint8Array(256 * 1024), new Uint8Array(256 * 1024)];
    let got = 0;
    for (let turn = 0;; turn++) {
      const r = await reader.read(buffers[turn % 2]!);
      if (r.done) break;
      // The same memory came back (handed over and back), filled from its start.
      assert.equal(r.value.buffer.byteLength, 256 * 1024);
      assert.equal(r.value.byteOffset, 0);
      received.update(r.value);
      got += r.value.length;
      buffers[turn % 2] = new Uint8Array(r.value.buffer);
    }
    assert.equal(got, size);
    assert.equal(received.digest("hex"), sent.digest("hex"));
  });
});
