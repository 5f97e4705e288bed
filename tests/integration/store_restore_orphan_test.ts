/**
 * A restore from the directory store lets `zfs receive` read the stored file itself while the
 * plugin checks it (src/replicate/receive.ts), so a plugin killed during that receive leaves it
 * running on its own, and its result unchecked. Each trial SIGKILLs the plugin at one point of a CreateVolume from a stored
 * snapshot of 1-1.25 GiB of incompressible data (one stream), starts it again and repeats the
 * CreateVolume at once, while the killed plugin's zfs receive may still run, until it answers.
 * Kill points, in turn: just as the receive was started (its dataset may not exist yet), a
 * seeded fraction into the receive (its result then completes unchecked, and the next restore
 * checks the file again before keeping it), once the receive and its check were done (before the
 * rename), and early in the call. Then, with every process of the killed plugin gone:
 * - exactly one volume dataset, holding exactly the stored snapshot (its guid), with the source's
 *   tree hash once staged and published, and no `.restore-*` dataset left;
 * - nothing outside the parent changed: a sibling dataset with a snapshot keeps its guids, its
 *   data and the list of datasets outside the parent is the same;
 * Whether a killed plugin's receive still runs when the restarted plugin is ready depends on the
 * machine (the plugin's start against 1 GiB of receive); the trials print how often it did. Two
 * more trials make sure of it: the test itself starts what a killed plugin leaves, `zfs receive
 * -u <temp> < <stored file>`, (a) before the CreateVolume: the restore must wait for it and keep
 * its result; (b) together with it: whichever receive takes the name first, the result is one
 * volume and the same checks.
 *
 * Seeded (ZFS_CSI_ORPHAN_SEED, a number or "random"; printed); ZFS_CSI_ORPHAN_TRIALS trials
 * (default 6, whole rounds of the four kill points are not required); ZFS_CSI_ORPHAN_MIB sets
 * the source's size (e.g. smaller in a VM without KVM, where receives are slow anyway).
 * zfs-fuse runs the receive in its daemon (the `zfs` client only waits for it); on OpenZFS the
 * `zfs receive` process does it: the VM run (tools/openzfs-vm/) runs this file there too.
 */

import assert from "node:assert/strict";
import { restoreTempDataset } from "../../src/replicate/restore.ts";
import { retryWhileBusy } from "../support/csi_client.ts";
import { claimPaths, createVolumeRequest, mountCapability } from "../support/nomad.ts";
import { PluginProcess } from "../support/plugin_process.ts";
import { Prng, seedFrom } from "../support/prng.ts";
import {
  datasetsBelow,
  fileStoreUnderTest,
  MiB,
  orphansOf,
  print,
  recordsOf,
  sleep,
  waitFor,
  writeRandomFile,
  zfsGet,
} from "../support/store_trials.ts";
import { treeHash } from "../support/tree_hash.ts";
import { sh, TestPool } from "../support/zfs_pool.ts";

const SEED = seedFrom(Deno.env.get("ZFS_CSI_ORPHAN_SEED"), 20261125);
const TRIALS = Number(Deno.env.get("ZFS_CSI_ORPHAN_TRIALS") || 6);
/** The source's size in MiB (default a seeded 1024-1280; smaller where receives are slow). */
const SOURCE_MIB = Number(Deno.env.get("ZFS_CSI_ORPHAN_MIB") || 0);
const CAPACITY = Math.max(2048, SOURCE_MIB * 2) * MiB;
const KILL_POINTS = ["receive started", "during the receive", "receive done", "early"] as const;

/** Calls `fn` until it does not fail with ABORTED or UNAVAILABLE (a restore still running). */
function retry<T>(fn: () => Promise<T>, timeoutMs = 180_000): Promise<T> {
  return retryWhileBusy(fn, timeoutMs, 100);
}

/** Datasets and snapshots of the pool outside the parent, with their guids. */
async function outsideParent(pool: TestPool): Promise<string[]> {
  const out = await sh(
    "zfs",
    "get",
    "-Hp",
    "-r",
    "-o",
    "name,value",
    "guid",
    pool.pool,
  );
  return out.split("\n").filter((l) =>
    l !== "" && !l.startsWith(`${pool.parent}\t`) && !l.startsWith(`${pool.parent}/`) &&
    !l.startsWith(`${pool.parent}@`)
  ).sort();
}

Deno.test({
  name: `store restore: SIGKILL during zfs receive < stored file, repeated at once (seed ${SEED})`,
  sanitizeResources: false,
  sanitizeOps: false,
  async fn() {
    print(`  seed ${SEED} (ZFS_CSI_ORPHAN_SEED), ${TRIALS} trials`);
    const rng = new Prng(SEED);
    await using pool = await TestPool.create(Math.max(8192, SOURCE_MIB * 4));
    const sut = await fileStoreUnderTest(`${pool.dir}/store`);
    // Outside the parent: a dataset with data and a snapshot that nothing may touch.
    const sibling = `${pool.pool}/outside`;
    await sh("zfs", "create", sibling);
    const siblingDir = (await sh("zfs", "get", "-H", "-o", "value", "mountpoint", sibling)).trim();
    await writeRandomFile(`${siblingDir}/keep.bin`, 4 * MiB, 1);
    await sh("zfs", "snapshot", `${sibling}@keep`);
    const siblingHash = await treeHash(siblingDir);
    const outside = await outsideParent(pool);

    const start = () =>
      PluginProcess.start({
        parentDataset: pool.parent,
        dir: pool.dir,
        extraArgs: [...sut.plugin.extraArgs ?? [], "--deleted-retention", "0"],
        ...(sut.plugin.scope ? { scope: sut.plugin.scope } : {}),
      });
    let plugin = await start();
    try {
      // The source: a volume with incompressible data, stored, then deleted.
      // Drawn either way, so a seed places the same kills whatever the size.
      const drawn = rng.int(1024, 1280);
      const mib = SOURCE_MIB || drawn;
      const src = await plugin.client.controller(
        "CreateVolume",
        createVolumeRequest("orphan-src", {
          capacity_range: { required_bytes: String(CAPACITY), limit_bytes: "0" },
        }),
      );
      const srcDataset = `${pool.parent}/orphan-src`;
      await sh("zfs", "mount", srcDataset).catch(() => {});
      const srcDir = (await sh("zfs", "get", "-H", "-o", "value", "mountpoint", srcDataset)).trim();
      await writeRandomFile(`${srcDir}/data.bin`, mib * MiB, rng.int(0, 0xffff_ffff));
      const hash = await treeHash(srcDir);
      const snap = await plugin.client.controller("CreateSnapshot", {
        source_volume_id: src.volume.volume_id,
        name: "orphan-snap",
        parameters: {},
      }, 120_000);
      assert.equal(snap.snapshot.ready_to_use, true);
      const snapshotId: string = snap.snapshot.snapshot_id;
      const guidHex = snapshotId.split(":")[2]!;
      await plugin.client.controller("DeleteVolume", { volume_id: src.volume.volume_id });
      print(`  source: ${mib} MiB, stored as ${snapshotId}`);

      const checkVolume = async (name: string, volume: Record<string, unknown>): Promise<void> => {
        const dataset = `${pool.parent}/${name}`;
        const all = await datasetsBelow(pool.parent);
        assert.deepEqual(
          [...all.keys()].filter((d) => d.includes("/.restore-")),
          [],
          `${name}: no .restore-* dataset left`,
        );
        assert.deepEqual(
          [...all.keys()].filter((d) => d === dataset || d.startsWith(`${dataset}@`)).length,
          2,
          `${name}: one dataset and its one snapshot: ${[...all.keys()]}`,
        );
        const snaps = [...all.keys()].filter((d) => d.startsWith(`${dataset}@`));
        const guid = BigInt((await zfsGet(snaps[0]!, "guid"))!).toString(16).padStart(16, "0");
        assert.equal(guid, guidHex, `${name}: the stored snapshot`);
        assert.equal(await zfsGet(dataset, "org.zfs-csi:managed"), "yes");
        const id = String(volume.volume_id);
        const p = await claimPaths(plugin.baseDir, { volumeId: name, allocId: `${name}-a0` });
        const common = {
          volume_id: id,
          volume_capability: mountCapability(),
          volume_context: volume.volume_context,
        };
        await plugin.client.node("NodeStageVolume", { ...common, staging_target_path: p.staging });
        await plugin.client.node("NodePublishVolume", {
          ...common,
          staging_target_path: p.staging,
          target_path: p.target,
          readonly: false,
        });
        assert.equal(await treeHash(p.target), hash, `${name}: restored data`);
        await plugin.client.node("NodeUnpublishVolume", { volume_id: id, target_path: p.target });
        await plugin.client.node("NodeUnstageVolume", {
          volume_id: id,
          staging_target_path: p.staging,
        });
        await retry(() => plugin.client.controller("DeleteVolume", { volume_id: id }));
        assert.equal(await zfsGet(dataset, "type"), undefined, `${dataset} deleted`);
      };

      const restoreReq = (name: string) =>
        createVolumeRequest(name, {
          capacity_range: { required_bytes: String(CAPACITY), limit_bytes: "0" },
          volume_content_source: { snapshot: { snapshot_id: snapshotId } },
        });

      // One uncrashed restore measures the receive, to place the kills inside it.
      const t0 = performance.now();
      const from0 = plugin.logs().length;
      const ref = await retry(() => plugin.client.controller("CreateVolume", restoreReq("ref")));
      const refMs = performance.now() - t0;
      const fileReceives = recordsOf(plugin.logs(), from0)
        .filter((r) => r.msg === "receive started" && r.from === "file");
      assert.equal(fileReceives.length, 1, "the restore let zfs read the stored file");
      const refRecs = recordsOf(plugin.logs(), from0);
      const at = (msg: string) => Date.parse(String(refRecs.find((r) => r.msg === msg)?.ts));
      // zfs's own part: from its start (after the file was checked) to its end.
      const receiveMs = at("receive done") - at("receive started");
      print(`  reference restore ${refMs.toFixed(0)} ms, zfs receive ${receiveMs} ms of it`);
      await checkVolume("ref", ref.volume);

      let repeatsWhileRunning = 0;
      for (let t = 0; t < TRIALS; t++) {
        const point = KILL_POINTS[t % KILL_POINTS.length]!;
        const name = `orphan-${t}`;
        const from = plugin.logs().length;
        const call = plugin.client.controller("CreateVolume", restoreReq(name), 120_000);
        call.catch(() => {});
        const seen = (msg: string, extra: (r: Record<string, unknown>) => boolean = () => true) =>
          waitFor(
            `"${msg}" in the log`,
            () =>
              Promise.resolve(
                recordsOf(plugin.logs(), from).some((r) => r.msg === msg && extra(r)) || undefined,
              ),
            120_000,
            2,
          );
        if (point === "early") {
          // A little after the call came: before, or just as, zfs receive starts.
          await sleep(rng.int(5, 60));
        } else if (point === "receive done") {
          await seen("receive done");
        } else {
          await seen("receive started", (r) => r.from === "file");
          if (point === "during the receive") await sleep(rng.int(5, 40) / 100 * receiveMs);
        }
        await plugin.stop("SIGKILL");
        const pid = (line: string) => line.split(/\s+/)[0]!;
        const atKill = await orphansOf(pool.pool);
        if (Deno.env.get("ZFS_CSI_ORPHAN_VERBOSE") === "1") {
          print(`    at the kill: ${atKill.join(" | ")}`);
        }
        const left = new Set(atKill.map(pid));
        const alive = async () => (await orphansOf(pool.pool)).filter((l) => left.has(pid(l)));
        plugin = await start();
        const running = (await alive()).length;
        if (running > 0) repeatsWhileRunning++;
        const res = await retry(() => plugin.client.controller("CreateVolume", restoreReq(name)));
        await waitFor(
          "the killed plugin's subprocesses to end",
          async () => (await alive()).length === 0 || undefined,
          120_000,
          20,
        );
        print(
          `  trial ${t}: killed at "${point}", ${running} of its processes ran when the restarted ` +
            `plugin was ready (${plugin.startupMs.toFixed(0)} ms)`,
        );
        await checkVolume(name, res.volume);
      }
      print(`  ${repeatsWhileRunning} of ${TRIALS} repeats came while the orphan receive ran`);

      // Whether a killed plugin's receive still runs when the restarted one is ready depends on
      // this machine's speed. What it leaves is a `zfs receive -u <temp> < <stored file>`: these
      // two trials start exactly that from here, so the call surely meets it running.
      const [stream] = (await sut.store.list("v1/volumes/orphan-src/streams/"))
        .filter((o) => o.key.endsWith(".zfs"));
      assert.ok(stream, "the stored stream");
      const storedFile = `${pool.dir}/store/${stream.key}`;
      const orphan = (name: string) => {
        const temp = restoreTempDataset(pool.parent, `${pool.parent}/${name}`);
        const child = new Deno.Command("bash", {
          args: ["-c", 'exec zfs receive -u "$1" < "$2"', "orphan", temp, storedFile],
          stdout: "null",
          stderr: "piped",
        }).spawn();
        return { temp, done: child.output() };
      };
      const logged = (from: number, msg: string) =>
        recordsOf(plugin.logs(), from).some((r) => r.msg === msg);

      // (a) The receive runs before the call comes: the restore waits for it and keeps it.
      {
        const from = plugin.logs().length;
        const o = orphan("orphan-a");
        await waitFor("the receive's dataset", () => zfsGet(o.temp, "type"), 30_000, 5);
        const res = await retry(() =>
          plugin.client.controller("CreateVolume", restoreReq("orphan-a"))
        );
        assert.equal((await o.done).code, 0, "the other receive completed");
        assert.ok(
          logged(
            from,
            "waiting for a receive into the temporary dataset that this restore did not start",
          ),
          "the restore waited for the receive it found",
        );
        assert.ok(!logged(from, "receive started"), "and received nothing itself");
        print("  (a) a receive running before the call: waited for and kept");
        await checkVolume("orphan-a", res.volume);
      }

      // (b) The receive starts together with the call (the killed plugin had spawned it a moment
      // before its end). Whichever takes the temporary dataset's name first, zfs refuses the
      // other: the restore either receives itself (the other receive fails and leaves nothing)
      // or waits for that receive and keeps its result once its file checked again; never both,
      // never a destroy of what the other receive made.
      {
        const from = plugin.logs().length;
        const call = retry(() => plugin.client.controller("CreateVolume", restoreReq("orphan-b")));
        call.catch(() => {});
        const o = orphan("orphan-b");
        const res = await call;
        const otherCode = (await o.done).code;
        const kept = logged(from, "another receive took the temporary dataset first") ||
          logged(
            from,
            "waiting for a receive into the temporary dataset that this restore did not start",
          );
        if (otherCode === 0) {
          assert.ok(kept, "the other receive completed, and the restore kept its result");
          print("  (b) a receive started with the call took the name first: waited for and kept");
        } else {
          assert.ok(
            logged(from, "receive started"),
            "the other receive failed: the restore received",
          );
          assert.ok(!kept);
          print("  (b) the restore's own receive took the name first: the other one was refused");
        }
        await checkVolume("orphan-b", res.volume);
      }
      assert.deepEqual(await outsideParent(pool), outside, "nothing outside the parent changed");
      assert.equal(await treeHash(siblingDir), siblingHash);
    } catch (err) {
      print(plugin.logs().slice(-30).join("\n"));
      throw err;
    } finally {
      await plugin.stop("SIGKILL");
    }
  },
});
