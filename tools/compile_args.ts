/** The exact `deno compile` arguments of the release binary; kept pure so a test can read them. */

import { PRODUCTION_DIRS, runtimeFlags } from "../src/permissions.ts";

/** What varies between builds. */
export interface CompileOptions {
  readonly extraDirs: readonly string[];
  readonly output: string;
  readonly target?: string;
}

/** Arguments after `deno`. The proto is imported as text, so it is in the module graph. */
export function compileArgs(opts: CompileOptions): string[] {
  return [
    "compile",
    "--frozen",
    ...runtimeFlags({ dirs: [...PRODUCTION_DIRS, ...opts.extraDirs] }),
    ...(opts.target ? ["--target", opts.target] : []),
    "--output",
    opts.output,
    "main.ts",
  ];
}
