/**
 * The scratch datasets `zfs-csi verify` receives a backup into, and how the ones an interrupted
 * verify left are found and removed.
 *
 * A verify creates `<parent>/.verify-<hex>` (never mounted) with {@linkcode VERIFY_PROPERTY}
 * set in the same `zfs create`, and receives into `<that>/data` below it: the mark is there
 * before a byte is received, and the data inherits it. A name alone never makes a dataset
 * verify's: an unmarked `.verify-*` (an older zfs-csi, or made by hand) is listed, never removed.
 *
 * Whether the verify that made one is gone: its mark holds the kernel's uptime (sysinfo(2),
 * CLOCK_BOOTTIME: one clock for every process of the machine, containers included, which never
 * jumps), refreshed every {@linkcode HEARTBEAT_MS} while the verify runs. A scratch dataset is
 * stale when its mark is older than {@linkcode STALE_MS} by that clock, or ahead of it (the
 * machine restarted since: every process that ran before is gone). No wall clock and no other
 * machine's clock is read. Process ids are recorded for people only: Deno lets no build read
 * /proc without every permission, and all of /proc is more than the plugin may read. The worst
 * a wrong verdict can do is remove the scratch of a verify stopped (SIGSTOP) for longer than
 * STALE_MS: that verify then fails; no volume is touched, since only a marked dataset below the
 * parent holding only `data` and its snapshots, all with the inherited mark, is destroyed.
 */

import type { Logger } from "../log.ts";
import { parseBytes, type PropertyMap } from "../zfs/parse.ts";
import type { Zfs } from "../zfs/zfs.ts";

/** Prefix of the scratch datasets verify receives into (hidden: never a volume). */
export const VERIFY_PREFIX = ".verify-";
/** User property marking a verify's scratch dataset: `up=<kernel uptime, s> pid=<n>`. */
export const VERIFY_PROPERTY = "org.zfs-csi:verify";
/** The dataset below the scratch dataset that the backup is received into. */
export const SCRATCH_DATA = "data";
/** How often a running verify refreshes its mark. */
export const HEARTBEAT_MS = 30_000;
/** A mark not refreshed for this long (by the kernel's uptime) belongs to a verify that is gone. */
export const STALE_MS = 3 * 60_000;

/** The kernel's clock, as every process of the machine sees it. */
export interface KernelClock {
  /** Seconds since boot (CLOCK_BOOTTIME), or undefined where this build may not read it. */
  uptimeSeconds(): number | undefined;
}

/** The machine's own kernel clock (src/permissions.ts grants --allow-sys=osUptime). */
export const SYSTEM_CLOCK: KernelClock = {
  uptimeSeconds() {
    if (Deno.permissions.querySync({ name: "sys", kind: "osUptime" }).state !== "granted") {
      return undefined;
    }
    try {
      return Deno.osUptime();
    } catch {
      return undefined;
    }
  },
};

/** A verify's mark. */
export interface VerifyMark {
  /** Kernel uptime at the last heartbeat, seconds. */
  readonly up: number;
  readonly pid: number;
}

/** The mark for now, or undefined when the kernel clock cannot be read. */
export function currentMark(clock: KernelClock, pid: number): string | undefined {
  const up = clock.uptimeSeconds();
  if (up === undefined) return undefined;
  return `up=${Math.floor(up)} pid=${pid}`;
}

/** Reads a mark; undefined for anything else. */
export function parseMark(text: string): VerifyMark | undefined {
  const m = /^up=(\d{1,12}) pid=(\d{1,10})$/.exec(text);
  if (!m) return undefined;
  return { up: Number(m[1]), pid: Number(m[2]) };
}

/** What is known of one scratch dataset. */
export type ScratchState =
  /** Its verify is gone: it may be removed. */
  | "stale"
  /** Its verify refreshed the mark within STALE_MS: it runs. */
  | "running"
  /** Its mark cannot be judged here (this build cannot read the kernel clock). */
  | "unknown"
  /** A `.verify-*` dataset without a mark: never removed by zfs-csi. */
  | "unmarked";

/** One scratch dataset as `list --deleted` shows it. */
export interface ScratchRow {
  readonly dataset: string;
  readonly usedBytes: number;
  readonly state: ScratchState;
  /** Why, in words. */
  readonly reason: string;
  /** The process that made it, as its mark says (for people). */
  readonly pid?: number;
}

/** Properties read of the parent's children to find scratch datasets. */
export const SCRATCH_PROPERTIES = ["type", "used", VERIFY_PROPERTY] as const;

/** The verdict on one mark, by the kernel clock. */
export function judgeMark(
  props: PropertyMap,
  clock: KernelClock,
): { state: ScratchState; reason: string; pid?: number } {
  const v = props.get(VERIFY_PROPERTY);
  const mark = v && v.source === "local" ? parseMark(v.value) : undefined;
  if (!mark) {
    return {
      state: "unmarked",
      reason: `no ${VERIFY_PROPERTY} mark: not made by this zfs-csi verify; never removed by ` +
        `zfs-csi (look at it, then zfs destroy -r it by hand)`,
    };
  }
  const up = clock.uptimeSeconds();
  if (up === undefined) {
    return {
      state: "unknown",
      pid: mark.pid,
      reason: "this build cannot read the kernel's uptime to judge it",
    };
  }
  if (mark.up > up) {
    return {
      state: "stale",
      pid: mark.pid,
      reason: `left by verify process ${mark.pid} before the machine restarted`,
    };
  }
  const silentMs = (up - mark.up) * 1000;
  if (silentMs >= STALE_MS) {
    return {
      state: "stale",
      pid: mark.pid,
      reason: `left by verify process ${mark.pid}, silent for ${Math.round(silentMs / 1000)} s`,
    };
  }
  return {
    state: "running",
    pid: mark.pid,
    reason: `verify process ${mark.pid} may still run: its mark was refreshed ` +
      `${Math.max(0, Math.round(silentMs / 1000))} s ago (stale after ${STALE_MS / 1000} s ` +
      `without)`,
  };
}

/** The scratch datasets among the parent's children (a `zfs get -r -d 1` with SCRATCH_PROPERTIES). */
export function scratchRows(
  parent: string,
  tree: ReadonlyMap<string, PropertyMap>,
  clock: KernelClock,
): ScratchRow[] {
  const rows: ScratchRow[] = [];
  for (const [dataset, props] of tree) {
    const component = dataset.slice(parent.length + 1);
    if (!dataset.startsWith(`${parent}/`) || component.includes("/") || component.includes("@")) {
      continue;
    }
    if (!component.startsWith(VERIFY_PREFIX) || props.get("type")?.value !== "filesystem") continue;
    const verdict = judgeMark(props, clock);
    rows.push({
      dataset,
      usedBytes: parseBytes(props.get("used")?.value ?? "0"),
      ...verdict,
    });
  }
  return rows.sort((a, b) => (a.dataset < b.dataset ? -1 : 1));
}

/**
 * Destroys a scratch dataset after reading it again: it must carry its own mark, and hold
 * nothing but `data` and its snapshots, which inherit the mark from it.
 * @returns undefined once destroyed (or gone), else why it was kept
 */
export async function removeScratchDataset(
  zfs: Zfs,
  dataset: string,
  accept: (props: PropertyMap) => boolean,
): Promise<string | undefined> {
  const tree = await zfs.getTree(dataset, 2, ["type", VERIFY_PROPERTY]);
  if (!tree) return undefined;
  const own = tree.get(dataset);
  if (!own || own.get("type")?.value !== "filesystem" || !accept(own)) {
    return "its mark changed since it was listed (its verify is running)";
  }
  const data = `${dataset}/${SCRATCH_DATA}`;
  const foreign = [...tree.entries()].filter(([name, props]) => {
    if (name === dataset) return false;
    const mine = name === data || name.startsWith(`${data}@`);
    const inherited = props.get(VERIFY_PROPERTY)?.source === `inherited from ${dataset}`;
    return !(mine && inherited);
  }).map(([name]) => name);
  if (foreign.length > 0) {
    return `it holds what verify does not make (${foreign.join(", ")}): look at it, then ` +
      `zfs destroy -r it by hand`;
  }
  for (let attempt = 0;; attempt++) {
    try {
      await zfs.destroy(dataset, { recursive: true });
      return undefined;
    } catch (err) {
      // zfs-fuse can call a dataset received a moment ago busy.
      const busy = err instanceof Error && /busy/i.test(err.message);
      if (!busy || attempt >= 5) {
        return `zfs destroy -r failed: ${err instanceof Error ? err.message : String(err)}`;
      }
      await new Promise((r) => setTimeout(r, 200 * (attempt + 1)));
    }
  }
}

/** What a sweep of stale scratch datasets did. */
export interface SweepResult {
  readonly removed: readonly ScratchRow[];
  readonly kept: readonly (ScratchRow & { readonly why: string })[];
}

/**
 * Removes the stale scratch datasets below `parent` (each read again right before), and tells
 * which stale ones were kept and why. Running, unknown and unmarked ones are left alone.
 */
export async function removeStaleScratch(
  zfs: Zfs,
  parent: string,
  clock: KernelClock,
): Promise<SweepResult> {
  const tree = await zfs.getTree(parent, 1, SCRATCH_PROPERTIES) ?? new Map();
  const removed: ScratchRow[] = [];
  const kept: (ScratchRow & { why: string })[] = [];
  for (const row of scratchRows(parent, tree, clock)) {
    if (row.state !== "stale") continue;
    const why = await removeScratchDataset(
      zfs,
      row.dataset,
      (props) => judgeMark(props, clock).state === "stale",
    );
    if (why === undefined) removed.push(row);
    else kept.push({ ...row, why });
  }
  return { removed, kept };
}

/** Refreshes a running verify's mark every HEARTBEAT_MS until stopped. */
export class Heartbeat {
  readonly #timer: ReturnType<typeof setInterval>;
  #running: Promise<void> = Promise.resolve();

  constructor(zfs: Zfs, dataset: string, clock: KernelClock, pid: number, everyMs = HEARTBEAT_MS) {
    this.#timer = setInterval(() => {
      const mark = currentMark(clock, pid);
      if (mark === undefined) return;
      // A refresh that fails is tried again next time; STALE_MS allows several to fail.
      this.#running = this.#running.then(() => zfs.set(dataset, VERIFY_PROPERTY, mark))
        .catch(() => {});
    }, everyMs);
    Deno.unrefTimer(this.#timer);
  }

  /** Stops refreshing and waits for a refresh under way. */
  async stop(): Promise<void> {
    clearInterval(this.#timer);
    await this.#running;
  }
}

/**
 * The plugin's sweep: removes stale scratch datasets at start and then every `intervalMs`,
 * logging what it removed and what it kept.
 */
export class ScratchSweep {
  readonly #zfs: Zfs;
  readonly #parent: string;
  readonly #log: Logger;
  readonly #clock: KernelClock;
  #timer: ReturnType<typeof setInterval> | undefined;
  #sweeping: Promise<void> | undefined;

  constructor(deps: { zfs: Zfs; parentDataset: string; log: Logger; clock?: KernelClock }) {
    this.#zfs = deps.zfs;
    this.#parent = deps.parentDataset;
    this.#log = deps.log;
    this.#clock = deps.clock ?? SYSTEM_CLOCK;
  }

  /** One sweep; a call while one runs joins it. Never throws. */
  sweep(): Promise<void> {
    this.#sweeping ??= this.#once().finally(() => (this.#sweeping = undefined));
    return this.#sweeping;
  }

  /** Sweeps now and every `intervalMs` (default 30 min), without keeping the process alive. */
  start(intervalMs = 30 * 60_000): void {
    if (this.#timer !== undefined) return;
    void this.sweep();
    this.#timer = setInterval(() => void this.sweep(), intervalMs);
    Deno.unrefTimer(this.#timer);
  }

  stop(): void {
    if (this.#timer !== undefined) clearInterval(this.#timer);
    this.#timer = undefined;
  }

  async #once(): Promise<void> {
    try {
      const { removed, kept } = await removeStaleScratch(this.#zfs, this.#parent, this.#clock);
      for (const r of removed) {
        this.#log.info("removed the scratch dataset of an interrupted zfs-csi verify", {
          dataset: r.dataset,
          usedBytes: r.usedBytes,
          reason: r.reason,
        });
      }
      for (const k of kept) {
        this.#log.warn("kept the scratch dataset of an interrupted zfs-csi verify", {
          dataset: k.dataset,
          usedBytes: k.usedBytes,
          reason: k.why,
        });
      }
    } catch (err) {
      this.#log.warn("could not look for scratch datasets of interrupted verifies", {
        error: err,
      });
    }
  }
}
