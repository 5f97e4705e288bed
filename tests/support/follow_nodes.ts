/**
 * Several nodes moving one follow volume with the real code, for unit tests: each node is a
 * {@linkcode FakePool} behind its own {@linkcode FakeRunner}, with the real FollowVolumes (stage
 * and release) and backupVolume (keep policy and the head's protection wired as
 * src/store_parts.ts wires them), over one shared {@linkcode MemoryStore}.
 *
 * `zfs snapshot`, `zfs send` and `zfs receive` are modelled as zfs behaves where these tests
 * look: a snapshot keeps its guid through send and receive and carries the dataset's data (a
 * string standing for its files); a full stream makes a new dataset; an incremental lands only
 * on a dataset whose newest snapshot is its base; a receive refuses a snapshot name the dataset
 * already has. Every node reads its wall clock as the shared virtual time plus its own offset,
 * so clocks can be skewed or stepped back. Nothing is started: no --allow-run needed.
 */

import { createHash } from "node:crypto";
import { FollowVolumes } from "../../src/follow/mover.ts";
import { createOwner } from "../../src/follow/owner.ts";
import { headGuard } from "../../src/follow/head.ts";
import { KeyedLock } from "../../src/lock.ts";
import { Logger } from "../../src/log.ts";
import { type BackupDeps, type BackupOutcome, backupVolume } from "../../src/replicate/backup.ts";
import type { SendToStoreSpec, SentStream } from "../../src/replicate/send.ts";
import type { SpawnOptions, StreamedCommand, StreamedExit, StreamRunner } from "../../src/run.ts";
import { FakePool } from "./fake_pool.ts";
import { fails, FakeRunner, fakeTools } from "./fake_runner.ts";
import { MemoryStore } from "./memory_store.ts";

/** The plugin's parent dataset on every node. */
export const PARENT = "tank/nomad";
/** The follow volume's name, and its copy on every node. */
export const VOLUME = "pg";
export const DATASET = `${PARENT}/${VOLUME}`;
/** The property standing for a dataset's (or snapshot's) files. */
export const DATA = "test:data";
/** The volume's uid in the store. */
const UID = "c".repeat(32);
/** 2026-03-01T00:00:00Z: the virtual time the cluster starts at. */
export const START_MS = Date.UTC(2026, 2, 1);

const encoder = new TextEncoder();
const decoder = new TextDecoder();

/** One log line as a node's logger wrote it. */
export interface NodeLogLine {
  readonly level: string;
  readonly msg: string;
  readonly node: string;
  readonly [key: string]: unknown;
}

/** What a stream in the store says, in this model. */
interface ModelStream {
  /** The snapshot's name after "@". */
  readonly snapshot: string;
  readonly guid: string;
  /** The base's guid, or null for a full stream. */
  readonly base: string | null;
  readonly data: string;
}

/** The cluster the nodes share: the store, virtual time, guids, and every log line. */
export class Cluster {
  readonly store = new MemoryStore();
  /** Virtual time, ms since the epoch; each node adds its own offset. */
  readonly time = { ms: START_MS };
  readonly logs: NodeLogLine[] = [];
  readonly #nodes: ModelNode[] = [];
  #guid = 7_000_000_000n;

  /** A node named `name`; see {@linkcode NodeOptions}. */
  node(name: string, options: NodeOptions = {}): ModelNode {
    const n = new ModelNode(this, name, options);
    this.#nodes.push(n);
    return n;
  }

  /**
   * Creates the follow volume's owner object (released, no head), as CreateVolume does: its
   * copies are made with the plugin's marker, a one-minute backup interval and `properties`
   * (the keep policy, say).
   */
  async createVolume(properties: Readonly<Record<string, string>> = {}): Promise<void> {
    await createOwner(this.store, VOLUME, {
      volume: VOLUME,
      uid: UID,
      ttlSeconds: 30,
      settings: {
        capacityBytes: 0,
        properties: {
          "org.zfs-csi:managed": "yes",
          "org.zfs-csi:backup-interval": "60",
          ...properties,
        },
      },
      nowMs: this.time.ms,
    });
  }

  /** A guid no snapshot of any node has. */
  nextGuid(): string {
    return String(++this.#guid);
  }

  /** Every unexpected zfs command of any node, as an error. */
  assertNoUnexpected(): void {
    for (const n of this.#nodes) n.runner.assertNoUnexpected();
  }
}

/** What differs between nodes. */
export interface NodeOptions {
  /** How far the node's wall clock is off the virtual time, in ms (default 0). */
  readonly offsetMs?: number;
  /** See BackupDeps.maxChainLength. */
  readonly maxChainLength?: number;
}

/** One node: its pool, its zfs model, and the plugin's follow side and backups on it. */
export class ModelNode {
  readonly name: string;
  readonly runner = new FakeRunner();
  readonly pool: FakePool;
  readonly follow: FollowVolumes;
  readonly backupDeps: BackupDeps;
  /** Added to the virtual time to make this node's wall clock (ms). */
  offsetMs: number;
  /** Called at the start of each send (to hold a backup's upload back). */
  onSend: ((spec: SendToStoreSpec) => Promise<void>) | undefined;
  readonly #cluster: Cluster;
  #txg = 100;

  constructor(cluster: Cluster, name: string, options: NodeOptions) {
    this.#cluster = cluster;
    this.name = name;
    this.offsetMs = options.offsetMs ?? 0;
    this.pool = new FakePool(this.runner);
    this.pool.add(PARENT, { "org.zfs-csi:managed": ["-", "-"] });
    const log = new Logger("info", { node: name }, (line) => cluster.logs.push(JSON.parse(line)));
    const { zfs } = fakeTools(this.runner, log, 10_000);
    this.runner.on(["zfs", "snapshot"], (argv) => this.#snapshot(argv.at(-1)!));
    this.runner.on(["zfs", "create"], (argv) => this.#create(argv));
    const locks = new KeyedLock();
    const store = cluster.store;
    const now = () => this.now();
    this.backupDeps = {
      zfs,
      store,
      locks,
      log,
      parentDataset: PARENT,
      node: name,
      now,
      lockWaitMs: 1000,
      cache: new Map(),
      ...(options.maxChainLength === undefined ? {} : { maxChainLength: options.maxChainLength }),
      send: (spec) => this.#send(spec),
      protect: (volumeKey, manifests) => headGuard(store, name, volumeKey, manifests),
    };
    this.follow = new FollowVolumes({
      zfs,
      store,
      locks,
      trash: {
        inspect: () => Promise.reject(new Error(`${name}: nothing is set aside in these tests`)),
        removeVolume: () =>
          Promise.reject(new Error(`${name}: nothing is set aside in these tests`)),
      },
      log,
      parentDataset: PARENT,
      node: name,
      receive: { streams: new ModelReceive(this), zfsPath: "zfs", zfs, store, log },
      backup: (dataset, options) => backupVolume(this.backupDeps, dataset, options),
      now,
    });
  }

  /** This node's wall clock, ms since the epoch. */
  now(): number {
    return this.#cluster.time.ms + this.offsetMs;
  }

  /** NodeStage's part in the store: acquire the volume and bring the copy to the head. */
  stage(): Promise<void> {
    return this.follow.prepareStage({ name: VOLUME, dataset: DATASET });
  }

  /** The job writes: the copy's data becomes `data` (refused on a read-only copy). */
  write(data: string): void {
    if (this.pool.value(DATASET, "readonly") !== "off") {
      throw new Error(`${this.name}: "${DATASET}" is not writable here`);
    }
    this.pool.setValue(DATASET, DATA, data);
  }

  /** What the copy holds, or undefined without one. */
  data(): string | undefined {
    return this.pool.value(DATASET, DATA);
  }

  /** NodeUnstage's part in the store: the final backup and the release. */
  unstage(): Promise<void> {
    return this.follow.release({ name: VOLUME, dataset: DATASET });
  }

  /** A scheduled backup of the copy, as the scheduler runs it. */
  backup(): Promise<BackupOutcome> {
    return this.follow.scheduledBackup(
      DATASET,
      {},
      (o) => backupVolume(this.backupDeps, DATASET, o),
    );
  }

  /** The snapshot components of the copy, oldest first. */
  snapshots(dataset = DATASET): string[] {
    return this.#snapshotsOf(dataset).map((s) => s.slice(dataset.length + 1));
  }

  #snapshotsOf(dataset: string): string[] {
    return this.pool.names().filter((n) => n.startsWith(`${dataset}@`))
      .sort((a, b) =>
        Number(this.pool.value(a, "createtxg")) - Number(this.pool.value(b, "createtxg"))
      );
  }

  #addSnapshot(name: string, guid: string, data: string): void {
    this.pool.add(name, {
      guid,
      createtxg: String(++this.#txg),
      creation: String(Math.floor(this.now() / 1000)),
      [DATA]: data,
    });
  }

  #snapshot(name: string) {
    const dataset = name.slice(0, name.indexOf("@"));
    if (this.pool.has(name)) {
      return fails(`cannot create snapshot '${name}': dataset already exists\n`);
    }
    if (!this.pool.has(dataset)) {
      return fails(`cannot open '${dataset}': dataset does not exist\n`);
    }
    this.#addSnapshot(name, this.#cluster.nextGuid(), this.pool.value(dataset, DATA) ?? "");
    return {};
  }

  #create(argv: readonly string[]) {
    const name = argv.at(-1)!;
    if (this.pool.has(name)) return fails(`cannot create '${name}': dataset already exists\n`);
    const props: Record<string, string> = {};
    for (let i = 2; i < argv.length - 1; i++) {
      if (argv[i] !== "-o") continue;
      const kv = argv[++i]!;
      props[kv.slice(0, kv.indexOf("="))] = kv.slice(kv.indexOf("=") + 1);
    }
    this.pool.add(name, props);
    return {};
  }

  async #send(spec: SendToStoreSpec): Promise<SentStream> {
    await this.onSend?.(spec);
    const guid = this.pool.value(spec.snapshot, "guid");
    if (guid === undefined) throw new Error(`${this.name}: no snapshot "${spec.snapshot}" to send`);
    const base = spec.base === undefined ? null : this.pool.value(spec.base, "guid") ?? null;
    const stream: ModelStream = {
      snapshot: spec.snapshot.slice(spec.snapshot.indexOf("@") + 1),
      guid,
      base,
      data: this.pool.value(spec.snapshot, DATA) ?? "",
    };
    const bytes = encoder.encode(JSON.stringify(stream));
    await this.#cluster.store.putStream(
      spec.key,
      ReadableStream.from([bytes]),
      spec.signal ? { signal: spec.signal } : {},
    );
    return { size: bytes.length, sha256: createHash("sha256").update(bytes).digest("hex") };
  }

  /**
   * `zfs receive <target>` of one model stream into this node's pool, as zfs judges it;
   * the zfs stderr on refusal.
   */
  receive(target: string, stream: ModelStream): string | undefined {
    const snapshot = `${target}@${stream.snapshot}`;
    if (stream.base === null) {
      if (this.pool.has(target)) {
        return `cannot receive new filesystem stream: destination '${target}' exists\n` +
          `must specify -F to overwrite it\n`;
      }
      this.pool.add(target, {});
    } else {
      if (!this.pool.has(target)) {
        return `cannot receive incremental stream: destination '${target}' does not exist\n`;
      }
      const newest = this.#snapshotsOf(target).at(-1);
      if (newest === undefined || this.pool.value(newest, "guid") !== stream.base) {
        return `cannot receive incremental stream: most recent snapshot of ${target} does not\n` +
          `match incremental source\n`;
      }
      if (this.pool.has(snapshot)) {
        return `cannot restore to ${snapshot}: destination already exists\n`;
      }
    }
    this.#addSnapshot(snapshot, stream.guid, stream.data);
    this.pool.setValue(target, DATA, stream.data);
    return undefined;
  }
}

/** `zfs receive` of one node: reads its stdin whole, then applies it to the node's pool. */
class ModelReceive implements StreamRunner {
  readonly #node: ModelNode;

  constructor(node: ModelNode) {
    this.#node = node;
  }

  spawn(argv: readonly string[], options: SpawnOptions = {}): StreamedCommand {
    if (options.stdin !== "piped") throw new Error(`unexpected receive ${JSON.stringify(argv)}`);
    const exit = Promise.withResolvers<StreamedExit>();
    let ended = false;
    const end = (code: number, stderr: string) => {
      if (ended) return;
      ended = true;
      exit.resolve({ code, stderr, killed: false });
    };
    const chunks: Uint8Array[] = [];
    const stdin = new WritableStream<Uint8Array>({
      write: (chunk) => {
        chunks.push(chunk.slice());
      },
      close: () => {
        const bytes = new Uint8Array(chunks.reduce((n, c) => n + c.length, 0));
        let at = 0;
        for (const c of chunks) {
          bytes.set(c, at);
          at += c.length;
        }
        let stream: ModelStream;
        try {
          stream = JSON.parse(decoder.decode(bytes));
        } catch {
          return end(1, "cannot receive: invalid backup stream\n");
        }
        const refused = this.#node.receive(argv.at(-1)!, stream);
        end(refused === undefined ? 0 : 1, refused ?? "");
      },
      abort: () => end(1, "cannot receive new filesystem stream: invalid backup stream\n"),
    });
    return { stdin, stdout: null, exit: exit.promise, kill: () => end(137, "") };
  }
}
