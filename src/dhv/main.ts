/**
 * The executable as a Nomad dynamic host volume plugin: `zfs-csi fingerprint|create|delete`, run
 * by the Nomad client with `DHV_*` variables. Stdout carries exactly the one JSON object Nomad
 * reads (`{"version"}`, `{"path","bytes"}`, or `{"error"}` on failure); diagnostics are JSON
 * lines on stderr; the exit code says how it went (contract.ts).
 */

import type { ReadTextFile } from "../config.ts";
import { Logger, type LogSink } from "../log.ts";
import { grantMessage, programRefusal, readFileGrant } from "../permissions.ts";
import type { CommandRunner } from "../run.ts";
import { DHV_ENV } from "../host_volume_env.ts";
import { PLUGIN_NAME, PLUGIN_VERSION } from "../version.ts";
import {
  createOutput,
  createRequest,
  deleteRequest,
  type DhvEnv,
  DhvError,
  errorOutput,
  EXIT_BAD_REQUEST,
  EXIT_OK,
  exitCodeOf,
  operationOf,
} from "./contract.ts";

/** What the plugin reads and writes; tests replace it. */
export interface DhvIo {
  /** A variable, or undefined where unset or not readable by this build. */
  readonly env: (name: string) => string | undefined;
  /** Writes stdout (one JSON object per call). */
  readonly stdout: (text: string) => void;
  readonly readTextFile: ReadTextFile;
  /** Runs zfs; by default real processes. */
  readonly runner?: (timeoutMs: number) => CommandRunner;
  /** Where log lines go; by default stderr. */
  readonly logSink?: LogSink;
}

const encoder = new TextEncoder();

/** An environment variable, or undefined where this build may not read it. */
function readEnv(name: string): string | undefined {
  if (Deno.permissions.querySync({ name: "env", variable: name }).state !== "granted") {
    return undefined;
  }
  return Deno.env.get(name);
}

/** Reads a file, refused in one line where the build may not (as the server does). */
function readTextFile(path: string): string {
  const grant = readFileGrant(path, "the host volume plugin's config file");
  if (Deno.permissions.querySync(grant.descriptors[0]!).state !== "granted") {
    throw new Error(grantMessage(grant));
  }
  return Deno.readTextFileSync(path);
}

/** The process's own input and output. */
export const PROCESS_IO: DhvIo = {
  env: readEnv,
  stdout: (text) => {
    const bytes = encoder.encode(text + "\n");
    let written = 0;
    while (written < bytes.length) written += Deno.stdout.writeSync(bytes.subarray(written));
  },
  readTextFile,
};

/**
 * Runs one host volume operation (`args[0]`; any further arguments are the plugin's flags, as a
 * wrapper script may pass them) and returns the exit code.
 */
export async function runHostVolumeOperation(
  args: readonly string[],
  io: DhvIo = PROCESS_IO,
): Promise<number> {
  const env: DhvEnv = Object.fromEntries(DHV_ENV.map((n) => [n, io.env(n)]));
  let log = new Logger("info", { plugin: PLUGIN_NAME, operation: args[0] ?? "" }, io.logSink);
  try {
    const op = operationOf(args, env);
    if (op === "fingerprint") {
      // Nomad gives fingerprint 5 seconds and no other variable: answer without config or zfs.
      io.stdout(JSON.stringify({ version: PLUGIN_VERSION }));
      return EXIT_OK;
    }
    // Checked before the config is read: a call that is wrong fails fast, whatever the config.
    const call = op === "create"
      ? { op, req: createRequest(env) } as const
      : { op, req: deleteRequest(env) } as const;
    const req = call.req;
    // Loaded only now: Nomad gives fingerprint one second at agent start, so it loads little.
    const [
      { STORE_ENV },
      { KeyedLock },
      { DenoCommandRunner },
      { Trash },
      { zfsFor },
      { resolveHostConfig },
      { HostVolumes },
    ] = await Promise.all([
      import("../config_store.ts"),
      import("../lock.ts"),
      import("../run.ts"),
      import("../volume/trash.ts"),
      import("../system_tools.ts"),
      import("./config.ts"),
      import("./volumes.ts"),
    ]);
    const { config, source } = resolveHostConfig({
      flags: args.slice(1),
      pluginDir: req.pluginDir,
      nodeId: req.nodeId,
      readTextFile: io.readTextFile,
      env: Object.fromEntries(STORE_ENV.map((n) => [n, io.env(n)])),
    });
    log = new Logger(config.logLevel, {
      plugin: PLUGIN_NAME,
      operation: op,
      volumeId: req.id,
    }, io.logSink);
    log.debug("config", { source, parentDataset: config.parentDataset });
    if (!io.runner) {
      // One line now rather than a permission error from the first zfs call.
      for (const command of [config.zfsPath, config.zpoolPath]) {
        const refused = programRefusal(command);
        if (refused !== undefined) throw new DhvError(EXIT_BAD_REQUEST, refused);
      }
    }
    const runner = io.runner?.(config.commandTimeoutMs) ??
      new DenoCommandRunner(config.commandTimeoutMs);
    const zfs = zfsFor(config, runner, log);
    const trash = new Trash({
      zfs,
      parentDataset: config.parentDataset,
      retentionSeconds: config.deletedRetentionSeconds,
      locks: new KeyedLock(),
      log,
    });
    const store = config.store;
    const volumes = new HostVolumes({
      config,
      zfs,
      trash,
      log,
      // The server's own store factory, loaded only by a delete that needs it.
      ...(store
        ? { openStore: async () => (await import("../store/open.ts")).openStore(store) }
        : {}),
    });
    if (call.op === "create") {
      const made = await volumes.create(call.req);
      io.stdout(createOutput(made.path, made.bytes));
    } else {
      await volumes.delete(call.req);
    }
    return EXIT_OK;
  } catch (err) {
    const code = exitCodeOf(err);
    const message = err instanceof Error ? err.message : String(err);
    log.error("host volume operation failed", { exitCode: code, error: err });
    io.stdout(errorOutput(message));
    return code;
  }
}
