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
import { BackupScheduler, type SchedulerDeps } from "./scheduler.ts";

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
