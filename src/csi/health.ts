/**
 * Plugin health for Probe: zfs answers, the pool is usable, the parent dataset exists and is
 * mounted where this process can see it. Checked in the background and cached, so a Probe
 * never waits on a slow zfs for long.
 */

import type { Logger } from "../log.ts";
import type { Mounter } from "../mount/mounter.ts";
import { mountsAt } from "../mount/mountinfo.ts";
import { poolOf } from "../zfs/names.ts";
import type { Zfs } from "../zfs/zfs.ts";

/** The outcome of one health check. */
export interface HealthStatus {
  readonly ready: boolean;
  /** Why not ready (or a warning, such as a degraded pool); empty when all is well. */
  readonly reason: string;
  /** Pool health as zpool reports it, if it answered. */
  readonly poolHealth?: string;
  /** When the check finished (ms since epoch). */
  readonly checkedAt: number;
}

/** Pool states in which datasets can still be read and written. */
const USABLE_POOL_STATES = new Set(["ONLINE", "DEGRADED"]);

/** Timing of the health checks. */
export interface HealthOptions {
  /** A cached result younger than this is answered without checking again. */
  readonly ttlMs: number;
  /** Time limit of each zfs/zpool call made by a check. */
  readonly checkTimeoutMs: number;
  /** How long a Probe waits for a check in flight before answering from the last result. */
  readonly maxWaitMs: number;
}

/** Runs and caches health checks; at most one check runs at a time. */
export class HealthChecker {
  readonly #zfs: Zfs;
  readonly #mounter: Mounter;
  readonly #parent: string;
  readonly #log: Logger;
  readonly #opts: HealthOptions;
  #last: HealthStatus | undefined;
  #running: Promise<HealthStatus> | undefined;

  constructor(
    deps: { zfs: Zfs; mounter: Mounter; parentDataset: string; log: Logger },
    opts: HealthOptions = { ttlMs: 10_000, checkTimeoutMs: 4_000, maxWaitMs: 3_000 },
  ) {
    this.#zfs = deps.zfs;
    this.#mounter = deps.mounter;
    this.#parent = deps.parentDataset;
    this.#log = deps.log;
    this.#opts = opts;
  }

  /** The last result, if any check has finished. */
  get last(): HealthStatus | undefined {
    return this.#last;
  }

  /**
   * The current status, never waiting on zfs once a first check has finished: a result older
   * than `ttlMs` is answered as it is while a new check starts in the background. Before the
   * first result, waits up to `maxWaitMs` for it.
   */
  async status(): Promise<HealthStatus> {
    const last = this.#last;
    if (last) {
      if (Date.now() - last.checkedAt >= this.#opts.ttlMs) void this.refresh();
      return last;
    }
    const check = this.refresh();
    let timer: ReturnType<typeof setTimeout> | undefined;
    const waited = new Promise<undefined>((resolve) => {
      timer = setTimeout(() => resolve(undefined), this.#opts.maxWaitMs);
    });
    try {
      return await Promise.race([check, waited]) ?? {
        ready: false,
        reason: "The first health check is still running",
        checkedAt: Date.now(),
      };
    } finally {
      clearTimeout(timer);
    }
  }

  /**
   * Checks every `ttlMs` in the background, so Probe answers from a recent result and a change
   * of health is logged when it happens, not when Nomad next asks. Returns a stop function.
   */
  startPeriodic(): () => void {
    void this.refresh();
    const timer = setInterval(() => void this.refresh(), this.#opts.ttlMs);
    return () => clearInterval(timer);
  }

  /** Starts a check unless one is running; resolves with its result. */
  refresh(): Promise<HealthStatus> {
    this.#running ??= this.#check().finally(() => this.#running = undefined);
    return this.#running;
  }

  async #check(): Promise<HealthStatus> {
    const status = await this.#evaluate().catch((err): HealthStatus => ({
      ready: false,
      reason: `Health check failed: ${err instanceof Error ? err.message : String(err)}`,
      checkedAt: Date.now(),
    }));
    const before = this.#last;
    this.#last = status;
    if (!before || before.ready !== status.ready || before.reason !== status.reason) {
      const fields = { ready: status.ready, reason: status.reason, pool: status.poolHealth };
      if (status.ready && status.reason === "") this.#log.info("plugin healthy", fields);
      else this.#log.warn(status.ready ? "plugin degraded" : "plugin not ready", fields);
    }
    return status;
  }

  async #evaluate(): Promise<HealthStatus> {
    const pool = poolOf(this.#parent);
    const t = this.#opts.checkTimeoutMs;
    const [health, props, table] = await Promise.all([
      this.#zfs.poolHealth(pool, t),
      this.#zfs.getProperties(this.#parent, ["type", "mounted", "mountpoint"], t),
      this.#mounter.table(),
    ]);
    const now = Date.now();
    const base = health === undefined ? {} : { poolHealth: health };
    if (health === undefined) {
      return { ready: false, reason: `Pool "${pool}" is not imported`, checkedAt: now };
    }
    if (!USABLE_POOL_STATES.has(health)) {
      return { ...base, ready: false, reason: `Pool "${pool}" is ${health}`, checkedAt: now };
    }
    if (!props) {
      return {
        ...base,
        ready: false,
        reason: `Parent dataset "${this.#parent}" does not exist`,
        checkedAt: now,
      };
    }
    if (props.get("type")?.value !== "filesystem") {
      return {
        ...base,
        ready: false,
        reason: `Parent dataset "${this.#parent}" is not a filesystem`,
        checkedAt: now,
      };
    }
    const mountpoint = props.get("mountpoint")?.value ?? "";
    if (props.get("mounted")?.value !== "yes") {
      return {
        ...base,
        ready: false,
        reason: `Parent dataset "${this.#parent}" is not mounted`,
        checkedAt: now,
      };
    }
    // The parent's own mount shows which filesystem type the running ZFS mounts as.
    this.#mounter.learnZfsType(table, this.#parent, mountpoint);
    const judge = this.#mounter.judge();
    if (!mountsAt(table, mountpoint).some((e) => judge.isMountOf(e, this.#parent))) {
      return {
        ...base,
        ready: false,
        reason: `Parent dataset "${this.#parent}" is mounted at "${mountpoint}" on the host but ` +
          `not visible to the plugin: bind-mount that path into the plugin task`,
        checkedAt: now,
      };
    }
    const reason = health === "ONLINE" ? "" : `Pool "${pool}" is ${health}`;
    return { ...base, ready: true, reason, checkedAt: now };
  }
}

/**
 * What is wrong with the plugin's storage as a volume condition message, or undefined when
 * the last check found nothing (or none has finished).
 */
export function storageProblem(last: HealthStatus | undefined): string | undefined {
  if (!last) return undefined;
  if (!last.ready) return last.reason;
  if (last.poolHealth && last.poolHealth !== "ONLINE") return `pool is ${last.poolHealth}`;
  return undefined;
}
