/**
 * Deno against Node serving the same Probe and NodeGetInfo handlers (bench/grpc_entry.ts): the
 * entry runs on Deno with the plugin's permission and V8 flags, and, bundled by `deno bundle`,
 * on Node with the same V8 flags. Calls alternate between the two in rounds.
 */

import { fileURLToPath } from "node:url";
import { runtimeFlags } from "../src/permissions.ts";
import { CsiClient } from "../tests/support/csi_client.ts";
import { formatMs, percentile, ratio, type Row } from "./stats.ts";

const ROOT = fileURLToPath(new URL("../", import.meta.url));
const ENTRY = `${ROOT}bench/grpc_entry.ts`;

/** A server process and a client connected to it. */
interface Served {
  readonly child: Deno.ChildProcess;
  readonly client: CsiClient;
}

async function serve(
  program: string,
  args: string[],
  socket: string,
  parent: string,
): Promise<Served> {
  const child = new Deno.Command(program, {
    args: [...args, socket, parent],
    cwd: ROOT,
    stdin: "null",
    stdout: "piped",
    stderr: "null",
  }).spawn();
  const reader = child.stdout.pipeThrough(new TextDecoderStream()).getReader();
  const first = await Promise.race([
    reader.read(),
    new Promise<undefined>((r) => setTimeout(() => r(undefined), 60_000)),
  ]);
  if (!first?.value?.includes("serving")) {
    child.kill("SIGKILL");
    throw new Error(`${program} did not start serving`);
  }
  void (async () => {
    while (!(await reader.read()).done);
  })();
  const client = new CsiClient(socket);
  for (let i = 0; i < 500; i++) {
    const res = await client.identity("Probe");
    if (res.ready?.value === true) return { child, client };
    await new Promise((r) => setTimeout(r, 20));
  }
  throw new Error(`${program} never answered a ready Probe`);
}

async function stop(s: Served): Promise<void> {
  s.client.close();
  s.child.kill("SIGKILL");
  await s.child.status;
}

async function latency(call: () => Promise<unknown>, n: number, concurrency: number) {
  const out: number[] = [];
  let started = 0;
  await Promise.all(Array.from({ length: concurrency }, async () => {
    while (started < n) {
      started++;
      const t0 = performance.now();
      await call();
      out.push(performance.now() - t0);
    }
  }));
  return out;
}

/** Rows comparing the two runtimes; a row saying why when Node or the bundle is missing. */
export async function nodeServerComparison(
  opts: { calls: number; parentDataset: string; dir: string },
): Promise<Row[]> {
  const bundle = `${opts.dir}/grpc_entry.mjs`;
  const built = await new Deno.Command(Deno.execPath(), {
    args: ["bundle", "--quiet", "--frozen", "-o", bundle, ENTRY],
    cwd: ROOT,
    stdout: "null",
    stderr: "piped",
  }).output();
  let nodeVersion = "";
  try {
    const v = await new Deno.Command("node", { args: ["--version"], stdout: "piped" }).output();
    nodeVersion = new TextDecoder().decode(v.stdout).trim();
  } catch {
    // No Node here.
  }
  if (!built.success || !nodeVersion) {
    const why = !nodeVersion ? "node is not installed" : "deno bundle failed";
    return [{ section: "3", what: "Deno vs Node, same handlers", plugin: "-", note: why }];
  }
  const v8 = ["--max-semi-space-size=1", "--max-old-space-size=128"];
  const deno = await serve(
    Deno.execPath(),
    ["run", "--quiet", "--frozen", ...runtimeFlags({ dirs: [opts.dir] }), ENTRY],
    `${opts.dir}/deno.sock`,
    opts.parentDataset,
  );
  const node = await serve("node", [...v8, bundle], `${opts.dir}/node.sock`, opts.parentDataset)
    .catch(
      async (err) => {
        await stop(deno);
        throw err;
      },
    );
  const rows: Row[] = [];
  try {
    for (const method of ["Probe", "NodeGetInfo"] as const) {
      for (const concurrency of [1, 16]) {
        const samples = { deno: [] as number[], node: [] as number[] };
        const rounds = 5;
        for (let r = 0; r < rounds; r++) {
          for (
            const [side, s] of r % 2 ? [["node", node], ["deno", deno]] as const : [
              ["deno", deno],
              ["node", node],
            ] as const
          ) {
            const call = method === "Probe"
              ? () => s.client.identity("Probe")
              : () => s.client.node("NodeGetInfo");
            samples[side].push(
              ...await latency(call, Math.ceil(opts.calls / rounds), concurrency),
            );
          }
        }
        const d50 = percentile(samples.deno, 50);
        const n50 = percentile(samples.node, 50);
        rows.push({
          section: "3",
          what: `  same handlers, ${method}, concurrency ${concurrency}: Deno vs Node p50 / p99`,
          plugin: `${formatMs(d50)} / ${formatMs(percentile(samples.deno, 99))}`,
          base: `${formatMs(n50)} / ${formatMs(percentile(samples.node, 99))}`,
          ratio: ratio(d50, n50),
          note: `Node ${nodeVersion}, bundled with deno bundle; ratio of p50`,
        });
      }
    }
  } finally {
    await stop(deno);
    await stop(node);
  }
  return rows;
}
