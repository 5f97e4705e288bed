import assert from "node:assert/strict";
import { CounterVec, gauge, HistogramVec, render } from "./exposition.ts";

Deno.test("render writes HELP and TYPE, then one line per sample with escaped label values", () => {
  const text = render([
    gauge("x_bytes", "Bytes of x.\nSecond line \\ backslash.", [
      { labels: { volume: 'a"b\\c\nd' }, value: 5 },
      { labels: {}, value: 0.25 },
    ]),
  ]);
  assert.equal(
    text,
    "# HELP x_bytes Bytes of x.\\nSecond line \\\\ backslash.\n" +
      "# TYPE x_bytes gauge\n" +
      'x_bytes{volume="a\\"b\\\\c\\nd"} 5\n' +
      "x_bytes 0.25\n",
  );
});

Deno.test("render writes special values as the format spells them", () => {
  const text = render([
    gauge("v", "h", [
      { labels: { k: "nan" }, value: NaN },
      { labels: { k: "inf" }, value: Infinity },
      { labels: { k: "neg" }, value: -Infinity },
    ]),
  ]);
  assert.match(text, /^v\{k="nan"\} NaN$/m);
  assert.match(text, /^v\{k="inf"\} \+Inf$/m);
  assert.match(text, /^v\{k="neg"\} -Inf$/m);
});

Deno.test("render refuses a family name given twice", () => {
  assert.throws(() => render([gauge("a", "h", []), gauge("a", "h", [])]), /rendered twice/);
});

Deno.test("CounterVec counts per label values and refuses to go down", () => {
  const c = new CounterVec("calls_total", "Calls.", ["method", "code"]);
  c.inc(["Probe", "OK"]);
  c.inc(["Probe", "OK"]);
  c.inc(["CreateVolume", "NOT_FOUND"], 3);
  assert.equal(c.value(["Probe", "OK"]), 2);
  assert.equal(c.value(["Probe", "INTERNAL"]), 0);
  assert.equal(
    render([c.family()]),
    "# HELP calls_total Calls.\n# TYPE calls_total counter\n" +
      'calls_total{method="Probe",code="OK"} 2\n' +
      'calls_total{method="CreateVolume",code="NOT_FOUND"} 3\n',
  );
  assert.throws(() => c.inc(["Probe", "OK"], -1), RangeError);
  assert.throws(() => c.inc(["Probe"]), /Expected 2 label values, got 1/);
});

Deno.test("CounterVec and gauges refuse names outside the format's syntax", () => {
  assert.throws(() => new CounterVec("calls", "h", []), /must end in _total/);
  assert.throws(() => new CounterVec("1calls_total", "h", []), /Invalid metric name/);
  assert.throws(() => new CounterVec("calls_total", "h", ["le"]), /Invalid label name "le"/);
  assert.throws(() => new CounterVec("calls_total", "h", ["__x"]), /Invalid label name/);
  assert.throws(() => gauge("g", "h", [{ labels: { "a-b": "x" }, value: 1 }]), /Invalid label/);
});

Deno.test("HistogramVec writes cumulative buckets, +Inf, _sum and _count", () => {
  const h = new HistogramVec("d_seconds", "Durations.", ["op"], [0.1, 1, 10]);
  for (const v of [0.05, 0.1, 0.5, 5, 50]) h.observe(["get"], v);
  h.observe(["set"], 2);
  assert.equal(
    render([h.family()]),
    [
      "# HELP d_seconds Durations.",
      "# TYPE d_seconds histogram",
      'd_seconds_bucket{op="get",le="0.1"} 2',
      'd_seconds_bucket{op="get",le="1"} 3',
      'd_seconds_bucket{op="get",le="10"} 4',
      'd_seconds_bucket{op="get",le="+Inf"} 5',
      'd_seconds_sum{op="get"} 55.65',
      'd_seconds_count{op="get"} 5',
      'd_seconds_bucket{op="set",le="0.1"} 0',
      'd_seconds_bucket{op="set",le="1"} 0',
      'd_seconds_bucket{op="set",le="10"} 1',
      'd_seconds_bucket{op="set",le="+Inf"} 1',
      'd_seconds_sum{op="set"} 2',
      'd_seconds_count{op="set"} 1',
      "",
    ].join("\n"),
  );
  assert.throws(() => new HistogramVec("h", "h", [], [1, 1]), /strictly ascending/);
  assert.throws(() => new HistogramVec("h", "h", [], []), /strictly ascending/);
});
