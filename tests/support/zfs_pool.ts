/**
 * A throw-away ZFS pool on a sparse file in a temporary directory, for integration tests.
 * tools/zfs-env.sh (run by the test task) makes sure zfs answers on this machine first.
 */

import { hostMounts } from "./nomad.ts";

const decoder = new TextDecoder();

/** Runs a command (no shell) and returns its output, throwing on failure. */
export async function sh(program: string, ...args: string[]): Promise<string> {
  const out = await new Deno.Command(program, { args, stdout: "piped", stderr: "piped" }).output();
  if (!out.success) {
    throw new Error(`${program} ${args.join(" ")} failed: ${decoder.decode(out.stderr).trim()}`);
  }
  return decoder.decode(out.stdout);
}

/** Like {@linkcode sh} but returns the exit code and output instead of throwing. */
export async function tryRun(
  program: string,
  ...args: string[]
): Promise<{ code: number; stdout: string; stderr: string }> {
  const out = await new Deno.Command(program, { args, stdout: "piped", stderr: "piped" }).output();
  return { code: out.code, stdout: decoder.decode(out.stdout), stderr: decoder.decode(out.stderr) };
}

/** `zfs destroy`, retried while zfs-fuse calls a dataset created or mounted a moment ago busy. */
export async function destroyRetrying(name: string): Promise<void> {
  for (let attempt = 0;; attempt++) {
    const r = await tryRun("zfs", "destroy", name);
    if (r.code === 0) return;
    if (attempt >= 20 || !/busy/.test(r.stderr)) {
      throw new Error(`zfs destroy ${name}: ${r.stderr}`);
    }
    await new Promise((res) => setTimeout(res, 250));
  }
}

let counter = 0;

/** A test pool: `<pool>/nomad` is the parent dataset; `dir` holds everything else. */
export class TestPool implements AsyncDisposable {
  readonly pool: string;
  readonly parent: string;
  /** Temporary directory: pool image, mountpoints, socket and base dirs live below it. */
  readonly dir: string;
  readonly mountRoot: string;

  private constructor(pool: string, dir: string) {
    this.pool = pool;
    this.parent = `${pool}/nomad`;
    this.dir = dir;
    this.mountRoot = `${dir}/zfs`;
  }

  /** Creates the pool (512 MiB sparse file) and its parent dataset. */
  static async create(sizeMiB = 512): Promise<TestPool> {
    const dir = await Deno.makeTempDir({ prefix: "zfs-csi-test-" });
    const pool = `zcsit${Deno.pid}x${counter++}`;
    const img = `${dir}/pool.img`;
    const f = await Deno.open(img, { create: true, write: true });
    await f.truncate(sizeMiB * 1024 * 1024);
    f.close();
    const p = new TestPool(pool, dir);
    await sh("zpool", "create", "-m", p.mountRoot, pool, img);
    await sh("zfs", "create", p.parent);
    return p;
  }

  /** Names of every dataset in the pool. */
  async datasets(): Promise<string[]> {
    const out = await sh("zfs", "list", "-H", "-r", "-o", "name", "-t", "filesystem", this.pool);
    return out.split("\n").filter((l) => l !== "");
  }

  /** One property value (parsable). */
  async get(dataset: string, prop: string): Promise<string> {
    return (await sh("zfs", "get", "-Hp", "-o", "value", prop, dataset)).trim();
  }

  /** Unmounts whatever the tests left below `dir`, then destroys the pool and the directory. */
  async destroy(): Promise<void> {
    const mounts = (await sh("mount")).split("\n")
      .map((l) => /^.*? on (.*) type \S+ \(.*\)$/.exec(l)?.[1])
      .filter((m): m is string => m !== undefined && m.startsWith(this.dir + "/"))
      .reverse();
    for (const m of mounts) {
      if (!m.startsWith(this.mountRoot)) await tryRun("umount", m);
    }
    let destroyed = false;
    let last = "";
    for (let i = 0; i < 20 && !destroyed; i++) {
      const r = await tryRun("zpool", "destroy", "-f", this.pool);
      destroyed = r.code === 0 || /no such pool/.test(r.stderr);
      last = r.stderr.trim();
      if (!destroyed) await new Promise((res) => setTimeout(res, 250));
    }
    if (!destroyed) {
      // zfs-fuse can call a pool with many datasets busy until its daemon restarts.
      await Deno.stderr.write(
        new TextEncoder().encode(
          `test pool ${this.pool} (${this.dir}) was left behind: ${last}; ` +
            `zpool destroy -f ${this.pool} (after restarting zfs-fuse if it stays busy)\n`,
        ),
      );
      return;
    }
    await Deno.remove(this.dir, { recursive: true }).catch(() => {});
  }

  async [Symbol.asyncDispose](): Promise<void> {
    await this.destroy();
  }
}

/** The properties {@linkcode poolState} records of everything `zfs get -r` lists in the pool. */
const STATE_PROPERTIES = "type,refquota,quota,mountpoint,mounted,org.zfs-csi:managed";

/**
 * Everything below the pool a refused or bad call must leave alone: the datasets with their
 * properties, and the host mount table. Compare two of them with equal.
 */
export async function poolState(pool: TestPool): Promise<string> {
  const props = await sh(
    "zfs",
    "get",
    "-Hp",
    "-r",
    "-o",
    "name,property,value",
    STATE_PROPERTIES,
    pool.pool,
  );
  const mounts = (await hostMounts()).map((m) => `${m.source} ${m.path} ${m.options.join(",")}`);
  return props + "\n" + mounts.sort().join("\n");
}
