/**
 * Runs the plugin as its own process, exactly as it ships: `deno run` with the production
 * permission flags (src/permissions.ts) scoped to the test's directory, speaking gRPC on a
 * real unix socket.
 */

import { fileURLToPath } from "node:url";
import { type PermissionScope, runtimeFlags } from "../../src/permissions.ts";
import { CsiClient } from "./csi_client.ts";

const ROOT = fileURLToPath(new URL("../../", import.meta.url));

/**
 * How long a started plugin may take to answer Probe ready. 20 s by default; a slow machine (the
 * OpenZFS VM under TCG, where one `zpool list` can take seconds) sets ZFS_CSI_TEST_READY_MS.
 */
export const READY_MS = Number(Deno.env.get("ZFS_CSI_TEST_READY_MS") ?? "20000");
if (!Number.isInteger(READY_MS) || READY_MS <= 0) {
  throw new RangeError(`ZFS_CSI_TEST_READY_MS must be a positive integer, got ${READY_MS}`);
}

/** How to start the plugin. */
export interface PluginOptions {
  readonly parentDataset: string;
  /** The directory the plugin may write (socket and base dir live below it). */
  readonly dir: string;
  readonly nodeId?: string;
  readonly topology?: readonly string[];
  readonly extraArgs?: readonly string[];
  /** Deno flags added before the script, e.g. a benchmark's `--preload` (never permissions). */
  readonly denoFlags?: readonly string[];
  readonly logLevel?: string;
  /** Wait until Probe answers ready (default true). */
  readonly waitReady?: boolean;
  /**
   * What the build may reach besides `dir`, as a production build would with ZFS_CSI_STORE_HOSTS,
   * ZFS_CSI_EXTRA_DIRS and ZFS_CSI_EXTRA_READ_FILES: the store's host:port, its directory, a
   * credentials file. `extraPrograms` is for tests only (no build has it): a shim the test puts
   * first on PATH, which a bare name then resolves to.
   */
  readonly scope?: Omit<PermissionScope, "dirs"> & { readonly extraDirs?: readonly string[] };
  /** Variables added to the test's environment for the plugin (e.g. AWS_ACCESS_KEY_ID). */
  readonly env?: Readonly<Record<string, string>>;
  /** Start the plugin with no PATH at all, as Nomad starts a host volume plugin. */
  readonly withoutPath?: boolean;
}

/** `env` without PATH. */
function withoutPath(env: Record<string, string>): Record<string, string> {
  const { PATH: _, ...rest } = env;
  return rest;
}

/** A running plugin process with a client connected to it. */
export class PluginProcess implements AsyncDisposable {
  readonly socketPath: string;
  readonly baseDir: string;
  #client: CsiClient;
  /** Milliseconds from spawn to the first Probe that answered ready. */
  startupMs = NaN;
  readonly #child: Deno.ChildProcess;
  readonly #lines: string[] = [];
  readonly #stderrDone: Promise<void>;
  readonly status: Promise<Deno.CommandStatus>;

  private constructor(child: Deno.ChildProcess, socketPath: string, baseDir: string) {
    this.#child = child;
    this.socketPath = socketPath;
    this.baseDir = baseDir;
    this.#client = new CsiClient(socketPath);
    this.status = child.status;
    this.#stderrDone = (async () => {
      let buf = "";
      for await (const chunk of child.stderr.pipeThrough(new TextDecoderStream())) {
        buf += chunk;
        const parts = buf.split("\n");
        buf = parts.pop() ?? "";
        this.#lines.push(...parts);
      }
      if (buf) this.#lines.push(buf);
    })();
  }

  /** The flags the plugin runs with in tests: the production flags, scoped to test dirs. */
  static flags(dir: string, scope: PluginOptions["scope"] = {}): string[] {
    return runtimeFlags({
      dirs: [dir, ...scope.extraDirs ?? []],
      ...(scope.netHosts ? { netHosts: scope.netHosts } : {}),
      ...(scope.readFiles ? { readFiles: scope.readFiles } : {}),
      ...(scope.extraPrograms ? { extraPrograms: scope.extraPrograms } : {}),
      // A build for block volumes (ZFS_CSI_BLOCK_VOLUMES), for a plugin with --block-volumes.
      ...(scope.blockVolumes ? { blockVolumes: true } : {}),
    });
  }

  /** Starts the plugin and (by default) waits until it is ready. */
  static async start(opts: PluginOptions): Promise<PluginProcess> {
    const socketPath = `${opts.dir}/plugin/csi.sock`;
    const baseDir = `${opts.dir}/base`;
    await Deno.mkdir(baseDir, { recursive: true });
    const args = [
      "run",
      "--quiet",
      "--frozen",
      // A plugin started with --block-volumes runs as a build for them would (dev_args.ts too).
      ...PluginProcess.flags(opts.dir, {
        ...opts.scope,
        ...(opts.extraArgs?.includes("--block-volumes") ? { blockVolumes: true } : {}),
      }),
      ...(opts.denoFlags ?? []),
      `${ROOT}main.ts`,
      "--parent-dataset",
      opts.parentDataset,
      "--node-id",
      opts.nodeId ?? "node-a",
      "--endpoint",
      `unix://${socketPath}`,
      "--stage-publish-base-dir",
      baseDir,
      "--log-level",
      opts.logLevel ?? "debug",
      ...(opts.topology ?? []).flatMap((t) => ["--topology", t]),
      ...(opts.extraArgs ?? []),
    ];
    const started = performance.now();
    // ZFS_CSI_PLUGIN_DENO runs the plugin under another Deno, e.g. to check a regression.
    const deno = Deno.env.get("ZFS_CSI_PLUGIN_DENO") ?? Deno.execPath();
    const env = opts.withoutPath
      ? { clearEnv: true, env: { ...withoutPath(Deno.env.toObject()), ...opts.env } }
      : opts.env
      ? { env: opts.env }
      : {};
    const child = new Deno.Command(deno, {
      args,
      cwd: ROOT,
      ...env,
      stdin: "null",
      stdout: "null",
      stderr: "piped",
    }).spawn();
    const p = new PluginProcess(child, socketPath, baseDir);
    if (opts.waitReady !== false) {
      await p.waitReady(READY_MS);
      p.startupMs = performance.now() - started;
    }
    return p;
  }

  /** A client connected to the plugin's socket. */
  get client(): CsiClient {
    return this.#client;
  }

  /**
   * Polls Probe until it answers ready. A failed attempt gets a fresh client, so grpc-js's
   * reconnect back-off (1 s and more) does not count against the plugin's start-up time.
   */
  async waitReady(timeoutMs: number): Promise<void> {
    const deadline = Date.now() + timeoutMs;
    let last: unknown;
    while (Date.now() < deadline) {
      try {
        await Deno.lstat(this.socketPath);
        const res = await this.#client.identity("Probe", {}, 2_000);
        if (res.ready?.value === true) return;
        last = res;
      } catch (err) {
        last = err;
        this.#client.close();
        this.#client = new CsiClient(this.socketPath);
      }
      await new Promise((r) => setTimeout(r, 10));
    }
    throw new Error(
      `Plugin not ready after ${timeoutMs}ms: ${String(last)}\n${this.logs().join("\n")}`,
    );
  }

  /** Log lines written so far (JSON lines). */
  logs(): string[] {
    return [...this.#lines];
  }

  /** Parsed log records. */
  records(): Record<string, unknown>[] {
    return this.#lines.flatMap((l) => {
      try {
        return [JSON.parse(l) as Record<string, unknown>];
      } catch {
        return [];
      }
    });
  }

  /** The process id, e.g. to measure its memory. */
  get pid(): number {
    return this.#child.pid;
  }

  /** Sends a signal and waits for the process to end. */
  async stop(signal: Deno.Signal = "SIGTERM"): Promise<Deno.CommandStatus> {
    this.#client.close();
    try {
      this.#child.kill(signal);
    } catch {
      // Already gone.
    }
    const status = await this.status;
    await this.#stderrDone;
    return status;
  }

  async [Symbol.asyncDispose](): Promise<void> {
    await this.stop("SIGKILL");
  }
}

/** What a finished `zfs-csi` command printed, and its exit code. */
export interface CliResult {
  readonly code: number;
  readonly stdout: string;
  readonly stderr: string;
}

/**
 * Runs `zfs-csi <args>` as the binary would: main.ts under `deno run` with the plugin's
 * production permission flags for `dir` (and `scope`), stdin closed, output collected.
 */
export async function runZfsCsi(
  dir: string,
  args: readonly string[],
  opts: { readonly scope?: PluginOptions["scope"]; readonly env?: Record<string, string> } = {},
): Promise<CliResult> {
  const out = await new Deno.Command(Deno.execPath(), {
    args: [
      "run",
      "--quiet",
      "--frozen",
      ...PluginProcess.flags(dir, opts.scope),
      `${ROOT}main.ts`,
      ...args,
    ],
    ...(opts.env ? { env: opts.env } : {}),
    stdin: "null",
    stdout: "piped",
    stderr: "piped",
  }).output();
  const dec = new TextDecoder();
  return { code: out.code, stdout: dec.decode(out.stdout), stderr: dec.decode(out.stderr) };
}
