/**
 * Memory soak: the plugin, run as it ships (`deno run` with the production permission and V8
 * flags), through many full volume lifecycles as Nomad drives them: CreateVolume, stage,
 * publish, unpublish, unstage, DeleteVolume, with Probe and NodeGetInfo (fingerprinting) each
 * time and, every 10 lifecycles, an extra create/delete and a ListVolumes. Its RSS is read from
 * /proc/<pid>/status at regular intervals, and its live heap after a forced full GC through
 * bench/heap_probe.ts (preloaded; the binary exposes no GC). Prints the samples, first/last/peak,
 * the growth over the last half and a verdict against the target (bench/soak_stats.ts). The
 * probe's forced GCs (one per sample) can lower RSS a little; --no-heap runs without it.
 *
 *   deno task bench:soak [--lifecycles N] [--minutes M] [--every N] [--idle-seconds S] [--no-heap]
 *   (or ZFS_CSI_SOAK_LIFECYCLES, ZFS_CSI_SOAK_MINUTES; flags win)
 *
 * Stops at whichever bound comes first. ZFS_CSI_PLUGIN_DENO runs the plugin under another Deno.
 * Deleted volumes are destroyed at once (--deleted-retention 0), so the pool does not fill.
 */

import { parseArgs } from "node:util";
import { fileURLToPath } from "node:url";
import { CsiClient } from "../tests/support/csi_client.ts";
import { claimPaths, mountCapability } from "../tests/support/nomad.ts";
import { PluginProcess } from "../tests/support/plugin_process.ts";
import { TestPool } from "../tests/support/zfs_pool.ts";
import {
  extent,
  FLAT_TOLERANCE_MIB,
  formatSamples,
  type HeapReport,
  heapReportPath,
  lastHalfGrowth,
  type SoakSample,
  soakVerdict,
  TARGET_RSS_MIB,
} from "./soak_stats.ts";

const PROBE = fileURLToPath(new URL("./heap_probe.ts", import.meta.url));
const VOLUME_BYTES = 64 * 1024 * 1024;
const CAP = mountCapability();
/** Nomad's controller calls each come on a fresh connection; the soak renews its every N. */
const CONTROLLER_CONNECTION_LIFECYCLES = 25;

const { values } = parseArgs({
  args: Deno.args,
  options: {
    lifecycles: { type: "string" },
    minutes: { type: "string" },
    every: { type: "string" },
    "idle-seconds": { type: "string" },
    "no-heap": { type: "boolean" },
  },
});

function positive(name: string, raw: string | undefined, fallback: number): number {
  const v = Number(raw ?? fallback);
  if (!Number.isFinite(v) || v <= 0) throw new RangeError(`${name} must be a positive number`);
  return v;
}

const lifecycles = Math.floor(
  positive("--lifecycles", values.lifecycles ?? Deno.env.get("ZFS_CSI_SOAK_LIFECYCLES"), 20_000),
);
const minutes = positive("--minutes", values.minutes ?? Deno.env.get("ZFS_CSI_SOAK_MINUTES"), 240);
const every = Math.floor(positive("--every", values.every, Math.ceil(lifecycles / 40)));
const idleSeconds = Number(values["idle-seconds"] ?? 30);
const withHeap = values["no-heap"] !== true;

const encoder = new TextEncoder();
function out(line: string): void {
  Deno.stdout.writeSync(encoder.encode(line + "\n"));
}
function progress(line: string): void {
  Deno.stderr.writeSync(encoder.encode(`soak: ${line}\n`));
}

async function rssMiB(pid: number): Promise<number> {
  const status = await Deno.readTextFile(`/proc/${pid}/status`);
  return Number(/VmRSS:\s+(\d+) kB/.exec(status)?.[1] ?? NaN) / 1024;
}

/** Asks the preloaded probe for a fresh report and waits for it (10 s at most). */
async function heapReport(pid: number, path: string, lastSeq: number): Promise<HeapReport> {
  Deno.kill(pid, "SIGUSR1");
  const deadline = Date.now() + 10_000;
  while (Date.now() < deadline) {
    try {
      const r = JSON.parse(await Deno.readTextFile(path)) as HeapReport;
      if (r.seq > lastSeq) return r;
    } catch {
      // Not written yet.
    }
    await new Promise((r) => setTimeout(r, 20));
  }
  throw new Error("the heap probe did not answer within 10 s");
}

await using pool = await TestPool.create(1024);
const dir = `${pool.dir}/soak`;
await Deno.mkdir(dir, { recursive: true });
await using plugin = await PluginProcess.start({
  parentDataset: pool.parent,
  dir,
  logLevel: "info",
  extraArgs: ["--deleted-retention", "0"],
  ...(withHeap ? { denoFlags: [`--preload=${PROBE}`] } : {}),
});
const heapPath = heapReportPath(`unix://${plugin.socketPath}`);
const node = plugin.client;
let controller = new CsiClient(plugin.socketPath);

const samples: SoakSample[] = [];
let heapSeq = 0;
const t0 = performance.now();
async function sample(done: number): Promise<SoakSample> {
  // RSS first: the probe's forced GC would lower it.
  const rss = await rssMiB(plugin.pid);
  let heapMiB: number | undefined;
  if (withHeap) {
    const r = await heapReport(plugin.pid, heapPath, heapSeq);
    heapSeq = r.seq;
    heapMiB = r.heapUsed / 1024 / 1024;
  }
  const s: SoakSample = {
    lifecycles: done,
    seconds: (performance.now() - t0) / 1000,
    rssMiB: rss,
    ...(heapMiB === undefined ? {} : { heapMiB }),
  };
  samples.push(s);
  return s;
}

async function createVolume(name: string) {
  const res = await controller.controller("CreateVolume", {
    name,
    capacity_range: { required_bytes: String(VOLUME_BYTES) },
    volume_capabilities: [CAP],
    parameters: {},
  });
  return res.volume as { volume_id: string; volume_context: Record<string, string> };
}

/** One full lifecycle of a fresh volume, as Nomad drives it, and the directories Nomad removes. */
async function lifecycle(i: number): Promise<void> {
  await node.identity("Probe");
  await node.node("NodeGetInfo");
  const name = `soak-${i}`;
  const v = await createVolume(name);
  const paths = await claimPaths(plugin.baseDir, { volumeId: name, allocId: `alloc-${i}` });
  const common = {
    volume_id: v.volume_id,
    volume_capability: CAP,
    volume_context: v.volume_context,
  };
  await node.node("NodeStageVolume", { ...common, staging_target_path: paths.staging });
  await node.node("NodePublishVolume", {
    ...common,
    staging_target_path: paths.staging,
    target_path: paths.target,
    readonly: false,
  });
  await node.node("NodeUnpublishVolume", { volume_id: v.volume_id, target_path: paths.target });
  await node.node("NodeUnstageVolume", {
    volume_id: v.volume_id,
    staging_target_path: paths.staging,
  });
  await Deno.remove(`${plugin.baseDir}/per-alloc/alloc-${i}`, { recursive: true });
  await Deno.remove(`${plugin.baseDir}/staging/default/${name}`, { recursive: true });
  await deleteVolume(v.volume_id);
  if (i % 10 === 0) {
    const extra = await createVolume(`${name}-cd`);
    await deleteVolume(extra.volume_id);
    await controller.controller("ListVolumes", {});
  }
  if (i % CONTROLLER_CONNECTION_LIFECYCLES === 0) {
    controller.close();
    controller = new CsiClient(plugin.socketPath);
  }
}

/** DeleteVolume, again while zfs-fuse calls a dataset that was just unmounted busy. */
async function deleteVolume(volumeId: string): Promise<void> {
  for (let attempt = 0;; attempt++) {
    try {
      await controller.controller("DeleteVolume", { volume_id: volumeId });
      return;
    } catch (err) {
      if (attempt >= 20 || !/busy/i.test(String((err as Error).message))) throw err;
      await new Promise((r) => setTimeout(r, 250));
    }
  }
}

progress(
  `up to ${lifecycles.toLocaleString("en")} lifecycles or ${minutes} min, a sample every ` +
    `${every}; plugin pid ${plugin.pid}, started in ${plugin.startupMs.toFixed(0)} ms`,
);
await sample(0);
const deadline = t0 + minutes * 60_000;
let done = 0;
while (done < lifecycles && performance.now() < deadline) {
  await lifecycle(++done);
  if (done % every === 0) {
    const s = await sample(done);
    progress(`${done} lifecycles, RSS ${s.rssMiB.toFixed(1)} MiB`);
  }
}
if (samples.at(-1)!.lifecycles !== done) await sample(done);
const atEnd = samples.at(-1)!;
controller.close();
await new Promise((r) => setTimeout(r, idleSeconds * 1000));
const idleRss = await rssMiB(plugin.pid);

const elapsed = (performance.now() - t0) / 1000;
const rss = extent(samples.map((s) => s.rssMiB));
const heaps = samples.flatMap((s) => s.heapMiB === undefined ? [] : [s.heapMiB]);
const growth = lastHalfGrowth(samples, (s) => s.rssMiB);
const heapGrowth = lastHalfGrowth(samples, (s) => s.heapMiB);
const verdict = soakVerdict(atEnd.rssMiB, growth);

const deno = Deno.env.get("ZFS_CSI_PLUGIN_DENO") ?? Deno.execPath();
out(
  `soak: ${done.toLocaleString("en")} full lifecycles (+${
    Math.floor(done / 10)
  } create/delete and ListVolumes) in ${(elapsed / 60).toFixed(1)} min` +
    `${done < lifecycles ? ` (time bound reached before ${lifecycles})` : ""}; plugin on ${deno}`,
);
out("");
out(formatSamples(samples));
out("");
const f = (v: number) => `${v.toFixed(1)} MiB`;
const lines: [string, string][] = [
  ["samples", String(samples.length)],
  ["RSS first / last / peak", `${f(rss.first)} / ${f(rss.last)} / ${f(rss.peak)}`],
  [`RSS after ${idleSeconds} s idle`, f(idleRss)],
  ["RSS growth, last half", `${f(growth)} (least-squares line through its samples)`],
];
if (heaps.length > 0) {
  const h = extent(heaps);
  lines.push(["live heap first / last / peak", `${f(h.first)} / ${f(h.last)} / ${f(h.peak)}`]);
  lines.push(["live heap growth, last half", f(heapGrowth)]);
}
const width = Math.max(...lines.map(([k]) => k.length));
for (const [k, v] of lines) out(`${k.padEnd(width)}  ${v}`);
out(
  `target: RSS after the soak <= ${TARGET_RSS_MIB} MiB and growth over the last half <= ` +
    `${FLAT_TOLERANCE_MIB} MiB: ${verdict.met ? "met" : `NOT met (${verdict.reasons.join("; ")})`}`,
);
