/**
 * Watches, while the ZFS tests run on zfs-fuse, for the daemon's own deadlock: now and then
 * (about once in twenty CI runs, and by a stress of concurrent `zfs create`, stats and bind
 * mounts in 2 of 5 tries here) zfs-fuse stops answering FUSE requests on a dataset for good.
 * Every process that then looks at that filesystem sleeps in the kernel, SIGKILL cannot end it,
 * and the test run hangs until CI's time runs out, with nothing said.
 *
 * A process is stuck when, for `--stuck-seconds`, it waits on the daemon (a FUSE request, or a
 * zfs or zpool command reading the daemon's socket; its wchan says) without being scheduled once (its context-switch counts do not move); a process doing many quick requests is
 * scheduled between them. On the first stuck process this prints what waits on what, runs
 * `tools/zfs-env.sh recover` (the waits fail, the daemon restarts, and the test that met the
 * deadlock fails in seconds instead of hanging), then appends the same text to `--report`. tools/test.sh then runs
 * that test file once more (only when this report says a recovery happened).
 *
 * Usage: deno run --allow-write=<report> --allow-run=ps,cat,tools/zfs-env.sh
 *   tools/fuse_watchdog.ts --report FILE [--stuck-seconds 90] [--every-seconds 10]
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

/**
 * Samples the processes waiting on FUSE now. Deno lets no program without --allow-all read
 * /proc/PID, so ps finds them and cat reads their files (seldom: usually none waits).
 */
async function sampleWaiters(): Promise<ProcSample[]> {
  const out: ProcSample[] = [];
  for (const line of (await output("ps", "-e", "-o", "pid=,wchan:64=,comm=")).split("\n")) {
    const [pid, wchan, comm] = line.trim().split(/\s+/);
    if (pid === undefined || wchan === undefined || !waitsOnDaemon(comm ?? "", wchan)) continue;
    const [stat, status, cmdline] = await Promise.all(
      ["stat", "status", "cmdline"].map((f) => output("cat", `/proc/${pid}/${f}`)),
    );
    const s = parseSample(Number(pid), stat!, status!, wchan, cmdline!);
    if (s) out.push(s);
  }
  return out;
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

async function main(): Promise<void> {
  const { values } = parseArgs({
    options: {
      report: { type: "string" },
      "stuck-seconds": { type: "string", default: "90" },
      "every-seconds": { type: "string", default: "10" },
    },
  });
  if (!values.report) throw new Error("--report FILE is required");
  const tracker = new StuckTracker(Number(values["stuck-seconds"]) * 1000);
  const everyMs = Number(values["every-seconds"]) * 1000;
  const enc = new TextEncoder();
  for (;;) {
    const stuck = tracker.observe(await sampleWaiters(), Date.now());
    if (stuck.length > 0) {
      const text = describe(stuck, new Date());
      await Deno.stderr.write(enc.encode(text));
      // Its output goes where ours goes, not through us: it finishes even if we are killed.
      const dir = new URL(".", import.meta.url).pathname;
      const r = await new Deno.Command(`${dir}zfs-env.sh`, { args: ["recover"] }).spawn().status;
      await Deno.stderr.write(enc.encode(`fuse-watchdog: recover exited ${r.code}\n`));
      // Written once the daemon runs again: a report means a deadlock was met and recovered.
      await Deno.writeTextFile(values.report, text, { append: true });
      tracker.observe([], Date.now()); // the old waiters are gone or no longer count
    }
    await new Promise((r) => setTimeout(r, everyMs));
  }
}

if (import.meta.main) await main();
