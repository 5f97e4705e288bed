/**
 * Pure helpers of the benchmarks: summary statistics and the one result table. No I/O here, so
 * they are unit-tested without a pool.
 */

/** The value below which `p` percent of the samples lie (nearest rank; p in 0..100). */
export function percentile(samples: readonly number[], p: number): number {
  if (samples.length === 0) throw new RangeError("percentile of no samples");
  if (!(p >= 0 && p <= 100)) throw new RangeError(`percentile ${p} is outside 0..100`);
  const sorted = [...samples].sort((a, b) => a - b);
  const rank = Math.ceil((p / 100) * sorted.length);
  return sorted[Math.min(sorted.length - 1, Math.max(0, rank - 1))]!;
}

/** The middle sample; the mean of the two middle ones for an even count. */
export function median(samples: readonly number[]): number {
  if (samples.length === 0) throw new RangeError("median of no samples");
  const sorted = [...samples].sort((a, b) => a - b);
  const mid = sorted.length >> 1;
  return sorted.length % 2 === 1 ? sorted[mid]! : (sorted[mid - 1]! + sorted[mid]!) / 2;
}

/** `value / base`, or NaN when there is no base to compare with. */
export function ratio(value: number, base: number): number {
  return base > 0 && Number.isFinite(base) && Number.isFinite(value) ? value / base : NaN;
}

/** Milliseconds with a precision that suits their size: 0.412 ms, 12.4 ms, 1234 ms. */
export function formatMs(ms: number): string {
  if (!Number.isFinite(ms)) return "-";
  if (ms < 10) return `${ms.toFixed(3)} ms`;
  if (ms < 1000) return `${ms.toFixed(1)} ms`;
  return `${ms.toFixed(0)} ms`;
}

/** A ratio as "1.04x", or "-" when there is none. */
export function formatRatio(r: number): string {
  return Number.isFinite(r) ? `${r.toFixed(2)}x` : "-";
}

/** One row of the result table. */
export interface Row {
  /** Which section (1..7) the row belongs to. */
  readonly section: string;
  readonly what: string;
  /** The plugin's figure, already formatted. */
  readonly plugin: string;
  /** The figure it is compared with, formatted, or "" when none. */
  readonly base?: string;
  /** plugin / base, when a ratio makes sense. */
  readonly ratio?: number;
  /** Upper bound on the ratio, when the issue sets one. */
  readonly target?: number;
  readonly note?: string;
}

/** "yes", "NO" or "" for a row with a target. */
export function verdict(row: Row): string {
  if (row.target === undefined || row.ratio === undefined || !Number.isFinite(row.ratio)) return "";
  return row.ratio <= row.target ? "yes" : "NO";
}

const HEADER = ["#", "measurement", "plugin", "compared with", "ratio", "target", "met", "note"];

/** The rows as one Markdown table (readable as plain text too). */
export function formatTable(rows: readonly Row[]): string {
  const cells = rows.map((r) => [
    r.section,
    r.what,
    r.plugin,
    r.base ?? "",
    r.ratio === undefined ? "" : formatRatio(r.ratio),
    r.target === undefined ? "" : `<= ${r.target.toFixed(2)}`,
    verdict(r),
    r.note ?? "",
  ]);
  const widths = HEADER.map((h, i) => Math.max(h.length, ...cells.map((c) => c[i]!.length)));
  const line = (c: readonly string[]) => `| ${c.map((v, i) => v.padEnd(widths[i]!)).join(" | ")} |`;
  return [
    line(HEADER),
    `|${widths.map((w) => "-".repeat(w + 2)).join("|")}|`,
    ...cells.map(line),
  ].join("\n");
}
