import assert from "node:assert/strict";
import { type FakeRequest, FakeS3 } from "../../tests/support/fake_s3.ts";
import { assertRejectsKind } from "../../tests/support/store_contract.ts";
import { MAX_LIST_PAGE_BYTES, S3Store, type S3StoreOptions } from "./s3_store.ts";
import { MAX_OBJECT_BYTES } from "./store.ts";
import { partSizeFor } from "./s3_upload.ts";

const encoder = new TextEncoder();
const decoder = new TextDecoder();
const PART = 1024;

function fakeStore(fake: FakeS3, options: Partial<S3StoreOptions> = {}): S3Store {
  return new S3Store({
    endpoint: new URL("http://s3.test:9000"),
    region: "us-east-1",
    bucket: "b",
    prefix: "backups/zfs-csi",
    pathStyle: true,
    credentials: { accessKeyId: "AKID", secretAccessKey: "secret-key-value" },
    partSizeBytes: PART,
    allowSmallParts: true,
    retry: { baseDelayMs: 1, maxDelayMs: 2 },
    fetch: fake.fetch,
    ...options,
  });
}

/** A body of `chunks` chunks of 100 bytes (byte i of the body is i % 251), counting pulls. */
function counted(chunks: number): { stream: ReadableStream<Uint8Array>; pulled: () => number } {
  let pulled = 0;
  const stream = new ReadableStream<Uint8Array>({
    pull(c) {
      if (pulled === chunks) return c.close();
      c.enqueue(Uint8Array.from({ length: 100 }, (_, i) => (pulled * 100 + i) % 251));
      pulled++;
    },
  }, { highWaterMark: 0 });
  return { stream, pulled: () => pulled };
}

function expectedBytes(size: number): Uint8Array {
  return Uint8Array.from({ length: size }, (_, i) => i % 251);
}

/** An answer that never comes: rejects once the request's signal aborts. */
function never(r: FakeRequest): Promise<Response> {
  return new Promise((_, reject) => {
    if (r.signal?.aborted) reject(r.signal.reason);
    r.signal?.addEventListener("abort", () => reject(r.signal?.reason));
  });
}

function operations(fake: FakeS3): string[] {
  return fake.requests.map((r) => r.operation);
}

/** Holds every UploadPart until released; counts how many wait at once. */
function holdParts(fake: FakeS3) {
  let release = () => {};
  const released = new Promise<void>((r) => release = r);
  const state = { waiting: 0, most: 0 };
  fake.intercept = async (r: FakeRequest) => {
    if (r.operation !== "UploadPart") return undefined;
    state.waiting++;
    state.most = Math.max(state.most, state.waiting);
    await released;
    state.waiting--;
    return undefined;
  };
  return { state, release };
}

async function until(check: () => boolean): Promise<void> {
  for (let i = 0; i < 200 && !check(); i++) await new Promise((r) => setTimeout(r, 5));
}

for (const inFlight of [1, 3]) {
  Deno.test(`S3Store.putStream with ${inFlight} part(s) in flight holds ${inFlight} uploading and one being read`, async () => {
    const fake = new FakeS3("b");
    const held = holdParts(fake);
    const body = counted(100); // 10,000 bytes: 10 parts of 1 KiB
    const put = fakeStore(fake, { partsInFlight: inFlight }).putStream("v1/s.zfs", body.stream);
    await until(() => held.state.waiting === inFlight);
    await new Promise((r) => setTimeout(r, 20));
    assert.equal(held.state.waiting, inFlight, "parts upload at once, up to the limit");
    // The parts uploading and one more, full: read in chunks of 100, nothing beyond.
    assert.equal(body.pulled(), Math.ceil(((inFlight + 1) * PART) / 100));
    held.release();
    const result = await put;
    assert.equal(held.state.most, inFlight);
    assert.equal(result.size, 10_000);
    assert.deepEqual(fake.objects.get("backups/zfs-csi/v1/s.zfs")?.bytes, expectedBytes(10_000));
    assert.equal(operations(fake).filter((o) => o === "UploadPart").length, 10);
    assert.match(result.etag, /-10$/);
  });
}

Deno.test("S3Store.putStream reads a byte stream into one small buffer, not into its parts", async () => {
  const fake = new FakeS3("b");
  const sizes = new Set<number>();
  let at = 0;
  const part = 3 * 1024 * 1024;
  const total = 10 * 1024 * 1024 + 12_345;
  // A byte stream like a command's stdout: answers each read in the reader's own buffer, at
  // most 64 KiB at a time (a pipe's capacity).
  const stream = new ReadableStream({
    type: "bytes",
    pull(c) {
      const request = c.byobRequest!;
      const view = request.view as Uint8Array;
      if (at === total) {
        c.close();
        request.respond(0);
        return;
      }
      sizes.add(view.buffer.byteLength);
      const n = Math.min(65_536, view.length, total - at);
      for (let i = 0; i < n; i++) view[i] = (at + i) % 251;
      at += n;
      request.respond(n);
    },
  });
  const result = await fakeStore(fake, { partSizeBytes: part }).putStream("v1/s.zfs", stream);
  assert.equal(result.size, total);
  assert.deepEqual(fake.objects.get("backups/zfs-csi/v1/s.zfs")?.bytes, expectedBytes(total));
  // Every read landed in a buffer of 1 MiB, then copied into the part: a part's buffer (8 MiB)
  // handed over and back through every stream layer on each 64 KiB read cost more CPU.
  assert.deepEqual([...sizes], [1024 * 1024]);
});

Deno.test("S3Store signs parts as UNSIGNED-PAYLOAD only over TLS or loopback", async () => {
  for (
    const [endpoint, unsigned] of [
      ["http://127.0.0.1:7070", true],
      ["https://s3.example.net", true],
      ["http://s3.example.net:9000", false],
    ] as const
  ) {
    const fake = new FakeS3("b");
    const hashes: string[] = [];
    fake.intercept = (r: FakeRequest) => {
      if (r.operation === "UploadPart" || r.operation === "PutObject") {
        hashes.push(r.headers.get("x-amz-content-sha256") ?? "");
      }
      return undefined;
    };
    const store = fakeStore(fake, { endpoint: new URL(endpoint) });
    await store.putStream("v1/s.zfs", counted(30).stream);
    await store.putStream("v1/t.zfs", counted(3).stream);
    assert.equal(hashes.length, 4, endpoint);
    for (const h of hashes) {
      if (unsigned) assert.equal(h, "UNSIGNED-PAYLOAD", endpoint);
      else assert.match(h, /^[0-9a-f]{64}$/, endpoint);
    }
  }
});

Deno.test("S3Store.putStream sends a body smaller than a part as one PutObject", async () => {
  const fake = new FakeS3("b");
  const put = await fakeStore(fake).putStream("v1/s.zfs", counted(10).stream);
  assert.equal(put.size, 1000);
  assert.deepEqual(operations(fake), ["PutObject"]);
  assert.equal(put.etag, fake.objects.get("backups/zfs-csi/v1/s.zfs")?.etag);
});

Deno.test("S3Store.putStream aborts the multipart upload when a part fails", async () => {
  const fake = new FakeS3("b");
  fake.intercept = (r) =>
    r.operation === "UploadPart" && r.url.searchParams.get("partNumber") === "3"
      ? new Response("<Error><Code>AccessDenied</Code></Error>", { status: 403 })
      : undefined;
  const body = counted(100);
  await assertRejectsKind(fakeStore(fake).putStream("v1/s.zfs", body.stream), "denied");
  assert.equal(fake.objects.size, 0);
  assert.equal(fake.uploads.size, 0, "AbortMultipartUpload was sent");
  assert.ok(operations(fake).includes("AbortMultipartUpload"));
  assert.ok(body.pulled() < 100, "the source is not read to its end after a failure");
});

Deno.test("S3Store joins the prefix and key without double slashes, path-style or not", async () => {
  const fake = new FakeS3("b");
  await fakeStore(fake, { prefix: "/backups//zfs-csi/" }).putBytes(
    "v1/a:b.json",
    encoder.encode("x"),
  );
  assert.equal(fake.requests[0]?.url.href, "http://s3.test:9000/b/backups/zfs-csi/v1/a%3Ab.json");
  await fakeStore(fake, { prefix: "" }).getBytes("v1/a.json");
  assert.equal(fake.requests[1]?.url.href, "http://s3.test:9000/b/v1/a.json");
  const hosted = new FakeS3("b");
  const urls: string[] = [];
  const store = fakeStore(hosted, {
    pathStyle: false,
    endpoint: new URL("https://s3.eu-west-1.amazonaws.com"),
    fetch: (input) => {
      urls.push(String(input));
      return Promise.resolve(new Response(null, { status: 200, headers: { etag: '"e"' } }));
    },
  });
  await store.putBytes("v1/a.json", encoder.encode("x"));
  assert.deepEqual(urls, ["https://b.s3.eu-west-1.amazonaws.com/backups/zfs-csi/v1/a.json"]);
});

Deno.test("S3Store.list follows continuation tokens and gives keys below the prefix", async () => {
  const fake = new FakeS3("b");
  fake.pageSize = 2;
  const store = fakeStore(fake);
  for (const k of ["v1/e", "v1/a", "v1/c", "v1/b", "v1/d"]) {
    await store.putBytes(k, encoder.encode(k));
  }
  await fakeStore(fake, { prefix: "other" }).putBytes("v1/x", encoder.encode("x"));
  const listed = await store.list("v1/");
  assert.deepEqual(listed.map((o) => o.key), ["v1/a", "v1/b", "v1/c", "v1/d", "v1/e"]);
  assert.deepEqual(listed.map((o) => o.size), [4, 4, 4, 4, 4]);
  assert.equal(operations(fake).filter((o) => o === "ListObjectsV2").length, 3);
  const query = fake.requests.at(-1)?.url.searchParams;
  assert.equal(query?.get("prefix"), "backups/zfs-csi/v1/");
  assert.equal(query?.get("list-type"), "2");
});

Deno.test("S3Store sends If-None-Match: * and a quoted If-Match", async () => {
  const fake = new FakeS3("b");
  const store = fakeStore(fake);
  const first = await store.putBytes("v1/r.json", encoder.encode("1"), { ifNoneMatch: "*" });
  assert.equal(fake.requests[0]?.headers.get("if-none-match"), "*");
  assert.doesNotMatch(first.etag, /"/, "etags are returned without quotes");
  await store.putBytes("v1/r.json", encoder.encode("2"), { ifMatch: first.etag });
  assert.equal(fake.requests[1]?.headers.get("if-match"), `"${first.etag}"`);
  await assertRejectsKind(
    store.putBytes("v1/r.json", encoder.encode("3"), { ifMatch: first.etag }),
    "precondition_failed",
  );
  await assertRejectsKind(
    store.putBytes("v1/none.json", encoder.encode("3"), { ifMatch: first.etag }),
    "precondition_failed",
  );
  assert.equal(decoder.decode(fake.objects.get("backups/zfs-csi/v1/r.json")?.bytes), "2");
});

Deno.test("S3Store retries an unconditional write, and reads back a conditional one", async () => {
  const fake = new FakeS3("b");
  let fail = 2;
  fake.intercept = (r) =>
    r.operation === "PutObject" && fail-- > 0 ? new Response("", { status: 500 }) : undefined;
  const store = fakeStore(fake);
  await store.putBytes("v1/a.json", encoder.encode("a"));
  assert.deepEqual(operations(fake), ["PutObject", "PutObject", "PutObject"]);

  fake.requests.length = 0;
  fail = 1;
  await store.putBytes("v1/b.json", encoder.encode("b"), { ifNoneMatch: "*" });
  assert.deepEqual(operations(fake), ["PutObject", "GetObject", "PutObject"]);

  // Four tries of a conditional write that never gets an answer, each followed by a read.
  fake.requests.length = 0;
  fail = 100;
  const e = await assertRejectsKind(
    store.putBytes("v1/c.json", encoder.encode("c"), { ifNoneMatch: "*" }),
    "unavailable",
  );
  assert.match(e.message, /answered 500/);
  assert.equal(operations(fake).filter((o) => o === "PutObject").length, 4);
});

Deno.test("S3Store gives up on a request that does not answer in time", async () => {
  const fake = new FakeS3("b");
  fake.intercept = (r) => never(r);
  const store = fakeStore(fake, { requestTimeoutMs: 20, retry: { tries: 2, baseDelayMs: 1 } });
  const e = await assertRejectsKind(store.list(""), "unavailable");
  assert.match(
    e.message,
    /^Listing "" in s3:\/\/b\/backups\/zfs-csi \(http:\/\/s3\.test:9000\) failed: the store is unreachable \(it did not answer in time\)$/,
  );
  assert.equal(fake.requests.length, 2);
});

Deno.test("S3Store passes the caller's abort reason through, without retrying", async () => {
  const fake = new FakeS3("b");
  const store = fakeStore(fake);
  await store.putBytes("v1/a.zfs", new Uint8Array(5000));
  const controller = new AbortController();
  fake.intercept = (r) => {
    controller.abort(new Error("the caller stopped"));
    return never(r);
  };
  fake.requests.length = 0;
  await assert.rejects(
    store.getStream("v1/a.zfs", { signal: controller.signal }),
    /the caller stopped/,
  );
  assert.equal(fake.requests.length, 1);
});

Deno.test("S3Store reads a missing key as absent only on NoSuchKey", async () => {
  const fake = new FakeS3("b");
  const store = fakeStore(fake);
  assert.equal(await store.getBytes("v1/missing.json"), undefined);
  await assertRejectsKind(store.getStream("v1/missing.zfs"), "not_found");
  await store.delete("v1/missing.json");
  // A 404 that is not S3's (a web server at the wrong endpoint) must not read as "absent".
  fake.intercept = () => new Response("<html>Not Found</html>", { status: 404 });
  await assertRejectsKind(store.getBytes("v1/missing.json"), "invalid");
  await assertRejectsKind(store.delete("v1/missing.json"), "invalid");
});

Deno.test("S3Store describes itself without user info and refuses parts under 5 MiB", () => {
  const fake = new FakeS3("b");
  const store = fakeStore(fake, { endpoint: new URL("https://user:pass@minio.example:9000/s3/") });
  assert.equal(store.description, "s3://b/backups/zfs-csi (https://minio.example:9000/s3)");
  assert.throws(
    () => fakeStore(fake, { allowSmallParts: false }),
    /S3 part size 1024 is not at least 5 MiB/,
  );
  assert.doesNotThrow(() =>
    fakeStore(fake, { allowSmallParts: false, partSizeBytes: 5 * 1024 ** 2 })
  );
});

Deno.test("partSizeFor doubles every 1,000 parts so 10,000 parts pass 5 TiB", () => {
  const MiB = 1024 ** 2;
  assert.equal(partSizeFor(8 * MiB, 1), 8 * MiB);
  assert.equal(partSizeFor(8 * MiB, 1000), 8 * MiB);
  assert.equal(partSizeFor(8 * MiB, 1001), 16 * MiB);
  assert.equal(partSizeFor(8 * MiB, 10_000), 4096 * MiB);
  let total = 0;
  for (let n = 1; n <= 10_000; n++) total += partSizeFor(8 * MiB, n);
  assert.ok(total > 5 * 1024 ** 4, `${total}`);
  assert.equal(partSizeFor(1024 * MiB, 10_000), 5 * 1024 * MiB, "capped at S3's 5 GiB");
});

Deno.test("S3Store.getBytes refuses an object over the cap, naming the key and the cap", async () => {
  const fake = new FakeS3("b");
  const store = fakeStore(fake);
  fake.objects.set("backups/zfs-csi/v1/big.json", {
    bytes: new Uint8Array(MAX_OBJECT_BYTES + 1),
    etag: "e",
  });
  const sized = await assertRejectsKind(() => store.getBytes("v1/big.json"), "invalid");
  assert.match(sized.message, /"v1\/big\.json".* 1048576 bytes/);
  // An answer without a length (chunked) is read only up to the cap, then dropped.
  let pulled = 0;
  const chunk = 64 * 1024;
  fake.intercept = (r) =>
    r.operation === "GetObject"
      ? new Response(
        new ReadableStream<Uint8Array>({
          pull(c) {
            if (++pulled > 64) return c.close();
            c.enqueue(new Uint8Array(chunk));
          },
        }, { highWaterMark: 0 }),
        { headers: { etag: '"e"' } },
      )
      : undefined;
  const streamed = await assertRejectsKind(() => store.getBytes("v1/big.json"), "invalid");
  assert.match(streamed.message, /"v1\/big\.json".* 1048576 bytes/);
  assert.ok(pulled <= MAX_OBJECT_BYTES / chunk + 2, `read ${pulled} chunks of 64 KiB`);
});

Deno.test("S3Store.list refuses a listing page over the cap", async () => {
  const fake = new FakeS3("b");
  const store = fakeStore(fake);
  const padding = " ".repeat(MAX_LIST_PAGE_BYTES);
  fake.intercept = (r) =>
    r.operation === "ListObjectsV2"
      ? new Response(
        `<ListBucketResult>${padding}<IsTruncated>false</IsTruncated></ListBucketResult>`,
      )
      : undefined;
  const err = await assertRejectsKind(() => store.list("v1/"), "invalid");
  assert.match(err.message, /^Listing "v1\/" in .* over the \d+ bytes/);
});
