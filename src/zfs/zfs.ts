/**
 * Typed access to zfs and zpool: argv builders + the command runner + parsers. The only place
 * that reads zfs stderr, which it classifies into {@linkcode ZfsErrorKind} once.
 */

import { ZfsError, type ZfsErrorKind } from "../errors.ts";
import type { Logger } from "../log.ts";
import type { CommandResult, CommandRunner } from "../run.ts";
import {
  createArgs,
  getArgs,
  mountArgs,
  poolHealthArgs,
  type Properties,
  setArgs,
} from "./args.ts";
import { parseGet, parsePoolHealth, type PropertyMap } from "./parse.ts";

/** Where the zfs and zpool programs are, and how long one call may take. */
export interface ZfsOptions {
  readonly zfsPath: string;
  readonly zpoolPath: string;
  readonly timeoutMs: number;
  readonly log: Logger;
}

const PATTERNS: ReadonlyArray<readonly [ZfsErrorKind, RegExp]> = [
  ["not_found", /does not exist|no such pool|no such file or directory|could not find/i],
  ["exists", /already exists/i],
  ["busy", /\bbusy\b/i],
  ["no_space", /out of space|no space left|quota exceeded/i],
  ["permission", /permission denied|operation not permitted/i],
  ["unsupported", /not supported|unsupported|must be upgraded|pool version/i],
  [
    "invalid",
    /invalid|bad property|bad numeric value|cannot be set|too long|illegal|must be a number|less than current used/i,
  ],
];

/**
 * Classifies a failed zfs or zpool command by its stderr (run with LC_ALL=C).
 * @returns the kind, "unknown" if no pattern matches
 */
export function classifyZfsError(stderr: string): ZfsErrorKind {
  for (const [kind, re] of PATTERNS) if (re.test(stderr)) return kind;
  return "unknown";
}

/** zfs and zpool behind typed methods. */
export class Zfs {
  readonly #runner: CommandRunner;
  readonly #opts: ZfsOptions;

  constructor(runner: CommandRunner, opts: ZfsOptions) {
    this.#runner = runner;
    this.#opts = opts;
  }

  async #exec(
    program: string,
    args: readonly string[],
    timeoutMs?: number,
  ): Promise<CommandResult> {
    const argv = [program, ...args];
    const limitMs = timeoutMs ?? this.#opts.timeoutMs;
    this.#opts.log.debug("exec", { argv });
    const started = performance.now();
    const res = await this.#runner.run(argv, { timeoutMs: limitMs });
    this.#opts.log.debug("exec done", {
      argv,
      code: res.code,
      durationMs: Math.round(performance.now() - started),
    });
    if (res.timedOut) throw new ZfsError("timeout", argv, `timed out after ${limitMs}ms`);
    if (res.code !== 0) throw new ZfsError(classifyZfsError(res.stderr), argv, res.stderr);
    return res;
  }

  #zfs(args: readonly string[], timeoutMs?: number): Promise<CommandResult> {
    return this.#exec(this.#opts.zfsPath, args, timeoutMs);
  }

  /**
   * Properties of one dataset, or undefined if it does not exist.
   * @throws {ZfsError} for any other failure
   */
  async getProperties(
    dataset: string,
    props: readonly string[],
    timeoutMs?: number,
  ): Promise<PropertyMap | undefined> {
    try {
      const res = await this.#zfs(getArgs([dataset], props), timeoutMs);
      return parseGet(res.stdout).get(dataset) ?? new Map();
    } catch (err) {
      if (err instanceof ZfsError && err.kind === "not_found") return undefined;
      throw err;
    }
  }

  /** Creates a filesystem with properties set at creation. */
  async create(dataset: string, props: Properties): Promise<void> {
    await this.#zfs(createArgs(dataset, props));
  }

  /** Sets one property. */
  async set(dataset: string, name: string, value: string): Promise<void> {
    await this.#zfs(setArgs(dataset, name, value));
  }

  /** Mounts a filesystem at its mountpoint; already mounted counts as success. */
  async mount(dataset: string): Promise<void> {
    try {
      await this.#zfs(mountArgs(dataset));
    } catch (err) {
      if (err instanceof ZfsError && /already mounted/i.test(err.stderr)) return;
      throw err;
    }
  }

  /**
   * Health of a pool ("ONLINE", "DEGRADED", ...), or undefined if no such pool is imported.
   * @throws {ZfsError} for any other failure
   */
  async poolHealth(pool: string, timeoutMs?: number): Promise<string | undefined> {
    try {
      const res = await this.#exec(this.#opts.zpoolPath, poolHealthArgs(pool), timeoutMs);
      return parsePoolHealth(res.stdout).find((p) => p.name === pool)?.health;
    } catch (err) {
      if (err instanceof ZfsError && err.kind === "not_found") return undefined;
      throw err;
    }
  }
}
