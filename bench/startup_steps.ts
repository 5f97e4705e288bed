/**
 * The child of bench/startup_breakdown.ts: the steps of the plugin's start, timed one by one.
 * It imports nothing statically, so its first line runs as soon as the runtime is up.
 *
 *   deno run <plugin flags> bench/startup_steps.ts PARENT_DATASET SOCKET
 */

/** The child: times each step and prints them as one JSON object (ms). */
async function steps(parent: string, socket: string): Promise<void> {
  const t: Record<string, number> = { jsStart: performance.now() };
  const { parseConfig } = await import("../src/config.ts");
  const { Logger } = await import("../src/log.ts");
  t.configLoaded = performance.now();
  const { startServer } = await import("../src/grpc/server.ts");
  t.grpcLoaded = performance.now();
  await import("../src/plugin.ts");
  t.pluginLoaded = performance.now();
  const { loadCsiServices } = await import("../src/grpc/proto.ts");
  const p0 = performance.now();
  loadCsiServices();
  t.protoParse = performance.now() - p0;
  const parsed = parseConfig(
    ["--parent-dataset", parent, "--node-id", "n", "--endpoint", `unix://${socket}`],
    {},
  );
  if (parsed.kind !== "run") throw new Error("unexpected config");
  const log = new Logger("error");
  const { DenoCommandRunner } = await import("../src/run.ts");
  const runner = new DenoCommandRunner();
  const time = async (argv: string[]) => {
    const s = performance.now();
    await runner.run(argv);
    return performance.now() - s;
  };
  const pool = parent.split("/")[0]!;
  const zpool = ["zpool", "list", "-H", "-o", "health", pool];
  const zget = ["zfs", "get", "-Hp", "-o", "property,value", "type,mounted,mountpoint", parent];
  // Each command alone, then the three together as the first health check runs them.
  t.zpoolList = await time(zpool);
  t.zfsGet = await time(zget);
  t.mount = await time(["mount"]);
  const c0 = performance.now();
  await Promise.all([time(zpool), time(zget), time(["mount"])]);
  t.healthTogether = performance.now() - c0;
  const s0 = performance.now();
  // The services are built once per process (src/grpc/proto.ts): "bind" reuses them.
  const server = await startServer(parsed.config.socketPath, { Identity: {} }, log);
  t.bind = performance.now() - s0;
  Deno.stdout.writeSync(new TextEncoder().encode(JSON.stringify(t) + "\n"));
  await server.stop();
  Deno.exit(0);
}

await steps(Deno.args[0]!, Deno.args[1]!);
