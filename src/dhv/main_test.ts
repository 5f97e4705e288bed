import assert from "node:assert/strict";
import { FakeRunner, fakeTools } from "../../tests/support/fake_runner.ts";
import { FakePool } from "../../tests/support/fake_pool.ts";
import { Logger } from "../log.ts";
import type { BackupOutcome } from "../replicate/backup.ts";
import { BackupScheduler } from "../replicate/scheduler.ts";
import { type DhvIo, runHostVolumeOperation } from "./main.ts";

const PARENT = "tank/nomad";
const PLUGIN_DIR = "/opt/nomad/data/host_volume_plugins";
const VOLUMES = "/opt/nomad/data/host_volumes";
const ID = "7b0e9c34-52f1-4c1e-9d7e-0a1b2c3d4e5f";
const OTHER_ID = "11111111-2222-3333-4444-555555555555";
const MIB = 1024 * 1024;
const DATASET = `${PARENT}/.host-default_pgdata`;
const VID = "org.zfs-csi:host-volume-id";
const VNS = "org.zfs-csi:host-namespace";

interface Run {
  readonly code: number;
  readonly stdout: string[];
  readonly logs: Record<string, unknown>[];
}

interface Harness {
  readonly runner: FakeRunner;
  readonly pool: FakePool;
  /** Config files by path. */
  readonly files: Map<string, string>;
  run(args: readonly string[], env: Record<string, string>): Promise<Run>;
}

/** A pool with the parent dataset, `zfs create` and `zfs mount` answered like zfs. */
function setup(): Harness {
  const runner = new FakeRunner();
  const pool = new FakePool(runner);
  pool.add("tank").add(PARENT, { "org.zfs-csi:managed": "yes" });
  runner.on(["zfs", "create"], (argv) => {
    const name = argv.at(-1)!;
    if (pool.has(name)) {
      return { code: 1, stderr: `cannot create '${name}': dataset already exists\n` };
    }
    const values: Record<string, string> = {};
    for (let i = 2; i < argv.length - 1; i += 2) {
      const kv = argv[i + 1]!;
      values[kv.slice(0, kv.indexOf("="))] = kv.slice(kv.indexOf("=") + 1);
    }
    pool.add(name, { ...values, mounted: "yes" });
    return {};
  });
  runner.on(["zfs", "mount"], (argv) => {
    pool.setValue(argv.at(-1)!, "mounted", "yes");
    return {};
  });
  const files = new Map([[`${PLUGIN_DIR}/zfs-csi.conf`, `--parent-dataset ${PARENT}\n`]]);
  return {
    runner,
    pool,
    files,
    async run(args, env) {
      const stdout: string[] = [];
      const logs: Record<string, unknown>[] = [];
      const io: DhvIo = {
        env: (n) => env[n],
        stdout: (t) => stdout.push(t),
        readTextFile: (path) => {
          const text = files.get(path);
          if (text === undefined) throw new Deno.errors.NotFound(`No such file: ${path}`);
          return text;
        },
        runner: () => runner,
        logSink: (line) => logs.push(JSON.parse(line)),
      };
      const code = await runHostVolumeOperation(args, io);
      return { code, stdout, logs };
    },
  };
}

/** Nomad's create environment, with `over` replacing (or, as undefined, removing) variables. */
function createEnv(over: Record<string, string | undefined> = {}): Record<string, string> {
  const env: Record<string, string | undefined> = {
    DHV_OPERATION: "create",
    DHV_VOLUMES_DIR: VOLUMES,
    DHV_PLUGIN_DIR: PLUGIN_DIR,
    DHV_NODE_POOL: "default",
    DHV_NAMESPACE: "default",
    DHV_VOLUME_NAME: "pgdata",
    DHV_VOLUME_ID: ID,
    DHV_CAPACITY_MIN_BYTES: String(10 * MIB),
    DHV_CAPACITY_MAX_BYTES: String(20 * MIB),
    DHV_NODE_ID: "5d1e4a2b-0000-4000-8000-000000000001",
    DHV_PARAMETERS: '{"compression":"lz4"}',
    ...over,
  };
  return Object.fromEntries(
    Object.entries(env).filter((e): e is [string, string] => e[1] !== undefined),
  );
}

/** Nomad's delete environment (no capacities; the created path). */
function deleteEnv(over: Record<string, string | undefined> = {}): Record<string, string> {
  return createEnv({
    DHV_OPERATION: "delete",
    DHV_CAPACITY_MIN_BYTES: undefined,
    DHV_CAPACITY_MAX_BYTES: undefined,
    DHV_CREATED_PATH: `${VOLUMES}/${ID}`,
    ...over,
  });
}

/** Asserts a failed call: its exit code, and the one `{"error"}` line with exactly `message`. */
function assertFailed(r: Run, code: number, message: string | RegExp): void {
  assert.equal(r.code, code, JSON.stringify(r));
  assert.equal(r.stdout.length, 1);
  const out = JSON.parse(r.stdout[0]!) as { error: string };
  assert.deepEqual(Object.keys(out), ["error"]);
  if (typeof message === "string") assert.equal(out.error, message);
  else assert.match(out.error, message);
  const logged = r.logs.find((l) => l.level === "error");
  assert.equal(logged?.exitCode, code, "the failure is logged on stderr with its exit code");
}

const argvOf = (h: Harness, verb: string) => h.runner.argvs.filter((a) => a[1] === verb);

Deno.test("fingerprint prints the version and nothing else, without config or zfs", async () => {
  const h = setup();
  const r = await h.run(["fingerprint"], { DHV_OPERATION: "fingerprint" });
  assert.equal(r.code, 0);
  assert.deepEqual(r.stdout, ['{"version":"0.1.0"}']);
  assert.deepEqual(h.runner.argvs, []);
});

Deno.test("an operation without DHV_OPERATION, or with another one, is refused with exit 2", async () => {
  const h = setup();
  assertFailed(
    await h.run(["fingerprint"], {}),
    2,
    "DHV_OPERATION is not set: this operation is meant to be run by Nomad as a dynamic host " +
      "volume plugin, which sets it",
  );
  assertFailed(
    await h.run(["create"], createEnv({ DHV_OPERATION: "delete" })),
    2,
    'DHV_OPERATION="delete" does not match the operation argument "create"',
  );
  assert.deepEqual(h.runner.argvs, []);
});

Deno.test("create with a variable missing exits 2 naming it, before any zfs call", async () => {
  const h = setup();
  for (const name of ["DHV_VOLUME_ID", "DHV_VOLUMES_DIR", "DHV_VOLUME_NAME", "DHV_NAMESPACE"]) {
    assertFailed(
      await h.run(["create"], createEnv({ [name]: undefined })),
      2,
      `${name} is not set: this operation is meant to be run by Nomad as a dynamic host ` +
        `volume plugin, which sets it`,
    );
  }
  assert.deepEqual(h.runner.argvs, []);
});

Deno.test("create refuses malformed variables with exit 2", async () => {
  const h = setup();
  assertFailed(
    await h.run(["create"], createEnv({ DHV_VOLUME_ID: "../etc" })),
    2,
    'DHV_VOLUME_ID="../etc" is not a volume id (letters, digits, "-" and "_")',
  );
  assertFailed(
    await h.run(["create"], createEnv({ DHV_VOLUMES_DIR: "/opt/nomad/../etc" })),
    2,
    'DHV_VOLUMES_DIR="/opt/nomad/../etc" is not an absolute, normalized directory',
  );
  assertFailed(
    await h.run(["create"], createEnv({ DHV_VOLUMES_DIR: "host_volumes" })),
    2,
    'DHV_VOLUMES_DIR="host_volumes" is not an absolute, normalized directory',
  );
  assertFailed(
    await h.run(["create"], createEnv({ DHV_NAMESPACE: "a_b" })),
    2,
    'DHV_NAMESPACE="a_b" is not a Nomad namespace name',
  );
  assertFailed(
    await h.run(["create"], createEnv({ DHV_CAPACITY_MIN_BYTES: "10GiB" })),
    2,
    'DHV_CAPACITY_MIN_BYTES="10GiB" is not a number of bytes',
  );
  assert.deepEqual(h.runner.argvs, []);
});

Deno.test("create refuses bad JSON parameters with exit 2", async () => {
  const h = setup();
  assertFailed(
    await h.run(["create"], createEnv({ DHV_PARAMETERS: '{"compression":' })),
    2,
    /^DHV_PARAMETERS is not valid JSON: /,
  );
  assertFailed(
    await h.run(["create"], createEnv({ DHV_PARAMETERS: '["lz4"]' })),
    2,
    'DHV_PARAMETERS must be a JSON object of strings, not ["lz4"]',
  );
  assertFailed(
    await h.run(["create"], createEnv({ DHV_PARAMETERS: '{"recordsize":128}' })),
    2,
    'DHV_PARAMETERS: parameter "recordsize" must be a string, not 128',
  );
  assert.deepEqual(h.runner.argvs, []);
});

Deno.test("create refuses parameters outside the allowlist and the operator's policy (exit 2)", async () => {
  const h = setup();
  assertFailed(
    await h.run(["create"], createEnv({ DHV_PARAMETERS: '{"sharenfs":"on"}' })),
    2,
    'Parameter "sharenfs" is not supported; use ZFS properties such as compression, ' +
      "recordsize, atime, quota or a user property (module:name)",
  );
  h.files.set(
    `${PLUGIN_DIR}/zfs-csi.conf`,
    `--parent-dataset ${PARENT}\n--deny-parameter compression\n`,
  );
  const r = await h.run(["create"], createEnv());
  assertFailed(
    r,
    2,
    'Parameter compression="lz4" is not allowed on this node: the operator refuses it ' +
      "(--deny-parameter compression)",
  );
  assert.deepEqual(h.runner.argvs, []);
});

Deno.test("create with a capacity below the smallest volume exits 2", async () => {
  const h = setup();
  assertFailed(
    await h.run(
      ["create"],
      createEnv({ DHV_CAPACITY_MIN_BYTES: "0", DHV_CAPACITY_MAX_BYTES: "4096" }),
    ),
    2,
    "capacity_max (4096 bytes) is below the smallest volume, 1048576 bytes (1MiB)",
  );
  assertFailed(
    await h.run(
      ["create"],
      createEnv({ DHV_CAPACITY_MIN_BYTES: "3000000", DHV_CAPACITY_MAX_BYTES: "2000000" }),
    ),
    2,
    "capacity_min (3000000 bytes) is above capacity_max (2000000 bytes)",
  );
  assert.deepEqual(h.runner.argvs, []);
});

Deno.test("create without a config exits 2 saying where the flags go", async () => {
  const h = setup();
  h.files.clear();
  assertFailed(
    await h.run(["create"], createEnv()),
    2,
    `Cannot read the host volume plugin's flags from "${PLUGIN_DIR}/zfs-csi.conf": it does not ` +
      `exist. Put the server's flags there, one per line (at least --parent-dataset POOL/DATASET)`,
  );
  h.files.set(`${PLUGIN_DIR}/zfs-csi.conf`, "--log-level debug\n");
  assertFailed(
    await h.run(["create"], createEnv()),
    2,
    `Flags from ${PLUGIN_DIR}/zfs-csi.conf: Missing required flag --parent-dataset (for example ` +
      `tank/nomad)`,
  );
});

Deno.test("create makes the dataset, mounted at <volumes dir>/<id>, and prints path and bytes", async () => {
  const h = setup();
  const r = await h.run(["create"], createEnv());
  assert.equal(r.code, 0, JSON.stringify(r));
  assert.deepEqual(r.stdout, [JSON.stringify({ path: `${VOLUMES}/${ID}`, bytes: 10 * MIB })]);
  assert.deepEqual(argvOf(h, "create"), [[
    "zfs",
    "create",
    ...["-o", "compression=lz4"],
    ...["-o", `mountpoint=${VOLUMES}/${ID}`],
    ...["-o", "org.zfs-csi:host-namespace=default"],
    ...["-o", `org.zfs-csi:host-volume-id=${ID}`],
    ...["-o", "org.zfs-csi:managed=yes"],
    ...["-o", "org.zfs-csi:name=pgdata"],
    ...["-o", 'org.zfs-csi:parameters={"compression":"lz4"}'],
    ...["-o", `refquota=${10 * MIB}`],
    DATASET,
  ]]);
  h.runner.assertNoUnexpected();
});

Deno.test("create with no capacity makes an unlimited volume (bytes 0); a tiny one gets 1MiB", async () => {
  const h = setup();
  const none = await h.run(
    ["create"],
    createEnv({ DHV_CAPACITY_MIN_BYTES: "0", DHV_CAPACITY_MAX_BYTES: "0" }),
  );
  assert.deepEqual(none.stdout, [JSON.stringify({ path: `${VOLUMES}/${ID}`, bytes: 0 })]);
  assert.equal(h.pool.value(DATASET, "refquota"), undefined);
  const tiny = await h.run(
    ["create"],
    createEnv({
      DHV_VOLUME_NAME: "tiny",
      DHV_VOLUME_ID: OTHER_ID,
      DHV_CAPACITY_MIN_BYTES: "1000",
      DHV_CAPACITY_MAX_BYTES: "0",
    }),
  );
  assert.deepEqual(tiny.stdout, [JSON.stringify({ path: `${VOLUMES}/${OTHER_ID}`, bytes: MIB })]);
});

Deno.test("create again for the same volume id changes nothing and answers the same", async () => {
  const h = setup();
  const first = await h.run(["create"], createEnv());
  const calls = h.runner.argvs.length;
  const again = await h.run(["create"], createEnv());
  assert.equal(again.code, 0);
  assert.deepEqual(again.stdout, first.stdout);
  const later = h.runner.argvs.slice(calls);
  assert.deepEqual(later.filter((a) => a[1] !== "get"), [], "only reads");
});

Deno.test("create again after a reboot mounts the volume again", async () => {
  const h = setup();
  await h.run(["create"], createEnv());
  h.pool.setValue(DATASET, "mounted", "no");
  const r = await h.run(["create"], createEnv());
  assert.equal(r.code, 0);
  assert.deepEqual(argvOf(h, "mount"), [["zfs", "mount", DATASET]]);
  assert.equal(h.pool.value(DATASET, "mounted"), "yes");
});

Deno.test("create with a larger capacity raises refquota; a smaller capacity_max is refused", async () => {
  const h = setup();
  await h.run(["create"], createEnv());
  const grown = await h.run(
    ["create"],
    createEnv({ DHV_CAPACITY_MIN_BYTES: String(30 * MIB), DHV_CAPACITY_MAX_BYTES: "0" }),
  );
  assert.equal(grown.code, 0, JSON.stringify(grown));
  assert.deepEqual(grown.stdout, [JSON.stringify({ path: `${VOLUMES}/${ID}`, bytes: 30 * MIB })]);
  assert.deepEqual(argvOf(h, "set"), [["zfs", "set", `refquota=${30 * MIB}`, DATASET]]);
  assertFailed(
    await h.run(
      ["create"],
      createEnv({
        DHV_CAPACITY_MIN_BYTES: String(5 * MIB),
        DHV_CAPACITY_MAX_BYTES: String(8 * MIB),
      }),
    ),
    2,
    `Volume "${ID}" has ${30 * MIB} bytes; shrinking to ${8 * MIB} is not supported`,
  );
  assert.equal(h.pool.value(DATASET, "refquota"), String(30 * MIB));
});

Deno.test("create refuses other parameters for an existing volume (exit 2)", async () => {
  const h = setup();
  await h.run(["create"], createEnv());
  assertFailed(
    await h.run(["create"], createEnv({ DHV_PARAMETERS: '{"compression":"off"}' })),
    2,
    `Host volume "${ID}" was created with parameters {"compression":"lz4"}; they cannot change ` +
      `(asked: {"compression":"off"})`,
  );
});

Deno.test("the same name in two namespaces gets two datasets", async () => {
  const h = setup();
  await h.run(["create"], createEnv());
  const r = await h.run(["create"], createEnv({ DHV_NAMESPACE: "prod", DHV_VOLUME_ID: OTHER_ID }));
  assert.equal(r.code, 0, JSON.stringify(r));
  assert.equal(h.pool.value(DATASET, VID), ID);
  assert.equal(h.pool.value(`${PARENT}/.host-prod_pgdata`, VID), OTHER_ID);
  assert.equal(h.pool.value(`${PARENT}/.host-prod_pgdata`, VNS), "prod");
});

Deno.test("create of a name whose dataset belongs to another volume id is refused (exit 1)", async () => {
  const h = setup();
  await h.run(["create"], createEnv());
  assertFailed(
    await h.run(["create"], createEnv({ DHV_VOLUME_ID: OTHER_ID })),
    1,
    `Host volume "pgdata" in namespace "default" already exists as dataset "${DATASET}", for ` +
      `another volume id ("${ID}", not "${OTHER_ID}"). Delete that volume in Nomad first, or, to ` +
      `hand this dataset to the new volume (e.g. after undoing a delete), run ` +
      `"zfs set ${VID}=${OTHER_ID} ${DATASET}"`,
  );
});

Deno.test("create never takes a dataset made another way (exit 1)", async () => {
  const h = setup();
  // Foreign: no marker.
  h.pool.add(DATASET);
  assertFailed(
    await h.run(["create"], createEnv()),
    1,
    `Dataset "${DATASET}" exists but is not managed by zfs-csi; to hand it over, run ` +
      `"zfs set org.zfs-csi:managed=yes ${DATASET}"`,
  );
  // Ours, but not a host volume: no volume id recorded.
  h.pool.setValue(DATASET, "org.zfs-csi:managed", "yes");
  assertFailed(
    await h.run(["create"], createEnv()),
    1,
    `Dataset "${DATASET}" is not a host volume (it has no ${VID}); zfs-csi never hands a ` +
      `dataset made another way to a host volume`,
  );
  // An inherited volume id is not the dataset's own.
  h.pool.setValue(DATASET, VID, [ID, `inherited from ${PARENT}`]);
  assertFailed(await h.run(["create"], createEnv()), 1, /is not a host volume/);
  assert.deepEqual(argvOf(h, "create"), []);
  assert.deepEqual(argvOf(h, "set"), []);
});

Deno.test("flags after the operation replace the config file", async () => {
  const h = setup();
  h.files.clear();
  h.pool.add("tank/other", { "org.zfs-csi:managed": "yes" });
  const r = await h.run(["create", "--parent-dataset", "tank/other"], createEnv());
  assert.equal(r.code, 0, JSON.stringify(r));
  assert.equal(h.pool.value(`tank/other/.host-default_pgdata`, VID), ID);
});

Deno.test("delete sets the dataset aside, marked for the purge, and is idempotent", async () => {
  const h = setup();
  await h.run(["create"], createEnv());
  const r = await h.run(["delete"], deleteEnv());
  assert.equal(r.code, 0, JSON.stringify(r));
  assert.deepEqual(r.stdout, []);
  assert.ok(!h.pool.has(DATASET));
  const hidden = h.pool.names().filter((n) => n.startsWith(`${PARENT}/.deleted-`));
  assert.equal(hidden.length, 1);
  assert.match(hidden[0]!, /^tank\/nomad\/\.deleted-\d+-\.host-default_pgdata$/);
  assert.equal(h.pool.value(hidden[0]!, "org.zfs-csi:deleted-name"), DATASET);
  assert.equal(h.pool.value(hidden[0]!, "canmount"), "noauto");
  const setAside = r.logs.find((l) => l.msg === "host volume set aside");
  assert.equal(
    setAside?.undo,
    `zfs rename ${hidden[0]} ${DATASET} && zfs set canmount=on ${DATASET}, then nomad volume ` +
      `create the same spec and follow what it says about the volume id`,
  );
  const again = await h.run(["delete"], deleteEnv());
  assert.equal(again.code, 0);
  assert.deepEqual(h.pool.names().filter((n) => n.startsWith(`${PARENT}/.deleted-`)), hidden);
  assert.equal(argvOf(h, "destroy").length, 0, "nothing destroyed");
});

Deno.test("delete with DHV_CREATED_PATH = the volumes dir and no name finds the volume by id", async () => {
  const h = setup();
  await h.run(["create"], createEnv());
  // What Nomad sends after it failed to save a first create: no name, no namespace.
  const r = await h.run(
    ["delete"],
    deleteEnv({ DHV_CREATED_PATH: VOLUMES, DHV_VOLUME_NAME: "", DHV_NAMESPACE: "" }),
  );
  assert.equal(r.code, 0, JSON.stringify(r));
  assert.ok(!h.pool.has(DATASET));
  assert.ok(
    r.logs.some((l) =>
      l.msg === "DHV_CREATED_PATH is not the volume's path; deleting by volume id"
    ),
  );
  // Nothing was done to the volumes dir: zfs was only ever given dataset names.
  assert.ok(h.runner.argvs.every((a) => !a.includes(VOLUMES)));
});

Deno.test("delete leaves another volume id's dataset of the same name alone", async () => {
  const h = setup();
  await h.run(["create"], createEnv());
  const r = await h.run(["delete"], deleteEnv({ DHV_VOLUME_ID: OTHER_ID }));
  assert.equal(r.code, 0);
  assert.equal(h.pool.value(DATASET, VID), ID);
  assert.deepEqual(argvOf(h, "rename"), []);
});

Deno.test("delete refuses a volume holding a snapshot zfs-csi did not make (exit 1)", async () => {
  const h = setup();
  await h.run(["create"], createEnv());
  h.pool.add(`${DATASET}@manual`);
  assertFailed(
    await h.run(["delete"], deleteEnv()),
    1,
    `Host volume "${ID}" is not deleted: it holds what zfs-csi did not make, which it never ` +
      `destroys: snapshot "${DATASET}@manual", not made by zfs-csi: destroy it ("zfs destroy ` +
      `${DATASET}@manual") and stop the tool that takes it (sanoid, zrepl, ...) from ` +
      `snapshotting this dataset`,
  );
  assert.ok(h.pool.has(DATASET));
});

Deno.test("delete without DHV_VOLUME_ID exits 2", async () => {
  const h = setup();
  assertFailed(
    await h.run(["delete"], deleteEnv({ DHV_VOLUME_ID: undefined })),
    2,
    "DHV_VOLUME_ID is not set: this operation is meant to be run by Nomad as a dynamic host " +
      "volume plugin, which sets it",
  );
});

/** The config file with a directory store (and `extra` flags). */
function withStore(h: Harness, dir: string, extra = ""): void {
  h.files.set(
    `${PLUGIN_DIR}/zfs-csi.conf`,
    `--parent-dataset ${PARENT}\n--store file://${dir}\n${extra}`,
  );
}

Deno.test("create records backup_interval and backup_keep as CreateVolume does, with a store", async () => {
  const h = setup();
  withStore(h, "/tmp/zfs-csi-dhv-unused-store");
  const r = await h.run(
    ["create"],
    createEnv({ DHV_PARAMETERS: '{"backup_interval":"5s","backup_keep":"last=3,daily=7"}' }),
  );
  assert.equal(r.code, 0, JSON.stringify(r));
  assert.equal(h.pool.value(DATASET, "org.zfs-csi:backup-interval"), "5");
  assert.equal(
    h.pool.value(DATASET, "org.zfs-csi:backup-keep"),
    "last=3,hourly=0,daily=7,weekly=0",
  );
  assert.equal(
    h.pool.value(DATASET, "org.zfs-csi:parameters"),
    '{"backup_interval":"5s","backup_keep":"last=3,daily=7"}',
  );
  // A volume that names no interval gets none of its own: the node plugin's --backup-interval
  // applies to it, whatever that is when it backs up. Its own 0 turns backups off for good.
  withStore(h, "/tmp/zfs-csi-dhv-unused-store", "--backup-interval 1h\n");
  const other = `${PARENT}/.host-default_logs`;
  const env = { DHV_VOLUME_ID: OTHER_ID, DHV_VOLUME_NAME: "logs", DHV_PARAMETERS: "{}" };
  assert.equal((await h.run(["create"], createEnv(env))).code, 0);
  assert.equal(h.pool.value(other, "org.zfs-csi:backup-interval"), undefined);
  assert.equal(h.pool.value(other, "org.zfs-csi:backup-keep"), undefined);
  const off = { ...env, DHV_VOLUME_ID: ID.replace("7b", "8c"), DHV_VOLUME_NAME: "scratch" };
  off.DHV_PARAMETERS = '{"backup_interval":"0"}';
  assert.equal((await h.run(["create"], createEnv(off))).code, 0);
  assert.equal(h.pool.value(`${PARENT}/.host-default_scratch`, "org.zfs-csi:backup-interval"), "0");
});

Deno.test("a host volume created under --backup-interval 1h is backed up every 15m once the node plugin runs with 15m", async () => {
  const h = setup();
  withStore(h, "/tmp/zfs-csi-dhv-unused-store", "--backup-interval 1h\n");
  assert.equal((await h.run(["create"], createEnv({ DHV_PARAMETERS: "{}" }))).code, 0);
  const start = Date.UTC(2026, 0, 1);
  const clock = { ms: start };
  const backups: number[] = [];
  const log = new Logger("error", {}, () => {});
  const scheduler = new BackupScheduler({
    zfs: fakeTools(h.runner, log).zfs,
    parentDataset: PARENT,
    log,
    backup: (dataset) => {
      assert.equal(dataset, DATASET);
      backups.push((clock.ms - start) / 60_000);
      h.pool.setValue(dataset, "org.zfs-csi:backup-last", String(Math.floor(clock.ms / 1000)));
      return Promise.resolve({ status: "stored" } as unknown as BackupOutcome);
    },
    // The node plugin's --backup-interval 15m.
    defaultIntervalSeconds: 900,
    now: () => clock.ms,
    monotonic: () => clock.ms,
  });
  for (let minutes = 0; minutes <= 60; minutes += 5) {
    await scheduler.tick();
    clock.ms += 5 * 60_000;
  }
  assert.deepEqual(backups, [0, 15, 30, 45, 60], "minutes after the node plugin's restart");
  await scheduler.stop();
});

Deno.test("create refuses backup parameters without a store, and the operator's policy applies", async () => {
  const h = setup();
  assertFailed(
    await h.run(["create"], createEnv({ DHV_PARAMETERS: '{"backup_interval":"1h"}' })),
    2,
    "Parameters backup_interval and backup_keep need a store, and the host volume plugin's " +
      "config has none (add --store to zfs-csi.conf, the same as the zfs-csi node plugin's on " +
      "this node)",
  );
  assertFailed(
    await h.run(["create"], createEnv({ DHV_PARAMETERS: '{"backup_interval":"often"}' })),
    2,
    /backup_interval/,
  );
  withStore(h, "/tmp/zfs-csi-dhv-unused-store", "--deny-parameter backup_keep\n");
  assertFailed(
    await h.run(["create"], createEnv({ DHV_PARAMETERS: '{"backup_keep":"last=1"}' })),
    2,
    /backup_keep.*not allowed on this node/,
  );
  assert.deepEqual(argvOf(h, "create"), [], "nothing created");
  // Without a store and without backup parameters, nothing is recorded.
  h.files.set(`${PLUGIN_DIR}/zfs-csi.conf`, `--parent-dataset ${PARENT}\n`);
  assert.equal((await h.run(["create"], createEnv())).code, 0);
  assert.equal(h.pool.value(DATASET, "org.zfs-csi:backup-interval"), undefined);
});

Deno.test("delete with a store marks the volume's store record deleted, and only its own uid", async () => {
  const dir = await Deno.makeTempDir({ prefix: "zfs-csi-dhv-store-" });
  try {
    const h = setup();
    withStore(h, dir);
    assert.equal((await h.run(["create"], createEnv())).code, 0);
    const uid = "0123456789abcdef0123456789abcdef";
    h.pool.setValue(DATASET, "org.zfs-csi:store-uid", uid);
    const recordPath = `${dir}/v1/volumes/:2ehost-default_pgdata/volume.json`;
    await Deno.mkdir(recordPath.slice(0, recordPath.lastIndexOf("/")), { recursive: true });
    const record = {
      format: 1,
      name: ".host-default_pgdata",
      uid,
      createdAt: "2026-01-01T00:00:00.000Z",
      capacityBytes: 10 * MIB,
      parameters: {},
      node: "n1",
    };
    await Deno.writeTextFile(recordPath, JSON.stringify(record));
    const r = await h.run(["delete"], deleteEnv());
    assert.equal(r.code, 0, JSON.stringify(r));
    const marked = JSON.parse(await Deno.readTextFile(recordPath));
    assert.match(marked.deletedAt, /^\d{4}-\d\d-\d\dT/);
    assert.equal(marked.uid, uid);
    assert.ok(
      r.logs.some((l) =>
        l.msg === "host volume's backups kept in the store for its deleted retention"
      ),
    );
    // Another volume of the same name (another uid) leaves that record alone.
    assert.equal((await h.run(["create"], createEnv())).code, 0);
    h.pool.setValue(DATASET, "org.zfs-csi:store-uid", "f".repeat(32));
    await Deno.writeTextFile(recordPath, JSON.stringify(record));
    assert.equal((await h.run(["delete"], deleteEnv())).code, 0);
    assert.equal(JSON.parse(await Deno.readTextFile(recordPath)).deletedAt, undefined);
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
});
