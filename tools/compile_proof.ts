/**
 * The compile proof, run by tools/test.sh: `deno task compile` up to denort, on a machine that
 * cannot download denort (dl.deno.land is not reachable here; npm is).
 *
 * It runs `deno task compile` as a fresh clone would (a DENO_DIR without type-check cache; the
 * npm packages come from the current npm cache, or from npm), with every build variable set
 * and DENORT_BIN naming a stand-in for denort: the pinned deno binary itself. Then it checks
 * that the task exited 0 and wrote an executable that is the stand-in's bytes followed by
 * Deno's payload (tools/compile_payload.ts), whose metadata holds exactly the permission flags
 * and V8 flags of tools/compile_args.ts for those variables and main.ts as entry point, and
 * which holds byte for byte every local file main.ts reaches through code imports (static and
 * dynamic: the server, each subcommand, the store and metrics modules, the CSI descriptor) and
 * names every npm package of the graph.
 *
 * What it does not prove: the stand-in is not denort, so the output runs deno's own command
 * line and not zfs-csi (`./zfs-csi --version` prints deno's version); that denort 2.8.3 can be
 * downloaded or runs the payload; that the baked flags are enforced (the integration tests run
 * main.ts under the same flags with `deno run`); other --target platforms; the Containerfile.
 *
 * Prints "compile-proof: ..." lines; exits 1 when a check fails.
 */

import { fileURLToPath } from "node:url";
import { BUILD_VARIABLES, needsFromVariables, V8_FLAGS } from "../src/permissions.ts";
import { compileArgs, ENTRY_POINT } from "./compile_args.ts";
import {
  codeFiles,
  type InfoModule,
  missingBytes,
  missingV8Flags,
  permissionMismatches,
  readPayload,
} from "./compile_payload.ts";

const ROOT = fileURLToPath(new URL("../", import.meta.url)).replace(/\/$/, "");
const DENO = Deno.execPath();
const decoder = new TextDecoder();

/** Build variables for the proof: every kind, so each is seen to reach the binary. */
const VARIABLES: Record<string, string> = {
  [BUILD_VARIABLES.extraDirs.name]: "/srv/nomad/client/csi:/mnt/zfs-csi-store",
  [BUILD_VARIABLES.storeHosts.name]: "s3.example.com,127.0.0.1:7070",
  [BUILD_VARIABLES.extraReadFiles.name]: "/etc/zfs-csi/s3.ini",
  [BUILD_VARIABLES.metricsListen.name]: "127.0.0.1:9474",
};

function say(line: string): void {
  Deno.stdout.writeSync(new TextEncoder().encode(`compile-proof: ${line}\n`));
}

async function deno(args: string[], env: Record<string, string>) {
  const out = await new Deno.Command(DENO, {
    args,
    cwd: ROOT,
    env: { ...env, NO_COLOR: "1" },
    stdin: "null",
    stdout: "piped",
    stderr: "piped",
  }).output();
  return { ...out, text: decoder.decode(out.stdout) + decoder.decode(out.stderr) };
}

/** The npm cache deno uses now, to share with the fresh DENO_DIR (no download when present). */
async function npmCache(): Promise<string | undefined> {
  const info = await deno(["info", "--json"], {});
  if (!info.success) return undefined;
  const dir: unknown = JSON.parse(decoder.decode(info.stdout)).npmCache;
  return typeof dir === "string" ? dir : undefined;
}

async function prove(tmp: string): Promise<string[]> {
  const denoDir = `${tmp}/deno-dir`;
  await Deno.mkdir(denoDir);
  const npm = await npmCache();
  if (npm !== undefined && (await Deno.stat(npm).catch(() => undefined))?.isDirectory) {
    await Deno.symlink(npm, `${denoDir}/npm`);
  }
  const output = `${tmp}/zfs-csi`;
  const env = { DENO_DIR: denoDir, DENORT_BIN: DENO, ...VARIABLES };
  const started = performance.now();
  const task = await deno(["task", "compile", "--output", output], env);
  const seconds = ((performance.now() - started) / 1000).toFixed(1);
  if (!task.success) {
    // Its error lines (a V8 abort prints "# Fatal ..." before a long stack trace), then its end.
    const lines = task.text.trimEnd().split("\n");
    const errors = lines.filter((l) => /^(error|# Fatal|Fatal)|out of memory/i.test(l));
    return [
      `deno task compile exited ${task.code}${task.signal ? ` (${task.signal})` : ""} after ` +
      `${seconds} s:\n${[...errors.slice(0, 10), "...", ...lines.slice(-5)].join("\n")}`,
    ];
  }
  say(`deno task compile exited 0 in ${seconds} s (type check and compile, fresh DENO_DIR)`);

  const failures: string[] = [];
  const mode = (await Deno.stat(output)).mode ?? 0;
  if ((mode & 0o111) === 0) failures.push(`${output} is not executable (mode ${mode.toString(8)})`);
  const [binary, standIn] = [await Deno.readFile(output), await Deno.readFile(DENO)];
  const payload = readPayload(binary, standIn);

  const expected = compileArgs({ ...needsFromVariables(VARIABLES), output });
  const permissionFlags = expected.filter((a) => /^--(allow-|no-prompt$)/.test(a));
  for (const m of permissionMismatches(payload.metadata, permissionFlags)) {
    failures.push(`permissions: ${m}`);
  }
  for (const f of missingV8Flags(payload.metadata, V8_FLAGS)) {
    failures.push(`V8 flag ${f} is not baked in`);
  }
  if (payload.metadata.entrypoint_key !== ENTRY_POINT) {
    failures.push(`the entry point is ${JSON.stringify(payload.metadata.entrypoint_key)}`);
  }

  const info = await deno(["info", "--frozen", "--json", ENTRY_POINT], { DENO_DIR: denoDir });
  if (!info.success) return [...failures, `deno info failed: ${info.text}`];
  const graph = JSON.parse(decoder.decode(info.stdout)) as {
    roots: string[];
    modules: InfoModule[];
    npmPackages?: Record<string, unknown>;
  };
  const files = codeFiles(graph.roots, graph.modules);
  const sources = new Map<string, Uint8Array>();
  for (const url of files) {
    sources.set(url.slice(`file://${ROOT}/`.length), await Deno.readFile(new URL(url)));
  }
  for (const name of missingBytes(payload.rest, sources)) failures.push(`${name} is not embedded`);
  const packages = Object.keys(graph.npmPackages ?? {});
  const named = new Map(packages.map((p) => [p, new TextEncoder().encode(p)]));
  for (const name of missingBytes(payload.rest, named)) {
    failures.push(`npm:${name} is not embedded`);
  }
  if (files.length === 0 || packages.length === 0) failures.push("deno info listed no modules");

  if (failures.length === 0) {
    const permissions = permissionFlags.map((f) => f.split("=")[0]).join(" ");
    say(
      `the output is the stand-in plus ${
        binary.length - standIn.length
      } bytes of payload; it bakes ${permissions} exactly as compileArgs writes them for ` +
        Object.keys(VARIABLES).join(", ") + `, ${V8_FLAGS}, entry point ${ENTRY_POINT}`,
    );
    say(
      `it embeds all ${files.length} local files main.ts reaches by code imports, byte for byte, ` +
        `and names all ${packages.length} npm packages of the graph`,
    );
  }
  return failures;
}

const tmp = await Deno.makeTempDir({ prefix: "zfs-csi-compile-proof-" });
let failures: string[];
try {
  failures = await prove(tmp);
} catch (err) {
  failures = [err instanceof Error ? err.message : String(err)];
} finally {
  await Deno.remove(tmp, { recursive: true });
}
if (failures.length > 0) {
  for (const f of failures) say(`FAILED: ${f}`);
  Deno.exit(1);
}
say(
  "ok; not proven: that denort runs it (the stand-in is deno's own CLI, so this output is not " +
    "a working zfs-csi binary)",
);
