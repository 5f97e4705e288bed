/**
 * zfs-csi entry point: resolve the config, serve, and on SIGTERM/SIGINT stop serving without
 * unmounting anything (mounts must outlive the plugin process).
 */

import { ConfigError, parseConfig } from "./src/config.ts";
import { Logger } from "./src/log.ts";
import { PLUGIN_NAME, PLUGIN_VERSION } from "./src/version.ts";

const encoder = new TextEncoder();

function say(text: string): void {
  Deno.stdout.writeSync(encoder.encode(text + "\n"));
}

function fail(text: string, code: number): never {
  Deno.stderr.writeSync(encoder.encode(`zfs-csi: ${text}\n`));
  Deno.exit(code);
}

/** An environment variable, or undefined where this build may not read it. */
function readEnv(name: string): string | undefined {
  if (Deno.permissions.querySync({ name: "env", variable: name }).state !== "granted") {
    return undefined;
  }
  return Deno.env.get(name);
}

async function main(): Promise<void> {
  let parsed;
  try {
    parsed = parseConfig(Deno.args, { CSI_ENDPOINT: readEnv("CSI_ENDPOINT") });
  } catch (err) {
    if (err instanceof ConfigError) fail(err.message, 2);
    throw err;
  }
  if (parsed.kind !== "run") {
    say(parsed.text);
    return;
  }
  const config = parsed.config;
  const log = new Logger(config.logLevel, { plugin: PLUGIN_NAME });
  let plugin;
  try {
    // Loaded only now: grpc-js reads its environment when imported, which --help need not do.
    const { startPlugin } = await import("./src/plugin.ts");
    plugin = await startPlugin(config, log);
  } catch (err) {
    fail(`cannot start: ${err instanceof Error ? err.message : String(err)}`, 1);
  }
  log.info("serving", {
    version: PLUGIN_VERSION,
    endpoint: config.endpoint,
    nodeId: config.nodeId,
    parentDataset: config.parentDataset,
    topology: config.topology,
    stagePublishDirs: config.stagePublishDirs,
    // Since the runtime started: how long an operator waits for the socket.
    startupMs: Math.round(performance.now()),
  });
  let stopping = false;
  const stop = (signal: string) => {
    if (stopping) return;
    stopping = true;
    log.info("stopping; mounts are left in place", { signal });
    plugin.server.stop().finally(() => Deno.exit(0));
  };
  Deno.addSignalListener("SIGTERM", () => stop("SIGTERM"));
  Deno.addSignalListener("SIGINT", () => stop("SIGINT"));
}

if (import.meta.main) await main();
