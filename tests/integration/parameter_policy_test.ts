/**
 * The operator's parameter policy, end to end: the plugin as its own process (production
 * permission flags) on a real pool, started with and without --allow-parameter,
 * --deny-parameter and --key-dir. A refused CreateVolume leaves the pool as it was and runs no
 * zfs command (the plugin logs every argv at debug); an allowed one sets the property.
 *
 * zfs-fuse cannot show: an encrypted volume whose key file lies below --key-dir being created
 * (it has no encryption; here that create is refused as needing OpenZFS, after the policy let
 * it through). The OpenZFS VM run shows it.
 */

import assert from "node:assert/strict";
import { Code } from "../../src/errors.ts";
import { createVolumeRequest, mountCapability } from "../support/nomad.ts";
import { rejects } from "../support/csi_client.ts";
import { PluginProcess } from "../support/plugin_process.ts";
import { poolState, sh, TestPool } from "../support/zfs_pool.ts";

/** Every property set locally anywhere in the pool: an injected one shows up here. */
async function localProperties(pool: TestPool): Promise<string> {
  return await sh(
    "zfs",
    "get",
    "-Hp",
    "-r",
    "-s",
    "local",
    "-o",
    "name,property,value",
    "all",
    pool.pool,
  );
}

/**
 * The pool's datasets with their properties and mounts (poolState), and every locally set
 * property. Other tests on this machine mount and unmount meanwhile: only lines about this
 * pool or its directory are compared.
 */
async function ourState(pool: TestPool): Promise<string[]> {
  const ours = (line: string) =>
    new RegExp(`^${pool.pool}[\t /@]`).test(line) || line.includes(`${pool.dir}/`);
  const text = (await poolState(pool)) + "\n" + (await localProperties(pool));
  return text.split("\n").filter((l) => l !== "" && ours(l));
}

/** The zfs argvs the plugin logged (at debug, every one it runs). */
function zfsArgvs(plugin: PluginProcess): string[][] {
  return plugin.records()
    .filter((r) => r.msg === "exec" && Array.isArray(r.argv))
    .map((r) => (r.argv as unknown[]).map(String));
}

/**
 * Waits until the plugin's start-up purge (src/volume/trash.ts, begun once the first Probe is
 * answered) has listed the parent, and then until the plugin has started no command for 300 ms:
 * a purge still running would count as commands of the refused call that follows (it did once
 * in CI).
 */
async function startupPurgeDone(plugin: PluginProcess): Promise<void> {
  const deadline = Date.now() + 20_000;
  const execs = () => plugin.records().filter((r) => r.msg === "exec").length;
  const listed = () =>
    plugin.records().some((r) =>
      r.msg === "exec done" && Array.isArray(r.argv) &&
      r.argv.some((a) => String(a).includes(":deleted-at"))
    );
  let seen = -1;
  for (;;) {
    const now = execs();
    if (listed() && now === seen) return;
    if (Date.now() > deadline) throw new Error("the plugin's start-up purge did not end in 20 s");
    seen = now;
    await new Promise((r) => setTimeout(r, 300));
  }
}

/** Asserts that `create` is refused with INVALID_ARGUMENT and `message`, touching nothing. */
async function assertRefusedUntouched(
  pool: TestPool,
  plugin: PluginProcess,
  name: string,
  parameters: Record<string, string>,
  message: RegExp,
): Promise<void> {
  await startupPurgeDone(plugin);
  const before = await ourState(pool);
  assert.ok(before.some((l) => l.startsWith(`${pool.parent}\t`)), "the state lists the parent");
  const ran = zfsArgvs(plugin).length;
  const details = await rejects(
    plugin.client.controller("CreateVolume", createVolumeRequest(name, { parameters })),
    Code.INVALID_ARGUMENT,
  );
  assert.match(details, message, JSON.stringify(parameters));
  assert.deepEqual(
    zfsArgvs(plugin).slice(ran),
    [],
    `no zfs command for ${JSON.stringify(parameters)}`,
  );
  assert.deepEqual(await ourState(pool), before, "the pool");
  assert.equal((await pool.datasets()).includes(`${pool.parent}/${name}`), false);
}

Deno.test("parameter policy: the defaults refuse what loosens the parent or costs the pool, before zfs", async () => {
  await using pool = await TestPool.create();
  // The operator's choice on the parent, which a volume must not undo on its own mount.
  await sh("zfs", "set", "setuid=off", pool.parent);
  await sh("zfs", "set", "devices=off", pool.parent);
  await sh("zfs", "set", "exec=off", pool.parent);
  await using plugin = await PluginProcess.start({ parentDataset: pool.parent, dir: pool.dir });
  await Deno.writeTextFile(`${pool.dir}/stolen.key`, "0123456789abcdef".repeat(4));
  const refused: ReadonlyArray<readonly [Record<string, string>, RegExp]> = [
    [
      { setuid: "on" },
      /^Parameter setuid="on" is not allowed on this node: .*--allow-parameter setuid=on$/,
    ],
    [{ devices: "on" }, /devices="on" .*--allow-parameter devices=on$/],
    [{ exec: "on", compression: "lz4" }, /exec="on" .*--allow-parameter exec=on$/],
    [{ dedup: "on" }, /dedup="on" .*whole pool.*--allow-parameter dedup=on$/],
    [{ snapdir: "visible" }, /snapdir="visible" .*--allow-parameter snapdir=visible$/],
    [{ "com.sun:auto-snapshot": "true" }, /com.sun:auto-snapshot="true" .*zfs-auto-snapshot/],
    [
      { encryption: "on", keyformat: "hex", keylocation: `file://${pool.dir}/stolen.key` },
      /keylocation=.* key locations are refused unless the operator gives --key-dir DIR/,
    ],
    [
      { encryption: "on", keyformat: "hex", keylocation: "https://127.0.0.1:9/k" },
      /--allow-parameter keylocation=https:\/\/127\.0\.0\.1:9\/k$/,
    ],
  ];
  for (const [parameters, message] of refused) {
    await assertRefusedUntouched(pool, plugin, "loose", parameters, message);
  }
  // GetCapacity judges parameters the same way, and also before zfs.
  const ran = zfsArgvs(plugin).length;
  await rejects(
    plugin.client.controller("GetCapacity", { parameters: { setuid: "on" } }),
    Code.INVALID_ARGUMENT,
  );
  assert.deepEqual(zfsArgvs(plugin).slice(ran), []);

  // "off" never loosens: accepted, and set on the dataset.
  await plugin.client.controller(
    "CreateVolume",
    createVolumeRequest("tight", {
      parameters: { setuid: "off", devices: "off", exec: "off", dedup: "off" },
    }),
  );
  const ds = `${pool.parent}/tight`;
  // The log shows the commands run, so an empty list above means none ran.
  assert.ok(zfsArgvs(plugin).some((a) => a[1] === "create" && a.at(-1) === ds));
  for (const p of ["setuid", "devices", "exec", "dedup"]) {
    assert.equal(await pool.get(ds, p), "off", p);
  }
});

Deno.test("parameter policy: what the operator allows is set, and the rest stays refused", async () => {
  await using pool = await TestPool.create();
  await sh("zfs", "set", "setuid=off", pool.parent);
  await using plugin = await PluginProcess.start({
    parentDataset: pool.parent,
    dir: pool.dir,
    extraArgs: [
      "--allow-parameter",
      "setuid=on",
      "--allow-parameter",
      "dedup=on|off",
      "--allow-parameter",
      "com.sun:*=*",
      "--deny-parameter",
      "compression",
    ],
  });
  const c = plugin.client;
  await c.controller(
    "CreateVolume",
    createVolumeRequest("trusted", {
      parameters: { setuid: "on", dedup: "on", "com.sun:auto-snapshot": "true" },
    }),
  );
  const ds = `${pool.parent}/trusted`;
  assert.equal(await pool.get(ds, "setuid"), "on");
  assert.equal(await pool.get(ds, "dedup"), "on");
  assert.equal(await pool.get(ds, "com.sun:auto-snapshot"), "true");
  // ValidateVolumeCapabilities confirms what the policy allows, and not what it refuses.
  const validate = (parameters: Record<string, string>) =>
    c.controller("ValidateVolumeCapabilities", {
      volume_id: "trusted@node-a",
      volume_capabilities: [mountCapability()],
      parameters,
    });
  assert.deepEqual((await validate({ setuid: "on" })).confirmed.parameters, { setuid: "on" });
  const denied = await validate({ compression: "lz4" });
  assert.equal(denied.confirmed, null);
  assert.match(denied.message, /compression="lz4" .*\(--deny-parameter compression\)/);

  // The operator's list replaces the default for setuid; others keep theirs.
  await assertRefusedUntouched(pool, plugin, "other", { setuid: "off" }, /may only use "on"/);
  await assertRefusedUntouched(pool, plugin, "other", { exec: "on" }, /exec="on" .* by default/);
  await assertRefusedUntouched(
    pool,
    plugin,
    "other",
    { compression: "lz4" },
    /^Parameter compression="lz4" is not allowed on this node: the operator refuses it \(--deny-parameter compression\)$/,
  );
});

Deno.test("parameter policy: --key-dir lets key files below it through, and nothing else", async () => {
  await using pool = await TestPool.create();
  const keyDir = `${pool.dir}/keys`;
  await Deno.mkdir(keyDir);
  await Deno.writeTextFile(`${keyDir}/v.key`, "0123456789abcdef".repeat(4));
  await Deno.writeTextFile(`${pool.dir}/outside.key`, "fedcba9876543210".repeat(4));
  await using plugin = await PluginProcess.start({
    parentDataset: pool.parent,
    dir: pool.dir,
    extraArgs: ["--key-dir", keyDir],
  });
  const keyed = (keylocation: string) => ({ encryption: "on", keyformat: "hex", keylocation });
  for (const outside of [`file://${pool.dir}/outside.key`, `file://${keyDir}/../outside.key`]) {
    await assertRefusedUntouched(
      pool,
      plugin,
      "enc",
      keyed(outside),
      new RegExp(`key locations must be files below --key-dir "${keyDir}"`),
    );
  }
  const probe = await sh("zfs", "get", "-H", "-o", "value", "encryption", pool.parent).catch(
    () => undefined,
  );
  const inside = keyed(`file://${keyDir}/v.key`);
  if (probe === undefined) {
    // zfs-fuse: the policy lets the key through; this zfs then refuses encryption itself.
    const details = await rejects(
      plugin.client.controller("CreateVolume", createVolumeRequest("enc", { parameters: inside })),
      Code.INVALID_ARGUMENT,
    );
    assert.match(details, /needs OpenZFS/);
    return;
  }
  await plugin.client.controller(
    "CreateVolume",
    createVolumeRequest("enc", { parameters: inside }),
  );
  const ds = `${pool.parent}/enc`;
  assert.equal(await pool.get(ds, "keylocation"), `file://${keyDir}/v.key`);
  assert.equal(await pool.get(ds, "keystatus"), "available");
});

Deno.test("parameter policy: a flag naming an unknown parameter stops the plugin at start", async () => {
  await using pool = await TestPool.create();
  for (
    const [args, message] of [
      [["--allow-parameter", "mountpoint=/etc"], /"mountpoint" is not a parameter zfs-csi accepts/],
      [["--allow-parameter", "setuid=yes"], /is not a value zfs accepts for setuid/],
      [["--deny-parameter", "sharenfs"], /"sharenfs" is not a parameter/],
      [["--key-dir", "/"], /--key-dir must not be "\/"/],
    ] as const
  ) {
    const plugin = await PluginProcess.start({
      parentDataset: pool.parent,
      dir: pool.dir,
      extraArgs: args,
      waitReady: false,
    });
    const status = await plugin.status;
    await plugin.stop();
    assert.equal(status.code, 2, args.join(" "));
    const lines = plugin.logs();
    assert.equal(lines.length, 1, lines.join("\n"));
    assert.match(lines[0]!, /^zfs-csi: --/);
    assert.match(lines[0]!, message);
  }
});
