/**
 * Issue 13's core end to end: a volume that follows its job between two plugins (two nodes: two
 * pools, two parent datasets, one store), each the plugin as it ships (PluginProcess), called as
 * Nomad calls them. The same checks run for the directory store
 * (tests/integration/follow_move_test.ts) and a real S3 server (follow_move_s3_test.ts):
 *
 * 1. a clean move A→B: B's task sees exactly A's bytes (same tree hash);
 * 2. back B→A: A's copy is current up to B's first release, so only the increment moves;
 * 3. a lost holder: A's plugin is SIGKILLed while it holds the volume with writes the store
 *    never got; B's stage is refused, naming the holder, until the lease has been unchanged for
 *    TTL + --takeover-after as B sees it; then B takes over with the last copy;
 * 4. A comes back: it finds it was taken over and makes its copy read-only; its late upload is
 *    never the head; at its next stage its diverged copy is set aside (kept, with A's writes),
 *    and it receives the volume as B left it.
 * 5. A is lost again; `zfs-csi takeover` (the binary's subcommand, with the store only) frees
 *    the volume at once, and B stages it;
 * 6. DeleteVolume is refused while B holds it, then marks the volume deleted in the store.
 *
 * Throughout, at most one node has the volume's dataset mounted read-write.
 *
 * The other follow tests (follow_lifecycle_test.ts, follow_standby_test.ts) build their nodes
 * with the same pieces: createNode, startPlugin, killNodes, logTail, ownerOf.
 */

import assert from "node:assert/strict";
import { Code } from "../../src/errors.ts";
import type { SnapshotManifest } from "../../src/store/layout.ts";
import { type CsiClient, rejects } from "./csi_client.ts";
import {
  type Claim,
  claimPaths,
  claimVolume,
  createVolumeRequest,
  hostMounts,
  mountCapability,
  stagedClaim,
} from "./nomad.ts";
import { PluginProcess, runZfsCsi } from "./plugin_process.ts";
import type { StoreUnderTest } from "./store_flows.ts";
import { print } from "./store_trials.ts";
import { treeHash } from "./tree_hash.ts";
import { sh, TestPool } from "./zfs_pool.ts";

const KiB = 1024;
const MiB = 1024 * KiB;
const VOLUME = "moving";
/** The lease TTL and takeover wait the plugins run with: short, for a test. */
const LEASE_TTL_S = 3;
const TAKEOVER_AFTER_S = 4;
/** Long calls (a receive inside NodeStage): Nomad gives them no deadline. */
const STAGE_DEADLINE_MS = 180_000;

/** Writes `bytes` random bytes to `path`. */
export async function writeRandom(path: string, bytes: number): Promise<void> {
  const data = new Uint8Array(bytes);
  for (let i = 0; i < bytes; i += 65_536) {
    crypto.getRandomValues(data.subarray(i, Math.min(bytes, i + 65_536)));
  }
  await Deno.writeFile(path, data);
}

/** Every manifest of the volume in the store, read without the plugin's code. */
async function manifestsOf(store: StoreUnderTest): Promise<SnapshotManifest[]> {
  const keys = await store.keys(`v1/volumes/${VOLUME}/snapshots/`);
  const out: SnapshotManifest[] = [];
  for (const key of keys.filter((k) => k.endsWith(".json"))) {
    const bytes = await store.read(key);
    if (bytes) out.push(JSON.parse(new TextDecoder().decode(bytes)) as SnapshotManifest);
  }
  return out;
}

/** The owner object of `volume`, read without the plugin's code. */
export async function ownerOf(
  store: StoreUnderTest,
  volume: string,
): Promise<Record<string, unknown>> {
  const bytes = await store.read(`v1/volumes/${volume}/owner.json`);
  assert.ok(bytes, "the store holds the owner object");
  return JSON.parse(new TextDecoder().decode(bytes)) as Record<string, unknown>;
}

/** Guids of the head's chain, full stream first. */
function chainOf(manifests: readonly SnapshotManifest[], head: string): string[] {
  const byGuid = new Map(manifests.map((m) => [m.guid, m]));
  const out: string[] = [];
  for (let m = byGuid.get(head); m; m = m.baseGuid ? byGuid.get(m.baseGuid) : undefined) {
    out.unshift(m.guid);
  }
  return out;
}

/** A node of the follow tests: its pool and the plugin that runs on it now. */
export interface FollowNode {
  readonly name: string;
  readonly pool: TestPool;
  plugin?: PluginProcess;
}

/** A node named `name` on a new file-backed pool, with no plugin running yet. */
export async function createNode(name: string): Promise<FollowNode> {
  return { name, pool: await TestPool.create() };
}

/**
 * Starts the plugin as it ships on `node` (its pool's parent dataset, its name as node id),
 * given `store`, with `flags` after the store's own.
 */
export async function startPlugin(
  node: FollowNode,
  store: StoreUnderTest,
  flags: readonly string[],
): Promise<void> {
  node.plugin = await PluginProcess.start({
    parentDataset: node.pool.parent,
    dir: node.pool.dir,
    nodeId: node.name,
    ...store.plugin,
    extraArgs: [...store.plugin.extraArgs ?? [], ...flags],
  });
}

/** Kills every node's plugin (SIGKILL), then destroys every node's pool. */
export async function killNodes(nodes: readonly FollowNode[]): Promise<void> {
  for (const node of nodes) await node.plugin?.stop("SIGKILL");
  for (const node of nodes) await node.pool.destroy();
}

/** The last `n` log lines of `node`'s plugin, for failure messages. */
export function logTail(node: FollowNode, n = 25): string {
  return `\n--- ${node.name}'s last log lines ---\n${
    node.plugin?.logs().slice(-n).join("\n") ?? ""
  }`;
}

/** Mount points of `dataset` that are writable (the dataset's own mount and bind mounts). */
async function writableMounts(dataset: string): Promise<string[]> {
  return (await hostMounts())
    .filter((m) => m.source === dataset && !m.options.includes("ro"))
    .map((m) => m.path);
}

/** The follow flows against `store`; see the module doc. */
export async function followFlows(t: Deno.TestContext, store: StoreUnderTest): Promise<void> {
  const a = await createNode("node-a");
  const b = await createNode("node-b");
  const start = (node: FollowNode) =>
    startPlugin(node, store, [
      "--lease-ttl",
      `${LEASE_TTL_S}s`,
      "--takeover-after",
      `${TAKEOVER_AFTER_S}s`,
    ]);
  const client = (node: FollowNode): CsiClient => node.plugin!.client;
  const datasetOn = (node: FollowNode) => `${node.pool.parent}/${VOLUME}`;
  let volumeId = "";
  let allocs = 0;

  /** Stages and publishes the volume on `node` as Nomad does for a new alloc there. */
  const claim = (node: FollowNode): Promise<Claim> =>
    claimVolume(
      () => node.plugin!,
      { volume_id: volumeId, volume_context: {} },
      `alloc-${++allocs}`,
      { nomadVolumeId: VOLUME, stageDeadlineMs: STAGE_DEADLINE_MS },
    );

  /** At most one node has the volume mounted writable, and `holder` is that node (or none). */
  const checkOneWriter = async (holder: FollowNode | undefined, when: string) => {
    const onA = await writableMounts(datasetOn(a));
    const onB = await writableMounts(datasetOn(b));
    if (holder !== a) assert.deepEqual(onA, [], `${when}: nothing of node-a's copy is writable`);
    if (holder !== b) assert.deepEqual(onB, [], `${when}: nothing of node-b's copy is writable`);
    if (holder) {
      assert.ok(
        (holder === a ? onA : onB).length > 0,
        `${when}: ${holder.name} has the volume mounted writable`,
      );
    }
  };

  /** The bytes the plugin of `node` logged receiving for the volume since `from` lines. */
  const receivedBytes = (node: FollowNode, from: number) =>
    node.plugin!.records().slice(from).filter((r) => r.msg === "follow volume received")
      .reduce((n, r) => n + Number(r.bytes), 0);

  /**
   * Brings node A's plugin back after a kill while another node took its volume over: A's
   * staging and target mounts survived the kill and are removed as Nomad's GC would, without
   * the plugin; then A's renewal must find it was taken over, mark its copy fenced, read-only
   * and unmounted.
   */
  const restartFenced = async () => {
    const stale = (await hostMounts()).filter((m) =>
      m.source === datasetOn(a) && m.path.startsWith(a.plugin!.baseDir)
    ).map((m) => m.path).sort().reverse();
    for (const path of stale) await sh("umount", path);
    await start(a);
    const deadline = Date.now() + 30_000;
    const fenced = async () =>
      await a.pool.get(datasetOn(a), "org.zfs-csi:follow-released") === "fenced" &&
      await a.pool.get(datasetOn(a), "mounted") === "no";
    while (!await fenced()) {
      assert.ok(Date.now() < deadline, `A's copy is still writable${logTail(a)}`);
      await new Promise((r) => setTimeout(r, 500));
    }
    assert.equal(await a.pool.get(datasetOn(a), "readonly"), "on", "A's fenced copy is read-only");
  };

  try {
    await start(a);
    await start(b);
    let hash = "";
    let onA: Claim | undefined;
    let onB: Claim | undefined;

    await t.step("create: the store holds the volume, no node does", async () => {
      const res = await client(a).controller(
        "CreateVolume",
        createVolumeRequest(VOLUME, {
          parameters: { follow: "true", backup_interval: "1h" },
          capacity_range: { required_bytes: String(128 * MiB), limit_bytes: "0" },
        }),
      );
      volumeId = res.volume.volume_id;
      assert.equal(volumeId, `${VOLUME}@*`);
      assert.deepEqual(res.volume.accessible_topology, [], "no topology: any node may stage it");
      const owner = await ownerOf(store, VOLUME);
      assert.equal(owner.state, "released");
      assert.equal(owner.head, null);
      assert.equal(
        await sh("zfs", "list", "-H", "-o", "name", "-r", a.pool.parent).then((o) =>
          o.includes(`/${VOLUME}`)
        ),
        false,
        "CreateVolume made no dataset",
      );
    });

    await t.step("1: A writes; a clean move A→B gives B exactly A's bytes", async () => {
      onA = await claim(a);
      await Deno.mkdir(`${onA.target}/dir`);
      for (let i = 0; i < 4; i++) await writeRandom(`${onA.target}/dir/f${i}.bin`, MiB);
      hash = await treeHash(onA.target);
      await checkOneWriter(a, "A holds it");
      await onA.release();
      await checkOneWriter(undefined, "after A's unstage");
      const owner = await ownerOf(store, VOLUME);
      assert.equal(owner.state, "released");
      assert.equal(owner.holder, "node-a");
      assert.equal(await a.pool.get(datasetOn(a), "readonly"), "on", "A's warm copy is read-only");
      const mark = b.plugin!.records().length;
      onB = await claim(b);
      assert.equal(await treeHash(onB.target), hash, "B sees A's bytes");
      await checkOneWriter(b, "B holds it");
      const full = receivedBytes(b, mark);
      assert.ok(full > 4 * MiB, `B received the full stream (${full} bytes)`);
      print(`follow: A→B (cold) received ${full} bytes`);
    });

    await t.step("2: back B→A moves only the increment", async () => {
      await writeRandom(`${onB!.target}/more.bin`, 64 * KiB);
      hash = await treeHash(onB!.target);
      await onB!.release();
      const mark = a.plugin!.records().length;
      onA = await claim(a);
      assert.equal(await treeHash(onA.target), hash, "A sees B's bytes");
      const moved = receivedBytes(a, mark);
      const increments = a.plugin!.records().slice(mark).filter((r) =>
        r.msg === "follow volume held here"
      ).map((r) => r.plan);
      assert.deepEqual(increments, ["increment"], "A received an increment on its warm copy");
      assert.ok(moved > 0 && moved < MiB, `B→A moved ${moved} bytes, not the 4 MiB`);
      print(`follow: B→A (warm) received ${moved} bytes`);
      await checkOneWriter(a, "A holds it again");
    });

    let lastCopy = "";
    let headBeforeKill = "";
    await t.step("3: A is lost; B is refused until the rule allows, then takes over", async () => {
      // What the store has now is the last copy; A writes more, which the store never gets.
      lastCopy = hash;
      headBeforeKill = String((await ownerOf(store, VOLUME)).head);
      await writeRandom(`${onA!.target}/lost.bin`, 256 * KiB);
      await a.plugin!.stop("SIGKILL");
      const started = performance.now();
      const pb = await claimPaths(b.plugin!.baseDir, { volumeId: VOLUME, allocId: "alloc-b2" });
      const stage = () =>
        client(b).node("NodeStageVolume", {
          volume_id: volumeId,
          volume_capability: mountCapability(),
          volume_context: {},
          staging_target_path: pb.staging,
        }, STAGE_DEADLINE_MS);
      const refusal = await rejects(stage(), Code.FAILED_PRECONDITION, /held by node "node-a"/);
      assert.match(refusal, /last renewed its lease at \d{4}-/);
      assert.match(refusal, /the last copy in the store is from \d{4}-.*old\)/);
      assert.match(refusal, /may be taken over once its lease has been unchanged for 7s/);
      let refused = 1;
      for (;;) {
        await new Promise((r) => setTimeout(r, 1_000));
        try {
          await stage();
          break;
        } catch (err) {
          const details = (err as { details?: string }).details ?? String(err);
          assert.match(details, /held by node "node-a"/, logTail(b));
          refused++;
          assert.ok(performance.now() - started < 60_000, `still refused after 60 s${logTail(b)}`);
        }
      }
      const waitedMs = Math.round(performance.now() - started);
      assert.ok(
        waitedMs >= (LEASE_TTL_S + TAKEOVER_AFTER_S) * 1000,
        `taken over after ${waitedMs} ms, not before TTL + takeover-after`,
      );
      print(`follow: B refused ${refused} times, took over after ${waitedMs} ms`);
      await client(b).node("NodePublishVolume", {
        volume_id: volumeId,
        volume_capability: mountCapability(),
        volume_context: {},
        staging_target_path: pb.staging,
        target_path: pb.target,
      });
      assert.equal(await treeHash(pb.target), lastCopy, "B has the last copy in the store");
      const owner = await ownerOf(store, VOLUME);
      assert.equal(owner.holder, "node-b");
      assert.equal(owner.state, "held");
      assert.equal(owner.head, headBeforeKill, "the head is the last copy A stored");
      hash = lastCopy;
      onB = stagedClaim(() => b.plugin!, volumeId, pb, { stageDeadlineMs: STAGE_DEADLINE_MS });
    });

    await t.step(
      "4: A comes back: fenced, its diverged copy set aside, never published",
      async () => {
        // A's copy looks never backed up, so A's scheduler uploads it as soon as A is back,
        // before A's renewal finds out: a late upload, which must never become the head.
        const before = new Set((await manifestsOf(store)).map((m) => m.guid));
        await sh("zfs", "inherit", "org.zfs-csi:backup-last", datasetOn(a));
        await restartFenced();
        await checkOneWriter(b, "A is back, B holds it");
        const owner = await ownerOf(store, VOLUME);
        assert.equal(owner.holder, "node-b");
        assert.equal(owner.head, headBeforeKill, "the head is still the last copy A released");
        const after = await manifestsOf(store);
        const chain = chainOf(after, String(owner.head));
        const late = after.filter((m) => !before.has(m.guid));
        for (const m of late) {
          assert.equal(m.node, "node-a");
          assert.ok(!chain.includes(m.guid), `late upload ${m.guid} is not on the head's chain`);
        }
        print(`follow: ${late.length} late upload(s) of node-a, none on the head's chain`);

        // B lets go; A's next stage sets its diverged copy aside and receives B's.
        await writeRandom(`${onB!.target}/after-takeover.bin`, 32 * KiB);
        hash = await treeHash(onB!.target);
        await onB!.release();
        const mark = a.plugin!.records().length;
        onA = await claim(a);
        assert.equal(await treeHash(onA.target), hash, "A sees B's bytes, not its own lost ones");
        const held = a.plugin!.records().slice(mark).find((r) =>
          r.msg === "follow volume held here"
        );
        assert.equal(held?.plan, "full", logTail(a));
        const aside = (await a.pool.datasets()).filter((d) => d.includes("/.deleted-"));
        assert.equal(aside.length, 1, `one set-aside copy on A: ${aside.join(", ")}`);
        assert.equal(
          await a.pool.get(aside[0]!, "org.zfs-csi:deleted-name"),
          datasetOn(a),
          "the set-aside copy says what it was",
        );
        await checkOneWriter(a, "A holds it after the takeover");
      },
    );

    await t.step(
      "5: an explicit takeover (zfs-csi takeover) frees a lost holder's volume at once",
      async () => {
        hash = await treeHash(onA!.target);
        const ownerBefore = await ownerOf(store, VOLUME);
        await a.plugin!.stop("SIGKILL");
        const pb = await claimPaths(b.plugin!.baseDir, { volumeId: VOLUME, allocId: "alloc-b3" });
        const req = {
          volume_id: volumeId,
          volume_capability: mountCapability(),
          volume_context: {},
          staging_target_path: pb.staging,
        };
        await rejects(
          client(b).node("NodeStageVolume", req, STAGE_DEADLINE_MS),
          Code.FAILED_PRECONDITION,
          /held by node "node-a"/,
        );
        // The operator's command, as it ships, on node-b's flags: it needs the store only.
        const cli = await runZfsCsi(
          b.pool.dir,
          [
            "takeover",
            "--parent-dataset",
            b.pool.parent,
            "--node-id",
            "node-b",
            ...store.plugin.extraArgs ?? [],
            VOLUME,
            // A dry run without it; A's lease went silent when A was killed, so no --force.
            "--yes",
          ],
          {
            ...(store.plugin.scope ? { scope: store.plugin.scope } : {}),
            ...(store.plugin.env ? { env: store.plugin.env } : {}),
          },
        );
        assert.equal(cli.code, 0, cli.stderr);
        assert.match(cli.stdout, /was taken from node "node-a"/);
        const owner = await ownerOf(store, VOLUME);
        assert.equal(owner.state, "released");
        assert.equal(owner.generation, Number(ownerBefore.generation) + 1, "the takeover fences A");
        assert.match(String(owner.releasedBy), /takeover by zfs-csi takeover on node "node-b"/);
        await client(b).node("NodeStageVolume", req, STAGE_DEADLINE_MS);
        await client(b).node("NodePublishVolume", { ...req, target_path: pb.target });
        // A stored nothing since its stage received B's copy: B gets that copy back.
        assert.equal(await treeHash(pb.target), hash);
        await restartFenced();
        await checkOneWriter(b, "B holds it after the explicit takeover, A is back");
        onB = stagedClaim(() => b.plugin!, volumeId, pb, { stageDeadlineMs: STAGE_DEADLINE_MS });
      },
    );

    await t.step(
      "6: DeleteVolume is refused while a node holds it, then marks it deleted",
      async () => {
        await rejects(
          client(b).controller("DeleteVolume", { volume_id: volumeId }),
          Code.FAILED_PRECONDITION,
          /in use: held by node "node-b"/,
        );
        await onB!.release();
        await checkOneWriter(undefined, "at the end");
        await client(b).controller("DeleteVolume", { volume_id: volumeId });
        assert.equal((await ownerOf(store, VOLUME)).state, "deleted");
        const record = JSON.parse(
          new TextDecoder().decode(await store.read(`v1/volumes/${VOLUME}/volume.json`)),
        );
        assert.ok(record.deletedAt, "the record's deletedAt starts the store's retention");
        assert.equal(
          (await b.pool.datasets()).includes(datasetOn(b)),
          false,
          "node-b's copy is set aside like any deleted volume",
        );
      },
    );
  } finally {
    await killNodes([a, b]);
  }
}
