/**
 * `deno task dev` and `deno task cli` as an operator runs them (through deno.json, the same deno):
 * the dev plugin started with a store (a directory, or an S3 endpoint on this host: versitygw)
 * and a metrics address serves metrics and writes its backups there, with the permissions of a
 * build for those arguments (tools/dev_args.ts); `deno task cli -- list` and `-- verify` work on
 * its pool. Each test moves the dev pool (ZFS_CSI_DEV_DIR, ZFS_CSI_DEV_POOL) to a throw-away one,
 * so it never touches an operator's .cache/dev pool.
 */

import assert from "node:assert/strict";
import { fileURLToPath } from "node:url";
import { CsiClient } from "../support/csi_client.ts";
import { createVolumeRequest } from "../support/nomad.ts";
import { S3Server } from "../support/s3_server.ts";
import { tryRun } from "../support/zfs_pool.ts";

const ROOT = fileURLToPath(new URL("../../", import.meta.url)).replace(/\/$/, "");
const decoder = new TextDecoder();
/** How long the dev task may take to create its pool and serve (a busy 2-core machine). */
const START_MS = 120_000;

let counter = 0;

/** A throw-away dev setup: its directory, pool and the environment that points the tasks there. */
async function devSetup(): Promise<{ tmp: string; pool: string; env: Record<string, string> }> {
  const tmp = await Deno.makeTempDir({ prefix: "zfs-csi-devtask-" });
  const pool = `zcdev${Deno.pid}x${counter++}`;
  return {
    tmp,
    pool,
    env: { ZFS_CSI_DEV_DIR: `${tmp}/dev`, ZFS_CSI_DEV_POOL: pool, NO_COLOR: "1" },
  };
}

/** Removes the dev pool and directory: unmounts what is below it, destroys the pool. */
async function removeDevSetup(tmp: string, pool: string): Promise<void> {
  const mounts = decoder.decode(
    (await new Deno.Command("mount", { stdout: "piped" }).output()).stdout,
  )
    .split("\n").map((l) => /^.*? on (.*) type \S+ \(.*\)$/.exec(l)?.[1])
    .filter((m): m is string => m !== undefined && m.startsWith(`${tmp}/dev/csi/`)).reverse();
  for (const m of mounts) await tryRun("umount", m);
  for (let i = 0; i < 20; i++) {
    const r = await tryRun("zpool", "destroy", "-f", pool);
    if (r.code === 0 || /no such pool/.test(r.stderr)) break;
    await new Promise((res) => setTimeout(res, 250));
  }
  await Deno.remove(tmp, { recursive: true }).catch(() => {});
}

/** A running `deno task <name> ...`, its output kept. */
class Task implements AsyncDisposable {
  readonly #child: Deno.ChildProcess;
  readonly #out: string[] = [];
  readonly #reading: Promise<void>[];
  readonly status: Promise<Deno.CommandStatus>;

  constructor(args: string[], env: Record<string, string>) {
    this.#child = new Deno.Command(Deno.execPath(), {
      args: ["task", ...args],
      cwd: ROOT,
      env,
      stdin: "null",
      stdout: "piped",
      stderr: "piped",
    }).spawn();
    this.#reading = [this.#child.stdout, this.#child.stderr].map(async (stream) => {
      for await (const chunk of stream.pipeThrough(new TextDecoderStream())) this.#out.push(chunk);
    });
    this.status = this.#child.status;
  }

  /** Everything it printed so far. */
  output(): string {
    return this.#out.join("");
  }

  /** SIGTERM: deno task passes it to tools/dev.ts, which passes it to the plugin. */
  async stop(): Promise<Deno.CommandStatus> {
    try {
      this.#child.kill("SIGTERM");
    } catch {
      // Already gone.
    }
    const status = await this.status;
    await Promise.all(this.#reading);
    return status;
  }

  async [Symbol.asyncDispose](): Promise<void> {
    await this.stop();
  }
}

/** `deno task cli -- <args>` to its end. */
async function cli(env: Record<string, string>, args: string[]) {
  const out = await new Deno.Command(Deno.execPath(), {
    args: ["task", "cli", "--", ...args],
    cwd: ROOT,
    env,
    stdin: "null",
    stdout: "piped",
    stderr: "piped",
  }).output();
  return { code: out.code, stdout: decoder.decode(out.stdout), stderr: decoder.decode(out.stderr) };
}

/** Waits until `ready` resolves true, failing with the task's output if it ends or times out. */
async function waitFor(task: Task, what: string, ready: () => Promise<boolean>): Promise<void> {
  let ended = false;
  task.status.then(() => ended = true);
  const deadline = Date.now() + START_MS;
  while (Date.now() < deadline) {
    if (await ready().catch(() => false)) return;
    if (ended) break;
    await new Promise((r) => setTimeout(r, 200));
  }
  assert.fail(`${what}: ${ended ? "the task ended" : "not within the limit"}:\n${task.output()}`);
}

/** The metrics page, or "" while nothing answers. */
async function metrics(listen: string): Promise<string> {
  const r = await fetch(`http://${listen}/metrics`);
  return r.ok ? await r.text() : (await r.body?.cancel(), "");
}

function freeLocalPort(): number {
  const l = Deno.listen({ hostname: "127.0.0.1", port: 0 });
  const port = l.addr.port;
  l.close();
  return port;
}

/** Creates a volume and a snapshot in the store through the dev plugin's socket. */
async function backUpOneVolume(socket: string, name: string): Promise<string> {
  const client = new CsiClient(socket);
  try {
    await client.controller("CreateVolume", createVolumeRequest(name));
    const snap = (await client.controller(
      "CreateSnapshot",
      { source_volume_id: `${name}@dev`, name: `${name}-snap`, parameters: {} },
      120_000,
    )).snapshot;
    assert.equal(snap.ready_to_use, true);
    return snap.snapshot_id;
  } finally {
    client.close();
  }
}

Deno.test("deno task dev -- --store DIR --metrics-listen ADDR serves metrics and backs up there; deno task cli -- list and verify work on its pool", async (t) => {
  const { tmp, pool, env } = await devSetup();
  // A directory store must exist: the plugin never creates one (an unmounted disk stays empty).
  const storeDir = `${tmp}/store`;
  await Deno.mkdir(storeDir);
  const listen = `127.0.0.1:${freeLocalPort()}`;
  try {
    await using dev = new Task(
      ["dev", "--", "--store", `file://${storeDir}`, "--metrics-listen", listen],
      env,
    );

    await t.step("the dev plugin serves metrics on the address its arguments name", async () => {
      await waitFor(dev, "metrics", async () => /^zfs_csi_info\{/m.test(await metrics(listen)));
      assert.match(await metrics(listen), /^zfs_csi_metrics_source_up\{source="zfs"\} 1$/m);
      // It runs as the build for those arguments would, and says which build that is.
      assert.ok(
        dev.output().includes(
          `dev: permissions of: ZFS_CSI_EXTRA_DIRS=${tmp}/dev/csi:${storeDir} ` +
            `ZFS_CSI_METRICS_LISTEN=${listen} deno task compile`,
        ),
        dev.output(),
      );
    });

    await t.step("its snapshots go to the directory store", async () => {
      const id = await backUpOneVolume(`${tmp}/dev/csi/csi.sock`, "devtask");
      assert.match(id, /^store:devtask:[0-9a-f]{16}$/);
      const manifests = await Array.fromAsync(
        Deno.readDir(`${storeDir}/v1/volumes/devtask/snapshots`),
      );
      assert.equal(manifests.length, 1);
    });

    await t.step("deno task cli -- list shows the dev pool's volume", async () => {
      const r = await cli(env, ["list", "--json"]);
      assert.equal(r.code, 0, r.stderr);
      const rows = JSON.parse(r.stdout) as { name: string; volumeId: string; dataset: string }[];
      assert.deepEqual(
        rows.map((v) => [v.name, v.volumeId, v.dataset]),
        [["devtask", "devtask@dev", `${pool}/nomad/devtask`]],
      );
    });

    await t.step(
      "deno task cli -- verify reads the same store, with the store's grant",
      async () => {
        const r = await cli(env, ["verify", "devtask", "--store", `file://${storeDir}`]);
        assert.equal(r.code, 0, r.stderr);
        assert.match(r.stdout, /^Verified store:devtask:[0-9a-f]{16} of "devtask" /);
      },
    );

    await t.step("SIGTERM stops the task and the plugin under it", async () => {
      const status = await dev.stop();
      assert.equal(status.code, 0, dev.output());
      await assert.rejects(metrics(listen));
    });
  } finally {
    await removeDevSetup(tmp, pool);
  }
});

Deno.test("deno task dev -- --store s3://... --store-endpoint on this host backs up to that S3 server", async () => {
  const { tmp, pool, env } = await devSetup();
  const s3 = await S3Server.start();
  try {
    const keyEnv = {
      ...env,
      AWS_ACCESS_KEY_ID: s3.accessKeyId,
      AWS_SECRET_ACCESS_KEY: s3.secretAccessKey,
    };
    const endpoint = s3.endpoint.origin;
    const storeFlags = [
      "--store",
      `s3://${s3.bucket}`,
      "--store-endpoint",
      endpoint,
      "--store-path-style",
    ];
    {
      await using dev = new Task(["dev", "--", ...storeFlags], keyEnv);
      const socket = `${tmp}/dev/csi/csi.sock`;
      await waitFor(dev, "socket", async () => (await Deno.lstat(socket)).isSocket === true);
      assert.ok(
        dev.output().includes(`ZFS_CSI_STORE_HOSTS=${s3.endpoint.host} deno task compile`),
        dev.output(),
      );
      const id = await backUpOneVolume(socket, "devs3");
      assert.match(id, /^store:devs3:[0-9a-f]{16}$/);
      const manifests = await Array.fromAsync(
        Deno.readDir(`${s3.dir}/${s3.bucket}/v1/volumes/devs3/snapshots`),
      );
      assert.equal(manifests.length, 1);
    }
    const r = await cli(keyEnv, ["verify", "devs3", ...storeFlags]);
    assert.equal(r.code, 0, r.stderr);
    assert.match(r.stdout, /^Verified store:devs3:[0-9a-f]{16} of "devs3" /);
  } finally {
    await s3.stop();
    await removeDevSetup(tmp, pool);
  }
});
