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
import { STEP_ASIDE_BYTES_PER_SECOND, volumeCalls } from "../foreground.ts";
import { write } from "node:fs";
import type { SpawnOptions, StreamedCommand, StreamedExit, StreamRunner } from "../run.ts";
import { FileStore } from "../store/file_store.ts";
import type { Zfs } from "../zfs/zfs.ts";

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
  // A pattern is no zfs stream: its form has no header features, and no zfs was asked.
  const form = { compressed: false, largeBlocks: false, embedded: false };
  assert.deepEqual(sent, { size: 100_003, sha256: sha256(bytes), form });
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

Deno.test("sendToStore reads zfs send at the slow rate while another volume's call is served", async () => {
  const chunk = 64 * 1024;
  const { streams, store, deps } = setup({ stdout: patternChunks(64 * chunk, chunk) });
  const end = volumeCalls.begin({});
  const sending = sendToStore(deps, { snapshot: "tank/v@s1", raw: false, key: KEY });
  await new Promise((r) => setTimeout(r, 100));
  const given = streams.processes[0]!.events.filter((e) => e.startsWith("stdout ")).length;
  end();
  // 100 ms at the slow rate is 1.6 MiB: 25 chunks, and the one being read.
  const most = Math.ceil((0.1 * STEP_ASIDE_BYTES_PER_SECOND) / chunk) + 2;
  assert.ok(given <= most, `${given} of 64 chunks read in 100 ms while a call was served`);
  // Once the call ended, the rest goes through.
  assert.equal((await sending).size, 64 * chunk);
  assert.equal(store.peek(KEY)?.length, 64 * chunk);
});

/**
 * A zfs send that writes `chunks` into the file it is given as stdout (by descriptor, as
 * `zfs send > file` does), pausing between chunks, then exits with `code`.
 */
class FileWritingRunner implements StreamRunner {
  readonly spawned: SpawnOptions[] = [];
  readonly argvs: (readonly string[])[] = [];
  readonly #chunks: readonly Uint8Array[];
  readonly #code: number;
  readonly #stderr: string;

  constructor(chunks: readonly Uint8Array[], code = 0, stderr = "") {
    this.#chunks = chunks;
    this.#code = code;
    this.#stderr = stderr;
  }

  spawn(argv: readonly string[], options: SpawnOptions = {}): StreamedCommand {
    this.spawned.push(options);
    this.argvs.push(argv);
    const out = options.stdout;
    if (typeof out !== "object") throw new TypeError("this zfs send writes only to a file");
    let killed = false;
    const kill = () => killed = true;
    options.signal?.addEventListener("abort", kill, { once: true });
    const exit = (async (): Promise<StreamedExit> => {
      for (const chunk of this.#chunks) {
        if (killed) break;
        await new Promise<void>((resolve, reject) =>
          write(out.fd, chunk, 0, chunk.length, null, (e) => e ? reject(e) : resolve())
        );
        await new Promise((r) => setTimeout(r, 2));
      }
      return killed
        ? { code: 137, stderr: "", killed }
        : { code: this.#code, stderr: this.#stderr, killed };
    })();
    return { stdin: null, stdout: null, exit, kill };
  }
}

async function fileStoreIn(): Promise<{ store: FileStore; root: string } & AsyncDisposable> {
  const root = await Deno.makeTempDir({ dir: "/tmp", prefix: "zfs-csi-send-" });
  return {
    store: new FileStore(root),
    root,
    [Symbol.asyncDispose]: () => Deno.remove(root, { recursive: true }),
  };
}

async function tempNames(root: string): Promise<string[]> {
  const out: string[] = [];
  for await (const e of Deno.readDir(`${root}/.tmp`)) out.push(e.name);
  return out;
}

Deno.test("sendToStore has zfs send write a file store's file itself, and hashes it", async () => {
  await using dir = await fileStoreIn();
  const chunks = patternChunks(300_001, 65_536);
  const streams = new FileWritingRunner(chunks);
  const deps = { streams, zfsPath: "zfs", store: dir.store, log };
  const sent = await sendToStore(deps, { snapshot: "tank/v@s1", raw: false, key: KEY });
  const bytes = joinChunks(chunks);
  const form = { compressed: false, largeBlocks: false, embedded: false };
  assert.deepEqual(sent, { size: 300_001, sha256: sha256(bytes), form });
  assert.deepEqual((await dir.store.getBytes(KEY))?.bytes, bytes);
  assert.equal(typeof streams.spawned[0]?.stdout, "object", "stdout was the file, not a pipe");
  assert.deepEqual(await tempNames(dir.root), []);
});

Deno.test("sendToStore to a file store keeps nothing of a zfs send that failed midway", async () => {
  await using dir = await fileStoreIn();
  const stderr = "warning: cannot send 'tank/v@s1': Input/output error\n";
  const streams = new FileWritingRunner(patternChunks(50_000, 4096), 1, stderr);
  const deps = { streams, zfsPath: "zfs", store: dir.store, log };
  const err = await sendToStore(deps, { snapshot: "tank/v@s1", raw: false, key: KEY })
    .then(() => undefined, (e: unknown) => e);
  assert.ok(err instanceof ZfsError, String(err));
  assert.equal(err.stderr, stderr);
  assert.deepEqual(await dir.store.list(""), []);
  assert.deepEqual(await tempNames(dir.root), []);
});

Deno.test("sendToStore to a file store, aborted midway, stops zfs send and keeps nothing", async () => {
  await using dir = await fileStoreIn();
  const streams = new FileWritingRunner(patternChunks(400_000, 4096));
  const deps = { streams, zfsPath: "zfs", store: dir.store, log };
  const abort = new AbortController();
  setTimeout(() => abort.abort(new Error("plugin stopping")), 20);
  await assert.rejects(
    sendToStore(deps, { snapshot: "tank/v@s1", raw: false, key: KEY, signal: abort.signal }),
    { message: "plugin stopping" },
  );
  assert.deepEqual(await dir.store.list(""), []);
  assert.deepEqual(await tempNames(dir.root), []);
});

Deno.test("sendToStore to a full file store fails as the store's no_space, naming the store", async () => {
  await using dir = await fileStoreIn();
  const stderr = "warning: cannot send 'tank/v@s1': No space left on device\n";
  const streams = new FileWritingRunner(patternChunks(50_000, 4096), 1, stderr);
  const deps = { streams, zfsPath: "zfs", store: dir.store, log };
  const err = await sendToStore(deps, { snapshot: "tank/v@s1", raw: false, key: KEY })
    .then(() => undefined, (e: unknown) => e);
  assert.ok(err instanceof StoreError && err.kind === "no_space", String(err));
  assert.ok(err.message.includes(dir.store.description), err.message);
  assert.match(err.message, /full.*No space left on device/);
  assert.deepEqual(await dir.store.list(""), []);
  assert.deepEqual(await tempNames(dir.root), []);
});

/** A zfs stream's first bytes (DRR_BEGIN, little-endian) stating `flags`, then a pattern. */
function streamChunks(flags: number, size: number): Uint8Array[] {
  const head = new Uint8Array(312);
  const view = new DataView(head.buffer);
  view.setBigUint64(8, 0x2f5bacbacn, true);
  view.setBigUint64(16, (BigInt(flags) << 2n) | 1n, true);
  // The header arrives split over reads, as a pipe may hand it over.
  return [head.subarray(0, 10), head.subarray(10), ...patternChunks(size - head.length, 4096)];
}

/** What zfs send and zpool say of a pool, as Zfs.streamSupport gives it. */
function support(kind: "openzfs" | "zfs-fuse"): Pick<Zfs, "streamSupport"> {
  const features = kind === "zfs-fuse" ? new Map() : new Map([
    ["lz4_compress", "active"],
    ["large_blocks", "enabled"],
    ["embedded_data", "active"],
  ]);
  const asked: string[] = [];
  return {
    streamSupport: (pool: string) => {
      asked.push(pool);
      return Promise.resolve({
        pool,
        zfsVersion: kind === "zfs-fuse" ? undefined : "2.1.11",
        poolVersion: kind === "zfs-fuse" ? "23" : "-",
        features,
      });
    },
  };
}

const COMPRESSED_FLAGS = (1 << 2) | (1 << 16) | (1 << 17) | (1 << 22);

Deno.test("sendToStore sends -c -L -e where the pool has them, and records the header's features", async () => {
  const streams = new FakeStreamRunner(() => ({ stdout: streamChunks(COMPRESSED_FLAGS, 50_000) }));
  const store = new MemoryStore();
  const deps = { streams, zfsPath: "zfs", store, log, zfs: support("openzfs") };
  const sent = await sendToStore(deps, { snapshot: "tank/nomad/v@s1", raw: false, key: KEY });
  assert.deepEqual(streams.processes[0]!.argv, [
    "zfs",
    "send",
    "-c",
    "-L",
    "-e",
    "tank/nomad/v@s1",
  ]);
  assert.deepEqual(sent.form, {
    compressed: true,
    largeBlocks: true,
    embedded: true,
    features: ["compressed", "embed_data", "lz4", "sa_spill"],
  });
});

Deno.test("sendToStore keeps a plain chain's -L off, and a raw send takes only -w", async () => {
  const streams = new FakeStreamRunner(() => ({ stdout: streamChunks(1 << 24, 5000) }));
  const deps = { streams, zfsPath: "zfs", store: new MemoryStore(), log, zfs: support("openzfs") };
  const plain = { compressed: false, largeBlocks: false, embedded: false };
  await sendToStore(deps, {
    snapshot: "tank/v@s2",
    base: "tank/v@s1",
    baseForm: plain,
    raw: false,
    key: KEY,
  });
  // A base without a recorded form is plain too.
  await sendToStore(deps, { snapshot: "tank/v@s2", base: "tank/v@s1", raw: false, key: KEY });
  const raw = await sendToStore(deps, { snapshot: "tank/v@s2", raw: true, key: KEY });
  assert.deepEqual(streams.processes.map((p) => p.argv), [
    ["zfs", "send", "-c", "-e", "-i", "tank/v@s1", "tank/v@s2"],
    ["zfs", "send", "-c", "-e", "-i", "tank/v@s1", "tank/v@s2"],
    ["zfs", "send", "-w", "tank/v@s2"],
  ]);
  assert.deepEqual(raw.form, { ...plain, features: ["raw"] });
});

Deno.test("sendToStore on zfs-fuse sends plain streams and records so", async () => {
  // zfs-fuse 0.7.0's header: no feature flags.
  const streams = new FakeStreamRunner(() => ({ stdout: streamChunks(0, 20_000) }));
  const deps = { streams, zfsPath: "zfs", store: new MemoryStore(), log, zfs: support("zfs-fuse") };
  const sent = await sendToStore(deps, { snapshot: "tank/v@s1", raw: false, key: KEY });
  assert.deepEqual(streams.processes[0]!.argv, ["zfs", "send", "tank/v@s1"]);
  assert.deepEqual(sent.form, {
    compressed: false,
    largeBlocks: false,
    embedded: false,
    features: [],
  });
});

Deno.test("sendToStore to a file store reads the form's features from the written file", async () => {
  await using dir = await fileStoreIn();
  const streams = new FileWritingRunner(streamChunks(COMPRESSED_FLAGS, 100_000));
  const deps = { streams, zfsPath: "zfs", store: dir.store, log, zfs: support("openzfs") };
  const sent = await sendToStore(deps, { snapshot: "tank/v@s1", raw: false, key: KEY });
  assert.deepEqual(streams.argvs[0], ["zfs", "send", "-c", "-L", "-e", "tank/v@s1"]);
  assert.deepEqual(sent.form?.features, ["compressed", "embed_data", "lz4", "sa_spill"]);
});
