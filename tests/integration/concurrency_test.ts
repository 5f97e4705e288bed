/**
 * Concurrency, end to end: the plugin in its own process (monolith, production permission
 * flags) on a real pool, hit with many calls at once, on one volume and on many. A seeded PRNG
 * picks the operations, their duplicates and their start jitter, so a failing schedule can be
 * run again: ZFS_CSI_CONCURRENCY_SEED=<n> (or "random"); the seed in use is printed. The seed
 * fixes the schedule; timing can still decide which of two overlapping calls wins.
 *
 * A call for a volume another call holds waits its turn (Nomad fails an allocation on ABORTED),
 * so every call must do what a model of the volumes says it does, or get the documented code
 * for the state it met: never ABORTED, never UNAVAILABLE (the wait is a minute, far longer than
 * any call here). Afterwards the mount table below the base dir is empty, and every dataset
 * below the parent is a volume the model knows or `.deleted-*` trash of a delete that
 * succeeded: nothing half-made, nothing leaked. The plugin's log shows that calls did overlap
 * and wait (`lockWaitMs`).
 */

import assert from "node:assert/strict";
import { Code, codeName } from "../../src/errors.ts";
import type { CsiClient } from "../support/csi_client.ts";
import { claimPaths, hostMounts, mountCapability } from "../support/nomad.ts";
import { PluginProcess } from "../support/plugin_process.ts";
import { Prng, seedFrom } from "../support/prng.ts";
import { sh, TestPool } from "../support/zfs_pool.ts";

const MiB = 1024 * 1024;
const OK = 0;
const VOLUMES = 8;
const ROUNDS = 16;
/** Identical calls sent at once on one volume. */
const IDENTICAL = 20;

function print(text: string): void {
  Deno.stdout.writeSync(new TextEncoder().encode(text + "\n"));
}

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

/** What one call got. */
interface Outcome {
  readonly label: string;
  readonly code: number;
  readonly details: string;
  readonly response?: Record<string, unknown>;
}

/** Every call made, with the codes it was allowed to get. */
class Ledger {
  readonly calls: Array<Outcome & { readonly allowed: readonly number[] }> = [];
  /** What the plugin logged last at warn or error, to explain a failure. */
  readonly #pluginLog: () => string[];

  constructor(pluginLog: () => string[]) {
    this.#pluginLog = pluginLog;
  }

  /** Runs `call` and records its outcome; never throws for a gRPC error. */
  async run(label: string, call: () => Promise<unknown>): Promise<Outcome> {
    try {
      const response = (await call()) as Record<string, unknown>;
      return { label, code: OK, details: "", response };
    } catch (err) {
      const e = err as { code?: number; details?: string };
      if (typeof e.code !== "number") throw err;
      return { label, code: e.code, details: e.details ?? "" };
    }
  }

  /** Asserts that `o` got one of `allowed`, and records it. */
  expect(o: Outcome, allowed: readonly number[]): void {
    this.calls.push({ ...o, allowed });
    if (allowed.includes(o.code)) return;
    // The volume's story so far: what the model was told, call by call.
    const volume = / (v\d+|same|contested) /.exec(` ${o.label} `)?.[1];
    const story = this.calls.filter((c) => volume && c.label.includes(` ${volume} `))
      .map((c) => `  ${c.label}: ${codeName(c.code)}`).slice(-12).join("\n");
    assert.fail(
      `${o.label}: got ${codeName(o.code)} (${o.details}), allowed ` +
        allowed.map(codeName).join(", ") + `\ncalls for ${volume}:\n${story}` +
        "\nlast warnings of the plugin:\n" +
        this.#pluginLog().filter((l) => /"level":"(warn|error)"/.test(l)).slice(-6).join("\n"),
    );
  }

  /** How many calls got each code. */
  tally(): Record<string, number> {
    const out: Record<string, number> = {};
    for (const c of this.calls) out[codeName(c.code)] = (out[codeName(c.code)] ?? 0) + 1;
    return out;
  }
}

/** What the test believes about one volume; only calls that succeeded change it. */
interface VolumeModel {
  readonly name: string;
  readonly id: string;
  readonly staging: string;
  readonly target: string;
  exists: boolean;
  staged: boolean;
  /** Staged at least once since it was created: a CreateVolume of its name is then no retry. */
  everStaged: boolean;
  published: boolean;
  capacity: number;
  readonly snapshots: Set<string>;
  /** Successful deletes that set a dataset aside (and snapshot deletes, per volume). */
  deletes: number;
  snapshotDeletes: number;
}

type Op =
  | "stage"
  | "publish"
  | "unpublish"
  | "unstage"
  | "snapshot"
  | "deleteSnapshot"
  | "expand"
  | "delete"
  | "create";

const OPS: readonly Op[] = [
  "stage",
  "stage",
  "publish",
  "publish",
  "unpublish",
  "unstage",
  "snapshot",
  "deleteSnapshot",
  "expand",
  "delete",
  "create",
];

Deno.test("concurrency: parallel calls on one volume and many, with a seeded schedule", async (t) => {
  const seed = seedFrom(Deno.env.get("ZFS_CSI_CONCURRENCY_SEED"), 20261123);
  print(`concurrency: seed ${seed} (ZFS_CSI_CONCURRENCY_SEED=${seed} repeats this schedule)`);
  const rng = new Prng(seed);
  await using pool = await TestPool.create(1024);
  await using plugin = await PluginProcess.start({
    parentDataset: pool.parent,
    dir: pool.dir,
    logLevel: "info",
  });
  const c: CsiClient = plugin.client;
  const ledger = new Ledger(() => plugin.logs());
  const base = plugin.baseDir;
  const cap = mountCapability();
  const createReq = (name: string, over: Record<string, unknown> = {}) => ({
    name,
    capacity_range: { required_bytes: String(64 * MiB), limit_bytes: "0" },
    volume_capabilities: [cap],
    parameters: {},
    ...over,
  });
  /** Starts `n` copies of a call at once, each after a PRNG jitter of up to `jitterMs`. */
  const burst = (
    n: number,
    label: string,
    call: () => Promise<unknown>,
    delays = Array.from({ length: n }, () => rng.int(0, 10)),
  ) => {
    return Promise.all(
      delays.map((d, i) => sleep(d).then(() => ledger.run(`${label} #${i + 1}`, call))),
    );
  };
  const mountsBelowBase = async () =>
    (await hostMounts()).filter((m) => m.path.startsWith(base + "/")).map((m) => m.path).sort();

  await t.step(`${IDENTICAL} identical CreateVolume calls race for one name`, async () => {
    const outcomes = await burst(
      IDENTICAL,
      "CreateVolume same",
      () => c.controller("CreateVolume", createReq("same")),
    );
    // The others wait for the first, then find the volume it made: all OK.
    for (const o of outcomes) ledger.expect(o, [OK]);
    for (const o of outcomes) {
      assert.deepEqual(o.response, outcomes[0]!.response, "every OK names one volume");
    }
    assert.equal((await pool.datasets()).filter((d) => d.endsWith("/same")).length, 1);
  });

  await t.step("CreateVolume with two different parameter sets races for one name", async () => {
    const racers = Array.from({ length: 16 }, (_, i) => ({
      compression: i % 2 === 0 ? "on" : "off",
      delay: rng.int(0, 10),
    }));
    const outcomes = await Promise.all(
      racers.map(({ compression, delay }, i) =>
        sleep(delay).then(() =>
          ledger.run(
            `CreateVolume contested ${compression} #${i + 1}`,
            () =>
              c.controller("CreateVolume", createReq("contested", { parameters: { compression } })),
          )
        )
      ),
    );
    for (const o of outcomes) ledger.expect(o, [OK, Code.ALREADY_EXISTS]);
    const winners = new Set(
      outcomes.map((o, i) => o.code === OK ? racers[i]!.compression : undefined)
        .filter((x) => x !== undefined),
    );
    assert.equal(winners.size, 1, `exactly one parameter set won (${[...winners]})`);
    const [winner] = [...winners];
    assert.equal(await pool.get(`${pool.parent}/contested`, "compression"), winner);
    // The losers were told so; a retry gets the same answer.
    const loser = winner === "on" ? "off" : "on";
    const retry = await ledger.run(
      "CreateVolume contested retry",
      () =>
        c.controller(
          "CreateVolume",
          createReq("contested", { parameters: { compression: loser } }),
        ),
    );
    ledger.expect(retry, [Code.ALREADY_EXISTS]);
  });

  const same = await claimPaths(base, { volumeId: "same@node-a", allocId: "same-alloc" });
  const sameStage = {
    volume_id: "same@node-a",
    staging_target_path: same.staging,
    volume_capability: cap,
    volume_context: { dataset: `${pool.parent}/same` },
  };
  const sameSteps: Array<[string, string, () => Promise<unknown>, number]> = [
    ["NodeStageVolume", same.staging, () => c.node("NodeStageVolume", sameStage), 1],
    [
      "NodePublishVolume",
      same.target,
      () => c.node("NodePublishVolume", { ...sameStage, target_path: same.target }),
      1,
    ],
    [
      "NodeUnpublishVolume",
      same.target,
      () => c.node("NodeUnpublishVolume", { volume_id: "same@node-a", target_path: same.target }),
      0,
    ],
    [
      "NodeUnstageVolume",
      same.staging,
      () =>
        c.node("NodeUnstageVolume", {
          volume_id: "same@node-a",
          staging_target_path: same.staging,
        }),
      0,
    ],
  ];
  for (const [method, path, call, mounts] of sameSteps) {
    await t.step(`${IDENTICAL} identical ${method} calls on one volume`, async () => {
      const outcomes = await burst(IDENTICAL, `${method} same`, call);
      // One call does the work; the others wait for it, then find it done.
      for (const o of outcomes) ledger.expect(o, [OK]);
      const at = (await hostMounts()).filter((m) => m.path === path);
      assert.equal(at.length, mounts, `${mounts} mount(s) at ${path}, never stacked`);
      ledger.expect(await ledger.run(`${method} same repeat`, call), [OK]);
    });
  }

  // --- Many volumes, interleaved -----------------------------------------------------------------
  const volumes: VolumeModel[] = [];
  await t.step(`${VOLUMES} volumes created in parallel`, async () => {
    const outcomes = await Promise.all(
      Array.from(
        { length: VOLUMES },
        (_, i) =>
          ledger.run(`CreateVolume v${i}`, () => c.controller("CreateVolume", createReq(`v${i}`))),
      ),
    );
    for (const [i, o] of outcomes.entries()) {
      ledger.expect(o, [OK]);
      const id = `v${i}@node-a`;
      const p = await claimPaths(base, { volumeId: id, allocId: `alloc-${i}` });
      volumes.push({
        name: `v${i}`,
        id,
        staging: p.staging,
        target: p.target,
        exists: true,
        staged: false,
        everStaged: false,
        published: false,
        capacity: 64 * MiB,
        snapshots: new Set(),
        deletes: 0,
        snapshotDeletes: 0,
      });
    }
  });

  const volumeContext = (v: VolumeModel) => ({ dataset: `${pool.parent}/${v.name}` });
  const callFor = (v: VolumeModel, op: Op, snap: string, size: number) => {
    const stage = {
      volume_id: v.id,
      staging_target_path: v.staging,
      volume_capability: cap,
      volume_context: volumeContext(v),
    };
    switch (op) {
      case "stage":
        return () => c.node("NodeStageVolume", stage);
      case "publish":
        return () => c.node("NodePublishVolume", { ...stage, target_path: v.target });
      case "unpublish":
        return () => c.node("NodeUnpublishVolume", { volume_id: v.id, target_path: v.target });
      case "unstage":
        return () =>
          c.node("NodeUnstageVolume", { volume_id: v.id, staging_target_path: v.staging });
      case "snapshot":
        return () => c.controller("CreateSnapshot", { source_volume_id: v.id, name: snap });
      case "deleteSnapshot":
        return () => c.controller("DeleteSnapshot", { snapshot_id: `${v.name}@${snap}@node-a` });
      case "expand":
        return () =>
          c.controller("ControllerExpandVolume", {
            volume_id: v.id,
            capacity_range: { required_bytes: String(size), limit_bytes: "0" },
          });
      case "delete":
        return () => c.controller("DeleteVolume", { volume_id: v.id });
      case "create":
        return () => c.controller("CreateVolume", createReq(v.name));
    }
  };
  /** The code a lone call of `op` gets in the model's state, and how it changes the model. */
  const expected = (v: VolumeModel, op: Op, snap: string, size: number) => {
    const inUse = v.staged || v.published;
    switch (op) {
      case "stage":
        return v.exists
          ? { code: OK, apply: () => void (v.staged = v.everStaged = true) }
          : { code: Code.NOT_FOUND, apply: () => {} };
      case "publish":
        return v.staged
          ? { code: OK, apply: () => void (v.published = true) }
          : { code: Code.FAILED_PRECONDITION, apply: () => {} };
      case "unpublish":
        return { code: OK, apply: () => void (v.published = false) };
      case "unstage":
        return { code: OK, apply: () => void (v.staged = false) };
      case "snapshot":
        return v.exists
          ? { code: OK, apply: () => void v.snapshots.add(snap) }
          : { code: Code.NOT_FOUND, apply: () => {} };
      case "deleteSnapshot":
        return {
          code: OK,
          apply: () => {
            if (v.snapshots.delete(snap)) v.snapshotDeletes++;
          },
        };
      case "expand":
        return v.exists
          ? { code: OK, apply: () => void (v.capacity = Math.max(v.capacity, size)) }
          : { code: Code.NOT_FOUND, apply: () => {} };
      case "delete":
        if (!v.exists) return { code: OK, apply: () => {} };
        if (inUse || v.snapshots.size > 0) {
          return { code: Code.FAILED_PRECONDITION, apply: () => {} };
        }
        return {
          code: OK,
          apply: () => {
            v.exists = false;
            v.everStaged = false;
            v.deletes++;
            v.capacity = 64 * MiB;
          },
        };
      case "create":
        // A repeat fits the volume (64 MiB asked, at least that much held), but is a retry only
        // until the volume is first staged (src/volume/tenancy.ts); a new one is new.
        if (v.exists) return { code: v.everStaged ? Code.ALREADY_EXISTS : OK, apply: () => {} };
        return { code: OK, apply: () => void (v.exists = true) };
    }
  };

  // zfs-fuse's `zfs rename` once failed with no message at all (in about 30 runs), and the
  // plugin answered INTERNAL. Such a delete is counted, and the model then follows what zfs
  // shows, so the final checks still catch a delete left half done.
  let renameGlitches = 0;
  const renameGlitch = (o: Outcome) =>
    o.code === Code.INTERNAL && /"zfs rename" failed \(unknown\)/.test(o.details);
  const settleGlitch = async (v: VolumeModel) => {
    renameGlitches++;
    const still = await pool.get(`${pool.parent}/${v.name}`, "type").then(() => true, () => false);
    if (!still && v.exists) expected(v, "delete", "", 0).apply();
  };
  let roundCalls = 0;
  let listCalls = 0;
  const opCounts: Record<string, number> = {};
  const checkMounts = async (when: string) => {
    const want = volumes.flatMap((v) => [
      ...(v.staged ? [v.staging] : []),
      ...(v.published ? [v.target] : []),
    ]).sort();
    assert.deepEqual(await mountsBelowBase(), want, `mounts below the base dir ${when}`);
  };

  for (let round = 1; round <= ROUNDS; round++) {
    await t.step(
      `round ${round}/${ROUNDS}: one operation per volume, duplicated, interleaved`,
      async () => {
        // Every choice is drawn whatever the model's state, so the seed alone fixes the
        // schedule (timing can still decide who wins a race).
        const plans = volumes.map((v) => {
          const raceRoll = rng.chance(0.25);
          const plan = {
            v,
            op: rng.pick(OPS),
            copies: rng.int(1, 3),
            snap: `${v.name}-s${rng.int(1, 2)}`,
            size: (64 + 8 * rng.int(0, 4)) * MiB,
            delays: [rng.int(0, 10), rng.int(0, 10), rng.int(0, 10)],
          };
          const free = v.exists && !v.staged && !v.published && v.snapshots.size === 0;
          return { ...plan, race: raceRoll && free };
        });
        // Listings take no lock: they run beside creates, renames into the trash and snapshots,
        // and must neither fail nor show anything but whole volumes.
        const listings = Promise.all([
          ...Array.from(
            { length: 2 },
            (_, i) =>
              sleep(rng.int(0, 20)).then(() =>
                ledger.run(
                  `round ${round} ListVolumes #${i + 1}`,
                  () => c.controller("ListVolumes", {}),
                )
              ),
          ),
          ...Array.from(
            { length: 2 },
            (_, i) =>
              sleep(rng.int(0, 20)).then(() =>
                ledger.run(
                  `round ${round} ListSnapshots #${i + 1}`,
                  () => c.controller("ListSnapshots", {}),
                )
              ),
          ),
        ]);
        await Promise.all(plans.map(async (p) => {
          const { v } = p;
          if (p.race) {
            // DeleteVolume racing NodeStageVolume on a free volume: one goes first, the other
            // waits and then meets what it left (a staged volume, or none).
            const [del, stg] = await Promise.all([
              sleep(p.delays[0]! / 2).then(() =>
                ledger.run(`round ${round} ${v.name} delete (race)`, callFor(v, "delete", "", 0))
              ),
              sleep(p.delays[1]! / 2).then(() =>
                ledger.run(`round ${round} ${v.name} stage (race)`, callFor(v, "stage", "", 0))
              ),
            ]);
            ledger.expect(
              del,
              renameGlitch(del) ? [Code.INTERNAL] : [OK, Code.FAILED_PRECONDITION],
            );
            if (renameGlitch(del)) await settleGlitch(v);
            ledger.expect(stg, [OK, Code.NOT_FOUND]);
            if (del.code === OK) {
              assert.notEqual(stg.code, OK, "a volume was deleted and staged at once");
              expected(v, "delete", "", 0).apply();
            }
            if (stg.code === OK) v.staged = v.everStaged = true;
            if (del.code === Code.FAILED_PRECONDITION) {
              assert.ok(
                stg.code === OK || /busy/.test(del.details),
                `delete refused without a stage winning: ${del.details}`,
              );
            }
            if (stg.code === Code.NOT_FOUND) {
              assert.ok(del.code === OK || renameGlitch(del), "NOT_FOUND only after delete");
            }
            roundCalls += 2;
            opCounts["delete/stage race"] = (opCounts["delete/stage race"] ?? 0) + 1;
            return;
          }
          const want = expected(v, p.op, p.snap, p.size);
          const outcomes = await burst(
            p.copies,
            `round ${round} ${v.name} ${p.op}`,
            callFor(v, p.op, p.snap, p.size),
            p.delays.slice(0, p.copies),
          );
          roundCalls += outcomes.length;
          opCounts[p.op] = (opCounts[p.op] ?? 0) + 1;
          // zfs-fuse can call a just-unmounted filesystem busy for a moment: a delete then fails
          // before changing anything, and says so.
          const busyDelete = (o: Outcome) =>
            p.op === "delete" && o.code === Code.FAILED_PRECONDITION && /busy/.test(o.details);
          for (const o of outcomes) {
            const odd = busyDelete(o) || (p.op === "delete" && renameGlitch(o));
            ledger.expect(o, odd ? [o.code] : [want.code]);
          }
          // Copies run one after another; a busy call changed nothing, the others did what
          // the model says (a repeat of an operation answers as the first did).
          if (outcomes.some((o) => o.code === want.code && !busyDelete(o))) want.apply();
          else if (p.op === "delete" && outcomes.some(renameGlitch)) await settleGlitch(v);
        }));
        const known = new Set(["same", "contested", ...volumes.map((v) => v.name)]);
        for (const o of await listings) {
          ledger.expect(o, [OK]);
          const entries = (o.response?.entries ?? []) as Array<{
            volume?: { volume_id: string };
            snapshot?: { snapshot_id: string; source_volume_id: string };
          }>;
          for (const e of entries) {
            const id = e.volume?.volume_id ?? e.snapshot?.source_volume_id ?? "";
            assert.ok(known.has(id.split("@")[0]!), `${o.label} lists a known volume: ${id}`);
            if (e.snapshot) {
              assert.match(e.snapshot.snapshot_id, /^v\d+@v\d+-s\d@node-a$/, o.label);
            }
          }
          listCalls++;
        }
        await checkMounts(`after round ${round}`);
      },
    );
  }

  await t.step("release everything, delete snapshots and some volumes, in parallel", async () => {
    for (const op of ["unpublish", "unstage"] as const) {
      const outcomes = await Promise.all(
        volumes.map((v) => burst(2, `final ${v.name} ${op}`, callFor(v, op, "", 0))),
      );
      for (const [i, os] of outcomes.entries()) {
        for (const o of os) ledger.expect(o, [OK]);
        assert.ok(os.some((o) => o.code === OK));
        expected(volumes[i]!, op, "", 0).apply();
      }
    }
    await checkMounts("after the final release");
    // All at once, so two snapshots of one volume collide: the second waits for the first.
    const snaps = volumes.flatMap((v) => [...v.snapshots].map((s) => ({ v, s })));
    await Promise.all(snaps.map(async ({ v, s }) => {
      const o = await ledger.run(
        `final ${v.name} deleteSnapshot ${s}`,
        callFor(v, "deleteSnapshot", s, 0),
      );
      ledger.expect(o, [OK]);
      expected(v, "deleteSnapshot", s, 0).apply();
    }));
    const rolls = volumes.map(() => rng.chance(0.5));
    const doomed = volumes.filter((v, i) => v.exists && rolls[i]);
    for (let attempt = 0; attempt < 5 && doomed.some((v) => v.exists); attempt++) {
      const left = doomed.filter((v) => v.exists);
      const res = await Promise.all(
        left.map((v) => ledger.run(`final ${v.name} delete`, callFor(v, "delete", "", 0))),
      );
      for (const [i, o] of res.entries()) {
        if (o.code === Code.FAILED_PRECONDITION && /busy/.test(o.details)) {
          ledger.expect(o, [o.code]);
          continue;
        }
        if (renameGlitch(o)) {
          ledger.expect(o, [o.code]);
          await settleGlitch(left[i]!);
          continue;
        }
        ledger.expect(o, [OK]);
        expected(left[i]!, "delete", "", 0).apply();
      }
      if (doomed.some((v) => v.exists)) await sleep(300);
    }
    assert.ok(doomed.every((v) => !v.exists), "every chosen volume was deleted");
  });

  await t.step("no leaked mount, no orphan dataset, every code accounted for", async () => {
    assert.deepEqual(await mountsBelowBase(), [], "no mount left below the base dir");
    const parent = pool.parent;
    const names = (await sh("zfs", "list", "-H", "-r", "-t", "all", "-o", "name", parent))
      .split("\n").filter((l) => l !== "" && l !== parent);
    const datasets = names.filter((n) => !n.includes("@"));
    const live = new Set([
      "same",
      "contested",
      ...volumes.filter((v) => v.exists).map((v) => v.name),
    ].map((n) => `${parent}/${n}`));
    const trash = new Map<string, number>();
    for (const d of datasets) {
      if (live.has(d)) continue;
      const m = new RegExp(`^${parent}/\\.deleted-\\d+-(.+)$`).exec(d);
      assert.ok(m, `dataset ${d} is neither a live volume nor trash`);
      trash.set(m[1]!, (trash.get(m[1]!) ?? 0) + 1);
    }
    for (const d of live) assert.ok(datasets.includes(d), `live volume ${d} exists`);
    for (const v of volumes) {
      assert.equal(trash.get(v.name) ?? 0, v.deletes, `trash of ${v.name}`);
      if (!v.exists) continue;
      const ds = `${parent}/${v.name}`;
      assert.equal(await pool.get(ds, "org.zfs-csi:managed"), "yes", ds);
      assert.equal(Number(await pool.get(ds, "refquota")), v.capacity, `capacity of ${ds}`);
      const visible = names.filter((n) => n.startsWith(`${ds}@`) && !n.includes("@."));
      assert.deepEqual(visible, [], `no snapshot of ${ds} left`);
    }
    for (const n of names.filter((n) => n.includes("@"))) {
      assert.match(n.slice(n.indexOf("@") + 1), /^\.deleted-\d+-/, `snapshot ${n} is trash`);
    }
    const listed = await c.controller("ListVolumes", {});
    assert.deepEqual(
      listed.entries.map((e: { volume: { volume_id: string } }) => e.volume.volume_id).sort(),
      [...live].map((d) => `${d.slice(parent.length + 1)}@node-a`).sort(),
    );
    const codes = new Set(ledger.calls.filter((x) => !renameGlitch(x)).map((x) => x.code));
    for (const code of codes) {
      assert.ok(
        [OK, Code.FAILED_PRECONDITION, Code.NOT_FOUND, Code.ALREADY_EXISTS].includes(code),
        `unexpected code ${codeName(code)}`,
      );
    }
    // Calls did overlap on one volume, and waited for each other instead of failing.
    const waited = plugin.records().filter((r) => typeof r.lockWaitMs === "number");
    assert.ok(waited.length >= IDENTICAL, `calls waited for a busy volume (${waited.length})`);
    const longest = Math.max(...waited.map((r) => r.lockWaitMs as number));
    assert.equal(
      plugin.records().filter((r) => r.code === "INTERNAL").length,
      renameGlitches,
      "no INTERNAL but the counted rename glitches",
    );
    print(
      `concurrency: seed ${seed}, ${ledger.calls.length} calls (${roundCalls} in ${ROUNDS} ` +
        `rounds over ${VOLUMES} volumes, ${listCalls} listings beside them, ` +
        `${renameGlitches} zfs-fuse rename glitches, ${waited.length} waited for a busy ` +
        `volume, longest ${longest} ms), ` +
        `codes ${JSON.stringify(ledger.tally())}, ` +
        `operations per volume and round ${JSON.stringify(opCounts)}`,
    );
  });
});
