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
  createVolumeArgs,
  destroyArgs,
  type DestroyOptions,
  getArgs,
  getBySourceArgs,
  getLocalArgs,
  getTreeArgs,
  inheritArgs,
  loadKeyArgs,
  mountArgs,
  poolHealthArgs,
  poolPropertiesArgs,
  type Properties,
  type PropertyList,
  type PropertySource,
  receiveArgs,
  renameArgs,
  rollbackArgs,
  setArgs,
  setManyArgs,
  snapshotArgs,
  unmountArgs,
  versionArgs,
  type ZvolSpec,
} from "./args.ts";
import { parseGet, parsePoolHealth, type PropertyMap } from "./parse.ts";
import { parsePoolStreamSupport, parseZfsVersion, type PoolStreamSupport } from "./stream_form.ts";

/** Where the zfs and zpool programs are, how long one call may take, and what to trust. */
export interface ZfsOptions {
  readonly zfsPath: string;
  readonly zpoolPath: string;
  readonly timeoutMs: number;
  readonly log: Logger;
  /**
   * The dataset everything the plugin manages lives below (its parent dataset). zfs says "dataset
   * does not exist" of every dataset of a pool it cannot see (not imported yet, or the zfs-fuse
   * daemon restarting), so {@linkcode Zfs.getProperties} and {@linkcode Zfs.getTree} believe
   * "does not exist" of a name below the anchor only when the anchor is visible right after;
   * otherwise they throw ZfsError "unavailable". Without an anchor (unit tests, tools), every
   * "does not exist" is believed.
   */
  readonly anchor?: string;
}

/**
 * zfs-fuse's daemon or OpenZFS's kernel module cannot be reached: no command can see anything.
 * Checked first: zfs-fuse's "connect: No such file or directory" is not a missing dataset.
 */
const UNAVAILABLE =
  /make sure that the zfs-fuse daemon is running|failed to initiali[sz]e (?:the )?(?:zfs|libzfs) library|zfs modules (?:are not loaded|cannot be auto-loaded)|\/dev\/zfs and \/proc\/self\/mounts are required/i;

const PATTERNS: ReadonlyArray<readonly [ZfsErrorKind, RegExp]> = [
  ["unavailable", UNAVAILABLE],
  ["dependents", /has dependent clones/i],
  // Before not_found: a missing key file is bad input, not a missing dataset.
  ["invalid", /encryption failure|key material/i],
  ["key_unavailable", /key not loaded|keys? (?:is|are) not loaded|key is unavailable/i],
  ["not_found", /does not exist|no such pool|no such file or directory|could not find/i],
  ["exists", /already exists/i],
  ["busy", /\bbusy\b/i],
  // "greater than available space": a reservation (refreservation) without room for it.
  ["no_space", /out of space|no space left|quota exceeded|greater than available space/i],
  ["permission", /permission denied|operation not permitted/i],
  ["unsupported", /not supported|unsupported|must be upgraded|pool version/i],
  [
    "invalid",
    /invalid|bad property|bad numeric value|cannot be set|too long|illegal|must be a number|must be one of|must be (?:a )?power of|less than current used|keyformat required/i,
  ],
];

/** A name or path zfs quotes ('tank/nomad/busy'); ZFS names cannot hold a quote. */
const QUOTED = /'[^'\n]*'/g;
/** A line that is one bare name, as in the datasets a refused destroy lists. */
const NAME_LINE = /^\s*[^\s']*[/@][^\s']*\s*$/;
/**
 * The `cannot <verb> <name>: ` before zfs's reason, also where the name is not quoted
 * ("cannot destroy snapshot tank/v@busy: dataset is busy"); names hold no ": ".
 */
const CANNOT_PREFIX = /^cannot [^\n]*?: /;

/**
 * What zfs says went wrong, without the names it says it of: quoted names and paths, bare
 * names on their own lines, and the `cannot <verb> <name>:` before the reason. A volume named
 * "busy" or "invalid-orders" must not decide what kind of failure zfs reported.
 */
export function reasonText(stderr: string): string {
  return stderr.split("\n")
    .filter((line) => !NAME_LINE.test(line))
    .map((line) => line.replace(QUOTED, "''").replace(CANNOT_PREFIX, ""))
    .join("\n");
}

/**
 * Classifies a failed zfs or zpool command by its stderr (run with LC_ALL=C), ignoring the
 * names in it ({@linkcode reasonText}).
 * @returns the kind, "unknown" if no pattern matches
 */
export function classifyZfsError(stderr: string): ZfsErrorKind {
  const reason = reasonText(stderr);
  for (const [kind, re] of PATTERNS) if (re.test(reason)) return kind;
  return "unknown";
}

/** zfs's words for a failed command, all on one line (for a message). */
function oneLine(stderr: string): string {
  return stderr.trim().split("\n").map((l) => l.trim()).filter((l) => l !== "").join("; ")
    .slice(0, 300);
}

/** Whether `name` is a dataset or snapshot strictly below `anchor`. */
function isBelow(name: string, anchor: string): boolean {
  return name.startsWith(`${anchor}/`) || name.startsWith(`${anchor}@`);
}

/** zfs and zpool behind typed methods. */
export class Zfs {
  readonly #runner: CommandRunner;
  readonly #opts: ZfsOptions;
  /** Whether `zfs set` takes several properties; undefined until first tried. */
  #setsSeveral: boolean | undefined;
  /** Whether `zfs receive` takes `-x` and `-o`; undefined until probed (or the probe failed). */
  #receiveOverrides: Promise<boolean> | undefined;
  /** Properties found known (true) or unknown (false) to this zfs by {@linkcode knownProperties}. */
  readonly #knows = new Map<string, boolean>();
  /** What each pool's zfs send and receive can do, read once per pool (streamSupport). */
  readonly #streamSupport = new Map<string, Promise<PoolStreamSupport>>();
  /** zfs's userland version, read once (undefined: a zfs without `zfs version`). */
  #version: Promise<string | undefined> | undefined;

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
    if (res.timedOut) {
      // Code -1: the runner gave up on a command that could not be killed; its stderr says why.
      const stuck = res.code === -1 ? `; ${res.stderr}` : "";
      throw new ZfsError("timeout", argv, `timed out after ${limitMs}ms${stuck}`);
    }
    if (res.code === 0) return res;
    const kind = classifyZfsError(res.stderr);
    if (kind === "unavailable") {
      throw new ZfsError(kind, argv, res.stderr, {
        detail: `ZFS cannot be reached (${oneLine(res.stderr)}); this command changed nothing: ` +
          `start the zfs-fuse daemon or load the ZFS kernel module, then retry`,
      });
    }
    throw new ZfsError(kind, argv, res.stderr);
  }

  #zfs(args: readonly string[], timeoutMs?: number): Promise<CommandResult> {
    return this.#exec(this.#opts.zfsPath, args, timeoutMs);
  }

  /**
   * Properties of one dataset or snapshot, or undefined if it does not exist. Below the anchor
   * "does not exist" counts only when the anchor is visible (see {@linkcode ZfsOptions.anchor});
   * of the anchor itself it is answered as undefined, for the caller to report.
   * @throws {ZfsError} unavailable when neither it nor the anchor is visible; the classified
   *   failure for anything else
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
      if (!(err instanceof ZfsError && err.kind === "not_found")) throw err;
      await this.#checkAbsent(dataset, err, timeoutMs);
      return undefined;
    }
  }

  /**
   * Properties of `root` and every descendant down to `depth`, by name; undefined if `root`
   * does not exist. One zfs process, however many datasets there are. Below the anchor "does
   * not exist" counts only when the anchor is visible; the anchor itself must be visible: a
   * listing of it that cannot see it would read as empty.
   * @throws {ZfsError} unavailable when `root` is the anchor and not visible, or is below it
   *   and neither is visible; the classified failure for anything else
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
      if (!(err instanceof ZfsError && err.kind === "not_found")) throw err;
      if (root === this.#opts.anchor) throw anchorNotVisible(err, root);
      await this.#checkAbsent(root, err);
      return undefined;
    }
  }

  /**
   * Returns when zfs's "does not exist" of `name` can be believed: when `name` is not below
   * the anchor, or the anchor is visible right after. Asked only on this (rare) path, so a read
   * of a dataset that exists still costs one process. (Only a pool imported in the moment
   * between the two reads could fool it.)
   * @throws {ZfsError} unavailable when the anchor is not visible either
   */
  async #checkAbsent(name: string, err: ZfsError, timeoutMs?: number): Promise<void> {
    const anchor = this.#opts.anchor;
    if (anchor === undefined || !isBelow(name, anchor)) return;
    try {
      await this.#zfs(getArgs([anchor], ["type"]), timeoutMs);
    } catch (e) {
      if (e instanceof ZfsError && (e.kind === "not_found" || e.kind === "unavailable")) {
        throw anchorNotVisible(err, anchor, e);
      }
      throw e;
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

  /**
   * The names among `props` that this zfs knows, asking zfs only about those not asked before
   * (the answer is the same for the life of this Zfs). See {@linkcode unknownProperties}.
   * @throws {ZfsError} for failures other than an unknown property
   */
  async knownProperties(dataset: string, props: readonly string[]): Promise<string[]> {
    const ask = [...new Set(props)].filter((p) => !this.#knows.has(p));
    if (ask.length > 0) {
      const unknown = new Set(await this.unknownProperties(dataset, ask));
      for (const p of ask) this.#knows.set(p, !unknown.has(p));
    }
    return props.filter((p) => this.#knows.get(p) === true);
  }

  /**
   * Whether `zfs receive` takes `-x` and `-o` (OpenZFS) or not (zfs-fuse), found once per Zfs
   * by a dry run (`-n`) of `-x mountpoint` into `target` with an empty stdin: OpenZFS takes the
   * option and then fails to read a stream (nothing is received either way); zfs-fuse refuses
   * the option ("invalid option 'x'") before it reads anything.
   * @throws {ZfsError} unavailable or timeout (not remembered: the next call asks again)
   */
  receiveOverrides(target: string): Promise<boolean> {
    this.#receiveOverrides ??= this.#probeReceiveOverrides(target).catch((err) => {
      this.#receiveOverrides = undefined;
      throw err;
    });
    return this.#receiveOverrides;
  }

  async #probeReceiveOverrides(target: string): Promise<boolean> {
    const args = receiveArgs(target, { unmounted: true, dryRun: true, exclude: ["mountpoint"] });
    try {
      await this.#zfs(args);
      return true;
    } catch (err) {
      if (!(err instanceof ZfsError)) throw err;
      if (/invalid option 'x'/.test(err.stderr)) {
        this.#opts.log.info(
          "zfs receive takes no -x or -o; received properties are checked after",
          {
            said: oneLine(err.stderr),
          },
        );
        return false;
      }
      if (err.kind === "unavailable" || err.kind === "timeout") throw err;
      // It took the option and then found no stream to read ("failed to read from stream").
      return true;
    }
  }

  /**
   * The properties of the datasets and snapshots `names` whose value comes from one of
   * `sources` (`received`: what a received stream decided), by name; a name with none is left
   * out.
   * @throws {ZfsError} classified (not_found when one of them does not exist)
   */
  async propertiesFrom(
    names: readonly string[],
    sources: readonly PropertySource[],
  ): Promise<Map<string, PropertyMap>> {
    const res = await this.#zfs(getBySourceArgs(names, sources));
    const out = new Map<string, PropertyMap>();
    for (const [name, props] of parseGet(res.stdout)) {
      // Only what zfs says comes from there: a zfs that ignored `-s` must not add anything else.
      const kept = [...props].filter(([, v]) =>
        sources.some((source) => v.source === source || v.source.startsWith(`${source} `))
      );
      if (kept.length > 0) out.set(name, new Map(kept));
    }
    return out;
  }

  /**
   * The properties set locally on `dataset` (not its snapshots), by name.
   * @throws {ZfsError} classified (not_found when it does not exist)
   */
  async localProperties(dataset: string): Promise<PropertyMap> {
    const res = await this.#zfs(getLocalArgs(dataset));
    const props = parseGet(res.stdout).get(dataset) ?? new Map();
    return new Map([...props].filter(([, v]) => v.source === "local"));
  }

  /** Creates a filesystem with properties set at creation. */
  async create(dataset: string, props: Properties): Promise<void> {
    await this.#zfs(createArgs(dataset, props));
  }

  /** Creates a zvol (`zfs create -V`). */
  async createVolume(dataset: string, spec: ZvolSpec, props: Properties): Promise<void> {
    await this.#zfs(createVolumeArgs(dataset, spec, props));
  }

  /**
   * Whether this zfs can make zvols: OpenZFS (whose `zfs version` answers, 0.8 and later) can;
   * zfs-fuse, which has no `zfs version`, cannot. Read once with the version.
   * @throws {ZfsError} when zfs cannot be asked (not remembered: the next call asks again)
   */
  async canMakeZvols(): Promise<boolean> {
    const version = this.#version ??= this.#readVersion();
    version.catch(() => this.#version = undefined);
    return (await version) !== undefined;
  }

  /** Sets one property. */
  async set(dataset: string, name: string, value: string): Promise<void> {
    await this.#zfs(setArgs(dataset, name, value));
  }

  /** Removes a locally set property, so the dataset inherits it again. */
  async inherit(dataset: string, name: string): Promise<void> {
    await this.#zfs(inheritArgs(dataset, name));
  }

  /**
   * Sets several properties, in one `zfs set` where this zfs takes several (OpenZFS: the kernel
   * applies them in order and tries a refused one again after the others), else one at a time
   * in the order given, so give them in an order that is safe one by one. Whether it takes
   * several is learnt from the first try and remembered. Not atomic either way: a caller that
   * fails half way reads the state again and sets what still differs. With `inAnyOrder` (a
   * dataset nobody else sees yet, such as a restore's temporary one), the one-at-a-time sets run
   * at once: zfs-fuse then commits them together instead of waiting for a transaction group
   * each (5 sets: 45 against 23 ms here).
   * @throws {ZfsError} classified, for the first property zfs refused
   */
  async setProperties(
    dataset: string,
    props: PropertyList,
    options: { readonly inAnyOrder?: boolean } = {},
  ): Promise<void> {
    if (props.length > 1 && this.#setsSeveral !== false) {
      try {
        await this.#zfs(setManyArgs(dataset, props));
        this.#setsSeveral = true;
        return;
      } catch (err) {
        if (!(err instanceof ZfsError && takesOnePropertyPerSet(err, props))) throw err;
        // It may have set the first property already: setting it again below changes nothing.
        this.#setsSeveral = false;
        this.#opts.log.info("zfs sets one property per call; setting them one at a time", {
          dataset,
        });
      }
    }
    if (options.inAnyOrder) {
      const settled = await Promise.allSettled(
        props.map(([name, value]) => this.set(dataset, name, value)),
      );
      const refused = settled.find((r) => r.status === "rejected");
      if (refused) throw refused.reason;
      return;
    }
    for (const [name, value] of props) await this.set(dataset, name, value);
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

  /** Rolls a filesystem back to its newest snapshot (refused when a later one exists). */
  async rollback(snapshot: string): Promise<void> {
    await this.#zfs(rollbackArgs(snapshot));
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

  // --- What zfs send and receive can do on a pool -------------------------------------------

  /**
   * What `pool`'s zfs can send and receive (src/zfs/stream_form.ts): the zfs version and the
   * pool's version and feature states, read once per pool and remembered (a failed read is
   * not). `fresh` reads them again, for a refusal that an upgrade since may have lifted.
   * @throws {ZfsError} classified, when zpool cannot read the pool; SyntaxError for output of
   *   another shape
   */
  streamSupport(
    pool: string,
    options: { readonly fresh?: boolean } = {},
  ): Promise<PoolStreamSupport> {
    let support = options.fresh ? undefined : this.#streamSupport.get(pool);
    if (!support) {
      support = this.#readStreamSupport(pool);
      this.#streamSupport.set(pool, support);
      support.catch(() => {
        if (this.#streamSupport.get(pool) === support) this.#streamSupport.delete(pool);
      });
    }
    return support;
  }

  async #readStreamSupport(pool: string): Promise<PoolStreamSupport> {
    const version = this.#version ??= this.#readVersion();
    version.catch(() => this.#version = undefined);
    const res = await this.#exec(this.#opts.zpoolPath, poolPropertiesArgs(pool));
    return parsePoolStreamSupport(pool, res.stdout, await version);
  }

  /** `zfs version`'s userland version; undefined for a zfs that does not know the command. */
  async #readVersion(): Promise<string | undefined> {
    try {
      return parseZfsVersion((await this.#zfs(versionArgs())).stdout);
    } catch (err) {
      // zfs-fuse and OpenZFS before 0.8: "unrecognized command 'version'".
      if (err instanceof ZfsError && /unrecognized command|unknown command/i.test(err.stderr)) {
        return undefined;
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

/**
 * Whether a failed `zfs set` of several properties shows a zfs that takes one per call: older
 * releases (zfs-fuse) read every argument after the first as a dataset name and say
 * "cannot open 'refquota=1': invalid dataset name".
 */
function takesOnePropertyPerSet(err: ZfsError, props: PropertyList): boolean {
  return props.slice(1).some(([name, value]) => err.stderr.includes(`'${name}=${value}'`));
}

/** The error for a "does not exist" that cannot be believed: the anchor is not visible. */
function anchorNotVisible(err: ZfsError, anchor: string, anchorErr?: ZfsError): ZfsError {
  const stderr = anchorErr ? `${err.stderr.trimEnd()}\n${anchorErr.stderr}` : err.stderr;
  return new ZfsError("unavailable", err.argv, stderr, {
    detail: `the parent dataset "${anchor}" is not visible${anchorErr ? " either" : ""}, so ` +
      `ZFS cannot see the pool (not imported, the ZFS daemon or module not running, or no ` +
      `such dataset); nothing was changed: retry once "zfs list ${anchor}" answers`,
    cause: anchorErr ?? err,
  });
}
