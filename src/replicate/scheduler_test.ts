import assert from "node:assert/strict";
import { Logger } from "../log.ts";
import { gate } from "../../tests/support/fake_runner.ts";
import {
  type BackupHarness,
  backupHarness,
  PARENT,
  T0,
} from "../../tests/support/backup_harness.ts";
import {
  BACKUP_INTERVAL_PROPERTY,
  BACKUP_LAST_PROPERTY,
  type BackupOptions,
  type BackupOutcome,
  backupVolume,
} from "./backup.ts";
import {
  BackupScheduler,
  type SchedulerDeps,
  type SchedulerTimers,
  type TimerId,
} from "./scheduler.ts";

const SECONDS = T0 / 1000;
const STORED = { status: "stored" } as unknown as BackupOutcome;

interface Clocks {
  wall: number;
  mono: number;
}

function scheduler(
  h: BackupHarness,
  backup: SchedulerDeps["backup"],
  clocks: Clocks = { wall: T0, mono: 0 },
): BackupScheduler {
  return new BackupScheduler({
    zfs: h.deps.zfs,
    parentDataset: PARENT,
    log: new Logger("error", {}, () => {}),
    backup,
    now: () => clocks.wall,
    monotonic: () => clocks.mono,
  });
}

/** A volume backed up every 15 minutes, last at `last` (unix seconds) if given. */
function scheduled(h: BackupHarness, name: string, last?: number): string {
  return h.volume(name, {
    [BACKUP_INTERVAL_PROPERTY]: "900",
    ...(last === undefined ? {} : { [BACKUP_LAST_PROPERTY]: String(last) }),
  });
}

Deno.test("BackupScheduler backs up due volumes one at a time, most overdue first", async () => {
  const h = backupHarness();
  const never = scheduled(h, "never");
  const late = scheduled(h, "late", SECONDS - 3600);
  const due = scheduled(h, "due", SECONDS - 900);
  scheduled(h, "fresh", SECONDS - 899);
  h.volume("unscheduled");
  h.volume("off", { [BACKUP_INTERVAL_PROPERTY]: "0" });
  h.volume("bad", { [BACKUP_INTERVAL_PROPERTY]: "often" });
  h.pool.add(`${PARENT}/foreign`, { [BACKUP_INTERVAL_PROPERTY]: "900" });
  h.pool.add(`${PARENT}/.deleted-1-x`, {
    "org.zfs-csi:managed": "yes",
    [BACKUP_INTERVAL_PROPERTY]: "900",
  });
  const order: string[] = [];
  let running = 0;
  let most = 0;
  const hold = gate();
  const s = scheduler(h, async (dataset) => {
    order.push(dataset);
    most = Math.max(most, ++running);
    await hold.promise;
    running--;
    return STORED;
  });
  const first = s.tick();
  // A second tick joins the first; a requested upload waits for the running backup only.
  const second = s.tick();
  await new Promise((r) => setTimeout(r, 10));
  assert.equal(s.status(never)?.running, true);
  const requested = s.runExclusive(() => {
    order.push("requested");
    most = Math.max(most, ++running);
    running--;
    return Promise.resolve(1);
  });
  hold.open();
  await Promise.all([first, second, requested]);
  assert.equal(most, 1);
  assert.deepEqual(order, [never, "requested", late, due]);
  assert.deepEqual([...s.statuses().keys()].sort(), [due, `${PARENT}/fresh`, late, never]);
  assert.equal(s.status(due)?.lastSuccessAt, T0);
  assert.equal(s.status(`${PARENT}/fresh`)?.lastSuccessAt, T0 - 899_000);
});

Deno.test("BackupScheduler skips a volume whose lock is held, until the next tick", async () => {
  // A backup that waited for the lock would wait 5 s.
  const h = backupHarness({ lockWaitMs: 5000 });
  const busy = scheduled(h, "busy");
  const free = scheduled(h, "free");
  const s = scheduler(h, (dataset, options) => backupVolume(h.deps, dataset, options));
  const lock = h.locks.tryAcquire([busy])!;
  const started = performance.now();
  await s.tick();
  assert.ok(performance.now() - started < 2500, "the tick waited for the busy volume");
  assert.deepEqual(h.sends.map((x) => x.snapshot.split("@")[0]), [free]);
  assert.deepEqual(s.status(busy), { failures: 0, running: false });
  assert.equal(h.pool.value(busy, BACKUP_LAST_PROPERTY), undefined);
  lock.release();
  await s.tick();
  assert.deepEqual(h.sends.map((x) => x.snapshot.split("@")[0]), [free, busy]);
  assert.equal(h.pool.value(busy, BACKUP_LAST_PROPERTY), String(SECONDS));
  // Now neither is due.
  await s.tick();
  assert.equal(h.sends.length, 2);
});

Deno.test("BackupScheduler retries a failed volume after a doubling backoff, and says why", async () => {
  const h = backupHarness();
  const ds = scheduled(h, "pg");
  const clocks = { wall: T0, mono: 0 };
  let fail = true;
  let calls = 0;
  const s = scheduler(h, () => {
    calls++;
    return fail ? Promise.reject(new Error("store down")) : Promise.resolve(STORED);
  }, clocks);
  await s.tick();
  assert.deepEqual(s.status(ds), { failures: 1, lastError: "store down", running: false });
  await s.tick();
  assert.equal(calls, 1);
  clocks.mono += 30_000;
  await s.tick();
  assert.equal(calls, 2);
  assert.equal(s.status(ds)?.failures, 2);
  // The second failure waits 60 s.
  clocks.mono += 59_999;
  await s.tick();
  assert.equal(calls, 2);
  clocks.mono += 1;
  fail = false;
  await s.tick();
  assert.equal(calls, 3);
  assert.deepEqual(s.status(ds), { lastSuccessAt: T0, failures: 0, running: false });
});

Deno.test("BackupScheduler.stop aborts the running backup and waits for it", async () => {
  const h = backupHarness();
  scheduled(h, "pg");
  scheduled(h, "pg2");
  let seen: AbortSignal | undefined;
  const calls: string[] = [];
  const s = scheduler(h, (dataset: string, options: BackupOptions) => {
    calls.push(dataset);
    seen = options.signal;
    return new Promise((_, reject) => {
      options.signal!.addEventListener("abort", () => reject(options.signal!.reason));
    });
  });
  const tick = s.tick();
  await new Promise((r) => setTimeout(r, 10));
  await s.stop();
  await tick;
  assert.equal(seen?.aborted, true);
  // The second volume was not started, and an abort is no failure.
  assert.equal(calls.length, 1);
  assert.equal(s.status(calls[0]!)?.failures, 0);
  assert.equal(s.status(calls[0]!)?.running, false);
  await assert.rejects(s.runExclusive(() => Promise.resolve(1)), /stopping/);
});

Deno.test("BackupScheduler backs up a volume stamped in the future by a clock that was ahead", async () => {
  const h = backupHarness();
  const ahead = scheduled(h, "ahead", SECONDS + 3600);
  const soon = scheduled(h, "soon", SECONDS + 60);
  const done: string[] = [];
  const s = scheduler(h, (dataset) => {
    done.push(dataset);
    return Promise.resolve(STORED);
  });
  await s.tick();
  assert.deepEqual(done, [ahead]);
  assert.ok(s.status(soon));
});

/** Timers that only record what the scheduler asked for; `fire` runs the newest. */
function fakeTimers() {
  const asked: { fn: () => void; ms: number; cleared: boolean }[] = [];
  const timers: SchedulerTimers = {
    set(fn, ms) {
      asked.push({ fn, ms, cleared: false });
      return asked.length as unknown as TimerId;
    },
    clear(id) {
      asked[(id as unknown as number) - 1]!.cleared = true;
    },
  };
  /** Waits until the scheduler has set its next timer; returns its delay. */
  const next = async (count: number): Promise<number> => {
    for (let i = 0; i < 200 && asked.length < count; i++) {
      await new Promise((r) => setTimeout(r, 5));
    }
    assert.equal(asked.length, count, "the scheduler set its next timer");
    return asked[count - 1]!.ms;
  };
  return { timers, asked, next };
}

/** A scheduler on fake clocks and timers whose backups stamp backup-last as zfs would. */
function wakingScheduler(
  h: BackupHarness,
  clocks: Clocks,
  timers: SchedulerTimers,
  extra: Partial<SchedulerDeps> = {},
  fail: () => boolean = () => false,
) {
  const done: string[] = [];
  const s = new BackupScheduler({
    zfs: h.deps.zfs,
    parentDataset: PARENT,
    log: new Logger("error", {}, () => {}),
    backup: async (dataset) => {
      done.push(dataset);
      if (fail()) throw new Error("store down");
      await h.deps.zfs.set(dataset, BACKUP_LAST_PROPERTY, String(Math.floor(clocks.wall / 1000)));
      return STORED;
    },
    now: () => clocks.wall,
    monotonic: () => clocks.mono,
    timers,
    ...extra,
  });
  return { s, done };
}

Deno.test("BackupScheduler wakes when the earliest volume falls due, within 5 s and 30 s", async () => {
  const h = backupHarness();
  const clocks = { wall: T0, mono: 0 };
  const t = fakeTimers();
  const ten = h.volume("ten", {
    [BACKUP_INTERVAL_PROPERTY]: "10s",
    [BACKUP_LAST_PROPERTY]: String(SECONDS - 4),
  });
  h.volume("hourly", {
    [BACKUP_INTERVAL_PROPERTY]: "1h",
    [BACKUP_LAST_PROPERTY]: String(SECONDS),
  });
  const { s, done } = wakingScheduler(h, clocks, t.timers);
  s.start();
  // Nothing due: the next pass is when "ten" falls due, 6 s on, not a fixed 30 s tick.
  assert.equal(await t.next(1), 6_000);
  assert.deepEqual(done, []);
  clocks.wall += 6_000;
  clocks.mono += 6_000;
  t.asked[0]!.fn();
  // "ten" is backed up; it is due again in 10 s.
  assert.equal(await t.next(2), 10_000);
  assert.deepEqual(done, [ten]);
  // An interval of 1 s is held to the 5 s minimum between passes.
  await h.deps.zfs.set(ten, BACKUP_INTERVAL_PROPERTY, "1s");
  clocks.wall += 10_000;
  clocks.mono += 10_000;
  t.asked[1]!.fn();
  assert.equal(await t.next(3), 5_000);
  assert.deepEqual(done, [ten, ten]);
  // Only hourly volumes: the scheduler still looks every 30 s (for new volumes).
  await h.deps.zfs.set(ten, BACKUP_INTERVAL_PROPERTY, "1h");
  clocks.wall += 5_000;
  clocks.mono += 5_000;
  t.asked[2]!.fn();
  assert.equal(await t.next(4), 30_000);
  await s.stop();
  assert.equal(t.asked[3]!.cleared, true, "stop clears the pending timer");
});

Deno.test("BackupScheduler wakes for a failed volume when its backoff ends", async () => {
  const h = backupHarness();
  const clocks = { wall: T0, mono: 0 };
  const t = fakeTimers();
  const ds = scheduled(h, "pg");
  let failing = true;
  const { s, done } = wakingScheduler(
    h,
    clocks,
    t.timers,
    { firstBackoffMs: 7_000 },
    () => failing,
  );
  s.start();
  assert.equal(await t.next(1), 7_000);
  assert.equal(s.status(ds)?.failures, 1);
  failing = false;
  clocks.wall += 7_000;
  clocks.mono += 7_000;
  t.asked[0]!.fn();
  // Backed up at last; next due in its 15 minutes, looked at again within 30 s.
  assert.equal(await t.next(2), 30_000);
  assert.deepEqual(done, [ds, ds]);
  assert.equal(s.status(ds)?.failures, 0);
  await s.stop();
});

Deno.test("BackupScheduler bounds the backups of one pass and never loops busily", async () => {
  const h = backupHarness();
  const clocks = { wall: T0, mono: 0 };
  const t = fakeTimers();
  const names = ["a", "b", "c"].map((n) => scheduled(h, n, SECONDS - 1000 - n.charCodeAt(0)));
  const { s, done } = wakingScheduler(h, clocks, t.timers, { maxPerPass: 2 });
  s.start();
  // Two backed up, the third left for a pass 5 s after this one began (not at once).
  assert.equal(await t.next(1), 5_000);
  assert.deepEqual(done, [names[2], names[1]]);
  // A pass that took longer than 5 s still rests 1 s before the next.
  let slow = true;
  const s2 = new BackupScheduler({
    zfs: h.deps.zfs,
    parentDataset: PARENT,
    log: new Logger("error", {}, () => {}),
    backup: () => {
      clocks.mono += slow ? 9_000 : 0;
      slow = false;
      return Promise.resolve({ status: "busy" } as unknown as BackupOutcome);
    },
    now: () => clocks.wall,
    monotonic: () => clocks.mono,
    timers: t.timers,
    maxPerPass: 1,
  });
  await s.stop();
  s2.start();
  assert.equal(await t.next(2), 1_000);
  await s2.stop();
});

Deno.test("BackupScheduler with real timers keeps a 1 s interval (a 30 s tick would not)", async () => {
  const h = backupHarness();
  const ds = h.volume("fast", { [BACKUP_INTERVAL_PROPERTY]: "1s" });
  const stamps: number[] = [];
  const s = new BackupScheduler({
    zfs: h.deps.zfs,
    parentDataset: PARENT,
    log: new Logger("error", {}, () => {}),
    backup: async (dataset) => {
      stamps.push(Date.now());
      await h.deps.zfs.set(dataset, BACKUP_LAST_PROPERTY, String(Math.floor(Date.now() / 1000)));
      return STORED;
    },
    minWakeMs: 100,
  });
  s.start();
  await new Promise((r) => setTimeout(r, 3_500));
  await s.stop();
  // Stamps are whole seconds, so each copy comes 1 to 2 s after the one before.
  assert.ok(stamps.length >= 2 && stamps.length <= 5, `${stamps.length} backups in 3.5 s`);
  for (let i = 1; i < stamps.length; i++) {
    const gap = stamps[i]! - stamps[i - 1]!;
    assert.ok(gap >= 900 && gap <= 2_600, `backup ${i} came ${gap} ms after the one before`);
  }
  assert.equal(s.status(ds)?.failures, 0);
});

Deno.test("BackupScheduler: --backup-interval covers every volume that chose nothing, made before it or after", async () => {
  const h = backupHarness();
  // Made before the default was set: no interval of its own.
  const old = h.volume("old");
  const own = scheduled(h, "own");
  // CreateVolume with backup_interval=0: recorded in its parameters, no property.
  const off = h.volume("off", { "org.zfs-csi:parameters": '{"backup_interval":"0"}' });
  const zero = h.volume("zero", { [BACKUP_INTERVAL_PROPERTY]: "0" });
  // A follow volume's copy takes its interval from its owner record only.
  const copy = h.volume("copy", { "org.zfs-csi:follow-generation": "3" });
  const host = h.volume(".host-default_web");
  h.pool.add(`${PARENT}/.verify-1`, { "org.zfs-csi:managed": "yes" });
  const order: string[] = [];
  const logs: string[] = [];
  const s = new BackupScheduler({
    zfs: h.deps.zfs,
    parentDataset: PARENT,
    log: new Logger("warn", {}, (line) => logs.push(line)),
    backup: (dataset) => {
      order.push(dataset);
      return Promise.resolve(STORED);
    },
    now: () => T0,
    monotonic: () => 0,
    defaultIntervalSeconds: 3600,
  });
  await s.tick();
  assert.deepEqual(order.sort(), [host, old, own].sort());
  for (const never of [off, zero, copy]) assert.ok(!order.includes(never), never);
  assert.ok(!logs.some((l) => l.includes("without a backup schedule")), logs.join("\n"));
});

Deno.test("BackupScheduler without a default names the volumes that have no schedule, once", async () => {
  const h = backupHarness();
  h.volume("old");
  h.volume("zero", { [BACKUP_INTERVAL_PROPERTY]: "0" });
  scheduled(h, "own");
  const logs: Array<Record<string, unknown>> = [];
  const s = new BackupScheduler({
    zfs: h.deps.zfs,
    parentDataset: PARENT,
    log: new Logger("warn", {}, (line) => logs.push(JSON.parse(line))),
    backup: () => Promise.resolve(STORED),
    now: () => T0,
    monotonic: () => 0,
  });
  await s.tick();
  await s.tick();
  const said = logs.filter((l) => String(l.msg).includes("without a backup schedule"));
  assert.equal(said.length, 1);
  assert.deepEqual(said[0]!.volumes, ["old"]);
  assert.match(String(said[0]!.msg), /zfs-csi backup set VOLUME --interval 1h/);
});
