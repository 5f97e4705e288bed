import assert from "node:assert/strict";
import { FakeRunner } from "../../tests/support/fake_runner.ts";
import { FakePool } from "../../tests/support/fake_pool.ts";
import { MountJudge } from "../mount/mountinfo.ts";
import { parseGet } from "../zfs/parse.ts";
import { deletedRows, run, stateText, volumeRows } from "./list.ts";
import { memoryIo, TEST_FLAGS } from "./test_io.ts";

/** `zfs get -Hp` lines: name, property, value, source. */
function tree(lines: string[][]) {
  return parseGet(lines.map((l) => l.join("\t")).join("\n") + "\n");
}

Deno.test("volumeRows tells staged from published from other mounts, and skips what is not a volume", () => {
  const t = tree([
    ["tank/nomad", "type", "filesystem", "-"],
    ["tank/nomad/pg", "type", "filesystem", "-"],
    ["tank/nomad/pg", "org.zfs-csi:managed", "yes", "local"],
    ["tank/nomad/pg", "refquota", "67108864", "local"],
    ["tank/nomad/pg", "used", "1048576", "-"],
    ["tank/nomad/pg", "mountpoint", "/mnt/tank/nomad/pg", "default"],
    ["tank/nomad/pg", "mounted", "yes", "-"],
    ["tank/nomad/pg", "org.zfs-csi:backup-last", "1795392530", "local"],
    ["tank/nomad/foreign", "type", "filesystem", "-"],
    ["tank/nomad/inherited", "type", "filesystem", "-"],
    ["tank/nomad/inherited", "org.zfs-csi:managed", "yes", "inherited from tank/nomad"],
    ["tank/nomad/.deleted-1-old", "type", "filesystem", "-"],
    ["tank/nomad/.deleted-1-old", "org.zfs-csi:managed", "yes", "local"],
  ]);
  const table = [
    { source: "tank/nomad/pg", mountPoint: "/mnt/tank/nomad/pg", fsType: "zfs", options: ["rw"] },
    {
      source: "tank/nomad/pg",
      mountPoint: "/local/csi/staging/default/pg/rw-file-system-single-node-writer",
      fsType: "zfs",
      options: ["rw"],
    },
    {
      source: "tank/nomad/pg",
      mountPoint: "/local/csi/per-alloc/a1/pg/rw-file-system-single-node-writer",
      fsType: "zfs",
      options: ["rw"],
    },
    { source: "tank/nomad/pg", mountPoint: "/srv/pg", fsType: "zfs", options: ["rw"] },
    // A user's FUSE mount named like the dataset is no use of it.
    {
      source: "tank/nomad/pg",
      mountPoint: "/local/csi/per-alloc/a2/pg/x",
      fsType: "fuse.zfs",
      options: ["user_id=1000"],
    },
  ];
  const rows = volumeRows({
    parent: "tank/nomad",
    nodeId: "node-a",
    stagePublishDirs: ["/local/csi"],
    tree: t,
    table,
    judge: new MountJudge(),
  });
  assert.equal(rows.length, 1);
  const pg = rows[0]!;
  assert.equal(pg.volumeId, "pg@node-a");
  assert.equal(pg.sizeBytes, 64 * 1024 * 1024);
  assert.equal(pg.usedBytes, 1024 * 1024);
  assert.equal(pg.lastBackup, 1795392530);
  assert.deepEqual(pg.staged, ["/local/csi/staging/default/pg/rw-file-system-single-node-writer"]);
  assert.deepEqual(pg.published, ["/local/csi/per-alloc/a1/pg/rw-file-system-single-node-writer"]);
  assert.deepEqual(pg.otherMounts, ["/srv/pg"]);
  assert.equal(stateText(pg), "published x1, staged x1, mounted elsewhere x1");
});

Deno.test("deletedRows lists only marked set-aside volumes and snapshots", () => {
  const t = tree([
    ["tank/nomad/.deleted-100-a", "type", "filesystem", "-"],
    ["tank/nomad/.deleted-100-a", "org.zfs-csi:managed", "yes", "local"],
    ["tank/nomad/.deleted-100-a", "org.zfs-csi:deleted-at", "100", "local"],
    ["tank/nomad/.deleted-100-a", "org.zfs-csi:deleted-name", "tank/nomad/a", "local"],
    ["tank/nomad/.deleted-50-unmarked", "type", "filesystem", "-"],
    ["tank/nomad/.deleted-50-unmarked", "org.zfs-csi:managed", "yes", "local"],
    ["tank/nomad/v@.deleted-90-s", "type", "snapshot", "-"],
    ["tank/nomad/v@.deleted-90-s", "org.zfs-csi:managed", "yes", "local"],
    ["tank/nomad/v@.deleted-90-s", "org.zfs-csi:deleted-at", "90", "local"],
    ["tank/nomad/v@.deleted-90-s", "org.zfs-csi:deleted-name", "tank/nomad/v@s", "local"],
  ]);
  const rows = deletedRows("tank/nomad", t);
  assert.deepEqual(rows.map((r) => [r.hidden, r.kind, r.deletedName, r.deletedAt]), [
    ["tank/nomad/v@.deleted-90-s", "snapshot", "tank/nomad/v@s", 90],
    ["tank/nomad/.deleted-100-a", "volume", "tank/nomad/a", 100],
  ]);
});

Deno.test("list runs one zfs get and one mount, and prints a table or JSON", async () => {
  const runner = new FakeRunner();
  const pool = new FakePool(runner);
  pool.add("tank/nomad");
  pool.add("tank/nomad/web", {
    "org.zfs-csi:managed": "yes",
    refquota: "1073741824",
    used: "5242880",
    mounted: "yes",
    "org.zfs-csi:backup-interval": "3600",
  });
  pool.mounts = [
    ["tank/nomad/web", "/mnt/tank/nomad/web"],
    ["tank/nomad/web", "/local/csi/staging/default/web/rw-file-system-multi-node-multi-writer"],
  ];
  const io = memoryIo();
  assert.equal(await run([...TEST_FLAGS], io, { runner }), 0);
  assert.deepEqual(io.stdout, [
    "NAME  NODE    SIZE   USED   STATE      LAST BACKUP",
    "web   node-a  1 GiB  5 MiB  staged x1  none yet",
  ]);
  const zfsCalls = runner.argvs.filter((a) => a[0] === "zfs");
  assert.equal(zfsCalls.length, 1);
  assert.deepEqual(zfsCalls[0]!.slice(0, 6), ["zfs", "get", "-Hp", "-r", "-d", "1"]);
  assert.equal(runner.argvs.filter((a) => a[0] === "mount").length, 1);

  const json = memoryIo();
  assert.equal(await run(["--json", ...TEST_FLAGS], json, { runner }), 0);
  const rows = JSON.parse(json.stdout.join("\n"));
  assert.equal(rows[0].name, "web");
  assert.equal(rows[0].backupIntervalSeconds, 3600);
  assert.equal(rows[0].lastBackup, undefined);
  runner.assertNoUnexpected();
});

Deno.test("list refuses stray arguments and a missing parent dataset", async () => {
  const runner = new FakeRunner();
  await assert.rejects(() => run([...TEST_FLAGS, "pg"], memoryIo(), { runner }), /no arguments/);
  await assert.rejects(() => run(["--node-id", "n"], memoryIo(), { runner }), /--parent-dataset/);
  assert.equal(runner.argvs.length, 0);
});
