import assert from "node:assert/strict";
import { createHash } from "node:crypto";
import { ZfsError } from "../errors.ts";
import { Logger } from "../log.ts";
import { type PutResult, StoreError, type TransferOptions } from "../store/store.ts";
import {
  FakeStreamRunner,
  joinChunks,
  patternChunks,
  type StreamScript,
} from "../../tests/support/fake_stream_runner.ts";
import { MemoryStore } from "../../tests/support/memory_store.ts";
import { sendToStore } from "./send.ts";

const KEY = "v1/volumes/v/streams/00000000000000ff-0123abcd.zfs";
const log = new Logger("error", {}, () => {});

function setup(script: StreamScript, store = new MemoryStore()) {
  const streams = new FakeStreamRunner(() => script);
  return { streams, store, deps: { streams, zfsPath: "zfs", store, log } };
}

function sha256(bytes: Uint8Array): string {
  return createHash("sha256").update(bytes).digest("hex");
}

Deno.test("sendToStore stores exactly zfs send's bytes and returns their size and SHA-256", async () => {
  const chunks = patternChunks(100_003, 4096);
  const { streams, store, deps } = setup({ stdout: chunks });
  const sent = await sendToStore(deps, {
    snapshot: "tank/v@s2",
    base: "tank/v@s1",
    raw: false,
    key: KEY,
  });
  const bytes = joinChunks(chunks);
  assert.deepEqual(sent, { size: 100_003, sha256: sha256(bytes) });
  assert.deepEqual(store.peek(KEY), bytes);
  assert.deepEqual(streams.processes[0]!.argv, ["zfs", "send", "-i", "tank/v@s1", "tank/v@s2"]);
  assert.equal(streams.processes[0]!.options.stdout, "piped");
});

Deno.test("sendToStore of a zfs send failing midway leaves no object and says why", async () => {
  const stderr = "warning: cannot send 'tank/v@s1': Input/output error\n";
  const { store, deps } = setup({ stdout: patternChunks(50_000, 4096), code: 1, stderr });
  const err = await sendToStore(deps, { snapshot: "tank/v@s1", raw: false, key: KEY })
    .then(() => undefined, (e: unknown) => e);
  assert.ok(err instanceof ZfsError, String(err));
  assert.equal(err.stderr, stderr);
  assert.deepEqual(err.argv, ["zfs", "send", "tank/v@s1"]);
  assert.deepEqual(store.streamed, [], "the upload failed, not stored then deleted");
  assert.deepEqual(store.keys(), []);
  assert.equal(store.pendingWrites, 0);
});

Deno.test("sendToStore classifies zfs send's failure as zfs.ts does", async () => {
  const stderr = "cannot open 'tank/v@gone': dataset does not exist\n";
  const { store, deps } = setup({ code: 1, stderr });
  const err = await sendToStore(deps, { snapshot: "tank/v@gone", raw: true, key: KEY })
    .then(() => undefined, (e: unknown) => e);
  assert.ok(err instanceof ZfsError);
  assert.equal(err.kind, "not_found");
  assert.deepEqual(err.argv, ["zfs", "send", "-w", "tank/v@gone"]);
  assert.deepEqual(store.keys(), []);
});

/** A store that fails a streamed write after reading `reads` chunks. */
class FailingStore extends MemoryStore {
  constructor(readonly reads: number) {
    super();
  }

  override async putStream(
    key: string,
    body: ReadableStream<Uint8Array>,
    _options?: TransferOptions,
  ): Promise<PutResult> {
    const reader = body.getReader();
    for (let i = 0; i < this.reads; i++) await reader.read();
    await reader.cancel();
    throw new StoreError("no_space", `No space left for "${key}" in ${this.description}`);
  }
}

Deno.test("sendToStore kills zfs send when the store fails", async () => {
  const { streams, store, deps } = setup(
    { stdout: patternChunks(20_000, 4096), hang: true },
    new FailingStore(2),
  );
  const err = await sendToStore(deps, { snapshot: "tank/v@s1", raw: false, key: KEY })
    .then(() => undefined, (e: unknown) => e);
  assert.ok(err instanceof StoreError && err.kind === "no_space", String(err));
  assert.ok(streams.processes[0]!.killed);
  assert.deepEqual(store.keys(), []);
});

Deno.test("sendToStore aborted midway kills zfs send and stores nothing", async () => {
  const controller = new AbortController();
  const chunks = patternChunks(40_000, 4096);
  const store = new MemoryStore();
  const streams = new FakeStreamRunner(() => ({ stdout: chunks, hang: true }));
  const sending = sendToStore({ streams, zfsPath: "zfs", store, log }, {
    snapshot: "tank/v@s1",
    raw: false,
    key: KEY,
    signal: controller.signal,
  });
  while (!streams.processes[0]?.events.includes("stdout 4096")) {
    await new Promise((r) => setTimeout(r, 1));
  }
  controller.abort();
  await assert.rejects(sending, { name: "AbortError" });
  assert.ok(streams.processes[0]!.killed);
  assert.deepEqual(store.streamed, []);
  assert.deepEqual(store.keys(), []);
  assert.equal(store.pendingWrites, 0);
});

/** A store that reads one chunk, then waits until told. */
class StalledStore extends MemoryStore {
  readonly go = Promise.withResolvers<void>();

  override async putStream(
    key: string,
    body: ReadableStream<Uint8Array>,
    options?: TransferOptions,
  ): Promise<PutResult> {
    const reader = body.getReader();
    const first = await reader.read();
    await this.go.promise;
    const rest = new ReadableStream<Uint8Array>({
      start(c) {
        if (!first.done) c.enqueue(first.value);
      },
      async pull(c) {
        const r = await reader.read();
        if (r.done) c.close();
        else c.enqueue(r.value);
      },
    });
    return await super.putStream(key, rest, options);
  }
}

Deno.test("sendToStore reads zfs send no faster than the store takes the stream", async () => {
  const store = new StalledStore();
  const { streams, deps } = setup({ stdout: patternChunks(400 * 1024, 4096) }, store);
  const sending = sendToStore(deps, { snapshot: "tank/v@s1", raw: false, key: KEY });
  await new Promise((r) => setTimeout(r, 50));
  const given = streams.processes[0]!.events.filter((e) => e.startsWith("stdout ")).length;
  assert.ok(given <= 4, `${given} of 100 chunks read while the store took 1`);
  store.go.resolve();
  assert.equal((await sending).size, 400 * 1024);
});
