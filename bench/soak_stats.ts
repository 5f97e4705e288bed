/**
 * Pure helpers of the memory soak (bench/soak.ts): its samples, the growth over the last half,
 * the verdict against the target, and the table. No I/O, so they are unit-tested.
 */

/** The target: RSS after the soak at most this, in MiB... */
export const TARGET_RSS_MIB = 120;
/**
 * ...and no growth over the last half. "None" allows this much (MiB), the size of the steps a
 * flat RSS still takes as the allocator maps and unmaps a region.
 */
export const FLAT_TOLERANCE_MIB = 2;

/** One sample of the plugin's memory during the soak. */
export interface SoakSample {
  /** Full lifecycles done when the sample was taken. */
  readonly lifecycles: number;
  /** Seconds since the soak began. */
  readonly seconds: number;
  /** RSS read from /proc/<pid>/status, MiB. */
  readonly rssMiB: number;
  /** Live heap after a forced full GC, MiB; absent when the soak runs without the probe. */
  readonly heapMiB?: number;
}

/** What bench/heap_probe.ts writes on SIGUSR1. */
export interface HeapReport {
  /** Counts the reports, so a reader can tell a fresh one from the last. */
  readonly seq: number;
  /** Bytes of live heap after a full GC. */
  readonly heapUsed: number;
  readonly heapTotal: number;
  readonly external: number;
  /** RSS right after the GC, bytes. */
  readonly rss: number;
}

/** Where bench/heap_probe.ts writes, for a plugin serving on `endpoint` (unix://...). */
export function heapReportPath(endpoint: string): string {
  const socket = endpoint.replace(/^unix:\/\//, "");
  const slash = socket.lastIndexOf("/");
  return `${slash > 0 ? socket.slice(0, slash) : "."}/heap.json`;
}

/** First, last and highest of a series. */
export interface Extent {
  readonly first: number;
  readonly last: number;
  readonly peak: number;
}

/** First, last and peak of `values`. */
export function extent(values: readonly number[]): Extent {
  if (values.length === 0) throw new RangeError("extent of no values");
  return { first: values[0]!, last: values.at(-1)!, peak: Math.max(...values) };
}

/**
 * How much `value` grew over the second half of the soak (by lifecycles), in MiB: the slope of a
 * least-squares line through the samples of that half, times the lifecycles it spans. A line,
 * not last minus middle, so one sample taken just before a GC does not decide the verdict. NaN
 * with fewer than 3 samples in the half.
 */
export function lastHalfGrowth(
  samples: readonly SoakSample[],
  value: (s: SoakSample) => number | undefined,
): number {
  if (samples.length === 0) return NaN;
  const end = samples.at(-1)!.lifecycles;
  const half = samples.filter((s) => s.lifecycles >= end / 2 && value(s) !== undefined);
  if (half.length < 3) return NaN;
  const xs = half.map((s) => s.lifecycles);
  const ys = half.map((s) => value(s)!);
  const mx = xs.reduce((a, b) => a + b, 0) / xs.length;
  const my = ys.reduce((a, b) => a + b, 0) / ys.length;
  let num = 0;
  let den = 0;
  for (let i = 0; i < xs.length; i++) {
    num += (xs[i]! - mx) * (ys[i]! - my);
    den += (xs[i]! - mx) ** 2;
  }
  if (den === 0) return NaN;
  return (num / den) * (xs.at(-1)! - xs[0]!);
}

/** The soak's verdict: met or not, and each reason it is not. */
export interface SoakVerdict {
  readonly met: boolean;
  readonly reasons: readonly string[];
}

/** Judges RSS after the soak and its growth over the last half against the target. */
export function soakVerdict(rssAfterMiB: number, growthMiB: number): SoakVerdict {
  const reasons: string[] = [];
  if (!(rssAfterMiB <= TARGET_RSS_MIB)) {
    reasons.push(`RSS after the soak ${rssAfterMiB.toFixed(1)} MiB > ${TARGET_RSS_MIB} MiB`);
  }
  if (!Number.isFinite(growthMiB)) {
    reasons.push("too few samples in the last half to tell growth");
  } else if (growthMiB > FLAT_TOLERANCE_MIB) {
    reasons.push(
      `RSS grew ${growthMiB.toFixed(1)} MiB over the last half (> ${FLAT_TOLERANCE_MIB} MiB)`,
    );
  }
  return { met: reasons.length === 0, reasons };
}

const mib = (v: number | undefined) => v === undefined ? "-" : v.toFixed(1);

/** The samples as a Markdown table (readable as plain text too). */
export function formatSamples(samples: readonly SoakSample[]): string {
  const header = ["lifecycles", "minutes", "RSS MiB", "live heap MiB"];
  const cells = samples.map((s) => [
    s.lifecycles.toLocaleString("en"),
    (s.seconds / 60).toFixed(1),
    mib(s.rssMiB),
    mib(s.heapMiB),
  ]);
  const widths = header.map((h, i) => Math.max(h.length, ...cells.map((c) => c[i]!.length)));
  const line = (c: readonly string[]) =>
    `| ${c.map((v, i) => v.padStart(widths[i]!)).join(" | ")} |`;
  return [
    line(header),
    `|${widths.map((w) => "-".repeat(w + 1) + ":").join("|")}|`,
    ...cells.map(line),
  ].join("\n");
}
