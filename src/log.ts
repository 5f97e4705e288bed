/**
 * A small synchronous JSON-lines logger on stderr. Synchronous so that lines are never lost
 * when the process exits and never interleave. The only module allowed to write to the console.
 */

/** Log levels, lowest first. */
export const LOG_LEVELS = ["debug", "info", "warn", "error"] as const;
/** One of {@linkcode LOG_LEVELS}. */
export type LogLevel = typeof LOG_LEVELS[number];

/** Structured fields added to a log line. */
export type LogFields = Record<string, unknown>;

/** Where log lines go; the default writes to stderr, tests collect them. */
export type LogSink = (line: string) => void;

const encoder = new TextEncoder();

function stderrSink(line: string): void {
  const bytes = encoder.encode(line + "\n");
  let written = 0;
  while (written < bytes.length) written += Deno.stderr.writeSync(bytes.subarray(written));
}

/** Keys whose values are never written, wherever they appear in logged fields. */
const SECRET_KEYS = new Set(["secrets", "secret", "password", "token"]);

/** Replaces secret values, recursively, so a secret never reaches a log line. */
export function redact(value: unknown, depth = 0): unknown {
  if (depth > 8 || value === null || typeof value !== "object") return value;
  if (Array.isArray(value)) return value.map((v) => redact(v, depth + 1));
  if (value instanceof Error) {
    // name and message are not enumerable: copying the own fields alone would log "{}".
    return Object.assign(
      {},
      redact({ ...value }, depth + 1),
      { name: value.name, message: value.message },
      value.cause === undefined ? {} : { cause: redact(value.cause, depth + 1) },
    );
  }
  const out: Record<string, unknown> = {};
  for (const [k, v] of Object.entries(value)) {
    if (SECRET_KEYS.has(k.toLowerCase())) {
      out[k] = v && typeof v === "object" ? `[${Object.keys(v).length} redacted]` : "[redacted]";
    } else {
      out[k] = redact(v, depth + 1);
    }
  }
  return out;
}

/** A leveled logger whose children carry extra fields on every line. */
export class Logger {
  #level: number;
  #fields: LogFields;
  #sink: LogSink;

  constructor(level: LogLevel = "info", fields: LogFields = {}, sink: LogSink = stderrSink) {
    this.#level = LOG_LEVELS.indexOf(level);
    this.#fields = fields;
    this.#sink = sink;
  }

  /** A logger that adds `fields` to every line. */
  child(fields: LogFields): Logger {
    const c = new Logger(LOG_LEVELS[this.#level], { ...this.#fields, ...fields }, this.#sink);
    return c;
  }

  /** Whether lines at `level` are written. */
  enabled(level: LogLevel): boolean {
    return LOG_LEVELS.indexOf(level) >= this.#level;
  }

  debug(msg: string, fields?: LogFields): void {
    this.#write("debug", msg, fields);
  }
  info(msg: string, fields?: LogFields): void {
    this.#write("info", msg, fields);
  }
  warn(msg: string, fields?: LogFields): void {
    this.#write("warn", msg, fields);
  }
  error(msg: string, fields?: LogFields): void {
    this.#write("error", msg, fields);
  }

  #write(level: LogLevel, msg: string, fields?: LogFields): void {
    if (!this.enabled(level)) return;
    const record = redact({
      ts: new Date().toISOString(),
      level,
      msg,
      ...this.#fields,
      ...fields,
    });
    this.#sink(JSON.stringify(record, errorReplacer));
  }
}

function errorReplacer(_key: string, value: unknown): unknown {
  if (value instanceof Error) {
    return { name: value.name, message: value.message, cause: value.cause };
  }
  if (typeof value === "bigint") return value.toString();
  return value;
}
