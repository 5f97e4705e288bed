/**
 * `deno task dev`: runs the plugin locally on a file-backed pool that it creates if missing.
 * Extra arguments go to the plugin (e.g. --log-level debug, --store file:///tmp/x,
 * --metrics-listen 127.0.0.1:9474), and the plugin runs with the permissions of a binary
 * `deno task compile` would build for them (tools/dev_args.ts): the production flags plus the
 * dev directory and what its store and metrics address need, and what the build variables in
 * the environment add. The line "dev: permissions of ..." names that build.
 * ZFS_CSI_DEV_DIR and ZFS_CSI_DEV_POOL move the pool (default .cache/dev, zfscsidev).
 */

import { fileURLToPath } from "node:url";
import { variablesOf } from "../src/permissions.ts";
import { devPaths, devPluginArgs, runArgs, runNeeds, taskArgs } from "./dev_args.ts";

const ROOT = fileURLToPath(new URL("../", import.meta.url)).replace(/\/$/, "");
const paths = devPaths(ROOT, Deno.env.toObject());

function log(text: string): void {
  Deno.stderr.writeSync(new TextEncoder().encode(`dev: ${text}\n`));
}

async function run(program: string, ...args: string[]): Promise<{ ok: boolean; out: string }> {
  const res = await new Deno.Command(program, { args, stdout: "piped", stderr: "piped" }).output();
  const dec = new TextDecoder();
  return { ok: res.success, out: dec.decode(res.stdout) + dec.decode(res.stderr) };
}

async function ensurePool(): Promise<void> {
  if ((await run("zpool", "list", "-H", "-o", "name", paths.pool)).ok) return;
  await Deno.mkdir(paths.dir, { recursive: true });
  try {
    await Deno.lstat(paths.image);
    log(`importing pool ${paths.pool} from ${paths.image}`);
    const r = await run("zpool", "import", "-d", paths.dir, paths.pool);
    if (!r.ok) throw new Error(r.out.trim());
    return;
  } catch (err) {
    if (!(err instanceof Deno.errors.NotFound)) throw err;
  }
  log(`creating pool ${paths.pool} on ${paths.image} (1 GiB sparse file)`);
  const f = await Deno.open(paths.image, { create: true, write: true });
  await f.truncate(1024 ** 3);
  f.close();
  const r = await run("zpool", "create", "-m", paths.mountRoot, paths.pool, paths.image);
  if (!r.ok) throw new Error(r.out.trim());
}

async function ensureParent(): Promise<void> {
  if ((await run("zfs", "list", "-H", "-o", "name", paths.parent)).ok) return;
  const r = await run("zfs", "create", paths.parent);
  if (!r.ok) throw new Error(r.out.trim());
}

await ensurePool();
await ensureParent();
await Deno.mkdir(paths.baseDir, { recursive: true });
const args = devPluginArgs(paths, taskArgs(Deno.args));
const needs = runNeeds(args, Deno.env.toObject(), Deno.readTextFileSync, paths);
log(
  `socket unix://${paths.socket}, staging/publish base ${paths.baseDir}, parent ${paths.parent}`,
);
log(`permissions of: ${[...variablesOf(needs), "deno task compile"].join(" ")}`);
const child = new Deno.Command(Deno.execPath(), { args: runArgs(ROOT, needs, args), stdin: "null" })
  .spawn();
for (const sig of ["SIGINT", "SIGTERM"] as const) {
  Deno.addSignalListener(sig, () => child.kill(sig));
}
Deno.exit((await child.status).code);
