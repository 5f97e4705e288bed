/**
 * Typed access to zfs and zpool: argv builders + the command runner + parsers. The only place
 * that reads zfs stderr, which it classifies into {@linkcode ZfsErrorKind} once.
 */

import { ZfsError, type ZfsErrorKind } from "../errors.ts";
import type { Logger } from "../log.ts";
import type { CommandResult, CommandRunner } from "../run.ts";
import {
  cloneArgs,
  createArgs,
  destroyArgs,
  type DestroyOptions,
  getArgs,
  getTreeArgs,
  loadKeyArgs,
  mountArgs,
  poolHealthArgs,
  type Properties,
  renameArgs,
  setArgs,
  snapshotArgs,
  unmountArgs,
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
  ["dependents", /has dependent clones/i],
  // Before not_found: a missing key file is bad input, not a missing dataset.
  ["invalid", /encryption failure|key material/i],
  ["key_unavailable", /key not loaded|keys? (?:is|are) not loaded|key is unavailable/i],
  ["not_found", /does not exist|no such pool|no such file or directory|could not find/i],
  ["exists", /already exists/i],
  ["busy", /\bbusy\b/i],
  ["no_space", /out of space|no space left|quota exceeded/i],
  ["permission", /permission denied|operation not permitted/i],
  ["unsupported", /not supported|unsupported|must be upgraded|pool version/i],
  [
    "invalid",
    /invalid|bad property|bad numeric value|cannot be set|too long|illegal|must be a number|must be one of|must be (?:a )?power of|less than current used|keyformat required/i,
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

  /**
   * Properties of `root` and every descendant down to `depth`, by name; undefined if `root`
   * does not exist. One zfs process, however many datasets there are.
   * @throws {ZfsError} for any other failure
   */
  async getTree(
    root: string,
    depth: number,
    props: readonly string[],
  ): Promise<Map<string, PropertyMap> | undefined> {
    try {
      const res = await this.#zfs(getTreeArgs(root, depth, props));
      return parseGet(res.stdout);
    } catch (err) {
      if (err instanceof ZfsError && err.kind === "not_found") return undefined;
      throw err;
    }
  }

  /**
   * The names among `props` that this ZFS does not know, found by asking for them on `dataset`
   * (zfs names the first unknown one; each is then asked again without it).
   * @throws {ZfsError} for failures other than an unknown property
   */
  async unknownProperties(dataset: string, props: readonly string[]): Promise<string[]> {
    const unknown: string[] = [];
    let rest = [...props];
    while (rest.length > 0) {
      try {
        await this.#zfs(getArgs([dataset], rest));
        return unknown;
      } catch (err) {
        const bad = err instanceof ZfsError
          ? /invalid property '([^']+)'/.exec(err.stderr)?.[1]
          : undefined;
        if (bad === undefined || !rest.includes(bad)) throw err;
        unknown.push(bad);
        rest = rest.filter((p) => p !== bad);
      }
    }
    return unknown;
  }

  /** Creates a filesystem with properties set at creation. */
  async create(dataset: string, props: Properties): Promise<void> {
    await this.#zfs(createArgs(dataset, props));
  }

  /** Sets one property. */
  async set(dataset: string, name: string, value: string): Promise<void> {
    await this.#zfs(setArgs(dataset, name, value));
  }

  /** Takes a snapshot (`<dataset>@<name>`). */
  async snapshot(snapshot: string): Promise<void> {
    await this.#zfs(snapshotArgs(snapshot));
  }

  /** Clones a snapshot into a new filesystem with properties set at creation. */
  async clone(snapshot: string, dataset: string, props: Properties): Promise<void> {
    await this.#zfs(cloneArgs(snapshot, dataset, props));
  }

  /** Destroys a dataset or snapshot (never its clones, never forced). */
  async destroy(name: string, opts: DestroyOptions = {}): Promise<void> {
    await this.#zfs(destroyArgs(name, opts));
  }

  /** Renames a dataset, or a snapshot within its dataset. */
  async rename(from: string, to: string): Promise<void> {
    await this.#zfs(renameArgs(from, to));
  }

  /** Unmounts a filesystem; not mounted counts as success. */
  async unmount(dataset: string): Promise<void> {
    try {
      await this.#zfs(unmountArgs(dataset));
    } catch (err) {
      if (err instanceof ZfsError && /not currently mounted|not mounted/i.test(err.stderr)) return;
      throw err;
    }
  }

  /**
   * Mounts a filesystem at its mountpoint; already mounted counts as success. An encrypted
   * filesystem whose key is not loaded (after a reboot) gets its key loaded from its own
   * keylocation first (OpenZFS).
   */
  async mount(dataset: string): Promise<void> {
    try {
      await this.#zfs(mountArgs(dataset));
    } catch (err) {
      if (err instanceof ZfsError && /already mounted/i.test(err.stderr)) return;
      if (err instanceof ZfsError && err.kind === "key_unavailable") {
        await this.#zfs(loadKeyArgs(dataset));
        await this.#zfs(mountArgs(dataset));
        return;
      }
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
