/**
 * The one seam through which the plugin starts other programs. Everything that runs zfs,
 * zpool, mount or umount goes through a {@linkcode CommandRunner}, so tests can replace it.
 */

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
    const timer = setTimeout(() => {
      timedOut = true;
      try {
        child.kill("SIGKILL");
      } catch {
        // Already gone.
      }
    }, timeoutMs);
    try {
      const out = await child.output();
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

/** Options of a streamed command. */
export interface SpawnOptions {
  readonly stdin?: "piped" | "null";
  readonly stdout?: "piped" | "null";
  /** Kills the command when aborted. */
  readonly signal?: AbortSignal;
}

/** Starts programs whose input or output is a stream of any size; never through a shell. */
export interface StreamRunner {
  spawn(argv: readonly string[], options?: SpawnOptions): StreamedCommand;
}

const STDERR_KEEP = 64 * 1024;

/** The real stream runner on top of `Deno.Command`, with the same environment as the runner. */
export class DenoStreamRunner implements StreamRunner {
  spawn(argv: readonly string[], options: SpawnOptions = {}): StreamedCommand {
    const [program, ...args] = argv;
    if (program === undefined) throw new TypeError("Cannot run an empty argument list");
    const child = new Deno.Command(program, {
      args,
      stdin: options.stdin ?? "null",
      stdout: options.stdout ?? "null",
      stderr: "piped",
      env: { LC_ALL: "C", LANG: "C" },
    }).spawn();
    let killed = false;
    const kill = () => {
      killed = true;
      try {
        child.kill("SIGKILL");
      } catch {
        // Already gone.
      }
    };
    const signal = options.signal;
    if (signal?.aborted) kill();
    signal?.addEventListener("abort", kill, { once: true });
    const exit = (async (): Promise<StreamedExit> => {
      // Keep only the tail of stderr: a misbehaving command cannot grow our memory.
      let tail = new Uint8Array(0);
      for await (const chunk of child.stderr) {
        const joined = new Uint8Array(tail.length + chunk.length);
        joined.set(tail);
        joined.set(chunk, tail.length);
        tail = joined.length > STDERR_KEEP ? joined.slice(joined.length - STDERR_KEEP) : joined;
      }
      const status = await child.status;
      signal?.removeEventListener("abort", kill);
      return { code: status.code, stderr: decoder.decode(tail), killed };
    })();
    return {
      stdin: options.stdin === "piped" ? child.stdin : null,
      stdout: options.stdout === "piped" ? child.stdout : null,
      exit,
      kill,
    };
  }
}
