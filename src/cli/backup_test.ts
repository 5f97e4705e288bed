import assert from "node:assert/strict";
import { FakeRunner } from "../../tests/support/fake_runner.ts";
import { FakePool } from "../../tests/support/fake_pool.ts";
import { ConfigError } from "../config.ts";
import { parseSettings, run } from "./backup.ts";
import { memoryIo, TEST_FLAGS } from "./test_io.ts";

function setup() {
  const runner = new FakeRunner();
  const pool = new FakePool(runner);
  pool.add("tank/nomad");
  pool.add("tank/nomad/pg", { "org.zfs-csi:managed": "yes" });
  pool.add("tank/nomad/.host-prod_cache", { "org.zfs-csi:managed": "yes" });
  pool.add("tank/nomad/follows", {
    "org.zfs-csi:managed": "yes",
    "org.zfs-csi:follow-generation": "2",
  });
  pool.add("tank/nomad/byhand");
  // Zvols: one the plugin made (its own fs-type record), one with the marker but no record of
  // its own (inherited from above), one made by hand.
  pool.add("tank/nomad/disk", {
    type: "volume",
    "org.zfs-csi:managed": "yes",
    "org.zfs-csi:fs-type": "ext4",
  });
  pool.add("tank/nomad/inherited", {
    type: "volume",
    "org.zfs-csi:managed": "yes",
    "org.zfs-csi:fs-type": ["block", "inherited from tank/nomad"],
  });
  pool.add("tank/nomad/handzvol", { type: "volume" });
  runner.on(["zfs", "inherit"], (argv) => {
    pool.objects.get(argv.at(-1)!)?.delete(argv.at(-2)!);
    return {};
  });
  return { runner, pool };
}

Deno.test("backup set gives a volume its own interval and keep policy, as the scheduler reads them", async () => {
  const { runner, pool } = setup();
  const io = memoryIo();
  assert.equal(
    await run(["set", ...TEST_FLAGS, "pg", "--interval", "1h30m", "--keep", "daily=7,last=2"], io, {
      runner,
    }),
    0,
  );
  assert.equal(pool.value("tank/nomad/pg", "org.zfs-csi:backup-interval"), "5400");
  assert.equal(
    pool.value("tank/nomad/pg", "org.zfs-csi:backup-keep"),
    "last=2,hourly=0,daily=7,weekly=0",
  );
  assert.deepEqual(io.stdout, [
    'Volume "pg": backups every 1h30m (was none of its own: the plugin\'s --backup-interval), keep last=2,hourly=0,daily=7,weekly=0. ' +
    "The plugin backs it up only with --store.",
  ]);
  // A host volume by its dataset component; 0 turns it off; "default" gives it back.
  assert.equal(
    await run(["set", ...TEST_FLAGS, ".host-prod_cache", "--interval", "0"], memoryIo(), {
      runner,
    }),
    0,
  );
  assert.equal(pool.value("tank/nomad/.host-prod_cache", "org.zfs-csi:backup-interval"), "0");
  const back = memoryIo();
  assert.equal(
    await run(
      [
        "set",
        ...TEST_FLAGS,
        "--store",
        "file:///tmp/s",
        "--backup-interval",
        "2h",
        "pg",
        "--interval",
        "default",
      ],
      back,
      { runner },
    ),
    0,
  );
  assert.equal(pool.value("tank/nomad/pg", "org.zfs-csi:backup-interval"), undefined);
  assert.match(back.stdout[0]!, /backups every 2h \(default\) \(was every 1h30m\)/);
  runner.assertNoUnexpected();
});

Deno.test("backup set gives a zvol the plugin made a schedule of its own, as a dataset", async () => {
  const { runner, pool } = setup();
  const io = memoryIo();
  assert.equal(
    await run(["set", ...TEST_FLAGS, "disk", "--interval", "15m", "--keep", "last=3"], io, {
      runner,
    }),
    0,
  );
  assert.equal(pool.value("tank/nomad/disk", "org.zfs-csi:backup-interval"), "900");
  assert.equal(
    pool.value("tank/nomad/disk", "org.zfs-csi:backup-keep"),
    "last=3,hourly=0,daily=0,weekly=0",
  );
  assert.match(io.stdout[0]!, /^Volume "disk": backups every 15m \(was none of its own/);
  assert.deepEqual(
    runner.argvs.filter((a) => a[1] === "set"),
    [[
      "zfs",
      "set",
      "org.zfs-csi:backup-interval=900",
      "org.zfs-csi:backup-keep=last=3,hourly=0,daily=0,weekly=0",
      "tank/nomad/disk",
    ]],
  );
  const back = memoryIo();
  assert.equal(
    await run(["set", ...TEST_FLAGS, "disk", "--interval", "default"], back, { runner }),
    0,
  );
  assert.equal(pool.value("tank/nomad/disk", "org.zfs-csi:backup-interval"), undefined);
  runner.assertNoUnexpected();
});

Deno.test("backup set refuses a zvol the plugin did not make, by its own fs-type record", async () => {
  const { runner, pool } = setup();
  for (const name of ["inherited", "handzvol"]) {
    await assert.rejects(
      () => run(["set", ...TEST_FLAGS, name, "--interval", "1h"], memoryIo(), { runner }),
      new RegExp(
        `"tank/nomad/${name}" is a zvol zfs-csi did not make \\(no org.zfs-csi:fs-type of its own\\)`,
      ),
    );
    assert.equal(pool.value(`tank/nomad/${name}`, "org.zfs-csi:backup-interval"), undefined);
  }
  assert.ok(!runner.argvs.some((a) => a[1] === "set"));
});

Deno.test("backup set refuses what is not a volume of zfs-csi's, and a volume that follows its job", async () => {
  const { runner, pool } = setup();
  await assert.rejects(
    () => run(["set", ...TEST_FLAGS, "byhand", "--interval", "1h"], memoryIo(), { runner }),
    /not zfs-csi's .*zfs-csi adopt/,
  );
  await assert.rejects(
    () => run(["set", ...TEST_FLAGS, "follows", "--interval", "1h"], memoryIo(), { runner }),
    /follows its job/,
  );
  await assert.rejects(
    () => run(["set", ...TEST_FLAGS, "gone", "--interval", "1h"], memoryIo(), { runner }),
    /No volume "tank\/nomad\/gone"/,
  );
  await assert.rejects(
    () =>
      run(["set", ...TEST_FLAGS, "tank/nomad/.verify-1", "--interval", "1h"], memoryIo(), {
        runner,
      }),
    /is not a volume below/,
  );
  assert.ok(!runner.argvs.some((a) => a[1] === "set"));
  assert.equal(pool.value("tank/nomad/byhand", "org.zfs-csi:backup-interval"), undefined);
});

Deno.test("backup set reads its flags as the scheduler does, in one line when wrong", () => {
  assert.deepEqual(parseSettings("15m", undefined), { interval: { set: "900" } });
  assert.deepEqual(parseSettings(undefined, "default"), { keep: { inherit: true } });
  assert.throws(() => parseSettings(undefined, undefined), ConfigError);
  assert.throws(() => parseSettings("often", undefined), /--interval: Backup interval "often"/);
  assert.throws(() => parseSettings(undefined, "all"), /--keep: /);
});

Deno.test("backup set says a missing parent does not exist, not that it is not visible", async () => {
  const runner = new FakeRunner();
  const pool = new FakePool(runner);
  pool.add("tank");
  await assert.rejects(
    () => run(["set", ...TEST_FLAGS, "pg", "--interval", "1h"], memoryIo(), { runner }),
    /Parent dataset "tank\/nomad" does not exist \(zfs said: cannot open 'tank\/nomad': dataset does not exist\)/,
  );
  assert.ok(!runner.argvs.some((a) => a[1] === "set"));
});
