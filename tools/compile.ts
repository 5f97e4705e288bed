/**
 * Builds the single `zfs-csi` executable with its permissions baked in, from the one
 * definition in src/permissions.ts. Extra writable directories (for a Nomad data_dir other
 * than /var/lib/nomad or /opt/nomad/data) come from ZFS_CSI_EXTRA_DIRS, colon-separated.
 *
 * Usage: deno task compile [--print] [--target TRIPLE] [--output PATH]
 */

import { parseArgs } from "node:util";
import { compileArgs } from "./compile_args.ts";

const { values } = parseArgs({
  args: Deno.args,
  options: {
    print: { type: "boolean" },
    target: { type: "string" },
    output: { type: "string" },
  },
});
const extra = (Deno.env.get("ZFS_CSI_EXTRA_DIRS") ?? "").split(":").filter((d) => d !== "");
const args = compileArgs({
  extraDirs: extra,
  output: values.output ?? "zfs-csi",
  ...(values.target ? { target: values.target } : {}),
});
const text = new TextEncoder().encode(["deno", ...args].join(" ") + "\n");
Deno.stdout.writeSync(text);
if (!values.print) {
  const status = await new Deno.Command(Deno.execPath(), { args }).spawn().status;
  Deno.exit(status.code);
}
