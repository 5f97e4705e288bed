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
