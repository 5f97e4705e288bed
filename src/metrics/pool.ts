/**
 * The pool's health and space from one `zpool list`. OpenZFS prints exact bytes with `-p`;
 * older releases (zfs-fuse) refuse `-p` and print rounded sizes ("1.98G"), read as such.
 */

import { gauge, type MetricFamily } from "./exposition.ts";

/** The health states `zpool list` reports; one series each, 1 for the current one. */
export const POOL_STATES = [
  "ONLINE",
  "DEGRADED",
  "FAULTED",
  "OFFLINE",
  "UNAVAIL",
  "REMOVED",
  "SUSPENDED",
] as const;

/** One pool as `zpool list` reports it. */
export interface PoolState {
  readonly name: string;
  readonly health: string;
  readonly sizeBytes: number;
  readonly allocatedBytes: number;
  readonly freeBytes: number;
}

/** `zpool list` of one pool's name, health and space; `parsable` adds `-p` (OpenZFS). */
export function poolListArgs(pool: string, parsable: boolean): string[] {
  return ["list", "-H", ...(parsable ? ["-p"] : []), "-o", "name,health,size,allocated,free", pool];
}

/** Whether zpool's stderr says it does not know `-p` (zfs-fuse: "invalid option 'p'"). */
export function refusesParsable(stderr: string): boolean {
  return /invalid option '?p'?/.test(stderr);
}

const UNITS = "BKMGTPE";

/**
 * A size as zpool prints it: bytes with `-p`, else a rounded "512M" or "1.98G" (powers of 1024).
 * @throws {SyntaxError} for anything else
 */
export function parseSize(text: string): number {
  if (/^\d+$/.test(text)) return Number(text);
  const m = /^(\d+(?:\.\d+)?)([KMGTPE])$/.exec(text);
  if (!m) throw new SyntaxError(`Cannot parse "${text}" as a pool size`);
  return Math.round(Number(m[1]) * 1024 ** UNITS.indexOf(m[2]!));
}

/**
 * Parses `zpool list -H [-p] -o name,health,size,allocated,free` output.
 * @throws {SyntaxError} for a line without five tab-separated fields or with a bad size
 */
export function parsePoolList(stdout: string): PoolState[] {
  const out: PoolState[] = [];
  for (const line of stdout.split("\n")) {
    if (line === "") continue;
    const f = line.split("\t");
    if (f.length !== 5) {
      throw new SyntaxError(
        `Cannot parse zpool list line ${JSON.stringify(line)}: expected 5 fields`,
      );
    }
    out.push({
      name: f[0]!,
      health: f[1]!,
      sizeBytes: parseSize(f[2]!),
      allocatedBytes: parseSize(f[3]!),
      freeBytes: parseSize(f[4]!),
    });
  }
  return out;
}

/** The pool gauges. */
export function poolFamilies(pools: readonly PoolState[]): MetricFamily[] {
  const health = pools.flatMap((p) => {
    const states: readonly string[] = POOL_STATES.includes(p.health as typeof POOL_STATES[number])
      ? POOL_STATES
      : [...POOL_STATES, p.health];
    return states.map((s) => ({
      labels: { pool: p.name, health: s },
      value: s === p.health ? 1 : 0,
    }));
  });
  const each = (value: (p: PoolState) => number) =>
    pools.map((p) => ({ labels: { pool: p.name }, value: value(p) }));
  return [
    gauge(
      "zfs_csi_pool_health",
      "1 for the pool's current health state (zpool list HEALTH), 0 for the others.",
      health,
    ),
    gauge("zfs_csi_pool_size_bytes", "The pool's size in bytes.", each((p) => p.sizeBytes)),
    gauge(
      "zfs_csi_pool_allocated_bytes",
      "Bytes allocated in the pool.",
      each((p) => p.allocatedBytes),
    ),
    gauge("zfs_csi_pool_free_bytes", "Bytes free in the pool.", each((p) => p.freeBytes)),
  ];
}
