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
import type { CopyDeps, FollowDeps } from "../../src/follow/mover.ts";
import { KeyedLock } from "../../src/lock.ts";
import type { BackupOutcome } from "../../src/replicate/backup.ts";
import { encodeJson } from "../../src/store/chain.ts";
import { manifestKey, type SnapshotManifest, streamKey } from "../../src/store/layout.ts";
import type { Store } from "../../src/store/store.ts";
import { FakePool } from "./fake_pool.ts";
import { FakeRunner, fakeTools } from "./fake_runner.ts";
import { FakeStreamRunner, type StreamScript } from "./fake_stream_runner.ts";
import { MemoryStore } from "./memory_store.ts";

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
