import assert from "node:assert/strict";
import { FakeS3 } from "../../tests/support/fake_s3.ts";
import { MemoryStore } from "../../tests/support/memory_store.ts";
import { checkStore, PROBE_PREFIX } from "./check.ts";
import { S3Store } from "./s3_store.ts";
import {
  type PutResult,
  type RequestOptions,
  type Store,
  StoreError,
  type WriteCondition,
} from "./store.ts";

/** `inner` with some of its methods replaced. */
function replacing(inner: MemoryStore, own: Partial<Store>): Store {
  return {
    description: inner.description,
    putStream: (key, body, options) => inner.putStream(key, body, options),
    putBytes: (key, bytes, condition, options) => inner.putBytes(key, bytes, condition, options),
    getStream: (key, options) => inner.getStream(key, options),
    getBytes: (key, options) => inner.getBytes(key, options),
    list: (prefix, options) => inner.list(prefix, options),
    delete: (key, options) => inner.delete(key, options),
    ...own,
  };
}

/** A store whose server ignores the conditions named (writes as if none was given). */
function ignoring(inner: MemoryStore, which: "ifNoneMatch" | "ifMatch" | "both"): Store {
  return replacing(inner, {
    putBytes(
      key: string,
      bytes: Uint8Array,
      condition?: WriteCondition,
      options?: RequestOptions,
    ): Promise<PutResult> {
      const drop = condition !== undefined &&
        (which === "both" || (which === "ifNoneMatch") === ("ifNoneMatch" in condition));
      return inner.putBytes(key, bytes, drop ? undefined : condition, options);
    },
  });
}

function statuses(report: Awaited<ReturnType<typeof checkStore>>): string[] {
  return report.steps.map((s) => `${s.name}: ${s.status}`);
}

Deno.test("checkStore passes a store that enforces conditional writes, and leaves no probe", async () => {
  const store = new MemoryStore();
  const seen: string[] = [];
  const report = await checkStore(store, {
    node: "node-a",
    random: () => "0123456789abcdef",
    onStep: (s) => seen.push(s.name),
  });
  assert.deepEqual(statuses(report), [
    "reachable: ok",
    "listing: ok",
    "put, get and delete: ok",
    "conditional writes: ok",
  ]);
  assert.deepEqual(seen, report.steps.map((s) => s.name), "told as they came");
  assert.deepEqual(report.conditional, { kind: "enforced" });
  assert.equal(report.ok, true);
  assert.match(report.steps[2]!.detail, /"v1\/probe\/node-a-0123456789abcdef"/);
  assert.deepEqual(store.keys(), [], "the probe object is gone");
});

Deno.test("checkStore passes an S3 store that enforces them, the bucket checked", async () => {
  const fake = new FakeS3("b");
  const store = new S3Store({
    endpoint: new URL("http://s3.test:9000"),
    region: "us-east-1",
    bucket: "b",
    prefix: "p",
    pathStyle: true,
    credentials: { accessKeyId: "AKID", secretAccessKey: "secret-key-value" },
    fetch: fake.fetch,
  });
  const report = await checkStore(store, { node: "n1", bucket: true });
  assert.deepEqual(statuses(report), [
    "reachable: ok",
    "bucket exists: ok",
    "listing: ok",
    "put, get and delete: ok",
    "conditional writes: ok",
  ]);
  assert.deepEqual([...fake.objects.keys()], []);
  const missing = await checkStore(
    new S3Store({
      endpoint: new URL("http://s3.test:9000"),
      region: "us-east-1",
      bucket: "other",
      prefix: "p",
      pathStyle: true,
      credentials: { accessKeyId: "AKID", secretAccessKey: "secret-key-value" },
      fetch: fake.fetch,
    }),
    { node: "n1", bucket: true },
  );
  assert.deepEqual(statuses(missing), [
    "reachable: ok",
    "bucket exists: failed",
    "listing: skipped",
    "put, get and delete: skipped",
    "conditional writes: skipped",
  ]);
  assert.match(missing.steps[1]!.detail, /the bucket "other" does not exist/);
  assert.equal(missing.conditional.kind, "unknown");
});

Deno.test("checkStore fails a server that ignores If-None-Match or If-Match, naming its answer", async () => {
  for (
    const [which, answer] of [
      ["ifNoneMatch", /^a write with If-None-Match: \* to an object that exists was accepted/],
      ["ifMatch", /^a write with If-Match: "0+" \(an etag the object does not have\) was accepted/],
      ["both", /^a write with If-None-Match: \*/],
    ] as const
  ) {
    const inner = new MemoryStore();
    const report = await checkStore(ignoring(inner, which), { node: "node-a" });
    assert.equal(report.ok, false, which);
    assert.equal(report.conditional.kind, "not_enforced", which);
    const detail = report.conditional.kind === "not_enforced" ? report.conditional.detail : "";
    assert.match(detail, answer, which);
    assert.match(detail, /where S3 answers 412 Precondition Failed$/, which);
    assert.deepEqual(report.steps.at(-1), {
      name: "conditional writes",
      status: "failed",
      detail,
    });
    assert.deepEqual(inner.keys(), [], `${which}: the probe object is gone`);
  }
});

Deno.test("checkStore fails a server that refuses conditional writes, and cannot tell for one that fails", async () => {
  const memory = new MemoryStore();
  const refusing = replacing(memory, {
    putBytes(key: string, bytes: Uint8Array, condition?: WriteCondition) {
      if (condition !== undefined) {
        return Promise.reject(
          new StoreError("invalid", "Writing failed: the store answered 501 NotImplemented"),
        );
      }
      return memory.putBytes(key, bytes);
    },
  });
  const refused = await checkStore(refusing, { node: "node-a" });
  assert.equal(refused.conditional.kind, "not_enforced");
  assert.match(refused.steps.at(-1)!.detail, /failed: .*501 NotImplemented/);

  const down = replacing(new MemoryStore(), {
    list: () => Promise.reject(new StoreError("unavailable", "Listing failed: unreachable")),
  });
  const report = await checkStore(down, { node: "node-a", bucket: true });
  assert.deepEqual(statuses(report), [
    "reachable: failed",
    "bucket exists: skipped",
    "listing: skipped",
    "put, get and delete: skipped",
    "conditional writes: skipped",
  ]);
  assert.equal(report.conditional.kind, "unknown");
  assert.ok(PROBE_PREFIX.startsWith("v1/probe/"));
});
