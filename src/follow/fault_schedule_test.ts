/**
 * The fault-schedule test of the follow protocol (tests/faults/): simulated nodes running the
 * real src/follow and src/replicate code over model pools and a faulty store, on virtual time,
 * driven by seeded schedules of Nomad calls, backups, pauses, kills, clock steps and store
 * faults; the four invariants are checked throughout (tests/faults/invariants.ts).
 *
 * Issue 21 lists defects this test finds on the code it was written against; until they are
 * fixed, the seeds it runs here break invariants, so by default a broken invariant is printed
 * and not failed. With FAULTS_EXPECT_FIXED=1 every broken invariant fails the test. A model
 * error (a command the model pools do not know) always fails it.
 *
 * FAULTS_SEEDS (default 300) and FAULTS_FROM (default 0) choose the seeds;
 * `deno task test:faults --seeds N` runs as many as asked, outside the unit suite.
 */

import assert from "node:assert/strict";
import { formatFailure } from "../../tests/faults/report.ts";
import { generate, type Scenario } from "../../tests/faults/schedule.ts";
import { runScenario } from "../../tests/faults/world.ts";

const expectFixed = Deno.env.get("FAULTS_EXPECT_FIXED") === "1";

function envCount(name: string, fallback: number): number {
  const v = Deno.env.get(name);
  if (v === undefined || v === "") return fallback;
  if (!/^\d+$/.test(v)) throw new RangeError(`${name} must be a whole number, got "${v}"`);
  return Number(v);
}

Deno.test("fault schedules: the four invariants hold over many seeds", async () => {
  const from = envCount("FAULTS_FROM", 0);
  const count = envCount("FAULTS_SEEDS", 300);
  const broken: string[] = [];
  const started = performance.now();
  for (let seed = from; seed < from + count; seed++) {
    const r = await runScenario(generate(seed), { logLevel: "warn" });
    const v = r.violation;
    if (!v) continue;
    // A failure to read is run again with the plugins' log lines (runs repeat exactly).
    if (v.invariant === "sim" || expectFixed) {
      assert.fail(formatFailure(await runScenario(r.scenario), { log: true }));
    }
    broken.push(`seed ${seed}: invariant ${v.invariant}: ${v.message.slice(0, 160)}`);
  }
  const seconds = (performance.now() - started) / 1000;
  // deno-lint-ignore no-console
  console.log(
    `${count} seeds in ${seconds.toFixed(1)} s; ${broken.length} broke an invariant` +
      (broken.length > 0
        ? ` (known defects of issue 21 until fixed; FAULTS_EXPECT_FIXED=1 fails on them):\n  ` +
          broken.join("\n  ")
        : ""),
  );
});

/** A schedule with no fault at all: jobs placed, written, moved and stopped. */
const CALM: Scenario = {
  seed: 1,
  flavour: "openzfs",
  nodes: 3,
  keeps: ["last=2", "hourly=1"],
  ttlSeconds: 30,
  takeoverAfterSeconds: 60,
  maxChainLength: 3,
  steps: [
    { dt: 100, op: "place", vol: 0, node: 0 },
    { dt: 100, op: "place", vol: 1, node: 1 },
    { dt: 5_000, op: "write", vol: 0 },
    { dt: 100, op: "write", vol: 1 },
    { dt: 60_000, op: "backup", vol: 0, node: -1 },
    { dt: 1_000, op: "move", vol: 0, node: 2 },
    { dt: 10_000, op: "write", vol: 0 },
    { dt: 1_000, op: "move", vol: 1, node: 0 },
    { dt: 10_000, op: "write", vol: 1 },
    { dt: 1_000, op: "move", vol: 0, node: 0 },
    { dt: 10_000, op: "write", vol: 0 },
    { dt: 1_000, op: "stop", vol: 1 },
  ],
};

Deno.test("fault schedules: a schedule without faults breaks nothing, on both zfs", async () => {
  for (const flavour of ["openzfs", "zfs-fuse"] as const) {
    const r = await runScenario({ ...CALM, flavour });
    assert.equal(r.violation, undefined, r.violation ? formatFailure(r, { log: true }) : "");
    assert.equal(r.stepsRun, CALM.steps.length);
  }
});

Deno.test("fault schedules: a run is a function of its scenario", async () => {
  for (const seed of [3, 18]) {
    const a = await runScenario(generate(seed));
    const b = await runScenario(generate(seed));
    assert.deepEqual(b.trace, a.trace, `seed ${seed}: Nomad saw the same calls and answers`);
    assert.equal(b.timersFired, a.timersFired);
    assert.deepEqual(b.violation, a.violation);
  }
});
