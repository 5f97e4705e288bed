/**
 * Follow volumes under store faults and Nomad's overlapping calls, with the plugin as it ships
 * on zfs-fuse pools and a real S3 server (versitygw); node A reaches it through fault proxies
 * (tests/support/fault_proxy.ts), node B directly (issue 21):
 *
 * 1. a long final upload of one volume holds up no lease: while A's release of "big" uploads
 *    for longer than TTL + --takeover-after, B is refused both "big" and "small" (listed after
 *    it on A), which A holds;
 * 2. a stage whose renewals all answer 503 while B takes the volume over by its rule never makes
 *    A's copy writable: A's stage fails, and only B's copy is writable;
 * 3. NodeUnstage of the old allocation and NodeStage of the new one sent together on A (Nomad
 *    before 1.11): whichever comes first, the store says A holds the volume, A's copy is writable
 *    and bound, and the job's bytes are there.
 */

import assert from "node:assert/strict";
import { Code } from "../../src/errors.ts";
import { rejects } from "../support/csi_client.ts";
import { FaultProxy } from "../support/fault_proxy.ts";
import {
  createNode,
  type FollowNode,
  killNodes,
  logTail,
  ownerOf,
  startPlugin,
  writeRandom,
} from "../support/follow_flows.ts";
import {
  type Claim,
  claimPaths,
  claimVolume,
  createVolumeRequest,
  hostMounts,
  mountCapability,
  stagedClaim,
} from "../support/nomad.ts";
import { S3Server } from "../support/s3_server.ts";
import { s3StoreUnderTest, type StoreUnderTest } from "../support/store_flows.ts";
import { print } from "../support/store_trials.ts";
import { treeHash } from "../support/tree_hash.ts";

const MiB = 1024 * 1024;
/** Short leases, for a test: renewed every second; taken over after 3 s + 1 s unchanged. */
const LEASE_TTL_S = 3;
const TAKEOVER_AFTER_S = 1;
const STAGE_DEADLINE_MS = 180_000;
const PREFIX = "clusters/faults";

/** `store` as a plugin reaches it through `endpoint` (a proxy) instead of the server. */
function via(store: StoreUnderTest, endpoint: URL): StoreUnderTest {
  const args = [...store.plugin.extraArgs ?? []];
  args[args.indexOf("--store-endpoint") + 1] = endpoint.origin;
  return {
    ...store,
    plugin: { ...store.plugin, extraArgs: args, scope: { netHosts: [endpoint.host] } },
  };
}

/** Whether a request goes to a key of volume `volume` below `part` ("streams/", "owner.json"). */
function toKey(r: Request, volume: string, part: string): boolean {
  return new URL(r.url).pathname.includes(`/${PREFIX}/v1/volumes/${volume}/${part}`);
}

/** Mount points of `dataset` that are writable (its own mount and bind mounts). */
async function writableMounts(dataset: string): Promise<string[]> {
  return (await hostMounts())
    .filter((m) => m.source === dataset && !m.options.includes("ro"))
    .map((m) => m.path);
}

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

/** What each test gets: versitygw, A behind two proxies in a row, B direct, a volume maker. */
interface Rig {
  readonly a: FollowNode;
  readonly b: FollowNode;
  /** In front of versitygw (A's second hop). */
  readonly near: FaultProxy;
  /** In front of `near` (A's first hop). */
  readonly far: FaultProxy;
  readonly store: StoreUnderTest;
  create(name: string): Promise<string>;
  claim(node: FollowNode, volumeId: string, name: string): Promise<Claim>;
}

function faultsTest(name: string, fn: (rig: Rig) => Promise<void>): void {
  Deno.test({
    name,
    sanitizeOps: false,
    sanitizeResources: false,
    async fn() {
      const server = await S3Server.start();
      const near = new FaultProxy(server.endpoint);
      const far = new FaultProxy(near.endpoint);
      const store = s3StoreUnderTest(server, PREFIX);
      const a = await createNode("node-a");
      const b = await createNode("node-b");
      let allocs = 0;
      try {
        const flags = [
          "--lease-ttl",
          `${LEASE_TTL_S}s`,
          "--takeover-after",
          `${TAKEOVER_AFTER_S}s`,
        ];
        await startPlugin(a, via(store, far.endpoint), flags);
        await startPlugin(b, store, flags);
        await fn({
          a,
          b,
          near,
          far,
          store,
          async create(volume) {
            const res = await a.plugin!.client.controller(
              "CreateVolume",
              createVolumeRequest(volume, {
                parameters: { follow: "true", backup_interval: "1h" },
                capacity_range: { required_bytes: String(64 * MiB), limit_bytes: "0" },
              }),
            );
            return res.volume.volume_id as string;
          },
          claim: (node, volumeId, volume) =>
            claimVolume(
              () => node.plugin!,
              { volume_id: volumeId, volume_context: {} },
              `alloc-${++allocs}`,
              { nomadVolumeId: volume, stageDeadlineMs: STAGE_DEADLINE_MS },
            ),
        });
      } finally {
        near.set({ kind: "pass" });
        far.set({ kind: "pass" });
        await killNodes([a, b]);
        await far.stop();
        await near.stop();
        await server.stop();
      }
    },
  });
}

/** NodeStage of `volume` on `node` at a new allocation's staging path. */
async function stageOn(node: FollowNode, volumeId: string, volume: string, alloc: string) {
  const paths = await claimPaths(node.plugin!.baseDir, { volumeId: volume, allocId: alloc });
  const req = {
    volume_id: volumeId,
    volume_capability: mountCapability(),
    volume_context: {},
    staging_target_path: paths.staging,
  };
  return {
    paths,
    stage: () => node.plugin!.client.node("NodeStageVolume", req, STAGE_DEADLINE_MS),
    publish: () =>
      node.plugin!.client.node("NodePublishVolume", { ...req, target_path: paths.target }),
  };
}

faultsTest(
  "follow faults: a long final upload of one volume holds up no lease, its own included",
  async (rig) => {
    const { a, b, far } = rig;
    const bigId = await rig.create("big");
    const smallId = await rig.create("small");
    const big = await rig.claim(a, bigId, "big");
    const small = await rig.claim(a, smallId, "small");
    await writeRandom(`${big.target}/data.bin`, 4 * MiB);
    await writeRandom(`${small.target}/data.bin`, 64 * 1024);
    const hash = await treeHash(big.target);
    // Every request of A's upload of "big" waits 10 s: the final upload takes well over the
    // TTL plus --takeover-after (4 s) that B waits for.
    far.set(
      { kind: "delay", ms: 10_000 },
      (r) => r.method !== "GET" && toKey(r, "big", "streams/"),
    );
    const started = performance.now();
    let released = false;
    const releasing = big.release().finally(() => released = true);
    releasing.catch(() => {});
    const bBig = await stageOn(b, bigId, "big", "alloc-b-big");
    const bSmall = await stageOn(b, smallId, "small", "alloc-b-small");
    let looks = 0;
    let bHasBig = false;
    const renewals = new Set<string>();
    while (!released && performance.now() - started < 60_000) {
      await rejects(bSmall.stage(), Code.FAILED_PRECONDITION, /held by node "node-a"/);
      // Refused until A's release lands in the store (its NodeUnstage answers a little later).
      if (!bHasBig) {
        try {
          await bBig.stage();
          bHasBig = true;
        } catch (err) {
          assert.match(
            String((err as { details?: string }).details ?? err),
            /held by node "node-a"/,
          );
        }
      }
      renewals.add(String((await ownerOf(rig.store, "small")).renewedAt));
      looks++;
      await sleep(1_000);
    }
    const uploadMs = Math.round(performance.now() - started);
    assert.ok(
      uploadMs > (LEASE_TTL_S + TAKEOVER_AFTER_S) * 1000 * 2,
      `the final upload took ${uploadMs} ms, long enough for a takeover`,
    );
    await releasing;
    far.set({ kind: "pass" });
    const takeovers = b.plugin!.records().filter((r) =>
      r.msg === "follow volume taken over from a holder that stopped renewing"
    );
    assert.deepEqual(takeovers, [], "B never took a volume over from A");
    assert.ok(renewals.size >= 3, `"small" was renewed meanwhile (${renewals.size} stamps seen)`);
    const owner = await ownerOf(rig.store, "big");
    assert.equal(owner.holder, bHasBig ? "node-b" : "node-a", logTail(a));
    assert.equal(owner.state, bHasBig ? "held" : "released", logTail(a));
    assert.equal((await ownerOf(rig.store, "small")).holder, "node-a");
    print(`follow faults: B refused ${looks} times during a ${uploadMs} ms final upload`);
    // Released now: B takes "big" with A's bytes.
    if (!bHasBig) await bBig.stage();
    await bBig.publish();
    assert.equal(await treeHash(bBig.paths.target), hash, "B has A's last bytes");
    const onB = stagedClaim(() => b.plugin!, bigId, bBig.paths, {
      stageDeadlineMs: STAGE_DEADLINE_MS,
    });
    await onB.release();
    await small.release();
  },
);

faultsTest(
  "follow faults: a stage whose renewals answer 503 while another node takes over never makes its copy writable",
  async (rig) => {
    const { a, b, near, far } = rig;
    const volumeId = await rig.create("moving");
    // B holds it first and stores 4 MiB; its release leaves a warm copy there.
    const first = await rig.claim(b, volumeId, "moving");
    await writeRandom(`${first.target}/data.bin`, 4 * MiB);
    await first.release();
    // A's stage receives in full; each download request of it waits 15 s.
    far.set(
      { kind: "delay", ms: 15_000 },
      (r) => r.method === "GET" && toKey(r, "moving", "streams/"),
    );
    const aStage = await stageOn(a, volumeId, "moving", "alloc-a");
    const staging = aStage.stage();
    staging.catch(() => {});
    // Once A holds it, every request of A for the owner object answers 503.
    const deadline = performance.now() + 30_000;
    while ((await ownerOf(rig.store, "moving")).holder !== "node-a") {
      assert.ok(performance.now() < deadline, `A never acquired${logTail(a)}`);
      await sleep(100);
    }
    near.set(
      { kind: "error", status: 503, code: "ServiceUnavailable", count: 1_000 },
      // Reads too: after a write without an answer the store reads the object back, and
      // would learn of the takeover from it.
      (r) => toKey(r, "moving", "owner.json"),
    );
    // B, which reaches the store, takes it over by its rule once A's lease stood still.
    const bStage = await stageOn(b, volumeId, "moving", "alloc-b");
    let refused = 0;
    for (;;) {
      try {
        await bStage.stage();
        break;
      } catch (err) {
        const details = String((err as { details?: string }).details ?? err);
        // zfs-fuse now and then fails a command under load ("Connection reset by peer"): the
        // stage hands the volume back and the next try goes on.
        if (/held by node "node-a"/.test(details)) refused++;
        else print(`follow faults: B's stage failed otherwise, tried again: ${details}`);
        assert.ok(performance.now() < deadline, `B never took over${logTail(b)}`);
        await sleep(500);
      }
    }
    assert.ok(refused > 0, "B was refused while A's lease was fresh");
    await bStage.publish();
    assert.equal((await ownerOf(rig.store, "moving")).holder, "node-b");
    // A's receive ends while its writes still answer 503: nothing proves A holds the volume.
    const failure = await staging.then(() => undefined, (err: unknown) => err);
    assert.ok(failure, `A's stage must fail${logTail(a)}`);
    print(`follow faults: A's stage failed: ${(failure as { details?: string }).details}`);
    near.set({ kind: "pass" });
    far.set({ kind: "pass" });
    const dsA = `${a.pool.parent}/moving`;
    const dsB = `${b.pool.parent}/moving`;
    assert.deepEqual(await writableMounts(dsA), [], `nothing of A's copy is writable${logTail(a)}`);
    assert.notEqual(await a.pool.get(dsA, "readonly").catch(() => "on"), "off");
    assert.ok((await writableMounts(dsB)).length > 0, "B's copy is mounted writable");
    const onB = stagedClaim(() => b.plugin!, volumeId, bStage.paths, {
      stageDeadlineMs: STAGE_DEADLINE_MS,
    });
    await onB.release();
  },
);

faultsTest(
  "follow faults: NodeUnstage of the old allocation and NodeStage of the new one together on one node",
  async (rig) => {
    const { a } = rig;
    const volumeId = await rig.create("overlap");
    const ds = `${a.pool.parent}/overlap`;
    let old = await rig.claim(a, volumeId, "overlap");
    for (let round = 1; round <= 3; round++) {
      await writeRandom(`${old.target}/round-${round}.bin`, 256 * 1024);
      const hash = await treeHash(old.target);
      const before = await ownerOf(rig.store, "overlap");
      // Nomad before 1.11: the old allocation's unpublish and unstage, and the new one's stage
      // and publish, at the same time (the same staging path: one per volume and node).
      const next = await stageOn(a, volumeId, "overlap", `alloc-new-${round}`);
      await a.plugin!.client.node("NodeUnpublishVolume", {
        volume_id: volumeId,
        target_path: old.target,
      });
      const unstage = a.plugin!.client.node("NodeUnstageVolume", {
        volume_id: volumeId,
        staging_target_path: next.paths.staging,
      }, STAGE_DEADLINE_MS);
      const stage = next.stage();
      const [u, s] = await Promise.allSettled([unstage, stage]);
      assert.equal(u.status, "fulfilled", `round ${round}: unstage ${String(u)}${logTail(a)}`);
      assert.equal(s.status, "fulfilled", `round ${round}: stage ${String(s)}${logTail(a)}`);
      // Nomad publishes once the stage answered; its staging path may have been unmounted by
      // the old unstage if the stage bound first: then Nomad's publish fails and it stages
      // again (not the case this test looks at).
      await next.publish();
      const owner = await ownerOf(rig.store, "overlap");
      assert.equal(owner.state, "held", `round ${round}: the store calls it held${logTail(a)}`);
      assert.equal(owner.holder, "node-a");
      assert.ok(Number(owner.generation) >= Number(before.generation));
      assert.equal(await a.pool.get(ds, "readonly"), "off", `round ${round}${logTail(a)}`);
      assert.ok((await writableMounts(ds)).includes(next.paths.target), `round ${round}: bound`);
      assert.equal(await treeHash(next.paths.target), hash, `round ${round}: the job's bytes`);
      const skipped = a.plugin!.records().filter((r) => String(r.msg).includes("in use again"));
      print(
        `follow faults: overlap round ${round}: generation ${before.generation} → ` +
          `${owner.generation}, releases skipped so far: ${skipped.length}`,
      );
      old = stagedClaim(() => a.plugin!, volumeId, next.paths, {
        stageDeadlineMs: STAGE_DEADLINE_MS,
      });
    }
    await old.release();
    assert.equal((await ownerOf(rig.store, "overlap")).state, "released");
  },
);
