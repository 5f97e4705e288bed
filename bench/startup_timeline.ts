/**
 * The plugin's start from exec to the first ready Probe, phase by phase, with builds compared in
 * turn (so the load of a shared machine hits each alike): exec to the runtime's clock origin,
 * "serving" (the plugin's clock), the socket appearing, the first Probe answered ready, and the
 * CPU time of the plugin's main thread (where JS runs) and of all its threads up to then. The
 * harness warms its own gRPC client first and polls every millisecond, so what it measures is
 * the plugin's.
 *
 *   deno run --allow-all bench/startup_timeline.ts [--runs 15] [--main FILE]... [--bundle]
 *
 * --main: a main module to start (default main.ts; repeat to compare, e.g. a checkout of an
 * older build); --bundle adds main.ts bundled into one file by `deno bundle`, run with the same
 * flags. Each start gets the plugin's production permission and V8 flags.
 */

import { parseArgs } from "node:util";
import { fileURLToPath } from "node:url";
import { startServer } from "../src/grpc/server.ts";
import { Logger } from "../src/log.ts";
import { CsiClient } from "../tests/support/csi_client.ts";
import { PluginProcess } from "../tests/support/plugin_process.ts";
import { TestPool } from "../tests/support/zfs_pool.ts";
import { median, percentile } from "./stats.ts";

const ROOT = fileURLToPath(new URL("../", import.meta.url));
const encoder = new TextEncoder();
function out(line: string): void {
  Deno.stdout.writeSync(encoder.encode(line + "\n"));
}

const { values } = parseArgs({
  args: Deno.args,
  options: {
    runs: { type: "string" },
    main: { type: "string", multiple: true },
    bundle: { type: "boolean" },
  },
});
const runs = Number(values.runs ?? 15);

/** CPU time a thread has had so far (ms): the first field of its schedstat, in ns. */
async function threadCpuMs(path: string): Promise<number> {
  return Number((await Deno.readTextFile(`${path}/schedstat`)).split(" ")[0]) / 1e6;
}

async function allThreadsCpuMs(pid: number): Promise<number> {
  let all = 0;
  for await (const task of Deno.readDir(`/proc/${pid}/task`)) {
    all += await threadCpuMs(`/proc/${pid}/task/${task.name}`).catch(() => 0);
  }
  return all;
}

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

/** One start of `main`: the phases in ms since spawn, and CPU times. */
async function startOnce(main: string, pool: TestPool, dir: string): Promise<Map<string, number>> {
  await Deno.mkdir(`${dir}/base`, { recursive: true });
  const socket = `${dir}/plugin/csi.sock`;
  const spawnedAt = Date.now();
  const t0 = performance.now();
  const child = new Deno.Command(Deno.execPath(), {
    args: [
      "run",
      "--quiet",
      "--frozen",
      ...PluginProcess.flags(dir),
      main,
      ...["--parent-dataset", pool.parent, "--node-id", "node-a"],
      ...["--endpoint", `unix://${socket}`, "--stage-publish-base-dir", `${dir}/base`],
      ...["--log-level", "info"],
    ],
    cwd: ROOT,
    stdin: "null",
    stdout: "null",
    stderr: "piped",
  }).spawn();
  const stderr = new Response(child.stderr).text();
  const row = new Map<string, number>();
  try {
    for (;;) {
      try {
        await Deno.lstat(socket);
        break;
      } catch {
        if (performance.now() - t0 > 20_000) throw new Error(`${main}: no socket`);
        await sleep(1);
      }
    }
    row.set("socket appears", performance.now() - t0);
    let client = new CsiClient(socket);
    for (;;) {
      try {
        const res = await client.identity("Probe", {}, 2_000);
        if (res.ready?.value === true) break;
      } catch {
        client.close();
        client = new CsiClient(socket);
      }
      if (performance.now() - t0 > 20_000) throw new Error(`${main}: never ready`);
      await sleep(1);
    }
    row.set("first ready Probe", performance.now() - t0);
    row.set("CPU to ready, main thread", await threadCpuMs(`/proc/${child.pid}`));
    row.set("CPU to ready, all threads", await allThreadsCpuMs(child.pid));
    client.close();
  } finally {
    child.kill("SIGKILL");
    await child.status;
  }
  const serving = (await stderr).split("\n").flatMap((l) => {
    try {
      const r = JSON.parse(l) as { msg?: string; ts?: string; startupMs?: number };
      return r.msg === "serving" ? [r] : [];
    } catch {
      return [];
    }
  })[0];
  if (serving?.ts && serving.startupMs !== undefined) {
    // The runtime's clock starts after exec; the log's wall clock places that origin.
    row.set(
      "exec to the runtime's clock origin",
      Date.parse(serving.ts) - serving.startupMs - spawnedAt,
    );
    row.set('"serving" (plugin clock)', serving.startupMs);
  }
  return row;
}

{
  await using pool = await TestPool.create();
  const mains = [...values.main ?? ["main.ts"]];
  if (values.bundle) {
    const file = `${pool.dir}/zfs-csi.bundle.js`;
    const res = await new Deno.Command(Deno.execPath(), {
      args: ["bundle", "--quiet", "--frozen", "--platform", "deno", "main.ts", "-o", file],
      cwd: ROOT,
      stdout: "inherit",
      stderr: "inherit",
    }).output();
    if (!res.success) throw new Error("deno bundle failed");
    mains.push(file);
  }
  // The harness's own client code is warmed on a server of its own before any start.
  const warm = await startServer(
    `${pool.dir}/warm.sock`,
    { Identity: { Probe: () => Promise.resolve({ ready: { value: true } }) } },
    new Logger("error"),
  );
  const warmClient = new CsiClient(`${pool.dir}/warm.sock`);
  await warmClient.identity("Probe");
  warmClient.close();
  await warm.stop();
  const rows = new Map<string, Map<string, number[]>>(mains.map((m) => [m, new Map()]));
  const loads: number[] = [];
  for (let i = 0; i < runs; i++) {
    for (const [k, main] of mains.entries()) {
      const row = await startOnce(main, pool, `${pool.dir}/r${i}m${k}`);
      for (const [what, v] of row) {
        const m = rows.get(main)!;
        m.set(what, [...m.get(what) ?? [], v]);
      }
    }
    loads.push(Deno.loadavg()[0] ?? NaN);
  }
  out(
    `deno ${Deno.version.deno}, ${runs} starts of each in turn, load ${
      Math.min(...loads).toFixed(1)
    }-${Math.max(...loads).toFixed(1)}; median / p90 (ms)`,
  );
  for (const [main, m] of rows) {
    out(main);
    for (const [what, v] of m) {
      out(`  ${what.padEnd(36)} ${median(v).toFixed(1)} / ${percentile(v, 90).toFixed(1)}`);
    }
  }
}
