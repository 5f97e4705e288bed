/**
 * Prints the plugin's production `deno run` flags (src/permissions.ts), scoped to the one
 * directory given, one flag per line: the conformance script starts main.ts with exactly these.
 * With --block-volumes, a block build's flags (ZFS_CSI_BLOCK_VOLUMES=on), for a plugin started
 * with --block-volumes (csi-sanity with block specs).
 * Usage: deno run tests/conformance/plugin_flags.ts DIR [--block-volumes]
 */

import { runtimeFlags } from "../../src/permissions.ts";

const [dir, ...rest] = Deno.args;
const block = rest.length === 1 && rest[0] === "--block-volumes";
if (dir === undefined || (rest.length > 0 && !block)) {
  Deno.stderr.writeSync(new TextEncoder().encode("usage: plugin_flags.ts DIR [--block-volumes]\n"));
  Deno.exit(2);
}
const flags = runtimeFlags({ dirs: [dir], ...(block ? { blockVolumes: true } : {}) });
Deno.stdout.writeSync(new TextEncoder().encode(flags.join("\n") + "\n"));
