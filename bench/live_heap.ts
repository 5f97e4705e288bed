/**
 * Is RSS growth a leak? Runs the plugin in this process on a test pool, makes rounds of
 * Probe/NodeGetInfo calls, forces a full GC after each round and prints the live heap.
 * A flat heap means the growing RSS is V8 keeping freed memory, not the plugin holding on.
 *
 *   deno task bench:heap [--rounds N] [--calls N]
 */

import { parseArgs } from "node:util";
import { parseConfig } from "../src/config.ts";
import { Logger } from "../src/log.ts";
import { startPlugin } from "../src/plugin.ts";
import { CsiClient } from "../tests/support/csi_client.ts";
import { TestPool } from "../tests/support/zfs_pool.ts";

const { values } = parseArgs({
  args: Deno.args,
  options: { rounds: { type: "string" }, calls: { type: "string" } },
});
const rounds = Number(values.rounds ?? 5);
const calls = Number(values.calls ?? 5000);
const gc = (globalThis as { gc?: () => void }).gc;
if (!gc) throw new Error("Run with --v8-flags=--expose-gc");

function out(line: string): void {
  Deno.stdout.writeSync(new TextEncoder().encode(line + "\n"));
}

await using pool = await TestPool.create();
const parsed = parseConfig([
  "--parent-dataset",
  pool.parent,
  "--node-id",
  "bench",
  "--endpoint",
  `unix://${pool.dir}/sock/csi.sock`,
  "--stage-publish-base-dir",
  `${pool.dir}/base`,
], {});
if (parsed.kind !== "run") throw new Error("unexpected config");
await Deno.mkdir(`${pool.dir}/base`, { recursive: true });
const plugin = await startPlugin(parsed.config, new Logger("error"));
const client = new CsiClient(parsed.config.socketPath);
const mib = (n: number) => (n / 1024 / 1024).toFixed(1);
for (let r = 1; r <= rounds; r++) {
  for (let i = 0; i < calls; i++) {
    await client.identity("Probe");
    if (i % 2) await client.node("NodeGetInfo");
  }
  gc();
  const m = Deno.memoryUsage();
  out(`after ${r * calls} Probes: live heap ${mib(m.heapUsed)} MiB, RSS ${mib(m.rss)} MiB`);
}
client.close();
await plugin.server.stop();
Deno.exit(0);
