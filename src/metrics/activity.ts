/**
 * What the plugin did since it started: gRPC calls, the processes it ran and its backups.
 * Counted in memory as things happen (no I/O), so a scrape reads them for free.
 *
 * Counters exist at 0 from the start for what is known then (the processes the plugin runs,
 * the methods it serves answered OK) and from the first scrape that sees a volume (its backups
 * stored and failed, its bytes sent): a counter that first appears at 1 hides that first
 * increase from rate() and increase(), and an alert on failed backups would miss it.
 */

import type { CommandEvent } from "../run.ts";
import { CounterVec, gauge, HistogramVec, type MetricFamily } from "./exposition.ts";

/** Latency buckets of gRPC calls, seconds: a Probe takes milliseconds, a create seconds. */
export const CALL_BUCKETS = [0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60];
/** Duration buckets of zfs/zpool/mount processes, seconds (a zfs send may run for hours). */
export const COMMAND_BUCKETS = [
  0.005,
  0.01,
  0.025,
  0.05,
  0.1,
  0.25,
  0.5,
  1,
  2.5,
  5,
  10,
  30,
  60,
  300,
  3600,
];

const WORD = /^[a-z][a-z-]{0,23}$/;

/**
 * The program and subcommand a process is counted under: `zfs get`, `zpool list`, `mount list`
 * (the table), `mount bind`, `mount remount`, `mount mount`, `umount umount`. Bounded: anything
 * unexpected counts as "other", so a label never carries a dataset name or a path.
 */
export function commandLabels(argv: readonly string[]): [program: string, subcommand: string] {
  const path = argv[0] ?? "";
  const base = path.slice(path.lastIndexOf("/") + 1);
  const program = WORD.test(base) ? base : "other";
  const args = argv.slice(1);
  if (program === "mount") {
    if (args.length === 0) return [program, "list"];
    if (args.includes("--bind")) return [program, "bind"];
    if (args.some((a) => a.split(",").includes("remount"))) return [program, "remount"];
    return [program, "mount"];
  }
  if (program === "umount") return [program, "umount"];
  const sub = args[0] ?? "";
  return [program, WORD.test(sub) ? sub : "other"];
}

/**
 * The processes the plugin runs, declared at 0: zfs's subcommands it uses, zpool list, the mount
 * table, bind mounts and remounts, umount.
 */
export const KNOWN_COMMANDS: readonly (readonly [string, string])[] = [
  ...[
    "get",
    "list",
    "create",
    "set",
    "inherit",
    "snapshot",
    "clone",
    "destroy",
    "rename",
    "mount",
    "unmount",
    "send",
    "receive",
  ].map((sub) => ["zfs", sub] as const),
  ["zpool", "list"],
  ["mount", "list"],
  ["mount", "bind"],
  ["mount", "remount"],
  ["mount", "mount"],
  ["umount", "umount"],
];

/** How a scheduled backup of a volume ended. */
export type BackupResult = "stored" | "failed";

/** The counters and histograms of the plugin's activity. */
export class Activity {
  readonly #calls = new CounterVec(
    "zfs_csi_grpc_calls_total",
    "CSI gRPC calls answered, by method and gRPC status code.",
    ["method", "code"],
  );
  readonly #callSeconds = new HistogramVec(
    "zfs_csi_grpc_call_duration_seconds",
    "Time from receiving a CSI gRPC call to answering it, lock waits included.",
    ["method"],
    CALL_BUCKETS,
  );
  readonly #commands = new CounterVec(
    "zfs_csi_commands_total",
    "zfs, zpool, mount and umount processes that ended, by program and subcommand.",
    ["program", "subcommand"],
  );
  readonly #commandFailures = new CounterVec(
    "zfs_csi_command_failures_total",
    "Processes that exited non-zero or were killed (time limit, abort), by program and subcommand.",
    ["program", "subcommand"],
  );
  readonly #commandSeconds = new HistogramVec(
    "zfs_csi_command_duration_seconds",
    "Run time of zfs, zpool, mount and umount processes, by program and subcommand.",
    ["program", "subcommand"],
    COMMAND_BUCKETS,
  );
  readonly #backups = new CounterVec(
    "zfs_csi_backups_total",
    "Scheduled backups that ended, by volume and result (stored or failed).",
    ["volume", "result"],
  );
  readonly #sentBytes = new CounterVec(
    "zfs_csi_backup_sent_bytes_total",
    "Bytes of zfs send streams stored in the backup store, by volume.",
    ["volume"],
  );
  /** Unix seconds of each volume's last failed scheduled backup; 0 for none since start. */
  readonly #lastFailed = new Map<string, number>();
  readonly #now: () => number;

  /** @param now wall clock, ms since the epoch (for the last failure's time); replaceable in tests */
  constructor(now: () => number = Date.now) {
    this.#now = now;
    for (const [program, sub] of KNOWN_COMMANDS) {
      this.#commands.declare([program, sub]);
      this.#commandFailures.declare([program, sub]);
    }
  }

  /** Makes `methods` answered OK exist at 0: the methods the plugin serves. */
  declareMethods(methods: readonly string[]): void {
    for (const m of methods) this.#calls.declare([m, "OK"]);
  }

  /** Makes a volume's backup counters exist at 0 (the metrics see it now). */
  declareVolumes(volumes: readonly string[]): void {
    for (const v of volumes) {
      this.#backups.declare([v, "stored"]);
      this.#backups.declare([v, "failed"]);
      this.#sentBytes.declare([v]);
      if (!this.#lastFailed.has(v)) this.#lastFailed.set(v, 0);
    }
  }

  /** One answered gRPC call; `code` is the status name, e.g. "OK" or "NOT_FOUND". */
  observeCall(method: string, code: string, seconds: number): void {
    this.#calls.inc([method, code]);
    this.#callSeconds.observe([method], seconds);
  }

  /** One process that ended (the seam in src/run.ts reports it). */
  observeCommand(event: CommandEvent): void {
    const labels = commandLabels(event.argv);
    this.#commands.inc(labels);
    if (event.code !== 0 || event.killed) this.#commandFailures.inc(labels);
    this.#commandSeconds.observe(labels, event.seconds);
  }

  /** One scheduled backup of `volume` that ended. */
  observeBackup(volume: string, result: BackupResult): void {
    this.#backups.inc([volume, result]);
    if (result === "failed") this.#lastFailed.set(volume, Math.floor(this.#now() / 1000));
  }

  /** One stream of `bytes` stored for `volume`. */
  observeSent(volume: string, bytes: number): void {
    this.#sentBytes.inc([volume], bytes);
  }

  /** Snapshots of every family, for rendering. */
  families(): MetricFamily[] {
    return [
      this.#calls.family(),
      this.#callSeconds.family(),
      this.#commands.family(),
      this.#commandFailures.family(),
      this.#commandSeconds.family(),
      this.#backups.family(),
      this.#sentBytes.family(),
      gauge(
        "zfs_csi_volume_last_failed_backup_timestamp_seconds",
        "When the volume's last scheduled backup failed (unix seconds, this node's clock); 0: " +
          "none failed since the plugin started.",
        [...this.#lastFailed].map(([volume, value]) => ({ labels: { volume }, value })),
      ),
    ];
  }
}
