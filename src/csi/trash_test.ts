import assert from "node:assert/strict";
import { Code } from "../errors.ts";
import { KeyedLock } from "../lock.ts";
import { Logger } from "../log.ts";
import { assertRejectsCsi, assertRejectsZfs } from "../../tests/support/assert_errors.ts";
import { fails, FakeRunner, fakeTools, gate } from "../../tests/support/fake_runner.ts";
import { FakePool, type FakeValue } from "../../tests/support/fake_pool.ts";
import { zfsArgv } from "../../tests/support/zfs_argv.ts";
import { type Inspection, Trash } from "./trash.ts";

const PARENT = "tank/nomad";
const NOW = 1_700_000_000;
const YEAR = 365 * 86400;
const MANAGED = "org.zfs-csi:managed";
const AT = "org.zfs-csi:deleted-at";
const NAME = "org.zfs-csi:deleted-name";
const CLONE = ".clone-0123456789abcdef-1600000000";

const zfs = zfsArgv("zfs");
const SUBTREE = "type,mountpoint,org.zfs-csi:managed,org.zfs-csi:deleted-at," +
  "org.zfs-csi:deleted-name,userrefs,defer_destroy";
const PURGE = "type,creation,defer_destroy,userrefs,origin,org.zfs-csi:managed," +
  "org.zfs-csi:deleted-at,org.zfs-csi:deleted-name";
/** What purge lists: the parent's children and their snapshots. */
const listArgv = (parent = PARENT) => zfs.tree(parent, 2, `${PURGE},clones`);
/** How a dataset's subtree is read right before it is deleted or purged. */
const inspectArgv = (dataset: string) => zfs.tree(dataset, 1, `${SUBTREE},clones`);
/** How a set-aside snapshot is read right before it is purged. */
const snapshotArgv = (snapshot: string) => zfs.get(`${SUBTREE},clones`, snapshot);
const destroy = (name: string) => ["zfs", "destroy", name];
const destroyDeferred = (snapshot: string) => ["zfs", "destroy", "-d", snapshot];
/** One `zfs set` of several properties, as OpenZFS takes them. */
const set = (name: string, ...props: [string, string | number][]) => [
  "zfs",
  "set",
  ...props.map(([k, v]) => `${k}=${v}`),
  name,
];
/** How a volume set aside at NOW from `dataset` is marked. */
const volumeMarks = (hidden: string, dataset: string) =>
  set(hidden, [NAME, dataset], [AT, NOW], ["canmount", "noauto"]);

interface LogLine {
  level: string;
  msg: string;
  name?: string;
  [key: string]: unknown;
}

interface Harness extends Disposable {
  readonly runner: FakeRunner;
  readonly pool: FakePool;
  readonly trash: Trash;
  readonly locks: KeyedLock;
  readonly logs: LogLine[];
  /** The wall clock (unix seconds) and the monotonic clock (seconds) the trash reads. */
  readonly clock: { wall: number; mono: number };
}

function setup(
  opts: { retention?: number; parent?: string; minObservation?: number } = {},
): Harness {
  const runner = new FakeRunner();
  const pool = new FakePool(runner);
  const parent = opts.parent ?? PARENT;
  pool.add(parent);
  const logs: LogLine[] = [];
  const log = new Logger("debug", {}, (line) => logs.push(JSON.parse(line)));
  const { zfs } = fakeTools(runner, log);
  const locks = new KeyedLock();
  const clock = { wall: NOW, mono: 5_000 };
  const trash = new Trash({
    zfs,
    parentDataset: parent,
    retentionSeconds: opts.retention ?? 3600,
    locks,
    log,
    now: () => clock.wall,
    monotonic: () => clock.mono,
    // Most tests look at expiry alone; the tests of the minimum observation set it.
    minObservationSeconds: opts.minObservation ?? 0,
  });
  return {
    runner,
    pool,
    trash,
    locks,
    logs,
    clock,
    [Symbol.dispose]: () => {
      trash.stop();
      // Even a command whose failure the trash swallowed must have been answered.
      runner.assertNoUnexpected();
    },
  };
}

/** Lets `seconds` pass on both clocks. */
function pass(h: Harness, seconds: number): void {
  h.clock.wall += seconds;
  h.clock.mono += seconds;
}

/** The marks a delete sets on what it sets aside at `at`, from `original`. */
function marks(at: number, original: string): Record<string, FakeValue> {
  return { [MANAGED]: "yes", [AT]: String(at), [NAME]: original };
}

/** Adds a volume set aside at `at` (marked), as removeVolume leaves it; returns its name. */
function setAsideVolume(
  pool: FakePool,
  name: string,
  at: number,
  extra: Record<string, FakeValue> = {},
): string {
  const hidden = `${PARENT}/.deleted-${at}-${name}`;
  pool.add(hidden, { ...marks(at, `${PARENT}/${name}`), canmount: "noauto", ...extra });
  return hidden;
}

/** Adds a snapshot of `dataset` set aside at `at` (marked); returns its name. */
function setAsideSnapshot(pool: FakePool, dataset: string, name: string, at: number): string {
  const hidden = `${dataset}@.deleted-${at}-${name}`;
  pool.add(hidden, marks(at, `${dataset}@${name}`));
  return hidden;
}

/** Adds a volume (ours, mounted nowhere) and returns its dataset. */
function volume(pool: FakePool, name: string, extra: Record<string, FakeValue> = {}): string {
  const dataset = `${PARENT}/${name}`;
  pool.add(dataset, { [MANAGED]: "yes", ...extra });
  return dataset;
}

const purgeLogs = (h: Harness) => h.logs.filter((l) => l.msg.startsWith("purge "));
const warnings = (h: Harness) => h.logs.filter((l) => l.level === "warn").map((l) => l.name);
/** Every argv that destroys, for asserting that none uses -r or -R. */
const destroys = (h: Harness) => h.runner.argvs.filter((a) => a[1] === "destroy");

async function inspected(h: Harness, dataset: string): Promise<Inspection> {
  const found = await h.trash.inspect(dataset);
  assert.ok(found, `${dataset} exists`);
  return found;
}

// ---------------------------------------------------------------------------------------------
// purge: what it destroys, and how

Deno.test("Trash.purge destroys marked items older than the retention, each read again first, never with -r", async () => {
  using h = setup({ retention: 3600 });
  const v1 = volume(h.pool, "v1");
  const oldSnap = setAsideSnapshot(h.pool, v1, "s0", NOW - 7200);
  const youngSnap = setAsideSnapshot(h.pool, v1, "s1", NOW - 60);
  const old = setAsideVolume(h.pool, "old", NOW - 7200);
  const inner = setAsideSnapshot(h.pool, old, "s9", NOW - 9000);
  h.pool.add(`${old}@${CLONE}`);
  const young = setAsideVolume(h.pool, "young", NOW - 60);
  await h.trash.purge();
  assert.deepEqual(h.runner.argvs, [
    listArgv(),
    // The set-aside volume: its subtree read again, its own snapshots one by one, then itself.
    inspectArgv(old),
    destroy(`${old}@${CLONE}`),
    destroy(inner),
    destroy(old),
    // A set-aside snapshot of a live volume, read again first.
    snapshotArgv(oldSnap),
    destroy(oldSnap),
  ]);
  assert.deepEqual(h.pool.names(), [PARENT, young, v1, youngSnap]);
  assert.deepEqual(
    h.logs.filter((l) => l.msg === "purged").map((l) => l.name),
    [old, oldSnap],
  );
  assert.ok(!h.locks.isHeld(v1) && !h.locks.isHeld(old));
});

Deno.test("Trash.purge never destroys unmarked .deleted-* datasets or snapshots, and says once what to do", async () => {
  using h = setup({ retention: 60 });
  const v1 = volume(h.pool, "v1");
  const hidden = [
    // Made by hand: a name is not a marker.
    `${PARENT}/.deleted-1-x`,
    // Set aside by an older zfs-csi: its own marker, but no deletion time.
    `${PARENT}/.deleted-100-legacy`,
    // Marks inherited from a parent, or received, are not its own.
    `${PARENT}/.deleted-200-inherited`,
    `${PARENT}/.deleted-300-received`,
    // A time that is not plain seconds.
    `${PARENT}/.deleted-400-odd`,
    `${v1}@.deleted-1-y`,
  ];
  h.pool.add(hidden[0]!);
  h.pool.add(hidden[1]!, { [MANAGED]: "yes" });
  h.pool.add(hidden[2]!, {
    [MANAGED]: ["yes", `inherited from ${PARENT}`],
    [AT]: ["1", `inherited from ${PARENT}`],
  });
  h.pool.add(hidden[3]!, { [MANAGED]: ["yes", "received"], [AT]: ["1", "received"] });
  h.pool.add(hidden[4]!, { [MANAGED]: "yes", [AT]: "1e3" });
  h.pool.add(hidden[5]!);
  await h.trash.purge();
  pass(h, YEAR);
  await h.trash.purge();
  for (const name of hidden) assert.ok(h.pool.has(name), name);
  assert.deepEqual(h.runner.argvs, [listArgv(), listArgv()]);
  // Once per item, with the commands that undo, hand over or destroy it.
  assert.deepEqual(warnings(h).sort(), [...hidden].sort());
  const legacy = h.logs.find((l) => l.name === `${PARENT}/.deleted-100-legacy`)!;
  assert.equal(legacy.msg, "purge never destroys a set-aside item without marks");
  assert.match(
    String(legacy.hint),
    new RegExp(
      `zfs rename ${PARENT}/\\.deleted-100-legacy <old name>.*` +
        `zfs set ${AT}=<unix seconds> ${PARENT}/\\.deleted-100-legacy.*` +
        `zfs destroy -r ${PARENT}/\\.deleted-100-legacy`,
    ),
  );
  assert.match(
    String(h.logs.find((l) => l.name === `${PARENT}/.deleted-1-x`)!.hint),
    new RegExp(`zfs set ${MANAGED}=yes ${PARENT}/\\.deleted-1-x; zfs set ${AT}=`),
  );
});

Deno.test("Trash.purge takes the deletion time from the marker, never from the name", async () => {
  using h = setup({ retention: 3600 });
  // The name says long ago, the marker says just now.
  const hidden = `${PARENT}/.deleted-1-v1`;
  h.pool.add(hidden, marks(NOW - 10, `${PARENT}/v1`));
  await h.trash.purge();
  assert.deepEqual(h.runner.argvs, [listArgv()]);
  pass(h, 3590);
  await h.trash.purge();
  assert.ok(!h.pool.has(hidden));
});

// ---------------------------------------------------------------------------------------------
// purge: clocks

Deno.test("Trash.purge destroys nothing when the wall clock jumps a year forward", async () => {
  using h = setup({ retention: 3600 });
  const v1 = volume(h.pool, "v1");
  const snap = setAsideSnapshot(h.pool, v1, "s0", NOW - 600);
  const hidden = setAsideVolume(h.pool, "v0", NOW - 600);
  // Seen 600 seconds after their deletion, then the clock jumps, and jumps again.
  await h.trash.purge();
  h.clock.wall += YEAR;
  h.clock.mono += 60;
  await h.trash.purge();
  h.clock.wall += YEAR;
  h.clock.mono += 2939;
  await h.trash.purge();
  assert.ok(h.pool.has(snap) && h.pool.has(hidden));
  assert.deepEqual(h.runner.argvs, [listArgv(), listArgv(), listArgv()]);
  // Their age counts on by the monotonic clock alone: 600 + 3000 seconds is past the hour.
  h.clock.mono += 1;
  await h.trash.purge();
  assert.ok(!h.pool.has(snap) && !h.pool.has(hidden));
});

Deno.test("Trash.purge of a process started with the wall clock a year ahead waits, and a corrected clock saves everything", async () => {
  using h = setup({ retention: 7 * 86400, minObservation: 3600 });
  const hidden = setAsideVolume(h.pool, "v0", NOW);
  h.clock.wall = NOW + YEAR;
  await h.trash.purge();
  // Within the minimum observation nothing goes, however old the wall clock says it is.
  h.clock.mono += 1800;
  h.clock.wall += 1800;
  await h.trash.purge();
  assert.deepEqual(h.runner.argvs, [listArgv(), listArgv()]);
  // NTP corrects the clock: its age is what the corrected clock implies, and stays so.
  h.clock.mono += 600;
  h.clock.wall = NOW + 2400;
  await h.trash.purge();
  h.clock.mono += 86400;
  h.clock.wall += YEAR;
  await h.trash.purge();
  assert.deepEqual(h.runner.argvs, Array.from({ length: 4 }, () => listArgv()));
  assert.ok(h.pool.has(hidden));
  // A week after the deletion by the monotonic clock, it goes.
  h.clock.mono += 7 * 86400 - 86400 - 2400;
  await h.trash.purge();
  assert.ok(!h.pool.has(hidden));
});

Deno.test("Trash.purge with the wall clock wrong all along still waits for the minimum observation", async () => {
  using h = setup({ retention: 7 * 86400, minObservation: 3600 });
  const hidden = setAsideVolume(h.pool, "v0", NOW);
  h.clock.wall = NOW + YEAR;
  await h.trash.purge();
  pass(h, 3599);
  await h.trash.purge();
  assert.ok(h.pool.has(hidden));
  pass(h, 1);
  await h.trash.purge();
  assert.ok(!h.pool.has(hidden));
});

Deno.test("Trash.purge keeps items deleted in the future, with one warning, until the clock passes them", async () => {
  using h = setup({ retention: 0 });
  const hidden = setAsideVolume(h.pool, "v0", NOW + 86400);
  const soon = setAsideVolume(h.pool, "v1", NOW + 30);
  await h.trash.purge();
  await h.trash.purge();
  assert.deepEqual(h.runner.argvs, [listArgv(), listArgv()]);
  assert.deepEqual(warnings(h), [hidden]);
  assert.match(h.logs.find((l) => l.level === "warn")!.msg, /deleted in the future/);
  h.clock.wall = NOW + 86400;
  await h.trash.purge();
  assert.ok(!h.pool.has(hidden) && !h.pool.has(soon));
});

Deno.test("Trash.purge with retention 0 destroys what is marked at once, whatever the minimum observation", async () => {
  using h = setup({ retention: 0, minObservation: 3600 });
  const hidden = setAsideVolume(h.pool, "v0", NOW);
  await h.trash.purge();
  assert.deepEqual(h.runner.argvs, [listArgv(), inspectArgv(hidden), destroy(hidden)]);
});

// ---------------------------------------------------------------------------------------------
// purge: what is in the way

for (
  const [what, add, obstacle] of [
    [
      "a sanoid snapshot",
      (p: FakePool, d: string) => p.add(`${d}@autosnap_2024-01-01_00:00:00_hourly`),
      "@autosnap_2024-01-01_00:00:00_hourly",
    ],
    [
      "a snapshot with a name like a CSI snapshot's",
      (p: FakePool, d: string) => p.add(`${d}@zrepl_20240101_000000_000`),
      "@zrepl_20240101_000000_000",
    ],
    ["a child dataset", (p: FakePool, d: string) => p.add(`${d}/wal`), "/wal"],
    [
      "a hold on its own snapshot",
      (p: FakePool, d: string) => p.add(`${d}@${CLONE}`, { userrefs: "1" }),
      `@${CLONE}`,
    ],
    [
      "a clone outside the parent",
      (p: FakePool, d: string) =>
        p.add(`${d}@${CLONE}`).add("tank/other").add("tank/other/copy", {
          origin: `${d}@${CLONE}`,
        }),
      "tank/other/copy",
    ],
    [
      "a foreign clone below the parent",
      (p: FakePool, d: string) =>
        p.add(`${d}@${CLONE}`).add(`${PARENT}/mine`, { origin: `${d}@${CLONE}` }),
      `${PARENT}/mine`,
    ],
    [
      "an unmarked .deleted-* snapshot",
      (p: FakePool, d: string) => p.add(`${d}@.deleted-1-x`),
      "@.deleted-1-x",
    ],
  ] as const
) {
  Deno.test(`Trash.purge keeps a set-aside dataset holding ${what}, saying why once`, async () => {
    using h = setup({ retention: 3600 });
    const hidden = setAsideVolume(h.pool, "v0", NOW - 7200);
    add(h.pool, hidden);
    const before = h.pool.names();
    await h.trash.purge();
    await h.trash.purge();
    assert.deepEqual(destroys(h), []);
    assert.deepEqual(h.pool.names(), before);
    const kept = purgeLogs(h).filter((l) => l.level === "warn" && l.name === hidden);
    assert.equal(kept.length, 1);
    assert.equal(kept[0]!.msg, "purge keeps a set-aside dataset");
    assert.ok(String(kept[0]!.reason).includes(obstacle), String(kept[0]!.reason));
  });
}

Deno.test("Trash.purge keeps a set-aside snapshot that is held, or that a foreign clone needs", async () => {
  using h = setup({ retention: 3600 });
  const v1 = volume(h.pool, "v1");
  const held = setAsideSnapshot(h.pool, v1, "s0", NOW - 7200);
  h.pool.setValue(held, "userrefs", "1");
  const cloned = setAsideSnapshot(h.pool, v1, "s1", NOW - 7200);
  h.pool.add("tank/other").add("tank/other/copy", { origin: cloned });
  await h.trash.purge();
  assert.deepEqual(destroys(h), []);
  assert.ok(h.pool.has(held) && h.pool.has(cloned));
  // Not even marked for a deferred destroy, which would take it when the hold is released.
  assert.equal(h.pool.value(held, "defer_destroy"), "off");
  assert.deepEqual(warnings(h), [held, cloned]);
});

Deno.test("Trash.purge keeps a set-aside dataset when something appears in it after it was read again", async () => {
  using h = setup({ retention: 3600 });
  const hidden = setAsideVolume(h.pool, "v0", NOW - 7200);
  h.pool.add(`${hidden}@${CLONE}`);
  h.pool.hook = (argv) => {
    // Between the check and the destroy, sanoid takes a snapshot.
    if (argv.join(" ") === destroy(`${hidden}@${CLONE}`).join(" ")) {
      h.pool.add(`${hidden}@autosnap_x`);
    }
    return undefined;
  };
  await h.trash.purge();
  assert.deepEqual(destroys(h), [destroy(`${hidden}@${CLONE}`), destroy(hidden)]);
  assert.ok(h.pool.has(hidden) && h.pool.has(`${hidden}@autosnap_x`));
  assert.deepEqual(purgeLogs(h).map((l) => [l.level, l.name]), [["warn", hidden]]);
});

Deno.test("Trash.purge waits for the plugin's own clones, and marks a cloned snapshot for deferred destroy", async () => {
  using h = setup({ retention: 3600 });
  const hidden = setAsideVolume(h.pool, "v0", NOW - 7200);
  h.pool.add(`${hidden}@${CLONE}`, { defer_destroy: "on" });
  volume(h.pool, "v2", { origin: `${hidden}@${CLONE}` });
  const v1 = volume(h.pool, "v1");
  const snap = setAsideSnapshot(h.pool, v1, "s0", NOW - 7200);
  volume(h.pool, "v3", { origin: snap });
  await h.trash.purge();
  assert.deepEqual(h.runner.argvs, [
    listArgv(),
    inspectArgv(hidden),
    // Its snapshot has a clone: whose it is, is read from the parent's children.
    zfs.tree(PARENT, 1, "type,origin,org.zfs-csi:managed"),
    snapshotArgv(snap),
    destroyDeferred(snap),
  ]);
  assert.ok(h.pool.has(hidden));
  assert.equal(h.pool.value(snap, "defer_destroy"), "on");
  assert.deepEqual(warnings(h), []);
});

Deno.test("Trash.purge destroys hidden clone snapshots of the exact form only, after one hour", async () => {
  using h = setup({ retention: 7 * 86400 });
  const v1 = volume(h.pool, "v1");
  const due = `${v1}@.clone-0123456789abcdef-1`;
  const fresh = `${v1}@.clone-fedcba9876543210-2`;
  h.pool.add(due, { creation: String(NOW - 3600) });
  h.pool.add(fresh, { creation: String(NOW - 3599) });
  // Not the form CreateVolume makes: not ours to destroy.
  h.pool.add(`${v1}@.clone-00000000000000aa`, { creation: "100" });
  // Marked already: ZFS destroys it with its last clone.
  h.pool.add(`${v1}@.clone-00000000000000bb-3`, { creation: "100", defer_destroy: "on" });
  await h.trash.purge();
  assert.deepEqual(destroys(h), [destroy(due)]);
  assert.ok(!h.pool.has(due) && h.pool.has(fresh));
  assert.ok(h.pool.has(`${v1}@.clone-00000000000000aa`));
});

Deno.test("Trash.purge on zfs-fuse, which has no clones property, finds out once and reads origins", async () => {
  using h = setup({ retention: 3600 });
  h.pool.clonesProperty = false;
  const hidden = setAsideVolume(h.pool, "v0", NOW - 7200);
  h.pool.add(`${hidden}@${CLONE}`);
  h.pool.add(`${PARENT}/mine`, { origin: `${hidden}@${CLONE}` });
  await h.trash.purge();
  await h.trash.purge();
  const once = [
    zfs.tree(PARENT, 2, PURGE),
    // The set-aside dataset, and the clone snapshot in it (an hour old): both have a clone.
    zfs.tree(hidden, 1, SUBTREE),
    zfs.tree(PARENT, 1, "type,origin,org.zfs-csi:managed"),
    zfs.get(SUBTREE, `${hidden}@${CLONE}`),
  ];
  assert.deepEqual(h.runner.argvs, [listArgv(), zfs.get("clones", PARENT), ...once, ...once]);
  assert.ok(h.pool.has(hidden) && h.pool.has(`${hidden}@${CLONE}`));
  assert.deepEqual(warnings(h), [hidden, `${hidden}@${CLONE}`]);
});

Deno.test("Trash.purge leaves alone what changed between the listing and the second read", async () => {
  using h = setup({ retention: 3600 });
  const hidden = setAsideVolume(h.pool, "v0", NOW - 7200);
  h.pool.hook = (argv) => {
    // Undone and deleted again meanwhile: marked anew, with a new time.
    if (argv.join(" ") === inspectArgv(hidden).join(" ")) h.pool.setValue(hidden, AT, String(NOW));
    return undefined;
  };
  await h.trash.purge();
  assert.deepEqual(destroys(h), []);
  assert.ok(h.pool.has(hidden));
});

Deno.test("Trash.purge logs other failures as warnings and never throws", async () => {
  using h = setup();
  const hidden = setAsideVolume(h.pool, "v0", NOW - 7200);
  h.pool.hook = (argv) =>
    argv[1] === "destroy" ? fails(`cannot destroy '${hidden}': permission denied\n`) : undefined;
  await h.trash.purge();
  assert.deepEqual(purgeLogs(h).map((l) => [l.level, l.name]), [["warn", hidden]]);
});

Deno.test("Trash.purge of a missing parent or a failing zfs get does nothing and never throws", async () => {
  {
    using h = setup({ parent: "tank/gone" });
    h.pool.objects.delete("tank/gone");
    await h.trash.purge();
    assert.equal(h.runner.calls.length, 1);
    assert.deepEqual(purgeLogs(h), []);
  }
  {
    using h = setup();
    h.pool.hook = () => ({ timedOut: true, code: -1 });
    await h.trash.purge();
    assert.equal(h.runner.calls.length, 1);
    assert.deepEqual(purgeLogs(h).map((l) => [l.level, l.msg]), [
      ["warn", "purge could not list the parent dataset"],
    ]);
  }
});

Deno.test("Trash.purge skips what a running operation holds the lock of", async () => {
  using h = setup();
  const v1 = volume(h.pool, "v1");
  const snap = setAsideSnapshot(h.pool, v1, "s1", NOW - 7200);
  const hidden = setAsideVolume(h.pool, "v0", NOW - 7200);
  // A clone of v1 holds v1's lock; a delete holds the lock of the name it set aside.
  const source = h.locks.tryAcquire([v1])!;
  const aside = h.locks.tryAcquire([hidden])!;
  await h.trash.purge();
  assert.deepEqual(h.runner.argvs, [listArgv()]);
  assert.ok(h.locks.isHeld(v1) && h.locks.isHeld(hidden));
  // Released: the next purge destroys them.
  source.release();
  aside.release();
  await h.trash.purge();
  assert.ok(!h.pool.has(snap) && !h.pool.has(hidden));
});

Deno.test("Trash.purge called while a purge runs shares that run", async () => {
  const held = gate();
  using h = setup();
  let calls = 0;
  h.pool.hook = async () => {
    calls++;
    await held.promise;
    return undefined;
  };
  const first = h.trash.purge();
  const second = h.trash.purge();
  assert.equal(second, first);
  held.open();
  await Promise.all([first, second]);
  assert.equal(calls, 1);
  // Finished: the next call starts a new run.
  await h.trash.purge();
  assert.equal(calls, 2);
});

Deno.test("Trash.startPeriodic purges at once, once however often it is started, until stopped", async () => {
  using h = setup();
  h.trash.startPeriodic(3_600_000);
  h.trash.startPeriodic(3_600_000);
  // The run started by startPeriodic is still in flight: purge() joins it.
  await h.trash.purge();
  assert.equal(h.runner.calls.length, 1);
  h.trash.stop();
});

// ---------------------------------------------------------------------------------------------
// inspect

Deno.test("Trash.inspect reads the subtree once, and the parent's children only when clones may matter", async () => {
  using h = setup();
  const v1 = volume(h.pool, "v1");
  assert.deepEqual((await inspected(h, v1)).check.obstacles, []);
  h.pool.add(`${v1}@autosnap_2024-01-01_00:00:00_hourly`);
  assert.deepEqual((await inspected(h, v1)).check.obstacles, [
    { kind: "snapshot", name: `${v1}@autosnap_2024-01-01_00:00:00_hourly` },
  ]);
  assert.equal(await h.trash.inspect(`${PARENT}/v9`), undefined);
  assert.deepEqual(h.runner.argvs, [
    inspectArgv(v1),
    inspectArgv(v1),
    inspectArgv(`${PARENT}/v9`),
  ]);
});

// ---------------------------------------------------------------------------------------------
// removeVolume

Deno.test("Trash.removeVolume with a retention unmounts, renames aside and marks it", async () => {
  using h = setup({ retention: 3600 });
  const v1 = volume(h.pool, "v1");
  const hidden = `${PARENT}/.deleted-${NOW}-v1`;
  await h.trash.removeVolume(v1, await inspected(h, v1));
  assert.deepEqual(h.runner.argvs.slice(1), [
    ["zfs", "unmount", v1],
    ["zfs", "rename", v1, hidden],
    volumeMarks(hidden, v1),
  ]);
  for (const [prop, value] of [[MANAGED, "yes"], [NAME, v1], [AT, String(NOW)]] as const) {
    assert.deepEqual(h.pool.objects.get(hidden)!.get(prop), { value, source: "local" }, prop);
  }
  assert.ok(h.logs.some((l) => l.msg === "volume set aside" && l.deletedAs === hidden));
});

Deno.test("Trash.removeVolume sets the marker locally on a volume that received it", async () => {
  using h = setup();
  const v1 = volume(h.pool, "v1", { [MANAGED]: ["yes", "received"] });
  const hidden = `${PARENT}/.deleted-${NOW}-v1`;
  await h.trash.removeVolume(v1, await inspected(h, v1));
  assert.deepEqual(h.runner.argvs.slice(3), [
    set(hidden, [MANAGED, "yes"], [NAME, v1], [AT, NOW], ["canmount", "noauto"]),
  ]);
  assert.equal(h.pool.objects.get(hidden)!.get(MANAGED)!.source, "local");
});

Deno.test("Trash.removeVolume then purge: a volume set aside goes after the retention by the monotonic clock", async () => {
  using h = setup({ retention: 3600, minObservation: 3600 });
  const v1 = volume(h.pool, "v1");
  await h.trash.removeVolume(v1, await inspected(h, v1));
  const hidden = `${PARENT}/.deleted-${NOW}-v1`;
  h.clock.wall += YEAR;
  h.clock.mono += 3599;
  await h.trash.purge();
  assert.ok(h.pool.has(hidden));
  h.clock.mono += 1;
  await h.trash.purge();
  assert.ok(!h.pool.has(hidden));
});

Deno.test("Trash.removeVolume with retention 0 destroys its own snapshots one by one, then the dataset without -r", async () => {
  using h = setup({ retention: 0 });
  const v1 = volume(h.pool, "v1");
  h.pool.add(`${v1}@${CLONE}`);
  const snap = setAsideSnapshot(h.pool, v1, "s0", NOW - 10);
  await h.trash.removeVolume(v1, await inspected(h, v1));
  assert.deepEqual(h.runner.argvs.slice(1), [
    ["zfs", "unmount", v1],
    destroy(`${v1}@${CLONE}`),
    destroy(snap),
    destroy(v1),
  ]);
  assert.deepEqual(h.pool.names(), [PARENT]);
});

Deno.test("Trash.removeVolume with retention 0 sets aside at once a volume the plugin's clones need", async () => {
  using h = setup({ retention: 0 });
  const v1 = volume(h.pool, "v1");
  h.pool.add(`${v1}@${CLONE}`, { defer_destroy: "on" });
  volume(h.pool, "v2", { origin: `${v1}@${CLONE}` });
  const hidden = `${PARENT}/.deleted-${NOW}-v1`;
  const found = await inspected(h, v1);
  const mark = h.runner.calls.length;
  await h.trash.removeVolume(v1, found);
  assert.deepEqual(h.runner.argvs.slice(mark), [
    ["zfs", "unmount", v1],
    ["zfs", "rename", v1, hidden],
    volumeMarks(hidden, v1),
  ]);
  assert.equal(h.pool.value(`${PARENT}/v2`, "origin"), `${hidden}@${CLONE}`);
});

Deno.test("Trash.removeVolume with retention 0 refuses, naming it, a snapshot that appeared after the check", async () => {
  using h = setup({ retention: 0 });
  const v1 = volume(h.pool, "v1");
  const found = await inspected(h, v1);
  h.pool.hook = (argv) => {
    if (argv[1] === "unmount") h.pool.add(`${v1}@autosnap_2024-01-01_00:00:00_hourly`);
    return undefined;
  };
  await assertRejectsCsi(
    h.trash.removeVolume(v1, found),
    Code.FAILED_PRECONDITION,
    /^Volume dataset "tank\/nomad\/v1" is not deleted: .*snapshot "tank\/nomad\/v1@autosnap_2024-01-01_00:00:00_hourly", not made by zfs-csi/,
  );
  assert.ok(h.pool.has(v1) && h.pool.has(`${v1}@autosnap_2024-01-01_00:00:00_hourly`));
  assert.deepEqual(destroys(h), [destroy(v1)]);
});

Deno.test("Trash.removeVolume with retention 0 succeeds when the dataset is gone, and throws other failures", async () => {
  {
    using h = setup({ retention: 0 });
    const v1 = volume(h.pool, "v1");
    const found = await inspected(h, v1);
    h.pool.hook = (argv) => {
      if (argv[1] !== "destroy") return undefined;
      // Someone else destroyed it meanwhile.
      h.pool.objects.delete(v1);
      return fails(`cannot open '${v1}': dataset does not exist\n`);
    };
    await h.trash.removeVolume(v1, found);
  }
  {
    using h = setup({ retention: 0 });
    const v1 = volume(h.pool, "v1");
    const found = await inspected(h, v1);
    h.pool.hook = (argv) =>
      argv[1] === "destroy" ? fails(`cannot destroy '${v1}': permission denied\n`) : undefined;
    await assertRejectsZfs(h.trash.removeVolume(v1, found), "permission");
    assert.ok(h.pool.has(v1));
  }
});

Deno.test("Trash.removeVolume refuses a check that found something in the way, before any change", async () => {
  using h = setup({ retention: 0 });
  const v1 = volume(h.pool, "v1");
  h.pool.add(`${v1}/wal`);
  const found = await inspected(h, v1);
  const mark = h.runner.calls.length;
  await assertRejectsCsi(
    h.trash.removeVolume(v1, found),
    Code.FAILED_PRECONDITION,
    /child dataset "tank\/nomad\/v1\/wal"/,
  );
  assert.equal(h.runner.calls.length, mark);
});

Deno.test("Trash.removeVolume with retention 0 retries a destroy that finds the volume busy, then sets it aside", async () => {
  for (const [busyTimes, setAside] of [[2, false], [Infinity, true]] as const) {
    using h = setup({ retention: 0 });
    const v1 = volume(h.pool, "v1");
    let busy = busyTimes;
    h.pool.hook = (argv) =>
      argv.join(" ") === destroy(v1).join(" ") && busy-- > 0
        ? fails(`cannot destroy '${v1}': dataset is busy\n`)
        : undefined;
    await h.trash.removeVolume(v1, await inspected(h, v1));
    assert.equal(destroys(h).length, setAside ? 5 : 3);
    assert.equal(h.pool.has(`${PARENT}/.deleted-${NOW}-v1`), setAside);
    assert.ok(!h.pool.has(v1));
  }
});

Deno.test("Trash.removeVolume stops before any change when the unmount finds the volume busy", async () => {
  using h = setup({ retention: 0 });
  const v1 = volume(h.pool, "v1");
  const found = await inspected(h, v1);
  h.pool.hook = (argv) =>
    argv[1] === "unmount"
      ? fails(`cannot unmount '/mnt/${v1}': pool or dataset is busy\n`)
      : undefined;
  await assertRejectsZfs(h.trash.removeVolume(v1, found), "busy");
  assert.deepEqual(h.runner.argvs.slice(1), [["zfs", "unmount", v1]]);
  assert.ok(h.pool.has(v1));
});

Deno.test("Trash.removeVolume of a long name cuts the hidden name and records the full one, which undoes it", async () => {
  using h = setup();
  const component = "a".repeat(244);
  const v1 = volume(h.pool, component);
  assert.equal(v1.length, 255);
  await h.trash.removeVolume(v1, await inspected(h, v1));
  const hidden = `${PARENT}/.deleted-${NOW}-${component}`.slice(0, 255);
  assert.ok(h.pool.has(hidden) && !h.pool.has(v1));
  // The undo of docs/deleting.md: rename to the recorded name.
  const recorded = h.pool.value(hidden, NAME)!;
  assert.equal(recorded, v1);
  await fakeTools(h.runner).zfs.rename(hidden, recorded);
  assert.ok(h.pool.has(v1));
});

Deno.test("Trash.removeVolume takes the next second's name when the same name was deleted this second", async () => {
  using h = setup();
  const v1 = volume(h.pool, "v1");
  h.pool.add(`${PARENT}/.deleted-${NOW}-v1`);
  await h.trash.removeVolume(v1, await inspected(h, v1));
  const hidden = `${PARENT}/.deleted-${NOW + 1}-v1`;
  assert.ok(h.pool.has(hidden));
  // The time recorded is the deletion's, whatever the name says.
  assert.equal(h.pool.value(hidden, AT), String(NOW));
});

Deno.test("Trash.removeVolume retries a rename that finds the dataset busy right after the unmount", async () => {
  using h = setup();
  const v1 = volume(h.pool, "v1");
  let busy = 1;
  h.pool.hook = (argv) =>
    argv[1] === "rename" && busy-- > 0
      ? fails(`cannot rename '${v1}': dataset is busy\n`)
      : undefined;
  await h.trash.removeVolume(v1, await inspected(h, v1));
  assert.ok(h.pool.has(`${PARENT}/.deleted-${NOW + 1}-v1`));
});

Deno.test("Trash.removeVolume checks and retries a rename that failed without a word", async () => {
  using h = setup();
  const v1 = volume(h.pool, "v1");
  const first = `${PARENT}/.deleted-${NOW}-v1`;
  const second = `${PARENT}/.deleted-${NOW + 1}-v1`;
  let renames = 0;
  h.pool.hook = (argv) => {
    if (argv[1] !== "rename") return undefined;
    // The first fails and did nothing; the second fails but did rename.
    if (++renames === 2) {
      h.pool.objects.set(second, h.pool.objects.get(v1)!);
      h.pool.objects.delete(v1);
    }
    return fails("");
  };
  await h.trash.removeVolume(v1, await inspected(h, v1));
  assert.deepEqual(h.runner.argvs.slice(2, 6), [
    ["zfs", "rename", v1, first],
    zfs.get("type", first),
    ["zfs", "rename", v1, second],
    zfs.get("type", second),
  ]);
  assert.equal(h.pool.value(second, AT), String(NOW));
});

Deno.test("Trash.removeVolume logs, with the commands, marks it could not set", async () => {
  using h = setup();
  const v1 = volume(h.pool, "v1");
  h.pool.hook = (argv) =>
    argv[1] === "set" ? fails("cannot set property for 'x': permission denied\n") : undefined;
  await h.trash.removeVolume(v1, await inspected(h, v1));
  const hidden = `${PARENT}/.deleted-${NOW}-v1`;
  const line = h.logs.find((l) => l.level === "error")!;
  assert.equal(line.msg, "set aside but not marked: the purge will not destroy it");
  assert.equal(
    line.hint,
    `zfs set ${NAME}=${v1} ${hidden}; zfs set ${AT}=${NOW} ${hidden}; ` +
      `zfs set canmount=noauto ${hidden}`,
  );
});

// ---------------------------------------------------------------------------------------------
// removeSnapshot

Deno.test("Trash.removeSnapshot with a retention renames the snapshot aside and marks it", async () => {
  using h = setup({ retention: 3600 });
  const v1 = volume(h.pool, "v1");
  h.pool.add(`${v1}@s1`);
  const hidden = `${v1}@.deleted-${NOW}-s1`;
  await h.trash.removeSnapshot(`${v1}@s1`);
  assert.deepEqual(h.runner.argvs, [
    ["zfs", "rename", `${v1}@s1`, hidden],
    set(hidden, [MANAGED, "yes"], [NAME, `${v1}@s1`], [AT, NOW]),
  ]);
});

Deno.test("Trash.removeSnapshot with retention 0 destroys, or sets aside, marks and defers when clones need it", async () => {
  {
    using h = setup({ retention: 0 });
    const v1 = volume(h.pool, "v1");
    h.pool.add(`${v1}@s1`);
    await h.trash.removeSnapshot(`${v1}@s1`);
    assert.deepEqual(h.runner.argvs, [destroy(`${v1}@s1`)]);
  }
  {
    using h = setup({ retention: 0 });
    const v1 = volume(h.pool, "v1");
    h.pool.add(`${v1}@s1`);
    volume(h.pool, "v2", { origin: `${v1}@s1` });
    const hidden = `${v1}@.deleted-${NOW}-s1`;
    await h.trash.removeSnapshot(`${v1}@s1`);
    assert.deepEqual(h.runner.argvs, [
      destroy(`${v1}@s1`),
      ["zfs", "rename", `${v1}@s1`, hidden],
      set(hidden, [MANAGED, "yes"], [NAME, `${v1}@s1`], [AT, NOW]),
      destroyDeferred(hidden),
    ]);
    assert.equal(h.pool.value(hidden, "defer_destroy"), "on");
  }
});

Deno.test("Trash.removeSnapshot throws other failures", async () => {
  using h = setup({ retention: 0 });
  const v1 = volume(h.pool, "v1");
  h.pool.add(`${v1}@s1`, { userrefs: "1" });
  await assertRejectsZfs(h.trash.removeSnapshot(`${v1}@s1`), "busy");
  assert.equal(h.runner.calls.length, 1);
});
