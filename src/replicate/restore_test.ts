import assert from "node:assert/strict";
import { createHash } from "node:crypto";
import { readSync } from "node:fs";
import { CsiError } from "../errors.ts";
import type { SpawnOptions, StreamedCommand, StreamedExit, StreamRunner } from "../run.ts";
import type { SnapshotManifest } from "../store/layout.ts";
import { FileStore } from "../store/file_store.ts";
import { fails, FakeRunner, fakeTools } from "../../tests/support/fake_runner.ts";
import { joinChunks } from "../../tests/support/fake_stream_runner.ts";
import { ReplicateError } from "../replicate_errors.ts";
import { restoreTempDataset, restoreVolume } from "./restore.ts";

const PARENT = "tank/nomad";
const TARGET = `${PARENT}/vol`;
const TEMP = restoreTempDataset(PARENT, TARGET);
const encoder = new TextEncoder();

/** A stream whose bytes name its guid (so the fake zfs knows what it received) plus filler. */
function streamBytes(guid: string, size: number): Uint8Array {
  const bytes = new Uint8Array(size);
  for (let i = 0; i < size; i++) bytes[i] = (i * 13 + 5) & 0xff;
  bytes.set(encoder.encode(`guid=${guid};`));
  return bytes;
}

function manifest(guid: string, baseGuid: string | null, bytes: Uint8Array): SnapshotManifest {
  return {
    format: 1,
    volume: "vol",
    volumeUid: "0123456789abcdef0123456789abcdef",
    guid,
    baseGuid,
    snapshot: `.backup-${guid}`,
    kind: "scheduled",
    createdAt: "2026-11-25T10:00:00.000Z",
    stream: `v1/volumes/vol/streams/${guid}.zfs`,
    size: bytes.length,
    sha256: createHash("sha256").update(bytes).digest("hex"),
    raw: false,
    node: "n1",
    capacityBytes: 1 << 30,
  };
}

/** Datasets and snapshots of the fake pool: name → type, guid, used. */
type Pool = Map<string, { type: string; guid: string; used: string }>;

/** One receive the fake stream runner saw: how its stdin came, and the bytes zfs read. */
interface SeenReceive {
  readonly stdin: "piped" | "fd";
  readonly bytes: Uint8Array;
}

/** zfs receive over the fake pool: reads its stdin (a descriptor or a pipe), makes the snapshot. */
class FakeReceives implements StreamRunner {
  readonly seen: SeenReceive[] = [];
  /** Called instead of receiving, for the next receive only. */
  refuseNext: (() => StreamedExit) | undefined;
  readonly #pool: Pool;

  constructor(pool: Pool) {
    this.#pool = pool;
  }

  spawn(argv: readonly string[], options: SpawnOptions = {}): StreamedCommand {
    const target = argv.at(-1)!;
    const refuse = this.refuseNext;
    this.refuseNext = undefined;
    const received = (bytes: Uint8Array): StreamedExit => {
      if (refuse) return refuse();
      const guid = /guid=(\d+);/.exec(new TextDecoder().decode(bytes.subarray(0, 64)))![1]!;
      this.#pool.set(target, { type: "filesystem", guid: "9", used: String(bytes.length) });
      this.#pool.set(`${target}@.backup-${guid}`, { type: "snapshot", guid, used: "0" });
      return { code: 0, stderr: "", killed: false };
    };
    if (typeof options.stdin === "object") {
      // Read from the descriptor's own offset, as zfs does: it must be at the file's start.
      const chunks: Uint8Array[] = [];
      for (;;) {
        const buf = new Uint8Array(65536);
        const n = readSync(options.stdin.fd, buf, 0, buf.length, null);
        if (n === 0) break;
        chunks.push(buf.subarray(0, n));
      }
      const bytes = joinChunks(chunks);
      this.seen.push({ stdin: "fd", bytes });
      const exit = received(bytes);
      return { stdin: null, stdout: null, exit: Promise.resolve(exit), kill: () => {} };
    }
    const chunks: Uint8Array[] = [];
    const done = Promise.withResolvers<StreamedExit>();
    const stdin = new WritableStream<Uint8Array>({
      write: (chunk) => void chunks.push(chunk.slice()),
      close: () => {
        const bytes = joinChunks(chunks);
        this.seen.push({ stdin: "piped", bytes });
        done.resolve(received(bytes));
      },
      abort: () => done.resolve({ code: 1, stderr: "invalid backup stream", killed: false }),
    });
    return { stdin, stdout: null, exit: done.promise, kill: () => {} };
  }
}

/** zfs get/set/rename/destroy over the fake pool; `beforeGet` may change the pool first. */
function fakeZfs(pool: Pool, beforeGet: () => void = () => {}) {
  const runner = new FakeRunner()
    .when((a) => a[1] === "get" && a.includes("-r"), (a) => {
      beforeGet();
      const root = a.at(-1)!;
      if (!pool.has(root)) return fails(`cannot open '${root}': dataset does not exist`);
      const props = a.at(-2)!.split(",");
      const lines = [...pool.entries()]
        .filter(([name]) => name === root || name.startsWith(`${root}@`))
        .flatMap(([name, p]) => props.map((k) => `${name}\t${k}\t${p[k as keyof typeof p]}\t-`));
      return { stdout: lines.join("\n") + "\n" };
    })
    .when((a) => a[1] === "get", (a) => {
      const name = a.at(-1)!;
      const p = pool.get(name);
      if (!p) return fails(`cannot open '${name}': dataset does not exist`);
      return { stdout: `${name}\tguid\t${p.guid}\t-\n` };
    })
    .on(["zfs", "set"], {})
    .on(["zfs", "rename"], (a) => {
      const [from, to] = [a.at(-2)!, a.at(-1)!];
      for (const [name, p] of [...pool.entries()]) {
        if (name === from || name.startsWith(`${from}@`)) {
          pool.delete(name);
          pool.set(to + name.slice(from.length), p);
        }
      }
      return {};
    })
    .on(["zfs", "destroy"], (a) => {
      const root = a.at(-1)!;
      for (const name of [...pool.keys()]) {
        if (name === root || name.startsWith(`${root}@`)) pool.delete(name);
      }
      return {};
    });
  return { runner, ...fakeTools(runner) };
}

/** A file store in /tmp holding the streams of a chain of a full and an incremental stream. */
async function chainInStore() {
  const root = await Deno.makeTempDir({ dir: "/tmp", prefix: "zfs-csi-restore-" });
  const store = new FileStore(root);
  const full = streamBytes("1001", 300_000);
  const inc = streamBytes("1002", 70_000);
  const chain = [manifest("1001", null, full), manifest("1002", "1001", inc)];
  await store.putBytes(chain[0]!.stream, full);
  await store.putBytes(chain[1]!.stream, inc);
  return {
    root,
    store,
    full,
    inc,
    chain,
    [Symbol.asyncDispose]: () => Deno.remove(root, { recursive: true }),
  };
}

const spec = (chain: readonly SnapshotManifest[]) => ({
  parentDataset: PARENT,
  chain,
  target: TARGET,
  properties: [["quota", "1073741824"]] as [string, string][],
});

const destroys = (runner: FakeRunner) => runner.argvs.filter((a) => a[1] === "destroy");

Deno.test("restoreVolume gives zfs receive a file store's full stream as its stdin, the incremental by pipe", async () => {
  await using s = await chainInStore();
  const pool: Pool = new Map();
  const receives = new FakeReceives(pool);
  const { runner, zfs, log } = fakeZfs(pool);
  await restoreVolume(
    { streams: receives, zfsPath: "zfs", zfs, store: s.store, log },
    spec(s.chain),
  );
  assert.deepEqual(receives.seen.map((r) => r.stdin), ["fd", "piped"]);
  assert.deepEqual(receives.seen[0]!.bytes, s.full, "zfs read the whole file from its start");
  assert.deepEqual(receives.seen[1]!.bytes, s.inc);
  assert.deepEqual([...pool.keys()].sort(), [
    TARGET,
    `${TARGET}@.backup-1001`,
    `${TARGET}@.backup-1002`,
  ]);
  assert.deepEqual(runner.argvs.find((a) => a[1] === "rename"), ["zfs", "rename", TEMP, TARGET]);
  assert.deepEqual(destroys(runner), []);
});

Deno.test("restoreVolume fails on a damaged full stream in a file store and destroys what zfs received of it", async () => {
  await using s = await chainInStore();
  const bad = s.full.slice();
  bad[bad.length - 1]! ^= 1;
  await s.store.putBytes(s.chain[0]!.stream, bad);
  const pool: Pool = new Map();
  const receives = new FakeReceives(pool);
  const { runner, zfs, log } = fakeZfs(pool);
  await assert.rejects(
    restoreVolume({ streams: receives, zfsPath: "zfs", zfs, store: s.store, log }, spec(s.chain)),
    (err) => err instanceof ReplicateError && err.kind === "checksum",
  );
  // zfs read the file while it was being checked, and completed the snapshot (the fake receives
  // at once): the check's failure destroyed it, and no volume was made.
  assert.deepEqual(receives.seen.map((r) => r.stdin), ["fd"], "one receive, from the file");
  assert.deepEqual(pool.size, 0);
  assert.deepEqual(destroys(runner), [["zfs", "destroy", "-r", TEMP]]);
});

Deno.test("restoreVolume checks a full stream an earlier receive completed before keeping it", async () => {
  await using s = await chainInStore();
  const bad = s.full.slice();
  bad[bad.length - 1]! ^= 1;
  await s.store.putBytes(s.chain[0]!.stream, bad);
  // A killed plugin's receive of the (damaged) file completed into the temporary dataset before
  // its check ended: the guid is the chain's, the bytes are not.
  const pool: Pool = new Map([
    [TEMP, { type: "filesystem", guid: "9", used: "1000" }],
    [`${TEMP}@.backup-1001`, { type: "snapshot", guid: "1001", used: "0" }],
  ]);
  const receives = new FakeReceives(pool);
  const { runner, zfs, log } = fakeZfs(pool);
  await assert.rejects(
    restoreVolume({ streams: receives, zfsPath: "zfs", zfs, store: s.store, log }, spec(s.chain)),
    (err) => err instanceof ReplicateError && err.kind === "checksum",
  );
  assert.equal(receives.seen.length, 0, "nothing received on top of it");
  assert.deepEqual(destroys(runner), [["zfs", "destroy", "-r", TEMP]]);
  assert.equal(pool.size, 0, "no volume, no temporary dataset");
});

Deno.test("restoreVolume waits for another process's receive into its temporary dataset and keeps its result", async () => {
  await using s = await chainInStore();
  // A killed plugin's zfs receive of the full stream is still writing into the temporary dataset.
  const pool: Pool = new Map([[TEMP, { type: "filesystem", guid: "9", used: "1000" }]]);
  let gets = 0;
  const { runner, zfs, log } = fakeZfs(pool, () => {
    gets++;
    const t = pool.get(TEMP);
    if (gets === 3 && t) t.used = "2000";
    if (gets === 5) pool.set(`${TEMP}@.backup-1001`, { type: "snapshot", guid: "1001", used: "0" });
  });
  const receives = new FakeReceives(pool);
  await restoreVolume(
    { streams: receives, zfsPath: "zfs", zfs, store: s.store, log, pollMs: 1, stallMs: 5_000 },
    spec(s.chain),
  );
  assert.deepEqual(receives.seen.map((r) => r.stdin), ["piped"], "only the incremental received");
  assert.deepEqual(receives.seen[0]!.bytes, s.inc);
  assert.ok(gets >= 5);
  assert.deepEqual(destroys(runner), [], "the dataset being received into was never destroyed");
  assert.deepEqual([...pool.keys()].sort(), [
    TARGET,
    `${TARGET}@.backup-1001`,
    `${TARGET}@.backup-1002`,
  ]);
});

Deno.test("restoreVolume gives up on a receive that makes no progress, and leaves its dataset alone", async () => {
  await using s = await chainInStore();
  const pool: Pool = new Map([[TEMP, { type: "filesystem", guid: "9", used: "1000" }]]);
  const receives = new FakeReceives(pool);
  const { runner, zfs, log } = fakeZfs(pool);
  await assert.rejects(
    restoreVolume(
      { streams: receives, zfsPath: "zfs", zfs, store: s.store, log, pollMs: 2, stallMs: 30 },
      spec(s.chain),
    ),
    (err) =>
      err instanceof CsiError && err.code === 9 && err.message.includes(TEMP) &&
      /no progress/.test(err.message),
  );
  assert.deepEqual(receives.seen, []);
  assert.deepEqual(destroys(runner), []);
  assert.ok(pool.has(TEMP));
});

Deno.test("restoreVolume waits for a receive that took its temporary dataset's name first", async () => {
  await using s = await chainInStore();
  const pool: Pool = new Map();
  const receives = new FakeReceives(pool);
  // The killed plugin's receive makes the dataset just as this one starts: zfs refuses this one.
  receives.refuseNext = () => {
    pool.set(TEMP, { type: "filesystem", guid: "9", used: "1000" });
    return {
      code: 1,
      stderr: `cannot receive new filesystem stream: destination '${TEMP}' exists\n`,
      killed: false,
    };
  };
  let gets = 0;
  const { runner, zfs, log } = fakeZfs(pool, () => {
    if (pool.has(TEMP) && ++gets === 4) {
      pool.set(`${TEMP}@.backup-1001`, { type: "snapshot", guid: "1001", used: "0" });
    }
  });
  await restoreVolume(
    { streams: receives, zfsPath: "zfs", zfs, store: s.store, log, pollMs: 1 },
    spec(s.chain),
  );
  assert.deepEqual(receives.seen.map((r) => r.stdin), ["fd", "piped"]);
  assert.deepEqual(destroys(runner), []);
  assert.ok(pool.has(`${TARGET}@.backup-1002`) && !pool.has(TEMP));
});

Deno.test("restoreVolume refuses a temporary dataset holding a snapshot not of its chain, destroying nothing", async () => {
  await using s = await chainInStore();
  const pool: Pool = new Map([
    [TEMP, { type: "filesystem", guid: "9", used: "1000" }],
    [`${TEMP}@.backup-1001`, { type: "snapshot", guid: "1001", used: "0" }],
    [`${TEMP}@mine`, { type: "snapshot", guid: "4242", used: "0" }],
  ]);
  const receives = new FakeReceives(pool);
  const { runner, zfs, log } = fakeZfs(pool);
  await assert.rejects(
    restoreVolume({ streams: receives, zfsPath: "zfs", zfs, store: s.store, log }, spec(s.chain)),
    (err) => err instanceof CsiError && err.code === 9 && err.message.includes(`${TEMP}@mine`),
  );
  assert.deepEqual(receives.seen, []);
  assert.deepEqual(destroys(runner), []);
});

Deno.test("restoreVolume destroys its temporary dataset when a later stream fails", async () => {
  await using s = await chainInStore();
  const pool: Pool = new Map();
  const receives = new FakeReceives(pool);
  const { runner, zfs, log } = fakeZfs(pool);
  const bad = s.inc.slice();
  bad[10]! ^= 1;
  await s.store.putBytes(s.chain[1]!.stream, bad);
  await assert.rejects(
    restoreVolume({ streams: receives, zfsPath: "zfs", zfs, store: s.store, log }, spec(s.chain)),
    (err) => err instanceof ReplicateError && err.kind === "checksum",
  );
  assert.deepEqual(destroys(runner), [["zfs", "destroy", "-r", TEMP]]);
  assert.equal(pool.size, 0);
});

Deno.test("restoreVolume keeps what a receive that took its temporary dataset's name first completed", async () => {
  await using s = await chainInStore();
  const pool: Pool = new Map();
  const receives = new FakeReceives(pool);
  // The other receive was faster than this restore's check of the file: it is done already.
  receives.refuseNext = () => {
    pool.set(TEMP, { type: "filesystem", guid: "9", used: "1000" });
    pool.set(`${TEMP}@.backup-1001`, { type: "snapshot", guid: "1001", used: "0" });
    return {
      code: 1,
      stderr: `cannot receive new filesystem stream: destination '${TEMP}' exists\n`,
      killed: false,
    };
  };
  const { runner, zfs, log } = fakeZfs(pool);
  await restoreVolume(
    { streams: receives, zfsPath: "zfs", zfs, store: s.store, log, pollMs: 1 },
    spec(s.chain),
  );
  assert.deepEqual(receives.seen.map((r) => r.stdin), ["fd", "piped"]);
  assert.deepEqual(destroys(runner), [], "the other receive's result was kept, not destroyed");
  assert.ok(pool.has(`${TARGET}@.backup-1001`) && pool.has(`${TARGET}@.backup-1002`));
});
