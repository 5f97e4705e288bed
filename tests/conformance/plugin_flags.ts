/**
 * Prints the plugin's production `deno run` flags (src/permissions.ts), scoped to the one
 * directory given, one flag per line: the conformance script starts main.ts with exactly these.
 * Usage: deno run tests/conformance/plugin_flags.ts DIR
 */

import { runtimeFlags } from "../../src/permissions.ts";

const [dir, ...rest] = Deno.args;
if (dir === undefined || rest.length > 0) {
  Deno.stderr.writeSync(new TextEncoder().encode("usage: plugin_flags.ts DIR\n"));
  Deno.exit(2);
}
Deno.stdout.writeSync(new TextEncoder().encode(runtimeFlags({ dirs: [dir] }).join("\n") + "\n"));
