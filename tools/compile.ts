/**
 * Builds the single `zfs-csi` executable with its permissions baked in, from the one
 * definition in src/permissions.ts. Build variables extend them (src/permissions.ts
 * BUILD_VARIABLES):
 *   ZFS_CSI_EXTRA_DIRS        directories to read and write, colon-separated (a Nomad data_dir
 *                             other than /var/lib/nomad or /opt/nomad/data, a file store)
 *   ZFS_CSI_STORE_HOSTS       the S3 store's host[:port] (443 if none), comma-separated: the
 *                             only network the binary may reach (the bucket's own host when
 *                             virtual-hosted: bucket.s3.region.amazonaws.com)
 *   ZFS_CSI_EXTRA_READ_FILES  single files to read, colon-separated (a credentials file)
 *   ZFS_CSI_METRICS_LISTEN    host:port the metrics endpoint may listen on (--metrics-listen),
 *                             e.g. 0.0.0.0:9474 in a container; without it, no endpoint
 *   ZFS_CSI_BLOCK_VOLUMES     "on": the block tools (lsblk, blkid, wipefs, mkfs.ext4, mkfs.xfs,
 *                             resize2fs, xfs_growfs) may run, for --block-volumes
 * The plugin refuses to start, naming the variable to set, when its config needs more.
 *
 * Two steps (tools/compile_args.ts says why): `deno check`, then `deno compile --no-check`.
 * DENORT_BIN, read by `deno compile` itself, names a local runtime instead of downloading one.
 *
 * Usage: deno task compile [--print] [--target TRIPLE] [--output PATH]
 */

import { parseArgs } from "node:util";
import { BUILD_VARIABLES, needsFromVariables } from "../src/permissions.ts";
import { compilePipeline } from "./compile_args.ts";

const { values } = parseArgs({
  args: Deno.args,
  options: {
    print: { type: "boolean" },
    target: { type: "string" },
    output: { type: "string" },
  },
});
const names = Object.values(BUILD_VARIABLES).map((v) => v.name);
const steps = compilePipeline({
  ...needsFromVariables(Object.fromEntries(names.map((n) => [n, Deno.env.get(n)]))),
  output: values.output ?? "zfs-csi",
  ...(values.target ? { target: values.target } : {}),
});
for (const args of steps) {
  Deno.stdout.writeSync(new TextEncoder().encode(["deno", ...args].join(" ") + "\n"));
  if (values.print) continue;
  const status = await new Deno.Command(Deno.execPath(), { args }).spawn().status;
  if (!status.success) Deno.exit(status.code || 1);
}
