import assert from "node:assert/strict";
import { KeyedLock } from "../lock.ts";
import { Logger } from "../log.ts";
import { assertRejectsZfs } from "../../tests/support/assert_errors.ts";
import { fails, FakeRunner, fakeTools, gate } from "../../tests/support/fake_runner.ts";
import { zfsArgv } from "../../tests/support/zfs_argv.ts";
import { Trash } from "./trash.ts";

const PARENT = "tank/nomad";
const NOW = 10_000;

/** What purge lists: the parent's children and their snapshots, with type and creation. */
const listArgv = (parent = PARENT) => zfsArgv("zfs").tree(parent, 2, "type,creation,defer_destroy");
/** `zfs destroy -d` of a snapshot, and `zfs destroy -r` of a dataset. */
const destroyDeferred = (snapshot: string) => ["zfs", "destroy", "-d", snapshot];
const destroyRecursive = (dataset: string) => ["zfs", "destroy", "-r", dataset];

/**
 * `zfs get -Hp -r -d 2 ... type,creation,defer_destroy` output for [name, type, creation,
 * deferred?] rows; defer_destroy is "off" for snapshots unless given, "-" for filesystems.
 */
function tree(
  rows: readonly (readonly [string, string, number | string, boolean?])[],
): string {
  return rows.map(([name, type, creation, deferred]) => {
    const defer = type === "snapshot" ? (deferred ? "on" : "off") : "-";
    return `${name}\ttype\t${type}\t-\n${name}\tcreation\t${creation}\t-\n` +
      `${name}\tdefer_destroy\t${defer}\t-\n`;
  }).join("");
}

function fixture(name: string): Promise<string> {
  return Deno.readTextFile(new URL(`../../tests/fixtures/${name}`, import.meta.url));
}

interface Harness extends Disposable {
  readonly runner: FakeRunner;
  readonly trash: Trash;
  readonly locks: KeyedLock;
  readonly logs: { level: string; msg: string; name?: string; [key: string]: unknown }[];
}

function setup(opts: { retention?: number; now?: () => number; parent?: string } = {}): Harness {
  const runner = new FakeRunner();
  const logs: Harness["logs"] = [];
  const log = new Logger("debug", {}, (line) => logs.push(JSON.parse(line)));
  const { zfs } = fakeTools(runner, log);
  const locks = new KeyedLock();
  const trash = new Trash({
    zfs,
    parentDataset: opts.parent ?? PARENT,
    retentionSeconds: opts.retention ?? 3600,
    locks,
    log,
    now: opts.now ?? (() => NOW),
  });
  return {
    runner,
    trash,
    locks,
    logs,
    [Symbol.dispose]: () => {
      trash.stop();
      // Even a command whose failure the trash swallowed must have been scripted.
      runner.assertNoUnexpected();
    },
  };
}

/** Answers every `zfs destroy` of exactly `argv` with success. */
function allowDestroys(runner: FakeRunner, argvs: readonly (readonly string[])[]): void {
  for (const argv of argvs) runner.onExact(argv, {});
}

const purgeLogs = (h: Harness) => h.logs.filter((l) => l.msg.startsWith("purge "));

/** Scripts the listing purge reads below the parent: `tree` rows, the parent's first. */
function listing(h: Harness, rows: Parameters<typeof tree>[0]): void {
  h.runner.onExact(listArgv(), { stdout: tree([["tank/nomad", "filesystem", 1000], ...rows]) });
}

/** Purges, allowing `destroys`, and asserts that it listed once and destroyed those in order. */
async function assertPurgeDestroys(
  h: Harness,
  destroys: readonly string[][],
  parent = PARENT,
  label = `purge of ${parent}`,
): Promise<void> {
  allowDestroys(h.runner, destroys);
  await h.trash.purge();
  assert.deepEqual(h.runner.argvs, [listArgv(parent), ...destroys], label);
}

// ---------------------------------------------------------------------------------------------
// purge

Deno.test("Trash.purge leaves snapshots already marked for deferred destroy alone", async () => {
  using h = setup({ retention: 3600, now: () => NOW });
  listing(h, [
    ["tank/nomad/v1", "filesystem", 1000],
    ["tank/nomad/v1@.deleted-100-s0", "snapshot", 1000, true],
    ["tank/nomad/v1@.clone-0123456789abcdef-100", "snapshot", 100, true],
    ["tank/nomad/v1@.deleted-100-s1", "snapshot", 1000],
  ]);
  await assertPurgeDestroys(h, [destroyDeferred("tank/nomad/v1@.deleted-100-s1")]);
});

Deno.test("Trash.purge destroys what was set aside longer ago than the retention and keeps younger", async () => {
  using h = setup({ retention: 3600, now: () => NOW });
  listing(h, [
    ["tank/nomad/v1", "filesystem", 1000],
    ["tank/nomad/v1@s1", "snapshot", 1000],
    ["tank/nomad/v1@.deleted-6400-s0", "snapshot", 1000],
    ["tank/nomad/v1@.deleted-6401-s2", "snapshot", 1000],
    ["tank/nomad/.deleted-5000-old", "filesystem", 1000],
    ["tank/nomad/.deleted-5000-old@s1", "snapshot", 1000],
    ["tank/nomad/.deleted-9000-young", "filesystem", 1000],
    // Not below the parent directly: not ours to purge.
    ["tank/nomad/v1/.deleted-1-sub", "filesystem", 1000],
    // A volume named ".deleted-1-x" is encoded and never taken for a deleted one.
    ["tank/nomad/:2edeleted-1-x", "filesystem", 1000],
    ["tank/nomad/:2edeleted-1-x@:2edeleted-1-y", "snapshot", 1000],
  ]);
  await assertPurgeDestroys(h, [
    destroyDeferred("tank/nomad/v1@.deleted-6400-s0"),
    destroyRecursive("tank/nomad/.deleted-5000-old"),
  ]);
  assert.deepEqual(
    h.logs.filter((l) => l.msg === "purged").map((l) => l.name),
    ["tank/nomad/v1@.deleted-6400-s0", "tank/nomad/.deleted-5000-old"],
  );
  assert.equal(h.locks.isHeld("tank/nomad/v1"), false);
  assert.equal(h.locks.isHeld("tank/nomad/.deleted-5000-old"), false);
});

Deno.test("Trash.purge destroys hidden clone snapshots only when older than one hour", async () => {
  using h = setup({ retention: 7 * 86400, now: () => NOW });
  listing(h, [
    ["tank/nomad/v1", "filesystem", 1000],
    ["tank/nomad/v1@.clone-0123456789abcdef-6400", "snapshot", 6400],
    ["tank/nomad/v1@.clone-fedcba9876543210-6401", "snapshot", 6401],
    ["tank/nomad/v1@.clone-00000000000000aa", "snapshot", 100],
    ["tank/nomad/v1@.clone-00000000000000bb", "snapshot", "-"],
    // Only snapshots are clone leftovers.
    ["tank/nomad/.clone-0123456789abcdef", "filesystem", 100],
  ]);
  await assertPurgeDestroys(h, [
    destroyDeferred("tank/nomad/v1@.clone-0123456789abcdef-6400"),
    destroyDeferred("tank/nomad/v1@.clone-00000000000000aa"),
  ]);
});

Deno.test("Trash.purge reads a real zfs get -r listing", async () => {
  const listing = (await fixture("zfs_get_tree.txt")).split("\n")
    .filter((l) => ["type", "creation"].includes(l.split("\t")[1] ?? "")).join("\n") + "\n";
  const created = 1795393178;
  for (const [now, clone] of [[created + 3599, false], [created + 3600, true]] as const) {
    using h = setup({ parent: "tpool/nomad", retention: 7 * 86400, now: () => now });
    h.runner.onExact(listArgv("tpool/nomad"), { stdout: listing });
    const expected = [
      destroyRecursive("tpool/nomad/.deleted-1700000000-old"),
      ...(clone ? [destroyDeferred("tpool/nomad/pg@.clone-0123456789abcdef")] : []),
      destroyDeferred("tpool/nomad/pg@.deleted-1700000000-old"),
    ];
    await assertPurgeDestroys(h, expected, "tpool/nomad", `now ${now}`);
  }
});

Deno.test("Trash.purge with retention 0 destroys what was set aside at once", async () => {
  using h = setup({ retention: 0, now: () => NOW });
  listing(h, [[`tank/nomad/.deleted-${NOW}-v1`, "filesystem", NOW]]);
  allowDestroys(h.runner, [destroyRecursive(`tank/nomad/.deleted-${NOW}-v1`)]);
  await h.trash.purge();
  assert.equal(h.runner.calls.length, 2);
});

Deno.test("Trash.purge keeps what clones still need, without throwing, and goes on", async () => {
  const stderr = (await fixture("stderr_destroy_filesystem_dependent_clones.txt"))
    .replaceAll("tpool/nomad/pg", "tank/nomad/.deleted-100-pg");
  using h = setup();
  listing(h, [
    ["tank/nomad/.deleted-100-pg", "filesystem", 1000],
    ["tank/nomad/.deleted-100-pg@.clone-0123456789abcdef-99", "snapshot", 99],
    ["tank/nomad/.deleted-200-other", "filesystem", 1000],
  ]);
  h.runner.onExact(destroyRecursive("tank/nomad/.deleted-100-pg"), { code: 1, stderr });
  allowDestroys(h.runner, [
    destroyDeferred("tank/nomad/.deleted-100-pg@.clone-0123456789abcdef-99"),
    destroyRecursive("tank/nomad/.deleted-200-other"),
  ]);
  await h.trash.purge();
  assert.deepEqual(h.runner.argvs.slice(1), [
    destroyRecursive("tank/nomad/.deleted-100-pg"),
    destroyDeferred("tank/nomad/.deleted-100-pg@.clone-0123456789abcdef-99"),
    destroyRecursive("tank/nomad/.deleted-200-other"),
  ]);
  const kept = purgeLogs(h);
  assert.equal(kept.length, 1);
  assert.equal(kept[0]!.level, "debug");
  assert.equal(kept[0]!.name, "tank/nomad/.deleted-100-pg");
  assert.equal(h.locks.isHeld("tank/nomad/.deleted-100-pg"), false);
});

Deno.test("Trash.purge logs other failures as warnings and never throws", async () => {
  using h = setup();
  listing(h, [["tank/nomad/.deleted-100-a", "filesystem", 1000]]);
  h.runner.onExact(
    destroyRecursive("tank/nomad/.deleted-100-a"),
    fails("cannot destroy 'tank/nomad/.deleted-100-a': permission denied\n"),
  );
  await h.trash.purge();
  assert.deepEqual(purgeLogs(h).map((l) => [l.level, l.name]), [
    ["warn", "tank/nomad/.deleted-100-a"],
  ]);
});

Deno.test("Trash.purge of a missing parent or a failing zfs get does nothing and never throws", async () => {
  {
    using h = setup();
    h.runner.onExact(listArgv(), fails("cannot open 'tank/nomad': dataset does not exist\n"));
    await h.trash.purge();
    assert.equal(h.runner.calls.length, 1);
    assert.deepEqual(purgeLogs(h), []);
  }
  {
    using h = setup();
    h.runner.onExact(listArgv(), { timedOut: true, code: -1 });
    await h.trash.purge();
    assert.equal(h.runner.calls.length, 1);
    assert.deepEqual(purgeLogs(h).map((l) => [l.level, l.msg]), [
      ["warn", "purge could not list the parent dataset"],
    ]);
  }
});

Deno.test("Trash.purge skips what a running operation holds the lock of", async () => {
  using h = setup();
  listing(h, [
    ["tank/nomad/v1", "filesystem", 1000],
    ["tank/nomad/v1@.clone-0123456789abcdef-100", "snapshot", 100],
    ["tank/nomad/v1@.deleted-100-s1", "snapshot", 100],
    ["tank/nomad/.deleted-100-v0", "filesystem", 1000],
  ]);
  // A clone of v1 holds v1's lock; a delete holds the lock of the name it set aside.
  const source = h.locks.tryAcquire(["tank/nomad/v1"])!;
  const hidden = h.locks.tryAcquire(["tank/nomad/.deleted-100-v0"])!;
  await h.trash.purge();
  assert.deepEqual(h.runner.argvs, [listArgv()]);
  assert.ok(h.locks.isHeld("tank/nomad/v1") && h.locks.isHeld("tank/nomad/.deleted-100-v0"));
  // Released: the next purge destroys them.
  source.release();
  hidden.release();
  const destroys = [
    destroyDeferred("tank/nomad/v1@.clone-0123456789abcdef-100"),
    destroyDeferred("tank/nomad/v1@.deleted-100-s1"),
    destroyRecursive("tank/nomad/.deleted-100-v0"),
  ];
  allowDestroys(h.runner, destroys);
  await h.trash.purge();
  assert.deepEqual(h.runner.argvs, [listArgv(), listArgv(), ...destroys]);
});

Deno.test("Trash.purge called while a purge runs shares that run", async () => {
  const held = gate();
  using h = setup();
  h.runner.onExact(listArgv(), async () => {
    await held.promise;
    return { stdout: tree([["tank/nomad", "filesystem", 1000]]) };
  });
  const first = h.trash.purge();
  const second = h.trash.purge();
  assert.equal(second, first);
  held.open();
  await Promise.all([first, second]);
  assert.equal(h.runner.calls.length, 1);
  // Finished: the next call starts a new run.
  await h.trash.purge();
  assert.equal(h.runner.calls.length, 2);
});

Deno.test("Trash.startPeriodic purges at once, once however often it is started, until stopped", async () => {
  using h = setup();
  listing(h, []);
  h.trash.startPeriodic(3_600_000);
  h.trash.startPeriodic(3_600_000);
  // The run started by startPeriodic is still in flight: purge() joins it.
  await h.trash.purge();
  assert.equal(h.runner.calls.length, 1);
  h.trash.stop();
});

// ---------------------------------------------------------------------------------------------
// removeVolume

Deno.test("Trash.removeVolume with a retention unmounts, renames aside and sets canmount=noauto", async () => {
  using h = setup({ retention: 3600 });
  const hidden = `tank/nomad/.deleted-${NOW}-v1`;
  h.runner
    .onExact(["zfs", "unmount", "tank/nomad/v1"], {})
    .onExact(["zfs", "rename", "tank/nomad/v1", hidden], {})
    .onExact(["zfs", "set", "canmount=noauto", hidden], {});
  await h.trash.removeVolume("tank/nomad/v1");
  assert.deepEqual(h.runner.argvs, [
    ["zfs", "unmount", "tank/nomad/v1"],
    ["zfs", "rename", "tank/nomad/v1", hidden],
    ["zfs", "set", "canmount=noauto", hidden],
  ]);
});

Deno.test("Trash.removeVolume takes the next second's name when the same name was deleted this second", async () => {
  using h = setup();
  h.runner
    .onExact(["zfs", "unmount", "tank/nomad/v1"], {})
    .onExact(
      ["zfs", "rename", "tank/nomad/v1", `tank/nomad/.deleted-${NOW}-v1`],
      fails(`cannot rename to 'tank/nomad/.deleted-${NOW}-v1': dataset already exists\n`),
    )
    .onExact(["zfs", "rename", "tank/nomad/v1", `tank/nomad/.deleted-${NOW + 1}-v1`], {})
    .onExact(["zfs", "set", "canmount=noauto", `tank/nomad/.deleted-${NOW + 1}-v1`], {});
  await h.trash.removeVolume("tank/nomad/v1");
  assert.deepEqual(h.runner.argvs.map((a) => a.at(-1)), [
    "tank/nomad/v1",
    `tank/nomad/.deleted-${NOW}-v1`,
    `tank/nomad/.deleted-${NOW + 1}-v1`,
    `tank/nomad/.deleted-${NOW + 1}-v1`,
  ]);
});

Deno.test("Trash.removeVolume retries a rename that finds the dataset busy right after the unmount", async () => {
  using h = setup();
  const hidden = `tank/nomad/.deleted-${NOW + 1}-v1`;
  h.runner
    .onExact(["zfs", "unmount", "tank/nomad/v1"], {})
    .onExact(
      ["zfs", "rename", "tank/nomad/v1", `tank/nomad/.deleted-${NOW}-v1`],
      fails("cannot rename 'tank/nomad/v1': dataset is busy\n"),
    )
    .onExact(["zfs", "rename", "tank/nomad/v1", hidden], {})
    .onExact(["zfs", "set", "canmount=noauto", hidden], {});
  await h.trash.removeVolume("tank/nomad/v1");
  assert.equal(h.runner.calls.length, 4);
});

Deno.test("Trash.removeVolume checks and retries a rename that failed without a word", async () => {
  using h = setup();
  const first = `tank/nomad/.deleted-${NOW}-v1`;
  const second = `tank/nomad/.deleted-${NOW + 1}-v1`;
  h.runner
    .onExact(["zfs", "unmount", "tank/nomad/v1"], {})
    .onExact(["zfs", "rename", "tank/nomad/v1", first], fails(""))
    .onExact(
      zfsArgv("zfs").get("type", first),
      fails(
        `cannot open '${first}': dataset does not exist\n`,
      ),
    )
    .onExact(["zfs", "rename", "tank/nomad/v1", second], fails(""))
    // The second rename did happen, whatever zfs said.
    .onExact(zfsArgv("zfs").get("type", second), {
      stdout: `${second}\ttype\tfilesystem\t-\n`,
    })
    .onExact(["zfs", "set", "canmount=noauto", second], {});
  await h.trash.removeVolume("tank/nomad/v1");
  assert.deepEqual(h.runner.argvs.slice(1), [
    ["zfs", "rename", "tank/nomad/v1", first],
    zfsArgv("zfs").get("type", first),
    ["zfs", "rename", "tank/nomad/v1", second],
    zfsArgv("zfs").get("type", second),
    ["zfs", "set", "canmount=noauto", second],
  ]);
});

Deno.test("Trash.removeVolume cuts a long name aside to what zfs accepts", async () => {
  using h = setup();
  const component = "a".repeat(244);
  const dataset = `tank/nomad/${component}`;
  assert.equal(dataset.length, 255);
  h.runner
    .onExact(["zfs", "unmount", dataset], {})
    .on(["zfs", "rename", dataset], {})
    .on(["zfs", "set", "canmount=noauto"], {});
  await h.trash.removeVolume(dataset);
  const hidden = h.runner.argvs[1]![3]!;
  assert.equal(hidden.length, 255);
  assert.equal(hidden, `tank/nomad/.deleted-${NOW}-${component}`.slice(0, 255));
});

Deno.test("Trash.removeVolume only logs a failing canmount=noauto", async () => {
  using h = setup();
  const hidden = `tank/nomad/.deleted-${NOW}-v1`;
  h.runner
    .onExact(["zfs", "unmount", "tank/nomad/v1"], {})
    .onExact(["zfs", "rename", "tank/nomad/v1", hidden], {})
    .onExact(
      ["zfs", "set", "canmount=noauto", hidden],
      fails("cannot set property for 'x': permission denied\n"),
    );
  await h.trash.removeVolume("tank/nomad/v1");
  assert.ok(h.logs.some((l) => l.level === "warn" && l.msg.includes("canmount=noauto")));
});

Deno.test("Trash.removeVolume stops before any change when the unmount finds the volume busy", async () => {
  using h = setup({ retention: 0 });
  h.runner.onExact(
    ["zfs", "unmount", "tank/nomad/v1"],
    fails("cannot unmount '/tank/nomad/v1': pool or dataset is busy\n"),
  );
  await assertRejectsZfs(h.trash.removeVolume("tank/nomad/v1"), "busy");
  assert.equal(h.runner.calls.length, 1);
});

Deno.test("Trash.removeVolume goes on when the volume is not mounted", async () => {
  using h = setup({ retention: 0 });
  const stderr = (await fixture("stderr_unmount_not_mounted.txt"))
    .replace("tpool/nomad/foreign", "tank/nomad/v1");
  h.runner
    .onExact(["zfs", "unmount", "tank/nomad/v1"], { code: 1, stderr })
    .onExact(destroyRecursive("tank/nomad/v1"), {});
  await h.trash.removeVolume("tank/nomad/v1");
  assert.equal(h.runner.calls.length, 2);
});

Deno.test("Trash.removeVolume with retention 0 throws other destroy failures", async () => {
  using h = setup({ retention: 0 });
  h.runner
    .onExact(["zfs", "unmount", "tank/nomad/v1"], {})
    .onExact(
      destroyRecursive("tank/nomad/v1"),
      fails("cannot destroy 'tank/nomad/v1': permission denied\n"),
    );
  await assertRejectsZfs(h.trash.removeVolume("tank/nomad/v1"), "permission");
  assert.equal(h.runner.calls.length, 2);
});

// ---------------------------------------------------------------------------------------------
// removeSnapshot

Deno.test("Trash.removeSnapshot with a retention renames the snapshot aside", async () => {
  using h = setup({ retention: 3600 });
  h.runner.onExact(
    ["zfs", "rename", "tank/nomad/v1@s1", `tank/nomad/v1@.deleted-${NOW}-s1`],
    {},
  );
  await h.trash.removeSnapshot("tank/nomad/v1@s1");
  assert.equal(h.runner.calls.length, 1);
});

Deno.test("Trash.removeSnapshot with retention 0 destroys, or sets aside for a deferred destroy when clones need it", async () => {
  {
    using h = setup({ retention: 0 });
    h.runner.onExact(["zfs", "destroy", "tank/nomad/v1@s1"], {});
    await h.trash.removeSnapshot("tank/nomad/v1@s1");
    assert.equal(h.runner.calls.length, 1);
  }
  {
    const stderr = (await fixture("stderr_destroy_snapshot_dependent_clones.txt"))
      .replaceAll("tpool/nomad/pg", "tank/nomad/v1");
    using h = setup({ retention: 0 });
    const hidden = `tank/nomad/v1@.deleted-${NOW}-s1`;
    h.runner
      .onExact(["zfs", "destroy", "tank/nomad/v1@s1"], { code: 1, stderr })
      .onExact(["zfs", "rename", "tank/nomad/v1@s1", hidden], {})
      .onExact(destroyDeferred(hidden), {});
    await h.trash.removeSnapshot("tank/nomad/v1@s1");
    assert.deepEqual(h.runner.argvs, [
      ["zfs", "destroy", "tank/nomad/v1@s1"],
      ["zfs", "rename", "tank/nomad/v1@s1", hidden],
      destroyDeferred(hidden),
    ]);
  }
});

Deno.test("Trash.removeSnapshot throws other failures", async () => {
  using h = setup({ retention: 0 });
  h.runner.onExact(
    ["zfs", "destroy", "tank/nomad/v1@s1"],
    fails("cannot destroy snapshot tank/nomad/v1@s1: dataset is busy\n"),
  );
  await assertRejectsZfs(h.trash.removeSnapshot("tank/nomad/v1@s1"), "busy");
  assert.equal(h.runner.calls.length, 1);
});
