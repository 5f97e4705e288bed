/**
 * Watches zfs-fuse's daemon while the ZFS tests run on it, for its two failures seen in CI:
 * - It deadlocks: now and then (one CI run; a stress of concurrent `zfs create`, stats and bind
 *   mounts did it in 2 runs of 4 here) it stops answering FUSE requests for good. Every process
 *   that then touches one of its filesystems sleeps in the kernel, SIGKILL cannot end it, and the
 *   test run hangs until CI's time runs out, with nothing said.
 * - It dies (one CI run, in a crash trial): every later test fails at once.
 *
 * A process is stuck when, for `--stuck-seconds`, it waits on the daemon (a FUSE request, or a
 * zfs or zpool command reading the daemon's socket; its wchan says) without being scheduled once
 * (its context-switch counts do not move); a process doing many quick requests is scheduled
 * between them. The daemon is gone when two looks in a row do not find it. Either way this
 * prints what it found, runs `tools/zfs-env.sh recover` (waiters get an error, the daemon starts
 * again, and the test that met it fails in seconds instead of hanging), then appends the same
 * text to `--report`. tools/test.sh runs a part, or the test files, that failed meanwhile once
 * more; nothing is run again without such a report.
 *
 * Usage: deno run --allow-write=<report> --allow-run=ps,cat,tools/zfs-env.sh
 *   tools/fuse_watchdog.ts --report FILE [--stuck-seconds 90] [--every-seconds 3]
 */

import { parseArgs } from "node:util";

/** One process as /proc shows it at one moment. */
export interface ProcSample {
  readonly pid: number;
  /** Field 22 of /proc/PID/stat: tells a reused pid apart. */
  readonly startTime: string;
  readonly comm: string;
  readonly wchan: string;
  /** Voluntary plus involuntary context switches so far. */
  readonly switches: number;
  readonly cmdline: string;
}

/** Where a waiting process was first seen waiting, and how often it had been scheduled then. */
interface Waiting {
  readonly since: number;
  readonly switches: number;
}

/** A process found stuck, with how long it has waited. */
export interface Stuck {
  readonly sample: ProcSample;
  readonly seconds: number;
}

/**
 * Whether a process waits on zfs-fuse's daemon: any process in a FUSE wait (or waiting for
 * another one's FUSE request on the same inode), or a zfs or zpool command waiting for the
 * daemon's answer on its socket.
 */
export function waitsOnDaemon(comm: string, wchan: string): boolean {
  if (wchan.startsWith("fuse_") || wchan === "request_wait_answer") return true;
  return (comm === "zfs" || comm === "zpool") && wchan.startsWith("unix_stream_");
}

/**
 * Tracks FUSE waiters between samples. A waiter stays tracked while it waits without a context
 * switch; it is stuck once that has lasted `stuckMs`.
 */
export class StuckTracker {
  readonly #stuckMs: number;
  #waiting = new Map<string, Waiting>();

  constructor(stuckMs: number) {
    this.#stuckMs = stuckMs;
  }

  /** Takes the samples of the processes waiting at `nowMs`; returns the stuck ones. */
  observe(samples: readonly ProcSample[], nowMs: number): Stuck[] {
    const next = new Map<string, Waiting>();
    const stuck: Stuck[] = [];
    for (const s of samples) {
      if (!waitsOnDaemon(s.comm, s.wchan)) continue;
      const key = `${s.pid}/${s.startTime}`;
      const seen = this.#waiting.get(key);
      const w = seen && seen.switches === s.switches
        ? seen
        : { since: nowMs, switches: s.switches };
      next.set(key, w);
      if (nowMs - w.since >= this.#stuckMs) {
        stuck.push({ sample: s, seconds: Math.round((nowMs - w.since) / 1000) });
      }
    }
    this.#waiting = next;
    return stuck;
  }
}

/** Reads one process's sample; undefined when it ended meanwhile or cannot be read. */
export function parseSample(
  pid: number,
  stat: string,
  status: string,
  wchan: string,
  cmdline: string,
): ProcSample | undefined {
  // comm is in parentheses and may hold spaces and parentheses: split after the last ")".
  const close = stat.lastIndexOf(")");
  const open = stat.indexOf("(");
  if (open < 0 || close < open) return undefined;
  const rest = stat.slice(close + 2).split(" ");
  const startTime = rest[19]; // field 22 overall; rest starts at field 3
  const count = (name: string) => Number(new RegExp(`^${name}:\\s+(\\d+)$`, "m").exec(status)?.[1]);
  const switches = count("voluntary_ctxt_switches") + count("nonvoluntary_ctxt_switches");
  if (startTime === undefined || !Number.isFinite(switches)) return undefined;
  return {
    pid,
    startTime,
    comm: stat.slice(open + 1, close),
    wchan: wchan.trim(),
    switches,
    cmdline: cmdline.split("\0").filter((a) => a !== "").join(" "),
  };
}

/** A program's stdout; "" when it failed (a process that ended meanwhile). */
async function output(program: string, ...args: string[]): Promise<string> {
  const r = await new Deno.Command(program, { args, stdout: "piped", stderr: "null" }).output();
  return r.success ? new TextDecoder().decode(r.stdout) : "";
}

/** One look at the machine: whether zfs-fuse's daemon runs, and who waits on it. */
interface Look {
  readonly daemonRuns: boolean;
  readonly waiters: ProcSample[];
}

/**
 * Looks at the processes now. Deno lets no program without --allow-all read /proc/PID, so ps
 * lists them and cat reads the files of the waiters (seldom: usually none waits).
 */
async function look(): Promise<Look> {
  const waiters: ProcSample[] = [];
  let daemonRuns = false;
  for (const line of (await output("ps", "-e", "-o", "pid=,wchan:64=,comm=")).split("\n")) {
    const [pid, wchan, comm] = line.trim().split(/\s+/);
    if (comm === "zfs-fuse") daemonRuns = true;
    if (pid === undefined || wchan === undefined || !waitsOnDaemon(comm ?? "", wchan)) continue;
    const [stat, status, cmdline] = await Promise.all(
      ["stat", "status", "cmdline"].map((f) => output("cat", `/proc/${pid}/${f}`)),
    );
    const s = parseSample(Number(pid), stat!, status!, wchan, cmdline!);
    if (s) waiters.push(s);
  }
  return { daemonRuns, waiters };
}

/**
 * Tells when the daemon is gone: absent from `looks` looks in a row (one look can fall between
 * a restart's kill and start, tools/zfs-env.sh's or a test's).
 */
export class GoneTracker {
  readonly #looks: number;
  #absent = 0;

  constructor(looks: number) {
    this.#looks = looks;
  }

  /** Takes one look's answer; true once the daemon has been absent `looks` times in a row. */
  observe(daemonRuns: boolean): boolean {
    this.#absent = daemonRuns ? 0 : this.#absent + 1;
    return this.#absent >= this.#looks;
  }
}

/** What is printed and reported when stuck processes are found. */
export function describe(stuck: readonly Stuck[], at: Date): string {
  const lines = stuck.map(({ sample: s, seconds }) =>
    `  pid ${s.pid} (${s.comm}) waits in ${s.wchan} for ${seconds}s: ${s.cmdline.slice(0, 200)}`
  );
  return [
    `fuse-watchdog ${at.toISOString()}: zfs-fuse stopped answering FUSE requests ` +
    `(${stuck.length} process(es) stuck); restarting it (tools/zfs-env.sh recover)`,
    ...lines,
    "",
  ].join("\n");
}

/** What is printed and reported when the daemon has died. */
export function describeGone(at: Date): string {
  return `fuse-watchdog ${at.toISOString()}: the zfs-fuse daemon is gone (it died); ` +
    `starting it again (tools/zfs-env.sh recover)\n`;
}

async function main(): Promise<void> {
  const { values } = parseArgs({
    options: {
      report: { type: "string" },
      "stuck-seconds": { type: "string", default: "90" },
      "every-seconds": { type: "string", default: "3" },
    },
  });
  if (!values.report) throw new Error("--report FILE is required");
  const stuckTracker = new StuckTracker(Number(values["stuck-seconds"]) * 1000);
  const goneTracker = new GoneTracker(2);
  const everyMs = Number(values["every-seconds"]) * 1000;
  const enc = new TextEncoder();
  for (;;) {
    const now = await look();
    const stuck = stuckTracker.observe(now.waiters, Date.now());
    const gone = goneTracker.observe(now.daemonRuns);
    if (stuck.length > 0 || gone) {
      const text = stuck.length > 0 ? describe(stuck, new Date()) : describeGone(new Date());
      await Deno.stderr.write(enc.encode(text));
      // Its output goes where ours goes, not through us: it finishes even if we are killed.
      const dir = new URL(".", import.meta.url).pathname;
      const r = await new Deno.Command(`${dir}zfs-env.sh`, { args: ["recover"] }).spawn().status;
      await Deno.stderr.write(enc.encode(`fuse-watchdog: recover exited ${r.code}\n`));
      // Written once the daemon runs again: a report means a deadlock or death was recovered.
      await Deno.writeTextFile(values.report, text, { append: true });
      stuckTracker.observe([], Date.now()); // the old waiters are gone or no longer count
      goneTracker.observe(true);
    }
    await new Promise((r) => setTimeout(r, everyMs));
  }
}

if (import.meta.main) await main();
