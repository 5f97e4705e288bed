/**
 * Reads what `deno compile` wrote, for the compile proof (tools/compile_proof.ts). Deno 2.8.3 on
 * Linux copies the runtime it is given (denort, or DENORT_BIN) unchanged and appends the
 * standalone payload: the magic "d3n0l4nd", a little-endian u64 length, that many bytes of JSON
 * metadata (permissions, v8_flags, entrypoint_key, ...), then the module sources, the npm
 * packages and the virtual file system. This layout is Deno's, not a promise: a newer Deno may
 * change it, and the proof then fails saying which part it could not find.
 */

import { Buffer } from "node:buffer";
import { isDeepStrictEqual } from "node:util";

/** What starts the payload, right after the runtime's bytes. */
export const PAYLOAD_MAGIC = "d3n0l4nd";

/** The payload of a compiled executable. */
export interface Payload {
  /** The JSON metadata: how the runtime is to run the embedded program. */
  readonly metadata: Readonly<Record<string, unknown>>;
  /** Everything after the metadata: sources, npm packages, file system, trailer. */
  readonly rest: Uint8Array;
}

/**
 * The payload `output` carries after `runtime`.
 * @throws {Error} saying which part is not as Deno 2.8.3 writes it
 */
export function readPayload(output: Uint8Array, runtime: Uint8Array): Payload {
  if (output.length <= runtime.length) {
    throw new Error(
      `the output (${output.length} bytes) is no longer than the runtime (${runtime.length})`,
    );
  }
  if (Buffer.compare(output.subarray(0, runtime.length), runtime) !== 0) {
    throw new Error("the output does not start with the runtime's bytes");
  }
  const at = runtime.length;
  const magic = new TextDecoder().decode(output.subarray(at, at + PAYLOAD_MAGIC.length));
  if (magic !== PAYLOAD_MAGIC) {
    throw new Error(
      `no "${PAYLOAD_MAGIC}" after the runtime's bytes (found ${JSON.stringify(magic)})`,
    );
  }
  const start = at + PAYLOAD_MAGIC.length + 8;
  if (start > output.length) throw new Error("the payload ends before its metadata's length");
  const view = new DataView(output.buffer, output.byteOffset, output.byteLength);
  const length = Number(view.getBigUint64(at + PAYLOAD_MAGIC.length, true));
  if (start + length > output.length) {
    throw new Error(`the metadata's length (${length}) runs past the end of the output`);
  }
  let metadata: unknown;
  try {
    metadata = JSON.parse(new TextDecoder().decode(output.subarray(start, start + length)));
  } catch (err) {
    throw new Error(`the metadata is not JSON: ${err instanceof Error ? err.message : err}`);
  }
  if (typeof metadata !== "object" || metadata === null || Array.isArray(metadata)) {
    throw new Error("the metadata is not a JSON object");
  }
  return { metadata: { ...metadata }, rest: output.subarray(start + length) };
}

/** A JSON object's field as an object (empty when it is not one). */
function objectField(obj: Readonly<Record<string, unknown>>, key: string): Record<string, unknown> {
  const value = obj[key];
  return typeof value === "object" && value !== null && !Array.isArray(value) ? { ...value } : {};
}

/**
 * Where the metadata's permissions differ from what `flags` (deno's permission flags) ask:
 * each `--allow-X=a,b` must be `allow_X: ["a", "b"]`, `--no-prompt` `prompt: false`, and no
 * other `allow_*` may grant anything. `allow_import` is left out: `deno compile` fills it with
 * Deno's default hosts itself (the README's known gap: the plugin imports nothing at run time).
 */
export function permissionMismatches(
  metadata: Readonly<Record<string, unknown>>,
  flags: readonly string[],
): string[] {
  const got = objectField(metadata, "permissions");
  const want: Record<string, unknown> = {};
  for (const flag of flags) {
    const m = /^--allow-([a-z]+)=(.*)$/.exec(flag);
    if (m) want[`allow_${m[1]}`] = m[2]!.split(",");
    else if (flag === "--no-prompt") want.prompt = false;
    else throw new TypeError(`Not a scoped permission flag: ${flag}`);
  }
  const out: string[] = [];
  for (const [key, value] of Object.entries(want)) {
    if (!isDeepStrictEqual(got[key], value)) {
      out.push(`${key} is ${JSON.stringify(got[key])}, not ${JSON.stringify(value)}`);
    }
  }
  for (const [key, value] of Object.entries(got)) {
    const grants = value !== null && value !== false &&
      !(Array.isArray(value) && value.length === 0);
    if (key.startsWith("allow_") && key !== "allow_import" && !(key in want) && grants) {
      out.push(`${key} grants ${JSON.stringify(value)}, which no flag asked for`);
    }
  }
  return out;
}

/** The V8 flags of `--v8-flags=a,b` that the metadata's `v8_flags` lacks. */
export function missingV8Flags(
  metadata: Readonly<Record<string, unknown>>,
  v8FlagsArg: string,
): string[] {
  const m = /^--v8-flags=(.+)$/.exec(v8FlagsArg);
  if (!m) throw new TypeError(`Not --v8-flags=...: ${v8FlagsArg}`);
  const baked = Array.isArray(metadata.v8_flags) ? metadata.v8_flags : [];
  return m[1]!.split(",").filter((f) => !baked.includes(f));
}

/** The names in `items` whose bytes do not occur in `rest`. */
export function missingBytes(
  rest: Uint8Array,
  items: ReadonlyMap<string, Uint8Array>,
): string[] {
  const haystack = Buffer.from(rest.buffer, rest.byteOffset, rest.byteLength);
  return [...items].filter(([, bytes]) => haystack.indexOf(bytes) < 0).map(([name]) => name);
}

/** One module of `deno info --json`, as far as the proof reads it. */
export interface InfoModule {
  readonly specifier: string;
  readonly dependencies?: readonly {
    readonly code?: { readonly specifier?: string };
  }[];
}

/**
 * The local files (file: specifiers) `roots` reach through code imports, static or dynamic,
 * of `deno info --json` output. Modules reached only by `import type` are left out: they are
 * not part of the program, and `deno compile` does not embed them.
 */
export function codeFiles(roots: readonly string[], modules: readonly InfoModule[]): string[] {
  const bySpecifier = new Map(modules.map((m) => [m.specifier, m]));
  const seen = new Set<string>();
  const todo = [...roots];
  while (todo.length > 0) {
    const specifier = todo.pop()!;
    const module = bySpecifier.get(specifier);
    if (seen.has(specifier) || module === undefined) continue;
    seen.add(specifier);
    for (const dep of module.dependencies ?? []) {
      if (dep.code?.specifier !== undefined) todo.push(dep.code.specifier);
    }
  }
  return [...seen].filter((s) => s.startsWith("file://")).sort();
}
