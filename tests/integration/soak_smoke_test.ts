/**
 * The memory soak (bench/soak.ts) runs, short: it drives the plugin through whole lifecycles,
 * samples RSS from outside and the live heap through the preloaded probe (bench/heap_probe.ts),
 * and prints the table, the summary and a verdict.
 */

import assert from "node:assert/strict";
import { fileURLToPath } from "node:url";

const ROOT = fileURLToPath(new URL("../../", import.meta.url));

Deno.test("deno task bench:soak, 20 lifecycles: samples with RSS and live heap, and a verdict", async () => {
  const res = await new Deno.Command(Deno.execPath(), {
    args: [
      "run",
      "--frozen",
      "--allow-all",
      "bench/soak.ts",
      "--lifecycles",
      "20",
      "--every",
      "5",
      "--idle-seconds",
      "1",
    ],
    cwd: ROOT,
    stdout: "piped",
    stderr: "piped",
  }).output();
  const out = new TextDecoder().decode(res.stdout);
  assert.equal(res.code, 0, new TextDecoder().decode(res.stderr));
  assert.match(out, /^soak: 20 full lifecycles \(\+2 create\/delete and ListVolumes\)/m);
  // One row per sample: at 0, 5, 10, 15 and 20 lifecycles, each with RSS and a live heap.
  const rows = [...out.matchAll(/^\|\s+(\d+) \|\s+[\d.]+ \|\s+([\d.]+) \|\s+([\d.]+) \|$/gm)];
  assert.deepEqual(rows.map((r) => Number(r[1])), [0, 5, 10, 15, 20], out);
  for (const r of rows) {
    const rss = Number(r[2]);
    const heap = Number(r[3]);
    assert.ok(rss > 20 && rss < 1024, `RSS ${rss} MiB`);
    // The heap comes from the plugin after a full GC: far below its RSS, never zero.
    assert.ok(heap > 1 && heap < rss, `live heap ${heap} MiB, RSS ${rss} MiB`);
  }
  assert.match(out, /^samples\s+5$/m);
  assert.match(out, /^RSS after 1 s idle\s+[\d.]+ MiB$/m);
  assert.match(out, /^target: RSS after the soak <= 120 MiB .*: (met|NOT met \(.+\))$/m);
});
