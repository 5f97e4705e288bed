/**
 * `deno task dev`: runs the plugin locally on a file-backed pool that it creates if missing,
 * with the production permission flags scoped to local directories under .cache/dev.
 * Extra arguments are passed to the plugin (e.g. --log-level debug).
 */

import { fileURLToPath } from "node:url";
import { runtimeFlags } from "../src/permissions.ts";

const ROOT = fileURLToPath(new URL("../", import.meta.url)).replace(/\/$/, "");
const DEV = `${ROOT}/.cache/dev`;
const POOL = "zfscsidev";
const PARENT = `${POOL}/nomad`;
const IMAGE = `${DEV}/pool.img`;

function log(text: string): void {
  Deno.stderr.writeSync(new TextEncoder().encode(`dev: ${text}\n`));
}

async function run(program: string, ...args: string[]): Promise<{ ok: boolean; out: string }> {
  const res = await new Deno.Command(program, { args, stdout: "piped", stderr: "piped" }).output();
  const dec = new TextDecoder();
  return { ok: res.success, out: dec.decode(res.stdout) + dec.decode(res.stderr) };
}

async function ensurePool(): Promise<void> {
  if ((await run("zpool", "list", "-H", "-o", "name", POOL)).ok) return;
  await Deno.mkdir(DEV, { recursive: true });
  try {
    await Deno.lstat(IMAGE);
    log(`importing pool ${POOL} from ${IMAGE}`);
    const r = await run("zpool", "import", "-d", DEV, POOL);
    if (!r.ok) throw new Error(r.out.trim());
    return;
  } catch (err) {
    if (!(err instanceof Deno.errors.NotFound)) throw err;
  }
  log(`creating pool ${POOL} on ${IMAGE} (1 GiB sparse file)`);
  const f = await Deno.open(IMAGE, { create: true, write: true });
  await f.truncate(1024 ** 3);
  f.close();
  const r = await run("zpool", "create", "-m", `${DEV}/zfs`, POOL, IMAGE);
  if (!r.ok) throw new Error(r.out.trim());
}

async function ensureParent(): Promise<void> {
  if ((await run("zfs", "list", "-H", "-o", "name", PARENT)).ok) return;
  const r = await run("zfs", "create", PARENT);
  if (!r.ok) throw new Error(r.out.trim());
}

await ensurePool();
await ensureParent();
const csiDir = `${DEV}/csi`;
await Deno.mkdir(`${csiDir}/base`, { recursive: true });
const args = [
  "run",
  "--frozen",
  ...runtimeFlags({ dirs: [csiDir] }),
  `${ROOT}/main.ts`,
  "--parent-dataset",
  PARENT,
  "--node-id",
  "dev",
  "--endpoint",
  `unix://${csiDir}/csi.sock`,
  "--stage-publish-base-dir",
  `${csiDir}/base`,
  ...Deno.args,
];
log(`socket unix://${csiDir}/csi.sock, staging/publish base ${csiDir}/base, parent ${PARENT}`);
const child = new Deno.Command(Deno.execPath(), { args, stdin: "null" }).spawn();
for (const sig of ["SIGINT", "SIGTERM"] as const) {
  Deno.addSignalListener(sig, () => child.kill(sig));
}
Deno.exit((await child.status).code);
