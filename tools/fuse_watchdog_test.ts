import assert from "node:assert/strict";
import {
  describe,
  describeGone,
  GoneTracker,
  parseSample,
  type ProcSample,
  StuckTracker,
  waitsOnDaemon,
} from "./fuse_watchdog.ts";

const STAT = "6000 (umount) D 5999 6000 2193 0 -1 4194560 100 0 0 0 0 0 0 0 20 0 1 0 " +
  "2377146 3133440 375 18446744073709551615 1 2 3";
const STATUS = "Name:\tumount\nvoluntary_ctxt_switches:\t4\nnonvoluntary_ctxt_switches:\t3\n";

function sample(pid: number, wchan: string, switches: number, startTime = "100"): ProcSample {
  return { pid, startTime, comm: "zfs", wchan, switches, cmdline: `zfs create p/v${pid}` };
}

Deno.test("fuse watchdog: a /proc sample is read, comm with spaces and parentheses included", () => {
  const s = parseSample(6000, STAT, STATUS, "fuse_get_req\n", "/usr/bin/umount\0/tmp/a b\0");
  assert.deepEqual(s, {
    pid: 6000,
    startTime: "2377146",
    comm: "umount",
    wchan: "fuse_get_req",
    switches: 7,
    cmdline: "/usr/bin/umount /tmp/a b",
  });
  const odd = parseSample(7, STAT.replace("(umount)", "(a) b (c)"), STATUS, "0", "");
  assert.equal(odd?.comm, "a) b (c");
  assert.equal(odd?.startTime, "2377146");
  assert.equal(parseSample(7, "7 (x", STATUS, "0", ""), undefined);
  assert.equal(parseSample(7, STAT, "Name:\tx\n", "0", ""), undefined, "no switch counts");
});

Deno.test("fuse watchdog: FUSE waits count, and zfs or zpool waiting on the daemon's socket", () => {
  for (const w of ["request_wait_answer", "fuse_get_req", "fuse_lock_inode"]) {
    assert.ok(waitsOnDaemon("stat", w), w);
  }
  for (const w of ["0", "futex_do_wait", "do_epoll_wait", "pipe_read", "refuse_x"]) {
    assert.ok(!waitsOnDaemon("zfs", w), w);
  }
  assert.ok(waitsOnDaemon("zfs", "unix_stream_read_generic"));
  assert.ok(waitsOnDaemon("zpool", "unix_stream_data_wait"));
  assert.ok(!waitsOnDaemon("nomad", "unix_stream_read_generic"), "other programs' sockets");
});

Deno.test("fuse watchdog: a waiter is stuck only after waiting unscheduled for the whole time", () => {
  const t = new StuckTracker(90_000);
  assert.deepEqual(t.observe([sample(1, "request_wait_answer", 5)], 0), []);
  assert.deepEqual(t.observe([sample(1, "request_wait_answer", 5)], 89_999), []);
  const stuck = t.observe([sample(1, "request_wait_answer", 5), sample(2, "0", 1)], 90_000);
  assert.deepEqual(stuck.map((s) => [s.sample.pid, s.seconds]), [[1, 90]]);
});

Deno.test("fuse watchdog: a process making many quick FUSE requests is never stuck", () => {
  const t = new StuckTracker(90_000);
  for (let i = 0; i <= 20; i++) {
    // Sampled in a FUSE wait every time, but scheduled in between (its switches move).
    assert.deepEqual(t.observe([sample(1, "request_wait_answer", 10 + i)], i * 10_000), []);
  }
});

Deno.test("fuse watchdog: a wait that ends, or a pid reused, starts the count again", () => {
  const t = new StuckTracker(90_000);
  t.observe([sample(1, "fuse_lock_inode", 5)], 0);
  t.observe([sample(1, "0", 5)], 50_000); // woke up (no context switch counted yet)
  t.observe([sample(1, "fuse_lock_inode", 5)], 60_000);
  assert.deepEqual(t.observe([sample(1, "fuse_lock_inode", 5)], 140_000), []);
  assert.equal(t.observe([sample(1, "fuse_lock_inode", 5)], 150_000).length, 1);
  const u = new StuckTracker(90_000);
  u.observe([sample(1, "fuse_lock_inode", 5, "100")], 0);
  assert.deepEqual(u.observe([sample(1, "fuse_lock_inode", 5, "200")], 100_000), [], "reused pid");
});

Deno.test("fuse watchdog: the report names each stuck process and what it runs", () => {
  const text = describe(
    [{ sample: sample(42, "fuse_get_req", 1), seconds: 95 }],
    new Date("2026-11-27T10:00:00Z"),
  );
  assert.match(text, /^fuse-watchdog 2026-11-27T10:00:00.000Z: zfs-fuse stopped answering/);
  assert.ok(
    text.includes("\n  pid 42 (zfs) waits in fuse_get_req for 95s: zfs create p/v42\n"),
    text,
  );
});

Deno.test("fuse watchdog: the daemon is gone only when two looks in a row miss it", () => {
  const t = new GoneTracker(2);
  assert.equal(t.observe(true), false);
  assert.equal(t.observe(false), false, "one look can fall inside a restart");
  assert.equal(t.observe(true), false);
  assert.equal(t.observe(false), false);
  assert.equal(t.observe(false), true);
  assert.equal(t.observe(true), false, "started again");
  assert.match(describeGone(new Date(0)), /^fuse-watchdog 1970-01-01T00:00:00.000Z: the zfs-fuse/);
});
