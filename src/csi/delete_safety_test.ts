/**
 * DeleteVolume and the purge never destroy what the plugin did not make: an operator's or a
 * tool's snapshots, child datasets, held snapshots, and clones that are not the plugin's own
 * volumes. Through the CSI handler, on a model pool (tests/support/fake_pool.ts), with retention 0
 * (destroy at once) and with a retention (set aside, then purged).
 */

import assert from "node:assert/strict";
import { Code } from "../errors.ts";
import { assertRejectsCsi } from "../../tests/support/assert_errors.ts";
import { FakePool, type FakeValue } from "../../tests/support/fake_pool.ts";
import { fakeServices } from "../../tests/support/service_harness.ts";
import { ControllerService } from "./controller.ts";
import { Trash } from "../volume/trash.ts";

const PARENT = "tank/nomad";
const V1 = `${PARENT}/v1`;
const NOW = 1_700_000_000;
const MANAGED = "org.zfs-csi:managed";
const CLONE = ".clone-0123456789abcdef-1699990000";
const SANOID = `${V1}@autosnap_2024-01-01_00:00:00_hourly`;

function setup(retention: string) {
  const parts = fakeServices({
    parent: PARENT,
    flags: ["--deleted-retention", retention],
    host: (runner) => new FakePool(runner).add(PARENT).add(V1, { [MANAGED]: "yes" }),
  });
  const { config, runner, host: pool, zfs, mounter, health, locks, log } = parts;
  const clock = { wall: NOW, mono: 0 };
  const trash = new Trash({
    zfs,
    parentDataset: PARENT,
    retentionSeconds: config.deletedRetentionSeconds,
    locks,
    log,
    now: () => clock.wall,
    monotonic: () => clock.mono,
  });
  const controller = new ControllerService({ config, zfs, mounter, health, locks, trash, log });
  return {
    runner,
    pool,
    trash,
    controller,
    clock,
    [Symbol.dispose]: () => runner.assertNoUnexpected(),
  };
}

const deleteV1 = (c: ControllerService) => c.DeleteVolume({ volume_id: "v1@n1", secrets: {} });
/** Commands that change anything. */
const changes = (argvs: string[][]) =>
  argvs.filter((a) => ["destroy", "rename", "set", "unmount"].includes(a[1] ?? ""));

/** What is in the way, how to make it, and what the refusal must say. */
const CASES: readonly (readonly [string, (p: FakePool) => void, RegExp])[] = [
  [
    "a sanoid snapshot",
    (p) => p.add(SANOID),
    /snapshot "tank\/nomad\/v1@autosnap_2024-01-01_00:00:00_hourly", not made by zfs-csi: destroy it \("zfs destroy tank\/nomad\/v1@autosnap_2024-01-01_00:00:00_hourly"\)/,
  ],
  [
    "a child dataset",
    (p) => p.add(`${V1}/wal`).add(`${V1}/wal/archive`),
    /child dataset "tank\/nomad\/v1\/wal": move it out \("zfs rename tank\/nomad\/v1\/wal <new name>"\) or destroy it/,
  ],
  [
    // zfs-fuse cannot make holds (`zfs hold` needs pyzfs): this is shown here only.
    "a hold on the plugin's own hidden snapshot",
    (p) => p.add(`${V1}@${CLONE}`, { userrefs: "1" }),
    /snapshot "tank\/nomad\/v1@\.clone-0123456789abcdef-1699990000" is held: list the holds \("zfs holds /,
  ],
  [
    "a clone outside the parent of the plugin's own hidden snapshot",
    (p) =>
      p.add(`${V1}@${CLONE}`).add("tank/other").add("tank/other/copy", {
        origin: `${V1}@${CLONE}`,
      }),
    /dataset "tank\/other\/copy", not a zfs-csi volume, is a clone of "tank\/nomad\/v1@\.clone-[^"]+": make it independent \("zfs promote tank\/other\/copy"\)/,
  ],
  [
    "a foreign clone below the parent",
    (p) => p.add(`${V1}@${CLONE}`).add(`${PARENT}/mine`, { origin: `${V1}@${CLONE}` }),
    /dataset "tank\/nomad\/mine", not a zfs-csi volume, is a clone/,
  ],
  [
    "a .deleted-* snapshot made by hand",
    (p) => p.add(`${V1}@.deleted-1-x`),
    /snapshot "tank\/nomad\/v1@\.deleted-1-x" has a set-aside name but not zfs-csi's marks/,
  ],
];

for (const retention of ["0", "7d"]) {
  for (const [what, add, message] of CASES) {
    Deno.test(`ControllerService.DeleteVolume (retention ${retention}) refuses a volume holding ${what} and changes nothing`, async () => {
      using h = setup(retention);
      add(h.pool);
      const before = h.pool.names();
      await assertRejectsCsi(
        deleteV1(h.controller),
        Code.FAILED_PRECONDITION,
        new RegExp(
          `^Volume "v1@n1" is not deleted: it holds what zfs-csi did not make, which it never ` +
            `destroys: .*${message.source}`,
        ),
      );
      assert.deepEqual(changes(h.runner.argvs), []);
      assert.deepEqual(h.pool.names(), before);
    });
  }
}

Deno.test("ControllerService.DeleteVolume names everything in the way in one message, up to five", async () => {
  using h = setup("0");
  for (let i = 0; i < 7; i++) h.pool.add(`${V1}@autosnap_2024-01-0${i + 1}_00:00:00_daily`);
  h.pool.add(`${V1}/wal`);
  const err = await assertRejectsCsi(deleteV1(h.controller), Code.FAILED_PRECONDITION);
  assert.equal(err.message.match(/zfs destroy tank\/nomad\/v1@autosnap/g)?.length, 4);
  assert.match(err.message, /child dataset "tank\/nomad\/v1\/wal"/);
  assert.match(
    err.message,
    /; and 3 more \("zfs list -r -t all -o name,userrefs tank\/nomad\/v1"\)$/,
  );
});

Deno.test("ControllerService.DeleteVolume deletes a volume whose hidden snapshot the plugin's own volume is cloned from", async () => {
  for (const retention of ["0", "7d"]) {
    using h = setup(retention);
    h.pool.add(`${V1}@${CLONE}`, { defer_destroy: "on" });
    h.pool.add(`${PARENT}/v2`, { [MANAGED]: "yes", origin: `${V1}@${CLONE}` });
    assert.deepEqual(await deleteV1(h.controller), {});
    // Set aside until the clone goes, both ways.
    const hidden = `${PARENT}/.deleted-${NOW}-v1`;
    assert.ok(h.pool.has(hidden) && !h.pool.has(V1), retention);
    assert.equal(h.pool.value(`${PARENT}/v2`, "origin"), `${hidden}@${CLONE}`);
  }
});

Deno.test("ControllerService.DeleteVolume with a retention, then a snapshot taken of what was set aside: the purge keeps it", async () => {
  using h = setup("1h");
  assert.deepEqual(await deleteV1(h.controller), {});
  const hidden = `${PARENT}/.deleted-${NOW}-v1`;
  // A recursive sanoid run on the parent snapshots the trash too.
  h.pool.add(`${hidden}@autosnap_2024-01-01_00:00:00_hourly`);
  h.clock.wall += 7200;
  h.clock.mono += 7200;
  await h.trash.purge();
  assert.ok(h.pool.has(hidden) && h.pool.has(`${hidden}@autosnap_2024-01-01_00:00:00_hourly`));
  // Once the operator removes it, the purge takes the rest.
  h.pool.objects.delete(`${hidden}@autosnap_2024-01-01_00:00:00_hourly`);
  await h.trash.purge();
  assert.ok(!h.pool.has(hidden));
});

Deno.test("ControllerService.DeleteSnapshot marks what it sets aside, and the purge takes only that", async () => {
  using h = setup("1h");
  h.pool.add(`${V1}@s1`).add(`${V1}@.deleted-${NOW - 7200}-by-hand`);
  assert.deepEqual(await h.controller.DeleteSnapshot({ snapshot_id: "v1@s1@n1", secrets: {} }), {});
  const hidden = `${V1}@.deleted-${NOW}-s1`;
  const marks: Record<string, FakeValue> = {
    [MANAGED]: "yes",
    "org.zfs-csi:deleted-at": String(NOW),
    "org.zfs-csi:deleted-name": `${V1}@s1`,
  };
  for (const [k, v] of Object.entries(marks)) {
    assert.deepEqual(h.pool.objects.get(hidden)?.get(k), { value: v, source: "local" }, k);
  }
  h.clock.wall += 3600;
  h.clock.mono += 3600;
  await h.trash.purge();
  assert.ok(!h.pool.has(hidden));
  assert.ok(h.pool.has(`${V1}@.deleted-${NOW - 7200}-by-hand`));
});
