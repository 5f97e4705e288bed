/**
 * Self-fencing with the plugin as it ships (issue 21, a holder cut off from the store but
 * alive): two plugins on two pools and one real S3 server (versitygw), both with
 * `--takeover-after`; node A reaches the store through a fault proxy (tests/support/
 * fault_proxy.ts), node B directly. A holds a volume, its job's copy mounted writable; then A's
 * requests for the volume's owner object answer 503 (or stall). B keeps staging the volume:
 * refused, naming A, until A's lease has been unchanged for TTL + --takeover-after, then it
 * takes the volume over. Both copies' `readonly` are sampled together, in one `zfs get`, all
 * along: A's copy must be read-only before B's is writable, and the two are never writable at
 * once. When A reaches the store again it learns of the takeover and fences its copy.
 *
 * What A's job sees is sampled by the job's own means: creating a file in A's target (EROFS
 * once A's copy is read-only) and writing through a file it holds open. zfs-fuse enforces
 * `readonly=on` on a mounted filesystem when a file is opened (creating one fails with EROFS),
 * not on a file already open for writing, and reports the mounted filesystem's `readonly` as
 * the mount's ("off", source temporary); OpenZFS remounts it read-only at once, and also
 * refuses writes through open files, which this test checks there (the VM).
 */

import assert from "node:assert/strict";
import { Code } from "../../src/errors.ts";
import { rejects } from "../support/csi_client.ts";
import { type Fault, FaultProxy } from "../support/fault_proxy.ts";
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
  claimPaths,
  claimVolume,
  createVolumeRequest,
  mountCapability,
  stagedClaim,
} from "../support/nomad.ts";
import { S3Server } from "../support/s3_server.ts";
import { s3StoreUnderTest, type StoreUnderTest } from "../support/store_flows.ts";
import { print } from "../support/store_trials.ts";
import { tryRun } from "../support/zfs_pool.ts";

const MiB = 1024 * 1024;
/**
 * Short leases, for a test: 3 s (renewed every second, suspended 2.25 s after the last write
 * that landed), or ZFS_CSI_TEST_LEASE_TTL_S for a slow machine (the OpenZFS VM under TCG, where
 * a zfs command takes seconds); --takeover-after a third of it, at least 1 s.
 */
const LEASE_TTL_S = Number(Deno.env.get("ZFS_CSI_TEST_LEASE_TTL_S") ?? "3");
if (!Number.isInteger(LEASE_TTL_S) || LEASE_TTL_S < 3) {
  throw new RangeError(`ZFS_CSI_TEST_LEASE_TTL_S must be an integer of at least 3`);
}
const TAKEOVER_AFTER_S = Math.max(1, Math.round(LEASE_TTL_S / 3));
/** TTL + --takeover-after, in ms: the time scale of every wait below. */
const RULE_MS = (LEASE_TTL_S + TAKEOVER_AFTER_S) * 1000;
/** How long a stalled request waits at the proxy: well past the takeover. */
const STALL_MS = 5 * RULE_MS;
const STAGE_DEADLINE_MS = 180_000;
const PREFIX = "clusters/selffence";
const VOLUME = "fenced";
const SUSPENDED = "org.zfs-csi:follow-suspended";

/** `store` as a plugin reaches it through `endpoint` (a proxy) instead of the server. */
function via(store: StoreUnderTest, endpoint: URL): StoreUnderTest {
  const args = [...store.plugin.extraArgs ?? []];
  args[args.indexOf("--store-endpoint") + 1] = endpoint.origin;
  return {
    ...store,
    plugin: { ...store.plugin, extraArgs: args, scope: { netHosts: [endpoint.host] } },
  };
}

/** Whether a request is for the volume's owner object. */
function toOwner(r: Request): boolean {
  return new URL(r.url).pathname.endsWith(`/${PREFIX}/v1/volumes/${VOLUME}/owner.json`);
}

/**
 * One look at both copies, A's as its job sees it, then B's `readonly` and A's suspended marker
 * (one `zfs get`; "-" while a copy does not exist).
 */
interface Sample {
  readonly ms: number;
  /** Whether a new file could be created in A's target. */
  readonly aCreates: boolean;
  /** Whether a write through a file A's job holds open went through. */
  readonly aOpenWrites: boolean;
  readonly aMarker: string;
  readonly b: string;
}

/**
 * Samples every `everyMs` until stopped. A's `readonly` is not read: zfs-fuse reports a mounted
 * filesystem's as the mount's ("off", source temporary) after `zfs set readonly=on`.
 */
function sampler(targetA: string, dsA: string, dsB: string, everyMs = 100) {
  const samples: Sample[] = [];
  const started = performance.now();
  let stopped = false;
  const run = (async () => {
    // A job's file, open for writing all along.
    const open = await Deno.open(`${targetA}/open.bin`, { write: true, create: true });
    try {
      for (let n = 0; !stopped; n++) {
        const ms = Math.round(performance.now() - started);
        const aCreates = await Deno.writeFile(`${targetA}/probe-${n}`, new Uint8Array(1))
          .then(() => true, () => false);
        const aOpenWrites = await open.write(new Uint8Array(512)).then(() => true, () => false);
        const r = await tryRun(
          "zfs",
          "get",
          "-H",
          "-o",
          "name,property,value",
          `readonly,${SUSPENDED}`,
          dsA,
          dsB,
        );
        const values = new Map(
          r.stdout.split("\n").filter((l) => l !== "").map((l) => {
            const [name, prop, value] = l.split("\t");
            return [`${name} ${prop}`, value ?? ""] as const;
          }),
        );
        samples.push({
          ms,
          aCreates,
          aOpenWrites,
          aMarker: values.get(`${dsA} ${SUSPENDED}`) ?? "-",
          b: values.get(`${dsB} readonly`) ?? "-",
        });
        await new Promise((res) => setTimeout(res, everyMs));
      }
    } finally {
      open.close();
    }
  })();
  return {
    /** performance.now() at the first sample: samples' `ms` count from here. */
    started,
    async stop(): Promise<Sample[]> {
      stopped = true;
      await run;
      return samples;
    },
  };
}

/** Whether the pools run OpenZFS (it knows `relatime`; zfs-fuse does not). */
async function openzfs(dataset: string): Promise<boolean> {
  return (await tryRun("zfs", "get", "-H", "-o", "value", "relatime", dataset)).code === 0;
}

function selfFenceTest(name: string, fault: Fault): void {
  Deno.test({
    name,
    sanitizeOps: false,
    sanitizeResources: false,
    async fn() {
      const server = await S3Server.start();
      const proxy = new FaultProxy(server.endpoint);
      const store = s3StoreUnderTest(server, PREFIX);
      const a = await createNode("node-a");
      const b = await createNode("node-b");
      const flags = ["--lease-ttl", `${LEASE_TTL_S}s`, "--takeover-after", `${TAKEOVER_AFTER_S}s`];
      try {
        await startPlugin(a, via(store, proxy.endpoint), flags);
        await startPlugin(b, store, flags);
        await run(a, b, proxy, store, fault);
      } finally {
        proxy.set({ kind: "pass" });
        await killNodes([a, b]);
        await proxy.stop();
        await server.stop();
      }
    },
  });
}

async function run(
  a: FollowNode,
  b: FollowNode,
  proxy: FaultProxy,
  store: StoreUnderTest,
  fault: Fault,
): Promise<void> {
  const created = await a.plugin!.client.controller(
    "CreateVolume",
    createVolumeRequest(VOLUME, {
      parameters: { follow: "true", backup_interval: "1h" },
      capacity_range: { required_bytes: String(64 * MiB), limit_bytes: "0" },
    }),
  );
  const volumeId = created.volume.volume_id as string;
  const onA = await claimVolume(
    () => a.plugin!,
    { volume_id: volumeId, volume_context: {} },
    "alloc-a",
    { nomadVolumeId: VOLUME, stageDeadlineMs: STAGE_DEADLINE_MS },
  );
  await writeRandom(`${onA.target}/before.bin`, 256 * 1024);
  const dsA = `${a.pool.parent}/${VOLUME}`;
  const dsB = `${b.pool.parent}/${VOLUME}`;
  // A's store path for the owner object fails from now on; B reaches the store as before.
  const look = sampler(onA.target, dsA, dsB);
  // A few looks while all is well.
  await new Promise((res) => setTimeout(res, 500));
  proxy.set(fault, toOwner);
  const cut = performance.now();
  const paths = await claimPaths(b.plugin!.baseDir, { volumeId: VOLUME, allocId: "alloc-b" });
  const req = {
    volume_id: volumeId,
    volume_capability: mountCapability(),
    volume_context: {},
    staging_target_path: paths.staging,
  };
  let refused = 0;
  let stagedMs = 0;
  for (;;) {
    try {
      await b.plugin!.client.node("NodeStageVolume", req, STAGE_DEADLINE_MS);
      stagedMs = Math.round(performance.now() - cut);
      break;
    } catch (err) {
      const details = String((err as { details?: string }).details ?? err);
      if (/held by node "node-a"/.test(details)) refused++;
      else print(`follow self-fence: B's stage failed otherwise, tried again: ${details}`);
      assert.ok(performance.now() - cut < 15 * RULE_MS, `B never took over${logTail(b)}`);
      await new Promise((res) => setTimeout(res, 250));
    }
  }
  await b.plugin!.client.node("NodePublishVolume", { ...req, target_path: paths.target });
  // A few more looks with both copies staged.
  await new Promise((res) => setTimeout(res, 1_000));
  const samples = await look.stop();
  assert.ok(refused > 0, "B was refused while A's lease was fresh");
  assert.ok(samples[0]!.aCreates && samples[0]!.b === "-", "at first only A's copy, writable");
  // What the samples show: A's job could not create a file any more before B's copy was
  // writable, and never again since; never both.
  const both = samples.filter((s) => s.aCreates && s.b === "off");
  assert.deepEqual(both, [], `A's and B's copies writable at once${logTail(a)}`);
  const aRo = samples.findIndex((s) => !s.aCreates);
  const bRw = samples.findIndex((s) => s.b === "off");
  assert.ok(aRo >= 0, `A's copy never became read-only${logTail(a)}`);
  assert.ok(bRw >= 0, `B's copy never became writable${logTail(b)}`);
  assert.ok(aRo < bRw, `A read-only at sample ${aRo}, B writable at sample ${bRw}`);
  assert.ok(samples.slice(aRo).every((s) => !s.aCreates), "A's copy stayed read-only since");
  // Marked suspended: zfs-fuse sets one property per call, readonly first, so a look may fall
  // between the two.
  const marked = samples.findIndex((s) => s.aMarker === "on");
  assert.ok(marked >= aRo && marked <= aRo + 3, `marked suspended at sample ${marked}`);
  assert.ok(samples.slice(marked).every((s) => s.aMarker === "on"), "and stays so");
  // Times from the cut, as the samples count them.
  const since = (s: Sample | undefined) => s ? `${s.ms - Math.round(cut - look.started)} ms` : "-";
  const openFd = samples.slice(aRo).every((s) => !s.aOpenWrites)
    ? "refused too"
    : "went on (zfs-fuse checks read-only at open, not at each write)";
  print(
    `follow self-fence (${fault.kind}): ${samples.length} samples about 100 ms apart; after ` +
      `A was cut off, A's job met EROFS creating a file from ${since(samples[aRo])} (it ` +
      `created one at ${since(samples[aRo - 1])}); B's copy writable from ` +
      `${since(samples[bRw])}; B refused ${refused} times, its NodeStage answered at ` +
      `${stagedMs} ms (TTL ${LEASE_TTL_S}s + takeover-after ${TAKEOVER_AFTER_S}s); writes ` +
      `through A's open file after the suspension: ${openFd}`,
  );
  assert.equal((await ownerOf(store, VOLUME)).selfFence, true, "B promises to fence itself");
  assert.ok(
    a.plugin!.records().some((r) => String(r.msg).includes("was not renewed in time")),
    `A logged its suspension${logTail(a)}`,
  );
  assert.equal(await a.pool.get(dsA, "org.zfs-csi:follow-released"), "none", "suspended");
  if (await openzfs(dsA)) {
    assert.equal(openFd, "refused too", "OpenZFS refuses writes through open files as well");
  }
  // A reaches the store again: its next renewal is refused, and its copy is fenced.
  proxy.set({ kind: "pass" });
  const healed = performance.now();
  while ((await a.pool.get(dsA, "org.zfs-csi:follow-released")) !== "fenced") {
    assert.ok(
      performance.now() - healed < STALL_MS + 10 * RULE_MS,
      `A never learnt of the takeover${logTail(a)}`,
    );
    await new Promise((res) => setTimeout(res, 250));
  }
  // Still read-only for its job (its `readonly` reads "off" on zfs-fuse while it is mounted).
  const late = await Deno.writeFile(`${onA.target}/after-fencing`, new Uint8Array(1))
    .then(() => "written", (err: unknown) => String(err));
  assert.match(late, /Read-only file system|os error 30/);
  assert.equal(await a.pool.get(dsA, SUSPENDED), "off", "fenced, no longer suspended");
  assert.equal(await b.pool.get(dsB, "readonly"), "off");
  const owner = await ownerOf(store, VOLUME);
  assert.equal(owner.holder, "node-b");
  // Only B stages it now; A's new stage is refused, naming B.
  await rejects(
    a.plugin!.client.node("NodeStageVolume", {
      ...req,
      staging_target_path: (await claimPaths(a.plugin!.baseDir, {
        volumeId: VOLUME,
        allocId: "alloc-a2",
      })).staging,
    }, STAGE_DEADLINE_MS),
    Code.FAILED_PRECONDITION,
    /held by node "node-b"/,
  );
  await stagedClaim(() => b.plugin!, volumeId, paths, { stageDeadlineMs: STAGE_DEADLINE_MS })
    .release();
}

selfFenceTest(
  "follow self-fence: a holder whose store answers 503 makes its copy read-only before the taker's is writable",
  { kind: "error", status: 503, code: "ServiceUnavailable", count: 1_000_000 },
);

selfFenceTest(
  "follow self-fence: a holder whose store stalls makes its copy read-only before the taker's is writable",
  { kind: "delay", ms: STALL_MS },
);
