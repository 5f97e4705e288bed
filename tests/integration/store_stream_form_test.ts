/**
 * Stream forms on the machine's own ZFS: on OpenZFS (the VM, tools/openzfs-vm/) a volume with
 * compression=lz4 and 1 MiB records is sent `zfs send -c -L -e`, its stored streams take about
 * what the pool holds (not its logical size), and they restore through the plugin, `zfs-csi
 * verify` and the manual recipe of docs/backups.md; a pool without the features they need is
 * refused before anything is received. On zfs-fuse (pool version 23: no feature flags, no `-c`,
 * no lz4: the volume has compression=gzip) streams stay plain, byte for byte what `zfs send` gives, as before; a manifest claiming a
 * compressed form is refused there before anything is received.
 *
 * The figures (stored bytes against the pool's `used` and the plain send) are printed for
 * docs/benchmarks.md; ZFS_CSI_FORM_MIB sets the data's size (default 64 MiB; the byte rows of
 * docs/benchmarks.md use 256).
 */

import assert from "node:assert/strict";
import { Code } from "../../src/errors.ts";
import { encodeJson } from "../../src/store/chain.ts";
import { manifestKey } from "../../src/store/layout.ts";
import { parseStoredSnapshotId } from "../../src/store/snapshot_ids.ts";
import { mountedHash, recipe, runRecipe, toolDir } from "../support/manual_recipe.ts";
import type { CallError } from "../support/csi_client.ts";
import { claimVolume, createVolumeRequest } from "../support/nomad.ts";
import { PluginProcess, runZfsCsi } from "../support/plugin_process.ts";
import { measureStreamCosts, openZfs, type StreamCost } from "../support/stream_bytes.ts";
import { treeHash } from "../support/tree_hash.ts";
import { sh, TestPool, tryRun } from "../support/zfs_pool.ts";

const MiB = 1024 * 1024;
/** The byte rows use 256 MiB (ZFS_CSI_FORM_MIB=256); the suite's runs take less. */
const DATA_MIB = Number(Deno.env.get("ZFS_CSI_FORM_MIB") ?? "64");
const CHANGED_MIB = Math.max(1, Math.floor(DATA_MIB / 8));
/** The bound: stored bytes at most 1.05 times what the pool holds. */
const STORED_OVER_USED = 1.05;

function figures(what: string, c: StreamCost): string {
  const m = (n: number) => `${(n / MiB).toFixed(1)} MiB`;
  return `${what}: stored ${m(c.stored)} = ${(c.stored / c.used).toFixed(3)}x used ` +
    `(${m(c.used)}); plain zfs send ${m(c.plain)} = ${(c.plain / c.used).toFixed(3)}x used`;
}

Deno.test("store: streams take the form the pool allows, cost about what the pool holds, and restore", async (t) => {
  const openzfs = await openZfs();
  await using pool = await TestPool.create(1536 + DATA_MIB * 4);
  const storeDir = await Deno.makeTempDir({ prefix: "zfs-csi-store-form-" });
  try {
    await using plugin = await PluginProcess.start({
      parentDataset: pool.parent,
      dir: pool.dir,
      nodeId: "node-a",
      extraArgs: ["--store", `file://${storeDir}`],
      scope: { extraDirs: [storeDir] },
    });
    const c = plugin.client;
    // zfs-fuse has no lz4 (and no records over 128 KiB): gzip shows its plain streams.
    const parameters: Record<string, string> = openzfs
      ? { compression: "lz4", recordsize: "1M" }
      : { compression: "gzip" };
    const costs = await measureStreamCosts({
      plugin,
      storeDir,
      name: "text",
      parameters,
      dataMiB: DATA_MIB,
      changedMiB: CHANGED_MIB,
    });
    const { full, increment } = costs;
    Deno.stderr.writeSync(new TextEncoder().encode(
      `${openzfs ? "OpenZFS" : "zfs-fuse"}, compression=${parameters.compression}, ` +
        `${DATA_MIB} MiB of text, ${CHANGED_MIB} MiB rewritten:\n  ` +
        `${figures("full", full)}\n  ${figures("increment", increment)}\n  ` +
        `forms ${JSON.stringify(full.manifest.form)} / ${
          JSON.stringify(increment.manifest.form)
        }\n`,
    ));

    await t.step("each manifest records the form its stream was sent in", () => {
      if (!openzfs) {
        const plain = { compressed: false, largeBlocks: false, embedded: false, features: [] };
        assert.deepEqual(full.manifest.form, plain);
        assert.deepEqual(increment.manifest.form, plain);
        return;
      }
      for (const m of [full.manifest, increment.manifest]) {
        assert.equal(m.form?.compressed, true);
        assert.equal(m.form?.embedded, true);
        // 1 MiB records: large blocks, sent whole; the increment keeps its chain's -L.
        assert.equal(m.form?.largeBlocks, true);
        for (const f of ["compressed", "lz4", "large_blocks"]) {
          assert.ok(m.form?.features?.includes(f), `${f} in ${m.form?.features}`);
        }
      }
    });

    await t.step(
      "stored bytes: about what the pool holds on OpenZFS, unchanged on zfs-fuse",
      () => {
        if (!openzfs) {
          // Plain streams, as before: exactly the bytes of a plain zfs send.
          assert.equal(full.stored, full.plain);
          assert.equal(increment.stored, increment.plain);
          return;
        }
        assert.ok(full.stored <= STORED_OVER_USED * full.used, figures("full", full));
        assert.ok(increment.stored <= STORED_OVER_USED * increment.used, figures("inc", increment));
        // What it saves: the plain stream carries the logical size.
        assert.ok(full.plain > 1.5 * full.stored, figures("full", full));
      },
    );

    const source = await claimVolume(plugin, costs.volume, "alloc-hash");
    const sourceHash = await treeHash(source.target);
    await source.release();

    await t.step(
      "a restore through the plugin has the data and the volume's own compression",
      async () => {
        const restored = (await c.controller(
          "CreateVolume",
          createVolumeRequest("text-restored", {
            capacity_range: { required_bytes: String(DATA_MIB * 2 * MiB), limit_bytes: "0" },
            parameters,
            volume_content_source: { snapshot: { snapshot_id: costs.incrementId } },
          }),
          600_000,
        )).volume;
        const dataset: string = restored.volume_context.dataset;
        const claim = await claimVolume(plugin, restored, "alloc-restored");
        assert.equal(await treeHash(claim.target), sourceHash);
        await claim.release();
        // The property is the volume's own (its parameter), not the stream's; the received
        // blocks stay as compressed as they were sent.
        assert.equal(await pool.get(dataset, "compression"), parameters.compression);
        if (openzfs) {
          const used = Number(
            (await sh("zfs", "get", "-Hp", "-o", "value", "used", dataset)).trim(),
          );
          assert.ok(used < 1.1 * (full.used + increment.used), `restored used ${used}`);
        }
      },
    );

    const flags = ["--parent-dataset", pool.parent, "--node-id", "node-a"];
    const store = ["--store", `file://${storeDir}`];
    const grant = { scope: { extraDirs: [storeDir] } };

    await t.step("zfs-csi verify restores the chain and names its forms", async () => {
      const r = await runZfsCsi(pool.dir, ["verify", ...flags, ...store, "text", "--json"], grant);
      assert.equal(r.code, 0, r.stderr);
      const report = JSON.parse(r.stdout);
      assert.equal(report.streams, 2);
      const form = openzfs
        ? "compressed, large-block, embedded-data stream (zfs send -c -L -e)"
        : "plain stream (zfs send)";
      assert.deepEqual(report.forms, [form, form]);
      assert.match(
        r.stderr,
        new RegExp(`^verify: receiving 2 stream\\(s\\).*; ${escape(form)}$`, "m"),
      );
    });

    await t.step("the manual recipe of docs/backups.md restores it", async () => {
      const { script } = await recipe();
      const target = `${pool.pool}/manual`;
      const run = await runRecipe(script, {
        STORE_DIR: storeDir,
        VOLUME: "text",
        SNAPSHOT: "",
        TARGET: target,
        PATH: await toolDir(pool.dir),
      });
      assert.equal(run.code, 0, run.output);
      const form = openzfs ? "compressed largeBlocks embedded " : "";
      assert.match(run.output, new RegExp(`bytes; form: ${form}\\)`));
      assert.equal(await mountedHash(target, `${pool.mountRoot}/manual`), sourceHash);
      await sh("zfs", "destroy", "-r", target);
    });

    await t.step(
      "a pool that cannot receive the form is refused before anything is received",
      async () => {
        if (openzfs) {
          // A pool with no features enabled: it lacks what the streams' headers name.
          const img = `${pool.dir}/bare.img`;
          await sh("truncate", "-s", "512M", img);
          const bare = `${pool.pool}bare`;
          await sh("zpool", "create", "-d", "-m", `${pool.dir}/bare`, bare, img);
          try {
            await sh("zfs", "create", `${bare}/nomad`);
            const r = await runZfsCsi(pool.dir, [
              "verify",
              "--parent-dataset",
              `${bare}/nomad`,
              "--node-id",
              "node-b",
              ...store,
              "text",
            ], grant);
            assert.notEqual(r.code, 0);
            assert.match(
              r.stderr,
              /cannot receive stored snapshot ".*" \(guid \d+\) of volume "text"/,
            );
            assert.match(r.stderr, /pool ".*bare" lacks .*feature@lz4_compress \(disabled/);
            assert.match(r.stderr, /Nothing was received/);
            const left = await sh("zfs", "list", "-H", "-r", "-o", "name", `${bare}/nomad`);
            assert.deepEqual(left.trim().split("\n"), [`${bare}/nomad`]);
          } finally {
            await tryRun("zpool", "destroy", bare);
          }
          return;
        }
        // zfs-fuse: the full stream's manifest says compressed (as an OpenZFS node would write):
        // the restore refuses it before receiving, naming the form and what the pool lacks.
        const ref = parseStoredSnapshotId(costs.fullId)!;
        const path = `${storeDir}/${manifestKey(ref.volumeKey, ref.guid)}`;
        const original = await Deno.readFile(path);
        const claimed = {
          ...full.manifest,
          form: { compressed: true, largeBlocks: false, embedded: true, features: ["compressed"] },
        };
        await Deno.writeFile(path, encodeJson(claimed));
        try {
          const err = await c.controller(
            "CreateVolume",
            createVolumeRequest("text-refused", {
              volume_content_source: { snapshot: { snapshot_id: costs.fullId } },
            }),
            120_000,
          ).then(() => undefined, (e: CallError) => e);
          assert.equal(err?.code, Code.FAILED_PRECONDITION, String(err?.details));
          assert.match(err!.details, /compressed, embedded-data stream \(zfs send -c -e\)/);
          assert.match(err!.details, /lacks pool feature flags \(pool ".*" is version 23/);
          const datasets = await pool.datasets();
          assert.ok(!datasets.some((d) => d.includes(".restore-") || d.includes("refused")));
        } finally {
          await Deno.writeFile(path, original);
        }
      },
    );
  } finally {
    await Deno.remove(storeDir, { recursive: true });
  }
});

/** `text` as a regular expression matching itself. */
function escape(text: string): string {
  return text.replace(/[.*+?^${}()|[\]\\]/g, "\\$&");
}
