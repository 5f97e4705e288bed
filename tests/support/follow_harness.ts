/**
 * A node's follow side on a {@linkcode FakePool} and a {@linkcode MemoryStore}, for the unit
 * tests of src/follow/: the parent dataset, the volume "pg" (its owner object, its stored
 * manifests, a node holding it) and the deps that FollowVolumes, SizedFollowVolumes and
 * StandbyFollower are built on. Nothing is started: zfs answers from the pool, and `zfs receive`
 * from a {@linkcode FakeStreamRunner}.
 */

import {
  acquire,
  type AcquireOptions,
  createOwner,
  type FollowSettings,
  type Holding,
} from "../../src/follow/owner.ts";
import { type CopyDeps, type FollowDeps, FollowVolumes } from "../../src/follow/mover.ts";
import type { NodeService } from "../../src/csi/node.ts";
import { KeyedLock } from "../../src/lock.ts";
import type { BackupOutcome } from "../../src/replicate/backup.ts";
import { encodeJson } from "../../src/store/chain.ts";
import { manifestKey, type SnapshotManifest, streamKey } from "../../src/store/layout.ts";
import {
  type ObjectBytes,
  type PutResult,
  type Store,
  type StoredObject,
  StoreError,
  type TransferOptions,
  type WriteCondition,
} from "../../src/store/store.ts";
import { FakePool } from "./fake_pool.ts";
import { type FakeResponse, FakeRunner, fakeTools } from "./fake_runner.ts";
import { FakeStreamRunner, type StreamScript } from "./fake_stream_runner.ts";
import { MemoryStore } from "./memory_store.ts";
import { fakeNode, fakeServices } from "./service_harness.ts";

/** The plugin's parent dataset (marked managed in the harness's pool). */
export const PARENT = "tank/nomad";
/** Where this node keeps its copy of the volume "pg". */
export const DATASET = `${PARENT}/pg`;
/** The volume uid of every owner object and manifest made here. */
const UID = "b".repeat(32);
/** The lease every owner object and holding made here has. */
const TTL_SECONDS = 30;

/** A takeover rule: when another node holds a volume, whether this one may take it. */
export type TakeoverRule = AcquireOptions["mayTakeOver"];

/** The rule of a node that never takes a held volume over. */
export function neverTakeOver(): { ok: false; message: string } {
  return { ok: false, message: "held" };
}

/** The rule of a node that may take any held volume over. */
export function alwaysTakeOver(): { ok: true } {
  return { ok: true };
}

/**
 * A stored snapshot's manifest: volume "pg" (or `fields.volume`), a full stream when `baseGuid`
 * is null, created `guid` seconds after 2026-01-01T00:00:00Z by node "n1"; `fields` replaces any
 * of that.
 */
export function followManifest(
  guid: string,
  baseGuid: string | null,
  fields: Partial<SnapshotManifest> = {},
): SnapshotManifest {
  const volume = fields.volume ?? "pg";
  return {
    format: 1,
    volume,
    volumeUid: UID,
    guid,
    baseGuid,
    snapshot: `.backup-${guid}`,
    kind: "scheduled",
    createdAt: `2026-01-01T00:00:${guid.padStart(2, "0")}Z`,
    stream: streamKey(volume, guid, "c".repeat(16)),
    size: 10,
    sha256: "0".repeat(64),
    raw: false,
    node: "n1",
    capacityBytes: 0,
    ...fields,
  };
}

/** What {@linkcode storeManifests} writes besides the manifests. */
export interface StoreManifestsOptions {
  /** The bytes of each manifest's stream, stored under its key; without it no stream is. */
  readonly stream?: (manifest: SnapshotManifest) => Uint8Array;
}

/** Writes the manifests (and with `options.stream` their streams) to the store, in order. */
export async function storeManifests(
  store: Store,
  manifests: readonly SnapshotManifest[],
  options: StoreManifestsOptions = {},
): Promise<void> {
  for (const m of manifests) {
    await store.putBytes(manifestKey(m.volume, m.guid), encodeJson(m));
    if (options.stream) await store.putBytes(m.stream, options.stream(m));
  }
}

/** The follow volume {@linkcode createFollowOwner} makes. */
export interface FollowOwnerOptions {
  /** Its name and owner key (default "pg"). */
  readonly name?: string;
  /** Default: unlimited, no properties. */
  readonly settings?: FollowSettings;
  /** The nodes standing by for it (default none). */
  readonly standbys?: readonly string[];
}

/** Creates a released follow volume's owner object with no head, at time 0. */
export async function createFollowOwner(
  store: Store,
  options: FollowOwnerOptions = {},
): Promise<void> {
  const name = options.name ?? "pg";
  await createOwner(store, name, {
    volume: name,
    uid: UID,
    ttlSeconds: TTL_SECONDS,
    settings: options.settings ?? { capacityBytes: 0, properties: {} },
    ...(options.standbys ? { standbys: options.standbys } : {}),
    nowMs: 0,
  });
}

/** How {@linkcode holdAs} acquires. */
export interface HoldOptions {
  /** The volume (default "pg"). */
  readonly name?: string;
  /** Default 0. */
  readonly nowMs?: number;
  /** Default {@linkcode neverTakeOver}. */
  readonly mayTakeOver?: TakeoverRule;
}

/**
 * Makes `node` the volume's holder, as its stage does, and returns the holding.
 * @throws {HeldElsewhereError} when another node holds it and the rule refuses
 */
export async function holdAs(
  store: Store,
  node: string,
  options: HoldOptions = {},
): Promise<Holding> {
  const { holding } = await acquire(store, options.name ?? "pg", {
    node,
    nowMs: options.nowMs ?? 0,
    ttlSeconds: TTL_SECONDS,
    mayTakeOver: options.mayTakeOver ?? neverTakeOver,
  });
  return holding;
}

/** What differs between the follow tests' nodes. */
export interface FollowHarnessOptions {
  /** The node the deps are for (default "n1"). */
  readonly node?: string | undefined;
  /** What each `zfs receive` does, on the harness's pool (default: fails, none expected). */
  readonly receive?: ((argv: readonly string[], pool: FakePool) => StreamScript) | undefined;
  /** The store receives download from, made from the harness's (default: that store). */
  readonly receiveStore?: ((store: MemoryStore) => Store) | undefined;
  /** What each backup answers (default: it rejects, none expected). */
  readonly backup?: (() => Promise<BackupOutcome>) | undefined;
  /** The lease the node promises (default FollowVolumes' own). */
  readonly ttlSeconds?: number | undefined;
}

/** Everything a follow test builds on and looks at. */
export interface FollowHarness {
  readonly runner: FakeRunner;
  /** The node's pool, with only the managed parent dataset in it. */
  readonly pool: FakePool;
  readonly store: MemoryStore;
  /** Every `zfs receive` spawned. */
  readonly streams: FakeStreamRunner;
  /** The datasets backed up, oldest first. */
  readonly backups: string[];
  /** What the node's copies are handled with, with a KeyedLock of its own. */
  readonly copyDeps: CopyDeps;
  /** `copyDeps` (the same locks) plus the holder's backup and lease: for FollowVolumes. */
  readonly deps: FollowDeps;
}

/** A fresh node, its pool and an empty store; `options` says what differs. */
export function followHarness(options: FollowHarnessOptions = {}): FollowHarness {
  const runner = new FakeRunner();
  const pool = new FakePool(runner);
  // A long timeout: some tests hold a command back on purpose.
  const { zfs, log } = fakeTools(runner, undefined, 10_000);
  const store = new MemoryStore();
  pool.add(PARENT, { "org.zfs-csi:managed": ["-", "-"] });
  const receive = options.receive;
  const streams = new FakeStreamRunner((argv) =>
    receive ? receive(argv, pool) : { code: 1, stderr: "no receives here" }
  );
  const copyDeps: CopyDeps = {
    zfs,
    store,
    locks: new KeyedLock(),
    trash: {
      inspect: () => Promise.reject(new Error("nothing is set aside in these tests")),
      removeVolume: () => Promise.reject(new Error("nothing is set aside in these tests")),
    },
    log,
    parentDataset: PARENT,
    node: options.node ?? "n1",
    receive: {
      streams,
      zfsPath: "zfs",
      zfs,
      store: options.receiveStore?.(store) ?? store,
      log,
    },
  };
  const backups: string[] = [];
  const deps: FollowDeps = {
    ...copyDeps,
    ...(options.ttlSeconds === undefined ? {} : { ttlSeconds: options.ttlSeconds }),
    backup: (dataset) => {
      backups.push(dataset);
      return options.backup?.() ?? Promise.reject(new Error("no backups expected"));
    },
  };
  return { runner, pool, store, streams, backups, copyDeps, deps };
}

/** Lets every promise chain and zero-delay timer the fakes started run to where it waits. */
export async function settle(turns = 40): Promise<void> {
  for (let i = 0; i < turns; i++) await new Promise((r) => setTimeout(r, 0));
}

/**
 * Settles until `done` says so, or fails saying `what` (the fakes answer without delay, so a
 * bounded number of turns is enough: this measures no time).
 */
export async function settleUntil(what: string, done: () => boolean): Promise<void> {
  for (let i = 0; i < 400 && !done(); i++) await new Promise((r) => setTimeout(r, 0));
  if (!done()) throw new Error(`never happened: ${what}`);
}

/**
 * Clocks and one-shot timers that move only when a test says so, for FollowVolumes'
 * `now`, `monotonic` and `timers`: {@linkcode advance} runs each timer that falls due, in order,
 * at its own instant, and lets what it started settle before the next.
 */
export class VirtualTime {
  /** Monotonic ms. */
  mono = 0;
  /** Wall clock, ms since the epoch. */
  wall = Date.UTC(2026, 0, 1);
  readonly #due = new Map<number, { at: number; fn: () => void }>();
  #ids = 0;
  readonly now = (): number => this.wall;
  readonly monotonic = (): number => this.mono;
  readonly timers = {
    after: (fn: () => void, ms: number): () => void => {
      const id = ++this.#ids;
      this.#due.set(id, { at: this.mono + Math.max(0, ms), fn });
      return () => this.#due.delete(id);
    },
  };

  /** How many timers are set. */
  get pending(): number {
    return this.#due.size;
  }

  /** Moves both clocks `ms` forward; see the class doc. */
  async advance(ms: number): Promise<void> {
    const end = this.mono + ms;
    for (;;) {
      let next: [number, { at: number; fn: () => void }] | undefined;
      for (const entry of this.#due) {
        if (entry[1].at <= end && (!next || entry[1].at < next[1].at)) next = entry;
      }
      if (!next) break;
      this.#due.delete(next[0]);
      this.wall += next[1].at - this.mono;
      this.mono = next[1].at;
      next[1].fn();
      await settle(5);
    }
    this.wall += end - this.mono;
    this.mono = end;
    await settle(5);
  }
}

/** One call a {@linkcode FaultyStore} saw. */
export interface StoreCall {
  readonly op: "putStream" | "putBytes" | "getStream" | "getBytes" | "list" | "delete";
  /** The key, or the prefix of a listing. */
  readonly key: string;
  /** Whether a putBytes carried a condition (If-Match, If-None-Match). */
  readonly conditional: boolean;
}

/** What a {@linkcode FaultyStore} does with a call a fault matches. */
export type StoreFault =
  /** Answers as an S3 503 would: nothing happened. */
  | { readonly kind: "unavailable" }
  /** The write lands, and its answer is lost (a 503 or a timeout after the server acted). */
  | { readonly kind: "lost" }
  /** The call waits until `until` settles (a server that stalls), then goes on as usual. */
  | { readonly kind: "hold"; readonly until: Promise<void> }
  /**
   * The call reaches the server at once, and its answer comes only once `until` settles: a read
   * then answers what was there before, a write landed long before its caller learns it.
   */
  | { readonly kind: "late"; readonly until: Promise<void> };

interface Injected {
  readonly match: (call: StoreCall) => boolean;
  readonly fault: StoreFault;
  remaining: number;
}

/**
 * A store in front of another (a MemoryStore) whose faults a test switches: 503s, writes whose
 * answer is lost, and calls that stall until the test lets them go. Every call is recorded.
 */
export class FaultyStore implements Store {
  readonly #inner: Store;
  readonly #faults: Injected[] = [];
  /** Every call, oldest first. */
  readonly calls: StoreCall[] = [];

  constructor(inner: Store) {
    this.#inner = inner;
  }

  get description(): string {
    return this.#inner.description;
  }

  /**
   * Applies `fault` to the next `times` calls `match` accepts (default: every one, until the
   * returned function removes it).
   */
  inject(
    match: (call: StoreCall) => boolean,
    fault: StoreFault,
    times = Infinity,
  ): () => void {
    const entry: Injected = { match, fault, remaining: times };
    this.#faults.push(entry);
    return () => {
      const at = this.#faults.indexOf(entry);
      if (at >= 0) this.#faults.splice(at, 1);
    };
  }

  async #call<T>(call: StoreCall, run: () => Promise<T>): Promise<T> {
    this.calls.push(call);
    const entry = this.#faults.find((f) => f.remaining > 0 && f.match(call));
    if (!entry) return await run();
    entry.remaining--;
    const failed = () =>
      new StoreError("unavailable", `${call.op} "${call.key}": injected 503 Service Unavailable`);
    switch (entry.fault.kind) {
      case "unavailable":
        throw failed();
      case "lost":
        await run();
        throw failed();
      case "hold":
        await entry.fault.until;
        return await run();
      case "late": {
        const answer = await run();
        await entry.fault.until;
        return answer;
      }
    }
  }

  putStream(
    key: string,
    body: ReadableStream<Uint8Array>,
    options?: TransferOptions,
  ): Promise<PutResult> {
    return this.#call(
      { op: "putStream", key, conditional: false },
      () => this.#inner.putStream(key, body, options),
    );
  }

  putBytes(key: string, bytes: Uint8Array, condition?: WriteCondition): Promise<PutResult> {
    return this.#call(
      { op: "putBytes", key, conditional: condition !== undefined },
      () => this.#inner.putBytes(key, bytes, condition),
    );
  }

  getStream(key: string, options?: TransferOptions): Promise<ReadableStream<Uint8Array>> {
    return this.#call(
      { op: "getStream", key, conditional: false },
      () => this.#inner.getStream(key, options),
    );
  }

  getBytes(key: string): Promise<ObjectBytes | undefined> {
    return this.#call(
      { op: "getBytes", key, conditional: false },
      () => this.#inner.getBytes(key),
    );
  }

  list(prefix: string): Promise<StoredObject[]> {
    return this.#call(
      { op: "list", key: prefix, conditional: false },
      () => this.#inner.list(prefix),
    );
  }

  delete(key: string): Promise<void> {
    return this.#call({ op: "delete", key, conditional: false }, () => this.#inner.delete(key));
  }
}

/** What a {@linkcode followNodeHarness} builds. */
export interface FollowNodeHarness extends AsyncDisposable {
  /** Node "n1"'s CSI node service, with `follow`. */
  readonly node: NodeService;
  readonly follow: FollowVolumes;
  readonly runner: FakeRunner;
  /** The node's pool; its `mounts` is the mount table (dataset mounts and bind mounts). */
  readonly pool: FakePool;
  readonly store: MemoryStore;
  /** The datasets backed up, oldest first. */
  readonly backups: string[];
  /** The staging path Nomad uses for volume "pg" on this node. */
  readonly staging: string;
  /** Every line logged (JSON), oldest first. */
  readonly logs: readonly string[];
}

/** What differs between the tests of a follow node. */
export interface FollowNodeOptions {
  /** What each backup answers, on the node's pool (default: it rejects, none expected). */
  readonly backup?: (dataset: string, pool: FakePool) => Promise<BackupOutcome>;
  /** FollowVolumes' seams (clocks, timers), added to its deps. */
  readonly seams?: Partial<FollowDeps>;
}

/**
 * Node "n1": its CSI node service on a {@linkcode FakePool} whose `mount` table the fake
 * `mount --bind`, `umount` and `zfs mount` change, and the follow side (FollowVolumes) on the
 * same zfs, locks and a {@linkcode MemoryStore}. Staging paths live below a temporary base
 * directory (removed when disposed).
 */
export async function followNodeHarness(
  options: FollowNodeOptions = {},
): Promise<FollowNodeHarness> {
  const base = await Deno.makeTempDir({ prefix: "zfs-csi-follow-node-" });
  const parts = fakeServices({
    parent: PARENT,
    flags: ["--stage-publish-base-dir", base],
    host: (runner) => new FakePool(runner),
  });
  const { runner, host: pool, zfs, log, locks } = parts;
  pool.add(PARENT, { "org.zfs-csi:managed": ["-", "-"] });
  const mountpointOf = (dataset: string) => pool.value(dataset, "mountpoint") ?? "";
  // As the pool's own commands: its hook runs first, and may hold or answer them.
  const answer =
    (f: (argv: readonly string[]) => FakeResponse) => async (argv: readonly string[]) =>
      (await pool.hook?.(argv)) ?? f(argv);
  runner
    .on(
      ["mount", "-c", "--bind"],
      answer((argv) => {
        const [source, target] = argv.slice(-2) as [string, string];
        const from = pool.mounts.findLast(([, at]) => at === source);
        if (!from) return { code: 32, stderr: `mount: ${source}: not mounted\n` };
        pool.mounts.push([from[0], target]);
        return {};
      }),
    )
    .on(
      ["umount", "-c"],
      answer((argv) => {
        const target = argv.at(-1)!;
        const at = pool.mounts.findLastIndex(([, m]) => m === target);
        if (at < 0) return { code: 32, stderr: `umount: ${target}: not mounted.\n` };
        pool.mounts.splice(at, 1);
        return {};
      }),
    )
    .on(
      ["zfs", "mount"],
      answer((argv) => {
        const dataset = argv.at(-1)!;
        pool.mounts.push([dataset, mountpointOf(dataset)]);
        pool.setValue(dataset, "mounted", "yes");
        return {};
      }),
    );
  const store = new MemoryStore();
  const streams = new FakeStreamRunner(() => ({ code: 1, stderr: "no receives here" }));
  const backups: string[] = [];
  const deps: FollowDeps = {
    zfs,
    store,
    locks,
    trash: {
      inspect: () => Promise.reject(new Error("nothing is set aside in these tests")),
      removeVolume: () => Promise.reject(new Error("nothing is set aside in these tests")),
    },
    log,
    parentDataset: PARENT,
    node: "n1",
    receive: { streams, zfsPath: "zfs", zfs, store, log },
    backup: (dataset) => {
      backups.push(dataset);
      return options.backup?.(dataset, pool) ??
        Promise.reject(new Error("no backups expected"));
    },
    ...options.seams,
  };
  const follow = new FollowVolumes(deps);
  const node = fakeNode(parts, { follow });
  return {
    node,
    follow,
    runner,
    pool,
    store,
    backups,
    staging: `${base}/staging/pg/rw-file-system-single-node-writer`,
    logs: parts.logs,
    [Symbol.asyncDispose]: async () => {
      follow.stop();
      await Deno.remove(base, { recursive: true });
      runner.assertNoUnexpected();
    },
  };
}
