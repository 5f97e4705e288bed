/**
 * The exact commands that build the release binary; kept pure so a test can read them.
 *
 * Two steps, because `deno compile --v8-flags=...` applies the flags to the compiling process
 * too: the binary's 128 MiB old-generation cap (src/permissions.ts V8_FLAGS) then caps the
 * type checker, which needs more on a fresh clone (no type-check cache) and dies with "Fatal
 * JavaScript out of memory". So the graph is type-checked first with the compiler's own heap,
 * then compiled with --no-check and the runtime flags, which `deno compile` bakes into the
 * binary. DENO_V8_FLAGS is no way around it: `deno compile` does not bake it in, and it does not
 * override --v8-flags for the compiling process either (both seen on Deno 2.8.3).
 */

import { binaryFlags, type BuildNeeds, NO_NEEDS } from "../src/permissions.ts";

/** The entry point of the binary. */
export const ENTRY_POINT = "main.ts";

/** What varies between builds: the build variables' needs, where to write, for which target. */
export interface CompileOptions extends Partial<BuildNeeds> {
  readonly output: string;
  readonly target?: string;
}

/** Arguments after `deno` of the type check, run with the compiler's default heap. */
export const CHECK_ARGS: readonly string[] = Object.freeze(["check", "--frozen", ENTRY_POINT]);

/**
 * Arguments after `deno` of the compile step. The CSI descriptor (src/grpc/csi_descriptor.json)
 * is a JSON import and the store and metrics modules are imported by literal specifiers, so all
 * are in the graph.
 */
export function compileArgs(opts: CompileOptions): string[] {
  const needs: BuildNeeds = {
    extraDirs: opts.extraDirs ?? NO_NEEDS.extraDirs,
    storeHosts: opts.storeHosts ?? NO_NEEDS.storeHosts,
    extraReadFiles: opts.extraReadFiles ?? NO_NEEDS.extraReadFiles,
    metricsListen: opts.metricsListen ?? NO_NEEDS.metricsListen,
    blockVolumes: opts.blockVolumes ?? NO_NEEDS.blockVolumes,
  };
  return [
    "compile",
    "--frozen",
    // Checked by CHECK_ARGS just before, under the compiler's own heap.
    "--no-check",
    ...binaryFlags(needs),
    ...(opts.target ? ["--target", opts.target] : []),
    "--output",
    opts.output,
    ENTRY_POINT,
  ];
}

/** The build, step by step: each entry is the arguments after `deno` of one command. */
export function compilePipeline(opts: CompileOptions): string[][] {
  return [[...CHECK_ARGS], compileArgs(opts)];
}
