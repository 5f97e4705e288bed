/**
 * The set-aside of a zvol (docs/deleting.md): its refreservation is recorded with the deletion
 * marks and then dropped, in that order, so that a zvol reserving nothing always carries its
 * record; a sparse zvol reserves nothing and is left so; the purge destroys it as any other.
 */

import assert from "node:assert/strict";
import { KeyedLock } from "../lock.ts";
import { Logger } from "../log.ts";
import { FakeRunner, fakeTools } from "../../tests/support/fake_runner.ts";
import { FakePool } from "../../tests/support/fake_pool.ts";
import { openZfsProperties } from "../../tests/support/openzfs_fixtures.ts";
import { zfsArgv } from "../../tests/support/zfs_argv.ts";
import { Trash } from "./trash.ts";

const PARENT = "tank/nomad";
const NOW = 1_700_000_000;
const ZVOL = `${PARENT}/disk`;
const HIDDEN = `${PARENT}/.deleted-${NOW}-disk`;
const AT = "org.zfs-csi:deleted-at";
const NAME = "org.zfs-csi:deleted-name";
const RECORD = "org.zfs-csi:deleted-refreservation";
/** What `zfs create -V` reserved for a 64 MiB zvol, captured on OpenZFS. */
const FULL = openZfsProperties("zfs_get_zvol_reservation.txt", "tpool/nomad/z1")
  .get("refreservation")!.value;
const SUBTREE = "type,mountpoint,org.zfs-csi:managed,org.zfs-csi:deleted-at," +
  "org.zfs-csi:deleted-name,userrefs,defer_destroy,clones";

const zfs = zfsArgv("zfs");

interface LogLine {
  level: string;
  msg: string;
  [key: string]: unknown;
}

function setup(opts: { retention?: number } = {}) {
  const runner = new FakeRunner();
  const pool = new FakePool(runner);
  pool.add(PARENT);
  const logs: LogLine[] = [];
  const log = new Logger("debug", {}, (line) => logs.push(JSON.parse(line)));
  const clock = { wall: NOW, mono: 5_000 };
  const trash = new Trash({
    zfs: fakeTools(runner, log).zfs,
    parentDataset: PARENT,
    retentionSeconds: opts.retention ?? 3600,
    locks: new KeyedLock(),
    log,
    now: () => clock.wall,
    monotonic: () => clock.mono,
    minObservationSeconds: 0,
  });
  return { runner, pool, trash, logs, clock };
}

/** A zvol the plugin made, with `refreservation` (bytes, or "none" for a sparse one). */
function zvol(pool: FakePool, refreservation: string) {
  pool.add(ZVOL, {
    type: "volume",
    mountpoint: ["-", "-"],
    volsize: "67108864",
    // OpenZFS's `zfs get -p` says 0 for none.
    refreservation: refreservation === "none" ? ["0", "default"] : refreservation,
    "org.zfs-csi:managed": "yes",
    "org.zfs-csi:fs-type": "ext4",
  });
}

/** A zvol reserving `refreservation`, inspected for its delete (trash.inspect). */
async function inspectedZvol(h: ReturnType<typeof setup>, refreservation: string) {
  zvol(h.pool, refreservation);
  const found = await h.trash.inspect(ZVOL);
  assert.ok(found);
  return found;
}

Deno.test("Trash.removeVolume of a zvol records its refreservation with the marks, then drops it", async () => {
  const h = setup();
  const found = await inspectedZvol(h, FULL);
  const start = h.runner.argvs.length;
  await h.trash.removeVolume(ZVOL, found);
  assert.deepEqual(h.runner.argvs.slice(start), [
    // Read before anything changes; no unmount and no canmount for a zvol.
    zfs.get("refreservation", ZVOL),
    ["zfs", "rename", ZVOL, HIDDEN],
    // The record is written in the marks' `zfs set`, before the deletion time.
    ["zfs", "set", `${NAME}=${ZVOL}`, `${RECORD}=${FULL}`, `${AT}=${NOW}`, HIDDEN],
    ["zfs", "set", "refreservation=none", HIDDEN],
  ]);
  assert.equal(h.pool.value(HIDDEN, RECORD), FULL);
  assert.equal(h.pool.value(HIDDEN, "refreservation"), "none");
  assert.ok(
    h.logs.some((l) => l.msg === "volume set aside" && l.reservationBytes === Number(FULL)),
  );
  h.runner.assertNoUnexpected();
});

Deno.test("Trash.removeVolume of a sparse zvol writes no record and drops nothing", async () => {
  const h = setup();
  const found = await inspectedZvol(h, "none");
  const start = h.runner.argvs.length;
  await h.trash.removeVolume(ZVOL, found);
  assert.deepEqual(h.runner.argvs.slice(start), [
    zfs.get("refreservation", ZVOL),
    ["zfs", "rename", ZVOL, HIDDEN],
    ["zfs", "set", `${NAME}=${ZVOL}`, `${AT}=${NOW}`, HIDDEN],
  ]);
  assert.equal(h.pool.value(HIDDEN, RECORD), undefined);
  assert.equal(h.pool.value(HIDDEN, "refreservation"), "0");
});

Deno.test("Trash.removeVolume of a zvol keeps its reservation when the marks (and the record) could not be set", async () => {
  const h = setup();
  const found = await inspectedZvol(h, FULL);
  h.pool.hook = (argv) =>
    argv[1] === "set" && argv.some((a) => a.startsWith(`${AT}=`))
      ? { code: 1, stderr: "cannot set property: I/O error\n" }
      : undefined;
  await h.trash.removeVolume(ZVOL, found);
  // Set aside, unmarked (the purge never destroys it), and still reserving its space.
  assert.equal(h.pool.value(HIDDEN, RECORD), undefined);
  assert.equal(h.pool.value(HIDDEN, "refreservation"), FULL);
  assert.ok(!h.runner.argvs.some((a) => a.includes("refreservation=none")));
  assert.ok(
    h.logs.some((l) => l.msg === "set aside but not marked: the purge will not destroy it"),
  );
});

Deno.test("Trash.removeVolume of a zvol logs a drop that failed, with the command; the delete stands", async () => {
  const h = setup();
  const found = await inspectedZvol(h, FULL);
  h.pool.hook = (argv) =>
    argv[2] === "refreservation=none"
      ? { code: 1, stderr: "cannot set property: I/O error\n" }
      : undefined;
  await h.trash.removeVolume(ZVOL, found);
  assert.equal(h.pool.value(HIDDEN, RECORD), FULL);
  assert.equal(h.pool.value(HIDDEN, "refreservation"), FULL);
  const logged = h.logs.find((l) =>
    l.msg === "set aside but its reservation is kept until the purge"
  );
  assert.ok(logged);
  assert.match(String(logged.hint), new RegExp(`^zfs set refreservation=none ${HIDDEN} `));
});

Deno.test("Trash.removeVolume of a zvol whose refreservation cannot be read changes nothing", async () => {
  const h = setup();
  const found = await inspectedZvol(h, FULL);
  h.pool.hook = (argv) =>
    argv[1] === "get" && argv.includes("refreservation")
      ? { code: 1, stderr: "cannot open 'tank/nomad/disk': I/O error\n" }
      : undefined;
  await assert.rejects(() => h.trash.removeVolume(ZVOL, found), /I\/O error/);
  assert.ok(h.pool.has(ZVOL) && !h.pool.has(HIDDEN));
  assert.ok(!h.runner.argvs.some((a) => a[1] === "rename" || a[1] === "set"));
});

Deno.test("Trash.purge destroys a set-aside zvol that gave its reservation back, by the same checks", async () => {
  const h = setup({ retention: 60 });
  const found = await inspectedZvol(h, FULL);
  await h.trash.removeVolume(ZVOL, found);
  const start = h.runner.argvs.length;
  h.clock.wall += 61;
  h.clock.mono += 61;
  await h.trash.purge();
  assert.deepEqual(h.runner.argvs.slice(start), [
    zfs.tree(
      PARENT,
      2,
      "type,creation,defer_destroy,userrefs,origin,org.zfs-csi:managed," +
        "org.zfs-csi:deleted-at,org.zfs-csi:deleted-name,clones",
    ),
    zfs.tree(HIDDEN, 1, SUBTREE),
    ["zfs", "destroy", HIDDEN],
  ]);
  assert.deepEqual(h.pool.names(), [PARENT]);
});
