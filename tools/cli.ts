/**
 * `deno task cli -- <subcommand> …`: runs an operator subcommand (`zfs-csi <subcommand>`,
 * src/cli/) from the sources, with the permissions of a binary `deno task compile` would build
 * for its arguments (tools/dev_args.ts), so it may do what the shipped binary may. Without
 * --parent-dataset it works on `deno task dev`'s pool, socket and base directory
 * (ZFS_CSI_DEV_DIR and ZFS_CSI_DEV_POOL move them, as for the dev task).
 */

import { fileURLToPath } from "node:url";
import { cliArgs, devPaths, runArgs, runNeeds, taskArgs } from "./dev_args.ts";

const ROOT = fileURLToPath(new URL("../", import.meta.url)).replace(/\/$/, "");
const env = Deno.env.toObject();
const paths = devPaths(ROOT, env);
const args = cliArgs(paths, taskArgs(Deno.args));
const needs = runNeeds(args, env, Deno.readTextFileSync, paths);
const child = new Deno.Command(Deno.execPath(), { args: runArgs(ROOT, needs, args) }).spawn();
// A terminal's Ctrl-C reaches the subcommand itself too (same process group); a signal sent to
// this process alone is passed on, so `zfs-csi verify` cleans up either way.
for (const sig of ["SIGINT", "SIGTERM"] as const) {
  Deno.addSignalListener(sig, () => child.kill(sig));
}
Deno.exit((await child.status).code);
