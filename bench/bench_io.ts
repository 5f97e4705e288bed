/**
 * What the benchmarks that move data share (store_bench.ts, follow_bench.ts): timing a function
 * or a bash floor by its own clock, flushing the disks between trials, checking curl, sizes and
 * rates as text, destroying what a trial made despite zfs-fuse's "busy", and running one
 * section on its own.
 */

import { sh, tryRun } from "../tests/support/zfs_pool.ts";
import { formatTable, type Row } from "./stats.ts";

/** One mebibyte. */
export const MiB = 1024 * 1024;

/** curl gained --aws-sigv4 in 7.75. */
const CURL_MIN = [7, 75];

/** Resolves after `ms`. */
export const sleep = (ms: number): Promise<void> => new Promise((r) => setTimeout(r, ms));

/** Milliseconds `fn` takes, and what it returned. */
export async function timed<T>(fn: () => Promise<T>): Promise<{ ms: number; value: T }> {
  const t0 = performance.now();
  const value = await fn();
  return { ms: performance.now() - t0, value };
}

/** Runs the trials in rotating order, so no side always goes first. */
export async function interleave(
  trials: number,
  sides: readonly ((t: number) => Promise<void>)[],
): Promise<void> {
  for (let t = 0; t < trials; t++) {
    for (let k = 0; k < sides.length; k++) await sides[(t + k) % sides.length]!(t);
  }
}

/**
 * Runs `script` under bash (errexit, pipefail) and returns how long it took by bash's own clock
 * (ms), so bash's start-up is not counted. `env` is added to a C locale.
 */
export async function timedBash(
  script: string,
  env: Record<string, string> = {},
): Promise<number> {
  const full = [
    "set -euo pipefail",
    "t0=${EPOCHREALTIME/./}",
    script,
    "t1=${EPOCHREALTIME/./}",
    "echo elapsed $((10#$t1 - 10#$t0))",
  ].join("\n");
  const res = await new Deno.Command("bash", {
    args: ["-c", full],
    env: { LC_ALL: "C", LANG: "C", ...env },
    stdout: "piped",
    stderr: "piped",
  }).output();
  const dec = new TextDecoder();
  const m = /^elapsed (\d+)$/m.exec(dec.decode(res.stdout));
  if (!res.success || !m) {
    throw new Error(`floor failed: ${script}: ${dec.decode(res.stderr).trim()}`);
  }
  return Number(m[1]) / 1000;
}

/** How long the disk must have written nothing before a trial starts. */
const QUIET_MS = 1000;
/** The most a trial waits for a quiet disk; a disk busy with other work is then left busy. */
const QUIET_LIMIT_MS = 20_000;

/**
 * Flushes dirty pages before a trial, then waits until the disk under `/tmp` (where the bench
 * pools, stores and floor files live) has written nothing for a second, so that no trial pays
 * for the one before: deleting a 1 GiB file, or zfs freeing a destroyed dataset's blocks, goes
 * on writing after `sync` returns, and moved the next transfer by up to a third here. Not timed.
 */
export async function syncDisks(): Promise<void> {
  await sh("sync");
  const stat = await diskStatPath("/tmp");
  if (!stat) return;
  const started = Date.now();
  let last = await sectorsWritten(stat);
  let quietSince = Date.now();
  while (Date.now() - quietSince < QUIET_MS && Date.now() - started < QUIET_LIMIT_MS) {
    await sleep(100);
    const now = await sectorsWritten(stat);
    if (now !== last) [last, quietSince] = [now, Date.now()];
  }
}

/** `/sys/dev/block/MAJ:MIN/stat` of the block device holding `path`, if it has one. */
async function diskStatPath(path: string): Promise<string | undefined> {
  const dev = (await Deno.stat(path)).dev;
  // Linux's dev_t: the major number in bits 8-19 (and 32 up), the minor in 0-7 and 20-31.
  const major = ((dev >> 8) & 0xfff) | (Math.floor(dev / 2 ** 32) & ~0xfff);
  const minor = (dev & 0xff) | ((dev >> 12) & 0xfff00);
  const stat = `/sys/dev/block/${major}:${minor}/stat`;
  return await Deno.stat(stat).then(() => stat, () => undefined);
}

/** Sectors written to a block device since boot (field 7 of its stat file). */
async function sectorsWritten(stat: string): Promise<string> {
  return (await Deno.readTextFile(stat)).trim().split(/\s+/)[6] ?? "";
}

/** Checks that curl can sign S3 requests; returns its version ("curl 8.5.0"). */
export async function checkCurl(): Promise<string> {
  const r = await tryRun("curl", "--version").catch(() => undefined);
  const line = r?.stdout.split("\n")[0] ?? "";
  const v = /^curl (\d+)\.(\d+)/.exec(line);
  if (!v || Number(v[1]) * 1000 + Number(v[2]) < CURL_MIN[0]! * 1000 + CURL_MIN[1]!) {
    throw new Error(
      `The store benchmarks upload their S3 floor with curl --aws-sigv4 (curl ` +
        `${CURL_MIN.join(".")}+); found ${line || "no curl on PATH"}: install a newer curl`,
    );
  }
  return line.split(" ").slice(0, 2).join(" ");
}

/** "1 GiB", "64 MiB". */
export function sizeLabel(mib: number): string {
  return mib >= 1024 && mib % 1024 === 0 ? `${mib / 1024} GiB` : `${mib} MiB`;
}

/** Bytes per second as MiB/s. */
export function rate(bytes: number, ms: number): string {
  return `${(bytes / MiB / (ms / 1000)).toFixed(0)} MiB/s`;
}

/** Bytes as "12.3 MiB". */
export function mib(bytes: number): string {
  return `${(bytes / MiB).toFixed(1)} MiB`;
}

/** Destroys a dataset and its snapshots (or one snapshot), retrying zfs-fuse's "busy". */
export async function destroyTree(name: string): Promise<void> {
  for (let attempt = 0;; attempt++) {
    const r = await tryRun("zfs", "destroy", "-r", name);
    if (r.code === 0) return;
    if (attempt >= 20 || !/busy/.test(r.stderr)) {
      throw new Error(`zfs destroy -r ${name}: ${r.stderr}`);
    }
    await sleep(250);
  }
}

/** Overwrites `countMiB` MiB of `file` at `seekMiB` with new random bytes, synced. */
export async function overwriteRandom(
  file: string,
  countMiB: number,
  seekMiB = 0,
): Promise<void> {
  await sh(
    "dd",
    "if=/dev/urandom",
    `of=${file}`,
    "bs=1M",
    `count=${countMiB}`,
    `seek=${seekMiB}`,
    "conv=notrunc,fsync",
    "status=none",
  );
}

/**
 * Runs one section on its own (`deno run … bench/<section>.ts`): quick when
 * ZFS_CSI_BENCH_QUICK=1, progress lines on stderr, its table on stdout.
 */
export async function runSectionAlone(
  section: (o: { quick: boolean; progress: (text: string) => void }) => Promise<Row[]>,
): Promise<void> {
  const encoder = new TextEncoder();
  const rows = await section({
    quick: Deno.env.get("ZFS_CSI_BENCH_QUICK") === "1",
    progress: (text) => Deno.stderr.writeSync(encoder.encode(`bench: ${text}\n`)),
  });
  Deno.stdout.writeSync(encoder.encode(formatTable(rows) + "\n"));
}
