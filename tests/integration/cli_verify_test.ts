/**
 * `zfs-csi verify` as it ships (main.ts under `deno run` with the production flags and the file
 * store's grant) against a directory store the plugin wrote: a good backup restores into a
 * scratch dataset, checks out and leaves nothing behind; a damaged stream is refused, and leaves
 * nothing behind either; a store outside the build's grant is refused in one line.
 */

import assert from "node:assert/strict";
import { claimVolume, createVolumeRequest } from "../support/nomad.ts";
import { PluginProcess, runZfsCsi } from "../support/plugin_process.ts";
import { TestPool } from "../support/zfs_pool.ts";

const MiB = 1024 * 1024;

/** `zfs-csi <args>` with the file store's grant when `storeDir` is given. */
async function zfsCsi(dir: string, storeDir: string | undefined, args: string[]) {
  return await runZfsCsi(dir, args, storeDir ? { scope: { extraDirs: [storeDir] } } : {});
}

Deno.test("cli: verify restores a stored backup into a scratch dataset, checks it, removes it", async (t) => {
  await using pool = await TestPool.create();
  const storeDir = await Deno.makeTempDir({ prefix: "zfs-csi-verify-store-" });
  try {
    await using plugin = await PluginProcess.start({
      parentDataset: pool.parent,
      dir: pool.dir,
      extraArgs: ["--store", `file://${storeDir}`],
      scope: { extraDirs: [storeDir] },
    });
    const c = plugin.client;
    const flags = [
      "--parent-dataset",
      pool.parent,
      "--node-id",
      "node-a",
      "--store",
      `file://${storeDir}`,
    ];
    const vol = (await c.controller("CreateVolume", createVolumeRequest("data"))).volume;
    const claim = await claimVolume(plugin, vol, "alloc-1");
    const bytes = new Uint8Array(8 * MiB);
    for (let i = 0; i < bytes.length; i += 65536) {
      crypto.getRandomValues(bytes.subarray(i, i + 65536));
    }
    await Deno.writeFile(`${claim.target}/table.bin`, bytes);
    await claim.release();
    const snap = (await c.controller(
      "CreateSnapshot",
      { source_volume_id: "data@node-a", name: "nightly", parameters: {} },
      120_000,
    )).snapshot;
    assert.equal(snap.ready_to_use, true);

    await t.step(
      "a good backup verifies, with progress lines, and no scratch dataset stays",
      async () => {
        const r = await zfsCsi(pool.dir, storeDir, ["verify", ...flags, "data", "--json"]);
        assert.equal(r.code, 0, r.stderr);
        const report = JSON.parse(r.stdout);
        assert.equal(report.snapshotId, snap.snapshot_id);
        assert.equal(report.streams, 1);
        // The node still has the snapshot it sent: the restored one refers to as much.
        assert.equal(report.localSnapshot, "same");
        assert.ok(report.referencedBytes >= 8 * MiB, `referenced ${report.referencedBytes}`);
        assert.match(r.stderr, /^verify: receiving 1 stream\(s\)/m);
        assert.match(r.stderr, /^verify data: .* of .* \(100%\), .*\/s$/m);
        assert.ok(!(await pool.datasets()).some((d) => d.includes(".verify-")));
        const text = await zfsCsi(pool.dir, storeDir, ["verify", ...flags, "data"]);
        assert.equal(text.code, 0, text.stderr);
        assert.match(text.stdout, /^Verified store:data:[0-9a-f]{16} of "data" .*removed\.\n$/);
      },
    );

    await t.step("a damaged stream is refused and leaves nothing", async () => {
      const streams = `${storeDir}/v1/volumes/data/streams`;
      const [stream] = (await Array.fromAsync(Deno.readDir(streams))).map((e) => e.name);
      const file = `${streams}/${stream}`;
      const stored = await Deno.readFile(file);
      stored[Math.floor(stored.length / 2)]! ^= 0xff;
      await Deno.writeFile(file, stored);
      const r = await zfsCsi(pool.dir, storeDir, ["verify", ...flags, "data"]);
      assert.equal(r.code, 1, r.stdout);
      assert.match(r.stderr, /^zfs-csi verify: .*is not what its manifest says \(SHA-256/m);
      // zfs-fuse's daemon may finish removing a stopped receive a moment later.
      for (let i = 0; i < 40 && (await pool.datasets()).some((d) => d.includes(".verify-")); i++) {
        await new Promise((res) => setTimeout(res, 250));
      }
      assert.ok(!(await pool.datasets()).some((d) => d.includes(".verify-")));
      assert.deepEqual(await pool.datasets(), [pool.pool, pool.parent, `${pool.parent}/data`]);
    });

    await t.step("a store outside the build's grant is refused in one line", async () => {
      const r = await zfsCsi(pool.dir, undefined, ["verify", ...flags, "data"]);
      assert.equal(r.code, 2);
      assert.equal(r.stderr.trimEnd().split("\n").length, 1, r.stderr);
      assert.match(r.stderr, new RegExp(`ZFS_CSI_EXTRA_DIRS=${storeDir}`));
    });
  } finally {
    await Deno.remove(storeDir, { recursive: true });
  }
});
