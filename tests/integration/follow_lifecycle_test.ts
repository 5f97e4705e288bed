/**
 * A follow volume's life after its moves, with two plugins as they ship on two pools sharing a
 * directory store (`--standby-interval 1s`, which is also how often each node sweeps its copies
 * of deleted volumes):
 *
 * 1. the volume moves A→B→A, so both nodes have a copy (B's a released, warm one);
 * 2. expansion while B holds it: ControllerExpandVolume records the size in the store and asks
 *    for NodeExpandVolume, which grows B's copy; after the move B→A, A's warm copy (made before
 *    the expansion, topped up by an increment) has the new size too; expanded again while no
 *    node holds it, no node expansion is asked for and B's next stage applies it;
 * 3. a snapshot: CreateSnapshot pins the last copy in the store (ready at once, taken when that
 *    copy was), ListSnapshots lists it under `<name>@*`, CreateVolume restores it into an ordinary
 *    volume with the same tree hash, and into a new follow volume (its chain copied in the store)
 *    whose first stage on B has that tree hash too, and DeleteSnapshot (after the head moved on) unpins it
 *    without removing the head's chain;
 * 4. DeleteVolume on A marks it deleted and sets aside A's copy; B's plugin notices within a few
 *    sweeps and sets its warm copy aside too (`.deleted-…`, marked with its old name, data and
 *    snapshots kept), while a copy of a volume that lives on is never touched.
 */

import assert from "node:assert/strict";
import {
  createNode,
  type FollowNode,
  killNodes,
  logTail,
  startPlugin,
} from "../support/follow_flows.ts";
import { type Claim, claimVolume, createVolumeRequest } from "../support/nomad.ts";
import { fileStoreUnderTest } from "../support/store_flows.ts";
import { print } from "../support/store_trials.ts";
import { treeHash } from "../support/tree_hash.ts";
import { sh } from "../support/zfs_pool.ts";

const MiB = 1024 * 1024;
const VOLUME = "lifecycle";
const STAGE_DEADLINE_MS = 180_000;

/** How many snapshots `dataset` and its children have. */
async function snapshotCount(dataset: string): Promise<number> {
  const out = await sh("zfs", "list", "-H", "-t", "snapshot", "-o", "name", "-r", dataset);
  return out.trim().split("\n").filter(Boolean).length;
}

async function until(what: string, check: () => Promise<boolean>, timeoutMs = 30_000) {
  const deadline = Date.now() + timeoutMs;
  while (!await check()) {
    assert.ok(Date.now() < deadline, what);
    await new Promise((r) => setTimeout(r, 250));
  }
}

Deno.test("follow: expansion across moves, snapshots, and a deleted volume's copies elsewhere", async (t) => {
  const dir = await Deno.makeTempDir({ prefix: "zfs-csi-follow-life-" });
  const store = fileStoreUnderTest(dir);
  const a = await createNode("node-a");
  const b = await createNode("node-b");
  const start = (node: FollowNode) => startPlugin(node, store, ["--standby-interval", "1s"]);
  const datasetOn = (node: FollowNode, name = VOLUME) => `${node.pool.parent}/${name}`;
  let allocs = 0;
  const claim = (node: FollowNode, volumeId: string, name = VOLUME): Promise<Claim> =>
    claimVolume(
      () => node.plugin!,
      { volume_id: volumeId, volume_context: {} },
      `alloc-${++allocs}`,
      { nomadVolumeId: name, stageDeadlineMs: STAGE_DEADLINE_MS },
    );
  const create = async (name: string) =>
    (await a.plugin!.client.controller(
      "CreateVolume",
      createVolumeRequest(name, {
        parameters: { follow: "true", backup_interval: "1h" },
        capacity_range: { required_bytes: String(64 * MiB), limit_bytes: "0" },
      }),
    )).volume.volume_id as string;
  const setAside = async (node: FollowNode) =>
    (await node.pool.datasets()).filter((d) => d.includes("/.deleted-"));
  try {
    await start(a);
    await start(b);
    const volumeId = await create(VOLUME);
    // Another follow volume with a warm copy on B, which lives on: the sweep must leave it.
    const keptId = await create("kept");
    let hash = "";

    await t.step("1: A→B→A leaves a released warm copy on B", async () => {
      for (const [id, name] of [[volumeId, VOLUME], [keptId, "kept"]] as const) {
        const onA = await claim(a, id, name);
        await sh("dd", "if=/dev/urandom", `of=${onA.target}/data.bin`, "bs=1M", "count=2");
        await onA.release();
        const onB = await claim(b, id, name);
        await Deno.writeTextFile(`${onB.target}/b.txt`, "written on B\n");
        if (name === VOLUME) hash = await treeHash(onB.target);
        await onB.release();
      }
      const again = await claim(a, volumeId);
      assert.equal(await treeHash(again.target), hash, "A sees B's bytes");
      await again.release();
      assert.equal(await b.pool.get(datasetOn(b), "readonly"), "on", "B's warm copy");
      assert.equal(await b.pool.get(datasetOn(b), "mounted"), "no");
      // A few sweeps go by: a copy of a volume that is not deleted stays.
      await new Promise((r) => setTimeout(r, 3_000));
      assert.ok((await b.pool.datasets()).includes(datasetOn(b)), logTail(b));
      assert.deepEqual(await setAside(b), []);
    });

    await t.step("2: expand while held, move, expand while released, move", async () => {
      const expand = async (node: FollowNode, bytes: number) =>
        await node.plugin!.client.controller("ControllerExpandVolume", {
          volume_id: volumeId,
          capacity_range: { required_bytes: String(bytes), limit_bytes: "0" },
        });
      const onB = await claim(b, volumeId);
      const res = await expand(a, 96 * MiB);
      assert.equal(res.capacity_bytes, String(96 * MiB));
      assert.equal(res.node_expansion_required, true, "B holds it: its copy must grow");
      const owner = JSON.parse(
        new TextDecoder().decode(await store.read(`v1/volumes/${VOLUME}/owner.json`)),
      );
      assert.equal(owner.settings.capacityBytes, 96 * MiB, "recorded in the owner object");
      assert.equal(owner.holder, "node-b");
      // Nomad then calls NodeExpandVolume on the claiming node, with the alloc's target path.
      await b.plugin!.client.node("NodeExpandVolume", {
        volume_id: volumeId,
        volume_path: onB.target,
        capacity_range: { required_bytes: String(96 * MiB), limit_bytes: "0" },
      });
      assert.equal(await b.pool.get(datasetOn(b), "refquota"), String(96 * MiB));
      await onB.release();
      assert.equal(await a.pool.get(datasetOn(a), "refquota"), String(64 * MiB), "A's warm copy");
      const mark = a.plugin!.records().length;
      const onA = await claim(a, volumeId);
      assert.equal(await a.pool.get(datasetOn(a), "refquota"), String(96 * MiB), logTail(a));
      const held = a.plugin!.records().slice(mark).find((r) => r.msg === "follow volume held here");
      assert.equal(held?.plan, "increment", "A topped up its warm copy");
      await onA.release();
      const again = await expand(b, 128 * MiB);
      assert.equal(again.node_expansion_required, false, "no node holds it");
      const onB2 = await claim(b, volumeId);
      assert.equal(await b.pool.get(datasetOn(b), "refquota"), String(128 * MiB), logTail(b));
      await Deno.writeTextFile(`${onB2.target}/b2.txt`, "written on B after the expansions\n");
      hash = await treeHash(onB2.target);
      await onB2.release();
      // A repeat, and a shrink refused as for any volume.
      assert.equal((await expand(a, 128 * MiB)).capacity_bytes, String(128 * MiB));
      await assert.rejects(
        a.plugin!.client.controller("ControllerExpandVolume", {
          volume_id: volumeId,
          capacity_range: { required_bytes: "0", limit_bytes: String(64 * MiB) },
        }),
        /shrinking/,
      );
    });

    await t.step("3: snapshot, list, restore into an ordinary volume, delete", async () => {
      const ctl = a.plugin!.client;
      const owner = JSON.parse(
        new TextDecoder().decode(await store.read(`v1/volumes/${VOLUME}/owner.json`)),
      );
      const res = await ctl.controller("CreateSnapshot", {
        source_volume_id: volumeId,
        name: "life-snap",
      });
      const snap = res.snapshot;
      assert.equal(snap.ready_to_use, true);
      assert.equal(snap.source_volume_id, volumeId);
      assert.equal(
        Number(snap.creation_time.seconds),
        Math.floor(Date.parse(owner.headAt) / 1000),
        "as old as the last copy in the store",
      );
      const hex = BigInt(owner.head).toString(16).padStart(16, "0");
      assert.equal(snap.snapshot_id, `store:${VOLUME}:${hex}`);
      const manifestPath = `v1/volumes/${VOLUME}/snapshots/${hex}.json`;
      const pinned = JSON.parse(new TextDecoder().decode(await store.read(manifestPath)));
      assert.equal(pinned.kind, "requested");
      assert.equal(pinned.csiName, "life-snap");
      const listed = await ctl.controller("ListSnapshots", { source_volume_id: volumeId });
      const entry = listed.entries.map((e: { snapshot: Record<string, unknown> }) => e.snapshot)
        .find((e: Record<string, unknown>) => e.snapshot_id === snap.snapshot_id);
      assert.equal(entry?.source_volume_id, volumeId, JSON.stringify(listed));
      // Restored into an ordinary volume on A: B's last bytes.
      const restored = await ctl.controller(
        "CreateVolume",
        createVolumeRequest("restored", {
          volume_content_source: { snapshot: { snapshot_id: snap.snapshot_id } },
        }),
      );
      const onR = await claim(a, restored.volume.volume_id, "restored");
      assert.equal(await treeHash(onR.target), hash, "the snapshot holds B's last bytes");
      await onR.release();
      // And into a new follow volume, whose first stage (on B) receives the copied chain.
      const seeded = await ctl.controller(
        "CreateVolume",
        createVolumeRequest("seeded", {
          // No size asked for (Nomad sends none without capacity_min/max).
          capacity_range: null,
          parameters: { follow: "true", backup_interval: "1h" },
          volume_content_source: { snapshot: { snapshot_id: snap.snapshot_id } },
        }),
      );
      assert.equal(seeded.volume.volume_id, "seeded@*");
      assert.equal(seeded.volume.capacity_bytes, String(128 * MiB), "the size it had then");
      const onS = await claim(b, "seeded@*", "seeded");
      assert.equal(await treeHash(onS.target), hash, "the new follow volume holds the snapshot");
      assert.equal(await b.pool.get(datasetOn(b, "seeded"), "refquota"), String(128 * MiB));
      await onS.release();
      // The head moves on (a move); deleting the snapshot then keeps the head's chain.
      const onA = await claim(a, volumeId);
      await Deno.writeTextFile(`${onA.target}/after-snapshot.txt`, "later\n");
      await onA.release();
      await ctl.controller("DeleteSnapshot", { snapshot_id: snap.snapshot_id });
      const after = JSON.parse(new TextDecoder().decode(await store.read(manifestPath)));
      assert.equal(after.kind, "scheduled", "unpinned, still on the head's chain");
      assert.ok(await store.read(after.stream), "its stream stays");
      const onB = await claim(b, volumeId);
      assert.ok(await Deno.stat(`${onB.target}/after-snapshot.txt`), "the volume moves as before");
      await onB.release();
    });

    await t.step("4: DeleteVolume on A; B's sweep sets its warm copy aside", async () => {
      const snapshotsBefore = await snapshotCount(datasetOn(b));
      assert.ok(snapshotsBefore > 0, "B's copy has the snapshots it received");
      const started = performance.now();
      await a.plugin!.client.controller("DeleteVolume", { volume_id: volumeId });
      assert.equal((await a.pool.datasets()).includes(datasetOn(a)), false, "A's copy set aside");
      await until(
        `B's warm copy is still there${logTail(b)}`,
        async () => !(await b.pool.datasets()).includes(datasetOn(b)),
      );
      const ms = Math.round(performance.now() - started);
      // The copy leaves its name at the sweep's rename; the sweep logs once its properties are set.
      await until(
        `B's sweep never said it set the copy aside${logTail(b)}`,
        () =>
          Promise.resolve(
            b.plugin!.records().some((r) =>
              r.msg === "copy of a deleted follow volume set aside" && r.volume === VOLUME
            ),
          ),
      );
      const aside = await setAside(b);
      assert.equal(aside.length, 1, `one set-aside copy on B: ${aside.join(", ")}`);
      assert.equal(await b.pool.get(aside[0]!, "org.zfs-csi:deleted-name"), datasetOn(b));
      const snapshotsAfter = await snapshotCount(aside[0]!);
      assert.equal(snapshotsAfter, snapshotsBefore, "nothing of the copy was destroyed");
      for (const other of ["kept", "seeded"]) {
        assert.ok((await b.pool.datasets()).includes(datasetOn(b, other)), `${other} stays`);
      }
      print(`follow: B's warm copy set aside ${ms} ms after DeleteVolume on A`);
    });
  } finally {
    await killNodes([a, b]);
    await Deno.remove(dir, { recursive: true });
  }
});
