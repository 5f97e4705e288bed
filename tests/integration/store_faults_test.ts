/**
 * The store's faults, with real servers and real pools: versitygw (tests/support/s3_server.ts)
 * reached through a switch that takes it down (tests/support/tcp_switch.ts) or a proxy that
 * injects 500s, lost answers and delays (tests/support/fault_proxy.ts); a directory store on a
 * tmpfs that fills up; a second pool too small for a restore.
 * - A store that is down: CreateSnapshot fails UNAVAILABLE naming the store; Probe stays ready;
 *   volumes stage and publish; a scheduled backup fails, the volume's condition turns abnormal
 *   and the log says why; once the store is back the next backup succeeds and the condition
 *   clears.
 * - 500s for a few requests, and a manifest write whose answer is lost: backups and
 *   CreateSnapshot still complete, and the stored stream is whole.
 * - A full store: CreateSnapshot fails RESOURCE_EXHAUSTED, nothing is visible in the store and
 *   no temporary file is left, the volume is intact.
 * - A full pool on restore: CreateVolume fails RESOURCE_EXHAUSTED with a clear message and
 *   leaves no volume and no `.restore-*` dataset.
 * - A slow store does not slow stage/publish while a backup runs (measured, asserted loosely).
 */

import assert from "node:assert/strict";
import { Code } from "../../src/errors.ts";
import { type CallError, rejects } from "../support/csi_client.ts";
import { FaultProxy } from "../support/fault_proxy.ts";
import { claimPaths, mountCapability } from "../support/nomad.ts";
import { PluginProcess } from "../support/plugin_process.ts";
import { S3Server } from "../support/s3_server.ts";
import { BACKUP_LAST, startWithStore, stopWithBackupDue } from "../support/store_trial_plugin.ts";
import { type TrialVolume, volumeManifests } from "../support/store_trial_volumes.ts";
import {
  auditStore,
  datasetsBelow,
  fileStoreUnderTest,
  guidHex,
  MiB,
  print,
  recordsOf,
  s3StoreUnderTest,
  sleep,
  type StoreUnderTest,
  waitFor,
  writeRandomFile,
  zfsGet,
} from "../support/store_trials.ts";
import { TcpSwitch } from "../support/tcp_switch.ts";
import { treeHash } from "../support/tree_hash.ts";
import { sh, TestPool, tryRun } from "../support/zfs_pool.ts";

const NODE = "node-a";
const CAPACITY = 128 * MiB;

/** What the plugin reaches versitygw through: a switch that takes it down, or a fault proxy. */
type Front = AsyncDisposable & { readonly endpoint: URL };

/** The setup of a test against versitygw behind a front: the plugin runs on a pool of its own. */
interface S3Rig<F extends Front> extends AsyncDisposable {
  readonly server: S3Server;
  readonly front: F;
  readonly pool: TestPool;
  readonly sut: StoreUnderTest;
  /** The plugin started last (by `s3Rig` or `restartDue`). */
  readonly plugin: PluginProcess;
  /** Restarts the plugin with `dataset` due for a backup: its first tick backs the volume up. */
  restartDue(dataset: string): Promise<PluginProcess>;
}

/**
 * Starts versitygw, `front` before it, a pool and the plugin, in that order; disposing the rig
 * kills the plugin (SIGKILL) and then takes the rest down in the reverse order.
 */
async function s3Rig<F extends Front>(front: (target: URL) => F): Promise<S3Rig<F>> {
  // Whatever started is taken down again if a later start fails.
  await using stack = new AsyncDisposableStack();
  const server = stack.use(await S3Server.start());
  const f = stack.use(front(server.endpoint));
  const pool = stack.use(await TestPool.create());
  const sut = s3StoreUnderTest(server, f.endpoint);
  let plugin = await startWithStore(pool, sut, NODE);
  stack.defer(async () => {
    await plugin.stop("SIGKILL");
  });
  const all = stack.move();
  return {
    server,
    front: f,
    pool,
    sut,
    get plugin() {
      return plugin;
    },
    async restartDue(dataset: string) {
      await stopWithBackupDue(plugin, dataset);
      plugin = await startWithStore(pool, sut, NODE);
      return plugin;
    },
    [Symbol.asyncDispose]: () => all.disposeAsync(),
  };
}

/**
 * Registers a test of this file. Sanitizers off, as in the other store trials: the plugin's
 * process, its gRPC client and the servers are long-lived resources each test ends itself.
 */
function faultTest(name: string, fn: () => Promise<void>): void {
  Deno.test({ name, sanitizeOps: false, sanitizeResources: false, fn });
}

/** Registers a test of this file against versitygw behind a fault proxy (`rig.front`). */
function proxyTest(name: string, fn: (rig: S3Rig<FaultProxy>) => Promise<void>): void {
  faultTest(name, async () => {
    await using rig = await s3Rig((target) => new FaultProxy(target));
    await fn(rig);
  });
}

/** A volume of a test: staged at `staging`, published at `target`, its data's tree hash. */
interface Vol extends TrialVolume {
  readonly target: string;
  readonly hash: string;
}

let allocs = 0;

/** Creates a volume, stages and publishes it, and writes `mib` MiB of seeded data to it. */
async function volume(
  plugin: PluginProcess,
  pool: TestPool,
  name: string,
  mib: number,
  parameters: Record<string, string> = {},
): Promise<Vol> {
  const res = await plugin.client.controller("CreateVolume", {
    name,
    capacity_range: { required_bytes: String(CAPACITY), limit_bytes: "0" },
    volume_capabilities: [mountCapability()],
    parameters,
  });
  const id: string = res.volume.volume_id;
  const ctx: Record<string, string> = res.volume.volume_context;
  const p = await claimPaths(plugin.baseDir, { volumeId: name, allocId: `${name}-a${allocs++}` });
  await stagePublish(plugin, { id, ctx }, p.staging, p.target);
  if (mib > 0) await writeRandomFile(`${p.target}/data.bin`, mib * MiB, mib);
  await Deno.writeTextFile(`${p.target}/note.txt`, `${name}\n`);
  return {
    name,
    id,
    ctx,
    dataset: `${pool.parent}/${name}`,
    staging: p.staging,
    target: p.target,
    hash: await treeHash(p.target),
  };
}

async function stagePublish(
  plugin: PluginProcess,
  v: { id: string; ctx: Record<string, string> },
  staging: string,
  target: string,
): Promise<void> {
  await plugin.client.node("NodeStageVolume", {
    volume_id: v.id,
    staging_target_path: staging,
    volume_capability: mountCapability(),
    volume_context: v.ctx,
  });
  await plugin.client.node("NodePublishVolume", {
    volume_id: v.id,
    staging_target_path: staging,
    target_path: target,
    volume_capability: mountCapability(),
    readonly: false,
  });
}

/**
 * Publishes `v` at a fresh target (staging it again: a repeat when it is staged), checks its
 * data there, takes that publish down; returns the milliseconds stage+publish took.
 */
async function usable(plugin: PluginProcess, v: Vol): Promise<number> {
  const p = await claimPaths(plugin.baseDir, {
    volumeId: v.name,
    allocId: `${v.name}-a${allocs++}`,
  });
  const t0 = performance.now();
  await stagePublish(plugin, v, v.staging, p.target);
  const ms = performance.now() - t0;
  assert.equal(await treeHash(p.target), v.hash, `${v.name}: data`);
  await plugin.client.node("NodeUnpublishVolume", { volume_id: v.id, target_path: p.target });
  return ms;
}

async function condition(plugin: PluginProcess, v: Vol) {
  const res = await plugin.client.controller("ControllerGetVolume", { volume_id: v.id });
  return res.status.volume_condition as { abnormal: boolean; message: string };
}

/** Polls `v`'s condition until it is abnormal, or healthy (`abnormal` false); returns it. */
function conditionTurns(
  plugin: PluginProcess,
  v: Vol,
  until: { readonly abnormal: boolean; readonly what: string; readonly timeoutMs: number },
) {
  return waitFor(
    until.what,
    async () => {
      const c = await condition(plugin, v);
      return Boolean(c.abnormal) === until.abnormal ? c : undefined;
    },
    until.timeoutMs,
    500,
  );
}

faultTest(
  "store faults: a store that is down fails CreateSnapshot UNAVAILABLE and the volume's " +
    "condition, not stage/publish or Probe; the next backup after it is back clears it",
  async () => {
    await using rig = await s3Rig((target) => TcpSwitch.start(target));
    const { server, front: sw, pool, sut, plugin } = rig;
    const t0 = performance.now();
    const v = await volume(plugin, pool, "v", 4, { backup_interval: "5s", backup_keep: "last=2" });
    await sw.down();
    const down = performance.now();

    const details = await rejects(
      plugin.client.controller("CreateSnapshot", { source_volume_id: v.id, name: "s1" }),
      Code.UNAVAILABLE,
    );
    assert.ok(details.includes(sut.names), `names the store: ${details}`);
    assert.match(details, /unreachable/);
    assert.doesNotMatch(details, new RegExp(server.secretAccessKey));
    print(`  CreateSnapshot with the store down: UNAVAILABLE "${details}"`);

    const probe = await plugin.client.identity("Probe", {});
    assert.equal(probe.ready?.value, true, "Probe ready with the store down");
    const stageMs = await usable(plugin, v);
    const w = await volume(plugin, pool, "w", 1);
    print(`  stage+publish with the store down: ${stageMs.toFixed(0)} ms (and a new volume)`);

    // The scheduler ticks every 30 s; the volume is due from its creation.
    const abnormal = await conditionTurns(plugin, v, {
      abnormal: true,
      what: "the volume's condition to turn abnormal",
      timeoutMs: 45_000,
    });
    print(
      `  condition abnormal ${((performance.now() - down) / 1000).toFixed(1)} s after the ` +
        `store went down (${((performance.now() - t0) / 1000).toFixed(1)} s after the plugin ` +
        `answered): "${abnormal.message}"`,
    );
    assert.match(abnormal.message, /^Backups to s3:\/\/.* are failing \(1 in a row\)/);
    assert.ok(abnormal.message.includes(sut.names), abnormal.message);
    assert.match(abnormal.message, /unreachable/);
    assert.equal((await condition(plugin, w)).abnormal, false, "a volume without backups: fine");
    const listed = await plugin.client.controller("ListVolumes", {});
    const entry = listed.entries.find((e: { volume: { volume_id: string } }) =>
      e.volume.volume_id === v.id
    );
    assert.deepEqual(entry.status.volume_condition, abnormal, "ListVolumes says the same");
    const failed = recordsOf(plugin.logs()).find((r) =>
      r.msg === "backup failed; retrying later" && r.dataset === v.dataset
    );
    assert.ok(failed, "the log says the backup failed");
    const error = JSON.stringify(failed.error);
    assert.ok(error.includes(sut.names) && /unreachable/.test(error), error);
    assert.equal(failed.level, "warn");
    assert.doesNotMatch(plugin.logs().join("\n"), new RegExp(server.secretAccessKey));
    assert.equal((await plugin.client.identity("Probe", {})).ready?.value, true);
    const againMs = await usable(plugin, v);
    assert.ok(againMs < 5_000, `stage+publish took ${againMs} ms`);

    sw.up();
    const up = performance.now();
    const cleared = await conditionTurns(plugin, v, {
      abnormal: false,
      what: "the condition to clear",
      timeoutMs: 100_000,
    });
    print(
      `  condition cleared ${((performance.now() - up) / 1000).toFixed(1)} s after the store ` +
        `came back (the retry waits out a 30 s backoff and the next 30 s tick)`,
    );
    assert.equal(cleared.message, "Volume is healthy");
    const stored = await volumeManifests(sut.store, "v");
    assert.ok(stored.some((m) => m.kind === "scheduled"), JSON.stringify(stored));
    assert.notEqual(await zfsGet(v.dataset, BACKUP_LAST), "-");
    const s1 = await plugin.client.controller("CreateSnapshot", {
      source_volume_id: v.id,
      name: "s1",
    });
    assert.equal(s1.snapshot.ready_to_use, true);
  },
);

proxyTest(
  "store faults: 500s and a lost manifest answer are retried; the backup completes whole",
  async (rig) => {
    const { front: proxy, pool, sut } = rig;
    let plugin = rig.plugin;
    // Every other request of a stream's upload (its start, parts, end) answered 500, three
    // in all: parts are sent again, beside the other part in flight.
    let streamRequests = 0;
    const everyOther = (r: Request) =>
      new URL(r.url).pathname.includes("/streams/") && streamRequests++ % 2 === 1;
    proxy.set({ kind: "error", status: 500, code: "InternalError", count: 3 }, everyOther);
    const v = await volume(plugin, pool, "v", 24, { backup_interval: "1h" });
    // The scheduler's first tick after a start backs up the volume, due since its creation
    // (made due by hand too, in case a tick of the first start backed it up already).
    plugin = await rig.restartDue(v.dataset);
    const m = await waitFor(
      "the scheduled backup",
      async () => {
        const all = await volumeManifests(sut.store, "v");
        return all.find((x) => x.kind === "scheduled");
      },
      60_000,
      250,
    );
    const errors = proxy.seen.filter((s) => s.outcome === "error");
    const what = (t: string) =>
      /partNumber=/.test(t) ? "part" : /uploads/.test(t) ? "start" : /uploadId/.test(t) ? "end" : t;
    print(
      `  scheduled backup of 24 MiB through 3 injected 500s: stored (${m.size} bytes); ` +
        `${proxy.seen.length} requests, failed: ` +
        errors.map((s) => `${s.method} ${what(s.target)}`).join(", "),
    );
    assert.equal(errors.length, 3);
    assert.equal(
      recordsOf(plugin.logs()).filter((r) => r.msg === "backup failed; retrying later").length,
      0,
    );
    assert.equal((await condition(plugin, v)).abnormal, false);

    // 500s on every kind of request, then a manifest write that lands but whose answer is
    // lost: CreateSnapshot still answers ready, and its manifest names a stream that is there.
    await writeRandomFile(`${v.target}/more.bin`, 9 * MiB, 99);
    let requests = 0;
    proxy.set(
      { kind: "error", status: 500, code: "InternalError", count: 3 },
      () => requests++ % 2 === 1,
    );
    const before = proxy.seen.length;
    const pending = plugin.client.controller("CreateSnapshot", {
      source_volume_id: v.id,
      name: "s1",
    }, 120_000);
    await waitFor(
      "the injected 500s to be used up",
      () => {
        const used = proxy.seen.slice(before).filter((s) => s.outcome === "error").length;
        return Promise.resolve(used >= 3 ? true : undefined);
      },
      30_000,
      5,
    );
    proxy.set(
      { kind: "lose", count: 1 },
      (r) => r.method === "PUT" && /\/snapshots\/[0-9a-f]{16}\.json$/.test(new URL(r.url).pathname),
    );
    const s1 = await pending;
    assert.equal(s1.snapshot.ready_to_use, true);
    const lost = proxy.seen.slice(before).filter((s) => s.outcome === "lose");
    const failedToo = proxy.seen.slice(before).filter((s) => s.outcome === "error");
    print(
      `  CreateSnapshot through 3 injected 500s (` +
        failedToo.map((s) => `${s.method} ${what(s.target)}`).join(", ") +
        `) and ${lost.length} lost manifest answer: ready (${proxy.seen.length - before} requests)`,
    );
    assert.equal(lost.length, 1, "the manifest's answer was lost once");
    const hex = String(s1.snapshot.snapshot_id).split(":")[2];
    const all = await volumeManifests(sut.store, "v");
    const mine = all.find((x) => guidHex(x.guid) === hex);
    assert.ok(mine, `a manifest of ${s1.snapshot.snapshot_id}`);
    assert.equal(mine.csiName, "s1");
    assert.equal((await auditStore(sut.store)).orphanStreams.length, 0, "no stream left over");
  },
);

faultTest(
  "store faults: a full store fails CreateSnapshot RESOURCE_EXHAUSTED and shows nothing",
  async () => {
    await using pool = await TestPool.create();
    const dir = `${pool.dir}/store`;
    await Deno.mkdir(dir);
    await sh("mount", "-t", "tmpfs", "-o", "size=4m,mode=0700", "tmpfs", dir);
    try {
      const sut = await fileStoreUnderTest(dir);
      await using plugin = await startWithStore(pool, sut, NODE);
      const v = await volume(plugin, pool, "big", 8);
      const details = await rejects(
        plugin.client.controller("CreateSnapshot", { source_volume_id: v.id, name: "s1" }),
        Code.RESOURCE_EXHAUSTED,
      );
      print(`  CreateSnapshot of 8 MiB to a 4 MiB store: RESOURCE_EXHAUSTED "${details}"`);
      assert.ok(details.includes(sut.names), `names the store: ${details}`);
      assert.match(details, /full/);
      const objects = await sut.store.list("");
      assert.deepEqual(
        objects.filter((o) => !o.key.endsWith("/volume.json")),
        [],
        "no manifest and no stream in the store",
      );
      assert.deepEqual(await sut.leftovers(), [], "no temporary file left");
      assert.equal(await treeHash(v.target), v.hash, "the volume's data is intact");
      await usable(plugin, v);
      // The same again fails the same way; a snapshot that fits goes through.
      await rejects(
        plugin.client.controller("CreateSnapshot", { source_volume_id: v.id, name: "s1" }),
        Code.RESOURCE_EXHAUSTED,
      );
      assert.deepEqual(await sut.leftovers(), [], "no temporary file left");
      const small = await volume(plugin, pool, "small", 1);
      const ok = await plugin.client.controller("CreateSnapshot", {
        source_volume_id: small.id,
        name: "s2",
      });
      assert.equal(ok.snapshot.ready_to_use, true);
      assert.equal((await volumeManifests(sut.store, "small")).length, 1);
      assert.equal((await volumeManifests(sut.store, "big")).length, 0);
      const local = [...(await datasetsBelow(v.dataset)).keys()].filter((n) => n.includes("@"));
      print(`  left on the node for the retry: ${local.join(", ")}`);
    } finally {
      await tryRun("umount", dir);
    }
  },
);

faultTest(
  "store faults: a restore bigger than the pool's free space fails RESOURCE_EXHAUSTED and " +
    "leaves nothing",
  async () => {
    await using server = await S3Server.start();
    await using a = await TestPool.create();
    // zfs-fuse's smallest pool: well below the snapshot's size.
    await using b = await TestPool.create(64);
    const sut = s3StoreUnderTest(server);
    let source: PluginProcess | undefined;
    let target: PluginProcess | undefined;
    try {
      source = await startWithStore(a, sut, "node-a");
      const v = await volume(source, a, "v", 96);
      const snap = await source.client.controller("CreateSnapshot", {
        source_volume_id: v.id,
        name: "s1",
      }, 120_000);
      assert.equal(snap.snapshot.ready_to_use, true);
      target = await startWithStore(b, sut, "node-b");
      const free = await zfsGet(b.parent, "available");
      const before = [...(await datasetsBelow(b.pool)).keys()];
      const t0 = performance.now();
      let details: string;
      try {
        await target.client.controller("CreateVolume", {
          name: "v",
          capacity_range: { required_bytes: String(CAPACITY), limit_bytes: "0" },
          volume_capabilities: [mountCapability()],
          parameters: {},
          volume_content_source: { snapshot: { snapshot_id: snap.snapshot.snapshot_id } },
        }, 120_000);
        assert.fail("the restore succeeded on a pool too small for it");
      } catch (err) {
        const e = err as CallError;
        details = e.details;
        print(
          `  restore of ${snap.snapshot.size_bytes} bytes into a pool with ${free} bytes free: ` +
            `code ${e.code} after ${(performance.now() - t0).toFixed(0)} ms: "${e.details}"`,
        );
        assert.equal(e.code, Code.RESOURCE_EXHAUSTED, e.details);
      }
      assert.match(details, /space/i);
      const after = [...(await datasetsBelow(b.pool)).keys()];
      assert.deepEqual(after, before, "no volume and no .restore-* dataset left");
      // Nothing lingers either (zfs-fuse cleans a failed receive up in its daemon).
      await sleep(2_000);
      assert.deepEqual([...(await datasetsBelow(b.pool)).keys()], before);
      assert.equal(await zfsGet(`${b.parent}/v`, "type"), undefined);
    } finally {
      await target?.stop("SIGKILL");
      await source?.stop("SIGKILL");
    }
  },
);

proxyTest(
  "store faults: a slow store does not slow stage/publish while a backup runs",
  async (rig) => {
    const { front: proxy, pool, sut } = rig;
    let plugin = rig.plugin;
    const x = await volume(plugin, pool, "x", 48, { backup_interval: "1h" });
    const y = await volume(plugin, pool, "y", 2);
    // Unstaged, so that the measured calls mount for real.
    await plugin.client.node("NodeUnpublishVolume", { volume_id: y.id, target_path: y.target });
    await plugin.client.node("NodeUnstageVolume", {
      volume_id: y.id,
      staging_target_path: y.staging,
    });
    const cycle = async () => {
      const ms = await usable(plugin, y);
      await plugin.client.node("NodeUnstageVolume", {
        volume_id: y.id,
        staging_target_path: y.staging,
      });
      return ms;
    };
    const idle = [await cycle(), await cycle(), await cycle()];
    proxy.set({ kind: "delay", ms: 1_500 });
    // The first tick after a start backs up x, due since its creation (and made due by hand).
    plugin = await rig.restartDue(x.dataset);
    const started = await waitFor(
      "the backup's upload to start",
      () => {
        const r = recordsOf(plugin.logs()).find((r) =>
          r.msg === "send started" && String(r.snapshot).startsWith(`${x.dataset}@`)
        );
        return Promise.resolve(r ? performance.now() : undefined);
      },
      30_000,
      5,
    );
    const busy = [await cycle(), await cycle(), await cycle()];
    const xMs = await usable(plugin, x);
    const storedYet = recordsOf(plugin.logs()).some((r) =>
      r.msg === "send stored" && String(r.snapshot).startsWith(`${x.dataset}@`)
    );
    assert.equal(storedYet, false, "the backup still ran while stage/publish were measured");
    const done = await waitFor(
      "the backup",
      async () => {
        const m = (await volumeManifests(sut.store, "x")).find((m) => m.kind === "scheduled");
        return m ? performance.now() : undefined;
      },
      120_000,
      250,
    );
    const fmt = (xs: number[]) => xs.map((n) => n.toFixed(0)).join(", ");
    print(
      `  stage+publish of another volume: idle ${fmt(idle)} ms; during a backup through a ` +
        `store delaying each request 1.5 s: ${fmt(busy)} ms; of the volume being backed up ` +
        `${xMs.toFixed(0)} ms; the backup's upload took ${((done - started) / 1000).toFixed(1)} s`,
    );
    for (const ms of [...busy, xMs]) assert.ok(ms < 5_000, `stage+publish took ${ms} ms`);
  },
);
