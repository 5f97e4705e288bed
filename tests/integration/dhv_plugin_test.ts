/**
 * The executable as a Nomad dynamic host volume plugin, run as Nomad runs it: `deno run` with the
 * production permission flags (src/permissions.ts, scoped to the test's directory), the
 * operation as the only argument, and an environment replaced by the `DHV_*` variables, on a
 * real pool. Nomad passes no PATH, and neither does this test: the build's --allow-run lists its
 * programs by absolute path (src/permissions.ts), and the plugin finds them there itself, so the
 * binary (or a symlink to it) is the plugin file, with no wrapper.
 */

import assert from "node:assert/strict";
import { fileURLToPath } from "node:url";
import { PluginProcess, runZfsCsi } from "../support/plugin_process.ts";
import { parseManifest, parseVolumeRecord } from "../../src/store/chain.ts";
import { fileStoreUnderTest } from "../support/store_flows.ts";
import { treeHash } from "../support/tree_hash.ts";
import { sh, TestPool } from "../support/zfs_pool.ts";

const ROOT = fileURLToPath(new URL("../../", import.meta.url));
const MIB = 1024 * 1024;
const ID = "7b0e9c34-52f1-4c1e-9d7e-0a1b2c3d4e5f";
const PROD_ID = "11111111-2222-3333-4444-555555555555";
const decoder = new TextDecoder();

interface Result {
  readonly code: number;
  readonly stdout: string;
  readonly stderr: string;
}

/** Runs `main.ts <op>` with exactly `env` (nothing inherited), under the production flags. */
async function runPlugin(
  pool: TestPool,
  op: string,
  env: Record<string, string>,
  readFiles: readonly string[] = [],
): Promise<Result> {
  const out = await new Deno.Command(Deno.execPath(), {
    args: [
      "run",
      "--quiet",
      "--frozen",
      ...PluginProcess.flags(pool.dir, { readFiles }),
      `${ROOT}main.ts`,
      op,
    ],
    cwd: ROOT,
    clearEnv: true,
    env,
    stdin: "null",
    stdout: "piped",
    stderr: "piped",
  }).output();
  return { code: out.code, stdout: decoder.decode(out.stdout), stderr: decoder.decode(out.stderr) };
}

interface Dirs {
  readonly plugins: string;
  readonly volumes: string;
}

async function dirsOf(pool: TestPool): Promise<Dirs> {
  const plugins = `${pool.dir}/host_volume_plugins`;
  const volumes = `${pool.dir}/host_volumes`;
  await Deno.mkdir(plugins, { recursive: true });
  await Deno.mkdir(volumes, { recursive: true });
  await Deno.writeTextFile(
    `${plugins}/zfs-csi.conf`,
    `# written by the test\n--parent-dataset ${pool.parent}\n--deleted-retention 1h\n`,
  );
  return { plugins, volumes };
}

/** Nomad's environment for `op` on a volume: the DHV_* variables and nothing else. */
function nomadEnv(
  dirs: Dirs,
  op: "create" | "delete",
  over: Record<string, string> = {},
): Record<string, string> {
  const base: Record<string, string> = {
    DHV_OPERATION: op,
    DHV_VOLUMES_DIR: dirs.volumes,
    DHV_PLUGIN_DIR: dirs.plugins,
    DHV_NODE_POOL: "default",
    DHV_NAMESPACE: "default",
    DHV_VOLUME_NAME: "data",
    DHV_VOLUME_ID: ID,
    DHV_NODE_ID: "5d1e4a2b-0000-4000-8000-000000000001",
    DHV_PARAMETERS: '{"compression":"on"}',
  };
  if (op === "create") {
    base.DHV_CAPACITY_MIN_BYTES = String(16 * MIB);
    base.DHV_CAPACITY_MAX_BYTES = "0";
  } else {
    base.DHV_CREATED_PATH = `${dirs.volumes}/${over.DHV_VOLUME_ID ?? ID}`;
  }
  return { ...base, ...over };
}

function stdoutJson(r: Result): Record<string, unknown> {
  const lines = r.stdout.split("\n").filter((l) => l !== "");
  assert.equal(lines.length, 1, `one JSON line on stdout: ${r.stdout} / ${r.stderr}`);
  return JSON.parse(lines[0]!);
}

/** Every stderr line is a JSON object (our logger), never free text. */
function assertJsonLines(stderr: string): void {
  for (const line of stderr.split("\n").filter((l) => l !== "")) {
    const parsed: unknown = JSON.parse(line);
    assert.equal(typeof parsed, "object", line);
  }
}

Deno.test("dhv: with Nomad's exact environment (no PATH) the build starts and runs zfs", async () => {
  await using pool = await TestPool.create(64);
  const dirs = await dirsOf(pool);
  // Before --allow-run listed absolute paths, Deno refused to start here: "no path to search".
  const r = await runPlugin(pool, "fingerprint", { DHV_OPERATION: "fingerprint" });
  assert.equal(r.code, 0, r.stderr);
  assert.deepEqual(stdoutJson(r), { version: "0.1.0" });
  // create runs zfs: found in a listed directory, by its absolute path.
  const created = await runPlugin(pool, "create", nomadEnv(dirs, "create"));
  assert.equal(created.code, 0, created.stderr);
  assert.equal(stdoutJson(created).path, `${dirs.volumes}/${ID}`);
  assert.equal(await pool.get(`${pool.parent}/.host-default_data`, "mounted"), "yes");
  const deleted = await runPlugin(pool, "delete", nomadEnv(dirs, "delete"));
  assert.equal(deleted.code, 0, deleted.stderr);
});

Deno.test("dhv: a program outside the build's list is refused in one line, exit 2", async () => {
  await using pool = await TestPool.create(64);
  const dirs = await dirsOf(pool);
  await Deno.writeTextFile(
    `${dirs.plugins}/zfs-csi.conf`,
    `--parent-dataset ${pool.parent}\n--zfs /opt/x/zfs\n`,
  );
  const r = await runPlugin(pool, "create", nomadEnv(dirs, "create"));
  assert.equal(r.code, 2);
  assert.match(
    String(stdoutJson(r).error),
    /^this build may not run "\/opt\/x\/zfs": it runs zfs, zpool, mount, umount only from \/usr\/local\/sbin, /,
  );
  assert.ok(!r.stderr.includes("NotCapable"), r.stderr);
  assert.ok(!(await pool.datasets()).includes(`${pool.parent}/.host-default_data`));
});

Deno.test("dhv: fingerprint, create, grow, refuse a shrink, delete, as Nomad runs them", async (t) => {
  await using pool = await TestPool.create(256);
  const dirs = await dirsOf(pool);
  const dataset = `${pool.parent}/.host-default_data`;
  const path = `${dirs.volumes}/${ID}`;

  await t.step("fingerprint answers the version within Nomad's 5 s", async () => {
    const started = performance.now();
    const r = await runPlugin(pool, "fingerprint", { DHV_OPERATION: "fingerprint" });
    const ms = performance.now() - started;
    assert.equal(r.code, 0, r.stderr);
    assert.deepEqual(stdoutJson(r), { version: "0.1.0" });
    assert.ok(ms < 5000, `fingerprint took ${Math.round(ms)} ms`);
    Deno.stderr.writeSync(new TextEncoder().encode(`  fingerprint: ${Math.round(ms)} ms\n`));
  });

  await t.step("create makes a mounted, quota'd dataset at <volumes dir>/<id>", async () => {
    const r = await runPlugin(pool, "create", nomadEnv(dirs, "create"));
    assert.equal(r.code, 0, r.stderr);
    assert.deepEqual(stdoutJson(r), { path, bytes: 16 * MIB });
    assertJsonLines(r.stderr);
    assert.equal(await pool.get(dataset, "mountpoint"), path);
    assert.equal(await pool.get(dataset, "mounted"), "yes");
    assert.equal(await pool.get(dataset, "refquota"), String(16 * MIB));
    assert.equal(await pool.get(dataset, "compression"), "on");
    assert.equal(await pool.get(dataset, "org.zfs-csi:host-volume-id"), ID);
    assert.equal(await pool.get(dataset, "org.zfs-csi:host-namespace"), "default");
    await Deno.writeTextFile(`${path}/hello`, "written through the host volume");
  });

  await t.step("create again (agent restart) answers the same and keeps the data", async () => {
    const r = await runPlugin(pool, "create", nomadEnv(dirs, "create"));
    assert.equal(r.code, 0, r.stderr);
    assert.deepEqual(stdoutJson(r), { path, bytes: 16 * MIB });
    assert.equal(await Deno.readTextFile(`${path}/hello`), "written through the host volume");
  });

  await t.step("create with a larger capacity grows the refquota", async () => {
    const r = await runPlugin(
      pool,
      "create",
      nomadEnv(dirs, "create", { DHV_CAPACITY_MIN_BYTES: String(32 * MIB) }),
    );
    assert.equal(r.code, 0, r.stderr);
    assert.deepEqual(stdoutJson(r), { path, bytes: 32 * MIB });
    assert.equal(await pool.get(dataset, "refquota"), String(32 * MIB));
  });

  await t.step("a capacity_max below the volume's size is refused, exit 2", async () => {
    const r = await runPlugin(
      pool,
      "create",
      nomadEnv(dirs, "create", {
        DHV_CAPACITY_MIN_BYTES: String(8 * MIB),
        DHV_CAPACITY_MAX_BYTES: String(8 * MIB),
      }),
    );
    assert.equal(r.code, 2);
    assert.deepEqual(stdoutJson(r), {
      error: `Volume "${ID}" has ${32 * MIB} bytes; shrinking to ${8 * MIB} is not supported`,
    });
    assert.equal(await pool.get(dataset, "refquota"), String(32 * MIB));
  });

  await t.step("the same name in another namespace is another dataset", async () => {
    const r = await runPlugin(
      pool,
      "create",
      nomadEnv(dirs, "create", { DHV_NAMESPACE: "prod", DHV_VOLUME_ID: PROD_ID }),
    );
    assert.equal(r.code, 0, r.stderr);
    assert.deepEqual(stdoutJson(r), { path: `${dirs.volumes}/${PROD_ID}`, bytes: 16 * MIB });
    assert.equal(
      await pool.get(`${pool.parent}/.host-prod_data`, "org.zfs-csi:host-volume-id"),
      PROD_ID,
    );
    await assert.rejects(Deno.stat(`${dirs.volumes}/${PROD_ID}/hello`), Deno.errors.NotFound);
  });

  await t.step("a missing variable exits 2 with the contract's message", async () => {
    const env = nomadEnv(dirs, "create");
    delete env.DHV_VOLUME_ID;
    const r = await runPlugin(pool, "create", env);
    assert.equal(r.code, 2);
    assert.deepEqual(stdoutJson(r), {
      error: "DHV_VOLUME_ID is not set: this operation is meant to be run by Nomad as a " +
        "dynamic host volume plugin, which sets it",
    });
    assertJsonLines(r.stderr);
  });

  await t.step("delete sets the dataset aside, unmounted, and a repeat succeeds", async () => {
    const r = await runPlugin(pool, "delete", nomadEnv(dirs, "delete"));
    assert.equal(r.code, 0, r.stderr);
    assert.equal(r.stdout, "");
    const all = await pool.datasets();
    assert.ok(!all.includes(dataset));
    const hidden = all.filter((d) => d.startsWith(`${pool.parent}/.deleted-`));
    assert.equal(hidden.length, 1);
    assert.equal(await pool.get(hidden[0]!, "org.zfs-csi:deleted-name"), dataset);
    assert.equal(await pool.get(hidden[0]!, "mounted"), "no");
    const again = await runPlugin(pool, "delete", nomadEnv(dirs, "delete"));
    assert.equal(again.code, 0, again.stderr);
  });

  await t.step(
    "delete with DHV_CREATED_PATH = the volumes dir touches only the volume",
    async () => {
      await Deno.writeTextFile(`${dirs.volumes}/keep-me`, "not a volume");
      const r = await runPlugin(
        pool,
        "delete",
        nomadEnv(dirs, "delete", {
          DHV_VOLUME_ID: PROD_ID,
          DHV_CREATED_PATH: dirs.volumes,
          DHV_VOLUME_NAME: "",
          DHV_NAMESPACE: "",
        }),
      );
      assert.equal(r.code, 0, r.stderr);
      assert.ok(!(await pool.datasets()).includes(`${pool.parent}/.host-prod_data`));
      assert.equal(await Deno.readTextFile(`${dirs.volumes}/keep-me`), "not a volume");
    },
  );

  await t.step("the undo recipe brings the data back", async () => {
    const hidden = (await pool.datasets()).find((d) => d.endsWith("-.host-default_data"))!;
    const zfs = (...args: string[]) =>
      new Deno.Command("zfs", { args, stdout: "null", stderr: "piped" }).output();
    assert.ok((await zfs("rename", hidden, dataset)).success);
    assert.ok((await zfs("set", "canmount=on", dataset)).success);
    // Nomad gives the re-created volume a new id: create says how to hand the dataset over.
    const newId = "22222222-3333-4444-5555-666666666666";
    const env = nomadEnv(dirs, "create", {
      DHV_VOLUME_ID: newId,
      DHV_CAPACITY_MIN_BYTES: String(32 * MIB),
    });
    const refused = await runPlugin(pool, "create", env);
    assert.equal(refused.code, 1);
    const hint = `zfs set org.zfs-csi:host-volume-id=${newId} ${dataset}`;
    assert.ok(String(stdoutJson(refused).error).includes(hint));
    assert.ok((await zfs("set", `org.zfs-csi:host-volume-id=${newId}`, dataset)).success);
    const r = await runPlugin(pool, "create", env);
    assert.equal(r.code, 0, r.stderr);
    assert.deepEqual(stdoutJson(r), { path: `${dirs.volumes}/${newId}`, bytes: 32 * MIB });
    assert.equal(
      await Deno.readTextFile(`${dirs.volumes}/${newId}/hello`),
      "written through the host volume",
    );
  });
});

Deno.test("dhv: a config file outside the build's grants is refused in one line", async () => {
  await using pool = await TestPool.create(64);
  const outside = await Deno.makeTempDir({ prefix: "zfs-csi-dhv-plugins-" });
  try {
    const dirs = { plugins: outside, volumes: `${pool.dir}/host_volumes` };
    const conf = `${outside}/zfs-csi.conf`;
    await Deno.writeTextFile(conf, `--parent-dataset ${pool.parent}\n`);
    const refused = await runPlugin(pool, "create", nomadEnv(dirs, "create"));
    assert.equal(refused.code, 2);
    assert.deepEqual(stdoutJson(refused), {
      error: `Cannot read the host volume plugin's flags from "${conf}": this build may not ` +
        `read the host volume plugin's config file "${conf}"; rebuild with ` +
        `ZFS_CSI_EXTRA_READ_FILES=${conf} deno task compile. Put the server's flags there, one ` +
        `per line (at least --parent-dataset POOL/DATASET)`,
    });
    // Granted that one file (as ZFS_CSI_EXTRA_READ_FILES does), it is read, and nothing else is.
    const r = await runPlugin(pool, "create", nomadEnv(dirs, "create"), [conf]);
    assert.equal(r.code, 0, r.stderr);
    assert.equal(stdoutJson(r).path, `${dirs.volumes}/${ID}`);
  } finally {
    await Deno.remove(outside, { recursive: true });
  }
});

Deno.test("dhv: with a store, the node plugin backs host volumes up under their own key; the stream restores", async (t) => {
  await using pool = await TestPool.create(256);
  const dirs = await dirsOf(pool);
  // Inside the test's directory, so both processes' production grants cover it.
  const storeDir = `${pool.dir}/store`;
  await Deno.mkdir(storeDir);
  const store = fileStoreUnderTest(storeDir);
  await Deno.writeTextFile(
    `${dirs.plugins}/zfs-csi.conf`,
    `--parent-dataset ${pool.parent}\n--store file://${storeDir}\n--deleted-retention 1h\n`,
  );
  const dataset = `${pool.parent}/.host-default_data`;
  const path = `${dirs.volumes}/${ID}`;
  const key = "v1/volumes/:2ehost-default_data/";
  const params = '{"backup_interval":"5s","backup_keep":"last=2"}';

  await t.step("create records the schedule on the dataset", async () => {
    const r = await runPlugin(pool, "create", nomadEnv(dirs, "create", { DHV_PARAMETERS: params }));
    assert.equal(r.code, 0, r.stderr);
    assert.equal(await pool.get(dataset, "org.zfs-csi:backup-interval"), "5");
    assert.equal(
      await pool.get(dataset, "org.zfs-csi:backup-keep"),
      "last=2,hourly=0,daily=0,weekly=0",
    );
    await Deno.writeTextFile(`${path}/hello`, "backed up through the node plugin");
    await Deno.mkdir(`${path}/sub`);
    await Deno.writeFile(`${path}/sub/bytes`, crypto.getRandomValues(new Uint8Array(65536)));
  });

  let manifestKey = "";
  let hash = "";
  await t.step("the node plugin on the same parent and store backs it up within 60 s", async () => {
    await using plugin = await PluginProcess.start({
      parentDataset: pool.parent,
      dir: pool.dir,
      ...store.plugin,
    });
    const started = performance.now();
    while (performance.now() - started < 60_000) {
      const found = (await store.keys(`${key}snapshots/`)).filter((k) => k.endsWith(".json"));
      if (found.length > 0) {
        manifestKey = found[0]!;
        break;
      }
      await new Promise((r) => setTimeout(r, 250));
    }
    const ms = Math.round(performance.now() - started);
    assert.notEqual(
      manifestKey,
      "",
      `no backup under ${key}: ${plugin.logs().slice(-20).join("\n")}`,
    );
    Deno.stderr.writeSync(
      new TextEncoder().encode(`  first host volume backup: ${ms} ms after start\n`),
    );
    // Nothing under a CSI key of the same name.
    assert.deepEqual(await store.keys("v1/volumes/data/"), []);
  });

  await t.step("its stream restores with zfs receive, the same files", async () => {
    const record = parseVolumeRecord((await store.read(`${key}volume.json`))!);
    assert.equal(record.name, ".host-default_data");
    assert.equal(record.uid, await pool.get(dataset, "org.zfs-csi:store-uid"));
    const manifest = parseManifest((await store.read(manifestKey))!, { key: manifestKey });
    assert.equal(manifest.baseGuid, null, "the first backup is a full stream");
    const target = `${pool.pool}/restored`;
    await receive(`${storeDir}/${manifest.stream}`, target);
    assert.equal(await pool.get(`${target}@${manifest.snapshot}`, "guid"), manifest.guid);
    const mounted = await pool.get(target, "mountpoint");
    hash = await treeHash(path);
    assert.equal(await treeHash(mounted), hash);
  });

  await t.step("zfs-csi verify restores it by its store name", async () => {
    const r = await runZfsCsi(pool.dir, [
      "verify",
      "--parent-dataset",
      pool.parent,
      "--node-id",
      "node-a",
      ...store.plugin.extraArgs!,
      ".host-default_data",
    ]);
    assert.equal(r.code, 0, r.stderr);
  });

  await t.step("delete keeps the backups: the record is marked deleted", async () => {
    const r = await runPlugin(pool, "delete", nomadEnv(dirs, "delete"));
    assert.equal(r.code, 0, r.stderr);
    const record = parseVolumeRecord((await store.read(`${key}volume.json`))!);
    assert.match(record.deletedAt ?? "", /^\d{4}-/);
    assert.ok((await store.keys(`${key}snapshots/`)).length > 0);
  });

  await t.step("the restored dataset goes back to Nomad as docs/host-volumes.md says", async () => {
    // The recipe's steps: receive in the host volume's place, set what create checks.
    const record = parseVolumeRecord((await store.read(`${key}volume.json`))!);
    const manifest = parseManifest((await store.read(manifestKey))!, { key: manifestKey });
    await receive(`${storeDir}/${manifest.stream}`, dataset);
    // One property per `zfs set`: zfs-fuse takes no more (OpenZFS takes several).
    for (
      const prop of [
        "org.zfs-csi:managed=yes",
        "org.zfs-csi:host-namespace=default",
        "org.zfs-csi:host-volume-id=restored",
        `org.zfs-csi:parameters=${JSON.stringify(record.parameters)}`,
      ]
    ) await sh("zfs", "set", prop, dataset);
    const newId = "22222222-3333-4444-5555-666666666666";
    const env = nomadEnv(dirs, "create", { DHV_PARAMETERS: params, DHV_VOLUME_ID: newId });
    const refused = await runPlugin(pool, "create", env);
    assert.equal(refused.code, 1, refused.stderr);
    const command = `zfs set org.zfs-csi:host-volume-id=${newId} ${dataset}`;
    assert.ok(String(stdoutJson(refused).error).includes(command), refused.stdout);
    await sh("zfs", "set", `org.zfs-csi:host-volume-id=${newId}`, dataset);
    const r = await runPlugin(pool, "create", env);
    assert.equal(r.code, 0, r.stderr);
    assert.equal(stdoutJson(r).path, `${dirs.volumes}/${newId}`);
    assert.equal(await treeHash(`${dirs.volumes}/${newId}`), hash);
  });
});

/** `zfs receive target < file`. */
async function receive(file: string, target: string): Promise<void> {
  const stream = await Deno.open(file);
  const child = new Deno.Command("zfs", {
    args: ["receive", target],
    stdin: "piped",
    stderr: "piped",
  }).spawn();
  await stream.readable.pipeTo(child.stdin);
  const out = await child.output();
  assert.equal(out.code, 0, new TextDecoder().decode(out.stderr));
}
