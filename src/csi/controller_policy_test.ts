/**
 * The controller applies the operator's parameter policy (--allow-parameter, --deny-parameter,
 * --key-dir) at every call that takes parameters, before any zfs command: CreateVolume (plain
 * and clone), ValidateVolumeCapabilities and GetCapacity. Parameters recorded on a volume are
 * read back whatever the policy says now.
 */

import assert from "node:assert/strict";
import { Code } from "../errors.ts";
import { assertRejectsCsi } from "../../tests/support/assert_errors.ts";
import {
  fakeController,
  type FakeServices,
  fakeServices,
  fsCap,
} from "../../tests/support/service_harness.ts";
import { FakeRunner } from "../../tests/support/fake_runner.ts";
import { FakePool } from "../../tests/support/fake_pool.ts";
import { parseConfig } from "../config.ts";
import type { BackupOutcome } from "../replicate/backup.ts";
import { BackupScheduler } from "../replicate/scheduler.ts";
import { zfsArgv } from "../../tests/support/zfs_argv.ts";
import { ControllerService } from "./controller.ts";
import { Trash } from "./trash.ts";
import type { CreateVolumeRequest } from "./types.ts";

const PARENT = "tank/nomad";
const MiB = 1024 * 1024;
const zfs = zfsArgv("zfs");

interface Harness extends FakeServices<FakeRunner> {
  readonly controller: ControllerService;
}

/** A controller on a runner that answers only what a test scripts, with `flags` added. */
function setup(flags: readonly string[] = []): Harness {
  const parts = fakeServices({ parent: PARENT, flags, host: (runner) => runner });
  const { config, zfs, mounter, health, locks, log } = parts;
  const trash = new Trash({
    zfs,
    parentDataset: PARENT,
    retentionSeconds: config.deletedRetentionSeconds,
    locks,
    log,
  });
  return {
    ...parts,
    controller: new ControllerService({ config, zfs, mounter, health, locks, trash, log }),
  };
}

function createReq(name: string, over: Partial<CreateVolumeRequest> = {}): CreateVolumeRequest {
  return {
    name,
    capacity_range: { required_bytes: String(64 * MiB), limit_bytes: "0" },
    volume_capabilities: [fsCap()],
    parameters: {},
    secrets: {},
    volume_content_source: null,
    accessibility_requirements: null,
    mutable_parameters: {},
    ...over,
  };
}

/** `zfs get -Hp` output of one managed volume with these properties. */
function volumeProps(dataset: string, props: Record<string, string>): string {
  const all: Record<string, [string, string]> = {
    type: ["filesystem", "-"],
    creation: ["1700000000", "-"],
    referenced: ["24576", "-"],
    "org.zfs-csi:managed": ["yes", "local"],
    mountpoint: [`/${dataset}`, "default"],
    ...Object.fromEntries(Object.entries(props).map(([k, v]) => [k, [v, "local"]])),
  };
  return Object.entries(all).map(([k, [v, s]]) => `${dataset}\t${k}\t${v}\t${s}\n`).join("");
}

/** The `-o` values of a `zfs create` argv. */
function createOptions(argv: readonly string[]): string[] {
  return argv.flatMap((a, i) => (argv[i - 1] === "-o" ? [a] : []));
}

/** Parameters the default policy refuses, one kind of loosening or cost each. */
const REFUSED_BY_DEFAULT: ReadonlyArray<Record<string, string>> = [
  { setuid: "on" },
  { devices: "on" },
  { exec: "on" },
  { dedup: "on" },
  { snapdir: "visible" },
  { special_small_blocks: "128K" },
  { encryption: "on", keyformat: "passphrase", keylocation: "file:///etc/shadow" },
  { encryption: "on", keyformat: "raw", keylocation: "https://attacker.example/k" },
  { "com.sun:auto-snapshot": "true" },
  { "org.openzfs.systemd:wanted-by": "multi-user.target" },
];

Deno.test("ControllerService.CreateVolume refuses what the default policy refuses, before any zfs command", async () => {
  const h = setup();
  for (const parameters of REFUSED_BY_DEFAULT) {
    const label = JSON.stringify(parameters);
    await assertRejectsCsi(
      h.controller.CreateVolume(createReq("v1", { parameters })),
      Code.INVALID_ARGUMENT,
      /^Parameter \S+="[^"]*" is not allowed on this node: .*--allow-parameter /,
      label,
    );
    // A clone takes the same parameters, and is refused before it looks at its source.
    await assertRejectsCsi(
      h.controller.CreateVolume(
        createReq("v2", { parameters, volume_content_source: { volume: { volume_id: "v1" } } }),
      ),
      Code.INVALID_ARGUMENT,
      /is not allowed on this node/,
      label,
    );
  }
  assert.deepEqual(h.runner.argvs, [], "no zfs command for a refused parameter");
  h.runner.assertNoUnexpected();
});

Deno.test("ControllerService.CreateVolume names the value and the flag that would allow it", async () => {
  const h = setup(["--key-dir", "/etc/zfs/keys"]);
  await assertRejectsCsi(
    h.controller.CreateVolume(createReq("v1", { parameters: { setuid: "on" } })),
    Code.INVALID_ARGUMENT,
    /^Parameter setuid="on" is not allowed on this node: only "off" by default, as .*; the operator can allow it with --allow-parameter setuid=on$/,
  );
  await assertRejectsCsi(
    h.controller.CreateVolume(createReq("v1", {
      parameters: {
        encryption: "on",
        keyformat: "raw",
        keylocation: "file:///etc/zfs/keys/../../shadow",
      },
    })),
    Code.INVALID_ARGUMENT,
    'Parameter keylocation="file:///etc/zfs/keys/../../shadow" is not allowed on this node: ' +
      'key locations must be files below --key-dir "/etc/zfs/keys"; the operator can allow it ' +
      "with --allow-parameter keylocation=file:///etc/zfs/keys/../../shadow",
  );
  assert.deepEqual(h.runner.argvs, []);
});

Deno.test("ControllerService.CreateVolume passes what the operator allows on to zfs create", async () => {
  const h = setup(["--allow-parameter", "setuid=on", "--allow-parameter", "com.sun:*=*"]);
  h.runner.on(["zfs", "create"], {});
  await h.controller.CreateVolume(
    createReq("v1", { parameters: { setuid: "on", "com.sun:auto-snapshot": "true" } }),
  );
  // Other options of the create (ours) are other tests' business: these must be among them.
  const [create, ...more] = h.runner.argvs;
  assert.deepEqual(more, []);
  assert.deepEqual(create?.slice(0, 2), ["zfs", "create"]);
  assert.equal(create?.at(-1), "tank/nomad/v1");
  assert.deepEqual(
    createOptions(create!).filter((o) => !o.startsWith("org.zfs-csi:") && !o.startsWith("ref")),
    ["com.sun:auto-snapshot=true", "setuid=on"],
  );
  // What the defaults accept needs no flag.
  await h.controller.CreateVolume(createReq("v2", { parameters: { exec: "off", dedup: "off" } }));
  const second = h.runner.argvs.at(-1)!;
  assert.equal(second.at(-1), "tank/nomad/v2");
  assert.deepEqual(
    createOptions(second).filter((o) => !o.startsWith("org.zfs-csi:") && !o.startsWith("ref")),
    ["dedup=off", "exec=off"],
  );
  h.runner.assertNoUnexpected();
});

Deno.test("ControllerService.ValidateVolumeCapabilities judges parameters by the same policy", async () => {
  const validate = (h: Harness, parameters: Record<string, string>) =>
    h.controller.ValidateVolumeCapabilities({
      volume_id: "v1@n1",
      volume_capabilities: [fsCap()],
      volume_context: {},
      parameters,
      secrets: {},
      mutable_parameters: {},
    }) as Promise<Record<string, unknown>>;
  const props = volumeProps("tank/nomad/v1", { refquota: String(64 * MiB) });
  const strict = setup();
  strict.runner.on(["zfs", "get"], { stdout: props });
  assert.deepEqual(await validate(strict, { dedup: "on" }), {
    message: 'Parameter dedup="on" is not allowed on this node: only "off" by default, as the ' +
      "dedup table costs memory and I/O of the whole pool; the operator " +
      "can allow it with --allow-parameter dedup=on",
  });
  assert.ok("confirmed" in await validate(strict, { dedup: "off" }));
  const loose = setup(["--allow-parameter", "dedup=on"]);
  loose.runner.on(["zfs", "get"], { stdout: props });
  const res = await validate(loose, { dedup: "on" });
  assert.deepEqual((res.confirmed as Record<string, unknown>).parameters, { dedup: "on" });
  strict.runner.assertNoUnexpected();
  loose.runner.assertNoUnexpected();
});

Deno.test("ControllerService.GetCapacity judges parameters by the same policy, before any zfs command", async () => {
  const capacity = (h: Harness, parameters: Record<string, string>) =>
    h.controller.GetCapacity({
      volume_capabilities: [fsCap()],
      parameters,
      accessible_topology: null,
    });
  const strict = setup();
  await assertRejectsCsi(
    capacity(strict, { exec: "on" }),
    Code.INVALID_ARGUMENT,
    /^Parameter exec="on" is not allowed on this node: .*--allow-parameter exec=on$/,
  );
  assert.deepEqual(strict.runner.argvs, []);
  const loose = setup(["--allow-parameter", "exec=on|off"]);
  loose.runner.onExact(zfs.get("available", PARENT), {
    stdout: `${PARENT}\tavailable\t1073741824\t-\n`,
  });
  const res = await capacity(loose, { exec: "on" }) as Record<string, unknown>;
  assert.equal(res.available_capacity, "1073741824");
  loose.runner.assertNoUnexpected();
});

Deno.test("ControllerService.ControllerExpandVolume reads back recorded parameters the policy now refuses", async () => {
  // Made under a looser policy; refreservation="capacity" must still follow the volume, even
  // now that the operator refuses every parameter.
  const h = setup(["--deny-parameter", "*"]);
  const dataset = "tank/nomad/v1";
  h.runner.on(["zfs", "get"], {
    stdout: volumeProps(dataset, {
      refquota: String(64 * MiB),
      quota: "0",
      refreservation: String(64 * MiB),
      "org.zfs-csi:parameters": '{"dedup":"on","refreservation":"capacity","setuid":"on"}',
      "org.zfs-csi:source": "-",
    }),
  });
  h.runner.on(["zfs", "set"], {});
  const res = await h.controller.ControllerExpandVolume({
    volume_id: "v1@n1",
    capacity_range: { required_bytes: String(128 * MiB), limit_bytes: "0" },
    volume_capability: null,
    secrets: {},
  }) as Record<string, unknown>;
  assert.equal(res.capacity_bytes, String(128 * MiB));
  const sets = h.runner.argvs.filter((a) => a[1] === "set").flat();
  assert.ok(sets.includes(`refreservation=${128 * MiB}`), JSON.stringify(h.runner.argvs));
  h.runner.assertNoUnexpected();
});

Deno.test("ControllerService without a store refuses backups and stored snapshots, before any zfs command", async () => {
  const h = setup();
  await assertRejectsCsi(
    h.controller.CreateVolume(createReq("v1", { parameters: { backup_interval: "15m" } })),
    Code.INVALID_ARGUMENT,
    "Parameters backup_interval and backup_keep need a store, and this plugin has none " +
      "(start it with --store)",
  );
  await assertRejectsCsi(
    h.controller.CreateVolume(createReq("v1", { parameters: { backup_keep: "last=0" } })),
    Code.INVALID_ARGUMENT,
    /^Parameter backup_keep="last=0": Keep policy/,
  );
  const snap = (parameters: Record<string, string>) =>
    h.controller.CreateSnapshot({
      source_volume_id: "v1@n1",
      name: "s1",
      secrets: {},
      parameters,
    });
  await assertRejectsCsi(
    snap({ store: "true" }),
    Code.INVALID_ARGUMENT,
    'Snapshot parameter store="true": this plugin has no store (start it with --store)',
  );
  await assertRejectsCsi(
    snap({ store: "yes" }),
    Code.INVALID_ARGUMENT,
    'Snapshot parameter store="yes" must be "true" or "false"',
  );
  const stored = "store:v1:00000000000000ff";
  await assertRejectsCsi(
    h.controller.CreateVolume(
      createReq("v2", { volume_content_source: { snapshot: { snapshot_id: stored } } }),
    ),
    Code.FAILED_PRECONDITION,
    `Snapshot "${stored}" is kept in a store, and this plugin has none (start it with --store)`,
  );
  await assertRejectsCsi(
    h.controller.DeleteSnapshot({ snapshot_id: stored, secrets: {} }),
    Code.FAILED_PRECONDITION,
    /is kept in a store, and this plugin has none/,
  );
  // An id this plugin never makes names nothing: deleting nothing succeeds.
  assert.deepEqual(
    await h.controller.DeleteSnapshot({ snapshot_id: "store:v1:ff", secrets: {} }),
    {},
  );
  assert.deepEqual(h.runner.argvs, [], "no zfs command");
  h.runner.assertNoUnexpected();
});

Deno.test("ControllerService.CreateVolume records the schedule the volume asked for, never the plugin's default", async () => {
  const h = setup(["--store", "file:///srv/backups", "--backup-interval", "1h"]);
  h.runner.on(["zfs", "create"], {});
  await h.controller.CreateVolume(createReq("v1"));
  await h.controller.CreateVolume(
    createReq("v2", { parameters: { backup_interval: "15m", backup_keep: "daily=7" } }),
  );
  await h.controller.CreateVolume(createReq("v3", { parameters: { backup_interval: "0" } }));
  const creates = h.runner.argvs.filter((a) => a[1] === "create").map((a) =>
    createOptions(a).filter((o) => o.startsWith("org.zfs-csi:backup-"))
  );
  assert.deepEqual(creates, [
    // None: the plugin's --backup-interval, whatever it is when the scheduler reads it.
    [],
    ["org.zfs-csi:backup-interval=900", "org.zfs-csi:backup-keep=last=0,hourly=0,daily=7,weekly=0"],
    // An explicit 0 is the volume's own choice, kept whatever the default becomes.
    ["org.zfs-csi:backup-interval=0"],
  ]);
});

Deno.test("a volume created under --backup-interval 1h is backed up every 15m once the plugin runs with 15m", async () => {
  const store = ["--store", "file:///srv/backups"];
  const parts = fakeServices({
    parent: PARENT,
    flags: [...store, "--backup-interval", "1h"],
    host: (runner) => new FakePool(runner).add(PARENT, { "org.zfs-csi:managed": ["-", "-"] }),
  });
  parts.runner.on(["zfs", "create"], (argv) => {
    const values = Object.fromEntries(createOptions(argv).map((o) => o.split(/=(.*)/s, 2)));
    parts.host.add(argv.at(-1)!, values);
    return {};
  });
  await fakeController(parts).CreateVolume(createReq("pg"));
  const dataset = `${PARENT}/pg`;
  assert.ok(parts.host.has(dataset));
  // The plugin restarted with --backup-interval 15m: the same pool, its new scheduler.
  const restarted = parseConfig(
    ["--parent-dataset", PARENT, "--node-id", "n1", ...store, "--backup-interval", "15m"],
    {},
  );
  assert.ok(restarted.kind === "run" && restarted.config.store);
  const clock = { ms: Date.UTC(2026, 0, 1) };
  const backups: number[] = [];
  const scheduler = new BackupScheduler({
    zfs: parts.zfs,
    parentDataset: PARENT,
    log: parts.log,
    backup: (ds) => {
      backups.push((clock.ms - Date.UTC(2026, 0, 1)) / 60_000);
      parts.host.setValue(ds, "org.zfs-csi:backup-last", String(Math.floor(clock.ms / 1000)));
      return Promise.resolve({ status: "stored" } as unknown as BackupOutcome);
    },
    defaultIntervalSeconds: restarted.config.store.defaultBackupIntervalSeconds,
    now: () => clock.ms,
    monotonic: () => clock.ms,
  });
  for (let minutes = 0; minutes <= 60; minutes += 5) {
    await scheduler.tick();
    clock.ms += 5 * 60_000;
  }
  assert.deepEqual(backups, [0, 15, 30, 45, 60], "minutes after the restart");
  await scheduler.stop();
});
