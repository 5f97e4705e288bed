/**
 * The manual restore recipe of docs/backups.md ("Restore by hand, without the plugin"), run as an
 * operator would without the plugin: the shell block between `<!-- manual-restore:begin -->` and
 * `<!-- manual-restore:end -->` in that file, run by bash with only bash, coreutils, grep, sed and
 * zfs on PATH, against a directory store the plugin filled. The data received on another pool must
 * be the source's at snapshot time.
 */

import assert from "node:assert/strict";
import { createHash } from "node:crypto";
import type { SnapshotManifest } from "../../src/store/layout.ts";
import { mountedHash, recipe, runRecipe, toolDir } from "../support/manual_recipe.ts";
import { claimVolume, createVolumeRequest } from "../support/nomad.ts";
import { PluginProcess } from "../support/plugin_process.ts";
import { treeHash } from "../support/tree_hash.ts";
import { sh, TestPool, tryRun } from "../support/zfs_pool.ts";

const VOLUME = "pg-data";
const MiB = 1024 * 1024;

/** Writes `bytes` random bytes to `path`. */
async function writeRandom(path: string, bytes: number): Promise<void> {
  const data = new Uint8Array(bytes);
  for (let i = 0; i < bytes; i += 65_536) {
    crypto.getRandomValues(data.subarray(i, Math.min(bytes, i + 65_536)));
  }
  await Deno.writeFile(path, data);
}

/** The manifests of the volume in the store, by CSI snapshot name. */
async function manifestsByName(storeDir: string): Promise<Map<string, SnapshotManifest>> {
  const dir = `${storeDir}/v1/volumes/${VOLUME}/snapshots`;
  const out = new Map<string, SnapshotManifest>();
  for await (const e of Deno.readDir(dir)) {
    if (!e.name.endsWith(".json")) continue;
    const m = JSON.parse(await Deno.readTextFile(`${dir}/${e.name}`)) as SnapshotManifest;
    out.set(m.csiName ?? m.snapshot, m);
  }
  return out;
}

Deno.test("store: the manual restore recipe of docs/backups.md restores without the plugin", async (t) => {
  const storeDir = await Deno.makeTempDir({ prefix: "zfs-csi-store-manual-" });
  const a = await TestPool.create();
  let b: TestPool | undefined;
  let plugin: PluginProcess | undefined;
  try {
    b = await TestPool.create();
    const pathDir = await toolDir(b.dir);
    const { script, from } = await recipe();
    /** The source's tree at each snapshot, by CSI snapshot name. */
    const hashes = new Map<string, string>();
    let manifests = new Map<string, SnapshotManifest>();

    await t.step("the plugin fills a file store with a chain of three snapshots", async () => {
      plugin = await PluginProcess.start({
        parentDataset: a.parent,
        dir: a.dir,
        nodeId: "node-a",
        extraArgs: ["--store", `file://${storeDir}`],
        scope: { extraDirs: [storeDir] },
      });
      const c = plugin.client;
      const volume = (await c.controller("CreateVolume", createVolumeRequest(VOLUME))).volume;
      const p = await claimVolume(plugin, volume, "alloc");
      await Deno.mkdir(`${p.target}/base`);
      await writeRandom(`${p.target}/base/one.bin`, 2 * MiB);
      for (const [i, name] of ["s1", "s2", "s3"].entries()) {
        await Deno.writeTextFile(`${p.target}/version.txt`, `${name}\n`);
        await writeRandom(`${p.target}/base/${name}.bin`, 128 * 1024 * (i + 1));
        if (i === 2) await Deno.remove(`${p.target}/base/s1.bin`);
        hashes.set(name, await treeHash(p.target));
        const made = await c.controller(
          "CreateSnapshot",
          { source_volume_id: volume.volume_id, name, parameters: {} },
          120_000,
        );
        assert.equal(made.snapshot.ready_to_use, true);
      }
      // Written after the last snapshot: never in a restore.
      await writeRandom(`${p.target}/after.bin`, 64 * 1024);
      await p.release();
      assert.equal((await plugin.stop("SIGTERM")).code, 0);
      plugin = undefined;
      manifests = await manifestsByName(storeDir);
      const [s1, s2, s3] = ["s1", "s2", "s3"].map((n) => manifests.get(n));
      assert.ok(s1 && s2 && s3, `three manifests: ${[...manifests.keys()]}`);
      assert.equal(s1.baseGuid, null, "s1 is a full stream");
      assert.equal(s2.baseGuid, s1.guid, "s2 is incremental on s1");
      assert.equal(s3.baseGuid, s2.guid, "s3 is incremental on s2");
    });

    await t.step(`the recipe (from ${from}) restores the newest snapshot`, async () => {
      assert.doesNotMatch(
        script,
        /\b(jq|python3?|perl|awk)\b/,
        "only bash, coreutils, grep, sed, zfs",
      );
      const target = `${b!.pool}/restored-newest`;
      const run = await runRecipe(script, {
        STORE_DIR: storeDir,
        VOLUME,
        SNAPSHOT: "",
        TARGET: target,
        PATH: pathDir,
      });
      assert.equal(run.code, 0, run.output);
      assert.equal(
        await mountedHash(target, `${b!.mountRoot}/restored-newest`),
        hashes.get("s3"),
        `the tree at s3; the recipe said:\n${run.output}`,
      );
      assert.equal(await b!.get(target, "refquota"), String(64 * MiB), "refquota as the volume's");
    });

    await t.step("the recipe restores a chosen older snapshot, and stops there", async () => {
      const s2 = manifests.get("s2");
      assert.ok(s2);
      const target = `${b!.pool}/restored-s2`;
      const run = await runRecipe(script, {
        STORE_DIR: storeDir,
        VOLUME,
        SNAPSHOT: BigInt(s2.guid).toString(16).padStart(16, "0"),
        TARGET: target,
        PATH: pathDir,
      });
      assert.equal(run.code, 0, run.output);
      assert.equal(
        await mountedHash(target, `${b!.mountRoot}/restored-s2`),
        hashes.get("s2"),
        `the tree at s2; the recipe said:\n${run.output}`,
      );
      const snaps = (await sh("zfs", "list", "-H", "-t", "snapshot", "-o", "name", "-r", target))
        .split("\n").filter((l) => l !== "");
      assert.deepEqual(
        snaps,
        [manifests.get("s1")!, s2].map((m) => `${target}@${m.snapshot}`),
        "the chain s1, s2 was received, not s3",
      );
    });

    await t.step(
      "the newest is the highest sequence, whatever the nodes' clocks said",
      async () => {
        // s3 as a node whose clock was a day behind would have stamped it: the oldest createdAt.
        const copy = `${b!.dir}/store-skewed`;
        await sh("cp", "-a", storeDir, copy);
        const s3 = manifests.get("s3")!;
        assert.ok(
          typeof s3.sequence === "number" && s3.sequence > manifests.get("s2")!.sequence!,
          "the plugin numbers its manifests",
        );
        const path = `${copy}/v1/volumes/${VOLUME}/snapshots/${
          BigInt(s3.guid).toString(16).padStart(16, "0")
        }.json`;
        const text = await Deno.readTextFile(path);
        const skewed = text.replace(
          `"createdAt": "${s3.createdAt}"`,
          `"createdAt": "2000-01-01T00:00:00Z"`,
        );
        assert.notEqual(skewed, text, "s3's createdAt rewritten");
        await Deno.writeTextFile(path, skewed);
        const target = `${b!.pool}/restored-skewed`;
        const run = await runRecipe(script, {
          STORE_DIR: copy,
          VOLUME,
          SNAPSHOT: "",
          TARGET: target,
          PATH: pathDir,
        });
        assert.equal(run.code, 0, run.output);
        assert.equal(
          await mountedHash(target, `${b!.mountRoot}/restored-skewed`),
          hashes.get("s3"),
          `the tree at s3; the recipe said:\n${run.output}`,
        );
      },
    );

    await t.step("the recipe refuses a damaged stream before receiving anything", async () => {
      const copy = `${b!.dir}/store-copy`;
      await sh("cp", "-a", storeDir, copy);
      const s1 = manifests.get("s1")!;
      const path = `${copy}/${s1.stream}`;
      const bytes = await Deno.readFile(path);
      const at = bytes.length >> 1;
      bytes[at] = bytes[at]! ^ 0x80;
      await Deno.writeFile(path, bytes);
      const target = `${b!.pool}/restored-damaged`;
      const run = await runRecipe(script, {
        STORE_DIR: copy,
        VOLUME,
        SNAPSHOT: "",
        TARGET: target,
        PATH: pathDir,
      });
      assert.notEqual(run.code, 0, run.output);
      assert.match(run.output, /SHA-256/, "the recipe names the check that failed");
      const exists = await tryRun("zfs", "list", target);
      assert.notEqual(exists.code, 0, `${target} was not created`);
    });

    await t.step("the recipe refuses a stream that sets properties (zfs send -p)", async () => {
      const copy = `${b!.dir}/store-copy-props`;
      await sh("cp", "-a", storeDir, copy);
      // What anyone who can write the store could put there: another dataset's stream with its
      // properties, under s1's name, and a manifest with its true size, SHA-256 and guid.
      const s1 = manifests.get("s1")!;
      const other = `${b!.pool}/other`;
      await sh("zfs", "create", "-o", "setuid=off", "-o", "other.tool:y=from-the-stream", other);
      const snap = `${other}@${s1.snapshot}`;
      await sh("zfs", "snapshot", snap);
      const guid = (await sh("zfs", "get", "-Hp", "-o", "value", "guid", snap)).trim();
      const sent = await new Deno.Command("zfs", { args: ["send", "-p", snap], stdout: "piped" })
        .output();
      assert.ok(sent.success, "zfs send -p");
      await Deno.writeFile(`${copy}/${s1.stream}`, sent.stdout);
      const hex = BigInt(guid).toString(16).padStart(16, "0");
      const sha256 = createHash("sha256").update(sent.stdout).digest("hex");
      await Deno.writeTextFile(
        `${copy}/v1/volumes/${VOLUME}/snapshots/${hex}.json`,
        JSON.stringify({ ...s1, guid, size: sent.stdout.length, sha256 }, null, 2) + "\n",
      );
      const target = `${b!.pool}/restored-props`;
      const run = await runRecipe(script, {
        STORE_DIR: copy,
        VOLUME,
        SNAPSHOT: hex,
        TARGET: target,
        PATH: pathDir,
      });
      assert.notEqual(run.code, 0, run.output);
      assert.match(run.output, /set properties .*other\.tool:y/, "the recipe names them");
    });
  } finally {
    await plugin?.stop("SIGKILL");
    await b?.destroy();
    await a.destroy();
    await Deno.remove(storeDir, { recursive: true });
  }
});
