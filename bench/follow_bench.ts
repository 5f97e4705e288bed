/**
 * Section 9 of `deno task bench`: volumes that follow their job (issue 13). Two plugins as they
 * ship (PluginProcess), "node-a" and "node-b", each on its own file-backed pool, share one store:
 * a directory (`--store file://DIR`), then versitygw on 127.0.0.1 (`--store s3://…`).
 *
 * - Switchover: a follow volume holding `volumeMiB` of random data, with `changedMiB` rewritten
 *   since the last sync (its previous release), moves from the node that holds it to the other,
 *   called as Nomad calls them: NodeUnpublish+NodeUnstage on the holder (the final snapshot,
 *   its increment sent to the store, the release), then NodeStage+NodePublish on the other (the
 *   lease, the receive, the mount). Timed from the first call to the last answer: what the
 *   job's downtime costs the plugin. Cold: the other node never held the volume (it receives
 *   the full stream and the increments); warm: it held it before (only the increment).
 * - The floor, in bash with nothing else around it, on datasets of the same pools outside the
 *   plugin's parent, the same sizes: `zfs snapshot @cur`, then `zfs send -i @prev @cur` written
 *   into the store (a file in the store's directory then `sync`; for S3 a file then one
 *   PutObject by curl), then `zfs receive -u` of it (from that file; for S3 a curl GET piped
 *   into zfs receive). Cold adds the receive of the full stream stored beforehand, as the
 *   plugin's cold node does. No lease, no checks, no mount. The issue's target for warm: within
 *   2 × floor + 2 s.
 * - Bytes moved: what the holder logged uploading at its release ("follow volume released") and
 *   what the receiving node logged receiving ("follow volume received").
 * - RPO: another follow volume with a sync interval (`1m`; quick `10s`) is held on node-a while
 *   a writer rewrites 1 MiB of it every second. At random instants (0.5–3 s apart) the bench
 *   reads the store and notes the age of the newest copy (now − its snapshot's creation): what a
 *   holder killed then would lose at most. At the end node-a's plugin is SIGKILLed at a random
 *   instant and the same age is read once more.
 *
 *   deno run --frozen --allow-all bench/follow_bench.ts   # this section alone
 *   ZFS_CSI_BENCH_QUICK=1 …                               # 64 MiB, 4 MiB changed, 10 s interval
 */

import type { SnapshotManifest } from "../src/store/layout.ts";
import type { CsiClient } from "../tests/support/csi_client.ts";
import { claimPaths, createVolumeRequest, mountCapability } from "../tests/support/nomad.ts";
import { PluginProcess } from "../tests/support/plugin_process.ts";
import { S3Server } from "../tests/support/s3_server.ts";
import {
  fileStoreUnderTest,
  s3StoreUnderTest,
  type StoreUnderTest,
} from "../tests/support/store_flows.ts";
import { sh, TestPool } from "../tests/support/zfs_pool.ts";
import {
  checkCurl,
  destroyTree,
  MiB,
  mib,
  overwriteRandom,
  runSectionAlone,
  sizeLabel,
  sleep,
  syncDisks,
  timed,
  timedBash,
} from "./bench_io.ts";
import { shellQuote } from "./commands.ts";
import { formatMs, median, percentile, ratio, type Row } from "./stats.ts";

const SECTION = "9";
/** Long calls (a receive inside NodeStage): Nomad gives them no deadline. */
const STAGE_DEADLINE_MS = 20 * 60_000;
/** The issue's target for a warm switchover: within 2 × the floor plus this. */
const WARM_SLACK_MS = 2_000;

/** What {@linkcode followBench} needs from the bench. */
export interface FollowBenchOptions {
  /** Short run: 64 MiB, 4 MiB changed, one warm trial, a 10 s interval for 40 s. */
  readonly quick: boolean;
  readonly progress: (text: string) => void;
}

interface Config {
  readonly volumeMiB: number;
  readonly changedMiB: number;
  readonly warmTrials: number;
  /** The RPO run: the volume's sync interval, and how long the writer runs. */
  readonly interval: string;
  readonly intervalMs: number;
  readonly rpoRunMs: number;
}

/** A node: its pool, and the plugin on it. */
interface Node {
  readonly name: string;
  readonly pool: TestPool;
  readonly plugin: PluginProcess;
}

/** The volume staged and published on a node, as for one alloc. */
interface Held {
  readonly node: Node;
  readonly staging: string;
  readonly target: string;
}

/** One switchover: its parts (ms) and the bytes the logs name. */
interface Switchover {
  readonly releaseMs: number;
  readonly stageMs: number;
  readonly totalMs: number;
  readonly uploaded: number;
  readonly received: number;
}

/** A store the plugins share, and how the floor writes into it and reads from it. */
interface BenchStore {
  readonly label: string;
  readonly under: StoreUnderTest;
  /** Bash that puts local file $1 into the store as `name`, and bash that reads it to stdout. */
  put(file: string, name: string): string;
  get(name: string): string;
  readonly env: Record<string, string>;
  readonly floorNote: string;
}

let allocs = 0;

/** NodeStage+NodePublish on `node`, as Nomad calls them for a new alloc. */
async function stage(node: Node, volumeId: string): Promise<Held> {
  const p = await claimPaths(node.plugin.baseDir, {
    volumeId: volumeId.replace(/@.*/, ""),
    allocId: `alloc-${++allocs}`,
  });
  const base = { volume_id: volumeId, volume_capability: mountCapability(), volume_context: {} };
  const c: CsiClient = node.plugin.client;
  await c.node("NodeStageVolume", { ...base, staging_target_path: p.staging }, STAGE_DEADLINE_MS);
  await c.node("NodePublishVolume", {
    ...base,
    staging_target_path: p.staging,
    target_path: p.target,
  });
  return { node, staging: p.staging, target: p.target };
}

/** NodeUnpublish+NodeUnstage, as Nomad calls them when the node's last alloc stops. */
async function release(h: Held, volumeId: string): Promise<void> {
  const c = h.node.plugin.client;
  await c.node("NodeUnpublishVolume", { volume_id: volumeId, target_path: h.target });
  await c.node(
    "NodeUnstageVolume",
    { volume_id: volumeId, staging_target_path: h.staging },
    STAGE_DEADLINE_MS,
  );
}

/** The sum of the `bytes` a plugin logged with message `msg` since log record `from`. */
function loggedBytes(p: PluginProcess, msg: string, from: number): number {
  return p.records().slice(from).filter((r) => r.msg === msg)
    .reduce((n, r) => n + Number(r.bytes ?? 0), 0);
}

/** Moves the volume from `from` (which holds it) to `to`, timed; see the module doc. */
async function switchover(from: Held, to: Node, volumeId: string) {
  const markFrom = from.node.plugin.records().length;
  const markTo = to.plugin.records().length;
  await syncDisks();
  const t0 = performance.now();
  await release(from, volumeId);
  const t1 = performance.now();
  const held = await stage(to, volumeId);
  const t2 = performance.now();
  const result: Switchover = {
    releaseMs: t1 - t0,
    stageMs: t2 - t1,
    totalMs: t2 - t0,
    uploaded: loggedBytes(from.node.plugin, "follow volume released", markFrom),
    received: loggedBytes(to.plugin, "follow volume received", markTo),
  };
  return { held, result };
}

/** Newest snapshot's creation (ms) among the volume's manifests in the store; cache by key. */
async function newestCopyAt(
  store: StoreUnderTest,
  volume: string,
  seen: Map<string, number>,
): Promise<number | undefined> {
  const keys = await store.keys(`v1/volumes/${volume}/snapshots/`);
  for (const key of keys.filter((k) => k.endsWith(".json") && !seen.has(k))) {
    const bytes = await store.read(key);
    if (!bytes) continue;
    const m = JSON.parse(new TextDecoder().decode(bytes)) as SnapshotManifest;
    seen.set(key, Date.parse(m.createdAt));
  }
  return seen.size === 0 ? undefined : Math.max(...seen.values());
}

/** Rewrites 1 MiB of `file` every second (64 MiB of it in turn) until stopped. */
function steadyWriter(file: string): { stop(): Promise<number> } {
  let running = true;
  let written = 0;
  const loop = (async () => {
    const f = await Deno.open(file, { create: true, write: true });
    try {
      const chunk = new Uint8Array(MiB);
      const t0 = performance.now();
      for (let i = 0; running; i++) {
        for (let o = 0; o < MiB; o += 65_536) crypto.getRandomValues(chunk.subarray(o, o + 65_536));
        await f.seek((i % 64) * MiB, Deno.SeekMode.Start);
        for (let o = 0; o < MiB;) o += await f.write(chunk.subarray(o));
        written += MiB;
        const wait = t0 + (i + 1) * 1000 - performance.now();
        if (wait > 0) await sleep(wait);
      }
    } finally {
      f.close();
    }
  })();
  return {
    async stop() {
      running = false;
      await loop;
      return written;
    },
  };
}

/** The load, as `uptime` says it now. */
async function load(): Promise<string> {
  const out = (await sh("uptime")).trim();
  return /load average: (.*)$/.exec(out)?.[1] ?? out;
}

/**
 * Runs one store's switchover and RPO rows on two fresh pools; see the module doc.
 * @throws when a call fails
 */
async function benchStore(cfg: Config, store: BenchStore, progress: (t: string) => void) {
  const size = sizeLabel(cfg.volumeMiB);
  const changed = `${cfg.changedMiB} MiB`;
  const poolMiB = Math.max(1024, cfg.volumeMiB * 4);
  await using poolA = await TestPool.create(poolMiB);
  await using poolB = await TestPool.create(poolMiB);
  const startNode = async (name: string, pool: TestPool): Promise<Node> => ({
    name,
    pool,
    plugin: await PluginProcess.start({
      parentDataset: pool.parent,
      dir: `${pool.dir}/plugin`,
      nodeId: name,
      logLevel: "info",
      ...store.under.plugin,
    }),
  });
  const a = await startNode("node-a", poolA);
  await using _pa = a.plugin;
  const b = await startNode("node-b", poolB);
  await using _pb = b.plugin;
  const rows: Row[] = [];
  const loads: string[] = [await load()];

  // The volume: created in the store, first staged on A, filled, released (the full stream).
  progress(`follow (${store.label}): a ${size} volume on node-a`);
  const res = await a.plugin.client.controller(
    "CreateVolume",
    createVolumeRequest("moving", {
      parameters: { follow: "true", backup_interval: "1h" },
      capacity_range: { required_bytes: String(cfg.volumeMiB * 2 * MiB), limit_bytes: "0" },
    }),
  );
  const volumeId: string = res.volume.volume_id;
  let held = await stage(a, volumeId);
  await overwriteRandom(`${held.target}/data`, cfg.volumeMiB);
  const firstMark = a.plugin.records().length;
  const firstRelease = await timed(() => release(held, volumeId));
  const fullBytes = loggedBytes(a.plugin, "follow volume released", firstMark);
  held = await stage(a, volumeId);

  // The floor's datasets: a source on A's pool, the full stream in the store (not timed).
  progress(`follow (${store.label}): the floor's ${size} source`);
  const src = `${poolA.pool}/floor-src`;
  const dst = `${poolB.pool}/floor-dst`;
  await sh("zfs", "create", src);
  const srcFile = `${(await sh("zfs", "get", "-H", "-o", "value", "mountpoint", src)).trim()}/data`;
  await overwriteRandom(srcFile, cfg.volumeMiB);
  await sh("zfs", "snapshot", `${src}@s0`);
  const localFull = `${poolA.dir}/floor-full.zfs`;
  await sh("bash", "-c", `zfs send ${shellQuote(`${src}@s0`)} > ${shellQuote(localFull)}`);
  await timedBash(store.put(localFull, "floor-full.zfs"), store.env);
  await Deno.remove(localFull);
  let srcSnap = 0;
  const floorIncrement = async (receive: string): Promise<{ ms: number; bytes: number }> => {
    await overwriteRandom(srcFile, cfg.changedMiB, (srcSnap + 1) * cfg.changedMiB);
    const prev = `${src}@s${srcSnap}`;
    const cur = `${src}@s${++srcSnap}`;
    const local = `${poolA.dir}/floor-inc.zfs`;
    await syncDisks();
    const ms = await timedBash(
      `zfs snapshot ${shellQuote(cur)}\n` +
        `zfs send -i ${shellQuote(prev)} ${shellQuote(cur)} > ${shellQuote(local)}\n` +
        `${store.put(local, "floor-inc.zfs")}\n${receive}`,
      store.env,
    );
    const bytes = (await Deno.stat(local)).size;
    await Deno.remove(local);
    return { ms, bytes };
  };

  // Cold: B never held the volume. The plugin, then the floor.
  progress(`follow (${store.label}): cold switchover A→B`);
  await overwriteRandom(`${held.target}/data`, cfg.changedMiB, 0);
  const cold = await switchover(held, b, volumeId);
  held = cold.held;
  const coldFloor = await floorIncrement(
    `${store.get("floor-full.zfs")} | zfs receive -u ${shellQuote(dst)}\n` +
      `${store.get("floor-inc.zfs")} | zfs receive -u ${shellQuote(dst)}`,
  );
  loads.push(await load());

  // Warm: each node held the volume before; plugin and floor alternate which goes first.
  const warm: Switchover[] = [];
  const warmFloor: { ms: number; bytes: number }[] = [];
  for (let t = 0; t < cfg.warmTrials; t++) {
    progress(`follow (${store.label}): warm switchover ${t + 1}/${cfg.warmTrials}`);
    const plugin = async () => {
      const other = held.node === a ? b : a;
      await overwriteRandom(`${held.target}/data`, cfg.changedMiB, (t + 1) * cfg.changedMiB);
      const moved = await switchover(held, other, volumeId);
      held = moved.held;
      warm.push(moved.result);
    };
    const floor = async () => {
      warmFloor.push(
        await floorIncrement(`${store.get("floor-inc.zfs")} | zfs receive -u ${shellQuote(dst)}`),
      );
    };
    if (t % 2 === 0) {
      await plugin();
      await floor();
    } else {
      await floor();
      await plugin();
    }
  }
  loads.push(await load());
  await release(held, volumeId);
  await destroyTree(src);
  await destroyTree(dst);

  const c = cold.result;
  const warmMs = median(warm.map((w) => w.totalMs));
  const warmFloorMs = median(warmFloor.map((f) => f.ms));
  const budget = 2 * warmFloorMs + WARM_SLACK_MS;
  const parts = (w: readonly Switchover[]) =>
    `unstage on the holder ${formatMs(median(w.map((x) => x.releaseMs)))} + stage+publish ` +
    `on the other ${formatMs(median(w.map((x) => x.stageMs)))}`;
  rows.push(
    {
      section: SECTION,
      what: `switchover, ${size} volume, ${changed} changed, cold (B never held it), ` +
        `${store.label} (plugin) vs floor`,
      plugin: formatMs(c.totalMs),
      base: formatMs(coldFloor.ms),
      ratio: ratio(c.totalMs, coldFloor.ms),
      note: `${parts([c])}; floor: zfs send -i > ${store.floorNote}, then zfs receive -u of ` +
        `the stored full stream and of the increment; 1 trial; load ${loads[1]}`,
    },
    {
      section: SECTION,
      what: `switchover, ${size} volume, ${changed} changed, warm (the node held it before), ` +
        `${store.label} (plugin) vs 2 × floor + 2 s`,
      plugin: formatMs(warmMs),
      base: formatMs(budget),
      ratio: ratio(warmMs, budget),
      target: 1,
      note: `${parts(warm)}; floor ${formatMs(warmFloorMs)}: zfs send -i > ` +
        `${store.floorNote}, then zfs receive -u of it; medians of ${warm.length} trial${
          warm.length === 1 ? "" : "s"
        } each; load ${loads[2]}`,
    },
    {
      section: SECTION,
      what: `bytes moved per switchover, ${changed} changed, ${store.label}`,
      plugin: mib(median(warm.map((w) => w.received))),
      base: mib(median(warmFloor.map((f) => f.bytes))),
      ratio: ratio(median(warm.map((w) => w.received)), median(warmFloor.map((f) => f.bytes))),
      note: `warm: received ${mib(median(warm.map((w) => w.received)))}, uploaded at the ` +
        `release ${mib(median(warm.map((w) => w.uploaded)))}; cold: received ${mib(c.received)}` +
        ` (full stream + increment), uploaded ${mib(c.uploaded)}; compared with the floor's ` +
        `zfs send -i stream; first release (full stream) uploaded ${mib(fullBytes)} in ` +
        `${formatMs(firstRelease.ms)}`,
    },
  );

  rows.push(await rpoRow(cfg, store, a, loads));
  return rows;
}

/** The RPO run on node-a (killed at its end); see the module doc. */
async function rpoRow(cfg: Config, store: BenchStore, a: Node, loads: string[]): Promise<Row> {
  const res = await a.plugin.client.controller(
    "CreateVolume",
    createVolumeRequest("rpo", {
      parameters: { follow: "true", backup_interval: cfg.interval },
      capacity_range: { required_bytes: String(256 * MiB), limit_bytes: "0" },
    }),
  );
  const held = await stage(a, res.volume.volume_id);
  const seen = new Map<string, number>();
  const writer = steadyWriter(`${held.target}/load.bin`);
  try {
    // Warm-up: the first copy (a full stream) and one interval, before sampling.
    const deadline = Date.now() + 5 * 60_000;
    while (await newestCopyAt(store.under, "rpo", seen) === undefined) {
      if (Date.now() > deadline) throw new Error('follow bench: no first copy of "rpo"');
      await sleep(500);
    }
    await sleep(cfg.intervalMs);
    const ages: number[] = [];
    const end = Date.now() + cfg.rpoRunMs;
    while (Date.now() < end) {
      await sleep(500 + Math.random() * 2_500);
      const newest = await newestCopyAt(store.under, "rpo", seen);
      ages.push(Date.now() - newest!);
    }
    // The kill: at a random instant within one more interval.
    await sleep(Math.random() * cfg.intervalMs);
    await a.plugin.stop("SIGKILL");
    const killedAt = Date.now();
    const killAge = killedAt - (await newestCopyAt(store.under, "rpo", seen))!;
    const written = await writer.stop();
    loads.push(await load());
    const p90 = percentile(ages, 90);
    return {
      section: SECTION,
      what: `RPO, ${cfg.interval} interval, 1 MiB/s written, ${store.label}: ` +
        `age of the newest stored copy (p90 of samples) vs the interval`,
      plugin: formatMs(p90),
      base: formatMs(cfg.intervalMs),
      ratio: ratio(p90, cfg.intervalMs),
      note:
        `${ages.length} samples at random instants over ${
          (cfg.rpoRunMs / 1000).toFixed(0)
        } s: median ${formatMs(median(ages))}, max ${formatMs(Math.max(...ages))}; SIGKILL of ` +
        `the holder at a random instant: newest copy ${formatMs(killAge)} old; ` +
        `${seen.size} copies stored, ${mib(written)} written; load ${loads.at(-1)}`,
    };
  } finally {
    await writer.stop();
  }
}

/**
 * Measures section 9 (file store, then versitygw); see the module doc.
 * @throws when a trial fails, versitygw cannot be started or curl is missing
 */
export async function followBench(options: FollowBenchOptions): Promise<Row[]> {
  const { quick, progress } = options;
  const cfg: Config = quick
    ? {
      volumeMiB: 64,
      changedMiB: 4,
      warmTrials: 1,
      interval: "10s",
      intervalMs: 10_000,
      rpoRunMs: 40_000,
    }
    : {
      volumeMiB: 1024,
      changedMiB: 16,
      warmTrials: 3,
      interval: "1m",
      intervalMs: 60_000,
      rpoRunMs: 240_000,
    };
  const curl = await checkCurl();
  const rows: Row[] = [];

  const storeDir = await Deno.makeTempDir({ prefix: "zfs-csi-follow-bench-" });
  try {
    const floorDir = `${storeDir}/bench-floor`;
    await Deno.mkdir(floorDir);
    rows.push(
      ...await benchStore(cfg, {
        label: "file store",
        under: fileStoreUnderTest(storeDir),
        put: (file, name) => `cat ${shellQuote(file)} > ${shellQuote(`${floorDir}/${name}`)}; sync`,
        get: (name) => `cat ${shellQuote(`${floorDir}/${name}`)}`,
        env: {},
        floorNote: "a file in the store's directory && sync",
      }, progress),
    );
  } finally {
    await Deno.remove(storeDir, { recursive: true });
  }

  progress("follow: starting versitygw");
  await using s3 = await S3Server.start();
  const bucketUrl = `${s3.endpoint.origin}/${s3.bucket}/bench-floor`;
  // curl 7.x signs no payload hash of its own; S3 wants one, and UNSIGNED-PAYLOAD is allowed.
  const curlS3 = `curl -sS --fail --aws-sigv4 aws:amz:${s3.region}:s3 --user "$AK:$SK" ` +
    `-H 'x-amz-content-sha256: UNSIGNED-PAYLOAD'`;
  rows.push(
    ...await benchStore(cfg, {
      label: "S3 (versitygw)",
      under: s3StoreUnderTest(s3, "follow"),
      put: (file, name) =>
        `${curlS3} -T ${shellQuote(file)} ${shellQuote(`${bucketUrl}/${name}`)} -o /dev/null`,
      get: (name) => `${curlS3} ${shellQuote(`${bucketUrl}/${name}`)}`,
      env: { AK: s3.accessKeyId, SK: s3.secretAccessKey },
      floorNote: `a file, then one PutObject of it by ${curl} -T (a GET by curl piped into ` +
        `zfs receive)`,
    }, progress),
  );
  return rows;
}

if (import.meta.main) await runSectionAlone(followBench);
