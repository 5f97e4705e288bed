import assert from "node:assert/strict";
import { createHash } from "node:crypto";
import { ZfsError } from "../errors.ts";
import type { SnapshotManifest } from "../store/layout.ts";
import { FileStore } from "../store/file_store.ts";
import { StoreError, type TransferOptions } from "../store/store.ts";
import { fails, FakeRunner, fakeTools } from "../../tests/support/fake_runner.ts";
import {
  CUT_SHORT,
  FakeStreamRunner,
  joinChunks,
  KILLED_CODE,
  patternChunks,
  type StreamScript,
} from "../../tests/support/fake_stream_runner.ts";
import { MemoryStore } from "../../tests/support/memory_store.ts";
import { ReplicateError } from "../replicate_errors.ts";
import { STEP_ASIDE_BYTES_PER_SECOND, volumeCalls } from "../foreground.ts";
import { checkChain, receiveFromStore, restoreChain } from "./receive.ts";
import { excludedOnReceive } from "./stream_properties.ts";

const TARGET = "tank/nomad/.restore-v";
const CHUNK = 4096;

function manifest(bytes: Uint8Array, over: Partial<SnapshotManifest> = {}): SnapshotManifest {
  const guid = over.guid ?? "1001";
  return {
    format: 1,
    volume: "v",
    volumeUid: "0123456789abcdef0123456789abcdef",
    guid,
    baseGuid: null,
    snapshot: `.backup-${guid}`,
    kind: "scheduled",
    createdAt: "2026-11-23T10:00:00.000Z",
    stream: `v1/volumes/v/streams/${BigInt(guid).toString(16).padStart(16, "0")}-0a0b0c0d.zfs`,
    size: bytes.length,
    sha256: createHash("sha256").update(bytes).digest("hex"),
    raw: false,
    node: "n1",
    capacityBytes: 1 << 30,
    ...over,
  };
}

/** How the fake zfs differs from zfs-fuse's answers (no `-x`, nothing received). */
interface FakeZfs {
  /** Whether zfs receive takes `-x`/`-o` (OpenZFS). */
  readonly overrides?: boolean;
  /** What `zfs get -s received` prints after a receive (`zfs get -Hp` lines). */
  readonly received?: string;
  /** What `zfs get -s local` prints before the receive (`zfs get -Hp` lines). */
  readonly local?: string;
  /** What `zfs get -s local` prints once zfs receive ran (the stream cleared them). */
  readonly localAfter?: string;
  /** What `zfs get -r -d 1 ... type,guid,createtxg` prints of the dataset received into. */
  readonly tree?: string;
}

/** A store, a stream runner and a zfs whose snapshots of TARGET have the guids given. */
function setup(
  script: StreamScript = {},
  store = new MemoryStore({ chunkSize: CHUNK }),
  fake: FakeZfs = {},
) {
  let received = fake.received ?? "";
  let local = fake.local ?? "";
  const streams = new FakeStreamRunner(() => {
    local = fake.localAfter ?? local;
    return script;
  });
  const runner = new FakeRunner()
    .when(
      (argv) => argv[1] === "get" && argv.at(-2) === "guid",
      (argv) => {
        const snap = argv.at(-1)!;
        return { stdout: `${snap}\tguid\t${snap.split("-").at(-1)}\t-\n` };
      },
    )
    .when(
      (argv) => argv[1] === "receive" && argv.includes("-n"),
      () =>
        fake.overrides
          ? fails("cannot receive: failed to read from stream\n")
          : fails("invalid option 'x'\nusage:\n\treceive [-vnF] <filesystem|volume|snapshot>\n", 2),
    )
    .when((argv) => argv[1] === "get" && argv.includes("-s"), (argv) => {
      const sources = argv[argv.indexOf("-s") + 1]!.split(",");
      return {
        stdout: (sources.includes("local") ? local : "") +
          (sources.includes("received") ? received : ""),
      };
    })
    .when((argv) => argv[1] === "get" && argv.includes("-r") && !argv.includes("-s"), () => ({
      stdout: fake.tree ?? "",
    }))
    .on(["zfs", "destroy"], {})
    .on(["zfs", "rollback"], {})
    .on(["zfs", "set"], (argv) => {
      const [kv, name] = [argv.at(-2)!, argv.at(-1)!];
      const [k, ...v] = kv.split("=");
      local += `${name}\t${k}\t${v.join("=")}\tlocal\n`;
      // A local value hides the received one.
      received = received.split("\n").filter((l) => !l.startsWith(`${name}\t${k}\t`)).join("\n");
      return {};
    })
    // The -x list's names, all known.
    .when((argv) => argv[1] === "get" && argv.at(-1) === "tank/nomad", (argv) => ({
      stdout: argv.at(-2)!.split(",").map((k) => `tank/nomad\t${k}\t-\t-\n`).join(""),
    }))
    .on(["zfs", "inherit"], (argv) => {
      // Overridden: what the stream set no longer shows as received.
      const [k, name] = [argv.at(-2)!, argv.at(-1)!];
      received = received.split("\n").filter((l) => !l.startsWith(`${name}\t${k}\t`)).join("\n");
      return {};
    });
  const { zfs, log } = fakeTools(runner);
  return { streams, store, runner, deps: { streams, zfsPath: "zfs", zfs, store, log } };
}

/** The argv of the guid check (the `zfs get guid` of the received snapshot). */
function guidChecks(runner: FakeRunner): string[][] {
  return runner.argvs.filter((a) => a[1] === "get" && a.at(-2) === "guid");
}

async function stored(store: MemoryStore, m: SnapshotManifest, bytes: Uint8Array) {
  await store.putBytes(m.stream, bytes);
}

function failure(p: Promise<unknown>): Promise<unknown> {
  return p.then(() => assert.fail("expected a failure"), (e: unknown) => e);
}

Deno.test("receiveFromStore passes the whole stream to zfs receive -u and checks the guid", async () => {
  const bytes = joinChunks(patternChunks(50_001, 1000));
  const m = manifest(bytes);
  const { streams, store, runner, deps } = setup();
  await stored(store, m, bytes);
  await receiveFromStore(deps, { manifest: m, target: TARGET });
  const proc = streams.processes[0]!;
  assert.deepEqual(proc.argv, ["zfs", "receive", "-u", TARGET]);
  assert.deepEqual(proc.stdinBytes, bytes);
  assert.equal(proc.events.at(-2), "close");
  assert.ok(!proc.killed);
  assert.deepEqual(guidChecks(runner).map((a) => a.at(-1)), [`${TARGET}@.backup-1001`]);
});

/** A download that counts the chunks taken from it (none read ahead: highWaterMark 0). */
class CountingStore extends MemoryStore {
  taken = 0;

  override async getStream(key: string, options?: TransferOptions) {
    const inner = (await super.getStream(key, options)).getReader();
    return new ReadableStream<Uint8Array>({
      pull: async (controller) => {
        const r = await inner.read();
        if (r.done) return controller.close();
        this.taken++;
        controller.enqueue(r.value);
      },
    }, { highWaterMark: 0 });
  }
}

Deno.test("receiveFromStore downloads and hashes the next chunk while zfs receive still takes the last", async () => {
  const bytes = joinChunks(patternChunks(8 * CHUNK, CHUNK));
  const m = manifest(bytes);
  const store = new CountingStore({ chunkSize: CHUNK });
  // Each write waits (a few turns of the event loop) for the next chunk to be taken.
  const overlapped: boolean[] = [];
  const { streams, deps } = setup({
    beforeWrite: async () => {
      const before = store.taken;
      for (let i = 0; i < 20 && store.taken === before; i++) {
        await new Promise((resolve) => setTimeout(resolve, 0));
      }
      overlapped.push(store.taken > before);
    },
  }, store);
  await stored(store, m, bytes);
  await receiveFromStore(deps, { manifest: m, target: TARGET });
  assert.deepEqual(streams.processes[0]!.stdinBytes, bytes);
  // Every write but the last two (the held chunk, written after the end) saw the next read.
  assert.deepEqual(overlapped.slice(0, -2), Array(overlapped.length - 2).fill(true));
  assert.equal(overlapped.length, 8);
});

Deno.test("receiveFromStore downloads at the slow rate while another volume's call is served", async () => {
  // Larger than a hash slice: the hash's own pauses (hash_slices.ts) would not keep it slow.
  const chunk = 128 * 1024;
  const bytes = joinChunks(patternChunks(64 * chunk, chunk));
  const m = manifest(bytes);
  const store = new CountingStore({ chunkSize: chunk });
  const { streams, deps } = setup({}, store);
  await stored(store, m, bytes);
  const end = volumeCalls.begin({});
  const receiving = receiveFromStore(deps, { manifest: m, target: TARGET });
  await new Promise((r) => setTimeout(r, 100));
  const given = store.taken;
  end();
  // 100 ms at the slow rate is 1.6 MiB: 13 chunks, and the one being read.
  const most = Math.ceil((0.1 * STEP_ASIDE_BYTES_PER_SECOND) / chunk) + 2;
  assert.ok(given <= most, `${given} of 64 chunks downloaded in 100 ms while a call was served`);
  await receiving;
  assert.deepEqual(streams.processes[0]!.stdinBytes, bytes);
});

Deno.test("receiveFromStore reports a write that failed while the next chunk downloaded as zfs receive's refusal", async () => {
  const bytes = joinChunks(patternChunks(8 * CHUNK, CHUNK));
  const m = manifest(bytes);
  const { streams, store, deps } = setup({
    exitAfterStdinBytes: 2 * CHUNK,
    code: 1,
    stderr: "cannot receive new filesystem stream: out of space\n",
  });
  await stored(store, m, bytes);
  const err = await failure(receiveFromStore(deps, { manifest: m, target: TARGET }));
  assert.ok(err instanceof ZfsError, String(err));
  assert.match(err.message, /out of space/);
  assert.ok(streams.processes[0]!.stdinBytes.length < bytes.length);
});

Deno.test("receiveFromStore cuts zfs receive's input short of the last chunk when the last byte differs", async () => {
  const bytes = joinChunks(patternChunks(3 * CHUNK + 100, 1000));
  const m = manifest(bytes);
  const { streams, store, runner, deps } = setup();
  const bad = bytes.slice();
  bad[bad.length - 1]! ^= 1;
  await stored(store, m, bad);
  const err = await failure(receiveFromStore(deps, { manifest: m, target: TARGET }));
  assert.ok(err instanceof ReplicateError && err.kind === "checksum", String(err));
  assert.match(err.message, new RegExp(`"${m.stream}".*SHA-256`));
  const proc = streams.processes[0]!;
  // Every chunk but the last (100 bytes) reached zfs, then its input ended short: zfs fails
  // on a cut stream and removes what it made. The bad byte never reached it.
  assert.deepEqual(proc.stdinBytes, bytes.slice(0, 3 * CHUNK));
  assert.deepEqual(proc.events.slice(-2), ["abort", "exit 1"]);
  assert.ok(!proc.events.includes("close"));
  assert.deepEqual(guidChecks(runner), [], "no guid read after a refused stream");
});

Deno.test("receiveFromStore kills a zfs receive that does not exit once its input is cut", async () => {
  const bytes = joinChunks(patternChunks(2 * CHUNK, 1000));
  const m = manifest(bytes, { sha256: "0".repeat(64) });
  const { streams, store, deps } = setup({ cutShort: "hang" });
  await stored(store, m, bytes);
  const err = await failure(
    receiveFromStore({ ...deps, stopWaitMs: 10 }, { manifest: m, target: TARGET }),
  );
  assert.ok(err instanceof ReplicateError && err.kind === "checksum", String(err));
  assert.deepEqual(streams.processes[0]!.events.slice(-3), [
    "abort",
    "kill",
    `exit ${KILLED_CODE}`,
  ]);
});

Deno.test("receiveFromStore refuses a stored stream shorter or longer than its manifest", async () => {
  const bytes = joinChunks(patternChunks(2 * CHUNK, 1000));
  for (const size of [bytes.length - 1, bytes.length + 1]) {
    const { streams, store, deps } = setup();
    const m = manifest(bytes.slice(0, size), { size: bytes.length - (size - bytes.length) });
    await stored(store, m, bytes);
    const err = await failure(receiveFromStore(deps, { manifest: m, target: TARGET }));
    assert.ok(err instanceof ReplicateError && err.kind === "checksum", String(err));
    assert.ok(streams.processes[0]!.events.includes("abort"));
    assert.ok(!streams.processes[0]!.events.includes("close"));
  }
});

/** A store whose downloads fail after `chunks` chunks. */
class BreakingStore extends MemoryStore {
  constructor(readonly chunks: number) {
    super({ chunkSize: CHUNK });
  }

  override async getStream(key: string, options?: TransferOptions) {
    const reader = (await super.getStream(key, options)).getReader();
    let left = this.chunks;
    return new ReadableStream<Uint8Array>({
      async pull(c) {
        if (left-- === 0) {
          return c.error(new StoreError("unavailable", `Download of "${key}" was cut`));
        }
        const r = await reader.read();
        if (r.done) c.close();
        else c.enqueue(r.value);
      },
    });
  }
}

Deno.test("receiveFromStore kills zfs receive when the download fails", async () => {
  const bytes = joinChunks(patternChunks(4 * CHUNK, 1000));
  const m = manifest(bytes);
  const { streams, store, deps } = setup({}, new BreakingStore(2));
  await stored(store, m, bytes);
  const err = await failure(receiveFromStore(deps, { manifest: m, target: TARGET }));
  assert.ok(err instanceof StoreError && err.kind === "unavailable", String(err));
  assert.ok(streams.processes[0]!.events.includes("abort"));
  assert.ok(!streams.processes[0]!.events.includes("close"));
  assert.equal(streams.processes[0]!.stdinBytes.length, CHUNK);
});

Deno.test("receiveFromStore reports zfs receive's refusal, classified", async () => {
  const bytes = joinChunks(patternChunks(4 * CHUNK, 1000));
  const m = manifest(bytes, { baseGuid: "77", guid: "1002" });
  const stderr = "cannot receive incremental stream: destination 'tank/nomad/.restore-v' " +
    "does not exist\n";
  const { streams, store, deps } = setup({ exitAfterStdinBytes: CHUNK, code: 1, stderr });
  await stored(store, m, bytes);
  const err = await failure(receiveFromStore(deps, { manifest: m, target: TARGET }));
  assert.ok(err instanceof ZfsError, String(err));
  assert.equal(err.kind, "not_found");
  assert.equal(err.stderr, stderr);
  assert.deepEqual(err.argv, ["zfs", "receive", "-u", TARGET]);
  assert.ok(!streams.processes[0]!.events.includes("close"));
});

Deno.test("receiveFromStore blames the stored bytes when zfs refuses a damaged stream early", async () => {
  const bytes = joinChunks(patternChunks(8 * CHUNK, 1000));
  const m = manifest(bytes);
  const bad = bytes.slice();
  bad[CHUNK + 10]! ^= 1;
  for (const [content, kind] of [[bad, "checksum"], [bytes, "invalid"]] as const) {
    // OpenZFS checks each record as it reads: it stops at the damage, long before the end.
    const { store, deps } = setup({ exitAfterStdinBytes: 2 * CHUNK, ...CUT_SHORT });
    await stored(store, m, content);
    const err = await failure(receiveFromStore(deps, { manifest: m, target: TARGET }));
    if (kind === "checksum") {
      assert.ok(err instanceof ReplicateError && err.kind === "checksum", String(err));
      assert.ok(err.cause instanceof ZfsError);
    } else {
      assert.ok(err instanceof ZfsError && err.kind === "invalid", String(err));
    }
  }
});

Deno.test("receiveFromStore refuses a received snapshot whose guid is not the manifest's", async () => {
  const bytes = joinChunks(patternChunks(1000, 1000));
  // The fake zfs answers guid 1001 for "@.backup-1001"; the manifest says 999.
  const m = manifest(bytes, { guid: "999", snapshot: ".backup-1001" });
  const { store, deps } = setup();
  await stored(store, m, bytes);
  const err = await failure(receiveFromStore(deps, { manifest: m, target: TARGET }));
  assert.ok(err instanceof ReplicateError && err.kind === "guid", String(err));
  assert.match(err.message, /guid is 1001, not the manifest's 999/);
});

/** A store whose downloads give one chunk per timer tick, as a network would. */
class PacedStore extends MemoryStore {
  constructor() {
    super({ chunkSize: CHUNK });
  }

  override async getStream(key: string, options?: TransferOptions) {
    const reader = (await super.getStream(key, options)).getReader();
    return new ReadableStream<Uint8Array>({
      async pull(c) {
        await new Promise((r) => setTimeout(r, 1));
        try {
          const r = await reader.read();
          if (r.done) c.close();
          else c.enqueue(r.value);
        } catch (err) {
          c.error(err);
        }
      },
    });
  }
}

Deno.test("receiveFromStore aborted midway kills zfs receive and closes nothing", async () => {
  const bytes = joinChunks(patternChunks(64 * CHUNK, 1000));
  const m = manifest(bytes);
  const { streams, store, deps } = setup({}, new PacedStore());
  await stored(store, m, bytes);
  const controller = new AbortController();
  const receiving = receiveFromStore(deps, {
    manifest: m,
    target: TARGET,
    signal: controller.signal,
  });
  while ((streams.processes[0]?.stdinBytes.length ?? 0) < 2 * CHUNK) {
    await new Promise((r) => setTimeout(r, 0));
  }
  controller.abort();
  await assert.rejects(receiving, { name: "AbortError" });
  assert.ok(streams.processes[0]!.events.includes("abort"));
  assert.ok(!streams.processes[0]!.events.includes("close"));
  assert.ok(streams.processes[0]!.ended);
});

Deno.test("restoreChain receives the full stream, then each incremental, in order", async () => {
  const a = joinChunks(patternChunks(5000, 1000, 1));
  const b = joinChunks(patternChunks(3000, 1000, 2));
  const full = manifest(a, { guid: "1001" });
  const inc = manifest(b, { guid: "1002", baseGuid: "1001" });
  const { streams, store, deps } = setup();
  await stored(store, full, a);
  await stored(store, inc, b);
  await restoreChain(deps, { chain: [full, inc], target: TARGET });
  assert.deepEqual(streams.processes.map((p) => p.stdinBytes), [a, b]);
});

Deno.test("restoreChain refuses a chain with a gap before receiving anything", async () => {
  const a = joinChunks(patternChunks(5000, 1000, 1));
  const full = manifest(a, { guid: "1001" });
  const inc = manifest(a, { guid: "1003", baseGuid: "1002" });
  const { streams, store, deps } = setup();
  await stored(store, full, a);
  await stored(store, inc, a);
  const err = await failure(restoreChain(deps, { chain: [full, inc], target: TARGET }));
  assert.ok(err instanceof ReplicateError && err.kind === "chain", String(err));
  assert.match(err.message, /incremental from guid 1002, not from ".backup-1001".*gap/);
  assert.equal(streams.processes.length, 0);
});

Deno.test("checkChain wants a full stream first and one volume throughout", () => {
  const a = new Uint8Array(1);
  assert.throws(() => checkChain([]), /No stored snapshots/);
  assert.throws(
    () => checkChain([manifest(a, { guid: "2", baseGuid: "1" })]),
    /starts from a full stream/,
  );
  assert.throws(
    () => checkChain([manifest(a), manifest(a, { guid: "1002", baseGuid: null })]),
    /is a full stream, not from/,
  );
  assert.throws(
    () =>
      checkChain([
        manifest(a),
        manifest(a, { guid: "1002", baseGuid: "1001", volumeUid: "f".repeat(32) }),
      ]),
    /one restore reads one volume's backups/,
  );
  checkChain([manifest(a), manifest(a, { guid: "1002", baseGuid: "1001" })]);
});

/** A directory store in /tmp holding `bytes` as the stream of `m`. */
async function fileStoreHolding(
  m: SnapshotManifest,
  bytes: Uint8Array,
): Promise<{ store: FileStore } & AsyncDisposable> {
  const root = await Deno.makeTempDir({ dir: "/tmp", prefix: "zfs-csi-receive-" });
  const store = new FileStore(root);
  await store.putBytes(m.stream, bytes);
  return { store, [Symbol.asyncDispose]: () => Deno.remove(root, { recursive: true }) };
}

/** 3.5 MiB that differ in every 1 MiB piece, so a buffer reused too early shows. */
function bigStream(): Uint8Array {
  const bytes = new Uint8Array(3.5 * 1024 * 1024);
  for (let i = 0; i < bytes.length; i++) bytes[i] = (i * 7 + (i >> 20) * 13) % 251;
  return bytes;
}

Deno.test("receiveFromStore reads a file store's stream into its own buffers, every byte intact", async () => {
  const bytes = bigStream();
  const m = manifest(bytes);
  await using dir = await fileStoreHolding(m, bytes);
  const { streams, deps } = setup();
  await receiveFromStore({ ...deps, store: dir.store }, { manifest: m, target: TARGET });
  const proc = streams.processes[0]!;
  assert.deepEqual(proc.stdinBytes, bytes);
  // Reads of 1 MiB, each written once the next one checked in: two buffers in turn.
  assert.deepEqual(
    proc.events.filter((e) => e.startsWith("write ")),
    ["write 1048576", "write 1048576", "write 1048576", "write 524288"],
  );
  assert.equal(proc.events.at(-2), "close");
});

Deno.test("receiveFromStore from a file store holds back the last read when the last byte differs", async () => {
  const bytes = bigStream();
  const m = manifest(bytes);
  const bad = bytes.slice();
  bad[bad.length - 1]! ^= 1;
  await using dir = await fileStoreHolding(m, bad);
  const { streams, runner, deps } = setup();
  const err = await failure(
    receiveFromStore({ ...deps, store: dir.store }, { manifest: m, target: TARGET }),
  );
  assert.ok(err instanceof ReplicateError && err.kind === "checksum", String(err));
  const proc = streams.processes[0]!;
  assert.deepEqual(
    proc.stdinBytes,
    bytes.slice(0, 3 * 1024 * 1024),
    "the bad byte never reached zfs",
  );
  assert.deepEqual(proc.events.slice(-2), ["abort", "exit 1"]);
  assert.deepEqual(guidChecks(runner), [], "nothing received, nothing checked");
});

Deno.test("receiveFromStore with readFile pipes from a store without local files, as before", async () => {
  const bytes = joinChunks(patternChunks(50_001, 1000));
  const m = manifest(bytes);
  const { streams, store, deps } = setup();
  await stored(store, m, bytes);
  await receiveFromStore(deps, { manifest: m, target: TARGET, readFile: true });
  const proc = streams.processes[0]!;
  assert.equal(proc.options.stdin, "piped");
  assert.deepEqual(proc.stdinBytes, bytes);
});

Deno.test("receiveFromStore with readFile gives zfs a file store's checked file, and no pipe", async () => {
  const bytes = bigStream();
  const m = manifest(bytes);
  await using dir = await fileStoreHolding(m, bytes);
  const { streams, runner, deps } = setup();
  await receiveFromStore(
    { ...deps, store: dir.store },
    { manifest: m, target: TARGET, readFile: true },
  );
  const proc = streams.processes[0]!;
  assert.equal(typeof proc.options.stdin, "object", "a descriptor, not a pipe");
  assert.deepEqual(proc.argv, ["zfs", "receive", "-u", TARGET]);
  assert.deepEqual(guidChecks(runner).at(-1)?.at(-1), `${TARGET}@.backup-1001`, "guid checked");

  // A damaged file: zfs reads it while it is checked, and the check's failure is the error
  // (restore.ts destroys what zfs made of it).
  const bad = bytes.slice();
  bad[bad.length - 1]! ^= 1;
  await dir.store.putBytes(m.stream, bad);
  const err = await failure(
    receiveFromStore({ ...deps, store: dir.store }, {
      manifest: m,
      target: TARGET,
      readFile: true,
    }),
  );
  assert.ok(err instanceof ReplicateError && err.kind === "checksum", String(err));
  assert.equal(streams.processes.length, 2);
  assert.equal(typeof streams.processes[1]!.options.stdin, "object", "from the file again");
});

Deno.test("receiveFromStore with readFile kills a zfs receive still reading a file that failed its check after stopWaitMs", async () => {
  const bytes = bigStream();
  const m = manifest(bytes);
  const bad = bytes.slice();
  bad[0]! ^= 1;
  await using dir = await fileStoreHolding(m, bad);
  const { streams, deps } = setup({ hang: true });
  const err = await failure(
    receiveFromStore({ ...deps, store: dir.store, stopWaitMs: 10 }, {
      manifest: m,
      target: TARGET,
      readFile: true,
    }),
  );
  assert.ok(err instanceof ReplicateError && err.kind === "checksum", String(err));
  assert.ok(streams.processes[0]!.killed, "zfs receive was killed");
});

/** `zfs get -Hp` lines of what a `zfs send -p -i` stream set on a copy (zfs-fuse's output). */
const COPY = "tank/nomad/pg";
const RECEIVED_ON_COPY = [
  `${COPY}\tmountpoint\t/etc/cron.d\treceived`,
  `${COPY}\tsetuid\ton\treceived`,
  `${COPY}\tother.tool:x\t1\treceived`,
  `${COPY}@.backup-1002\tsnapprop:z\t2\treceived`,
].map((l) => `${l}\n`).join("");

/** The copy's own properties before the receive: the plugin's markers and settings. */
const LOCAL_ON_COPY = [
  `${COPY}\torg.zfs-csi:managed\tyes\tlocal`,
  `${COPY}\torg.zfs-csi:follow-released\t1001\tlocal`,
  `${COPY}\treadonly\ton\tlocal`,
  `${COPY}\tsetuid\toff\tlocal`,
].map((l) => `${l}\n`).join("");

/** The copy's snapshots after the receive: the base, and the one the receive made. */
const COPY_TREE = [
  `${COPY}\ttype\tfilesystem\t-`,
  `${COPY}@.backup-1001\ttype\tsnapshot\t-`,
  `${COPY}@.backup-1001\tguid\t1001\t-`,
  `${COPY}@.backup-1001\tcreatetxg\t10\t-`,
  `${COPY}@.backup-1002\ttype\tsnapshot\t-`,
  `${COPY}@.backup-1002\tguid\t1002\t-`,
  `${COPY}@.backup-1002\tcreatetxg\t12\t-`,
].map((l) => `${l}\n`).join("");

Deno.test("receiveFromStore refuses an incremental into a copy that decided properties, and overrides what it set", async () => {
  const bytes = joinChunks(patternChunks(5000, 1000));
  const m = manifest(bytes, { guid: "1002", baseGuid: "1001" });
  const { streams, store, runner, deps } = setup({}, undefined, {
    received: RECEIVED_ON_COPY,
    tree: COPY_TREE,
  });
  await stored(store, m, bytes);
  const err = await failure(receiveFromStore(deps, { manifest: m, target: COPY }));
  assert.ok(err instanceof ReplicateError && err.kind === "properties", String(err));
  assert.match(err.message, /mountpoint="\/etc\/cron\.d" on "tank\/nomad\/pg"/);
  assert.match(err.message, /snapprop:z="2" on "tank\/nomad\/pg@\.backup-1002"/);
  assert.match(err.message, new RegExp(`Stored stream "${m.stream}"`));
  assert.deepEqual(streams.processes[0]!.argv, ["zfs", "receive", "-u", COPY]);
  // Nothing the stream decided takes effect, whatever becomes of the copy.
  assert.deepEqual(runner.argvs.filter((a) => a[1] === "inherit"), [
    ["zfs", "inherit", "mountpoint", COPY],
    ["zfs", "inherit", "setuid", COPY],
    ["zfs", "inherit", "other.tool:x", COPY],
    ["zfs", "inherit", "snapprop:z", `${COPY}@.backup-1002`],
  ]);
  // And the copy is as it was before: the snapshot the receive made goes, back to the base.
  assert.deepEqual(
    runner.argvs.filter((a) => a[1] === "destroy" || a[1] === "rollback"),
    [
      ["zfs", "destroy", `${COPY}@.backup-1002`],
      ["zfs", "rollback", `${COPY}@.backup-1001`],
    ],
  );
  assert.match(err.message, /was put back as it was before the receive/);
});

Deno.test("receiveFromStore undoes an incremental whose snapshot is not the manifest's", async () => {
  const bytes = joinChunks(patternChunks(5000, 1000));
  // The fake zfs answers guid 1002 for "@.backup-1002"; the manifest says 999.
  const m = manifest(bytes, { guid: "999", baseGuid: "1001", snapshot: ".backup-1002" });
  const { store, runner, deps } = setup({}, undefined, { tree: COPY_TREE });
  await stored(store, m, bytes);
  const err = await failure(receiveFromStore(deps, { manifest: m, target: COPY }));
  assert.ok(err instanceof ReplicateError && err.kind === "guid", String(err));
  assert.deepEqual(
    runner.argvs.filter((a) => a[1] === "destroy" || a[1] === "rollback"),
    [
      ["zfs", "destroy", `${COPY}@.backup-1002`],
      ["zfs", "rollback", `${COPY}@.backup-1001`],
    ],
  );
});

Deno.test("receiveFromStore leaves a refused incremental alone when the snapshots are not as received", async () => {
  const bytes = joinChunks(patternChunks(5000, 1000));
  const m = manifest(bytes, { guid: "1002", baseGuid: "1000" });
  const { store, runner, deps } = setup({}, undefined, {
    received: RECEIVED_ON_COPY,
    tree: COPY_TREE,
  });
  await stored(store, m, bytes);
  const err = await failure(receiveFromStore(deps, { manifest: m, target: COPY }));
  assert.ok(err instanceof ReplicateError && err.kind === "properties", String(err));
  // The one before is not the base the manifest names: nothing destroyed, nothing rolled back.
  assert.deepEqual(runner.argvs.filter((a) => a[1] === "destroy" || a[1] === "rollback"), []);
  assert.match(err.message, /stays on "tank\/nomad\/pg"/);
});

Deno.test("receiveFromStore accepts what its caller settles itself, and nothing else", async () => {
  const bytes = joinChunks(patternChunks(5000, 1000));
  const m = manifest(bytes);
  const received = `${TARGET}\trefquota\t1\treceived\n`;
  const ok = setup({}, undefined, { received });
  await stored(ok.store, m, bytes);
  await receiveFromStore(ok.deps, { manifest: m, target: TARGET, settles: new Set(["refquota"]) });
  const refused = setup({}, undefined, { received });
  await stored(refused.store, m, bytes);
  const err = await failure(receiveFromStore(refused.deps, { manifest: m, target: TARGET }));
  assert.ok(err instanceof ReplicateError && err.kind === "properties", String(err));
});

Deno.test("receiveFromStore tells OpenZFS's receive what the stream must not decide (-x), once it learnt it can", async () => {
  const bytes = joinChunks(patternChunks(5000, 1000));
  const plain = manifest(bytes);
  const raw = manifest(bytes, { guid: "1002", baseGuid: "1001", raw: true });
  const { streams, store, runner, deps } = setup({}, undefined, { overrides: true });
  await stored(store, plain, bytes);
  await stored(store, raw, bytes);
  await receiveFromStore(deps, { manifest: plain, target: TARGET });
  await receiveFromStore(deps, { manifest: raw, target: TARGET });
  const xs = (argv: readonly string[]) => argv.filter((_, i) => argv[i - 1] === "-x");
  assert.deepEqual(xs(streams.processes[0]!.argv), excludedOnReceive(false));
  assert.ok(xs(streams.processes[0]!.argv).includes("keylocation"));
  // A raw stream's encryption comes with it: OpenZFS refuses -x of its key properties.
  assert.deepEqual(xs(streams.processes[1]!.argv), excludedOnReceive(true));
  assert.ok(!xs(streams.processes[1]!.argv).includes("keylocation"));
  assert.equal(runner.argvs.filter((a) => a[1] === "receive").length, 1, "probed once");
  assert.equal(
    runner.argvs.filter((a) => a[1] === "get" && a.at(-1) === "tank/nomad").length,
    1,
    "the names asked once",
  );
});

Deno.test("receiveFromStore marks a new dataset right after zfs made it where receive takes no -o", async () => {
  const bytes = joinChunks(patternChunks(5000, 1000));
  const m = manifest(bytes);
  const { streams, store, runner, deps } = setup();
  await stored(store, m, bytes);
  await receiveFromStore(deps, {
    manifest: m,
    target: TARGET,
    createdWith: { "org.zfs-csi:restore-token": "abc" },
  });
  assert.deepEqual(streams.processes[0]!.argv, ["zfs", "receive", "-u", TARGET]);
  const after = runner.argvs.filter((a) => a[1] !== "receive");
  assert.deepEqual(after[0], ["zfs", "set", "org.zfs-csi:restore-token=abc", TARGET]);
  assert.equal(after[1]?.at(-2), "guid", "marked before the guid is read");
});

Deno.test("receiveFromStore sets back the local properties a refused stream cleared on the copy", async () => {
  const bytes = joinChunks(patternChunks(5000, 1000));
  const m = manifest(bytes, { guid: "1002", baseGuid: "1001" });
  // The first stream with properties a dataset receives clears its local ones (zfs does so).
  const { store, runner, deps } = setup({}, undefined, {
    received: RECEIVED_ON_COPY,
    local: LOCAL_ON_COPY,
    localAfter: "",
    tree: COPY_TREE,
  });
  await stored(store, m, bytes);
  const err = await failure(receiveFromStore(deps, { manifest: m, target: COPY }));
  assert.ok(err instanceof ReplicateError && err.kind === "properties", String(err));
  const changes = runner.argvs.filter((a) => a[1] === "set" || a[1] === "inherit");
  assert.deepEqual(changes, [
    ["zfs", "set", "org.zfs-csi:managed=yes", COPY],
    ["zfs", "set", "org.zfs-csi:follow-released=1001", COPY],
    ["zfs", "set", "readonly=on", COPY],
    ["zfs", "set", "setuid=off", COPY],
    // setuid is local again: only what has no local value is overridden.
    ["zfs", "inherit", "mountpoint", COPY],
    ["zfs", "inherit", "other.tool:x", COPY],
    ["zfs", "inherit", "snapprop:z", `${COPY}@.backup-1002`],
  ]);
  // Read before the receive, to be set back after it.
  const reads = runner.argvs.filter((a) =>
    a[1] === "get" && (a[a.indexOf("-s") + 1] ?? "").includes("local")
  );
  assert.equal(reads.length, 2);
});

Deno.test("receiveFromStore sets back the local properties a stream cleared though it decided nothing (all excluded)", async () => {
  const bytes = joinChunks(patternChunks(5000, 1000));
  const m = manifest(bytes, { guid: "1002", baseGuid: "1001" });
  // OpenZFS with -x: the stream's properties are overridden, and still it cleared the copy's.
  const { streams, store, runner, deps } = setup({}, undefined, {
    overrides: true,
    local: LOCAL_ON_COPY,
    localAfter: "",
    tree: COPY_TREE,
  });
  await stored(store, m, bytes);
  await receiveFromStore(deps, { manifest: m, target: COPY });
  assert.ok(streams.processes[0]!.argv.includes("-x"));
  assert.deepEqual(runner.argvs.filter((a) => a[1] === "set" || a[1] === "inherit"), [
    ["zfs", "set", "org.zfs-csi:managed=yes", COPY],
    ["zfs", "set", "org.zfs-csi:follow-released=1001", COPY],
    ["zfs", "set", "readonly=on", COPY],
    ["zfs", "set", "setuid=off", COPY],
  ]);
  assert.deepEqual(runner.argvs.filter((a) => a[1] === "destroy" || a[1] === "rollback"), []);
});

Deno.test("receiveFromStore with readFile answers a damaged file that zfs refused first as damaged (checksum), not as zfs's refusal", async () => {
  const bytes = bigStream();
  const m = manifest(bytes);
  const bad = bytes.slice();
  bad[Math.floor(bad.length / 2)]! ^= 1;
  await using dir = await fileStoreHolding(m, bad);
  // zfs-fuse checks a stream's own checksum at its end and may say so before the plugin's check
  // of the same file ended (here: at once).
  const { deps } = setup({
    code: 1,
    stderr: "cannot receive new filesystem stream: invalid stream (checksum mismatch)\n",
  });
  const err = await failure(
    receiveFromStore({ ...deps, store: dir.store }, {
      manifest: m,
      target: TARGET,
      readFile: true,
    }),
  );
  assert.ok(err instanceof ReplicateError && err.kind === "checksum", String(err));

  // A refusal that says nothing about the stream (the target is there) is zfs's answer at once.
  await using good = await fileStoreHolding(m, bytes);
  const exists = setup({
    code: 1,
    stderr: `cannot receive new filesystem stream: destination '${TARGET}' exists\n`,
  });
  const refused = await failure(
    receiveFromStore({ ...exists.deps, store: good.store }, {
      manifest: m,
      target: TARGET,
      readFile: true,
    }),
  );
  assert.ok(refused instanceof ZfsError && /exists/.test(refused.message), String(refused));
});

Deno.test("receiveFromStore and restoreChain refuse a form the pool lacks before any receive", async () => {
  const bytes = joinChunks(patternChunks(10_000, CHUNK));
  const { store, runner, deps, streams } = setup();
  // zfs-fuse: no zfs version, a pool of version 23.
  runner
    .onExact(["zfs", "version"], { code: 2, stderr: "unrecognized command 'version'\n" })
    .onExact(["zpool", "get", "all", "tank"], {
      stdout: "NAME  PROPERTY  VALUE  SOURCE\ntank  version  23  default\n",
    });
  const form = { compressed: true, largeBlocks: false, embedded: true, features: ["compressed"] };
  const full = manifest(bytes, { guid: "1001" });
  const inc = manifest(bytes, { guid: "1002", baseGuid: "1001", form });
  await stored(store, full, bytes);
  await stored(store, inc, bytes);
  await assert.rejects(
    receiveFromStore(deps, { manifest: inc, target: TARGET }),
    /cannot receive stored snapshot "\.backup-1002".*compressed, embedded-data stream/,
  );
  // The chain is refused as a whole: not even its plain full stream is received.
  await assert.rejects(
    restoreChain(deps, { chain: [full, inc], target: TARGET }),
    /pool "tank" lacks pool feature flags/,
  );
  assert.deepEqual(streams.processes, []);
});
