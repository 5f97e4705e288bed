import assert from "node:assert/strict";
import {
  extent,
  formatSamples,
  heapReportPath,
  lastHalfGrowth,
  type SoakSample,
  soakVerdict,
} from "./soak_stats.ts";

/** Samples every 100 lifecycles whose RSS follows `rss(lifecycles)`. */
function series(count: number, rss: (n: number) => number): SoakSample[] {
  return Array.from({ length: count }, (_, i) => ({
    lifecycles: i * 100,
    seconds: i * 10,
    rssMiB: rss(i * 100),
    heapMiB: 14,
  }));
}

Deno.test("extent: first, last and peak", () => {
  assert.deepEqual(extent([80, 120, 95]), { first: 80, last: 95, peak: 120 });
  assert.throws(() => extent([]), RangeError);
});

Deno.test("lastHalfGrowth: a steady climb is measured over the last half only", () => {
  // 1 MiB per 100 lifecycles; samples 0..2000: the last half spans 1000..2000, 10 MiB.
  const got = lastHalfGrowth(series(21, (n) => 80 + n / 100), (s) => s.rssMiB);
  assert.ok(Math.abs(got - 10) < 1e-9, String(got));
});

Deno.test("lastHalfGrowth: growth that levels off early shows none", () => {
  const got = lastHalfGrowth(series(21, (n) => 80 + Math.min(n, 500) / 10), (s) => s.rssMiB);
  assert.ok(Math.abs(got) < 1e-9, String(got));
});

Deno.test("lastHalfGrowth: one high sample does not decide alone", () => {
  const s = series(21, () => 100).map((x, i) => i === 20 ? { ...x, rssMiB: 104 } : x);
  const got = lastHalfGrowth(s, (x) => x.rssMiB);
  // Last minus middle would say 4 MiB; the line through 11 samples says less.
  assert.ok(got > 0 && got < 4, String(got));
});

Deno.test("lastHalfGrowth: too few samples, or no heap figures, give NaN", () => {
  assert.ok(Number.isNaN(lastHalfGrowth(series(3, () => 90), (s) => s.rssMiB)));
  assert.ok(Number.isNaN(lastHalfGrowth([], (s) => s.rssMiB)));
  const noHeap = series(21, () => 90).map(({ heapMiB: _, ...rest }) => rest);
  assert.ok(Number.isNaN(lastHalfGrowth(noHeap, (s) => s.heapMiB)));
});

Deno.test("soakVerdict: met only when RSS is within 120 MiB and flat", () => {
  assert.deepEqual(soakVerdict(110, 1.5), { met: true, reasons: [] });
  const high = soakVerdict(130, 0);
  assert.equal(high.met, false);
  assert.match(high.reasons[0]!, /130\.0 MiB > 120 MiB/);
  const growing = soakVerdict(100, 6);
  assert.equal(growing.met, false);
  assert.match(growing.reasons[0]!, /grew 6\.0 MiB/);
  assert.equal(soakVerdict(100, NaN).met, false);
  assert.equal(soakVerdict(NaN, 0).met, false);
});

Deno.test("heapReportPath: beside the plugin's socket", () => {
  assert.equal(heapReportPath("unix:///tmp/x/plugin/csi.sock"), "/tmp/x/plugin/heap.json");
  assert.equal(heapReportPath("/run/csi.sock"), "/run/heap.json");
});

Deno.test("formatSamples: one row per sample, a dash for a missing heap", () => {
  const text = formatSamples([
    { lifecycles: 0, seconds: 0, rssMiB: 85.04, heapMiB: 13.6 },
    { lifecycles: 12000, seconds: 600, rssMiB: 101.26 },
  ]);
  const lines = text.split("\n");
  assert.equal(lines.length, 4);
  assert.match(lines[2]!, /\|\s+0 \|\s+0\.0 \|\s+85\.0 \|\s+13\.6 \|/);
  assert.match(lines[3]!, /\|\s+12,000 \|\s+10\.0 \|\s+101\.3 \|\s+- \|/);
});
