/**
 * The operator subcommands as they ship: main.ts under `deno run` with the production
 * permission flags, on a real pool, next to a running plugin. list after create and stage,
 * undelete after DeleteVolume (the data is back), adopt, purge (what is marked goes, what holds
 * a foreign snapshot stays), and the demo driving the plugin over its socket. With a store:
 * backup set, snapshots, restore (from the store and from a local snapshot, never over a
 * dataset), a verify stopped by a signal (its scratch dataset goes), and scratch datasets left
 * by verifies that are gone (listed, purged, and swept by the plugin when it starts).
 */

import assert from "node:assert/strict";
import { fileURLToPath } from "node:url";
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
        assert.match(table.stdout, /^NAME +KIND +NODE +SIZE +USED +STATE +BACKUPS +LAST BACKUP\n/);
        assert.match(
          table.stdout,
          /\npg +csi +node-a +64 MiB +\S+ MiB +published x1, staged x1 +none +-\n/,
        );
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

const ROOT = fileURLToPath(new URL("../../", import.meta.url));

/** SHA-256 of a file, hex. */
async function sha256(path: string): Promise<string> {
  const digest = await crypto.subtle.digest("SHA-256", await Deno.readFile(path));
  return [...new Uint8Array(digest)].map((b) => b.toString(16).padStart(2, "0")).join("");
}

Deno.test("cli: backup set, snapshots, restore and an interrupted verify, with a store", async (t) => {
  await using pool = await TestPool.create();
  const storeDir = `${pool.dir}/store`;
  await Deno.mkdir(storeDir);
  const scope = { extraDirs: [storeDir] };
  const start = () =>
    PluginProcess.start({
      parentDataset: pool.parent,
      dir: pool.dir,
      extraArgs: ["--store", `file://${storeDir}`],
      scope,
    });
  let plugin = await start();
  try {
    const flags = [
      "--parent-dataset",
      pool.parent,
      "--node-id",
      "node-a",
      "--store",
      `file://${storeDir}`,
      "--stage-publish-base-dir",
      plugin.baseDir,
    ];
    const cli = (args: string[]) => runZfsCsi(pool.dir, args, { scope });
    const dataset = `${pool.parent}/data`;
    let digest = "";

    await t.step(
      "a volume with 144 MiB of data, a local snapshot and two in the store",
      async () => {
        const vol = (await plugin.client.controller(
          "CreateVolume",
          createVolumeRequest("data", {
            capacity_range: { required_bytes: String(256 * 1024 * 1024), limit_bytes: "0" },
          }),
        )).volume;
        const claim = await claimVolume(plugin, vol, "alloc-1");
        const bytes = new Uint8Array(96 * 1024 * 1024);
        for (let i = 0; i < bytes.length; i += 65536) {
          crypto.getRandomValues(bytes.subarray(i, i + 65536));
        }
        await Deno.writeFile(`${claim.target}/table.bin`, bytes);
        digest = await sha256(`${claim.target}/table.bin`);
        await claim.release();
        await sh("zfs", "snapshot", `${dataset}@manual`);
        const snap = (await plugin.client.controller(
          "CreateSnapshot",
          { source_volume_id: "data@node-a", name: "nightly", parameters: {} },
          180_000,
        )).snapshot;
        assert.equal(snap.ready_to_use, true);
        // A second one, an increment on the first: a verify of it receives two streams.
        const again = await claimVolume(plugin, vol, "alloc-2");
        await Deno.writeFile(`${again.target}/more.bin`, bytes.subarray(0, 48 * 1024 * 1024));
        await again.release();
        const later = (await plugin.client.controller(
          "CreateSnapshot",
          { source_volume_id: "data@node-a", name: "later", parameters: {} },
          180_000,
        )).snapshot;
        // The volume's size at the snapshot, not the stream's bytes (the increment's 48 MiB).
        assert.equal(
          Number(later.size_bytes),
          Number(await pool.get(`${dataset}@.stored-later`, "referenced")),
        );
        assert.ok(Number(later.size_bytes) > 140 * 1024 * 1024, later.size_bytes);
      },
    );

    await t.step("backup set gives the volume a schedule, and list shows it", async () => {
      const r = await cli(["backup", "set", ...flags, "data", "--interval", "6h"]);
      assert.equal(r.code, 0, r.stderr);
      assert.match(
        r.stdout,
        /^Volume "data": backups every 6h \(was none of its own: the plugin's --backup-interval\)/,
      );
      assert.equal(await pool.get(dataset, "org.zfs-csi:backup-interval"), "21600");
      const list = await cli(["list", ...flags]);
      assert.match(list.stdout, /\ndata +csi +node-a +256 MiB +\S+ MiB +\S.* +every 6h +/);
      const typo = await cli(["backup", "set", ...flags, "data", "--intervl", "1h"]);
      assert.equal(typo.code, 2);
      assert.equal(
        typo.stderr,
        "zfs-csi backup: unknown flag --intervl; did you mean --interval? (see --help)\n",
      );
    });

    await t.step("snapshots lists the local and the stored ones, newest first", async () => {
      const r = await cli(["snapshots", ...flags, "data", "--json"]);
      assert.equal(r.code, 0, r.stderr);
      const rows = JSON.parse(r.stdout) as Array<Record<string, unknown>>;
      assert.deepEqual(rows.map((x) => [x.name, x.where, x.restorable]), [
        [".stored-later", "both", true],
        [".stored-nightly", "both", true],
        ["manual", "local", true],
      ]);
      const text = await cli(["snapshots", ...flags, "data"]);
      assert.match(text.stdout, /^SNAPSHOT +CREATED +AGE +SIZE +WHERE +KIND +RESTORE\n/);
    });

    await t.step("restore makes new volumes from the store and from a local snapshot", async () => {
      const r = await cli(["restore", ...flags, "data", "--to", "data-copy"]);
      assert.equal(r.code, 0, r.stderr);
      assert.match(
        r.stdout,
        /^Restored store:data:[0-9a-f]{16} .* into ".*\/data-copy" \(received/,
      );
      assert.equal(await pool.get(`${pool.parent}/data-copy`, "org.zfs-csi:managed"), "yes");
      assert.equal(
        await pool.get(`${pool.parent}/data-copy`, "refquota"),
        String(256 * 1024 * 1024),
      );
      const copy = await claimVolume(
        plugin,
        { volume_id: "data-copy@node-a", volume_context: {} },
        "a2",
      );
      assert.equal(await sha256(`${copy.target}/table.bin`), digest);
      await copy.release();
      const clone = await cli(["restore", ...flags, "data@manual", "--to", "data-clone"]);
      assert.equal(clone.code, 0, clone.stderr);
      assert.equal(await pool.get(`${pool.parent}/data-clone`, "origin"), `${dataset}@manual`);
      const before = await pool.datasets();
      const over = await cli(["restore", ...flags, "data", "--to", "data-copy"]);
      assert.equal(over.code, 1);
      assert.match(
        over.stderr,
        /data-copy" exists: restore makes a new volume and never writes over one/,
      );
      assert.deepEqual(await pool.datasets(), before);
    });

    await t.step("a verify stopped by a signal removes its scratch dataset", async () => {
      const child = new Deno.Command(Deno.execPath(), {
        args: [
          "run",
          "--quiet",
          "--frozen",
          ...PluginProcess.flags(pool.dir, scope),
          `${ROOT}main.ts`,
          "verify",
          ...flags,
          "data",
        ],
        stdin: "null",
        stdout: "piped",
        stderr: "piped",
      }).spawn();
      const stderr = new Response(child.stderr).text();
      const stdout = new Response(child.stdout).text();
      // Signalled once the full stream is received (a snapshot below the scratch dataset) and
      // the increment is on its way: what stays then is the full size of the volume.
      const deadline = Date.now() + 120_000;
      while (Date.now() < deadline) {
        const snaps = await sh(
          "zfs",
          "list",
          "-H",
          "-r",
          "-t",
          "snapshot",
          "-o",
          "name",
          pool.parent,
        );
        if (snaps.includes("/.verify-")) break;
        await new Promise((r) => setTimeout(r, 50));
      }
      child.kill("SIGINT");
      const status = await child.status;
      const err = await stderr;
      await stdout;
      assert.equal(status.code, 130, err);
      assert.match(err, /verify: receiving 2 stream\(s\)/);
      assert.match(err, /verify: SIGINT: stopping, then removing /);
      assert.match(err, /verify: interrupted; scratch dataset .*\/\.verify-[0-9a-f]{16} removed/);
      assert.deepEqual((await pool.datasets()).filter((d) => d.includes(".verify-")), []);
      // Run again, it verifies.
      const again = await cli(["verify", ...flags, "data"]);
      assert.equal(again.code, 0, again.stderr);
      assert.match(again.stdout, /^Verified store:data:/);
    });

    await t.step(
      "scratch of a verify that is gone is listed, purged, and swept by the plugin at start",
      async () => {
        // What a verify killed before the machine restarted leaves: marked at an uptime ahead of
        // this boot's, holding received data; beside it one made by hand, never removed.
        const left = (name: string) => `${pool.parent}/.verify-${name}`;
        const made = async (name: string, pid: number) => {
          await sh(
            "zfs",
            "create",
            "-o",
            "canmount=off",
            "-o",
            `org.zfs-csi:verify=up=999999999 pid=${pid}`,
            left(name),
          );
          await sh("sh", "-c", `zfs send ${dataset}@manual | zfs receive -u ${left(name)}/data`);
        };
        await made("dead", 4242);
        await sh("zfs", "create", "-o", "canmount=off", left("byhand"));
        const listed = await cli(["list", ...flags, "--deleted"]);
        assert.equal(listed.code, 0, listed.stderr);
        assert.match(
          listed.stdout,
          /stale +\S+ MiB +\S+\/\.verify-dead +left by verify process 4242 before the machine restarted/,
        );
        assert.match(
          listed.stdout,
          /unmarked +[\d.]+ \w+ +\S+\/\.verify-byhand +no org\.zfs-csi:verify mark/,
        );
        const dry = await cli(["purge", ...flags]);
        assert.match(dry.stdout, /\.verify-dead/);
        assert.ok((await pool.datasets()).includes(left("dead")));
        const purged = await cli(["purge", ...flags, "--yes"]);
        assert.equal(purged.code, 0, purged.stderr);
        assert.match(purged.stdout, /Removed .*\/\.verify-dead \(\S+ MiB\)/);
        assert.ok(!(await pool.datasets()).includes(left("dead")));
        // The plugin's own sweep, at its start, takes another one.
        await made("dead2", 4343);
        await plugin.stop("SIGTERM");
        plugin = await start();
        const deadline = Date.now() + 60_000;
        while (Date.now() < deadline) {
          const names = await pool.datasets();
          if (!names.includes(left("dead2"))) break;
          await new Promise((r) => setTimeout(r, 250));
        }
        const names = await pool.datasets();
        assert.ok(!names.includes(left("dead2")), names.join("\n"));
        assert.ok(names.includes(left("byhand")), "an unmarked one is never removed");
        assert.ok(
          plugin.logs().some((l) =>
            /removed the scratch dataset of an interrupted zfs-csi verify/.test(l)
          ),
          plugin.logs().join("\n"),
        );
      },
    );

    await t.step("a missing parent dataset is said not to exist", async () => {
      const r = await cli(["list", "--parent-dataset", `${pool.pool}/nothing`, "--node-id", "n"]);
      assert.equal(r.code, 1);
      assert.match(
        r.stderr,
        /^zfs-csi list: Parent dataset ".*\/nothing" does not exist \(zfs said: /,
      );
      assert.doesNotMatch(r.stderr, /not visible/);
    });
  } finally {
    await plugin.stop("SIGKILL");
  }
});
