/**
 * Issue 13, warm standby copies, end to end: three plugins as they ship (three pools, three
 * parent datasets, one directory store), called as Nomad calls them.
 *
 * 1. CreateVolume with `standby_nodes = "node-a,node-b"` answers one topology per standby
 *    node (Nomad then places the job only there); the owner object lists them.
 * 2. A holds the volume and writes; its scheduled backups move the head; B, a standby, receives
 *    them in the background: B's copy's newest snapshot reaches the store's head within a
 *    bounded time, first in full, then by increments; C, no standby, keeps no copy.
 * 3. A move A→B then receives only what A stored after B's last background receive (the
 *    bytes are printed), and B's task sees exactly A's bytes.
 * 4. ListVolumes (asked of C's controller) lists the volume once, with B as its published node
 *    and a condition naming the holder, the generation and the head's age.
 * 5. A, a standby too and the former holder, now follows B's increments onto its released copy.
 *
 * zfs-fuse has no `written`: a standby copy is judged clean by its release marker and
 * `readonly=on` alone here (OpenZFS also checks `written` = 0).
 */

import assert from "node:assert/strict";
import { NODE_TOPOLOGY_KEY } from "../../src/version.ts";
import { type Claim, claimVolume, createVolumeRequest } from "../support/nomad.ts";
import {
  createNode,
  type FollowNode,
  logTail,
  ownerOf,
  startPlugin,
  writeRandom,
} from "../support/follow_flows.ts";
import { fileStoreUnderTest } from "../support/store_flows.ts";
import { print } from "../support/store_trials.ts";
import { treeHash } from "../support/tree_hash.ts";
import { sh, TestPool } from "../support/zfs_pool.ts";

const KiB = 1024;
const MiB = 1024 * KiB;
const VOLUME = "warm";
/** How long a standby may take to reach the head: a backup pass (5 s) and a tick (1 s), loaded. */
const CATCH_UP_MS = 90_000;

/** The guid of the newest snapshot of `dataset`, or undefined (no dataset, no snapshot). */
async function newestGuid(pool: TestPool, dataset: string): Promise<string | undefined> {
  let out: string;
  try {
    out = await sh(
      "zfs",
      "list",
      "-H",
      "-t",
      "snapshot",
      "-o",
      "name",
      "-s",
      "createtxg",
      "-r",
      dataset,
    );
  } catch {
    return undefined;
  }
  const newest = out.trim().split("\n").filter((l) => l.startsWith(`${dataset}@`)).at(-1);
  return newest ? await pool.get(newest, "guid") : undefined;
}

Deno.test("follow: standby copies follow the head in the background; a move to one costs its delta", async (t) => {
  const dir = await Deno.makeTempDir({ prefix: "zfs-csi-standby-" });
  const store = fileStoreUnderTest(dir);
  const nodes: FollowNode[] = [];
  for (const name of ["node-a", "node-b", "node-c"]) nodes.push(await createNode(name));
  const [a, b, c] = nodes as [FollowNode, FollowNode, FollowNode];
  const datasetOn = (n: FollowNode) => `${n.pool.parent}/${VOLUME}`;
  /** Waits until `node`'s copy is at the store's head; returns the head and the ms it took. */
  const caughtUp = async (node: FollowNode, notBefore?: string): Promise<[string, number]> => {
    const started = performance.now();
    for (;;) {
      const head = (await ownerOf(store, VOLUME)).head as string | null;
      if (head !== null && head !== notBefore) {
        const guid = await newestGuid(node.pool, datasetOn(node));
        // The receive lands the snapshot first and then moves the release marker (a `zfs set`
        // after it): caught up is both, or a slow machine reads between the two.
        const marker = guid === head
          ? await node.pool.get(datasetOn(node), "org.zfs-csi:follow-released")
          : undefined;
        if (guid === head && marker === head) {
          assert.equal(await node.pool.get(datasetOn(node), "readonly"), "on");
          assert.equal(await node.pool.get(datasetOn(node), "mounted"), "no");
          return [head, Math.round(performance.now() - started)];
        }
      }
      assert.ok(
        performance.now() - started < CATCH_UP_MS,
        `${node.name}'s copy did not reach the head ${head}${logTail(node, 30)}`,
      );
      await new Promise((r) => setTimeout(r, 250));
    }
  };
  const records = (node: FollowNode, msg: string, from: number) =>
    node.plugin!.records().slice(from).filter((r) => r.msg === msg);
  /** The records once there is one: the plugin logs a receive after its last `zfs set`. */
  const loggedRecords = async (node: FollowNode, msg: string, from: number) => {
    const started = performance.now();
    while (records(node, msg, from).length === 0 && performance.now() - started < 10_000) {
      await new Promise((r) => setTimeout(r, 100));
    }
    return records(node, msg, from);
  };
  try {
    for (const n of nodes) {
      await startPlugin(n, store, ["--lease-ttl", "3s", "--standby-interval", "1s"]);
    }
    let volumeId = "";
    let onA: Claim | undefined;
    let onB: Claim | undefined;
    let hash = "";

    await t.step("1: CreateVolume answers one topology per standby node", async () => {
      const res = await c.plugin!.client.controller(
        "CreateVolume",
        createVolumeRequest(VOLUME, {
          parameters: { follow: "true", backup_interval: "5s", standby_nodes: "node-b,node-a" },
        }),
      );
      volumeId = res.volume.volume_id;
      assert.equal(volumeId, `${VOLUME}@*`);
      assert.deepEqual(res.volume.accessible_topology, [
        { segments: { [NODE_TOPOLOGY_KEY]: "node-a" } },
        { segments: { [NODE_TOPOLOGY_KEY]: "node-b" } },
      ]);
      assert.deepEqual((await ownerOf(store, VOLUME)).standbys, ["node-a", "node-b"]);
    });

    await t.step(
      "2: B receives A's backups in the background, in full then by increments",
      async () => {
        onA = await claimVolume(a.plugin!, { volume_id: volumeId, volume_context: {} }, "alloc-1");
        for (let i = 0; i < 4; i++) await writeRandom(`${onA.target}/f${i}.bin`, MiB);
        const [first, fullMs] = await caughtUp(b);
        const full = await loggedRecords(b, "standby copy received", 0);
        assert.equal(full[0]?.kind, "full", `B's first receive is full${logTail(b, 30)}`);
        assert.ok(Number(full[0]?.bytes) > 4 * MiB, "B received A's 4 MiB");
        print(`standby: B reached the head (full, ${full[0]?.bytes} bytes) in ${fullMs} ms`);

        const mark = b.plugin!.records().length;
        await writeRandom(`${onA.target}/more.bin`, 256 * KiB);
        const [, incMs] = await caughtUp(b, first);
        const inc = await loggedRecords(b, "standby copy received", mark);
        assert.ok(inc.length > 0 && inc.every((r) => r.kind === "increment"), logTail(b, 30));
        const bytes = inc.reduce((n, r) => n + Number(r.bytes), 0);
        assert.ok(bytes < 2 * MiB, `B received only the increment (${bytes} bytes)`);
        print(`standby: B followed an increment (${bytes} bytes) in ${incMs} ms`);
        assert.equal(await newestGuid(c.pool, datasetOn(c)), undefined, "C keeps no copy");
      },
    );

    await t.step("3: a move A→B receives only what A stored after B's last receive", async () => {
      await writeRandom(`${onA!.target}/last.bin`, 64 * KiB);
      hash = await treeHash(onA!.target);
      await onA!.release();
      const mark = b.plugin!.records().length;
      const started = performance.now();
      onB = await claimVolume(b.plugin!, { volume_id: volumeId, volume_context: {} }, "alloc-2");
      const stageMs = Math.round(performance.now() - started);
      assert.equal(await treeHash(onB.target), hash, "B sees A's last bytes");
      // What the stage received, and what the standby may have received just before it.
      const staged = records(b, "follow volume received", mark)
        .reduce((n, r) => n + Number(r.bytes), 0);
      const background = records(b, "standby copy received", mark)
        .reduce((n, r) => n + Number(r.bytes), 0);
      assert.ok(staged + background < 2 * MiB, `only the delta moved (${staged} + ${background})`);
      const planned = records(b, "follow volume held here", mark)[0]?.plan;
      assert.ok(
        planned === "increment" || planned === "current",
        `plan ${planned}${logTail(b, 30)}`,
      );
      print(
        `standby: move A→B received ${staged} bytes in the stage (${background} in the ` +
          `background since the release), stage took ${stageMs} ms, plan ${planned}`,
      );
    });

    await t.step("4: ListVolumes shows the holder and the condition", async () => {
      const res = await c.plugin!.client.controller("ListVolumes", {
        max_entries: 0,
        starting_token: "",
      });
      const entries = res.entries as {
        volume: { volume_id: string };
        status: { published_node_ids: string[]; volume_condition: { message: string } };
      }[];
      assert.deepEqual(entries.map((e) => e.volume.volume_id), [volumeId]);
      assert.deepEqual(entries[0]!.status.published_node_ids, ["node-b"]);
      assert.match(
        entries[0]!.status.volume_condition.message,
        /^Held by node "node-b" \(generation 2;.*the last copy in the store is \S+ old/,
      );
      const onB = await b.plugin!.client.controller("ListVolumes", {
        max_entries: 0,
        starting_token: "",
      });
      assert.deepEqual(
        (onB.entries as { volume: { volume_id: string } }[]).map((e) => e.volume.volume_id),
        [volumeId],
        "B's own copy is not listed as a volume of B's",
      );
    });

    await t.step(
      "5: A, the former holder, follows B's increments onto its released copy",
      async () => {
        const before = (await ownerOf(store, VOLUME)).head as string;
        const mark = a.plugin!.records().length;
        await writeRandom(`${onB!.target}/on-b.bin`, 128 * KiB);
        await caughtUp(a, before);
        const got = await loggedRecords(a, "standby copy received", mark);
        assert.ok(got.length > 0 && got.every((r) => r.kind === "increment"), logTail(a, 30));
        await onB!.release();
        onB = undefined;
      },
    );

    await t.step("cleanup: DeleteVolume removes the volume from the store's listings", async () => {
      await c.plugin!.client.controller("DeleteVolume", { volume_id: volumeId });
      const res = await c.plugin!.client.controller("ListVolumes", {
        max_entries: 0,
        starting_token: "",
      });
      assert.deepEqual(res.entries, []);
    });
  } finally {
    for (const n of nodes) await n.plugin?.stop().catch(() => {});
    for (const n of nodes) await n.pool.destroy().catch(() => {});
    await Deno.remove(dir, { recursive: true }).catch(() => {});
  }
});
