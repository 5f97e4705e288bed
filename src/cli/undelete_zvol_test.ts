/**
 * `zfs-csi undelete` of a zvol that gave its reservation back when it was set aside
 * (src/volume/zvol_reservation.ts): the reservation goes back first, as `auto` where it was the
 * full one and as the recorded value where it was not, then the rename and the marks; where the
 * pool has no room, the zvol stays set aside exactly as it was.
 */

import assert from "node:assert/strict";
import { Code } from "../errors.ts";
import { KeyedLock } from "../lock.ts";
import { Logger } from "../log.ts";
import { Trash } from "../volume/trash.ts";
import { assertRejectsCsi } from "../../tests/support/assert_errors.ts";
import { FakeRunner, fakeTools } from "../../tests/support/fake_runner.ts";
import { FakePool } from "../../tests/support/fake_pool.ts";
import { openZfsFixture, openZfsProperties } from "../../tests/support/openzfs_fixtures.ts";
import { zfsArgv } from "../../tests/support/zfs_argv.ts";
import { run } from "./undelete.ts";
import { memoryIo, TEST_FLAGS, trashMarks } from "./test_io.ts";

const HIDDEN = "tank/nomad/.deleted-1795392530-db";
const DEST = "tank/nomad/db";
const RECORD = "org.zfs-csi:deleted-refreservation";
const VOLSIZE = 64 * 1024 * 1024;
/** What `zfs create -V` (and refreservation=auto) reserved for a 64 MiB zvol, captured on OpenZFS. */
const FULL = Number(
  openZfsProperties("zfs_get_zvol_reservation.txt", "tpool/nomad/z1").get("refreservation")!.value,
);
/** OpenZFS refusing a zvol's reservation the pool has no room for (captured). */
const NO_SPACE = openZfsFixture("stderr_set_zvol_refreservation_no_space.txt");
const zfs = zfsArgv("zfs");

/**
 * A pool holding a set-aside zvol with `record`, whose `zfs set refreservation=` takes at most
 * `room` bytes (`auto` meaning {@linkcode FULL}), as OpenZFS refuses a reservation the pool has
 * no room for.
 */
function setup(record: string | undefined, room = Infinity) {
  const runner = new FakeRunner();
  const pool = new FakePool(runner);
  pool.add("tank/nomad");
  runner.on(["zfs", "inherit"], (argv) => {
    pool.objects.get(argv[3]!)?.delete(argv[2]!);
    return {};
  });
  pool.add(HIDDEN, {
    ...trashMarks(DEST, "1795392530"),
    type: "volume",
    mountpoint: ["-", "-"],
    volsize: String(VOLSIZE),
    refreservation: ["0", "local"],
    "org.zfs-csi:fs-type": "ext4",
    ...(record === undefined ? {} : { [RECORD]: record }),
  });
  pool.hook = (argv) => {
    const kv = argv[1] === "set" ? argv[2]! : "";
    if (!kv.startsWith("refreservation=")) return undefined;
    const value = kv.slice("refreservation=".length);
    const bytes = value === "auto" ? FULL : value === "none" ? 0 : Number(value);
    if (bytes > room) return { code: 1, stderr: NO_SPACE.replace("tpool/nomad/z1", argv[3]!) };
    pool.setValue(argv[3]!, "refreservation", [String(bytes), "local"]);
    return {};
  };
  return { runner, pool };
}

/** Every call after undelete read the item again (its checks made), in order. */
const changesAndReads = (runner: FakeRunner) =>
  runner.argvs.slice(runner.argvs.findIndex((a) => a[1] === "get" && a.at(-1) === HIDDEN) + 1);
const READ = zfs.get(`volsize,refreservation,${RECORD}`, HIDDEN);
const RENAME_AND_MARKS = [
  ["zfs", "rename", HIDDEN, DEST],
  ["zfs", "inherit", "org.zfs-csi:deleted-at", DEST],
  ["zfs", "inherit", "org.zfs-csi:deleted-name", DEST],
  ["zfs", "inherit", RECORD, DEST],
];

/** Asserts that the zvol is still set aside exactly as it was: marks, record, no reservation. */
function assertUnchanged(pool: FakePool, record: string, runner: FakeRunner): void {
  assert.ok(pool.has(HIDDEN) && !pool.has(DEST));
  assert.equal(pool.value(HIDDEN, "org.zfs-csi:deleted-at"), "1795392530");
  assert.equal(pool.value(HIDDEN, RECORD), record);
  assert.equal(pool.value(HIDDEN, "refreservation"), "0");
  assert.ok(!runner.argvs.some((a) => a[1] === "rename" || a[1] === "inherit"));
}

Deno.test("undelete puts a zvol's full reservation back as refreservation=auto, before the rename", async () => {
  const { runner, pool } = setup(String(FULL));
  assert.equal(await run([...TEST_FLAGS, "db"], memoryIo(), { runner }), 0);
  assert.deepEqual(changesAndReads(runner), [
    READ,
    ["zfs", "set", "refreservation=auto", HIDDEN],
    // Read back: a reservation set by hand above the full one is put back as it was.
    zfs.get("refreservation", HIDDEN),
    ...RENAME_AND_MARKS,
  ]);
  assert.equal(pool.value(DEST, "refreservation"), String(FULL));
  assert.equal(pool.value(DEST, RECORD), undefined);
  assert.equal(pool.value(DEST, "org.zfs-csi:deleted-at"), undefined);
  runner.assertNoUnexpected();
});

Deno.test("undelete puts back a reservation of part of a zvol exactly as it was recorded", async () => {
  const { runner, pool } = setup("16777216");
  assert.equal(await run([...TEST_FLAGS, "db"], memoryIo(), { runner }), 0);
  assert.deepEqual(changesAndReads(runner), [
    READ,
    ["zfs", "set", "refreservation=16777216", HIDDEN],
    ...RENAME_AND_MARKS,
  ]);
  assert.equal(pool.value(DEST, "refreservation"), "16777216");
  runner.assertNoUnexpected();
});

Deno.test("undelete puts back a reservation set by hand above the full one as it was", async () => {
  const big = String(FULL + 8 * 1024 * 1024);
  const { runner, pool } = setup(big);
  assert.equal(await run([...TEST_FLAGS, "db"], memoryIo(), { runner }), 0);
  assert.deepEqual(changesAndReads(runner), [
    READ,
    ["zfs", "set", "refreservation=auto", HIDDEN],
    zfs.get("refreservation", HIDDEN),
    ["zfs", "set", `refreservation=${big}`, HIDDEN],
    ...RENAME_AND_MARKS,
  ]);
  assert.equal(pool.value(DEST, "refreservation"), big);
  runner.assertNoUnexpected();
});

Deno.test("undelete refuses a zvol whose reservation the pool has no room for, and leaves it set aside as it was", async () => {
  {
    const { runner, pool } = setup(String(FULL), FULL - 1);
    await assertRejectsCsi(
      run([...TEST_FLAGS, "db"], memoryIo(), { runner }),
      Code.RESOURCE_EXHAUSTED,
      new RegExp(
        `^The pool has no room to reserve ${FULL} bytes for "tank/nomad/db" again \\(zfs said: ` +
          `cannot set property for '${HIDDEN}': size is greater than available space\\); it ` +
          `stays set aside as "${HIDDEN}", unchanged: make room in the pool and try again$`,
      ),
    );
    assert.deepEqual(changesAndReads(runner), [
      READ,
      ["zfs", "set", "refreservation=auto", HIDDEN],
    ]);
    assertUnchanged(pool, String(FULL), runner);
  }
  {
    // Room for the full reservation, not for the larger one set by hand: back to none.
    const big = String(FULL + 8 * 1024 * 1024);
    const { runner, pool } = setup(big, FULL);
    await assertRejectsCsi(
      run([...TEST_FLAGS, "db"], memoryIo(), { runner }),
      Code.RESOURCE_EXHAUSTED,
      { includes: `no room to reserve ${big} bytes` },
    );
    assert.deepEqual(changesAndReads(runner), [
      READ,
      ["zfs", "set", "refreservation=auto", HIDDEN],
      zfs.get("refreservation", HIDDEN),
      ["zfs", "set", `refreservation=${big}`, HIDDEN],
      ["zfs", "set", "refreservation=none", HIDDEN],
    ]);
    assertUnchanged(pool, big, runner);
  }
  {
    const { runner, pool } = setup("16777216", 1024);
    await assertRejectsCsi(
      run([...TEST_FLAGS, "db"], memoryIo(), { runner }),
      Code.RESOURCE_EXHAUSTED,
      { includes: "no room to reserve 16777216 bytes" },
    );
    assertUnchanged(pool, "16777216", runner);
  }
});

Deno.test("undelete refuses a zvol whose reservation record is not a byte count, changing nothing", async () => {
  for (const record of ["lots", "0", "-1", "1e9", "99999999999999999999"]) {
    const { runner, pool } = setup(record);
    await assertRejectsCsi(
      run([...TEST_FLAGS, "db"], memoryIo(), { runner }),
      Code.FAILED_PRECONDITION,
      {
        includes:
          `records its reservation as "${record}", not a positive byte count; nothing was changed`,
      },
      record,
    );
    assert.ok(!runner.argvs.some((a) => a[1] === "set"), record);
    assertUnchanged(pool, record, runner);
  }
});

Deno.test("undelete of a zvol set aside with no record (sparse, or before records) sets no reservation", async () => {
  const { runner, pool } = setup(undefined);
  pool.setValue(HIDDEN, "refreservation", ["67108864", "local"]);
  assert.equal(await run([...TEST_FLAGS, "db"], memoryIo(), { runner }), 0);
  assert.deepEqual(changesAndReads(runner), [READ, ...RENAME_AND_MARKS.slice(0, 3)]);
  assert.equal(pool.value(DEST, "refreservation"), "67108864");
  runner.assertNoUnexpected();
});

Deno.test("undelete finishes a zvol an earlier undelete put the reservation back on, then died", async () => {
  const { runner, pool } = setup(String(FULL));
  pool.setValue(HIDDEN, "refreservation", [String(FULL), "local"]);
  assert.equal(await run([...TEST_FLAGS, "db"], memoryIo(), { runner }), 0);
  assert.equal(pool.value(DEST, "refreservation"), String(FULL));
  assert.equal(pool.value(DEST, RECORD), undefined);
});

Deno.test("a delete killed after any of its steps leaves a zvol that is reserved, or recorded and brought back reserved", async () => {
  // The set-aside's steps: read, rename, marks with the record, drop.
  for (let steps = 0; steps <= 4; steps++) {
    const runner = new FakeRunner();
    const pool = new FakePool(runner);
    pool.add("tank/nomad");
    pool.add(DEST, {
      type: "volume",
      mountpoint: ["-", "-"],
      volsize: String(VOLSIZE),
      refreservation: String(FULL),
      "org.zfs-csi:managed": "yes",
      "org.zfs-csi:fs-type": "ext4",
    });
    const log = new Logger("error", {}, () => {});
    const trash = new Trash({
      zfs: fakeTools(runner, log).zfs,
      parentDataset: "tank/nomad",
      retentionSeconds: 3600,
      locks: new KeyedLock(),
      log,
      now: () => 1795392530,
    });
    const found = await trash.inspect(DEST);
    assert.ok(found);
    // The plugin is killed once `steps` commands of the delete have run: nothing after runs.
    let ran = 0;
    pool.hook = () => ran++ < steps ? undefined : { code: 137, stderr: "" };
    await trash.removeVolume(DEST, found).catch(() => {});
    pool.hook = undefined;
    const name = pool.has(DEST) ? DEST : HIDDEN;
    const reservation = pool.value(name, "refreservation");
    const record = pool.objects.get(name)?.get(RECORD);
    // Never without both its reservation and its record.
    assert.ok(
      reservation === String(FULL) || (reservation === "none" && record?.value === String(FULL)),
      `after ${steps} steps: ${name} reserves ${reservation}, records ${record?.value}`,
    );
    if (name === DEST || pool.value(HIDDEN, "org.zfs-csi:deleted-at") === undefined) {
      // Not deleted yet (Nomad's retry deletes it), or an unmarked .deleted-* zvol the purge never
      // destroys: reserved in full either way.
      assert.equal(reservation, String(FULL), `after ${steps} steps`);
      continue;
    }
    const cli = new FakeRunner();
    const back = new FakePool(cli);
    for (const [n, p] of pool.objects) back.objects.set(n, new Map(p));
    cli.on(["zfs", "inherit"], (argv) => {
      back.objects.get(argv[3]!)?.delete(argv[2]!);
      return {};
    });
    back.hook = (argv) => {
      if (argv[1] !== "set" || argv[2] !== "refreservation=auto") return undefined;
      back.setValue(argv[3]!, "refreservation", [String(FULL), "local"]);
      return {};
    };
    assert.equal(await run([...TEST_FLAGS, "db"], memoryIo(), { runner: cli }), 0);
    assert.equal(back.value(DEST, "refreservation"), String(FULL), `after ${steps} steps`);
    assert.equal(back.value(DEST, RECORD), undefined);
  }
});
