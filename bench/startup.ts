/**
 * Start-up time and memory of the plugin, run exactly as the tests run it (deno run with the
 * production permission flags) on a file-backed pool. Prints numbers; asserts nothing.
 *
 *   deno task bench:startup [--runs N] [--probes N]
 * (The harness itself runs with --allow-all to read /proc/PID/status; the plugin never does.)
 */

import { parseArgs } from "node:util";
import { PluginProcess } from "../tests/support/plugin_process.ts";
import { TestPool } from "../tests/support/zfs_pool.ts";

const { values } = parseArgs({
  args: Deno.args,
  options: { runs: { type: "string" }, probes: { type: "string" } },
});
const runs = Number(values.runs ?? 7);
const probes = Number(values.probes ?? 1000);

async function rssKiB(pid: number): Promise<number> {
  const status = await Deno.readTextFile(`/proc/${pid}/status`);
  return Number(/VmRSS:\s+(\d+) kB/.exec(status)?.[1] ?? NaN);
}

function median(xs: number[]): number {
  const s = [...xs].sort((a, b) => a - b);
  return s[Math.floor(s.length / 2)]!;
}

function out(line: string): void {
  Deno.stdout.writeSync(new TextEncoder().encode(line + "\n"));
}

await using pool = await TestPool.create();
const startups: number[] = [];
const rssStart: number[] = [];
const rssAfter: number[] = [];
const probeMs: number[] = [];
for (let i = 0; i < runs; i++) {
  await using plugin = await PluginProcess.start({
    parentDataset: pool.parent,
    dir: pool.dir,
    logLevel: "info",
  });
  startups.push(plugin.startupMs);
  await new Promise((r) => setTimeout(r, 200));
  rssStart.push(await rssKiB(plugin.pid));
  const t0 = performance.now();
  for (let p = 0; p < probes; p++) await plugin.client.identity("Probe");
  probeMs.push((performance.now() - t0) / probes);
  rssAfter.push(await rssKiB(plugin.pid));
}
out(`deno ${Deno.version.deno}, ${navigator.hardwareConcurrency} cores, ${runs} runs (median)`);
out(`start to first ready Probe   ${median(startups).toFixed(0)} ms`);
out(`RSS after start-up           ${(median(rssStart) / 1024).toFixed(1)} MiB`);
out(`RSS after ${probes} Probes       ${(median(rssAfter) / 1024).toFixed(1)} MiB`);
out(`Probe latency (sequential)   ${median(probeMs).toFixed(3)} ms`);
