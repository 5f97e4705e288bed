/**
 * A volume on a {@linkcode FakePool}, a {@linkcode MemoryStore} and a fake `send` for the unit
 * tests of backups, pruning and the scheduler: `zfs snapshot` makes a snapshot with a fresh
 * guid and createtxg at the test's clock, and `send` stores a small stream naming its snapshot
 * and base, so a test can tell what was sent from what.
 */

import { createHash } from "node:crypto";
import { KeyedLock } from "../../src/lock.ts";
import { Logger } from "../../src/log.ts";
import type { BackupDeps } from "../../src/replicate/backup.ts";
import type { SendToStoreSpec, SentStream } from "../../src/replicate/send.ts";
import { fails, FakeRunner, fakeTools } from "./fake_runner.ts";
import { FakePool, type FakeValue } from "./fake_pool.ts";
import { MemoryStore } from "./memory_store.ts";

export const PARENT = "tank/nomad";
/** 2024-01-01T00:00:00Z. */
export const T0 = Date.UTC(2024, 0, 1);
export const MANAGED = "org.zfs-csi:managed";
export const UID_PROPERTY = "org.zfs-csi:store-uid";

const encoder = new TextEncoder();

/** One log line as the logger wrote it. */
export interface LogLine {
  level: string;
  msg: string;
  [key: string]: unknown;
}

/** Everything a backup test looks at. */
export interface BackupHarness {
  readonly runner: FakeRunner;
  readonly pool: FakePool;
  readonly store: MemoryStore;
  readonly locks: KeyedLock;
  readonly logs: LogLine[];
  /** Every send, oldest first. */
  readonly sends: SendToStoreSpec[];
  /** The wall clock (ms) the backups read and snapshots are created at. */
  readonly clock: { ms: number };
  readonly deps: BackupDeps;
  /** Makes the next sends fail (with this error) until set back to undefined. */
  failSend: Error | undefined;
  /** Called at the start of each send (to look at locks, or to hold the send). */
  onSend: ((spec: SendToStoreSpec) => void | Promise<void>) | undefined;
  /** Adds a volume (a managed child of the parent) and returns its dataset. */
  volume(name: string, values?: Record<string, FakeValue>): string;
  /** Adds a snapshot of `dataset` as zfs would take it now; returns its name. */
  snapshot(dataset: string, component: string): string;
}

/** A fresh harness; `deps` overrides what the tests need. */
export function backupHarness(deps: Partial<BackupDeps> = {}): BackupHarness {
  const runner = new FakeRunner();
  const pool = new FakePool(runner);
  pool.add(PARENT);
  const logs: LogLine[] = [];
  const log = new Logger("debug", {}, (line) => logs.push(JSON.parse(line)));
  const { zfs } = fakeTools(runner, log);
  const store = new MemoryStore();
  const locks = new KeyedLock();
  const clock = { ms: T0 };
  let guid = 1_000_000n;
  let txg = 100;
  const sends: SendToStoreSpec[] = [];
  const addSnapshot = (name: string) => {
    pool.add(name, {
      guid: String(++guid),
      createtxg: String(++txg),
      creation: String(Math.floor(clock.ms / 1000)),
    });
  };
  runner.on(["zfs", "snapshot"], (argv) => {
    const name = argv.at(-1)!;
    if (pool.has(name)) return fails(`cannot create snapshot '${name}': dataset already exists\n`);
    if (!pool.has(name.slice(0, name.indexOf("@")))) {
      return fails(`cannot open '${name.slice(0, name.indexOf("@"))}': dataset does not exist\n`);
    }
    addSnapshot(name);
    return {};
  });
  const h: BackupHarness = {
    runner,
    pool,
    store,
    locks,
    logs,
    sends,
    clock,
    failSend: undefined,
    onSend: undefined,
    deps: {
      zfs,
      store,
      locks,
      log,
      parentDataset: PARENT,
      node: "node-1",
      now: () => clock.ms,
      lockWaitMs: 1000,
      send: async (spec: SendToStoreSpec): Promise<SentStream> => {
        sends.push(spec);
        await h.onSend?.(spec);
        if (h.failSend) throw h.failSend;
        const bytes = encoder.encode(`${spec.base ?? "full"} > ${spec.snapshot}`);
        await store.putStream(spec.key, ReadableStream.from([bytes]));
        return { size: bytes.length, sha256: createHash("sha256").update(bytes).digest("hex") };
      },
      ...deps,
    },
    volume(name, values = {}) {
      const dataset = `${PARENT}/${name}`;
      pool.add(dataset, { [MANAGED]: "yes", refquota: String(1 << 30), ...values });
      return dataset;
    },
    snapshot(dataset, component) {
      const name = `${dataset}@${component}`;
      addSnapshot(name);
      return name;
    },
  };
  return h;
}
