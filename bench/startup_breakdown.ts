/**
 * Where the plugin's start-up time goes: the same steps main.ts and startPlugin take, timed one
 * by one in a fresh process run with the plugin's permission and V8 flags, on a test pool:
 * runtime start to first line of JS, loading the module graph (grpc-js, protobufjs),
 * building the CSI services from src/grpc/csi_descriptor.json, binding the socket, and the first health check's three
 * commands (zpool list, zfs get, mount), alone and together. Medians over --runs.
 *
 *   deno run --allow-all bench/startup_breakdown.ts [--runs 7]
 */

import { parseArgs } from "node:util";
import { fileURLToPath } from "node:url";
import { PluginProcess } from "../tests/support/plugin_process.ts";
import { TestPool } from "../tests/support/zfs_pool.ts";
import { median } from "./stats.ts";

const STEPS = fileURLToPath(new URL("./startup_steps.ts", import.meta.url));
const encoder = new TextEncoder();
function out(line: string): void {
  Deno.stdout.writeSync(encoder.encode(line + "\n"));
}

const { values } = parseArgs({
  args: Deno.args,
  options: { runs: { type: "string" } },
});
{
  const runs = Number(values.runs ?? 7);
  await using pool = await TestPool.create();
  const rows = new Map<string, number[]>();
  const add = (k: string, v: number) => rows.set(k, [...rows.get(k) ?? [], v]);
  for (let i = 0; i < runs; i++) {
    const started = performance.now();
    const res = await new Deno.Command(Deno.execPath(), {
      args: [
        "run",
        "--quiet",
        "--frozen",
        ...PluginProcess.flags(pool.dir),
        STEPS,
        pool.parent,
        `${pool.dir}/b${i}.sock`,
      ],
      stdout: "piped",
      stderr: "inherit",
    }).output();
    const wall = performance.now() - started;
    const t = JSON.parse(new TextDecoder().decode(res.stdout)) as Record<string, number>;
    add("process start to first line of JS (runtime, reading main module)", t.jsStart!);
    add("  config, log modules", t.configLoaded! - t.jsStart!);
    add(
      "  grpc-js, protobufjs and the server module",
      t.grpcLoaded! - t.configLoaded!,
    );
    add("  the rest of the plugin's modules", t.pluginLoaded! - t.grpcLoaded!);
    add("build the services from the descriptor (once per process)", t.protoParse!);
    add("start the server: add the services, bind", t.bind!);
    add("health: zpool list alone", t.zpoolList!);
    add("health: zfs get alone", t.zfsGet!);
    add("health: mount alone", t.mount!);
    add("health: the three at once (as the first check runs them)", t.healthTogether!);
    add("(whole child process, wall)", wall);
  }
  out(`deno ${Deno.version.deno}, ${runs} runs, medians (ms)`);
  for (const [k, v] of rows) out(`${k.padEnd(66)} ${median(v).toFixed(1)}`);
  // The plugin itself, for comparison: spawn to first ready Probe.
  const startups: number[] = [];
  for (let i = 0; i < runs; i++) {
    await using p = await PluginProcess.start({
      parentDataset: pool.parent,
      dir: `${pool.dir}/p${i}`,
      logLevel: "info",
    });
    startups.push(p.startupMs);
  }
  out(`${"the plugin: spawn to first ready Probe".padEnd(66)} ${median(startups).toFixed(1)}`);
}
