/**
 * What the plugin did since it started: gRPC calls, the processes it ran and its backups.
 * Counted in memory as things happen (no I/O), so a scrape reads them for free.
 */

import type { CommandEvent } from "../run.ts";
import { CounterVec, HistogramVec, type MetricFamily } from "./exposition.ts";

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
    ];
  }
}
