/**
 * Crash safety of the store: the plugin is killed with SIGKILL at random moments of (a) a
 * CreateSnapshot that uploads 32-64 MiB of incompressible data to the store, (b) a scheduled
 * backup (an incremental of 32-64 MiB new data, with the store's and the node's pruning after
 * it), (c) a CreateVolume that restores a stored snapshot (one stream, or a chain of two). After
 * each kill, with the plugin dead, the trial asserts that
 * - every manifest the store shows is whole, names a stream the store holds, and the stream read
 *   back has the manifest's size and SHA-256; every incremental's base has its manifest;
 * - no volume dataset is half made: a restore's target is absent, or complete (all its
 *   snapshots, the marker, and after the retry the same dataset with the snapshot's data);
 * - the volume that was being snapshotted or backed up is still mounted, with its data;
 * then starts the plugin again and asserts that the operation completes when repeated
 * (CreateSnapshot again: ready, with its manifest; CreateVolume again: the volume with the
 * snapshot's tree hash, and no `.restore-*` left; the backup: done by the scheduler's first
 * tick), and that the volume can be staged and published at once after the restart. A backup
 * killed after it set backup-last leaves its local and store pruning to the next backup: the
 * last step runs one more backup and asserts that only its base `.backup-*` is left.
 *
 * The file store gets ZFS_CSI_STORE_CRASH_TRIALS kills (default 6), versitygw
 * ZFS_CSI_STORE_CRASH_S3_TRIALS (default 3), rounded up to whole rounds of the three
 * operations; each store first runs one uncrashed reference round that measures the calls.
 * Seeded (ZFS_CSI_STORE_CRASH_SEED, a number or "random"; printed): the seed fixes the data
 * sizes, the sources restored and the kill points, not as exact instants but as a fraction of
 * the measured duration, "the k-th stream's transfer started + a fraction of its expected
 * time", or "the last stream's transfer ended + 0-40 ms" (the manifest write, the rename, the
 * pruning), taking turns per operation: transfer, after, transfer, delay, transfer, ... Every
 * second restore is repeated at once after the restart, without waiting for the killed
 * plugin's zfs receive to end. ZFS_CSI_STORE_CRASH_VERBOSE=1 prints each phase's time.
 *
 * zfs-fuse cannot show: resumable receives (`-s`, which these restores do not use), raw sends.
 */

import assert from "node:assert/strict";
import { encodeComponent } from "../../src/zfs/names.ts";
import type { CsiClient } from "../support/csi_client.ts";
import { retryWhileBusy } from "../support/csi_client.ts";
import { claimPaths, hostMounts, mountCapability } from "../support/nomad.ts";
import { PluginProcess } from "../support/plugin_process.ts";
import { Prng, seedFrom } from "../support/prng.ts";
import { S3Server } from "../support/s3_server.ts";
import { BACKUP_LAST, startWithStore, stopWithBackupDue } from "../support/store_trial_plugin.ts";
import { type TrialVolume, volumeManifests } from "../support/store_trial_volumes.ts";
import type { StoreUnderTest } from "../support/store_trials.ts";
import {
  auditStore,
  datasetsBelow,
  fileStoreUnderTest,
  guidHex,
  MiB,
  orphansOf,
  print,
  recordsOf,
  s3StoreUnderTest,
  sleep,
  waitFor,
  waitForOrphans,
  writeRandomFile,
  zfsGet,
} from "../support/store_trials.ts";
import { treeHash } from "../support/tree_hash.ts";
import { TestPool } from "../support/zfs_pool.ts";

const SEED = seedFrom(Deno.env.get("ZFS_CSI_STORE_CRASH_SEED"), 20261124);
const FILE_TRIALS = trialsFrom("ZFS_CSI_STORE_CRASH_TRIALS", 6);
const S3_TRIALS = trialsFrom("ZFS_CSI_STORE_CRASH_S3_TRIALS", 3);
const OPS = ["snapshot", "restore", "backup"] as const;
type Op = typeof OPS[number];
const CAPACITY = 128 * MiB;
const VERBOSE = Deno.env.get("ZFS_CSI_STORE_CRASH_VERBOSE") === "1";
/** The kinds of kill plan, in turn for each operation. */
const PLAN_TURNS = ["transfer", "after", "transfer", "delay", "transfer"] as const;
const NODE = "node-a";
const MANAGED = "org.zfs-csi:managed";

function trialsFrom(variable: string, fallback: number): number {
  const n = Number(Deno.env.get(variable) || fallback);
  if (!Number.isInteger(n) || n < 0) {
    throw new RangeError(`${variable} must be a whole number, got ${Deno.env.get(variable)}`);
  }
  return n;
}

/**
 * Where an upload to the store was, from the log records of its snapshot: the manifest written,
 * the stream stored, uploading, or not started.
 */
function uploadPhase(recs: readonly Record<string, unknown>[]): string {
  return recs.some((x) => x.msg === "backup stored")
    ? "manifest written"
    : recs.some((x) => x.msg === "send stored")
    ? "stream stored, manifest not yet"
    : recs.some((x) => x.msg === "send started")
    ? "uploading"
    : "before the upload";
}

/** Calls `fn` until it does not fail with ABORTED or UNAVAILABLE (a restart settling). */
function retry<T>(fn: () => Promise<T>, timeoutMs = 60_000): Promise<T> {
  return retryWhileBusy(fn, timeoutMs, 200);
}

/** How a kill is timed. */
type KillPlan =
  /** `ms` after the call started (after the plugin answered ready, for a backup). */
  | { readonly kind: "delay"; readonly ms: number }
  /** Once the k-th stream's transfer started, plus `ms` (a fraction of its expected time). */
  | { readonly kind: "transfer"; readonly k: number; readonly ms: number }
  /** `ms` after the last stream's transfer ended (the manifest, the rename, the pruning). */
  | { readonly kind: "after"; readonly ms: number };

/** What one kill hit, for the summary and failure messages. */
interface KillRecord {
  readonly store: string;
  readonly op: Op;
  readonly plan: KillPlan;
  /** Where the operation was, read from the killed plugin's log. */
  readonly phase: string;
  readonly orphanPolls: number;
  /** What the kill left outside the store's keys (temporary files, open multipart uploads). */
  readonly leftovers: number;
  /** Streams without a manifest after the kill. */
  readonly orphanStreams: number;
  /** Restores: a `.restore-*` dataset was there after the kill; the target was. */
  readonly restoreLeftover?: boolean;
  readonly targetExisted?: boolean;
  /**
   * Restores repeated at once after the restart: how many of the killed plugin's subprocesses
   * still ran when the repeat was sent.
   */
  readonly eager?: number;
  /** Backups: `.backup-*` snapshots on the node once the backup completed after the restart. */
  readonly backupsLeft?: number;
}

/** A volume of the trials, with its staging path and the publish kept for it. */
interface Vol extends TrialVolume {
  /** Where it stays published, or undefined when not staged. */
  target: string | undefined;
  /** Tree hash of its data as last written. */
  hash: string;
}

/** A stored snapshot the restore trials restore. */
interface Source {
  readonly id: string;
  readonly hash: string;
  /** MiB of each stream of its chain, full stream first. */
  readonly sizes: readonly number[];
}

/** Measured on the uncrashed round. */
interface Calibration {
  /** The call (or, for a backup, ready to "backup stored"), per MiB moved. */
  readonly callMsPerMiB: number;
  /** One stream's transfer, per MiB. */
  readonly transferMsPerMiB: number;
}

/** The trials against one store. */
class StoreTrials {
  readonly #pool: TestPool;
  readonly #sut: StoreUnderTest;
  readonly #rng: Prng;
  readonly #label: string;
  #plugin!: PluginProcess;
  #alloc = 0;
  readonly #checked = new Map<string, string>();
  readonly #calibration = new Map<Op, Calibration>();
  /** Kill plans made so far, by operation. */
  readonly #planned = new Map<Op, number>();
  readonly kills: KillRecord[] = [];
  /** Mount points below the test dir (outside zfs's own) that must exist. */
  readonly #mounts = new Set<string>();
  /** Non-hidden child datasets of the parent that must exist (by name). */
  readonly #volumes = new Set<string>();
  readonly #sources: Source[] = [];
  #sched: Vol | undefined;
  readonly phases = { prepare: 0, kill: 0, restart: 0, converge: 0 };

  constructor(pool: TestPool, sut: StoreUnderTest, rng: Prng) {
    this.#pool = pool;
    this.#sut = sut;
    this.#rng = rng;
    this.#label = sut.kind === "file" ? "file store" : "versitygw";
  }

  get plugin(): PluginProcess {
    return this.#plugin;
  }

  async start(): Promise<PluginProcess> {
    this.#plugin = await startWithStore(this.#pool, this.#sut, NODE);
    return this.#plugin;
  }

  /** A new volume, staged and published, with `mib` MiB of seeded data in it. */
  async #volume(name: string, mib: number, parameters: Record<string, string> = {}) {
    const res = await this.#plugin.client.controller("CreateVolume", {
      name,
      capacity_range: { required_bytes: String(CAPACITY), limit_bytes: "0" },
      volume_capabilities: [mountCapability()],
      parameters,
    });
    this.#volumes.add(name);
    const p = await claimPaths(this.#plugin.baseDir, { volumeId: name, allocId: `${name}-a0` });
    const vol: Vol = {
      name,
      id: res.volume.volume_id,
      ctx: res.volume.volume_context,
      dataset: `${this.#pool.parent}/${name}`,
      staging: p.staging,
      target: undefined,
      hash: "",
    };
    await this.#stage(vol);
    vol.target = await this.#publish(vol, p.target);
    await this.#write(vol, "data.bin", mib);
    return vol;
  }

  async #stage(vol: Vol): Promise<void> {
    await this.#plugin.client.node("NodeStageVolume", {
      volume_id: vol.id,
      staging_target_path: vol.staging,
      volume_capability: mountCapability(),
      volume_context: vol.ctx,
    });
    this.#mounts.add(vol.staging);
  }

  async #publish(vol: Vol, target?: string): Promise<string> {
    const path = target ??
      (await claimPaths(this.#plugin.baseDir, {
        volumeId: vol.name,
        allocId: `${vol.name}-a${++this.#alloc}`,
      })).target;
    await this.#plugin.client.node("NodePublishVolume", {
      volume_id: vol.id,
      staging_target_path: vol.staging,
      target_path: path,
      volume_capability: mountCapability(),
      readonly: false,
    });
    this.#mounts.add(path);
    return path;
  }

  async #unpublish(vol: Vol, target: string): Promise<void> {
    await retry(() =>
      this.#plugin.client.node("NodeUnpublishVolume", { volume_id: vol.id, target_path: target })
    );
    this.#mounts.delete(target);
  }

  /** Unpublishes and unstages `vol` and deletes it (destroyed: --deleted-retention 0). */
  async #delete(vol: Vol): Promise<void> {
    if (vol.target) await this.#unpublish(vol, vol.target);
    vol.target = undefined;
    await retry(() =>
      this.#plugin.client.node("NodeUnstageVolume", {
        volume_id: vol.id,
        staging_target_path: vol.staging,
      })
    );
    this.#mounts.delete(vol.staging);
    await retry(() => this.#plugin.client.controller("DeleteVolume", { volume_id: vol.id }));
    this.#volumes.delete(vol.name);
    assert.equal(await zfsGet(vol.dataset, "type"), undefined, `${vol.dataset} still there`);
  }

  /** Writes `mib` MiB of seeded data to `file` in the published volume; updates its hash. */
  async #write(vol: Vol, file: string, mib: number): Promise<void> {
    await writeRandomFile(`${vol.target}/${file}`, mib * MiB, this.#rng.int(0, 0xffff_ffff));
    await Deno.writeTextFile(`${vol.target}/note.txt`, `${vol.name} ${file} ${mib} MiB\n`);
    vol.hash = await treeHash(vol.target!);
  }

  /**
   * The plugin was just (re)started: `vol` (staged before the kill) stages again and publishes
   * at a fresh target with its data; the extra publish is taken down again.
   */
  async #usable(vol: Vol): Promise<void> {
    await this.#stage(vol);
    const path = await this.#publish(vol);
    assert.equal(await treeHash(path), vol.hash, `${vol.name}: data after the restart`);
    await this.#unpublish(vol, path);
  }

  /** Store audit, dataset and mount checks; returns the audit. */
  async #check(label: string, restore?: { target: string; source: Source }) {
    const audit = await auditStore(this.#sut.store, this.#checked);
    const all = await datasetsBelow(this.#pool.parent);
    const parent = this.#pool.parent;
    let restoreLeftover = false;
    let targetExisted = false;
    for (const [name, type] of all) {
      if (type !== "filesystem" || name === parent) continue;
      const component = name.slice(parent.length + 1);
      if (component.startsWith(".restore-") && restore) {
        restoreLeftover = true;
        continue;
      }
      if (restore && name === restore.target) {
        targetExisted = true;
        // Renamed into place only once complete: every snapshot of the chain and the marker.
        assert.equal(await zfsGet(name, MANAGED), "yes", `${label}: ${name} lacks the marker`);
        const snaps = [...all.keys()].filter((n) => n.startsWith(`${name}@`));
        assert.equal(snaps.length, restore.source.sizes.length, `${label}: snapshots ${snaps}`);
        const last = restore.source.id.split(":")[2]!;
        const guids = await Promise.all(
          snaps.map(async (s) => guidHex((await zfsGet(s, "guid"))!)),
        );
        assert.ok(guids.includes(last), `${label}: ${name} lacks the restored snapshot ${last}`);
        continue;
      }
      assert.ok(this.#volumes.has(component), `${label}: unexpected dataset ${name}`);
      assert.equal(await zfsGet(name, MANAGED), "yes", `${label}: ${name} lacks the marker`);
    }
    for (const v of this.#volumes) {
      assert.ok(all.has(`${parent}/${v}`), `${label}: volume ${v} is gone`);
    }
    const mounts = (await hostMounts()).map((m) => m.path)
      .filter((p) => p.startsWith(this.#pool.dir + "/") && !p.startsWith(this.#pool.mountRoot));
    assert.deepEqual(mounts.sort(), [...this.#mounts].sort(), `${label}: mounts (each once)`);
    return { audit, restoreLeftover, targetExisted };
  }

  #lap = performance.now();
  #phase(name: keyof StoreTrials["phases"]): void {
    const now = performance.now();
    this.phases[name] += (now - this.#lap) / 1000;
    if (VERBOSE) print(`    ${name} ${((now - this.#lap) / 1000).toFixed(1)} s`);
    this.#lap = now;
  }

  /** The kill plan of a trial moving `sizes` (MiB per stream). */
  #plan(op: Op, sizes: readonly number[]): KillPlan {
    const c = this.#calibration.get(op)!;
    const total = sizes.reduce((a, b) => a + b, 0);
    // The kinds take turns, so that even a short run kills each operation in its transfer first.
    const n = this.#planned.get(op) ?? 0;
    this.#planned.set(op, n + 1);
    const kind = PLAN_TURNS[n % PLAN_TURNS.length]!;
    if (kind === "delay") {
      return { kind: "delay", ms: Math.round(this.#rng.next() * 1.3 * c.callMsPerMiB * total) };
    }
    if (kind === "after") return { kind: "after", ms: this.#rng.int(0, 40) };
    const k = this.#rng.int(1, sizes.length);
    const ms = Math.round(this.#rng.next() * 0.9 * c.transferMsPerMiB * sizes[k - 1]!);
    return { kind: "transfer", k, ms };
  }

  /**
   * Waits until the plan's moment, or until `done()` (the call answered). `log.started` and
   * `log.finished` tell the log records of a stream's transfer start and end; `streams` is how
   * many the operation moves.
   */
  async #waitPlan(
    plan: KillPlan,
    since: number,
    log: {
      readonly from: number;
      readonly started: (rec: Record<string, unknown>) => boolean;
      readonly finished: (rec: Record<string, unknown>) => boolean;
      readonly streams: number;
    },
    done: () => boolean,
  ): Promise<void> {
    if (plan.kind === "delay") {
      const end = since + plan.ms;
      while (!done() && performance.now() < end) await sleep(2);
      return;
    }
    const [which, count] = plan.kind === "transfer"
      ? [log.started, plan.k]
      : [log.finished, log.streams];
    const deadline = Date.now() + 60_000;
    while (!done() && Date.now() < deadline) {
      if (recordsOf(this.#plugin.logs(), log.from).filter(which).length >= count) break;
      await sleep(1);
    }
    const end = performance.now() + plan.ms;
    while (!done() && performance.now() < end) await sleep(1);
  }

  /** SIGKILL, then waits for the plugin's subprocesses to end; returns the polls it took. */
  /** A kill, then at once a restart and the repeat; the subprocesses left are waited for after. */
  async #eager<R>(
    spec: { readonly op: Op; readonly call: (c: CsiClient) => Promise<R> },
    plan: KillPlan,
    phase: string,
  ): Promise<{ res: R; record: KillRecord }> {
    try {
      await this.#plugin.stop("SIGKILL");
      // What the killed plugin left running, by pid (the new plugin runs zfs on the pool too).
      const pid = (line: string) => line.split(/\s+/)[0]!;
      const left = new Set((await orphansOf(this.#pool.pool)).map(pid));
      const alive = async () => (await orphansOf(this.#pool.pool)).filter((l) => left.has(pid(l)));
      this.#phase("kill");
      await this.start();
      this.#phase("restart");
      const running = await alive();
      const res = await retry(() => spec.call(this.#plugin.client));
      let orphanPolls = 0;
      await waitFor(
        "the killed plugin's subprocesses to end",
        async () => {
          if ((await alive()).length === 0) return true;
          orphanPolls++;
          return undefined;
        },
        30_000,
        10,
      );
      const record: KillRecord = {
        store: this.#label,
        op: spec.op,
        plan,
        phase,
        orphanPolls,
        leftovers: (await this.#sut.leftovers()).length,
        orphanStreams: (await auditStore(this.#sut.store, this.#checked)).orphanStreams.length,
        eager: running.length,
      };
      this.kills.push(record);
      return { res, record };
    } catch (err) {
      throw this.#failure(`${spec.op} repeated at once`, plan, phase, err);
    }
  }

  async #kill(): Promise<number> {
    await this.#plugin.stop("SIGKILL");
    return await waitForOrphans([this.#pool.pool]);
  }

  #failure(what: string, plan: KillPlan | undefined, phase: string, err: unknown): Error {
    return new Error(
      `${this.#label}: ${what} failed (plan ${JSON.stringify(plan)}, killed at "${phase}"); ` +
        `seed ${SEED} (ZFS_CSI_STORE_CRASH_SEED): ${
          err instanceof Error ? err.stack : String(err)
        }\nplugin log:\n${this.#plugin.logs().slice(-25).join("\n")}`,
    );
  }

  /** Sets up the volumes the restore trials read: a chain of two stored snapshots. */
  async setup(): Promise<void> {
    await this.start();
    const hist = await this.#volume("hist", this.#rng.int(24, 40));
    const first = await this.#storeSnapshot(hist, "hist-1");
    const firstSize = (await this.#manifestOf(first)).size;
    await this.#write(hist, "more.bin", this.#rng.int(12, 24));
    const second = await this.#storeSnapshot(hist, "hist-2");
    const secondSize = (await this.#manifestOf(second)).size;
    this.#sources.push(
      { id: second, hash: hist.hash, sizes: [firstSize / MiB, secondSize / MiB] },
    );
    // The volume goes; its stored snapshots stay restorable.
    await this.#delete(hist);
    this.#phase("prepare");
  }

  async #storeSnapshot(vol: Vol, name: string): Promise<string> {
    const res = await this.#plugin.client.controller("CreateSnapshot", {
      source_volume_id: vol.id,
      name,
      parameters: {},
    }, 120_000);
    assert.equal(res.snapshot.ready_to_use, true, `${name} ready`);
    return res.snapshot.snapshot_id;
  }

  async #manifestOf(id: string) {
    const [, volkey, hex] = id.split(":");
    const audit = await auditStore(this.#sut.store, this.#checked);
    const m = audit.manifests.find((m) =>
      m.dir === `v1/volumes/${volkey}` && guidHex(m.guid) === hex
    );
    assert.ok(m, `no manifest for ${id}`);
    return m;
  }

  /** The volumes stay mounted where they were published, with their data, whatever the plugin. */
  async #stillMounted(vols: readonly (Vol | undefined)[], label: string): Promise<void> {
    for (const v of vols) {
      if (v?.target) assert.equal(await treeHash(v.target), v.hash, `${label}: ${v.name}'s data`);
    }
  }

  /**
   * Runs `spec.call` on the plugin: uncrashed (calibrating its op), or killed by a plan, checked
   * while the plugin is dead, started again and repeated. Returns the answer (of the repeat).
   */
  async #callTrial<R>(spec: {
    readonly op: Op;
    readonly kill: boolean;
    /** MiB of each stream it moves. */
    readonly sizes: readonly number[];
    readonly call: (c: CsiClient) => Promise<R>;
    /** Whether a log record is of this trial's transfer. */
    readonly mine: (rec: Record<string, unknown>) => boolean;
    readonly phaseOf: (recs: Record<string, unknown>[], answered: boolean) => string;
    /** Volumes that must stay mounted with their data, and usable after the restart. */
    readonly watch: readonly (Vol | undefined)[];
    readonly restore?: { readonly target: string; readonly source: Source };
  }): Promise<{ res: R; record?: KillRecord; targetGuid?: string }> {
    const { op, sizes } = spec;
    const victim = this.#plugin;
    const from = victim.logs().length;
    let answered = false;
    const t0 = performance.now();
    const pending = spec.call(victim.client).finally(() => (answered = true));
    pending.catch(() => {});
    const started = op === "restore" ? "receive started" : "send started";
    const finished = op === "restore" ? "receive done" : "send stored";
    if (!spec.kill) {
      const res = await pending;
      this.#calibrate(op, performance.now() - t0, sizes, recordsOf(victim.logs(), from), finished);
      return { res };
    }
    const plan = this.#plan(op, sizes);
    await this.#waitPlan(plan, t0, {
      from,
      started: (r) => r.msg === started && spec.mine(r),
      finished: (r) => r.msg === finished && spec.mine(r),
      streams: sizes.length,
    }, () => answered);
    const phase = spec.phaseOf(recordsOf(victim.logs(), from).filter(spec.mine), answered);
    this.#phase("prepare");
    // Half the restores are repeated at once, while the killed plugin's zfs receive may still
    // run (as when Nomad restarts the plugin at once): checked after the repeat instead.
    if (op === "restore" && this.#planned.get(op)! % 2 === 0) {
      return await this.#eager(spec, plan, phase);
    }
    try {
      const orphanPolls = await this.#kill();
      this.#phase("kill");
      const label = `${this.#label} ${op} killed at "${phase}"`;
      const checked = await this.#check(label, spec.restore);
      await this.#stillMounted(spec.watch, label);
      const targetGuid = checked.targetExisted
        ? await zfsGet(spec.restore!.target, "guid")
        : undefined;
      const record: KillRecord = {
        store: this.#label,
        op,
        plan,
        phase,
        orphanPolls,
        leftovers: (await this.#sut.leftovers()).length,
        orphanStreams: checked.audit.orphanStreams.length,
        ...(spec.restore
          ? { restoreLeftover: checked.restoreLeftover, targetExisted: checked.targetExisted }
          : {}),
      };
      this.kills.push(record);
      await this.start();
      this.#phase("restart");
      for (const v of spec.watch) if (v?.target) await this.#usable(v);
      const res = await retry(() => spec.call(this.#plugin.client));
      return { res, record, ...(targetGuid ? { targetGuid } : {}) };
    } catch (err) {
      throw this.#failure(op, plan, phase, err);
    }
  }

  #calibrate(
    op: Op,
    ms: number,
    sizes: readonly number[],
    recs: Record<string, unknown>[],
    finished: string,
  ): void {
    const last = recs.filter((r) => r.msg === finished).at(-1);
    const total = sizes.reduce((a, b) => a + b, 0);
    const transfer = Number(last?.ms ?? ms);
    this.#calibration.set(op, {
      callMsPerMiB: ms / total,
      transferMsPerMiB: transfer / sizes.at(-1)!,
    });
    print(
      `  ${this.#label} ${op}: ${ms.toFixed(0)} ms for ${total} MiB ` +
        `(last stream ${transfer} ms for ${sizes.at(-1)} MiB)`,
    );
  }

  /** (a) CreateSnapshot of a fresh volume holding 32-64 MiB, killed during its upload. */
  async snapshotTrial(r: number, kill: boolean): Promise<void> {
    const mib = this.#rng.int(32, 64);
    const vol = await this.#volume(`snap-${r}x`, mib);
    const name = `csnap-${r}x`;
    const volkey = encodeComponent("Volume name", vol.name);
    const hashAtSnapshot = vol.hash;
    this.#phase("prepare");
    const isMine = (rec: Record<string, unknown>) =>
      String(rec.snapshot ?? "").startsWith(`${vol.dataset}@`);
    // deno-lint-ignore no-explicit-any
    const { res, record } = await this.#callTrial<any>({
      op: "snapshot",
      kill,
      sizes: [mib],
      call: (c) =>
        c.controller("CreateSnapshot", { source_volume_id: vol.id, name, parameters: {} }, 120_000),
      mine: isMine,
      phaseOf: (recs, answered) => answered ? "answered" : uploadPhase(recs),
      watch: [vol, this.#sched],
    });
    try {
      const s = res.snapshot;
      const local = [...(await datasetsBelow(vol.dataset)).keys()]
        .filter((n) => n.startsWith(`${vol.dataset}@.stored-`));
      assert.equal(local.length, 1, `one local .stored-* snapshot: ${local}`);
      const guid = (await zfsGet(local[0]!, "guid"))!;
      const id = `store:${volkey}:${guidHex(guid)}`;
      assert.equal(s.snapshot_id, id);
      assert.equal(s.ready_to_use, true, "ready when repeated");
      assert.equal(s.source_volume_id, vol.id);
      const mine = await volumeManifests(this.#sut.store, vol.name, this.#checked);
      assert.equal(mine.length, 1, `one manifest of ${vol.name}: ${JSON.stringify(mine)}`);
      assert.equal(mine[0]!.guid, guid);
      assert.equal(mine[0]!.csiName, name);
      assert.equal(mine[0]!.kind, "requested");
      const listed = await this.#plugin.client.controller("ListSnapshots", { snapshot_id: id });
      assert.deepEqual(listed.entries.map((e: { snapshot: unknown }) => e.snapshot), [s]);
      // The volume takes writes after the crash.
      await this.#write(vol, "after.bin", 1);
      this.#sources.push({ id, hash: hashAtSnapshot, sizes: [mine[0]!.size / MiB] });
      await this.#delete(vol);
      await this.#check(`${vol.name} after its lifecycle`);
    } catch (err) {
      throw this.#failure(`snapshot ${name}`, record?.plan, record?.phase ?? "-", err);
    }
    this.#phase("converge");
  }

  /** (c) CreateVolume from a stored snapshot (one stream, or a chain of two), killed. */
  async restoreTrial(r: number, kill: boolean): Promise<void> {
    const source = this.#rng.chance(0.5) ? this.#sources[0]! : this.#sources.at(-1)!;
    const name = `rest-${r}x`;
    const target = `${this.#pool.parent}/${name}`;
    const n = source.sizes.length;
    this.#phase("prepare");
    // deno-lint-ignore no-explicit-any
    const { res, record, targetGuid } = await this.#callTrial<any>({
      op: "restore",
      kill,
      sizes: source.sizes,
      call: (c) =>
        c.controller("CreateVolume", {
          name,
          capacity_range: { required_bytes: String(CAPACITY), limit_bytes: "0" },
          volume_capabilities: [mountCapability()],
          parameters: {},
          volume_content_source: { snapshot: { snapshot_id: source.id } },
        }, 120_000),
      mine: () => true,
      phaseOf: (recs, answered) => {
        if (answered) return "answered";
        if (recs.some((x) => x.msg === "volume restored from the store")) return "renamed";
        const started = recs.filter((x) => x.msg === "receive started").length;
        const done = recs.filter((x) => x.msg === "receive done").length;
        if (started > done) return `receiving stream ${started} of ${n}`;
        if (done === n) return "received, before the rename";
        return done > 0 ? `between streams ${done} and ${done + 1} of ${n}` : "before the receive";
      },
      watch: [this.#sched],
      restore: { target, source },
    });
    try {
      this.#volumes.add(name);
      const v = res.volume;
      assert.equal(v.volume_id, `${name}@${NODE}`);
      assert.equal(v.capacity_bytes, String(CAPACITY));
      assert.equal(v.content_source?.snapshot?.snapshot_id, source.id);
      const all = await datasetsBelow(this.#pool.parent);
      const left = [...all.keys()].filter((d) => d.includes("/.restore-"));
      assert.deepEqual(left, [], "no .restore-* dataset after the repeat");
      // A target that was complete at the kill is the one answered, not received again.
      if (targetGuid) assert.equal(await zfsGet(target, "guid"), targetGuid);
      const p = await claimPaths(this.#plugin.baseDir, { volumeId: name, allocId: `${name}-a0` });
      const vol: Vol = {
        name,
        id: v.volume_id,
        ctx: v.volume_context,
        dataset: target,
        staging: p.staging,
        target: undefined,
        hash: source.hash,
      };
      await this.#stage(vol);
      vol.target = await this.#publish(vol, p.target);
      assert.equal(await treeHash(vol.target), source.hash, `${name}: restored data`);
      await this.#delete(vol);
      await this.#check(`${name} after its lifecycle`);
    } catch (err) {
      throw this.#failure(`restore ${name}`, record?.plan, record?.phase ?? "-", err);
    }
    this.#phase("converge");
  }

  /**
   * (b) A scheduled backup of the "sched" volume (backup_interval 1h, keep last=2): 32-64 MiB
   * new data, the plugin stopped, the volume made due by hand (backup-last=0), the plugin
   * started (its first tick backs it up) and killed; the next start's tick must finish it.
   */
  async backupTrial(_r: number, kill: boolean): Promise<void> {
    const mib = this.#rng.int(32, 64);
    let sched = this.#sched;
    if (!sched) {
      sched = this.#sched = await this.#volume("sched", mib, {
        backup_interval: "1h",
        backup_keep: "last=2",
      });
    } else {
      await this.#write(sched, "data.bin", mib);
    }
    const vol = sched;
    await stopWithBackupDue(this.#plugin, vol.dataset);
    const before = new Set(
      (await volumeManifests(this.#sut.store, vol.name, this.#checked)).map((m) => m.guid),
    );
    this.#phase("prepare");
    const victim = await this.start();
    const t0 = performance.now();
    const isMine = (rec: Record<string, unknown>) =>
      String(rec.snapshot ?? "").startsWith(`${vol.dataset}@`);
    const stored = (rec: Record<string, unknown>) => rec.msg === "backup stored" && isMine(rec);
    let record: KillRecord | undefined;
    let plan: KillPlan | undefined;
    let phase = "not killed";
    try {
      if (!kill) {
        await waitFor(
          "the scheduled backup",
          () => Promise.resolve(recordsOf(victim.logs()).some(stored) ? true : undefined),
          90_000,
          5,
        );
        this.#calibrate(
          "backup",
          performance.now() - t0,
          [mib],
          recordsOf(victim.logs()),
          "send stored",
        );
      } else {
        plan = this.#plan("backup", [mib]);
        const done = () => recordsOf(victim.logs()).some(stored);
        await this.#waitPlan(
          plan,
          t0,
          {
            from: 0,
            started: (r) => r.msg === "send started" && isMine(r),
            finished: (r) => r.msg === "send stored" && isMine(r),
            streams: 1,
          },
          () => plan!.kind === "transfer" && done(),
        );
        const all = recordsOf(victim.logs());
        const recs = all.filter(isMine);
        const ran = (what: RegExp) =>
          all.some((r) =>
            r.msg === "exec" && Array.isArray(r.argv) && what.test(r.argv.join(" ")) &&
            r.argv.join(" ").includes(vol.dataset)
          );
        phase = all.some((x) => x.msg === "store pruned" && x.dataset === vol.dataset)
          ? "store pruned"
          : ran(/^zfs destroy .*@\.backup-/)
          ? "local prune"
          : ran(/^zfs set org\.zfs-csi:backup-last=/)
          ? "backup-last set"
          : uploadPhase(recs);
        this.#phase("prepare");
        const orphanPolls = await this.#kill();
        this.#phase("kill");
        const label = `${this.#label} backup killed at "${phase}"`;
        const checked = await this.#check(label);
        await this.#stillMounted([vol], label);
        record = {
          store: this.#label,
          op: "backup",
          plan,
          phase,
          orphanPolls,
          leftovers: (await this.#sut.leftovers()).length,
          orphanStreams: checked.audit.orphanStreams.length,
        };
        await this.start();
        this.#phase("restart");
      }
      const { manifest, left } = await this.#backupDone(vol, before, !kill);
      if (record) this.kills.push({ ...record, backupsLeft: left });
      // After the backup: a stage that holds the volume's lock when the tick comes makes the
      // scheduler skip the volume until the next tick (30 s), by design.
      if (kill) await this.#usable(vol);
      const status = await this.#plugin.client.controller("ControllerGetVolume", {
        volume_id: vol.id,
      });
      assert.equal(status.status.volume_condition.abnormal, false, JSON.stringify(status));
      assert.ok(!before.has(manifest.guid));
      await this.#check(`sched after its backup`);
    } catch (err) {
      throw this.#failure("scheduled backup", plan, phase, err);
    }
    this.#phase("converge");
  }

  /**
   * Waits until the scheduler finished a backup of `vol` newer than `before`: backup-last set,
   * the newest `.backup-*` snapshot stored under a scheduled manifest, and every `.backup-*`
   * left on the node stored (one without a manifest, left by a killed upload, goes at the start
   * of the next backup). With `pruned`, also only one `.backup-*` left (the base): a kill after
   * backup-last was set leaves the older one to the next backup's local prune.
   * @returns the new manifest and how many `.backup-*` snapshots are left
   */
  async #backupDone(vol: Vol, before: ReadonlySet<string>, pruned: boolean) {
    return await waitFor(
      `the backup of ${vol.name} to complete`,
      async () => {
        const last = await zfsGet(vol.dataset, BACKUP_LAST);
        if (last === undefined || last === "0" || last === "-") return undefined;
        const backups = [...(await datasetsBelow(vol.dataset)).keys()]
          .filter((n) => n.startsWith(`${vol.dataset}@.backup-`))
          .sort((a, b) => backupRank(a) - backupRank(b));
        if (backups.length === 0 || (pruned && backups.length !== 1)) return undefined;
        const guids = await Promise.all(backups.map((b) => zfsGet(b, "guid")));
        const mine = await volumeManifests(this.#sut.store, vol.name, this.#checked);
        if (!guids.every((g) => mine.some((m) => m.guid === g))) return undefined;
        const manifest = mine.find((m) =>
          m.guid === guids.at(-1) && m.kind === "scheduled" && !before.has(m.guid)
        );
        return manifest && { manifest, left: backups.length };
      },
      90_000,
      250,
    );
  }

  /** One round: a backup, a snapshot and a restore trial. */
  async round(r: number, kill: boolean): Promise<void> {
    this.#lap = performance.now();
    await this.backupTrial(r, kill);
    await this.snapshotTrial(r, kill);
    await this.restoreTrial(r, kill);
  }

  /** Takes the sched volume down and checks that nothing else is left. */
  async finish(): Promise<void> {
    if (this.#sched) {
      // One more backup, not killed: it prunes what killed ones left, down to its base.
      const vol = this.#sched;
      await this.#write(vol, "data.bin", 1);
      await stopWithBackupDue(this.#plugin, vol.dataset);
      await this.start();
      const { left } = await this.#backupDone(vol, new Set(), true);
      assert.equal(left, 1);
      await this.#delete(vol);
    }
    this.#sched = undefined;
    await this.#check("at the end");
    const left = [...(await datasetsBelow(this.#pool.parent)).keys()]
      .filter((n) => n !== this.#pool.parent);
    assert.deepEqual(left, [], "nothing is left below the parent");
  }
}

/** `.backup-<seconds>-<sequence>` in the order taken: by sequence (older names: by seconds). */
function backupRank(name: string): number {
  const [seconds, sequence] = name.slice(name.indexOf("@.backup-") + 9).split("-");
  return Number(sequence ?? seconds);
}

/** Prints where the kills landed and asserts most hit a transfer. */
function summarize(label: string, kills: readonly KillRecord[], trials: StoreTrials, secs: number) {
  const spent = Object.entries(trials.phases).map(([k, v]) => `${k} ${v.toFixed(1)} s`).join(", ");
  print(
    `store crash trials (${label}): ${kills.length} kills in ${
      secs.toFixed(1)
    } s (${spent}), seed ${SEED}`,
  );
  for (const op of OPS) {
    const mine = kills.filter((k) => k.op === op);
    const hist = new Map<string, number>();
    for (const k of mine) hist.set(k.phase, (hist.get(k.phase) ?? 0) + 1);
    const spread = [...hist].map(([p, c]) => `"${p}" ${c}`).join(", ");
    const eager = mine.filter((k) => k.eager !== undefined);
    const extra = op === "restore"
      ? `; .restore-* left by the kill ${mine.filter((k) => k.restoreLeftover).length}, ` +
        `target complete at the kill ${mine.filter((k) => k.targetExisted).length}; ` +
        `repeated at once ${eager.length} (the killed zfs receive still ran ` +
        `${eager.filter((k) => k.eager! > 0).length})`
      : op === "backup"
      ? `; older .backup-* left for the next backup's prune ${
        mine.filter((k) => (k.backupsLeft ?? 1) > 1).length
      }`
      : "";
    print(
      `  ${op}: ${mine.length} kills: ${spread}; waited for a subprocess ` +
        `${mine.filter((k) => k.orphanPolls > 0).length}; in the store after the kill: up to ` +
        `${Math.max(0, ...mine.map((k) => k.leftovers))} temporary files / open uploads and ` +
        `${Math.max(0, ...mine.map((k) => k.orphanStreams))} streams without manifest${extra}`,
    );
  }
  // Most kills must hit the operation in flight, or the trials prove little.
  const inFlight = kills.filter((k) => k.phase !== "answered").length;
  const inTransfer = kills.filter((k) => /^(uploading|receiving)/.test(k.phase)).length;
  print(`  in flight ${inFlight} of ${kills.length}, in a transfer ${inTransfer}`);
  assert.ok(
    inFlight * 2 >= kills.length,
    `only ${inFlight} of ${kills.length} kills hit an operation in flight`,
  );
}

async function runTrials(
  t: Deno.TestContext,
  label: string,
  trials: number,
  pool: TestPool,
  sut: StoreUnderTest,
): Promise<void> {
  print(
    `store crash trials (${label}): seed ${SEED} (ZFS_CSI_STORE_CRASH_SEED), ${trials} kills ` +
      `(ZFS_CSI_STORE_CRASH_${sut.kind === "s3" ? "S3_" : ""}TRIALS)`,
  );
  const st = new StoreTrials(pool, sut, new Prng(SEED));
  try {
    await st.setup();
    const calibrated = await t.step(
      `${label}: uncrashed reference round`,
      () => st.round(0, false),
    );
    if (!calibrated) return;
    for (const k of Object.keys(st.phases) as (keyof StoreTrials["phases"])[]) st.phases[k] = 0;
    const rounds = Math.ceil(trials / OPS.length);
    const started = performance.now();
    const survived = await t.step(`${label}: ${rounds * OPS.length} crash trials`, async () => {
      for (let r = 1; r <= rounds; r++) await st.round(r, true);
    });
    if (!survived) return;
    await t.step(`${label}: kills landed in transfers; nothing is left`, async () => {
      summarize(label, st.kills, st, (performance.now() - started) / 1000);
      await st.finish();
    });
  } finally {
    await st.plugin?.stop("SIGKILL");
  }
}

Deno.test({
  name: `store crash: SIGKILL during uploads, backups and restores (file store, seed ${SEED})`,
  ignore: FILE_TRIALS === 0,
  sanitizeOps: false,
  sanitizeResources: false,
  fn: async (t) => {
    await using pool = await TestPool.create(1024);
    const sut = await fileStoreUnderTest(`${pool.dir}/store`);
    await runTrials(t, "file store", FILE_TRIALS, pool, sut);
  },
});

Deno.test({
  name: `store crash: SIGKILL during uploads, backups and restores (versitygw, seed ${SEED})`,
  ignore: S3_TRIALS === 0,
  sanitizeOps: false,
  sanitizeResources: false,
  fn: async (t) => {
    await using server = await S3Server.start();
    await using pool = await TestPool.create(1024);
    await runTrials(t, "versitygw", S3_TRIALS, pool, s3StoreUnderTest(server));
  },
});
