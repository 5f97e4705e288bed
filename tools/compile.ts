/**
 * Builds the single `zfs-csi` executable with its permissions baked in, from the one
 * definition in src/permissions.ts. Build variables extend them:
 *   ZFS_CSI_EXTRA_DIRS        directories to read and write, colon-separated (a Nomad data_dir
 *                             other than /var/lib/nomad or /opt/nomad/data, a file store)
 *   ZFS_CSI_STORE_HOSTS       the S3 store's host[:port] (443 if none), comma-separated: the
 *                             only network the binary may reach (the bucket's own host when
 *                             virtual-hosted: bucket.s3.region.amazonaws.com)
 *   ZFS_CSI_EXTRA_READ_FILES  single files to read, colon-separated (a credentials file)
 *   ZFS_CSI_METRICS_LISTEN    host:port the metrics endpoint may listen on (--metrics-listen),
 *                             e.g. 0.0.0.0:9474 in a container; without it, no endpoint
 * The plugin refuses to start, naming the variable to set, when its config needs more.
 *
 * Usage: deno task compile [--print] [--target TRIPLE] [--output PATH]
 */

import { parseArgs } from "node:util";
import { compileArgs, fromBuildVariables } from "./compile_args.ts";

const { values } = parseArgs({
  args: Deno.args,
  options: {
    print: { type: "boolean" },
    target: { type: "string" },
    output: { type: "string" },
  },
});
const args = compileArgs({
  ...fromBuildVariables({
    ZFS_CSI_EXTRA_DIRS: Deno.env.get("ZFS_CSI_EXTRA_DIRS"),
    ZFS_CSI_STORE_HOSTS: Deno.env.get("ZFS_CSI_STORE_HOSTS"),
    ZFS_CSI_EXTRA_READ_FILES: Deno.env.get("ZFS_CSI_EXTRA_READ_FILES"),
    ZFS_CSI_METRICS_LISTEN: Deno.env.get("ZFS_CSI_METRICS_LISTEN"),
  }),
  output: values.output ?? "zfs-csi",
  ...(values.target ? { target: values.target } : {}),
});
const text = new TextEncoder().encode(["deno", ...args].join(" ") + "\n");
Deno.stdout.writeSync(text);
if (!values.print) {
  const status = await new Deno.Command(Deno.execPath(), { args }).spawn().status;
  Deno.exit(status.code);
}
