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
import { excludedOnReceive, RESTORE_TOKEN_PROPERTY } from "./stream_properties.ts";

const PARENT = "tank/nomad";
const TARGET = `${PARENT}/vol`;
const TEMP = restoreTempDataset(PARENT, TARGET);
const encoder = new TextEncoder();

/** What a fake stream says about itself, besides its guid. */
interface StreamOptions {
  /** The received snapshot's name (default `.backup-<guid>`, as the manifests name it). */
  readonly name?: string;
  /** Properties the stream carries (as `zfs send -p` puts them in it). */
  readonly props?: Readonly<Record<string, string>>;
  /** A zvol's stream: zfs makes a volume of it. */
  readonly volume?: boolean;
}

/**
 * A stream whose first bytes say what the fake zfs receives from it (its guid, its snapshot's
 * name, the properties it carries), plus filler.
 */
function streamBytes(guid: string, size: number, opts: StreamOptions = {}): Uint8Array {
  const bytes = new Uint8Array(size);
  for (let i = 0; i < size; i++) bytes[i] = (i * 13 + 5) & 0xff;
  const props = Object.entries(opts.props ?? {}).map(([k, v]) => `${k}:${v}`).join(",");
  const type = opts.volume ? "volume" : "filesystem";
  bytes.set(
    encoder.encode(`guid=${guid};name=${opts.name ?? `.backup-${guid}`};props=${props};${type};`),
  );
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

/** A property's value and where it came from, as `zfs get` says. */
interface Value {
  value: string;
  source: string;
}

/** Datasets and snapshots of the fake pool: name → type, guid, used and other properties. */
type Pool = Map<string, { type: string; guid: string; used: string; props?: Map<string, Value> }>;

/** The properties of `name` (made empty when it has none yet). */
function propsOf(pool: Pool, name: string): Map<string, Value> {
  const p = pool.get(name)!;
  return p.props ??= new Map();
}

/** Every `-x` and `-o` of a zfs receive argv. */
function receiveFlags(argv: readonly string[]) {
  const excluded = new Set<string>();
  const local = new Map<string, string>();
  for (let i = 0; i < argv.length; i++) {
    if (argv[i] === "-x") excluded.add(argv[++i]!);
    if (argv[i] === "-o") {
      const [k, ...v] = argv[++i]!.split("=");
      local.set(k!, v.join("="));
    }
  }
  return { excluded, local };
}

/** One receive the fake stream runner saw: how its stdin came, and the bytes zfs read. */
interface SeenReceive {
  readonly stdin: "piped" | "fd";
  readonly bytes: Uint8Array;
  readonly argv: readonly string[];
}

/**
 * zfs receive over the fake pool: reads its stdin (a descriptor or a pipe), makes the dataset
 * (with its `-o` properties set locally) and the snapshot the stream names, and gives the dataset
 * the stream's properties with source "received", except those excluded with `-x`.
 */
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
      const head = new TextDecoder().decode(bytes.subarray(0, 200));
      const [, guid, name, carried, type] =
        /guid=(\d+);name=([^;]*);props=([^;]*);(filesystem|volume);/.exec(head)!;
      const { excluded, local } = receiveFlags(argv);
      // OpenZFS refuses a (non-recursive) receive told to exclude what its type does not have.
      const alien = type === "volume"
        ? [...excluded].find((p) => ["mountpoint", "canmount", "quota", "recordsize"].includes(p))
        : [...excluded].find((p) => p === "volmode" || p === "snapdev");
      if (alien) {
        return {
          code: 1,
          stderr: `cannot receive new filesystem stream: property '${alien}' does not apply ` +
            `to datasets of this type\n`,
          killed: false,
        };
      }
      if (!this.#pool.has(target)) {
        this.#pool.set(target, { type: type!, guid: "9", used: String(bytes.length) });
        for (const [k, v] of local) {
          propsOf(this.#pool, target).set(k, { value: v, source: "local" });
        }
      }
      for (const pair of carried!.split(",").filter((p) => p !== "")) {
        const [k, ...v] = pair.split(":");
        const key = k!.includes(".") ? `${k}:${v.shift()}` : k!;
        const props = propsOf(this.#pool, target);
        if (excluded.has(key) || props.get(key)?.source === "local") continue;
        props.set(key, { value: v.join(":"), source: "received" });
      }
      this.#pool.set(`${target}@${name}`, { type: "snapshot", guid: guid!, used: "0" });
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
      this.seen.push({ stdin: "fd", bytes, argv });
      const exit = received(bytes);
      return { stdin: null, stdout: null, exit: Promise.resolve(exit), kill: () => {} };
    }
    const chunks: Uint8Array[] = [];
    const done = Promise.withResolvers<StreamedExit>();
    const stdin = new WritableStream<Uint8Array>({
      write: (chunk) => void chunks.push(chunk.slice()),
      close: () => {
        const bytes = joinChunks(chunks);
        this.seen.push({ stdin: "piped", bytes, argv });
        done.resolve(received(bytes));
      },
      abort: () => done.resolve({ code: 1, stderr: "invalid backup stream", killed: false }),
    });
    return { stdin, stdout: null, exit: done.promise, kill: () => {} };
  }
}

/** How the fake zfs answers what OpenZFS and zfs-fuse answer differently. */
interface FakeZfsOptions {
  /** `beforeGet` may change the pool first. */
  readonly beforeGet?: () => void;
  /** Whether zfs receive takes `-x`/`-o` (OpenZFS) or refuses them (zfs-fuse, the default). */
  readonly overrides?: boolean;
  /** Properties `zfs get` does not know (for the `-x` list). */
  readonly unknown?: readonly string[];
}

/** zfs get/set/inherit/rename/destroy over the fake pool. */
function fakeZfs(pool: Pool, opts: FakeZfsOptions | (() => void) = {}) {
  const { beforeGet = () => {}, overrides = false, unknown = [] } = typeof opts === "function"
    ? { beforeGet: opts }
    : opts;
  const value = (name: string, k: string): Value => {
    const p = pool.get(name)!;
    if (k === "type" || k === "guid" || k === "used") return { value: p[k], source: "-" };
    return p.props?.get(k) ?? { value: "-", source: "-" };
  };
  const runner = new FakeRunner()
    .when(
      (a) => a[1] === "receive" && a.includes("-n"),
      () =>
        overrides
          ? fails("cannot receive: failed to read from stream\n")
          : fails("invalid option 'x'\nusage:\n\treceive [-vnF] <filesystem|volume|snapshot>\n", 2),
    )
    .when((a) => a[1] === "get" && a.includes("-s"), (a) => {
      const names = a.slice(a.indexOf("all") + 1);
      const missing = names.find((n) => !pool.has(n));
      if (missing) return fails(`cannot open '${missing}': dataset does not exist`);
      const sources = a[a.indexOf("-s") + 1]!.split(",");
      const lines = names.flatMap((name) =>
        [...pool.get(name)!.props ?? []].filter(([, v]) => sources.includes(v.source))
          .map(([k, v]) => `${name}\t${k}\t${v.value}\t${v.source}`)
      );
      return { stdout: lines.map((l) => `${l}\n`).join("") };
    })
    .when((a) => a[1] === "get" && a.includes("-r"), (a) => {
      beforeGet();
      const root = a.at(-1)!;
      if (!pool.has(root)) return fails(`cannot open '${root}': dataset does not exist`);
      const props = a.at(-2)!.split(",");
      const lines = [...pool.entries()]
        .filter(([name]) => name === root || name.startsWith(`${root}@`))
        .flatMap(([name]) =>
          props.map((k) => {
            const v = value(name, k);
            return `${name}\t${k}\t${v.value}\t${v.source}`;
          })
        );
      return { stdout: lines.join("\n") + "\n" };
    })
    .when((a) => a[1] === "get" && a.at(-1) === PARENT, (a) => {
      const bad = a.at(-2)!.split(",").find((k) => unknown.includes(k));
      if (bad) return fails(`bad property list: invalid property '${bad}'\n`, 2);
      return { stdout: a.at(-2)!.split(",").map((k) => `${PARENT}\t${k}\t-\t-\n`).join("") };
    })
    .when((a) => a[1] === "get", (a) => {
      const name = a.at(-1)!;
      const p = pool.get(name);
      if (!p) return fails(`cannot open '${name}': dataset does not exist`);
      return { stdout: `${name}\tguid\t${p.guid}\t-\n` };
    })
    .on(["zfs", "set"], (a) => {
      const name = a.at(-1)!;
      if (!pool.has(name)) return fails(`cannot open '${name}': dataset does not exist`);
      for (const kv of a.slice(2, -1)) {
        const [k, ...v] = kv.split("=");
        propsOf(pool, name).set(k!, { value: v.join("="), source: "local" });
      }
      return {};
    })
    .on(["zfs", "inherit"], (a) => {
      const [k, name] = [a.at(-2)!, a.at(-1)!];
      propsOf(pool, name).set(k, { value: "-", source: "inherited from tank" });
      return {};
    })
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

/** A chain of one full stream `bytes` (manifest guid 1001) in a file store. */
async function fullInStore(bytes: Uint8Array, guid = "1001") {
  const root = await Deno.makeTempDir({ dir: "/tmp", prefix: "zfs-csi-restore-" });
  const store = new FileStore(root);
  const m = { ...manifest(guid, null, bytes) };
  await store.putBytes(m.stream, bytes);
  return {
    root,
    store,
    chain: [m],
    [Symbol.asyncDispose]: () => Deno.remove(root, { recursive: true }),
  };
}

/** A stream carrying what the issue's hostile store writer puts in one. */
const HOSTILE = {
  mountpoint: "/etc/cron.d",
  setuid: "on",
  devices: "on",
  "other.tool:x": "1",
  "org.zfs-csi:managed": "yes",
};

Deno.test("restoreVolume removes what it received when the snapshot's guid is not the manifest's, and the same restore works once the store is repaired", async () => {
  // The stored file is another snapshot's stream (same name, guid 4242), with the manifest's
  // size and SHA-256 made to match it: the checks of the bytes pass, the guid check does not.
  const wrong = streamBytes("4242", 50_000, { name: ".backup-1001" });
  await using s = await fullInStore(wrong);
  const pool: Pool = new Map();
  const receives = new FakeReceives(pool);
  const { zfs, log } = fakeZfs(pool);
  const deps = { streams: receives, zfsPath: "zfs", zfs, store: s.store, log };
  await assert.rejects(
    restoreVolume(deps, spec(s.chain)),
    (err) => err instanceof ReplicateError && err.kind === "guid",
  );
  assert.deepEqual([...pool.keys()], [], "nothing left: the temporary dataset was this restore's");
  // Repaired: the right stream and its manifest.
  const right = streamBytes("1001", 50_000);
  const repaired = [manifest("1001", null, right)];
  await s.store.putBytes(repaired[0]!.stream, right);
  await restoreVolume(deps, spec(repaired));
  assert.deepEqual([...pool.keys()].sort(), [TARGET, `${TARGET}@.backup-1001`]);
});

Deno.test("restoreVolume removes a temporary dataset it took over from an earlier receive when a later stream fails its guid check", async () => {
  await using s = await chainInStore();
  // An earlier (killed) plugin's receive completed the full stream; this restore checks it,
  // keeps it, and then receives an incremental whose snapshot is not the manifest's.
  const pool: Pool = new Map([
    [TEMP, { type: "filesystem", guid: "9", used: "1000" }],
    [`${TEMP}@.backup-1001`, { type: "snapshot", guid: "1001", used: "0" }],
  ]);
  const wrong = streamBytes("4343", 70_000, { name: ".backup-1002" });
  const chain = [s.chain[0]!, manifest("1002", "1001", wrong)];
  await s.store.putBytes(chain[1]!.stream, wrong);
  const receives = new FakeReceives(pool);
  const { zfs, log } = fakeZfs(pool);
  const deps = { streams: receives, zfsPath: "zfs", zfs, store: s.store, log };
  await assert.rejects(
    restoreVolume(deps, spec(chain)),
    (err) => err instanceof ReplicateError && err.kind === "guid",
  );
  assert.deepEqual([...pool.keys()], [], "the temporary dataset went, with what it received");
  await s.store.putBytes(s.chain[1]!.stream, s.inc);
  await restoreVolume(deps, spec(s.chain));
  assert.ok(pool.has(`${TARGET}@.backup-1002`) && !pool.has(TEMP));
});

Deno.test("restoreVolume refuses a stream that decided properties (zfs without -x) and removes what it received", async () => {
  const hostile = streamBytes("1001", 50_000, { props: HOSTILE });
  await using s = await fullInStore(hostile);
  const pool: Pool = new Map();
  const receives = new FakeReceives(pool);
  const { runner, zfs, log } = fakeZfs(pool);
  await assert.rejects(
    restoreVolume({ streams: receives, zfsPath: "zfs", zfs, store: s.store, log }, spec(s.chain)),
    (err) =>
      err instanceof ReplicateError && err.kind === "properties" &&
      err.message.includes(`mountpoint="/etc/cron.d" on "${TEMP}"`) &&
      err.message.includes(`other.tool:x="1"`) && err.message.includes(s.chain[0]!.stream),
  );
  assert.deepEqual([...pool.keys()], [], "no volume, no temporary dataset");
  assert.deepEqual(runner.argvs.filter((a) => a[1] === "rename"), [], "never renamed into place");
  // zfs-fuse: no -x, no -o; the restore's mark is set right after the receive.
  assert.deepEqual(receives.seen[0]!.argv, ["zfs", "receive", "-u", TEMP]);
});

Deno.test("restoreVolume excludes what a stream may not decide (-x), marks its dataset at creation (-o), and refuses what is left", async () => {
  const hostile = streamBytes("1001", 50_000, { props: HOSTILE });
  await using s = await fullInStore(hostile);
  const pool: Pool = new Map();
  const receives = new FakeReceives(pool);
  const { zfs, log } = fakeZfs(pool, { overrides: true, unknown: ["aclmode", "vscan"] });
  await assert.rejects(
    restoreVolume({ streams: receives, zfsPath: "zfs", zfs, store: s.store, log }, spec(s.chain)),
    (err) =>
      err instanceof ReplicateError && err.kind === "properties" &&
      // The foreign user property is not on the -x list: the check after the receive finds it.
      err.message.includes(`other.tool:x="1"`) && !err.message.includes("mountpoint"),
  );
  assert.deepEqual([...pool.keys()], []);
  const argv = receives.seen[0]!.argv;
  const { excluded, local } = receiveFlags(argv);
  assert.deepEqual(argv.slice(0, 3), ["zfs", "receive", "-u"]);
  assert.deepEqual(argv.at(-1), TEMP);
  assert.deepEqual(
    [...excluded],
    excludedOnReceive(false).filter((p) =>
      p !== "aclmode" && p !== "vscan" && p !== RESTORE_TOKEN_PROPERTY
    ),
  );
  assert.deepEqual([...local.keys()], [RESTORE_TOKEN_PROPERTY]);
  assert.match(local.get(RESTORE_TOKEN_PROPERTY)!, /^[0-9a-f]{32}$/);
});

Deno.test("restoreVolume keeps a stream whose properties were all excluded (-x), none decided by it", async () => {
  const { "other.tool:x": _, ...excludable } = HOSTILE;
  await using s = await chainInStore();
  const full = streamBytes("1001", 300_000, { props: excludable });
  const chain = [manifest("1001", null, full), s.chain[1]!];
  await s.store.putBytes(chain[0]!.stream, full);
  const pool: Pool = new Map();
  const receives = new FakeReceives(pool);
  const { zfs, log } = fakeZfs(pool, { overrides: true });
  await restoreVolume({ streams: receives, zfsPath: "zfs", zfs, store: s.store, log }, spec(chain));
  const props = pool.get(TARGET)!.props!;
  assert.deepEqual([...props].filter(([, v]) => v.source === "received"), []);
  assert.equal(props.get("mountpoint"), undefined, "the stream's mountpoint never landed");
  assert.equal(props.get("org.zfs-csi:managed")?.source, "local", "the plugin's own marker");
  // The incremental is told the same, without the mark (only a new dataset takes -o).
  const inc = receiveFlags(receives.seen[1]!.argv);
  assert.deepEqual([...inc.excluded], excludedOnReceive(false));
  assert.deepEqual([...inc.local], []);
});

/**
 * zfs-fuse's zfs receive of a file: the zfs process hands the open file to the zfs-fuse daemon,
 * which reads it itself, and killing the process does not stop the daemon. The daemon makes the
 * temporary dataset (no snapshot yet) a moment after the spawn, then, `finishMs` after the
 * spawn, either completes the snapshot (`completes`, the stream's own guid: a flipped byte in
 * the data) or removes the dataset; zfs exits then (0 or 1), or at once when killed.
 * `finishMs` undefined: the daemon only finishes when the `gets`-th recursive `zfs get` comes.
 */
class DaemonReceives implements StreamRunner {
  readonly #pool: Pool;
  readonly #completes: boolean;
  readonly #finishMs: number | undefined;
  /** Settled when the daemon is done with the dataset. */
  readonly done = Promise.withResolvers<void>();
  #finishExit: ((exit: StreamedExit) => void) | undefined;
  #target = "";

  constructor(pool: Pool, completes: boolean, finishMs: number | undefined) {
    this.#pool = pool;
    this.#completes = completes;
    this.#finishMs = finishMs;
  }

  spawn(argv: readonly string[]): StreamedCommand {
    this.#target = argv.at(-1)!;
    const exit = Promise.withResolvers<StreamedExit>();
    this.#finishExit = exit.resolve;
    setTimeout(() => {
      this.#pool.set(this.#target, { type: "filesystem", guid: "9", used: "1000" });
    }, this.#finishMs === undefined ? 0 : this.#finishMs / 2);
    if (this.#finishMs !== undefined) setTimeout(() => this.finish(), this.#finishMs);
    return {
      stdin: null,
      stdout: null,
      exit: exit.promise,
      kill: () => exit.resolve({ code: 143, stderr: "", killed: true }),
    };
  }

  /** The daemon ends the receive: completes the snapshot or removes the dataset. */
  finish(): void {
    if (this.#completes) {
      this.#pool.set(`${this.#target}@.backup-1001`, { type: "snapshot", guid: "1001", used: "0" });
    } else this.#pool.delete(this.#target);
    this.#finishExit?.(
      this.#completes ? { code: 0, stderr: "", killed: false } : {
        code: 1,
        stderr: "cannot receive: invalid stream (checksum mismatch)\n",
        killed: false,
      },
    );
    this.done.resolve();
  }
}

/** A chain in a file store whose full stream has a flipped byte. */
async function damagedChainInStore() {
  const s = await chainInStore();
  const bad = s.full.slice();
  bad[bad.length - 1]! ^= 1;
  await s.store.putBytes(s.chain[0]!.stream, bad);
  return s;
}

for (const completes of [true, false]) {
  Deno.test(`restoreVolume lets zfs end the receive of a file that failed its check, then leaves nothing (zfs-fuse's daemon ${completes ? "completes" : "abandons"} it)`, async () => {
    await using s = await damagedChainInStore();
    const pool: Pool = new Map();
    const { runner, zfs, log } = fakeZfs(pool);
    const receives = new DaemonReceives(pool, completes, 200);
    await assert.rejects(
      restoreVolume({ streams: receives, zfsPath: "zfs", zfs, store: s.store, log }, spec(s.chain)),
      (err) => err instanceof ReplicateError && err.kind === "checksum",
    );
    await receives.done.promise;
    assert.deepEqual([...pool.keys()], [], "nothing left once zfs is done");
    assert.deepEqual(destroys(runner), completes ? [["zfs", "destroy", "-r", TEMP]] : []);
  });

  Deno.test(`restoreVolume waits until zfs-fuse's daemon is done with a receive killed after a failed check, then leaves nothing (${completes ? "completed" : "abandoned"} by zfs)`, async () => {
    await using s = await damagedChainInStore();
    const pool: Pool = new Map();
    const receives = new DaemonReceives(pool, completes, undefined);
    let gets = 0;
    const { runner, zfs, log } = fakeZfs(pool, () => {
      if (++gets < 4 || !pool.has(TEMP)) return;
      if (gets === 4) pool.get(TEMP)!.used = "2000";
      if (gets === 6) receives.finish();
    });
    await assert.rejects(
      restoreVolume(
        {
          streams: receives,
          zfsPath: "zfs",
          zfs,
          store: s.store,
          log,
          pollMs: 1,
          stallMs: 5_000,
          stopWaitMs: 1,
        },
        spec(s.chain),
      ),
      (err) => err instanceof ReplicateError && err.kind === "checksum",
    );
    assert.deepEqual([...pool.keys()], [], "nothing left when the call answers");
    assert.deepEqual(destroys(runner), completes ? [["zfs", "destroy", "-r", TEMP]] : []);
  });
}

/** A zvol's chain (manifests saying so, streams zfs makes a volume of) in a file store. */
async function zvolChainInStore() {
  const root = await Deno.makeTempDir({ dir: "/tmp", prefix: "zfs-csi-restore-" });
  const store = new FileStore(root);
  const zvol = { content: "ext4" as const, volblocksize: 16384, formatted: true };
  const full = streamBytes("1001", 30_000, { volume: true });
  const inc = streamBytes("1002", 7_000, { volume: true });
  const chain = [
    { ...manifest("1001", null, full), zvol },
    { ...manifest("1002", "1001", inc), zvol },
  ];
  await store.putBytes(chain[0]!.stream, full);
  await store.putBytes(chain[1]!.stream, inc);
  return { store, chain, [Symbol.asyncDispose]: () => Deno.remove(root, { recursive: true }) };
}

Deno.test("restoreVolume of a zvol's chain excludes only what applies to volumes (-x), and makes a zvol", async () => {
  await using s = await zvolChainInStore();
  const pool: Pool = new Map();
  const receives = new FakeReceives(pool);
  const { zfs, log } = fakeZfs(pool, { overrides: true });
  await restoreVolume(
    { streams: receives, zfsPath: "zfs", zfs, store: s.store, log },
    { ...spec(s.chain), properties: [["refreservation", "auto"]] },
  );
  assert.equal(pool.get(TARGET)?.type, "volume");
  assert.equal(pool.get(TARGET)?.props?.get("refreservation")?.source, "local");
  for (const seen of receives.seen) {
    const { excluded } = receiveFlags(seen.argv);
    assert.deepEqual([...excluded].filter((p) => p !== RESTORE_TOKEN_PROPERTY), [
      ...excludedOnReceive(false, true).filter((p) => p !== RESTORE_TOKEN_PROPERTY),
    ]);
    assert.ok(!excluded.has("mountpoint") && excluded.has("volmode"));
  }
});

Deno.test("restoreVolume refuses a chain mixing a zvol's and a dataset's streams, before any receive", async () => {
  await using s = await zvolChainInStore();
  const pool: Pool = new Map();
  const receives = new FakeReceives(pool);
  const { zfs, log } = fakeZfs(pool, { overrides: true });
  const { zvol: _, ...plain } = s.chain[1]!;
  await assert.rejects(
    restoreVolume(
      { streams: receives, zfsPath: "zfs", zfs, store: s.store, log },
      spec([s.chain[0]!, plain]),
    ),
    (err) =>
      err instanceof CsiError && /mixes streams of a zvol and of a dataset/.test(err.message),
  );
  assert.deepEqual(receives.seen, []);
  assert.deepEqual([...pool.keys()], []);
});

Deno.test("restoreVolume of a zvol's chain refuses a temporary dataset that is a filesystem, destroying nothing", async () => {
  await using s = await zvolChainInStore();
  const pool: Pool = new Map([[TEMP, { type: "filesystem", guid: "7", used: "0" }]]);
  pool.set(`${TEMP}@.backup-1001`, { type: "snapshot", guid: "1001", used: "0" });
  const receives = new FakeReceives(pool);
  const { zfs, log, runner } = fakeZfs(pool, { overrides: true });
  await assert.rejects(
    restoreVolume({ streams: receives, zfsPath: "zfs", zfs, store: s.store, log }, spec(s.chain)),
    (err) => err instanceof CsiError && /not a volume/.test(err.message),
  );
  assert.deepEqual(destroys(runner), []);
  assert.deepEqual(receives.seen, []);
});
