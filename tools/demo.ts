/**
 * `deno task demo`: drives the plugin that `deno task dev` runs through one volume's life over
 * its socket (`zfs-csi demo`, src/cli/demo.ts), under the same permission flags as the dev
 * plugin, so it shows what the binary may do. Extra arguments go to the demo (e.g. --keep).
 */

import { fileURLToPath } from "node:url";
import { runtimeFlags } from "../src/permissions.ts";

const ROOT = fileURLToPath(new URL("../", import.meta.url)).replace(/\/$/, "");
const CSI = `${ROOT}/.cache/dev/csi`;
const SOCKET = `${CSI}/csi.sock`;

try {
  await Deno.lstat(SOCKET);
} catch {
  Deno.stderr.writeSync(
    new TextEncoder().encode(
      `demo: no plugin socket at ${SOCKET}: start the dev plugin first, in another terminal: ` +
        `./tools/deno task dev\n`,
    ),
  );
  Deno.exit(1);
}
const child = new Deno.Command(Deno.execPath(), {
  args: [
    "run",
    "--quiet",
    "--frozen",
    ...runtimeFlags({ dirs: [CSI] }),
    `${ROOT}/main.ts`,
    "demo",
    "--endpoint",
    `unix://${SOCKET}`,
    "--stage-publish-base-dir",
    `${CSI}/base`,
    ...Deno.args,
  ],
  stdin: "null",
}).spawn();
Deno.exit((await child.status).code);
