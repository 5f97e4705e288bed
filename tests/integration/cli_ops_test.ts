/**
 * The operator subcommands as they ship: main.ts under `deno run` with the production
 * permission flags, on a real pool, next to a running plugin. list after create and stage,
 * undelete after DeleteVolume (the data is back), adopt, purge (what is marked goes, what holds
 * a foreign snapshot stays), and the demo driving the plugin over its socket.
 */

import assert from "node:assert/strict";
import { claimVolume, createVolumeRequest } from "../support/nomad.ts";
import { PluginProcess, runZfsCsi } from "../support/plugin_process.ts";
import { sh, TestPool, tryRun } from "../support/zfs_pool.ts";

/** What the test writes into a volume: random, so nothing compresses it. */
const DATA = new Uint8Array(3 * 1024 * 1024);
for (let i = 0; i < DATA.length; i += 65536) crypto.getRandomValues(DATA.subarray(i, i + 65536));

Deno.test("cli: list, undelete, adopt and purge on a real pool beside the plugin", async (t) => {
  await using pool = await TestPool.create();
  await using plugin = await PluginProcess.start({ parentDataset: pool.parent, dir: pool.dir });
  const flags = [
    "--parent-dataset",
    pool.parent,
    "--node-id",
    "node-a",
    "--stage-publish-base-dir",
    plugin.baseDir,
  ];
  const c = plugin.client;

  await t.step(
    "list shows node, size, used and staged/published after create and stage",
    async () => {
      const pg = (await c.controller("CreateVolume", createVolumeRequest("pg"))).volume;
      await c.controller("CreateVolume", createVolumeRequest("idle"));
      const claim = await claimVolume(plugin, pg, "alloc-1");
      try {
        await Deno.writeFile(`${claim.target}/data.bin`, DATA);
        await sh("sync");
        // zfs-fuse charges written blocks to `used` only when its transaction
        // group syncs, which `sync` does not always wait for under load.
        const deadline = Date.now() + 30_000;
        while (
          Number(await pool.get(`${pool.parent}/pg`, "used")) < 2 * 1024 * 1024 &&
          Date.now() < deadline
        ) await new Promise((r) => setTimeout(r, 250));
        const json = await runZfsCsi(pool.dir, ["list", ...flags, "--json"]);
        assert.equal(json.code, 0, json.stderr);
        const rows = JSON.parse(json.stdout) as Array<Record<string, unknown>>;
        assert.deepEqual(rows.map((r) => r.name), ["idle", "pg"]);
        const row = rows[1]!;
        assert.equal(row.volumeId, "pg@node-a");
        assert.equal(row.node, "node-a");
        assert.equal(row.sizeBytes, 64 * 1024 * 1024);
        assert.equal(row.usedBytes, Number(await pool.get(`${pool.parent}/pg`, "used")));
        assert.ok((row.usedBytes as number) >= 2 * 1024 * 1024, `used ${row.usedBytes}`);
        assert.deepEqual(row.published, [claim.target]);
        assert.equal((row.staged as string[]).length, 1);
        assert.deepEqual(rows[0]!.staged, []);
        const table = await runZfsCsi(pool.dir, ["list", ...flags]);
        assert.equal(table.code, 0, table.stderr);
        assert.match(table.stdout, /^NAME +NODE +SIZE +USED +STATE +LAST BACKUP\n/);
        assert.match(table.stdout, /\npg +node-a +64 MiB +\S+ MiB +published x1, staged x1 +-\n/);
      } finally {
        await claim.release();
      }
    },
  );

  await t.step("undelete after DeleteVolume brings the volume and its data back", async () => {
    await c.controller("DeleteVolume", { volume_id: "pg@node-a" });
    const gone = await runZfsCsi(pool.dir, ["list", ...flags, "--json"]);
    assert.deepEqual(JSON.parse(gone.stdout).map((r: { name: string }) => r.name), ["idle"]);
    const deleted = await runZfsCsi(pool.dir, ["list", ...flags, "--deleted", "--json"]);
    const [aside] = JSON.parse(deleted.stdout);
    assert.equal(aside.deletedName, `${pool.parent}/pg`);
    const r = await runZfsCsi(pool.dir, ["undelete", ...flags, "pg"]);
    assert.equal(r.code, 0, r.stderr);
    assert.match(r.stdout, /Undeleted volume ".*\/pg"/);
    assert.equal(await pool.get(`${pool.parent}/pg`, "org.zfs-csi:deleted-at"), "-");
    assert.equal(await pool.get(`${pool.parent}/pg`, "canmount"), "on");
    // Nomad sees it again, and the data is there.
    const listed = await c.controller("ListVolumes", {});
    assert.ok(
      listed.entries.some((e: { volume: { volume_id: string } }) =>
        e.volume.volume_id === "pg@node-a"
      ),
    );
    const claim = await claimVolume(
      plugin,
      { volume_id: "pg@node-a", volume_context: {} },
      "alloc-2",
    );
    try {
      assert.deepEqual(await Deno.readFile(`${claim.target}/data.bin`), DATA);
    } finally {
      await claim.release();
    }
  });

  await t.step("undelete refuses a name taken since, in one line, changing nothing", async () => {
    await c.controller("DeleteVolume", { volume_id: "idle@node-a" });
    await c.controller("CreateVolume", createVolumeRequest("idle"));
    const before = await pool.datasets();
    const r = await runZfsCsi(pool.dir, ["undelete", ...flags, "idle"]);
    assert.equal(r.code, 1);
    assert.equal(r.stderr.trimEnd().split("\n").length, 1, r.stderr);
    assert.match(r.stderr, /^zfs-csi undelete: ".*\/idle" exists .*--as NAME/);
    assert.deepEqual(await pool.datasets(), before);
  });

  await t.step("adopt hands a dataset made by hand over, and the node then stages it", async () => {
    await sh("zfs", "create", `${pool.parent}/legacy`);
    const volume = { volume_id: "legacy@node-a", volume_context: {} };
    await assert.rejects(claimVolume(plugin, volume, "alloc-0"), /not managed by zfs-csi/);
    const r = await runZfsCsi(pool.dir, ["adopt", ...flags, "legacy"]);
    assert.equal(r.code, 0, r.stderr);
    assert.match(r.stdout, /volume "legacy@node-a"/);
    assert.equal(await pool.get(`${pool.parent}/legacy`, "org.zfs-csi:managed"), "yes");
    const claim = await claimVolume(plugin, volume, "alloc-3");
    await claim.release();
    const outside = await runZfsCsi(pool.dir, ["adopt", ...flags, `${pool.pool}/elsewhere`]);
    assert.equal(outside.code, 1);
    assert.match(outside.stderr, /cannot be a volume/);
  });

  await t.step(
    "purge destroys what is set aside now and keeps what holds a foreign snapshot",
    async () => {
      await c.controller("DeleteVolume", { volume_id: "idle@node-a" });
      await c.controller("DeleteVolume", { volume_id: "pg@node-a" });
      const deleted = JSON.parse(
        (await runZfsCsi(pool.dir, ["list", ...flags, "--deleted", "--json"])).stdout,
      );
      assert.equal(deleted.length, 3);
      const pgAside =
        deleted.find((d: { deletedName: string }) => d.deletedName === `${pool.parent}/pg`).hidden;
      await sh("zfs", "snapshot", `${pgAside}@operator-keep`);
      const dry = await runZfsCsi(pool.dir, ["purge", ...flags]);
      assert.equal(dry.code, 0, dry.stderr);
      assert.match(dry.stdout, /--yes to destroy these 3 now/);
      assert.equal((await pool.datasets()).filter((d) => d.includes(".deleted-")).length, 3);
      const r = await runZfsCsi(pool.dir, ["purge", ...flags, "--yes", "--json"]);
      assert.equal(r.code, 0, r.stderr);
      const outcomes = JSON.parse(r.stdout) as Array<
        { hidden: string; purged: boolean; reason?: string }
      >;
      assert.deepEqual(outcomes.map((o) => o.purged).sort(), [false, true, true]);
      const kept = outcomes.find((o) => !o.purged)!;
      assert.equal(kept.hidden, pgAside);
      assert.match(kept.reason ?? "", /operator-keep/);
      assert.deepEqual((await pool.datasets()).filter((d) => d.includes(".deleted-")), [pgAside]);
      assert.equal((await tryRun("zfs", "list", `${pgAside}@operator-keep`)).code, 0);
    },
  );
});

Deno.test("cli: demo drives a running plugin through a volume's life over its socket", async () => {
  await using pool = await TestPool.create();
  await using plugin = await PluginProcess.start({ parentDataset: pool.parent, dir: pool.dir });
  const args = [
    "demo",
    "--endpoint",
    `unix://${plugin.socketPath}`,
    "--stage-publish-base-dir",
    plugin.baseDir,
  ];
  const r = await runZfsCsi(pool.dir, args);
  assert.equal(r.code, 0, r.stderr);
  const steps = [
    "Probe",
    "CreateVolume",
    "NodeStageVolume",
    "NodePublishVolume",
    "write a file",
    "NodeGetVolumeStats",
    "ListVolumes",
    "NodeUnpublishVolume",
    "NodeUnstageVolume",
    "DeleteVolume",
  ];
  const lines = r.stdout.split("\n").filter((l) => /^\s*\d+\. /.test(l));
  assert.deepEqual(lines.map((l) => /^\s*\d+\. (.*?) \(\d+ ms\)/.exec(l)?.[1]), steps);
  assert.match(r.stdout, /write a file .*read back the same/);
  assert.match(r.stdout, /ListVolumes .*ours among them/);
  // Each step was the plugin's: its log has one line per call, all OK.
  const calls = plugin.records().filter((rec) =>
    typeof rec.method === "string" && rec.method !== "Probe"
  );
  for (const m of steps.filter((s) => /^[A-Z]/.test(s) && s !== "Probe")) {
    assert.ok(
      calls.some((rec) => rec.method === m && rec.code === "OK"),
      `${m} in the plugin's log`,
    );
  }
  // Nothing is left mounted, and the volume was set aside by the delete.
  assert.doesNotMatch(await sh("mount"), new RegExp(`${plugin.baseDir}/`));
  assert.ok((await pool.datasets()).some((d) => /\.deleted-\d+-zfs-csi-demo$/.test(d)));

  // A socket outside the build's directories is refused in one line before anything is dialled.
  const outside = await runZfsCsi(pool.dir, [
    "demo",
    "--endpoint",
    "unix:///run/elsewhere/csi.sock",
    "--stage-publish-base-dir",
    plugin.baseDir,
  ]);
  assert.equal(outside.code, 2);
  assert.match(
    outside.stderr,
    /^zfs-csi demo: this build may not read and write "\/run\/elsewhere\/csi.sock"; rebuild with ZFS_CSI_EXTRA_DIRS=\/run\/elsewhere/,
  );
});
