/**
 * zfs-csi entry point: resolve the config, serve, and on SIGTERM/SIGINT stop serving without
 * unmounting anything (mounts must outlive the plugin process).
 */

import { ConfigError, parseConfig } from "./src/config.ts";
import { STORE_ENV } from "./src/config_store.ts";
import { Logger } from "./src/log.ts";
import { grantMessage, readFileGrant } from "./src/permissions.ts";
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

/** A file a flag names (the store's credentials), refused in one line where the build may not. */
function readTextFile(path: string): string {
  const grant = readFileGrant(path, "the file");
  if (Deno.permissions.querySync(grant.descriptors[0]!).state !== "granted") {
    throw new Error(grantMessage(grant));
  }
  return Deno.readTextFileSync(path);
}

async function main(): Promise<void> {
  let parsed;
  try {
    const env = Object.fromEntries(["CSI_ENDPOINT", ...STORE_ENV].map((n) => [n, readEnv(n)]));
    parsed = parseConfig(Deno.args, env, readTextFile);
  } catch (err) {
    if (err instanceof ConfigError) fail(err.message, 2);
    throw err;
  }
  if (parsed.kind !== "run") {
    say(parsed.text);
    if (parsed.kind === "help") say((await import("./src/cli/main.ts")).subcommandsHelp());
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
    ...(config.store ? { store: config.store.url } : {}),
    // Since the runtime started: how long an operator waits for the socket.
    startupMs: Math.round(performance.now()),
  });
  let stopping = false;
  const stop = (signal: string) => {
    if (stopping) return;
    stopping = true;
    log.info("stopping; mounts are left in place", { signal });
    // A running upload is aborted (the store keeps nothing of it); the next start sends again.
    Promise.allSettled([plugin.server.stop(), plugin.stopBackground()]).finally(() => Deno.exit(0));
  };
  Deno.addSignalListener("SIGTERM", () => stop("SIGTERM"));
  Deno.addSignalListener("SIGINT", () => stop("SIGINT"));
}

/**
 * The executable has three faces, told apart by its first argument: Nomad's dynamic host volume
 * contract (Nomad runs the plugin as `<plugin> fingerprint|create|delete`, src/dhv/), operator
 * subcommands (a first argument that is not a flag, src/cli/), and the CSI server (flags only).
 * Each is loaded only when used, so a subcommand never pays for grpc-js.
 */
async function dispatch(args: readonly string[]): Promise<void> {
  const first = args[0];
  if (first === "fingerprint" || first === "create" || first === "delete") {
    const { runHostVolumeOperation } = await import("./src/dhv/main.ts");
    Deno.exit(await runHostVolumeOperation(args));
  }
  if (first !== undefined && !first.startsWith("-")) {
    const { runCli } = await import("./src/cli/main.ts");
    Deno.exit(await runCli(args));
  }
  await main();
}

if (import.meta.main) await dispatch(Deno.args);
