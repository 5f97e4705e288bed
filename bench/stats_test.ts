import assert from "node:assert/strict";
import { formatMs, formatRatio, formatTable, median, percentile, ratio, verdict } from "./stats.ts";

Deno.test("median of odd and even counts, unsorted input left alone", () => {
  const xs = [5, 1, 3];
  assert.deepEqual(median(xs), 3);
  assert.deepEqual(xs, [5, 1, 3]);
  assert.deepEqual(median([4, 1, 3, 2]), 2.5);
  assert.deepEqual(median([7]), 7);
  assert.throws(() => median([]), RangeError);
});

Deno.test("percentile uses the nearest rank", () => {
  const xs = Array.from({ length: 100 }, (_, i) => 100 - i); // 100..1
  assert.deepEqual(percentile(xs, 50), 50);
  assert.deepEqual(percentile(xs, 99), 99);
  assert.deepEqual(percentile(xs, 100), 100);
  assert.deepEqual(percentile(xs, 0), 1);
  assert.deepEqual(percentile([3, 1, 2], 50), 2);
  // One slow call in ten shows at p99, not at p50.
  assert.deepEqual(percentile([1, 1, 1, 1, 1, 1, 1, 1, 1, 40], 99), 40);
  assert.deepEqual(percentile([1, 1, 1, 1, 1, 1, 1, 1, 1, 40], 50), 1);
  assert.throws(() => percentile([], 50), RangeError);
  assert.throws(() => percentile([1], 101), RangeError);
  assert.throws(() => percentile([1], NaN), RangeError);
});

Deno.test("ratio is NaN without a usable base", () => {
  assert.deepEqual(ratio(11, 10), 1.1);
  assert.deepEqual(ratio(1, 0), NaN);
  assert.deepEqual(ratio(1, NaN), NaN);
  assert.deepEqual(ratio(NaN, 1), NaN);
});

Deno.test("numbers are formatted to a precision that fits their size", () => {
  assert.deepEqual(formatMs(0.4123), "0.412 ms");
  assert.deepEqual(formatMs(12.44), "12.4 ms");
  assert.deepEqual(formatMs(1234.4), "1234 ms");
  assert.deepEqual(formatMs(NaN), "-");
  assert.deepEqual(formatRatio(1.046), "1.05x");
  assert.deepEqual(formatRatio(NaN), "-");
});

Deno.test("verdict compares the ratio with the target, and is empty without one", () => {
  const row = { section: "1", what: "x", plugin: "1 ms" };
  assert.deepEqual(verdict({ ...row, ratio: 1.1, target: 1.1 }), "yes");
  assert.deepEqual(verdict({ ...row, ratio: 1.11, target: 1.1 }), "NO");
  assert.deepEqual(verdict({ ...row, ratio: 1.5 }), "");
  assert.deepEqual(verdict({ ...row, ratio: NaN, target: 1.1 }), "");
});

Deno.test("the table has a header, a rule and one aligned line per row", () => {
  const text = formatTable([
    {
      section: "1",
      what: "lifecycle",
      plugin: "50.0 ms",
      base: "48.0 ms",
      ratio: 50 / 48,
      target: 1.1,
    },
    { section: "4", what: "start-up", plugin: "460 ms", note: "5 starts" },
  ]);
  const lines = text.split("\n");
  assert.deepEqual(lines.length, 4);
  assert.deepEqual(new Set(lines.map((l) => l.length)).size, 1);
  assert.deepEqual(lines[0]!.split("|").map((c) => c.trim()).filter((c) => c !== ""), [
    "#",
    "measurement",
    "plugin",
    "compared with",
    "ratio",
    "target",
    "met",
    "note",
  ]);
  assert.deepEqual(/^\|-+\|/.test(lines[1]!), true);
  assert.deepEqual(lines[2]!.split("|").map((c) => c.trim()), [
    "",
    "1",
    "lifecycle",
    "50.0 ms",
    "48.0 ms",
    "1.04x",
    "<= 1.10",
    "yes",
    "",
    "",
  ]);
  assert.deepEqual(lines[3]!.split("|").map((c) => c.trim())[8], "5 starts");
});
