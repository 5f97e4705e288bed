/**
 * A scripted {@linkcode CommandRunner} for unit tests: records every argv, answers from a
 * script of rules, and fails loudly on any command the script does not expect. Nothing is
 * ever started, so tests using it pass without --allow-run.
 */

import { Logger } from "../../src/log.ts";
import { Mounter } from "../../src/mount/mounter.ts";
import type { CommandResult, CommandRunner, RunOptions } from "../../src/run.ts";
import { Zfs } from "../../src/zfs/zfs.ts";

/** A scripted answer; omitted fields mean success with empty output. */
export interface FakeResponse {
  readonly code?: number;
  readonly stdout?: string;
  readonly stderr?: string;
  readonly timedOut?: boolean;
}

/** The answer of a command that exits with `code` (1 unless told) and says `stderr`. */
export function fails(stderr: string, code = 1): FakeResponse {
  return { code, stderr };
}

/** An answer, or a function computing one from the argv (it may wait on a promise). */
export type Responder =
  | FakeResponse
  | ((argv: readonly string[]) => FakeResponse | Promise<FakeResponse>);

/** Decides whether a rule answers an argv. */
export type ArgvPredicate = (argv: readonly string[]) => boolean;

/** How often a rule may answer. */
export interface RuleOptions {
  /** Answer at most this many times (default: any number of times). */
  readonly times?: number;
}

/** One recorded call. */
export interface RecordedCall {
  readonly argv: readonly string[];
  readonly options: RunOptions | undefined;
}

interface Rule {
  readonly description: string;
  readonly match: ArgvPredicate;
  readonly respond: Responder;
  remaining: number;
}

/** Thrown (and recorded) when a command matches no rule. */
export class UnexpectedCommandError extends Error {
  readonly argv: readonly string[];

  constructor(argv: readonly string[], rules: readonly string[]) {
    super(
      `Unexpected command ${JSON.stringify(argv)}; scripted: ${
        rules.length > 0 ? rules.join("; ") : "nothing"
      }`,
    );
    this.name = "UnexpectedCommandError";
    this.argv = argv;
  }
}

/** Whether `argv` starts with `prefix`. */
export function hasPrefix(argv: readonly string[], prefix: readonly string[]): boolean {
  return prefix.length <= argv.length && prefix.every((p, i) => argv[i] === p);
}

/**
 * A CommandRunner that replays scripted results. Rules are tried in the order they were
 * added; the first one that matches and has answers left answers. Add `{ times: 1 }` rules
 * before a catch-all rule for the same command to script a sequence.
 */
export class FakeRunner implements CommandRunner {
  readonly #rules: Rule[] = [];
  readonly #calls: RecordedCall[] = [];
  readonly #unexpected: UnexpectedCommandError[] = [];

  /** Answers commands whose argv starts with `prefix`. */
  on(prefix: readonly string[], respond: Responder, options: RuleOptions = {}): this {
    const copy = [...prefix];
    return this.when((argv) => hasPrefix(argv, copy), respond, {
      ...options,
      description: `prefix ${JSON.stringify(copy)}`,
    });
  }

  /** Answers exactly `argv` and nothing longer or shorter. */
  onExact(argv: readonly string[], respond: Responder, options: RuleOptions = {}): this {
    const copy = [...argv];
    return this.when(
      (a) => a.length === copy.length && hasPrefix(a, copy),
      respond,
      { ...options, description: `exactly ${JSON.stringify(copy)}` },
    );
  }

  /** Answers commands for which `match` returns true. */
  when(
    match: ArgvPredicate,
    respond: Responder,
    options: RuleOptions & { readonly description?: string } = {},
  ): this {
    this.#rules.push({
      description: options.description ?? "predicate",
      match,
      respond,
      remaining: options.times ?? Infinity,
    });
    return this;
  }

  /** Every call so far, oldest first. */
  get calls(): readonly RecordedCall[] {
    return this.#calls;
  }

  /** The argv of every call so far, oldest first. */
  get argvs(): string[][] {
    return this.#calls.map((c) => [...c.argv]);
  }

  /** Commands that matched no rule. */
  get unexpected(): readonly UnexpectedCommandError[] {
    return this.#unexpected;
  }

  /**
   * Throws if any command matched no rule, even when the code under test swallowed the error.
   * @throws {UnexpectedCommandError} the first unexpected command
   */
  assertNoUnexpected(): void {
    const first = this.#unexpected[0];
    if (first) throw first;
  }

  async run(argv: readonly string[], options?: RunOptions): Promise<CommandResult> {
    const copy = Object.freeze([...argv]);
    this.#calls.push({ argv: copy, options });
    const rule = this.#rules.find((r) => r.remaining > 0 && r.match(copy));
    if (!rule) {
      const err = new UnexpectedCommandError(copy, this.#rules.map((r) => r.description));
      this.#unexpected.push(err);
      throw err;
    }
    rule.remaining -= 1;
    const r = typeof rule.respond === "function" ? await rule.respond(copy) : rule.respond;
    return {
      code: r.code ?? 0,
      stdout: r.stdout ?? "",
      stderr: r.stderr ?? "",
      timedOut: r.timedOut ?? false,
    };
  }
}

/** A promise with its resolve function exposed, to hold a fake command until a test says so. */
export interface Gate {
  readonly promise: Promise<void>;
  open(): void;
}

/** Creates a closed {@linkcode Gate}. */
export function gate(): Gate {
  const { promise, resolve } = Promise.withResolvers<void>();
  return { promise, open: () => resolve() };
}

/** One line of `mount` output (util-linux format). */
export function mountLine(
  source: string,
  mountPoint: string,
  fsType = "fuse.zfs",
  options = "rw,relatime,user_id=0,group_id=0,default_permissions,allow_other",
): string {
  return `${source} on ${mountPoint} type ${fsType} (${options})`;
}

/** Zfs and Mounter on a fake runner, with the default program names, as the unit tests use them. */
export function fakeTools(
  runner: CommandRunner,
  log: Logger = new Logger("error", {}, () => {}),
  timeoutMs = 1000,
): { zfs: Zfs; mounter: Mounter; log: Logger } {
  const zfs = new Zfs(runner, { zfsPath: "zfs", zpoolPath: "zpool", timeoutMs, log });
  const mounter = new Mounter(runner, { mountPath: "mount", umountPath: "umount", timeoutMs, log });
  return { zfs, mounter, log };
}
