/**
 * The one seam through which the plugin starts other programs. Everything that runs zfs,
 * zpool, mount or umount goes through a {@linkcode CommandRunner}, so tests can replace it.
 */

import { spawn as spawnNode } from "node:child_process";
import { constants } from "node:os";
import { childOutput } from "./child_output.ts";

/** What a finished command left behind. */
export interface CommandResult {
  readonly code: number;
  readonly stdout: string;
  readonly stderr: string;
  /** True when the runner killed the command because it ran past its time limit. */
  readonly timedOut: boolean;
}

/** Options of one run. */
export interface RunOptions {
  /** Kill the command (SIGKILL) after this many milliseconds. */
  readonly timeoutMs?: number;
}

/** Runs a program with an argument array; never through a shell. */
export interface CommandRunner {
  run(argv: readonly string[], options?: RunOptions): Promise<CommandResult>;
}

const decoder = new TextDecoder();

/** The real runner on top of `Deno.Command`. */
export class DenoCommandRunner implements CommandRunner {
  readonly #defaultTimeoutMs: number;

  constructor(defaultTimeoutMs = 60_000) {
    this.#defaultTimeoutMs = defaultTimeoutMs;
  }

  async run(argv: readonly string[], options: RunOptions = {}): Promise<CommandResult> {
    const [program, ...args] = argv;
    if (program === undefined) throw new TypeError("Cannot run an empty argument list");
    const child = new Deno.Command(program, {
      args,
      stdin: "null",
      stdout: "piped",
      stderr: "piped",
      // Stable, English, unlocalised messages: zfs output is classified by its text.
      env: { LC_ALL: "C", LANG: "C" },
    }).spawn();
    let timedOut = false;
    const timeoutMs = options.timeoutMs ?? this.#defaultTimeoutMs;
    const grace = graceAfterKill();
    const timer = setTimeout(() => {
      timedOut = true;
      try {
        child.kill("SIGKILL");
      } catch {
        // Already gone.
      }
      grace.start();
    }, timeoutMs);
    const ended = childOutput(child); // not child.output(): see src/child_output.ts
    try {
      const out = await Promise.race([ended, grace.promise]);
      if (out === undefined) {
        ended.catch(() => {}); // it may still end, long after; nobody waits for it then
        return { code: -1, stdout: "", stderr: unkillable(program, child.pid), timedOut: true };
      }
      return {
        code: out.code,
        stdout: decoder.decode(out.stdout),
        stderr: decoder.decode(out.stderr),
        timedOut,
      };
    } finally {
      clearTimeout(timer);
    }
  }
}

/**
 * How long a command killed with SIGKILL gets to end before its runner stops waiting. A process
 * blocked in the kernel (an OpenZFS ioctl on a suspended pool, a FUSE request zfs-fuse never
 * answers) cannot die, and a process it started can keep its output open: waiting on would hold
 * a CSI call, and its volume's lock, for ever, and Nomad sends NodeStage with no deadline.
 */
export const KILL_GRACE_MS = 5_000;

/** The stderr given for a killed command that did not end within {@linkcode KILL_GRACE_MS}. */
function unkillable(program: string, pid: number): string {
  return `${program} (pid ${pid}) did not end within ${KILL_GRACE_MS} ms of SIGKILL: ` +
    `it is blocked in the kernel (see its wchan in ps) or a process it started holds its output`;
}

/** Resolves to `undefined` {@linkcode KILL_GRACE_MS} after `kill` was called. */
function graceAfterKill(): { readonly promise: Promise<undefined>; start(): void } {
  const { promise, resolve } = Promise.withResolvers<undefined>();
  let started = false;
  return {
    promise,
    start() {
      if (started) return;
      started = true;
      // Unref'd: a command that ends in time must not keep the process alive for the grace.
      Deno.unrefTimer(setTimeout(() => resolve(undefined), KILL_GRACE_MS));
    },
  };
}

/** What a streamed command left behind once it ended. */
export interface StreamedExit {
  readonly code: number;
  /** Its stderr (the last 64 KiB). */
  readonly stderr: string;
  /** True when it was killed (by {@linkcode StreamedCommand.kill} or an abort signal). */
  readonly killed: boolean;
}

/** A started command whose stdin or stdout is a stream (`zfs send`, `zfs receive`). */
export interface StreamedCommand {
  /** The command's stdin, when asked for (`stdin: "piped"`); close it to end the input. */
  readonly stdin: WritableStream<Uint8Array> | null;
  /** The command's stdout, when asked for (`stdout: "piped"`). */
  readonly stdout: ReadableStream<Uint8Array> | null;
  /** Settles when the command has ended (it never rejects). */
  readonly exit: Promise<StreamedExit>;
  /** Kills the command (SIGKILL); harmless once it has ended. */
  kill(): void;
}

/**
 * An open file given to a command as its stdin or stdout, by its node:fs descriptor
 * (`fs.promises.open(…).fd`): the command reads or writes the file itself, and no byte passes
 * through this process (`zfs send > file`, `zfs receive < file`). The caller keeps the file open
 * and closes it after the command ended.
 */
export interface FileDescriptor {
  readonly fd: number;
}

/** Options of a streamed command. */
export interface SpawnOptions {
  readonly stdin?: "piped" | "null" | FileDescriptor;
  readonly stdout?: "piped" | "null" | FileDescriptor;
  /** Kills the command when aborted. */
  readonly signal?: AbortSignal;
}

/** Starts programs whose input or output is a stream of any size; never through a shell. */
export interface StreamRunner {
  spawn(argv: readonly string[], options?: SpawnOptions): StreamedCommand;
}

const STDERR_KEEP = 64 * 1024;

/** Keeps the last {@linkcode STDERR_KEEP} bytes of what is added. */
class Tail {
  #bytes = new Uint8Array(0);

  add(chunk: Uint8Array): void {
    const joined = new Uint8Array(this.#bytes.length + chunk.length);
    joined.set(this.#bytes);
    joined.set(chunk, this.#bytes.length);
    this.#bytes = joined.length > STDERR_KEEP ? joined.slice(joined.length - STDERR_KEEP) : joined;
  }

  text(): string {
    return decoder.decode(this.#bytes);
  }
}

/**
 * The real stream runner, with the same environment as the runner: on top of `Deno.Command`,
 * or of node:child_process when a file descriptor is given (Deno.Command cannot take one).
 */
export class DenoStreamRunner implements StreamRunner {
  spawn(argv: readonly string[], options: SpawnOptions = {}): StreamedCommand {
    const [program, ...args] = argv;
    if (program === undefined) throw new TypeError("Cannot run an empty argument list");
    if (typeof options.stdin === "object" || typeof options.stdout === "object") {
      return spawnWithFiles(program, args, options);
    }
    const child = new Deno.Command(program, {
      args,
      stdin: options.stdin ?? "null",
      stdout: options.stdout ?? "null",
      stderr: "piped",
      env: { LC_ALL: "C", LANG: "C" },
    }).spawn();
    let killed = false;
    const grace = graceAfterKill();
    const kill = () => {
      killed = true;
      try {
        child.kill("SIGKILL");
      } catch {
        // Already gone.
      }
      grace.start();
    };
    const signal = options.signal;
    if (signal?.aborted) kill();
    signal?.addEventListener("abort", kill, { once: true });
    const ended = (async (): Promise<StreamedExit> => {
      // Keep only the tail of stderr: a misbehaving command cannot grow our memory.
      const tail = new Tail();
      for await (const chunk of child.stderr) tail.add(chunk);
      const status = await child.status;
      return { code: status.code, stderr: tail.text(), killed };
    })();
    const exit = settleAfterKill(
      ended,
      grace,
      program,
      child.pid,
      () => signal?.removeEventListener("abort", kill),
    );
    return {
      stdin: options.stdin === "piped" ? child.stdin : null,
      stdout: options.stdout === "piped" ? child.stdout : null,
      exit,
      kill,
    };
  }
}

/** One process that ended, as an observer (the metrics) sees it. */
export interface CommandEvent {
  readonly argv: readonly string[];
  /** The exit code (-1 when it could not be started or its end was not seen). */
  readonly code: number;
  /** Killed by a time limit, an abort or {@linkcode StreamedCommand.kill}. */
  readonly killed: boolean;
  readonly seconds: number;
}

/** Told about every process that ends; must not throw. */
export type CommandObserver = (event: CommandEvent) => void;

/** A runner that tells `observe` about every command `inner` runs. */
export class ObservedRunner implements CommandRunner {
  readonly #inner: CommandRunner;
  readonly #observe: CommandObserver;

  constructor(inner: CommandRunner, observe: CommandObserver) {
    this.#inner = inner;
    this.#observe = observe;
  }

  async run(argv: readonly string[], options?: RunOptions): Promise<CommandResult> {
    const started = performance.now();
    const seconds = () => (performance.now() - started) / 1000;
    try {
      const res = await this.#inner.run(argv, options);
      this.#observe({ argv, code: res.code, killed: res.timedOut, seconds: seconds() });
      return res;
    } catch (err) {
      this.#observe({ argv, code: -1, killed: false, seconds: seconds() });
      throw err;
    }
  }
}

/** A stream runner that tells `observe` about every command `inner` starts, when it ends. */
export class ObservedStreamRunner implements StreamRunner {
  readonly #inner: StreamRunner;
  readonly #observe: CommandObserver;

  constructor(inner: StreamRunner, observe: CommandObserver) {
    this.#inner = inner;
    this.#observe = observe;
  }

  spawn(argv: readonly string[], options?: SpawnOptions): StreamedCommand {
    const started = performance.now();
    let cmd: StreamedCommand;
    try {
      cmd = this.#inner.spawn(argv, options);
    } catch (err) {
      this.#observe({ argv, code: -1, killed: false, seconds: 0 });
      throw err;
    }
    void cmd.exit.then((e) =>
      this.#observe({
        argv,
        code: e.code,
        killed: e.killed,
        seconds: (performance.now() - started) / 1000,
      })
    );
    return cmd;
  }
}

/** A stream of the node:child_process kind: the command's stdin or stdout is a file. */
function spawnWithFiles(program: string, args: string[], options: SpawnOptions): StreamedCommand {
  const stdio = (o: SpawnOptions["stdin"]) =>
    typeof o === "object" ? o.fd : o === "piped" ? "pipe" : "ignore";
  if (options.stdin === "piped" || options.stdout === "piped") {
    throw new TypeError("A command with a file as stdin or stdout pipes nothing else");
  }
  const child = spawnNode(program, args, {
    stdio: [stdio(options.stdin), stdio(options.stdout), "pipe"],
    // Only these: node:child_process passes exactly the environment it is given.
    env: { LC_ALL: "C", LANG: "C" },
  });
  let killed = false;
  const grace = graceAfterKill();
  const kill = () => {
    killed = true;
    // false once it has ended.
    child.kill("SIGKILL");
    grace.start();
  };
  const signal = options.signal;
  if (signal?.aborted) kill();
  signal?.addEventListener("abort", kill, { once: true });
  const tail = new Tail();
  child.stderr?.on("data", (chunk: Uint8Array) => tail.add(chunk));
  const ended = new Promise<StreamedExit>((resolve) => {
    const done = (code: number, failure?: string) =>
      resolve({ code, stderr: failure ?? tail.text(), killed });
    // A command that could not start (not found, not allowed) ends here, like one that failed.
    child.once("error", (err) => done(127, `cannot run ${program}: ${err.message}`));
    // "close": stderr has been read to its end.
    child.once("close", (code, sig) => done(code ?? 128 + (sig ? constants.signals[sig] : 0)));
  });
  const exit = settleAfterKill(
    ended,
    grace,
    program,
    child.pid ?? -1,
    () => signal?.removeEventListener("abort", kill),
  );
  return { stdin: null, stdout: null, exit, kill };
}

/**
 * A streamed command's end: when it ends, or {@linkcode KILL_GRACE_MS} after it was killed if it
 * cannot end (code -1, killed). `cleanup` runs once, either way.
 */
function settleAfterKill(
  ended: Promise<StreamedExit>,
  grace: ReturnType<typeof graceAfterKill>,
  program: string,
  pid: number,
  cleanup: () => void,
): Promise<StreamedExit> {
  const abandoned = grace.promise.then((): StreamedExit => ({
    code: -1,
    stderr: unkillable(program, pid),
    killed: true,
  }));
  return Promise.race([ended, abandoned]).finally(cleanup);
}
