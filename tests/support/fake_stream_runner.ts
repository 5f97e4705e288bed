/**
 * A scripted {@linkcode StreamRunner} for unit tests of `zfs send` and `zfs receive` streaming:
 * each spawned command writes scripted stdout chunks, records what reaches its stdin, and exits
 * with a scripted code and stderr, or when killed. Nothing is ever started.
 */

import type { SpawnOptions, StreamedCommand, StreamedExit, StreamRunner } from "../../src/run.ts";

/** What one spawned command does; omitted fields mean success with no output. */
export interface StreamScript {
  /** Chunks written to stdout, one per read, then stdout ends. */
  readonly stdout?: readonly Uint8Array[];
  /** After its stdout, stay running (stdout open) until killed, as a stuck `zfs send`. */
  readonly hang?: boolean;
  /** Exit once this many stdin bytes arrived, as a `zfs receive` refusing its stream. */
  readonly exitAfterStdinBytes?: number;
  readonly code?: number;
  readonly stderr?: string;
  /**
   * What it does when its stdin is aborted (ends short): exit as zfs receive does on a stream
   * cut short (the default: code 1, "invalid backup stream"), or "hang" until killed.
   */
  readonly cutShort?: { readonly code: number; readonly stderr: string } | "hang";
  /**
   * How it exits once its stdin is closed, decided from every byte it read (a model's `zfs
   * receive` applying the stream); without it, with `code` and `stderr`.
   */
  readonly onStdinEnd?: (stdin: Uint8Array) => { readonly code: number; readonly stderr: string };
  /** Awaited before each stdin write is taken, as a `zfs receive` slower than its input. */
  readonly beforeWrite?: () => Promise<void>;
}

/** How zfs receive ends when its input stops before the stream's end. */
export const CUT_SHORT = {
  code: 1,
  stderr: "cannot receive new filesystem stream: invalid backup stream\n",
} as const;

/** Exit code of a command killed with SIGKILL, as Deno reports it. */
export const KILLED_CODE = 137;

/** One spawned command, as the test sees it. */
export class FakeProcess {
  readonly argv: readonly string[];
  readonly options: SpawnOptions;
  /**
   * What happened, in order: "stdout <n>" (a chunk given out), "stdout cancelled", "write <n>"
   * (to stdin), "close", "abort" (of stdin), "kill", "exit <code>".
   */
  readonly events: string[] = [];
  readonly #stdin: Uint8Array[] = [];
  readonly #exit = Promise.withResolvers<StreamedExit>();
  #ended = false;

  constructor(argv: readonly string[], options: SpawnOptions) {
    this.argv = argv;
    this.options = options;
  }

  /** Every byte written to stdin so far. */
  get stdinBytes(): Uint8Array {
    return joinChunks(this.#stdin);
  }

  get killed(): boolean {
    return this.events.includes("kill");
  }

  get ended(): boolean {
    return this.#ended;
  }

  get exit(): Promise<StreamedExit> {
    return this.#exit.promise;
  }

  /** Ends the command once (later calls do nothing). */
  end(code: number, stderr: string, killed: boolean): void {
    if (this.#ended) return;
    this.#ended = true;
    this.events.push(`exit ${code}`);
    this.#exit.resolve({ code, stderr, killed });
  }

  record(chunk: Uint8Array): number {
    this.#stdin.push(chunk.slice());
    this.events.push(`write ${chunk.length}`);
    return this.#stdin.reduce((n, c) => n + c.length, 0);
  }
}

/** Spawns {@linkcode FakeProcess}es from scripts chosen by argv. */
export class FakeStreamRunner implements StreamRunner {
  readonly #script: (argv: readonly string[]) => StreamScript;
  /** Every command spawned, oldest first. */
  readonly processes: FakeProcess[] = [];

  constructor(script: (argv: readonly string[]) => StreamScript) {
    this.#script = script;
  }

  spawn(argv: readonly string[], options: SpawnOptions = {}): StreamedCommand {
    const script = this.#script(argv);
    const proc = new FakeProcess([...argv], options);
    this.processes.push(proc);
    const code = script.code ?? 0;
    const stderr = script.stderr ?? "";
    let stdoutController: ReadableStreamDefaultController<Uint8Array> | undefined;
    const kill = () => {
      if (proc.ended) return;
      proc.events.push("kill");
      try {
        stdoutController?.close();
      } catch {
        // Already closed or cancelled.
      }
      proc.end(KILLED_CODE, "", true);
    };
    if (options.signal?.aborted) kill();
    options.signal?.addEventListener("abort", kill, { once: true });

    const chunks = [...(script.stdout ?? [])];
    const stdout = options.stdout === "piped"
      ? new ReadableStream<Uint8Array>({
        start(controller) {
          stdoutController = controller;
        },
        pull(controller) {
          if (proc.ended) return;
          const next = chunks.shift();
          if (next !== undefined) {
            proc.events.push(`stdout ${next.length}`);
            return controller.enqueue(next.slice());
          }
          if (script.hang) return new Promise<void>(() => {});
          controller.close();
          // A command ends after its output: the exit follows the end of stdout.
          setTimeout(() => proc.end(code, stderr, false), 0);
        },
        cancel() {
          proc.events.push("stdout cancelled");
        },
      }, { highWaterMark: 0 })
      : null;

    const brokenPipe = () => new Deno.errors.BrokenPipe("Broken pipe (os error 32)");
    const stdin = options.stdin === "piped"
      ? new WritableStream<Uint8Array>({
        async write(chunk) {
          await script.beforeWrite?.();
          if (proc.ended) throw brokenPipe();
          const total = proc.record(chunk);
          const limit = script.exitAfterStdinBytes;
          if (limit !== undefined && total >= limit) proc.end(code, stderr, false);
        },
        close() {
          if (proc.ended) throw brokenPipe();
          proc.events.push("close");
          const end = script.onStdinEnd?.(proc.stdinBytes) ?? { code, stderr };
          proc.end(end.code, end.stderr, false);
        },
        abort() {
          proc.events.push("abort");
          const cut = script.cutShort ?? CUT_SHORT;
          if (cut !== "hang") proc.end(cut.code, cut.stderr, false);
        },
      }, { highWaterMark: 1 })
      : null;

    if (options.stdin !== "piped" && options.stdout !== "piped" && !script.hang) {
      proc.end(code, stderr, false);
    }
    return { stdin, stdout, exit: proc.exit, kill };
  }
}

/** `n` bytes of a repeatable pattern, cut into chunks of `chunk` bytes. */
export function patternChunks(n: number, chunk: number, seed = 7): Uint8Array[] {
  const all = new Uint8Array(n);
  for (let i = 0; i < n; i++) all[i] = (i * 31 + seed) & 0xff;
  const out: Uint8Array[] = [];
  for (let at = 0; at < n; at += chunk) out.push(all.slice(at, at + chunk));
  return out;
}

/** The chunks joined. */
export function joinChunks(chunks: readonly Uint8Array[]): Uint8Array {
  const out = new Uint8Array(chunks.reduce((n, c) => n + c.length, 0));
  let at = 0;
  for (const c of chunks) {
    out.set(c, at);
    at += c.length;
  }
  return out;
}
