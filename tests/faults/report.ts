/**
 * Running many seeds, shrinking a failing scenario to the steps that still break the same
 * invariant, and printing a failure so that it can be replayed as a fixed test.
 */

import { generate, type Scenario, type Step } from "./schedule.ts";
import { type RunResult, runScenario } from "./world.ts";

/**
 * Runs seeds `from` .. `from + count - 1` (without the plugins' info lines: run a failure again
 * with {@linkcode withLog} to read it); calls `onFail` for each failing one.
 */
export async function runSeeds(
  opts: { from: number; count: number; steps: number },
  onFail: (r: RunResult) => void = () => {},
): Promise<RunResult[]> {
  const failures: RunResult[] = [];
  for (let seed = opts.from; seed < opts.from + opts.count; seed++) {
    const r = await runScenario(generate(seed, opts.steps), { logLevel: "warn" });
    if (!r.violation) continue;
    failures.push(r);
    onFail(r);
  }
  return failures;
}

/**
 * The smallest scenario found that still breaks the same invariant: steps after the one that
 * broke it go, then ranges of steps, halving the range each round (a removed step's wait is
 * added to the next one's, so the rest keeps its times).
 */
export async function shrink(failed: RunResult, maxRuns = 400): Promise<RunResult> {
  const want = failed.violation!.invariant;
  let best = failed;
  let runs = 0;
  const attempt = async (steps: Step[]): Promise<boolean> => {
    if (runs++ >= maxRuns) return false;
    const r = await runScenario({ ...best.scenario, steps }, { logLevel: "warn" });
    if (r.violation?.invariant !== want) return false;
    best = r;
    return true;
  };
  // What came after the step that broke it never mattered.
  const cut = Math.min(best.scenario.steps.length, best.violation!.step + 1);
  if (cut < best.scenario.steps.length) await attempt(best.scenario.steps.slice(0, cut));
  for (let size = Math.max(1, Math.floor(best.scenario.steps.length / 2)); size >= 1;) {
    let removed = false;
    for (let i = 0; i < best.scenario.steps.length;) {
      if (await attempt(without(best.scenario.steps, i, size))) removed = true;
      else i += size;
    }
    if (!removed) size = Math.floor(size / 2);
  }
  return await withLog(best);
}

/** The same run again with the plugins' log lines (a run is a function of its scenario). */
export async function withLog(r: RunResult): Promise<RunResult> {
  return await runScenario(r.scenario);
}

/** `steps` without `count` steps from `at`, their waits added to the next step's. */
function without(steps: readonly Step[], at: number, count: number): Step[] {
  const gone = steps.slice(at, at + count);
  const rest = [...steps.slice(0, at), ...steps.slice(at + count)];
  const next = rest[at];
  if (next) rest[at] = { ...next, dt: next.dt + gone.reduce((n, s) => n + s.dt, 0) };
  return rest;
}

/** A failure for people, with its scenario as one line of JSON to replay. */
export function formatFailure(r: RunResult, opts: { log?: boolean } = {}): string {
  const v = r.violation!;
  const s: Scenario = r.scenario;
  const step = s.steps[v.step];
  const lines = [
    `seed ${s.seed}: invariant ${v.invariant} broke ${
      v.step >= s.steps.length
        ? "after the last step (while nodes came back and Nomad stopped every job)"
        : `at step ${v.step} (${JSON.stringify(step)})`
    }, ${v.atMs} ms into the run, on ${v.nodes.length > 0 ? v.nodes.join(", ") : "the store"}:`,
    `  ${v.message}`,
    `  scenario (${s.steps.length} steps; deno task test:faults --replay '<json>'):`,
    JSON.stringify(s),
    ...(r.hints.length > 0 ? [`  noticed on the way:`, ...r.hints.map((h) => `    ${h}`)] : []),
    `  Nomad's last calls:`,
    ...r.trace.slice(-25).map((l) => `    ${l}`),
  ];
  if (opts.log) lines.push(`  plugin log:`, ...r.log.slice(-150).map((l) => `    ${l}`));
  return lines.join("\n");
}
