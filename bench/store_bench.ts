/**
 * Section 8 of `deno task bench`: the store. A volume of random (incompressible) data on its own
 * file-backed pool is backed up and restored through the plugin as it ships (a PluginProcess
 * with `--store file://DIR`, then one with `--store s3://…` on versitygw at 127.0.0.1), timed
 * from the client: CreateSnapshot until the snapshot is ready, CreateVolume from the stored
 * snapshot until it answers. Floors, run by bash with nothing else around them, alternate with
 * the plugin's trials:
 *
 * - file store: `zfs send ds@snap > DIR/file && sync` (same disk, a new file each time) and
 *   `zfs receive -u ds < file` of the plugin's own stored stream, and (with openssl on PATH) each
 *   with `openssl dgst -sha256` hashing as many bytes beside it: what any backup or restore that
 *   hashes the stream costs on this machine's cores, with no plugin;
 * - S3: the same work with plain tools, `zfs send ds@snap | tee >(openssl dgst -sha256) | curl
 *   --aws-sigv4 -T -` (the length given in advance: versitygw refuses a chunked body) and
 *   `curl … | tee >(openssl dgst -sha256) | zfs receive -u ds`; and for context one PutObject of
 *   the stream already on disk (`curl -T file`), a script's `zfs send > file` then that curl, and
 *   a download piped into zfs receive with no hash.
 *
 * The same engine (send.ts, receive.ts) run from this process, without gRPC or the plugin's
 * process, gets its own rows. Also: an incremental backup of a small change (time and the
 * manifest's size), the plugin's RSS sampled every 100 ms during backups and restores, the
 * latency of NodeStage+NodePublish of another volume while a backup runs (to the file store and
 * to S3), CPU-seconds per GiB of the S3 transfers and their floors, and the stored bytes of a
 * compressed volume of text against what the pool holds (bench/stream_bytes.ts).
 *
 *   deno run --frozen --allow-all bench/store_bench.ts   # this section alone
 *   ZFS_CSI_BENCH_QUICK=1 …                              # 64 MiB, one trial
 *   ZFS_CSI_BENCH_STORE=file …                           # the directory store's rows only
 *   ZFS_CSI_BENCH_STORE=s3 …                             # S3's and the stored bytes' only
 *   ZFS_CSI_BENCH_TRIALS=9 …                             # 9 trials a row instead of 3
 */

import { createHash } from "node:crypto";
import { Logger } from "../src/log.ts";
import { receiveFromStore } from "../src/replicate/receive.ts";
import { sendToStore } from "../src/replicate/send.ts";
import { DenoCommandRunner, DenoStreamRunner } from "../src/run.ts";
import { parseManifest } from "../src/store/chain.ts";
import { FileStore } from "../src/store/file_store.ts";
import { manifestKey, type SnapshotManifest, streamKey } from "../src/store/layout.ts";
import { parseStoredSnapshotId } from "../src/store/snapshot_ids.ts";
import { formFlags } from "../src/zfs/stream_form.ts";
import { Zfs } from "../src/zfs/zfs.ts";
import type { CallError, CsiClient } from "../tests/support/csi_client.ts";
import { claimPaths, createVolumeRequest, mountCapability } from "../tests/support/nomad.ts";
import { PluginProcess } from "../tests/support/plugin_process.ts";
import { S3Server, signedFetch } from "../tests/support/s3_server.ts";
import { sh, TestPool, tryRun } from "../tests/support/zfs_pool.ts";
import {
  checkCurl,
  destroyTree,
  interleave,
  MiB,
  mib,
  overwriteRandom,
  rate,
  runSectionAlone,
  sizeLabel,
  sleep,
  syncDisks,
  timed,
  timedBash,
} from "./bench_io.ts";
import { shellQuote } from "./commands.ts";
import { streamBytesRows } from "./stream_bytes.ts";
import { which } from "./shims.ts";
import { formatMs, median, percentile, ratio, type Row } from "./stats.ts";

const SECTION = "8";
/** The issue's bound on the plugin's RSS above idle during a transfer. */
const RSS_BUDGET_MIB = 64;
/** gRPC deadline of the calls that wait for a transfer (the plugin answers within 90 s). */
const TRANSFER_DEADLINE_MS = 150_000;
/** How long a transfer may take in all before the bench gives up on it. */
const TRANSFER_LIMIT_MS = 20 * 60_000;
/** gRPC UNAVAILABLE: CreateVolume's "restore still running, call again". */
const UNAVAILABLE = 14;

/** What {@linkcode storeBench} needs from the bench. */
export interface StoreBenchOptions {
  /** Short run: a 64 MiB volume, one trial. */
  readonly quick: boolean;
  readonly progress: (text: string) => void;
  /** Overrides of the volume's size (MiB) and the trials per row, e.g. to look closer. */
  readonly volumeMiB?: number;
  readonly trials?: number;
  /** Only the directory store's rows (ZFS_CSI_BENCH_STORE=file when run alone). */
  readonly fileOnly?: boolean;
  /**
   * Only the S3 rows and the stored bytes (ZFS_CSI_BENCH_STORE=s3 when run alone): the file
   * store's plugin only sets the volume up.
   */
  readonly s3Only?: boolean;
}

interface Config {
  readonly volumeMiB: number;
  readonly changedMiB: number;
  readonly trials: number;
  /** Stage+publish cycles per trial without a backup. */
  readonly idleCycles: number;
  /** Volumes staged and published, one after another, during each S3 latency trial. */
  readonly latVolumes: number;
}

/** A volume of the plugin, claimed on this node. */
interface Claim {
  readonly volumeId: string;
  readonly context: Record<string, string>;
  readonly staging: string;
  readonly target: string;
}

const silent = new Logger("error", {}, () => {});

async function rssMiB(pid: number): Promise<number> {
  const status = await Deno.readTextFile(`/proc/${pid}/status`);
  return Number(/VmRSS:\s+(\d+) kB/.exec(status)?.[1] ?? NaN) / 1024;
}

/** Samples a process's VmRSS every 100 ms until stopped. */
class RssSampler {
  readonly #samples: number[] = [];
  #running = true;
  readonly #loop: Promise<void>;

  constructor(pid: number) {
    this.#loop = (async () => {
      while (this.#running) {
        this.#samples.push(await rssMiB(pid));
        await sleep(100);
      }
      this.#samples.push(await rssMiB(pid));
    })();
  }

  async stop(): Promise<number[]> {
    this.#running = false;
    await this.#loop;
    return this.#samples;
  }
}

/** The RSS of a process at rest: the median of five samples 100 ms apart. */
async function idleRss(pid: number): Promise<number> {
  const samples: number[] = [];
  for (let i = 0; i < 5; i++) {
    samples.push(await rssMiB(pid));
    await sleep(100);
  }
  return median(samples);
}

/** Every trial's times, by side. */
class Times {
  readonly #m = new Map<string, number[]>();
  push(side: string, ms: number): void {
    this.#m.set(side, [...(this.#m.get(side) ?? []), ms]);
  }
  /** A row of section 8: the median of `side` against the median of `floor`. */
  row(what: string, side: string, floor: string, rest: Pick<Row, "target" | "note">): Row {
    const [plugin, base] = [this.median(side), this.median(floor)];
    return {
      section: SECTION,
      what,
      plugin: formatMs(plugin),
      base: formatMs(base),
      ratio: ratio(plugin, base),
      ...rest,
    };
  }
  median(side: string): number {
    const xs = this.#m.get(side);
    if (!xs || xs.length === 0) throw new Error(`store bench: no "${side}" trial ran`);
    return median(xs);
  }
}

/**
 * The plugin's calls, timed from the client the way Nomad waits: CreateSnapshot until the
 * snapshot is ready (ListSnapshots if it answered before the upload ended), CreateVolume again
 * while it says the restore still runs.
 */
class PluginCalls {
  readonly #p: PluginProcess;
  readonly #capacity: number;

  constructor(p: PluginProcess, capacityBytes: number) {
    this.#p = p;
    this.#capacity = capacityBytes;
  }

  get client(): CsiClient {
    return this.#p.client;
  }

  /** Stores a snapshot of the volume; returns the stored snapshot's id once ready. */
  async backup(volumeId: string, name: string): Promise<string> {
    const c = this.#p.client;
    const deadline = Date.now() + TRANSFER_LIMIT_MS;
    const res = await c.controller(
      "CreateSnapshot",
      { source_volume_id: volumeId, name, parameters: {} },
      TRANSFER_DEADLINE_MS,
    );
    let snap = res.snapshot;
    while (snap.ready_to_use !== true) {
      if (Date.now() > deadline) throw new Error(`store bench: "${name}" never became ready`);
      await sleep(100);
      const listed = await c.controller("ListSnapshots", { snapshot_id: snap.snapshot_id });
      snap = listed.entries?.[0]?.snapshot;
      if (!snap) {
        throw new Error(
          `store bench: the upload of "${name}" failed:\n${this.#p.logs().slice(-20).join("\n")}`,
        );
      }
    }
    return snap.snapshot_id;
  }

  /** Creates volume `name` from a stored snapshot; returns its volume id. */
  async restore(name: string, snapshotId: string): Promise<string> {
    const deadline = Date.now() + TRANSFER_LIMIT_MS;
    const req = createVolumeRequest(name, {
      capacity_range: { required_bytes: String(this.#capacity), limit_bytes: "0" },
      volume_content_source: { snapshot: { snapshot_id: snapshotId } },
    });
    for (;;) {
      try {
        const res = await this.#p.client.controller("CreateVolume", req, TRANSFER_DEADLINE_MS);
        return res.volume.volume_id;
      } catch (err) {
        if ((err as CallError).code !== UNAVAILABLE || Date.now() > deadline) throw err;
        await sleep(100);
      }
    }
  }

  async deleteSnapshot(id: string): Promise<void> {
    await this.#p.client.controller("DeleteSnapshot", { snapshot_id: id });
  }

  async deleteVolume(id: string): Promise<void> {
    await this.#p.client.controller("DeleteVolume", { volume_id: id }, TRANSFER_DEADLINE_MS);
  }
}

/** The stage and publish of a claimed volume; returns how long they took (ms). */
async function stagePublish(c: CsiClient, v: Claim): Promise<number> {
  const common = {
    volume_id: v.volumeId,
    volume_capability: mountCapability(),
    volume_context: v.context,
  };
  const t0 = performance.now();
  await c.node("NodeStageVolume", { ...common, staging_target_path: v.staging });
  await c.node("NodePublishVolume", {
    ...common,
    staging_target_path: v.staging,
    target_path: v.target,
    readonly: false,
  });
  return performance.now() - t0;
}

/** The unpublish and unstage of a claimed volume; returns how long they took (ms). */
async function release(c: CsiClient, v: Claim): Promise<number> {
  const t0 = performance.now();
  await c.node("NodeUnpublishVolume", { volume_id: v.volumeId, target_path: v.target });
  await c.node("NodeUnstageVolume", { volume_id: v.volumeId, staging_target_path: v.staging });
  return performance.now() - t0;
}

/** The stage and publish of a claimed volume (timed), then its unpublish and unstage. */
async function stagePublishCycle(c: CsiClient, v: Claim): Promise<number> {
  const ms = await stagePublish(c, v);
  await release(c, v);
  return ms;
}

/** Stage+publish cycles until `running()` is false (at least one). */
async function cyclesWhile(c: CsiClient, v: Claim, running: () => boolean): Promise<number[]> {
  const out: number[] = [];
  do out.push(await stagePublishCycle(c, v)); while (running());
  return out;
}

/** Runs `work` while stage+publish cycles of `v` go on; returns the cycles' times. */
async function cyclesDuring(c: CsiClient, v: Claim, work: Promise<unknown>): Promise<number[]> {
  let running = true;
  const done = work.finally(() => running = false);
  const cycles = await cyclesWhile(c, v, () => running);
  await done;
  return cycles;
}

/**
 * Stage+publish of each of `claims` in turn while `work` runs (at least one), timed; then, after
 * `work`, the unpublish and unstage of each one staged, their times pushed to `released`.
 */
async function stagedDuring(
  c: CsiClient,
  claims: readonly Claim[],
  work: Promise<unknown>,
  released: number[],
): Promise<number[]> {
  let running = true;
  const done = work.finally(() => running = false);
  const times: number[] = [];
  const staged: Claim[] = [];
  try {
    for (const v of claims) {
      staged.push(v);
      times.push(await stagePublish(c, v));
      if (!running) break;
    }
    await done;
  } finally {
    for (const v of staged) released.push(await release(c, v));
  }
  return times;
}

/**
 * The median `ms` the plugin logged for its `msg` lines ("send stored", "receive done") whose
 * snapshot field holds `part`: the transfer's own time inside the plugin.
 */
function loggedMs(p: PluginProcess, msg: string, part: string): number {
  const xs = p.records()
    .filter((r) => r.msg === msg && String(r.snapshot ?? "").includes(part))
    .map((r) => r.ms)
    .filter((ms): ms is number => typeof ms === "number");
  return xs.length > 0 ? median(xs) : NaN;
}

/** One transfer's RSS: the plugin at rest just before it, and the samples during it. */
interface RssTrial {
  readonly idle: number;
  readonly samples: readonly number[];
}

/**
 * A plugin's RSS during transfers, as one row against the issue's budget: the most a transfer
 * raised it above the idle RSS measured just before that transfer. The idle RSS grows by itself
 * with the processes the plugin has started (see "Where the growth came from" in
 * docs/benchmarks.md; the stage+publish cycles before the file store's trials start hundreds), which no
 * transfer causes; the note also gives the peak above the idle RSS before the plugin's first
 * transfer, and each trial's peak, so growth over trials (memory kept) shows too.
 */
function rssRow(what: string, firstIdle: number, trials: readonly RssTrial[]): Row {
  const peakOf = (t: RssTrial) => Math.max(...t.samples);
  const above = Math.max(...trials.map((t) => peakOf(t) - t.idle));
  const peak = Math.max(...trials.map(peakOf));
  const list = (f: (t: RssTrial) => number) => trials.map((t) => f(t).toFixed(0)).join(" / ");
  return {
    section: SECTION,
    what,
    plugin: `${above.toFixed(1)} MiB above idle`,
    base: `${RSS_BUDGET_MIB} MiB`,
    ratio: ratio(above, RSS_BUDGET_MIB),
    target: 1,
    note: `idle just before each trial ${list((t) => t.idle)} MiB, peak ${list(peakOf)} MiB; ` +
      `idle before the plugin's first transfer ${firstIdle.toFixed(1)} MiB, peak ` +
      `${(peak - firstIdle).toFixed(1)} MiB above it; ` +
      `${trials.reduce((n, t) => n + t.samples.length, 0)} samples every 100 ms`,
  };
}

/**
 * Measures the store's rows (section 8) on a pool of its own; see the module doc.
 * @throws when a trial fails, versitygw cannot be started or curl is missing
 */
export async function storeBench(options: StoreBenchOptions): Promise<Row[]> {
  const { quick, progress } = options;
  const cfg: Config = {
    ...quick
      ? { volumeMiB: 64, changedMiB: 4, trials: 1, idleCycles: 10, latVolumes: 8 }
      : { volumeMiB: 1024, changedMiB: 16, trials: 3, idleCycles: 40, latVolumes: 40 },
    ...options.volumeMiB === undefined ? {} : { volumeMiB: options.volumeMiB },
    ...options.trials === undefined ? {} : { trials: options.trials },
  };
  const size = sizeLabel(cfg.volumeMiB);
  const curl = await checkCurl();
  const hashTool = await which("openssl").catch(() => undefined);
  progress(`store: a ${size} volume on its own pool`);
  await using pool = await TestPool.create(Math.max(1024, cfg.volumeMiB * 4));
  const parent = pool.parent;
  const storeDir = `${pool.dir}/store`;
  const floorDir = `${pool.dir}/floor`;
  await Deno.mkdir(storeDir);
  await Deno.mkdir(floorDir);
  const floorFile = `${floorDir}/full.zfs`;
  const capacity = cfg.volumeMiB * 2 * MiB;
  const rows: Row[] = [];
  const times = new Times();
  const rss = new Map<string, RssTrial[]>();
  const addRss = (key: string, trial: RssTrial) => rss.set(key, [...rss.get(key) ?? [], trial]);

  // --- the file store ------------------------------------------------------------------------
  // Disposed (killed) on the way out if a trial throws; stopped in order otherwise.
  await using pf = await PluginProcess.start({
    parentDataset: parent,
    dir: `${pool.dir}/plugin-file`,
    logLevel: "info",
    extraArgs: ["--store", `file://${storeDir}`, "--deleted-retention", "0"],
    scope: { extraDirs: [storeDir] },
  });
  const file = new PluginCalls(pf, capacity);
  const c = pf.client;
  const src = await c.controller(
    "CreateVolume",
    createVolumeRequest("store-src", {
      capacity_range: { required_bytes: String(capacity), limit_bytes: "0" },
    }),
  );
  const srcId: string = src.volume.volume_id;
  const dataset: string = src.volume.volume_context.dataset;
  let mountpoint = (await sh("zfs", "get", "-H", "-o", "value", "mountpoint", dataset)).trim();
  if ((await sh("zfs", "get", "-H", "-o", "value", "mounted", dataset)).trim() !== "yes") {
    await sh("zfs", "mount", dataset);
    mountpoint = (await sh("zfs", "get", "-H", "-o", "value", "mountpoint", dataset)).trim();
  }
  const dataFile = `${mountpoint}/data`;
  progress(`store: writing ${size} of random data`);
  // A new file written whole: the same as overwriting its whole length.
  await overwriteRandom(dataFile, cfg.volumeMiB);
  // What the checked backup floor hashes beside its send: as many bytes, in the page cache.
  const besideFile = `${floorDir}/beside.bin`;
  if (hashTool) await overwriteRandom(besideFile, cfg.volumeMiB);
  // The floors send this one snapshot of the same data.
  const floorSnap = `${dataset}@bench-floor`;
  await sh("zfs", "snapshot", floorSnap);
  const otherRes = await c.controller("CreateVolume", createVolumeRequest("store-other"));
  const other: Claim = {
    volumeId: otherRes.volume.volume_id,
    context: otherRes.volume.volume_context,
    ...await claimPaths(pf.baseDir, { volumeId: "store-other", allocId: "alloc-store-other" }),
  };
  await stagePublishCycle(c, other);
  const fileIdle = await idleRss(pf.pid);

  let streamBytes = 0;
  if (options.s3Only) {
    // The S3 floors upload this file of the stream too.
    await sh("bash", "-c", `zfs send ${shellQuote(floorSnap)} > ${shellQuote(floorFile)}`);
    streamBytes = (await Deno.stat(floorFile)).size;
  } else {
    // The plugin's added latency: stage+publish of another volume without a backup, during one
    // through the plugin, and during a plain zfs send > file (what the disk and zfs alone cost).
    progress("store: stage+publish while a backup runs");
    const lat = { idle: [] as number[], plugin: [] as number[], floor: [] as number[] };
    await interleave(cfg.trials, [
      async () => {
        await syncDisks();
        for (let i = 0; i < cfg.idleCycles; i++) lat.idle.push(await stagePublishCycle(c, other));
      },
      async (t) => {
        await syncDisks();
        let id = "";
        lat.plugin.push(
          ...await cyclesDuring(c, other, file.backup(srcId, `bench-lat-${t}`).then((x) => id = x)),
        );
        await file.deleteSnapshot(id);
      },
      async () => {
        await syncDisks();
        const send = timedBash(
          `zfs send ${shellQuote(floorSnap)} > ${shellQuote(`${floorDir}/lat.zfs`)} && sync`,
        );
        lat.floor.push(...await cyclesDuring(c, other, send));
        await Deno.remove(`${floorDir}/lat.zfs`);
      },
    ]);

    // 1. Backup to the file store: the plugin, the floor, and the engine in this process.
    progress(`store: ${size} backups to the file store`);
    const fileStore = new FileStore(storeDir);
    const zfs = new Zfs(new DenoCommandRunner(), {
      zfsPath: "zfs",
      zpoolPath: "zpool",
      timeoutMs: 120_000,
      log: silent,
    });
    const engine = {
      streams: new DenoStreamRunner(),
      zfsPath: "zfs",
      zfs,
      store: fileStore,
      log: silent,
    };
    const floorGuid = (await sh("zfs", "get", "-Hp", "-o", "value", "guid", floorSnap)).trim();
    let keptFile = "";
    await interleave(cfg.trials, [
      async (t) => {
        await syncDisks();
        const idle = await idleRss(pf.pid);
        const sampler = new RssSampler(pf.pid);
        const { ms, value: id } = await timed(() => file.backup(srcId, `bench-file-${t}`));
        addRss("file backup", { idle, samples: await sampler.stop() });
        times.push("file plugin", ms);
        if (t === cfg.trials - 1) keptFile = id;
        else await file.deleteSnapshot(id);
      },
      async () => {
        // A new file, as the store writes: overwriting the last trial's 1 GiB file made the
        // floor free its blocks while timed (about 250 ms here).
        await Deno.remove(floorFile).catch(() => {});
        await syncDisks();
        times.push(
          "file floor",
          await timedBash(`zfs send ${shellQuote(floorSnap)} > ${shellQuote(floorFile)} && sync`),
        );
        streamBytes = (await Deno.stat(floorFile)).size;
      },
      async () => {
        if (!hashTool) return;
        const out = `${floorDir}/checked.zfs`;
        await syncDisks();
        times.push(
          "file hashed floor",
          await timedBash(checkedSendScript(hashTool, floorSnap, out, besideFile)),
        );
        await Deno.remove(out);
      },
      async () => {
        await syncDisks();
        const key = streamKey("bench-engine", floorGuid, crypto.randomUUID().replaceAll("-", ""));
        const { ms } = await timed(() =>
          sendToStore(engine, { snapshot: floorSnap, raw: false, key })
        );
        times.push("file engine", ms);
        await fileStore.delete(key);
      },
    ]);
    const keptFileManifest = await fileManifest(fileStore, keptFile);
    rows.push(
      times.row(
        `backup of a ${size} volume to the file store (plugin) vs zfs send > file`,
        "file plugin",
        "file floor",
        {
          target: 1.1,
          note:
            `CreateSnapshot until ready, through the plugin process; floor: zfs send ds@snap > ` +
            `DIR/file && sync, same disk; ${mib(keptFileManifest.size)} stream: ` +
            `${rate(keptFileManifest.size, times.median("file plugin"))} vs ` +
            `${rate(streamBytes, times.median("file floor"))}; the send itself (plugin's log) ` +
            `${formatMs(loggedMs(pf, "send stored", "@.stored-bench-file-"))}; ${cfg.trials} trial${
              cfg.trials === 1 ? "" : "s"
            } each`,
        },
      ),
      times.row(
        "  same engine in this process (sendToStore to a FileStore) vs zfs send > file",
        "file engine",
        "file floor",
        {
          target: 1.1,
          note: "send.ts without gRPC or the plugin's process: the engine's own cost",
        },
      ),
    );
    if (hashTool) {
      rows.push(
        times.row(
          "  zfs send > file with as many bytes hashed beside it by openssl vs the same",
          "file hashed floor",
          "file floor",
          {
            note: "no plugin: `openssl dgst -sha256` of a file of the stream's size (in the page " +
              "cache) in its own process while zfs send writes: what any backup that hashes its " +
              "stream costs on this machine's cores, without even waiting for the bytes",
          },
        ),
        times.row("  backup (plugin) vs that checked floor", "file plugin", "file hashed floor", {
          note: "the plugin's cost above a hash made beside the send",
        }),
      );
    }

    // 3. Restore from the file store: the plugin, zfs receive < the stored file, the engine (as
    // the plugin runs it: the file checked, then read by zfs; and through a pipe, as for S3), the
    // same file piped by cat, and the check alone: where the time goes.
    progress(`store: ${size} restores from the file store`);
    const storedFile = `${storeDir}/${keptFileManifest.stream}`;
    await interleave(cfg.trials, [
      async (t) => {
        await syncDisks();
        const idle = await idleRss(pf.pid);
        const sampler = new RssSampler(pf.pid);
        const { ms, value: id } = await timed(() => file.restore(`restore-file-${t}`, keptFile));
        addRss("file restore", { idle, samples: await sampler.stop() });
        times.push("file restore plugin", ms);
        await file.deleteVolume(id);
      },
      async () => {
        await syncDisks();
        const target = `${parent}/floor-recv`;
        times.push(
          "file restore floor",
          await timedBash(`zfs receive -u ${shellQuote(target)} < ${shellQuote(storedFile)}`),
        );
        await destroyTree(target);
      },
      async () => {
        await syncDisks();
        const target = `${parent}/engine-recv`;
        const { ms } = await timed(() =>
          receiveFromStore(engine, { manifest: keptFileManifest, target, readFile: true })
        );
        times.push("file restore engine", ms);
        await destroyTree(target);
      },
      async () => {
        await syncDisks();
        const target = `${parent}/engine-pipe-recv`;
        const { ms } = await timed(() =>
          receiveFromStore(engine, { manifest: keptFileManifest, target })
        );
        times.push("file restore engine pipe", ms);
        await destroyTree(target);
      },
      async () => {
        await syncDisks();
        const target = `${parent}/cat-recv`;
        times.push(
          "file restore cat",
          await timedBash(`cat ${shellQuote(storedFile)} | zfs receive -u ${shellQuote(target)}`),
        );
        await destroyTree(target);
      },
      async () => {
        await syncDisks();
        const { ms } = await timed(() => sha256Of(fileStore, keptFileManifest.stream));
        times.push("file restore check", ms);
      },
      async () => {
        if (!hashTool) return;
        await syncDisks();
        const target = `${parent}/hashed-recv`;
        times.push(
          "file restore hashed floor",
          await timedBash(checkedReceiveScript(hashTool, storedFile, target)),
        );
        await destroyTree(target);
      },
    ]);
    rows.push(
      times.row(
        `restore of a ${size} volume from the file store (plugin) vs zfs receive < file`,
        "file restore plugin",
        "file restore floor",
        {
          target: 1.1,
          note:
            `CreateVolume from the store: id until it answers (receive with size, SHA-256 and ` +
            `guid checks, properties, rename); floor: zfs receive -u ds < the stored stream; ` +
            `${rate(keptFileManifest.size, times.median("file restore plugin"))} vs ` +
            `${rate(keptFileManifest.size, times.median("file restore floor"))}; the receive ` +
            `itself (plugin's log) ${
              formatMs(loggedMs(pf, "receive done", ".stored-bench-file-"))
            }`,
        },
      ),
      times.row(
        "  same engine in this process (receiveFromStore) vs zfs receive < file",
        "file restore engine",
        "file restore floor",
        {
          target: 1.1,
          note:
            "receive.ts as restores run it (the file's size and SHA-256 checked, then the open " +
            "file given to zfs receive as stdin; guid) without gRPC or temp dataset",
        },
      ),
      times.row(
        "  the check alone (SHA-256 of the stored file, in this process) vs the same",
        "file restore check",
        "file restore floor",
        {
          note: `what checking before receiving adds: 4 MiB reads by position (as receive.ts) ` +
            `from the page cache (${
              rate(keptFileManifest.size, times.median("file restore check"))
            })`,
        },
      ),
      times.row(
        "  same engine through a pipe (as from S3) vs the same",
        "file restore engine pipe",
        "file restore floor",
        {
          note: "the download hashed as it is written to zfs receive's stdin, last chunk held back",
        },
      ),
      times.row("  cat file | zfs receive vs the same", "file restore cat", "file restore floor", {
        note: "what a pipe alone costs zfs receive (zfs-fuse reads a pipe slowly)",
      }),
    );
    if (hashTool) {
      rows.push(
        times.row(
          "  zfs receive < file with the file hashed beside it by openssl vs the same",
          "file restore hashed floor",
          "file restore floor",
          {
            note: "no plugin: `openssl dgst -sha256 file` in its own process while zfs receive " +
              "reads the same file, what any restore that checks the SHA-256 while zfs reads costs " +
              "on this machine's cores",
          },
        ),
        times.row(
          "  restore (plugin) vs that checked floor",
          "file restore plugin",
          "file restore hashed floor",
          { note: "the plugin's cost above a check made beside the receive" },
        ),
      );
    } else {
      progress("store: no openssl on PATH: the checked floor's rows are left out");
    }

    // 4. Incremental: a small change, stored on top of the kept full backup.
    progress(`store: incremental backups of ${cfg.changedMiB} MiB changed`);
    let fileBase = keptFileManifest;
    const incBytes: number[] = [];
    const incFloorBytes: number[] = [];
    for (let t = 0; t < cfg.trials; t++) {
      await changeData(dataFile, cfg, t);
      const pluginSide = async () => {
        await syncDisks();
        const { ms, value: id } = await timed(() => file.backup(srcId, `bench-inc-file-${t}`));
        times.push("file inc plugin", ms);
        const m = await fileManifest(fileStore, id);
        if (m.baseGuid !== fileBase.guid) {
          throw new Error(`store bench: "${m.snapshot}" was not sent incrementally`);
        }
        incBytes.push(m.size);
        return m;
      };
      const floorSide = async () => {
        await syncDisks();
        const snap = `${dataset}@bench-inc-floor-${t}`;
        await sh("zfs", "snapshot", snap);
        const out = `${floorDir}/inc.zfs`;
        const base = `${dataset}@${fileBase.snapshot}`;
        times.push(
          "file inc floor",
          await timedBash(
            `zfs send -i ${shellQuote(base)} ${shellQuote(snap)} > ${shellQuote(out)} && sync`,
          ),
        );
        incFloorBytes.push((await Deno.stat(out)).size);
        await Deno.remove(out);
        await destroyTree(snap);
      };
      // Alternating which goes first; both send the same change from the same base.
      if (t % 2 === 0) {
        const m = await pluginSide();
        await floorSide();
        fileBase = m;
      } else {
        await floorSide();
        fileBase = await pluginSide();
      }
    }
    rows.push(
      times.row(
        `incremental backup, ${cfg.changedMiB} MiB changed of ${size}, file store (plugin)`,
        "file inc plugin",
        "file inc floor",
        {
          note:
            `bytes moved (manifest size) ${mib(median(incBytes))}; floor zfs send -i > file && ` +
            `sync, ${mib(median(incFloorBytes))}`,
        },
      ),
    );
    rows.push(
      rssRow(`RSS during ${size} backups to the file store`, fileIdle, rss.get("file backup")!),
      rssRow(`RSS during ${size} restores from the file store`, fileIdle, rss.get("file restore")!),
    );
    const during = median(lat.plugin);
    const without = median(lat.idle);
    const plain = median(lat.floor);
    rows.push(
      {
        section: SECTION,
        what: `stage+publish of another volume during a ${size} backup vs without`,
        plugin: formatMs(during),
        base: formatMs(without),
        ratio: ratio(during, without),
        note: `medians ${formatMs(during)} during, ${formatMs(without)} without (p90 ` +
          `${formatMs(percentile(lat.plugin, 90))} / ${formatMs(percentile(lat.idle, 90))}); ` +
          `${lat.plugin.length} / ${lat.idle.length} calls; target: none measurable`,
      },
      {
        section: SECTION,
        what: "  same, during the backup vs during a plain zfs send > file",
        plugin: formatMs(during),
        base: formatMs(plain),
        ratio: ratio(during, plain),
        note:
          `${lat.floor.length} calls during zfs send ds@snap > file && sync: what a busy disk ` +
          `and zfs cost without the plugin; ${navigator.hardwareConcurrency} cores`,
      },
    );
  }
  await pf.stop();
  if (options.fileOnly) return rows;

  // --- S3 (versitygw) ------------------------------------------------------------------------
  progress("store: starting versitygw");
  await using s3 = await S3Server.start();
  await using ps = await PluginProcess.start({
    parentDataset: parent,
    dir: `${pool.dir}/plugin-s3`,
    logLevel: "info",
    extraArgs: [
      "--store",
      `s3://${s3.bucket}`,
      "--store-endpoint",
      s3.endpoint.origin,
      "--store-path-style",
      "--store-region",
      s3.region,
      "--deleted-retention",
      "0",
    ],
    scope: { netHosts: [s3.endpoint.host] },
    env: { AWS_ACCESS_KEY_ID: s3.accessKeyId, AWS_SECRET_ACCESS_KEY: s3.secretAccessKey },
  });
  const s3Calls = new PluginCalls(ps, capacity);
  const s3Idle = await idleRss(ps.pid);
  const bucketUrl = `${s3.endpoint.origin}/${s3.bucket}`;
  const curlEnv = { AK: s3.accessKeyId, SK: s3.secretAccessKey };
  // curl 7.x signs no payload hash of its own; S3 wants one, and UNSIGNED-PAYLOAD is allowed.
  const curlS3 = `curl -sS --fail --aws-sigv4 aws:amz:${s3.region}:s3 --user "$AK:$SK" ` +
    `-H 'x-amz-content-sha256: UNSIGNED-PAYLOAD'`;
  const floorUrl = shellQuote(`${bucketUrl}/bench-floor/full.zfs`);
  if (streamBytes === 0) throw new Error("store bench: the file floor wrote no stream");

  // The piped floors hash with openssl where it is there: coreutils' sha256sum uses no SHA
  // instructions here (1.64 against 0.20 CPU-seconds for 256 MiB), node:crypto does.
  const hasher = hashTool ? `${shellQuote(hashTool)} dgst -sha256` : "sha256sum";
  const sgw = await s3Pid(s3);
  const fusePid = await zfsFusePid();
  /** CPU-seconds of the plugin, its floor's processes, zfs-fuse and versitygw over a trial. */
  const cpu = new Map<string, number[]>();
  const addCpu = (key: string, seconds: number) => cpu.set(key, [...cpu.get(key) ?? [], seconds]);
  const cpuTrial = async <T>(side: string, pid: number | "self", fn: () => Promise<T>) => {
    const before = [
      await cpuSeconds(pid, pid === "self"),
      await cpuSeconds(fusePid),
      await cpuSeconds(sgw),
    ];
    const value = await fn();
    const after = [
      await cpuSeconds(pid, pid === "self"),
      await cpuSeconds(fusePid),
      await cpuSeconds(sgw),
    ];
    addCpu(side, after[0]! - before[0]!);
    addCpu(`${side} zfs-fuse`, after[1]! - before[1]!);
    addCpu(`${side} versitygw`, after[2]! - before[2]!);
    return value;
  };
  // What the floor streams: the plugin's own form of the same data (plain on zfs-fuse), as
  // an untimed first backup to S3 shows it.
  const warmUp = await s3Calls.backup(srcId, "bench-s3-form");
  const s3Form = formFlags(
    (await s3Manifest(s3, warmUp)).form ??
      { compressed: false, largeBlocks: false, embedded: false },
  );
  await s3Calls.deleteSnapshot(warmUp);
  const floorSend = `zfs send ${s3Form === "" ? "" : `${s3Form} `}${shellQuote(floorSnap)}`;
  const pipedBytes = Number(
    (await sh("bash", "-c", `set -o pipefail; ${floorSend} | wc -c`)).trim(),
  );

  // The piped floor of a backup to S3 (section 2 below says what it does).
  const pipedFloor = `f=$(mktemp -u); mkfifo "$f"; ${hasher} < "$f" > /dev/null & h=$!\n` +
    `${floorSend} | tee "$f" | ${curlS3} -T - -H 'Content-Length: ${pipedBytes}' ` +
    `-H 'Transfer-Encoding:' ${floorUrl} -o /dev/null\nwait "$h"; rm "$f"`;

  // Stage+publish of other volumes while the plugin backs up to S3, against during a plain
  // zfs send > file: faster uploads must not starve volume calls. Before the backup trials:
  // the store holds no snapshot of the volume yet, so each backup here is a full one (later,
  // with the kept one as base, it would be an empty increment, which is what this row timed
  // until 2026-11-28). Each volume is staged and published once and released after the
  // transfer, so that the samples are stage+publish calls one after another.
  progress("store: stage+publish while a backup to S3 runs");
  const others: Claim[] = [];
  for (let i = 0; i < cfg.latVolumes; i++) {
    const name = `store-other-s3-${i}`;
    const res = await ps.client.controller("CreateVolume", createVolumeRequest(name));
    others.push({
      volumeId: res.volume.volume_id,
      context: res.volume.volume_context,
      ...await claimPaths(ps.baseDir, { volumeId: name, allocId: `alloc-${name}` }),
    });
  }
  // Each staged once before: no trial pays a volume's first mount.
  for (const v of others) await stagePublishCycle(ps.client, v);
  const latS3 = {
    plugin: [] as number[],
    floor: [] as number[],
    piped: [] as number[],
    release: [] as number[],
  };
  await interleave(cfg.trials, [
    async (t) => {
      await syncDisks();
      let id = "";
      latS3.plugin.push(
        ...await stagedDuring(
          ps.client,
          others,
          s3Calls.backup(srcId, `bench-s3-lat-${t}`).then((x) => id = x),
          latS3.release,
        ),
      );
      await s3Calls.deleteSnapshot(id);
    },
    async () => {
      await syncDisks();
      const send = timedBash(
        `zfs send ${shellQuote(floorSnap)} > ${shellQuote(`${floorDir}/lat.zfs`)} && sync`,
      );
      latS3.floor.push(...await stagedDuring(ps.client, others, send, latS3.release));
      await Deno.remove(`${floorDir}/lat.zfs`);
    },
    async () => {
      await syncDisks();
      const upload = timedBash(pipedFloor, curlEnv);
      latS3.piped.push(...await stagedDuring(ps.client, others, upload, latS3.release));
    },
  ]);
  rows.push({
    section: SECTION,
    what:
      `stage+publish of another volume during a ${size} backup to S3 vs during a plain zfs send`,
    plugin: formatMs(median(latS3.plugin)),
    base: formatMs(median(latS3.floor)),
    ratio: ratio(median(latS3.plugin), median(latS3.floor)),
    target: 1.1,
    note:
      `p90 ${formatMs(percentile(latS3.plugin, 90))} / ${formatMs(percentile(latS3.floor, 90))}; ` +
      `${latS3.plugin.length} / ${latS3.floor.length} calls (each of ${cfg.latVolumes} volumes ` +
      `once a trial, released after it: unpublish+unstage median ${
        formatMs(median(latS3.release))
      }); ` +
      `floor: zfs send ds@snap > file && sync`,
  }, {
    section: SECTION,
    what: "  same, during the backup vs during the piped floor's upload to the same versitygw",
    plugin: formatMs(median(latS3.plugin)),
    base: formatMs(median(latS3.piped)),
    ratio: ratio(median(latS3.plugin), median(latS3.piped)),
    note: `p90 ${formatMs(percentile(latS3.piped, 90))}; ${latS3.piped.length} calls during ` +
      "zfs send | tee >(openssl dgst) | curl -T -: the same transfer by plain tools, with " +
      "versitygw and zfs-fuse as busy on these cores as during the plugin's",
  });

  // 2. Backup to S3: the plugin against the floor doing the same work with plain tools: zfs
  // send, hashed beside the upload, streamed into one PutObject by curl. versitygw answers 411
  // to a body without a length (curl -T - sends it chunked), so the floor tells curl the length
  // in advance (the stream's size, measured before), which no real backup knows: the nearest
  // curl can do.
  progress(`store: ${size} backups to S3`);
  let keptS3 = "";
  await interleave(cfg.trials, [
    async (t) => {
      await syncDisks();
      const idle = await idleRss(ps.pid);
      const sampler = new RssSampler(ps.pid);
      const { ms, value: id } = await cpuTrial(
        "s3 plugin",
        ps.pid,
        () => timed(() => s3Calls.backup(srcId, `bench-s3-${t}`)),
      );
      addRss("s3 backup", { idle, samples: await sampler.stop() });
      times.push("s3 plugin", ms);
      if (t === cfg.trials - 1) keptS3 = id;
      else await s3Calls.deleteSnapshot(id);
    },
    async () => {
      await syncDisks();
      times.push(
        "s3 piped floor",
        await cpuTrial("s3 piped floor", "self", () => timedBash(pipedFloor, curlEnv)),
      );
    },
    async () => {
      await syncDisks();
      times.push(
        "s3 floor",
        await timedBash(`${curlS3} -T ${shellQuote(floorFile)} ${floorUrl} -o /dev/null`, curlEnv),
      );
    },
    async () => {
      await Deno.remove(floorFile).catch(() => {});
      await syncDisks();
      times.push(
        "s3 script",
        await timedBash(
          `zfs send ${shellQuote(floorSnap)} > ${shellQuote(floorFile)}\n` +
            `${curlS3} -T ${shellQuote(floorFile)} ${floorUrl} -o /dev/null`,
          curlEnv,
        ),
      );
    },
  ]);
  const keptS3Manifest = await s3Manifest(s3, keptS3);
  rows.push(
    times.row(
      `backup of a ${size} volume to S3 (plugin) vs zfs send | tee >(${
        hasher.split(" ")[0]!.split("/").at(-1)
      } dgst) | curl -T -`,
      "s3 plugin",
      "s3 piped floor",
      {
        target: 1.25,
        note: `versitygw on 127.0.0.1; plugin: zfs send streamed as a multipart upload (8 MiB ` +
          `parts, 2 in flight, UNSIGNED-PAYLOAD over loopback, by its own HTTP/1.1 client on ` +
          `Deno.connect), SHA-256 on its main thread; floor: ${floorSend} | tee fifo | ${curl} ` +
          `--aws-sigv4 -T - with Content-Length given in advance (versitygw answers 411 to a ` +
          `chunked body), ${hasher} reading the fifo; ` +
          `${rate(keptS3Manifest.size, times.median("s3 plugin"))} vs ` +
          `${rate(pipedBytes, times.median("s3 piped floor"))}; the send itself (plugin's log) ` +
          `${formatMs(loggedMs(ps, "send stored", "@.stored-bench-s3-"))}`,
      },
    ),
    cpuRow(
      `CPU-seconds per GiB of a ${size} backup to S3: plugin vs that floor`,
      cpu,
      "s3 plugin",
      "s3 piped floor",
      keptS3Manifest.size,
      "plugin: its process and the zfs commands it ran (/proc utime+stime, children reaped); " +
        "floor: every process of its pipeline (bash's children)",
    ),
    times.row(
      "  same vs one PutObject by curl -T of the stream, on disk already",
      "s3 plugin",
      "s3 floor",
      {
        note: `${curl} --aws-sigv4 -T file: the upload alone (no zfs send, no hash); ` +
          `${rate(streamBytes, times.median("s3 floor"))}`,
      },
    ),
    times.row("  same vs zfs send > file, then curl -T file", "s3 plugin", "s3 script", {
      note: "what a script does that cannot stream into one PutObject",
    }),
  );

  // 3. Restore from S3: the plugin against curl's download hashed beside zfs receive.
  progress(`store: ${size} restores from S3`);
  const streamUrl = shellQuote(`${bucketUrl}/${keptS3Manifest.stream}`);
  await interleave(cfg.trials, [
    async (t) => {
      await syncDisks();
      const idle = await idleRss(ps.pid);
      const sampler = new RssSampler(ps.pid);
      const { ms, value: id } = await cpuTrial(
        "s3 restore plugin",
        ps.pid,
        () => timed(() => s3Calls.restore(`restore-s3-${t}`, keptS3)),
      );
      addRss("s3 restore", { idle, samples: await sampler.stop() });
      times.push("s3 restore plugin", ms);
      await s3Calls.deleteVolume(id);
    },
    async () => {
      await syncDisks();
      const target = `${parent}/floor-recv`;
      times.push(
        "s3 restore piped floor",
        await cpuTrial("s3 restore piped floor", "self", () =>
          timedBash(
            `f=$(mktemp -u); mkfifo "$f"; ${hasher} < "$f" > /dev/null & h=$!\n` +
              `${curlS3} ${streamUrl} | tee "$f" | zfs receive -u ${shellQuote(target)}\n` +
              `wait "$h"; rm "$f"`,
            curlEnv,
          )),
      );
      await destroyTree(target);
    },
    async () => {
      await syncDisks();
      const target = `${parent}/floor-recv`;
      times.push(
        "s3 restore floor",
        await timedBash(`${curlS3} ${streamUrl} | zfs receive -u ${shellQuote(target)}`, curlEnv),
      );
      await destroyTree(target);
    },
  ]);
  rows.push(
    times.row(
      `restore of a ${size} volume from S3 (plugin) vs curl | tee >(dgst) | zfs receive`,
      "s3 restore plugin",
      "s3 restore piped floor",
      {
        target: 1.15,
        note: `floor: ${curl} --aws-sigv4 GET of the stored stream | tee fifo | zfs receive -u ` +
          `ds, ${hasher} reading the fifo; ` +
          `${rate(keptS3Manifest.size, times.median("s3 restore plugin"))} vs ` +
          `${rate(keptS3Manifest.size, times.median("s3 restore piped floor"))}; the receive ` +
          `itself (plugin's log) ${formatMs(loggedMs(ps, "receive done", ".stored-bench-s3-"))}`,
      },
    ),
    cpuRow(
      `CPU-seconds per GiB of a ${size} restore from S3: plugin vs that floor`,
      cpu,
      "s3 restore plugin",
      "s3 restore piped floor",
      keptS3Manifest.size,
      "plugin: its process and the zfs commands it ran; floor: every process of its pipeline",
    ),
    times.row(
      "  same vs curl | zfs receive (no hash)",
      "s3 restore plugin",
      "s3 restore floor",
      { note: "the download piped into zfs receive, nothing checked" },
    ),
  );

  // 4. Incremental to S3, on top of the kept full backup.
  let s3Base = keptS3Manifest;
  const s3IncBytes: number[] = [];
  for (let t = 0; t < cfg.trials; t++) {
    await changeData(dataFile, cfg, cfg.trials + t);
    await syncDisks();
    const { ms, value: id } = await timed(() => s3Calls.backup(srcId, `bench-inc-s3-${t}`));
    times.push("s3 inc plugin", ms);
    const m = await s3Manifest(s3, id);
    if (m.baseGuid !== s3Base.guid) {
      throw new Error(`store bench: "${m.snapshot}" was not sent incrementally`);
    }
    s3IncBytes.push(m.size);
    s3Base = m;
  }
  rows.push(
    {
      section: SECTION,
      what: `incremental backup, ${cfg.changedMiB} MiB changed of ${size}, S3 (plugin)`,
      plugin: formatMs(times.median("s3 inc plugin")),
      note: `bytes moved (manifest size) ${mib(median(s3IncBytes))}`,
    },
    rssRow(`RSS during ${size} backups to S3`, s3Idle, rss.get("s3 backup")!),
    rssRow(`RSS during ${size} restores from S3`, s3Idle, rss.get("s3 restore")!),
  );
  await ps.stop();
  // 5. Stored bytes against the pool's, on a pool and plugin of their own.
  rows.push(
    ...await streamBytesRows({ dataMiB: quick ? 32 : 256, section: SECTION, progress }),
  );
  return rows;
}

/** Clock ticks per second of /proc/<pid>/stat's times (USER_HZ: 100 on Linux). */
const TICKS = 100;

/**
 * CPU-seconds of a process from /proc/<pid>/stat: its own and those of its children it has
 * waited for (zfs commands the plugin ran), or with `childrenOnly` those children's alone
 * ("self": a floor's bash and its pipeline, waited for by this process); 0 without a pid.
 */
async function cpuSeconds(pid: number | "self" | undefined, childrenOnly = false): Promise<number> {
  if (pid === undefined) return 0;
  const stat = await Deno.readTextFile(`/proc/${pid}/stat`);
  const f = stat.slice(stat.lastIndexOf(")") + 2).split(" ").map(Number);
  // utime, stime, cutime, cstime: fields 14 to 17, here 11 to 14.
  const own = f[11]! + f[12]!;
  const children = f[13]! + f[14]!;
  return (childrenOnly ? children : own + children) / TICKS;
}

/** The pid of this bench's versitygw (by its unique access key), or undefined. */
async function s3Pid(s3: S3Server): Promise<number | undefined> {
  const r = await tryRun("pgrep", "-f", "--", `--access ${s3.accessKeyId} `);
  const pid = Number(r.stdout.trim().split("\n")[0]);
  return Number.isInteger(pid) && pid > 0 ? pid : undefined;
}

/** The zfs-fuse daemon's pid; undefined on OpenZFS (zfs runs in the kernel). */
async function zfsFusePid(): Promise<number | undefined> {
  const r = await tryRun("pgrep", "-x", "zfs-fuse");
  const pid = Number(r.stdout.trim().split("\n")[0]);
  return Number.isInteger(pid) && pid > 0 ? pid : undefined;
}

/**
 * A row of CPU-seconds per GiB moved: the median over trials of `side`'s processes against the
 * floor's, with zfs-fuse's and versitygw's in the note (they serve both alike).
 */
function cpuRow(
  what: string,
  cpu: ReadonlyMap<string, number[]>,
  side: string,
  floor: string,
  bytes: number,
  note: string,
): Row {
  const perGiB = (key: string) => median(cpu.get(key) ?? [NaN]) / (bytes / (1024 * MiB));
  const [plugin, base] = [perGiB(side), perGiB(floor)];
  const others = (key: string) =>
    `zfs-fuse ${perGiB(`${key} zfs-fuse`).toFixed(2)}, versitygw ${
      perGiB(`${key} versitygw`).toFixed(2)
    }`;
  return {
    section: SECTION,
    what,
    plugin: `${plugin.toFixed(2)} CPU-s/GiB`,
    base: `${base.toFixed(2)} CPU-s/GiB`,
    ratio: ratio(plugin, base),
    note: `${note}; beside them, per GiB: plugin's trials ${others(side)}; floor's ` +
      `${others(floor)} (0 where not running: OpenZFS sends in the kernel)`,
  };
}

/** The manifest of a stored snapshot in the file store. */
async function fileManifest(store: FileStore, snapshotId: string): Promise<SnapshotManifest> {
  const key = manifestKeyOf(snapshotId);
  const got = await store.getBytes(key);
  if (!got) throw new Error(`store bench: no manifest at ${key}`);
  return parseManifest(got.bytes, { key });
}

/** The manifest of a stored snapshot in the S3 bucket. */
async function s3Manifest(s3: S3Server, snapshotId: string): Promise<SnapshotManifest> {
  const key = manifestKeyOf(snapshotId);
  const r = await signedFetch(s3, "GET", new URL(`/${s3.bucket}/${key}`, s3.endpoint));
  const bytes = new Uint8Array(await r.arrayBuffer());
  if (!r.ok) throw new Error(`store bench: GET ${key} answered ${r.status}`);
  return parseManifest(bytes, { key });
}

function manifestKeyOf(snapshotId: string): string {
  const ref = parseStoredSnapshotId(snapshotId);
  if (!ref) throw new Error(`store bench: "${snapshotId}" is not a stored snapshot id`);
  return manifestKey(ref.volumeKey, ref.guid);
}

/** Overwrites `changedMiB` MiB of the data file with new random bytes (trial `t`'s region). */
async function changeData(dataFile: string, cfg: Config, t: number): Promise<void> {
  const regions = Math.floor(cfg.volumeMiB / cfg.changedMiB);
  await overwriteRandom(dataFile, cfg.changedMiB, (t % regions) * cfg.changedMiB);
}

/**
 * `zfs receive -u target < file` with `openssl dgst -sha256 file` running beside it in its own
 * process: a restore that checks the stream while zfs reads it, with no plugin. Fails when
 * either fails.
 */
function checkedReceiveScript(openssl: string, file: string, target: string): string {
  const [f, t] = [shellQuote(file), shellQuote(target)];
  return `${shellQuote(openssl)} dgst -sha256 ${f} > /dev/null & hashing=$!\n` +
    `zfs receive -u ${t} < ${f}\nwait "$hashing"`;
}

/**
 * `zfs send snap > out && sync` with `openssl dgst -sha256 beside` running in its own process at
 * the same time: a backup that hashes as many bytes as it sends, with no plugin. Fails when
 * either fails.
 */
function checkedSendScript(openssl: string, snap: string, out: string, beside: string): string {
  return `${shellQuote(openssl)} dgst -sha256 ${shellQuote(beside)} > /dev/null & hashing=$!\n` +
    `zfs send ${shellQuote(snap)} > ${shellQuote(out)}\nwait "$hashing"\nsync`;
}

/** Size and SHA-256 of a stored object read through {@linkcode FileStore.openFile}. */
async function sha256Of(store: FileStore, key: string): Promise<string> {
  const file = await store.openFile(key);
  try {
    const hash = createHash("sha256");
    const buffer = new Uint8Array(4 * MiB);
    for (let position = 0;;) {
      const n = await file.read(buffer, position);
      if (n === 0) break;
      hash.update(buffer.subarray(0, n));
      position += n;
    }
    return hash.digest("hex");
  } finally {
    await file.close();
  }
}

if (import.meta.main) {
  // ZFS_CSI_BENCH_TRIALS: more trials per row when three leave the medians too noisy to judge.
  const trials = Number(Deno.env.get("ZFS_CSI_BENCH_TRIALS") ?? "");
  await runSectionAlone((o) =>
    storeBench({
      ...o,
      fileOnly: Deno.env.get("ZFS_CSI_BENCH_STORE") === "file",
      s3Only: Deno.env.get("ZFS_CSI_BENCH_STORE") === "s3",
      ...Number.isInteger(trials) && trials > 0 ? { trials } : {},
    })
  );
}
