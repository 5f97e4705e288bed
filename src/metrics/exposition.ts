/**
 * Metric families and their rendering in the Prometheus text exposition format (version
 * 0.0.4): a HELP and a TYPE line per family, then one line per sample. Counters and histograms
 * keep their state here; gauges are built fresh at each collection.
 */

/** Label values, by label name. */
export type Labels = Readonly<Record<string, string>>;

/** One sample of a counter or gauge. */
export interface Sample {
  readonly labels: Labels;
  readonly value: number;
}

/** One labelled series of a histogram. */
export interface HistogramSeries {
  readonly labels: Labels;
  /** Observations at or below each bound of the family's buckets (not cumulative). */
  readonly counts: readonly number[];
  readonly sum: number;
  readonly count: number;
}

/** A counter or gauge family. */
export interface ScalarFamily {
  readonly name: string;
  readonly help: string;
  readonly type: "counter" | "gauge";
  readonly samples: readonly Sample[];
}

/** A histogram family. */
export interface HistogramFamily {
  readonly name: string;
  readonly help: string;
  readonly type: "histogram";
  /** Upper bounds, ascending, without +Inf. */
  readonly buckets: readonly number[];
  readonly series: readonly HistogramSeries[];
}

/** What an exposition is made of. */
export type MetricFamily = ScalarFamily | HistogramFamily;

/** The content type of {@linkcode render}'s output. */
export const CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8";

const METRIC_NAME = /^[a-zA-Z_:][a-zA-Z0-9_:]*$/;
const LABEL_NAME = /^[a-zA-Z_][a-zA-Z0-9_]*$/;

/**
 * Checks a metric name and its label names against the format's syntax.
 * @throws {TypeError} naming the bad name
 */
export function checkNames(name: string, labelNames: readonly string[]): void {
  if (!METRIC_NAME.test(name)) throw new TypeError(`Invalid metric name "${name}"`);
  for (const l of labelNames) {
    if (!LABEL_NAME.test(l) || l.startsWith("__") || l === "le") {
      throw new TypeError(`Invalid label name "${l}" of metric "${name}"`);
    }
  }
}

/** A gauge family from samples. */
export function gauge(name: string, help: string, samples: readonly Sample[]): ScalarFamily {
  checkNames(name, samples.flatMap((s) => Object.keys(s.labels)));
  return { name, help, type: "gauge", samples };
}

/** A sample value as the format writes it. */
export function formatValue(value: number): string {
  if (Number.isNaN(value)) return "NaN";
  if (value === Infinity) return "+Inf";
  if (value === -Infinity) return "-Inf";
  return String(value);
}

function escapeLabelValue(value: string): string {
  return value.replaceAll("\\", "\\\\").replaceAll('"', '\\"').replaceAll("\n", "\\n");
}

function escapeHelp(help: string): string {
  return help.replaceAll("\\", "\\\\").replaceAll("\n", "\\n");
}

function labelText(labels: Labels, extra?: readonly [string, string]): string {
  const pairs = Object.entries(labels);
  if (extra) pairs.push([extra[0], extra[1]]);
  if (pairs.length === 0) return "";
  return `{${pairs.map(([k, v]) => `${k}="${escapeLabelValue(v)}"`).join(",")}}`;
}

function renderFamily(f: MetricFamily, out: string[]): void {
  out.push(`# HELP ${f.name} ${escapeHelp(f.help)}`, `# TYPE ${f.name} ${f.type}`);
  if (f.type !== "histogram") {
    for (const s of f.samples) out.push(`${f.name}${labelText(s.labels)} ${formatValue(s.value)}`);
    return;
  }
  for (const s of f.series) {
    let cumulative = 0;
    f.buckets.forEach((bound, i) => {
      cumulative += s.counts[i] ?? 0;
      const le = labelText(s.labels, ["le", formatValue(bound)]);
      out.push(`${f.name}_bucket${le} ${cumulative}`);
    });
    out.push(`${f.name}_bucket${labelText(s.labels, ["le", "+Inf"])} ${s.count}`);
    out.push(`${f.name}_sum${labelText(s.labels)} ${formatValue(s.sum)}`);
    out.push(`${f.name}_count${labelText(s.labels)} ${s.count}`);
  }
}

/**
 * The text exposition of `families`, in their order.
 * @throws {Error} when a name appears twice (Prometheus rejects such a scrape)
 */
export function render(families: readonly MetricFamily[]): string {
  const seen = new Set<string>();
  const out: string[] = [];
  for (const f of families) {
    if (seen.has(f.name)) throw new Error(`Metric family "${f.name}" is rendered twice`);
    seen.add(f.name);
    renderFamily(f, out);
  }
  return out.length === 0 ? "" : `${out.join("\n")}\n`;
}

/** Series by their label values (joined with a separator no label value can hold). */
function seriesKey(values: readonly string[]): string {
  return values.join("\u0000");
}

function labelsOf(names: readonly string[], values: readonly string[]): Labels {
  if (values.length !== names.length) {
    throw new RangeError(`Expected ${names.length} label values, got ${values.length}`);
  }
  return Object.fromEntries(names.map((n, i) => [n, values[i]!]));
}

/** A counter with labels: only ever goes up, from 0 at start. */
export class CounterVec {
  readonly name: string;
  readonly help: string;
  readonly labelNames: readonly string[];
  readonly #values = new Map<string, { labels: Labels; value: number }>();

  /** @throws {TypeError} for a name without `_total` or invalid names */
  constructor(name: string, help: string, labelNames: readonly string[]) {
    checkNames(name, labelNames);
    if (!name.endsWith("_total")) throw new TypeError(`Counter "${name}" must end in _total`);
    this.name = name;
    this.help = help;
    this.labelNames = labelNames;
  }

  /**
   * Adds `by` (default 1) to the series of `values` (in the order of the label names).
   * @throws {RangeError} for a negative amount or the wrong number of values
   */
  inc(values: readonly string[], by = 1): void {
    if (!(by >= 0)) throw new RangeError(`Counter "${this.name}" cannot go down by ${by}`);
    const key = seriesKey(values);
    const s = this.#values.get(key);
    if (s) s.value += by;
    else this.#values.set(key, { labels: labelsOf(this.labelNames, values), value: by });
  }

  /** Makes the series of `values` exist at 0 (a counter Prometheus sees from its start). */
  declare(values: readonly string[]): void {
    this.inc(values, 0);
  }

  /** The current value of one series (0 if never incremented). */
  value(values: readonly string[]): number {
    return this.#values.get(seriesKey(values))?.value ?? 0;
  }

  /** A snapshot for rendering. */
  family(): ScalarFamily {
    const samples = [...this.#values.values()].map((s) => ({ labels: s.labels, value: s.value }));
    return { name: this.name, help: this.help, type: "counter", samples };
  }
}

/** A histogram with labels and fixed buckets (upper bounds in the metric's unit). */
export class HistogramVec {
  readonly name: string;
  readonly help: string;
  readonly labelNames: readonly string[];
  readonly buckets: readonly number[];
  readonly #series = new Map<
    string,
    { labels: Labels; counts: number[]; sum: number; count: number }
  >();

  /** @throws {TypeError} for invalid names or buckets that are not finite and ascending */
  constructor(
    name: string,
    help: string,
    labelNames: readonly string[],
    buckets: readonly number[],
  ) {
    checkNames(name, labelNames);
    if (
      buckets.length === 0 ||
      buckets.some((b, i) => !isFinite(b) || b <= (buckets[i - 1] ?? -Infinity))
    ) {
      throw new TypeError(`Buckets of "${name}" must be finite and strictly ascending`);
    }
    this.name = name;
    this.help = help;
    this.labelNames = labelNames;
    this.buckets = buckets;
  }

  /** Records one observation in the series of `values`. */
  observe(values: readonly string[], value: number): void {
    const key = seriesKey(values);
    let s = this.#series.get(key);
    if (!s) {
      s = {
        labels: labelsOf(this.labelNames, values),
        counts: this.buckets.map(() => 0),
        sum: 0,
        count: 0,
      };
      this.#series.set(key, s);
    }
    const i = this.buckets.findIndex((b) => value <= b);
    if (i >= 0) s.counts[i]! += 1;
    s.sum += value;
    s.count += 1;
  }

  /** A snapshot for rendering. */
  family(): HistogramFamily {
    const series = [...this.#series.values()].map((s) => ({
      labels: s.labels,
      counts: [...s.counts],
      sum: s.sum,
      count: s.count,
    }));
    return { name: this.name, help: this.help, type: "histogram", buckets: this.buckets, series };
  }
}
