/**
 * The error and the value parsers the command-line modules share (src/config.ts,
 * src/config_store.ts). Pure.
 */

/** A command line or environment the plugin cannot run with; the message is one clear line. */
export class ConfigError extends Error {
  constructor(message: string) {
    super(message);
    this.name = "ConfigError";
  }
}

/**
 * An absolute path without "." or ".." segments, trailing "/" and repeated "/" removed.
 * @throws {ConfigError} naming the flag
 */
export function absolutePath(flag: string, value: string): string {
  if (!value.startsWith("/") || value.split("/").some((p) => p === "." || p === "..")) {
    throw new ConfigError(`${flag} "${value}" must be an absolute path without "." or ".."`);
  }
  const trimmed = value.replace(/\/+$/, "");
  if (trimmed === "") throw new ConfigError(`${flag} must not be "/"`);
  return trimmed.replace(/\/{2,}/g, "/");
}

const DURATION_UNITS: Record<string, number> = { s: 1, m: 60, h: 3600, d: 86400 };

/**
 * Seconds from "0" or a whole number with a unit: 90s, 30m, 24h, 7d (at most 10 years).
 * @throws {ConfigError} naming the flag
 */
export function parseDuration(flag: string, value: string): number {
  if (value === "0") return 0;
  const m = /^(\d{1,6})([smhd])$/.exec(value);
  const seconds = m ? Number(m[1]) * DURATION_UNITS[m[2]!]! : NaN;
  if (!Number.isSafeInteger(seconds) || seconds > 10 * 365 * 86400) {
    throw new ConfigError(`${flag} "${value}" must be 0 or a duration such as 90s, 30m, 24h or 7d`);
  }
  return seconds;
}
