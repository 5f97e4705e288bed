/**
 * `deno task test:faults`: runs the fault-schedule test (world.ts) for many seeds, or replays one
 * scenario.
 *
 *   deno task test:faults [--seeds 300] [--from 0] [--steps 60] [--show 3] [--shrink]
 *   deno task test:faults --replay FILE|JSON [--shrink] [--verbose]
 *
 * Every failing seed gets a line (the invariant and what broke); the first `--show` of them a
 * full report: where and when, what was noticed on the way, Nomad's last calls, and the
 * scenario as JSON (with `--shrink`, cut down to the steps that still break the same
 * invariant), ready to be replayed or kept as a fixed test. `--verbose` adds the plugins' log.
 * Exits 1 when an invariant broke.
 */

import { parseArgs } from "node:util";
import { formatFailure, runSeeds, shrink, withLog } from "./report.ts";
import { DEFAULT_STEPS, parseScenario } from "./schedule.ts";
import { runScenario } from "./world.ts";

const { values } = parseArgs({
  args: Deno.args,
  options: {
    seeds: { type: "string", default: "300" },
    from: { type: "string", default: "0" },
    steps: { type: "string", default: String(DEFAULT_STEPS) },
    show: { type: "string", default: "3" },
    replay: { type: "string" },
    shrink: { type: "boolean", default: false },
    verbose: { type: "boolean", default: false },
  },
});

const encoder = new TextEncoder();
const write = (s: string) => Deno.stdout.writeSync(encoder.encode(s + "\n"));

function count(name: string, text: string): number {
  if (!/^\d+$/.test(text)) {
    write(`--${name} must be a whole number, got "${text}"`);
    Deno.exit(2);
  }
  return Number(text);
}

if (values.replay !== undefined) {
  const text = values.replay.trimStart().startsWith("{")
    ? values.replay
    : await Deno.readTextFile(values.replay);
  const result = await runScenario(parseScenario(text));
  if (!result.violation) {
    write(`replay: no invariant broke (${result.stepsRun} steps, ${result.virtualMs} ms virtual)`);
    Deno.exit(0);
  }
  const shown = values.shrink ? await shrink(result) : result;
  write(formatFailure(shown, { log: values.verbose }));
  Deno.exit(1);
}

const seeds = count("seeds", values.seeds);
const from = count("from", values.from);
const steps = count("steps", values.steps);
const show = count("show", values.show);
const started = performance.now();
const failures = await runSeeds({ from, count: seeds, steps }, (r) => {
  const v = r.violation!;
  write(`seed ${r.scenario.seed}: invariant ${v.invariant}: ${v.message.slice(0, 200)}`);
});
const seconds = (performance.now() - started) / 1000;
for (const f of failures.slice(0, show)) {
  write("");
  write(formatFailure(values.shrink ? await shrink(f) : await withLog(f), { log: values.verbose }));
}
const byInvariant = new Map<string, number>();
for (const f of failures) {
  const k = String(f.violation!.invariant);
  byInvariant.set(k, (byInvariant.get(k) ?? 0) + 1);
}
write(
  `\n${seeds} seeds (${from}..${from + seeds - 1}, ${steps} steps each) in ${
    seconds.toFixed(1)
  } s (${(seeds / seconds).toFixed(1)} seeds/s): ${failures.length} broke an invariant` +
    (failures.length > 0
      ? ` (${[...byInvariant].map(([k, n]) => `invariant ${k}: ${n}`).join(", ")})`
      : ""),
);
Deno.exit(failures.length > 0 ? 1 : 0);
