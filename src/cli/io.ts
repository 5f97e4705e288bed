/**
 * Where a subcommand writes: results on stdout (a table for people, JSON with `--json`),
 * messages and progress on stderr. Tests give their own sinks and say whether it is a terminal.
 */

const encoder = new TextEncoder();

/** A subcommand's output. */
export interface CliIo {
  /** Writes a line of result (stdout). */
  out(line: string): void;
  /** Writes a line of message (stderr). */
  err(line: string): void;
  /** Writes raw text to stderr without a newline (a progress bar redrawn in place). */
  errRaw(text: string): void;
  /** Whether stdout and stderr are a terminal: tables and a progress bar, not plain lines. */
  readonly terminal: boolean;
  /** Milliseconds by a clock that never jumps; replaceable in tests. */
  now(): number;
}

function writeAll(file: { writeSync(p: Uint8Array): number }, text: string): void {
  const bytes = encoder.encode(text);
  let written = 0;
  while (written < bytes.length) written += file.writeSync(bytes.subarray(written));
}

/** The process's own stdout and stderr. */
export function processIo(): CliIo {
  return {
    out: (line) => writeAll(Deno.stdout, line + "\n"),
    err: (line) => writeAll(Deno.stderr, line + "\n"),
    errRaw: (text) => writeAll(Deno.stderr, text),
    terminal: Deno.stdout.isTerminal() && Deno.stderr.isTerminal(),
    now: () => performance.now(),
  };
}

/** Writes `value` as one JSON document (for `--json`). */
export function printJson(io: CliIo, value: unknown): void {
  io.out(JSON.stringify(value, null, 2));
}

/**
 * Lays rows out in columns under a header, each column as wide as its widest cell; the last
 * column is not padded.
 */
export function formatTable(header: readonly string[], rows: readonly (readonly string[])[]) {
  const widths = header.map((h, i) => Math.max(h.length, ...rows.map((r) => (r[i] ?? "").length)));
  const line = (cells: readonly string[]) =>
    cells.map((c, i) => (i === cells.length - 1 ? c : c.padEnd(widths[i]!))).join("  ").trimEnd();
  return [line(header), ...rows.map(line)];
}

const UNITS = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"];

/** Bytes as people read them: 0 B, 1.5 KiB, 64 MiB, 2.25 GiB. */
export function humanBytes(bytes: number): string {
  let value = bytes;
  let unit = 0;
  while (value >= 1024 && unit < UNITS.length - 1) {
    value /= 1024;
    unit++;
  }
  const digits = unit === 0 || value >= 100 ? 0 : value >= 10 ? 1 : 2;
  // Number() drops trailing zeros: 64.00 reads 64.
  return `${Number(value.toFixed(digits))} ${UNITS[unit]}`;
}

/** Seconds as people read them: 45 s, 3 min 20 s, 2 h 5 min, 3 d 4 h. */
export function humanSeconds(seconds: number): string {
  const s = Math.max(0, Math.round(seconds));
  if (s < 60) return `${s} s`;
  if (s < 3600) return `${Math.floor(s / 60)} min ${s % 60} s`;
  if (s < 2 * 86400) return `${Math.floor(s / 3600)} h ${Math.floor((s % 3600) / 60)} min`;
  return `${Math.floor(s / 86400)} d ${Math.floor((s % 86400) / 3600)} h`;
}

/** A unix time in UTC, to the second, or "-" for none. */
export function isoSeconds(unixSeconds: number | undefined): string {
  if (unixSeconds === undefined) return "-";
  return new Date(unixSeconds * 1000).toISOString().replace(/\.\d{3}Z$/, "Z");
}

/** How often plain progress lines are written at most, and a bar redrawn. */
const LINE_EVERY_MS = 2000;
const BAR_EVERY_MS = 200;
const BAR_WIDTH = 30;

/**
 * Progress of a long transfer of a known size: on a terminal a bar redrawn in place with the
 * rate and an estimate of the time left; otherwise a plain line every 2 s at most.
 */
export class Progress {
  readonly #io: CliIo;
  readonly #label: string;
  readonly #total: number;
  readonly #started: number;
  #done = 0;
  #shownAt = -Infinity;
  #drawn = false;

  constructor(io: CliIo, label: string, totalBytes: number) {
    this.#io = io;
    this.#label = label;
    this.#total = totalBytes;
    this.#started = io.now();
  }

  /** Bytes done so far. */
  get done(): number {
    return this.#done;
  }

  /** Counts `bytes` more done, and shows it when it is time to. */
  add(bytes: number): void {
    this.#done += bytes;
    const now = this.#io.now();
    if (now - this.#shownAt < (this.#io.terminal ? BAR_EVERY_MS : LINE_EVERY_MS)) return;
    this.#shownAt = now;
    this.#show(now);
  }

  /** Shows the final state and ends the bar's line. */
  finish(): void {
    this.#show(this.#io.now());
    if (this.#io.terminal && this.#drawn) this.#io.errRaw("\n");
  }

  /** The status text: done of total, percent, rate and time left. */
  status(now: number): string {
    const seconds = Math.max((now - this.#started) / 1000, 0.001);
    const rate = this.#done / seconds;
    const percent = this.#total > 0
      ? Math.min(100, Math.floor((this.#done / this.#total) * 100))
      : 100;
    const left = rate > 0 && this.#done < this.#total
      ? `, about ${humanSeconds((this.#total - this.#done) / rate)} left`
      : "";
    return `${humanBytes(this.#done)} of ${humanBytes(this.#total)} (${percent}%), ` +
      `${humanBytes(rate)}/s${left}`;
  }

  #show(now: number): void {
    const text = this.status(now);
    if (!this.#io.terminal) {
      this.#io.err(`${this.#label}: ${text}`);
      return;
    }
    const filled = this.#total > 0
      ? Math.min(BAR_WIDTH, Math.floor((this.#done / this.#total) * BAR_WIDTH))
      : BAR_WIDTH;
    const bar = "#".repeat(filled) + "-".repeat(BAR_WIDTH - filled);
    // \r and "erase to end of line": the bar is redrawn where it was.
    this.#io.errRaw(`\r\x1b[K${this.#label} [${bar}] ${text}`);
    this.#drawn = true;
  }
}
