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
  const { rows } = volumeRows({
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
    "NAME  KIND  NODE    SIZE   USED   STATE      BACKUPS   LAST BACKUP",
    "web   csi   node-a  1 GiB  5 MiB  staged x1  every 1h  none yet",
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

/** A FakeRunner with the parent, the given children, and `mount` listing `mounts`. */
function poolWith(children: Record<string, Record<string, string>>, mounts: [string, string][]) {
  const runner = new FakeRunner();
  const pool = new FakePool(runner);
  pool.add("tank/nomad");
  for (const [name, values] of Object.entries(children)) pool.add(`tank/nomad/${name}`, values);
  pool.mounts = mounts;
  return { runner, pool };
}

Deno.test("list shows host volumes beside CSI volumes, with their Nomad id and namespace", async () => {
  const { runner } = poolWith({
    pg: { "org.zfs-csi:managed": "yes", mounted: "yes" },
    ".host-prod_cache": {
      "org.zfs-csi:managed": "yes",
      "org.zfs-csi:host-volume-id": "d3c1a8e2-0000-4000-8000-000000000001",
      "org.zfs-csi:host-namespace": "prod",
      "org.zfs-csi:name": "cache",
      refquota: "1048576",
    },
    // Not a host volume's: no id of its own.
    ".host-prod_stray": { "org.zfs-csi:managed": "yes" },
    ".verify-1": { "org.zfs-csi:managed": "yes" },
  }, []);
  const io = memoryIo();
  assert.equal(await run([...TEST_FLAGS, "--json"], io, { runner }), 0);
  const rows = JSON.parse(io.stdout.join("\n")) as Array<Record<string, unknown>>;
  assert.deepEqual(rows.map((r) => [r.name, r.kind, r.volumeId, r.namespace]), [
    ["pg", "csi", "pg@node-a", undefined],
    ["cache", "host", "d3c1a8e2-0000-4000-8000-000000000001", "prod"],
  ]);
  const table = memoryIo();
  assert.equal(await run([...TEST_FLAGS], table, { runner }), 0);
  assert.match(table.stdout[2]!, /^cache +host \(prod\) +node-a +1 MiB /);
});

Deno.test("list counts mounts in Nomad's shape below a base it was not given, and says which flag is missing", async () => {
  const base = "/opt/nomad/data/client/csi/node/zfs-node-a";
  const { runner } = poolWith({ pg: { "org.zfs-csi:managed": "yes", mounted: "yes" } }, [
    ["tank/nomad/pg", "/mnt/tank/nomad/pg"],
    ["tank/nomad/pg", `${base}/staging/default/pg/rw-file-system-single-node-writer`],
    ["tank/nomad/pg", `${base}/per-alloc/0b1c/pg/rw-file-system-single-node-writer`],
    ["tank/nomad/pg", "/srv/pg"],
  ]);
  const io = memoryIo();
  assert.equal(await run([...TEST_FLAGS], io, { runner }), 0);
  assert.match(io.stdout[1]!, /published x1, staged x1, mounted elsewhere x1/);
  assert.deepEqual(io.stderr, [
    `list: mounts below ${base} have Nomad's staging/publish shape, and ${base} is not a ` +
    `--stage-publish-base-dir here: they are counted as staged/published; give ` +
    `--stage-publish-base-dir ${base} as the plugin has it`,
  ]);
});

Deno.test("list shows each volume's backup schedule and names the ones without", async () => {
  const { runner } = poolWith({
    own: { "org.zfs-csi:managed": "yes", "org.zfs-csi:backup-interval": "900" },
    off: { "org.zfs-csi:managed": "yes", "org.zfs-csi:parameters": '{"backup_interval":"0"}' },
    bare: { "org.zfs-csi:managed": "yes" },
  }, []);
  const store = ["--store", "file:///tmp/zfs-csi-list-store"];
  const io = memoryIo();
  assert.equal(await run([...TEST_FLAGS, ...store], io, { runner }), 0);
  const col = (name: string) => io.stdout.find((l) => l.startsWith(`${name} `))!;
  assert.match(col("own"), / every 15m +none yet$/);
  assert.match(col("off"), / off \(CreateVolume\) +-$/);
  assert.match(col("bare"), / none +-$/);
  assert.equal(io.stderr.length, 1);
  assert.match(
    io.stderr[0]!,
    /1 volume\(s\) have no backup schedule .*: bare; .*zfs-csi backup set VOLUME --interval 1h/,
  );
  // With the plugin's default, the bare one has it.
  const withDefault = memoryIo();
  assert.equal(
    await run([...TEST_FLAGS, ...store, "--backup-interval", "1h"], withDefault, { runner }),
    0,
  );
  assert.match(withDefault.stdout.find((l) => l.startsWith("bare "))!, / every 1h \(default\) /);
  assert.deepEqual(withDefault.stderr, []);
});

Deno.test("list --deleted shows the scratch datasets interrupted verifies left, judged by their mark", async () => {
  const { runner } = poolWith({
    ".verify-gone": { "org.zfs-csi:verify": "up=10 pid=7", used: "314572800" },
    ".verify-old": { used: "1024" },
  }, []);
  const clock = { uptimeSeconds: () => 10_000 };
  const io = memoryIo();
  assert.equal(await run([...TEST_FLAGS, "--deleted"], io, { runner, clock }), 0);
  const text = io.stdout.join("\n");
  assert.match(text, /Nothing is set aside below tank\/nomad\./);
  assert.match(
    text,
    /stale +300 MiB +tank\/nomad\/\.verify-gone +left by verify process 7, silent/,
  );
  assert.match(text, /unmarked +1 KiB +tank\/nomad\/\.verify-old +no org\.zfs-csi:verify mark/);
  const json = memoryIo();
  assert.equal(await run([...TEST_FLAGS, "--deleted", "--json"], json, { runner, clock }), 0);
  const rows = JSON.parse(json.stdout.join("\n")) as Array<Record<string, unknown>>;
  assert.deepEqual(rows.map((r) => [r.kind, r.hidden, r.state]), [
    ["verify-scratch", "tank/nomad/.verify-gone", "stale"],
    ["verify-scratch", "tank/nomad/.verify-old", "unmarked"],
  ]);
});

Deno.test("list says a missing parent dataset does not exist, when zfs said so", async () => {
  const runner = new FakeRunner();
  runner.on(["zfs", "get", "-Hp", "-r"], {
    code: 1,
    stderr: "cannot open 'tank/nomad': dataset does not exist\n",
  });
  runner.on(["zfs", "get", "-Hp", "-o", "name,property,value,source", "type", "tank/nomad"], {
    code: 1,
    stderr: "cannot open 'tank/nomad': dataset does not exist\n",
  });
  runner.on(["zfs", "get", "-Hp", "-o", "name,property,value,source", "type", "tank"], {
    stdout: "tank\ttype\tfilesystem\t-\n",
  });
  runner.onExact(["mount"], { stdout: "" });
  await assert.rejects(
    () => run([...TEST_FLAGS], memoryIo(), { runner }),
    (err) =>
      err instanceof Error &&
      /^Parent dataset "tank\/nomad" does not exist \(zfs said: cannot open 'tank\/nomad': dataset does not exist\): give --parent-dataset/
        .test(err.message) &&
      !/not visible/.test(err.message),
  );
  // zfs knows no such pool.
  const nopool = new FakeRunner();
  nopool.on(["zfs", "get"], { code: 1, stderr: "cannot open 'tank': dataset does not exist\n" });
  nopool.onExact(["mount"], { stdout: "" });
  await assert.rejects(
    () => run([...TEST_FLAGS], memoryIo(), { runner: nopool }),
    /zfs knows no pool "tank".*zpool import tank/,
  );
  // zfs itself could not answer: the hedge stays.
  const down = new FakeRunner();
  down.on(["zfs", "get", "-Hp", "-r"], {
    code: 1,
    stderr: "cannot open 'tank/nomad': dataset does not exist\n",
  });
  down.on(["zfs", "get"], { code: 1, stderr: "connect: Connection refused\n" });
  down.onExact(["mount"], { stdout: "" });
  await assert.rejects(() => run([...TEST_FLAGS], memoryIo(), { runner: down }), /not visible/);
});
