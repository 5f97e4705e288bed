/**
 * Pagination for ListVolumes and ListSnapshots. A token names the last entry a page returned
 * (keyset paging), so it stays valid when that entry is deleted or new ones are created, and
 * no process state is needed to honour it, even after a restart.
 */

import { Code, CsiError } from "../errors.ts";

/** One page of entries. */
export interface Page<T> {
  readonly entries: readonly T[];
  /** Empty on the last page. */
  readonly nextToken: string;
}

const PREFIX = "after:";

/** The token that resumes a listing after the entry with `key`. */
export function tokenAfter(key: string): string {
  const bytes = new TextEncoder().encode(key);
  let bin = "";
  for (const b of bytes) bin += String.fromCharCode(b);
  return PREFIX + btoa(bin).replaceAll("+", "-").replaceAll("/", "_").replace(/=+$/, "");
}

/**
 * The key a token resumes after.
 * @throws {CsiError} ABORTED for a token this plugin did not make, as CSI asks
 */
export function keyOfToken(token: string): string {
  const bad = () =>
    new CsiError(Code.ABORTED, `starting_token "${token}" is not valid; list from the start`);
  if (!token.startsWith(PREFIX)) throw bad();
  const body = token.slice(PREFIX.length);
  if (!/^[A-Za-z0-9_-]+$/.test(body)) throw bad();
  try {
    const bin = atob(body.replaceAll("-", "+").replaceAll("_", "/"));
    const key = new TextDecoder("utf-8", { fatal: true }).decode(
      Uint8Array.from(bin, (c) => c.charCodeAt(0)),
    );
    if (key === "" || tokenAfter(key) !== token) throw bad();
    return key;
  } catch (err) {
    if (err instanceof CsiError) throw err;
    throw bad();
  }
}

/**
 * One page of `items`, ordered by `keyOf` (unique keys), starting after the token's key.
 * @throws {CsiError} INVALID_ARGUMENT for a negative max_entries, ABORTED for a bad token
 */
export function paginate<T>(
  items: readonly T[],
  keyOf: (item: T) => string,
  opts: { readonly maxEntries?: number; readonly startingToken?: string },
): Page<T> {
  const max = opts.maxEntries ?? 0;
  if (!Number.isInteger(max) || max < 0) {
    throw new CsiError(Code.INVALID_ARGUMENT, "max_entries must not be negative");
  }
  const after = opts.startingToken ? keyOfToken(opts.startingToken) : undefined;
  const sorted = [...items].sort((a, b) => compare(keyOf(a), keyOf(b)));
  const rest = after === undefined
    ? sorted
    : sorted.filter((item) => compare(keyOf(item), after) > 0);
  if (max === 0 || rest.length <= max) return { entries: rest, nextToken: "" };
  const entries = rest.slice(0, max);
  return { entries, nextToken: tokenAfter(keyOf(entries.at(-1)!)) };
}

function compare(a: string, b: string): number {
  return a < b ? -1 : a > b ? 1 : 0;
}
