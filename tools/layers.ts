/**
 * The folders of `src/` and which may import which: prints the folder-to-folder import table
 * (tests aside), the longest files, and every import that looks up a layer or across front ends;
 * exits 1 when there is one. `deno task check` runs it (so CI does), so the layers in
 * ../shared/guide/conventions.md ("Layers") and docs/layout.md stay true.
 *
 *   ./tools/deno run --allow-read tools/layers.ts [--root DIR] [--longest N] [--report-only]
 *
 * Layers, lowest first: ground (zfs, mount, store, grpc, the files directly in src/), the volume
 * domain (volume), engines (replicate, follow), front ends (csi, dhv, cli, metrics), and the
 * wiring that builds them all (main.ts, src/plugin.ts, src/store_parts.ts). A folder may import
 * its own layer and those below; no front end imports another.
 */

import { parseArgs } from "node:util";

/** A layer's rank: higher layers may import lower ones. */
export const LAYER_RANK = { ground: 0, domain: 1, engine: 2, front: 3, wiring: 4 } as const;
export type Layer = keyof typeof LAYER_RANK;

/** Each folder of src/ (by its name) and its layer; a folder not listed is an error. */
export const FOLDER_LAYERS: Readonly<Record<string, Layer>> = {
  zfs: "ground",
  mount: "ground",
  store: "ground",
  grpc: "ground",
  volume: "domain",
  block: "domain",
  replicate: "engine",
  follow: "engine",
  csi: "front",
  dhv: "front",
  cli: "front",
  metrics: "front",
};

/** Files that build every part and so may import any (paths relative to the root). */
export const WIRING_FILES: readonly string[] = ["main.ts", "src/plugin.ts", "src/store_parts.ts"];

/** The unit an import table counts: a folder of src/, `src` for its loose files, or wiring. */
export function unitOf(path: string): string | undefined {
  if (WIRING_FILES.includes(path)) return "wiring";
  // src/<folder>/…/x.ts names its folder; src/x.ts is one of the loose files.
  const m = /^src\/(?:([^/]+)\/.+|[^/]+)\.ts$/.exec(path);
  if (!m) return undefined;
  return m[1] ?? "src";
}

/** The layer of a unit from {@linkcode unitOf}; undefined for a folder nobody placed. */
export function layerOf(unit: string): Layer | undefined {
  if (unit === "wiring") return "wiring";
  if (unit === "src") return "ground";
  return FOLDER_LAYERS[unit];
}

/** Why `from` may not import `to`, or undefined when it may. */
export function violation(from: string, to: string): string | undefined {
  if (from === to) return undefined;
  const a = layerOf(from);
  const b = layerOf(to);
  if (!a) return `src/${from}/ has no layer (tools/layers.ts FOLDER_LAYERS)`;
  if (!b) return `src/${to}/ has no layer (tools/layers.ts FOLDER_LAYERS)`;
  if (LAYER_RANK[b] > LAYER_RANK[a]) return `${a} ${from} imports ${b} ${to}, a layer above`;
  if (a === "front" && b === "front") return `front end ${from} imports front end ${to}`;
  return undefined;
}

const IMPORT =
  /(?:^|\n)\s*(?:import|export)\b[^;"']*?\bfrom\s*["']([^"']+)["']|\bimport\s*\(\s*["']([^"']+)["']\s*\)|(?:^|\n)\s*import\s*["']([^"']+)["']/g;

/** The relative module specifiers a source text imports (static, re-exports, dynamic). */
export function importSpecifiers(source: string): string[] {
  const found: string[] = [];
  for (const m of source.matchAll(IMPORT)) {
    const spec = m[1] ?? m[2] ?? m[3];
    if (spec !== undefined && spec.startsWith(".")) found.push(spec);
  }
  return found;
}

/** `spec` as imported from the file at `path`, as a path relative to the same root. */
export function resolveSpecifier(path: string, spec: string): string {
  const parts = path.split("/").slice(0, -1);
  for (const seg of spec.split("/")) {
    if (seg === "..") parts.pop();
    else if (seg !== ".") parts.push(seg);
  }
  return parts.join("/");
}

/** One import from a file of one unit into another unit. */
export interface CrossImport {
  readonly file: string;
  readonly target: string;
  readonly from: string;
  readonly to: string;
}

/** Every import between two different units among `files` (path → source text). */
export function crossImports(files: ReadonlyMap<string, string>): CrossImport[] {
  const out: CrossImport[] = [];
  for (const [file, source] of files) {
    const from = unitOf(file);
    if (!from) continue;
    for (const spec of importSpecifiers(source)) {
      const target = resolveSpecifier(file, spec);
      const to = unitOf(target);
      if (to && to !== from) out.push({ file, target, from, to });
    }
  }
  return out;
}

/** The table's rows: `from → to` and how many imports, most first. */
export function importTable(imports: readonly CrossImport[]): [string, number][] {
  const counts = new Map<string, number>();
  for (const i of imports) {
    const key = `${i.from} → ${i.to}`;
    counts.set(key, (counts.get(key) ?? 0) + 1);
  }
  return [...counts].sort((x, y) => y[1] - x[1] || x[0].localeCompare(y[0]));
}

/** The source files the table reads: main.ts and src/, tests and test support aside. */
async function readSources(root: string): Promise<Map<string, string>> {
  const files = new Map<string, string>();
  async function walk(rel: string): Promise<void> {
    for await (const e of Deno.readDir(`${root}/${rel}`)) {
      const path = `${rel}/${e.name}`;
      if (e.isDirectory) await walk(path);
      else if (e.name.endsWith(".ts") && !e.name.endsWith("_test.ts")) {
        files.set(path, await Deno.readTextFile(`${root}/${path}`));
      }
    }
  }
  await walk("src");
  try {
    files.set("main.ts", await Deno.readTextFile(`${root}/main.ts`));
  } catch (err) {
    if (!(err instanceof Deno.errors.NotFound)) throw err;
  }
  return files;
}

const encoder = new TextEncoder();
function say(line: string): void {
  Deno.stdout.writeSync(encoder.encode(`${line}\n`));
}

function lineCount(text: string): number {
  return text.split("\n").length - (text.endsWith("\n") ? 1 : 0);
}

async function main(): Promise<number> {
  const { values } = parseArgs({
    args: Deno.args,
    options: {
      root: { type: "string", default: "." },
      longest: { type: "string", default: "10" },
      "report-only": { type: "boolean", default: false },
    },
  });
  const files = await readSources(values.root);
  const imports = crossImports(files);
  say("imports between folders of src/ (tests aside):");
  for (const [key, n] of importTable(imports)) say(`  ${key.padEnd(26)} ${n}`);
  say(`longest files:`);
  const longest = [...files].map(([p, t]) => [p, lineCount(t)] as const)
    .sort((a, b) => b[1] - a[1]).slice(0, Number(values.longest));
  for (const [p, n] of longest) say(`  ${String(n).padStart(5)} ${p}`);
  const bad = imports.flatMap((i) => {
    const why = violation(i.from, i.to);
    return why ? [`  ${i.file} → ${i.target}: ${why}`] : [];
  });
  if (bad.length === 0) {
    say("layers: ok (no folder imports a layer above it, no front end another)");
    return 0;
  }
  say(`layers: ${bad.length} import(s) against the layers:`);
  for (const line of bad) say(line);
  return values["report-only"] ? 0 : 1;
}

if (import.meta.main) Deno.exit(await main());
