/**
 * Start-up time and memory of the plugin, run exactly as the tests run it (deno run with the
 * production permission flags) on a file-backed pool. Prints numbers; asserts nothing.
 *
 *   deno task bench:startup [--runs N] [--probes N] [--raw FILE]
 *
 * Per start: spawn to the first Probe answered ready over the unix socket (the harness polls
 * every 10 ms), the plugin's own "serving" time (its clock, from runtime start), the CPU time
 * the plugin used up to that first ready Probe (its main thread, where JS runs, and all its
 * threads; from /proc/PID/task/TID/schedstat), and RSS. Medians and p90 over --runs (21).
 * (The harness itself runs with --allow-all to read /proc/PID; the plugin never does.)
 */

import { parseArgs } from "node:util";
import { PluginProcess } from "../tests/support/plugin_process.ts";
import { TestPool } from "../tests/support/zfs_pool.ts";
import { median, percentile } from "./stats.ts";

const { values } = parseArgs({
  args: Deno.args,
  options: { runs: { type: "string" }, probes: { type: "string" }, raw: { type: "string" } },
});
const runs = Number(values.runs ?? 21);
const probes = Number(values.probes ?? 1000);

async function rssKiB(pid: number): Promise<number> {
  const status = await Deno.readTextFile(`/proc/${pid}/status`);
  return Number(/VmRSS:\s+(\d+) kB/.exec(status)?.[1] ?? NaN);
}

/** CPU time a thread has had so far (ms): the first field of its schedstat, in ns. */
async function threadCpuMs(path: string): Promise<number> {
  return Number((await Deno.readTextFile(`${path}/schedstat`)).split(" ")[0]) / 1e6;
}

/** CPU time so far (ms) of a process's main thread, where JS runs, and of all its threads. */
async function cpuMs(pid: number): Promise<{ main: number; all: number }> {
  let all = 0;
  for await (const task of Deno.readDir(`/proc/${pid}/task`)) {
    all += await threadCpuMs(`/proc/${pid}/task/${task.name}`).catch(() => 0);
  }
  return { main: await threadCpuMs(`/proc/${pid}`), all };
}

function out(line: string): void {
  Deno.stdout.writeSync(new TextEncoder().encode(line + "\n"));
}

function summary(label: string, xs: number[], unit = "ms", digits = 0): void {
  const m = median(xs).toFixed(digits);
  const p90 = percentile(xs, 90).toFixed(digits);
  out(`${label.padEnd(40)} median ${m} ${unit}, p90 ${p90} ${unit}`);
}

await using pool = await TestPool.create();
const startups: number[] = [];
const serving: number[] = [];
const cpuMain: number[] = [];
const cpuAll: number[] = [];
const rssStart: number[] = [];
const rssAfter: number[] = [];
const probeMs: number[] = [];
for (let i = 0; i < runs; i++) {
  await using plugin = await PluginProcess.start({
    parentDataset: pool.parent,
    dir: `${pool.dir}/s${i}`,
    logLevel: "info",
  });
  startups.push(plugin.startupMs);
  const cpu = await cpuMs(plugin.pid);
  cpuMain.push(cpu.main);
  cpuAll.push(cpu.all);
  const line = plugin.records().find((r) => r.msg === "serving");
  if (typeof line?.startupMs === "number") serving.push(line.startupMs);
  await new Promise((r) => setTimeout(r, 200));
  rssStart.push(await rssKiB(plugin.pid) / 1024);
  if (probes > 0) {
    const t0 = performance.now();
    for (let p = 0; p < probes; p++) await plugin.client.identity("Probe");
    probeMs.push((performance.now() - t0) / probes);
    rssAfter.push(await rssKiB(plugin.pid) / 1024);
  }
}
if (values.raw) {
  const line = JSON.stringify({
    startups,
    serving,
    cpuMain,
    cpuAll,
    rssStart,
    load: Deno.loadavg()[0],
  });
  Deno.writeTextFileSync(values.raw, line + "\n", { append: true });
}
out(`deno ${Deno.version.deno}, ${navigator.hardwareConcurrency} cores, ${runs} starts`);
summary("spawn to first ready Probe", startups);
if (serving.length > 0) summary(`"serving" logged (plugin's clock)`, serving);
summary("CPU to first ready Probe, main thread", cpuMain);
summary("CPU to first ready Probe, all threads", cpuAll);
summary("RSS after start-up", rssStart, "MiB", 1);
if (probes > 0) {
  summary(`RSS after ${probes} Probes`, rssAfter, "MiB", 1);
  summary("Probe latency (sequential)", probeMs, "ms", 3);
}
