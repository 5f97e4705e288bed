/**
 * Fixed replays of the fault-schedule test (tests/faults/): for each defect of issue 21 that the
 * schedules find (and one they found beyond it), the scenario (shrunk from the seed that found
 * it on the code the test was written against) that breaks an invariant because of that
 * defect. Each must run without breaking any invariant once the defect is fixed.
 *
 * Until then they fail, by design: they run only with FAULTS_EXPECT_FIXED=1 (as the lead does
 * once the fixes are merged), and are skipped otherwise, saying so. To see one fail now:
 *   FAULTS_EXPECT_FIXED=1 ./tools/deno test --allow-read --allow-env src/follow/fault_replays_test.ts
 * or `deno task test:faults --replay tests/faults/replays/<file>.json --verbose`.
 */

import assert from "node:assert/strict";
import { formatFailure } from "../../tests/faults/report.ts";
import { parseScenario } from "../../tests/faults/schedule.ts";
import { runScenario } from "../../tests/faults/world.ts";
import d2 from "../../tests/faults/replays/defect-2-keep-by-clock.json" with { type: "json" };
import d3 from "../../tests/faults/replays/defect-3-renewals-queue.json" with { type: "json" };
import d3b from "../../tests/faults/replays/defect-3-release-lease.json" with { type: "json" };
import d4 from "../../tests/faults/replays/defect-4-writable-after-loss.json" with {
  type: "json",
};
import d5 from "../../tests/faults/replays/defect-5-overlapping-unstage-stage.json" with {
  type: "json",
};
import d6 from "../../tests/faults/replays/defect-6-stale-list-prune.json" with { type: "json" };
import d8 from "../../tests/faults/replays/defect-8-name-reused.json" with { type: "json" };
import n1 from "../../tests/faults/replays/new-stale-holder-prunes-next-head.json" with {
  type: "json",
};

const REPLAYS: ReadonlyArray<readonly [string, unknown]> = [
  ["defect 2: the keep policy trusts the sending node's wall clock", d2],
  ["defect 3: lease renewals queue behind another volume's release", d3],
  ["defect 3: a release does not keep its own lease alive while it uploads", d3b],
  ["defect 4: a stage makes its copy writable after losing the volume", d4],
  ["defect 5: overlapping NodeUnstage and NodeStage on one node", d5],
  ["defect 6: a stale manifest list unprotects the head's chain", d6],
  ["defect 8: a backup snapshot name is reused within one chain", d8],
  // Found by the schedules, not in issue 21's list: a holder that lost the volume mid-backup
  // prunes the new holder's first snapshot before it is the head; the head then moves onto it.
  ["a stale holder prunes the next holder's snapshot before it becomes the head", n1],
];

const expectFixed = Deno.env.get("FAULTS_EXPECT_FIXED") === "1";

for (const [name, json] of REPLAYS) {
  Deno.test({
    name: `fault replay, ${name}: no invariant breaks`,
    ignore: !expectFixed,
    fn: async () => {
      const r = await runScenario(parseScenario(JSON.stringify(json)));
      assert.equal(r.violation, undefined, r.violation ? formatFailure(r, { log: true }) : "");
    },
  });
}

if (!expectFixed) {
  // deno-lint-ignore no-console
  console.log(
    `fault_replays_test.ts: ${REPLAYS.length} replays skipped: they break invariants until the ` +
      `defects of issue 21 are fixed; run with FAULTS_EXPECT_FIXED=1 to run them`,
  );
}
