import assert from "node:assert/strict";
import { FakeRunner } from "../../tests/support/fake_runner.ts";
import { FakePool } from "../../tests/support/fake_pool.ts";
import { run } from "./undelete.ts";
import { memoryIo, TEST_FLAGS, trashMarks } from "./test_io.ts";

/** A pool that also answers `zfs inherit` and `zfs mount` as zfs does. */
function setup() {
  const runner = new FakeRunner();
  const pool = new FakePool(runner);
  pool.add("tank/nomad");
  runner.on(["zfs", "inherit"], (argv) => {
    const [prop, name] = [argv[2]!, argv[3]!];
    if (!pool.has(name)) {
      return { code: 1, stderr: `cannot open '${name}': dataset does not exist` };
    }
    pool.objects.get(name)!.delete(prop);
    return {};
  });
  runner.on(["zfs", "mount"], (argv) => {
    pool.setValue(argv[2]!, "mounted", "yes");
    return {};
  });
  return { runner, pool };
}

Deno.test("undelete gives a volume its recorded name back, removes the marks and mounts it", async () => {
  const { runner, pool } = setup();
  // The hidden name was cut; the recorded name is whole.
  pool.add("tank/nomad/.deleted-1795392530-pg-da", {
    ...trashMarks("tank/nomad/pg-data", "1795392530"),
    canmount: "noauto",
  });
  const io = memoryIo();
  assert.equal(await run([...TEST_FLAGS, "pg-data"], io, { runner }), 0);
  assert.ok(pool.has("tank/nomad/pg-data"));
  assert.ok(!pool.has("tank/nomad/.deleted-1795392530-pg-da"));
  assert.equal(pool.value("tank/nomad/pg-data", "org.zfs-csi:deleted-at"), undefined);
  assert.equal(pool.value("tank/nomad/pg-data", "org.zfs-csi:deleted-name"), undefined);
  assert.equal(pool.value("tank/nomad/pg-data", "org.zfs-csi:managed"), "yes");
  assert.equal(pool.value("tank/nomad/pg-data", "canmount"), "on");
  assert.equal(pool.value("tank/nomad/pg-data", "mounted"), "yes");
  const changes = runner.argvs.filter((a) => !["get"].includes(a[1]!));
  assert.deepEqual(changes, [
    ["zfs", "rename", "tank/nomad/.deleted-1795392530-pg-da", "tank/nomad/pg-data"],
    ["zfs", "inherit", "org.zfs-csi:deleted-at", "tank/nomad/pg-data"],
    ["zfs", "inherit", "org.zfs-csi:deleted-name", "tank/nomad/pg-data"],
    ["zfs", "set", "canmount=on", "tank/nomad/pg-data"],
    ["zfs", "mount", "tank/nomad/pg-data"],
  ]);
  assert.match(io.stdout.join("\n"), /external_id = "pg-data@node-a"/);
  runner.assertNoUnexpected();
});

Deno.test("undelete refuses a taken name and changes nothing; --as gives another name", async () => {
  const { runner, pool } = setup();
  pool.add("tank/nomad/.deleted-100-pg", trashMarks("tank/nomad/pg", "100"));
  pool.add("tank/nomad/pg", { "org.zfs-csi:managed": "yes" });
  await assert.rejects(
    () => run([...TEST_FLAGS, "pg"], memoryIo(), { runner }),
    /"tank\/nomad\/pg" exists .*nothing was changed.*--as NAME/,
  );
  assert.ok(!runner.argvs.some((a) => a[1] !== "get"), "only reads");
  assert.equal(
    await run([...TEST_FLAGS, "pg", "--as", "pg-restored", "--json"], memoryIo(), { runner }),
    0,
  );
  assert.ok(pool.has("tank/nomad/pg-restored"));
  assert.ok(pool.has("tank/nomad/pg"));
});

Deno.test("undelete of a name deleted twice asks which; the hidden name chooses", async () => {
  const { runner, pool } = setup();
  pool.add("tank/nomad/.deleted-100-pg", trashMarks("tank/nomad/pg", "100"));
  pool.add("tank/nomad/.deleted-200-pg", trashMarks("tank/nomad/pg", "200"));
  await assert.rejects(
    () => run([...TEST_FLAGS, "pg"], memoryIo(), { runner }),
    /deleted 2 times: name one of "tank\/nomad\/.deleted-100-pg".*"tank\/nomad\/.deleted-200-pg"/,
  );
  const io = memoryIo();
  assert.equal(
    await run([...TEST_FLAGS, "tank/nomad/.deleted-200-pg", "--json"], io, { runner }),
    0,
  );
  const out = JSON.parse(io.stdout.join("\n"));
  assert.deepEqual([out.from, out.to, out.deletedAt], [
    "tank/nomad/.deleted-200-pg",
    "tank/nomad/pg",
    200,
  ]);
  assert.ok(pool.has("tank/nomad/.deleted-100-pg"));
});

Deno.test("undelete never touches what lacks the marks, and brings back snapshots", async () => {
  const { runner, pool } = setup();
  // Made by hand: no deleted-at of its own.
  pool.add("tank/nomad/.deleted-100-pg", {
    "org.zfs-csi:managed": "yes",
    "org.zfs-csi:deleted-name": "tank/nomad/pg",
  });
  await assert.rejects(
    () => run([...TEST_FLAGS, "pg"], memoryIo(), { runner }),
    /Nothing set aside/,
  );
  pool.add("tank/nomad/v", { "org.zfs-csi:managed": "yes" });
  pool.add("tank/nomad/v@.deleted-300-nightly", trashMarks("tank/nomad/v@nightly", "300"));
  assert.equal(await run([...TEST_FLAGS, "v@nightly"], memoryIo(), { runner }), 0);
  assert.ok(pool.has("tank/nomad/v@nightly"));
  assert.ok(pool.has("tank/nomad/.deleted-100-pg"), "the unmarked one stays");
  assert.ok(!runner.argvs.some((a) => a[1] === "mount" || a.includes("canmount=on")));
});

Deno.test("undelete refuses a recorded name outside the parent", async () => {
  const { runner, pool } = setup();
  pool.add("tank/nomad/.deleted-100-x", trashMarks("tank/other/x", "100"));
  await assert.rejects(
    () => run([...TEST_FLAGS, "tank/nomad/.deleted-100-x"], memoryIo(), { runner }),
    /not a volume below "tank\/nomad"/,
  );
  assert.ok(!runner.argvs.some((a) => a[1] === "rename"));
});

Deno.test("undelete brings a host volume back under its own name and says how Nomad gets it", async () => {
  const { runner, pool } = setup();
  pool.add("tank/nomad/.deleted-1795392530-.host-default_pg", {
    ...trashMarks("tank/nomad/.host-default_pg", "1795392530"),
    "org.zfs-csi:host-volume-id": "0d4c-old",
    canmount: "noauto",
  });
  await assert.rejects(
    () => run([...TEST_FLAGS, ".host-default_pg", "--as", "other"], memoryIo(), { runner }),
    /host volume: it goes back to "tank\/nomad\/.host-default_pg" only/,
  );
  assert.ok(!pool.has("tank/nomad/other"));
  const io = memoryIo();
  assert.equal(await run([...TEST_FLAGS, ".host-default_pg", "--json"], io, { runner }), 0);
  const result = JSON.parse(io.stdout.join("\n"));
  assert.equal(result.to, "tank/nomad/.host-default_pg");
  assert.equal(result.hostVolume, true);
  assert.equal(result.volumeId, undefined);
  assert.ok(pool.has("tank/nomad/.host-default_pg"));
  assert.equal(pool.value("tank/nomad/.host-default_pg", "canmount"), "on");
  // Its id stays until Nomad's new create hands it over.
  assert.equal(pool.value("tank/nomad/.host-default_pg", "org.zfs-csi:host-volume-id"), "0d4c-old");
  runner.assertNoUnexpected();
});

Deno.test("undelete gives a zvol its name back and removes the marks, without canmount or a mount", async () => {
  const { runner, pool } = setup();
  pool.add("tank/nomad/.deleted-1795392530-db", {
    ...trashMarks("tank/nomad/db", "1795392530"),
    type: "volume",
    "org.zfs-csi:fs-type": "ext4",
  });
  assert.equal(await run([...TEST_FLAGS, "db"], memoryIo(), { runner }), 0);
  assert.equal(pool.value("tank/nomad/db", "type"), "volume");
  assert.equal(pool.value("tank/nomad/db", "org.zfs-csi:deleted-at"), undefined);
  assert.deepEqual(runner.argvs.filter((a) => a[1] !== "get"), [
    ["zfs", "rename", "tank/nomad/.deleted-1795392530-db", "tank/nomad/db"],
    ["zfs", "inherit", "org.zfs-csi:deleted-at", "tank/nomad/db"],
    ["zfs", "inherit", "org.zfs-csi:deleted-name", "tank/nomad/db"],
  ]);
  runner.assertNoUnexpected();
});
