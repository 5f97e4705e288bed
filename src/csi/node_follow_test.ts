/**
 * NodeStage and NodeUnstage of a volume that follows its job on one node, overlapping as Nomad
 * before 1.11 sends them (the old allocation's unstage while the new one's stage runs): the
 * release and the stage are ordered, and the one that comes second sees what the first did.
 * On a fake pool and mount table, with the in-memory store (issue 21, defect 5).
 */

import assert from "node:assert/strict";
import type { FakePool } from "../../tests/support/fake_pool.ts";
import { gate } from "../../tests/support/fake_runner.ts";
import {
  createFollowOwner,
  DATASET as DS,
  followManifest as manifest,
  type FollowNodeHarness,
  followNodeHarness,
  holdAs,
  settle,
  settleUntil,
  storeManifests,
} from "../../tests/support/follow_harness.ts";
import { FOLLOW_GENERATION_PROPERTY, FOLLOW_RELEASED_PROPERTY } from "../follow/copy.ts";
import { moveHead, readOwner } from "../follow/owner.ts";
import type { BackupOutcome } from "../replicate/backup.ts";
import { fsCap } from "../../tests/support/service_harness.ts";

/**
 * Node "n1" holds "pg" (generation 1, head "1"), its copy writable, mounted and staged for the
 * old allocation; the store has snapshots 1 ← 2.
 */
async function heldAndStaged(h: FollowNodeHarness): Promise<void> {
  await createFollowOwner(h.store);
  await storeManifests(h.store, [manifest("1", null), manifest("2", "1")]);
  const held = await holdAs(h.store, "n1");
  await moveHead(h.store, "pg", held, { guid: "1", createdAt: "x" }, 0);
  h.pool.add(DS, {
    "org.zfs-csi:managed": "yes",
    [FOLLOW_GENERATION_PROPERTY]: String(held.record.generation),
    [FOLLOW_RELEASED_PROPERTY]: "none",
    "org.zfs-csi:backup-interval": "60",
    "org.zfs-csi:staged": "1700000000",
    readonly: "off",
    mounted: "yes",
  });
  h.pool.add(`${DS}@.backup-1`, { guid: "1", createtxg: "100" });
  await Deno.mkdir(h.staging, { recursive: true });
  h.pool.mounts.push([DS, h.pool.value(DS, "mountpoint")!], [DS, h.staging]);
}

/** The final backup of a release: snapshot 2 on the copy, stored. */
function finalBackup(before?: () => Promise<void>) {
  return async (_dataset: string, pool: FakePool): Promise<BackupOutcome> => {
    await before?.();
    pool.add(`${DS}@.backup-2`, { guid: "2", createtxg: "200" });
    return {
      status: "stored",
      manifest: manifest("2", "1"),
      sent: true,
      pruned: [],
      destroyed: [],
    };
  };
}

const stageReq = (staging: string) => ({
  volume_id: "pg@*",
  staging_target_path: staging,
  volume_capability: fsCap(),
  volume_context: {},
  publish_context: {},
  secrets: {},
});

const unstageReq = (staging: string) => ({ volume_id: "pg@*", staging_target_path: staging });

/** Whether the volume is bound at the staging path (something uses it). */
const staged = (h: FollowNodeHarness) =>
  h.pool.mounts.some(([d, at]) => d === DS && at === h.staging);

Deno.test("NodeStage prepared while the old allocation's NodeUnstage decides: the release is skipped, the volume stays held and writable", async () => {
  await using h = await followNodeHarness({ backup: finalBackup() });
  await heldAndStaged(h);
  const before = (await readOwner(h.store, "pg"))!.record;
  // The old allocation's unstage: held while it unmounts, before it decides to release.
  const unmounting = gate();
  let unmountSeen = false;
  h.pool.hook = async (argv) => {
    if (argv[0] !== "umount") return undefined;
    unmountSeen = true;
    await unmounting.promise;
    return undefined;
  };
  const unstage = h.node.NodeUnstageVolume(unstageReq(h.staging));
  await settleUntil("the unstage unmounts", () => unmountSeen);
  // The new allocation's stage prepares the copy meanwhile (outside the volume's lock).
  const stage = h.node.NodeStageVolume(stageReq(h.staging));
  await settleUntil(
    "the stage made the copy this generation's",
    () => h.runner.argvs.some((a) => a[1] === "set" && a.includes("readonly=off")),
  );
  unmounting.open();
  await unstage;
  await stage;
  const after = (await readOwner(h.store, "pg"))!.record;
  assert.equal(after.state, "held", "the store does not call the volume released");
  assert.equal(after.holder, "n1");
  assert.equal(after.generation, before.generation);
  assert.equal(h.pool.value(DS, "readonly"), "off", "the new allocation's copy is writable");
  assert.ok(staged(h), "and bound at the staging path");
  assert.deepEqual(h.backups, [], "no final upload of a copy in use");
  assert.ok(h.logs.some((l) => l.includes("in use again")), "the log says why");
});

Deno.test("NodeStage that comes while the old allocation's release uploads waits for it and acquires the volume again", async () => {
  const upload = gate();
  let uploading = false;
  await using h = await followNodeHarness({
    backup: finalBackup(async () => {
      uploading = true;
      await upload.promise;
    }),
  });
  await heldAndStaged(h);
  const before = (await readOwner(h.store, "pg"))!.record;
  const unstage = h.node.NodeUnstageVolume(unstageReq(h.staging));
  await settleUntil("the final upload is under way", () => uploading);
  let stageDone = false;
  const stage = h.node.NodeStageVolume(stageReq(h.staging)).finally(() => stageDone = true);
  await settle();
  assert.equal(stageDone, false, "the stage waits for the release");
  upload.open();
  await unstage;
  await stage;
  const after = (await readOwner(h.store, "pg"))!.record;
  assert.equal(after.state, "held");
  assert.equal(after.holder, "n1");
  assert.equal(after.generation, before.generation + 1, "acquired again after the release");
  assert.equal(after.head, "2", "at the release's final snapshot");
  assert.equal(h.pool.value(DS, "readonly"), "off");
  assert.equal(h.pool.value(DS, FOLLOW_GENERATION_PROPERTY), String(after.generation));
  assert.ok(staged(h));
});

Deno.test("a NodeStage that fails makes the release an overlapping NodeUnstage left to it", async () => {
  await using h = await followNodeHarness({ backup: finalBackup() });
  await heldAndStaged(h);
  const unmounting = gate();
  let unmountSeen = false;
  h.pool.hook = async (argv) => {
    if (argv[0] === "umount") {
      unmountSeen = true;
      await unmounting.promise;
    }
    // The new allocation's bind fails.
    if (argv[0] === "mount" && argv.includes("--bind")) {
      return { code: 32, stderr: "mount: permission denied\n" };
    }
    return undefined;
  };
  const unstage = h.node.NodeUnstageVolume(unstageReq(h.staging));
  await settleUntil("the unstage unmounts", () => unmountSeen);
  const stage = h.node.NodeStageVolume(stageReq(h.staging));
  stage.catch(() => {});
  await settleUntil(
    "the stage made the copy this generation's",
    () => h.runner.argvs.some((a) => a[1] === "set" && a.includes("readonly=off")),
  );
  unmounting.open();
  await unstage;
  await assert.rejects(stage, /permission denied/);
  const after = (await readOwner(h.store, "pg"))!.record;
  assert.ok(h.logs.some((l) => l.includes("in use again")), "the unstage left it to the stage");
  assert.equal(after.state, "released", "nothing uses the volume here: it is released");
  assert.equal(after.head, "2");
  assert.equal(h.pool.value(DS, "readonly"), "on");
  assert.equal(staged(h), false);
});
