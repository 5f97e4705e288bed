import assert from "node:assert/strict";
import { Logger } from "../log.ts";
import {
  type FakeResponse,
  FakeRunner,
  fakeTools,
  gate,
  mountLine,
  type Responder,
} from "../../tests/support/fake_runner.ts";
import type { Mounter } from "../mount/mounter.ts";
import { HealthChecker, type HealthOptions } from "./health.ts";

const PARENT_GET = [
  "zfs",
  "get",
  "-Hp",
  "-o",
  "name,property,value,source",
  "type,mounted,mountpoint",
  "tank/nomad",
];

function parentProps(mounted = "yes", type = "filesystem"): FakeResponse {
  return {
    stdout: `tank/nomad\ttype\t${type}\t-\ntank/nomad\tmounted\t${mounted}\t-\n` +
      "tank/nomad\tmountpoint\t/tank/nomad\tdefault\n",
  };
}

const VISIBLE: FakeResponse = {
  stdout: mountLine("tank/nomad", "/tank/nomad", "zfs", "rw,xattr") + "\n",
};

function setup(
  script: { pool?: Responder; parent?: Responder; mounts?: Responder },
  opts: HealthOptions = { ttlMs: 10_000, checkTimeoutMs: 400, maxWaitMs: 300 },
): {
  runner: FakeRunner;
  health: HealthChecker;
  mounter: Mounter;
  logs: () => Record<string, unknown>[];
} {
  const runner = new FakeRunner()
    .on(["zpool", "list"], script.pool ?? { stdout: "tank\tONLINE\n" })
    .on(PARENT_GET, script.parent ?? parentProps())
    .onExact(["mount"], script.mounts ?? VISIBLE);
  const lines: string[] = [];
  const log = new Logger("debug", {}, (l) => lines.push(l));
  const { zfs, mounter } = fakeTools(runner, log, 60_000);
  const health = new HealthChecker({ zfs, mounter, parentDataset: "tank/nomad", log }, opts);
  return {
    runner,
    health,
    mounter,
    logs: () =>
      lines.map((l) => JSON.parse(l)).filter((r) => r.msg !== "exec" && r.msg !== "exec done"),
  };
}

Deno.test("HealthChecker.refresh is ready when the pool is online and the parent is mounted and visible", async () => {
  const { runner, health, logs } = setup({});
  const status = await health.refresh();
  assert.equal(status.ready, true);
  assert.equal(status.reason, "");
  assert.equal(status.poolHealth, "ONLINE");
  assert.deepEqual(runner.argvs, [
    ["zpool", "list", "-H", "-o", "name,health", "tank"],
    PARENT_GET,
    ["mount"],
  ]);
  assert.deepEqual(runner.calls[0]?.options, { timeoutMs: 400 });
  assert.deepEqual(runner.calls[1]?.options, { timeoutMs: 400 });
  assert.equal(health.last, status);
  // The parent's own mount tells which type the running ZFS mounts as.
  assert.deepEqual(logs().map((r) => [r.level, r.msg]), [
    ["info", "ZFS mounts datasets with this filesystem type"],
    ["info", "plugin healthy"],
  ]);
});

Deno.test("HealthChecker.refresh explains each way of not being ready", async () => {
  const table: ReadonlyArray<readonly [Parameters<typeof setup>[0], boolean, string]> = [
    [
      { pool: { code: 1, stderr: "cannot open 'tank': no such pool\n" } },
      false,
      'Pool "tank" is not imported',
    ],
    [{ pool: { stdout: "tank\tFAULTED\n" } }, false, 'Pool "tank" is FAULTED'],
    [{ pool: { stdout: "tank\tDEGRADED\n" } }, true, 'Pool "tank" is DEGRADED'],
    [
      { parent: { code: 1, stderr: "cannot open 'tank/nomad': dataset does not exist\n" } },
      false,
      'Parent dataset "tank/nomad" does not exist',
    ],
    [
      { parent: parentProps("yes", "volume") },
      false,
      'Parent dataset "tank/nomad" is not a filesystem',
    ],
    [{ parent: parentProps("no") }, false, 'Parent dataset "tank/nomad" is not mounted'],
    [
      { mounts: { stdout: "" } },
      false,
      'Parent dataset "tank/nomad" is mounted at "/tank/nomad" on the host but not visible to the plugin: bind-mount that path into the plugin task',
    ],
    [
      { parent: { timedOut: true, code: 137 } },
      false,
      'Health check failed: Command "zfs get -Hp -o name,property,value,source type,mounted,mountpoint tank/nomad" failed (timeout): timed out after 400ms',
    ],
  ];
  for (const [script, ready, reason] of table) {
    const { health } = setup(script);
    const status = await health.refresh();
    assert.equal(status.ready, ready, reason);
    assert.equal(status.reason, reason);
  }
});

Deno.test("HealthChecker.status answers from the cache while it is fresh", async () => {
  const { runner, health } = setup({});
  const first = await health.status();
  const second = await health.status();
  assert.equal(second, first);
  assert.equal(runner.calls.length, 3);
});

Deno.test("HealthChecker.status does not wait longer than maxWaitMs for a slow check", async () => {
  const held = gate();
  const { health } = setup({
    mounts: async () => {
      await held.promise;
      return VISIBLE;
    },
  }, { ttlMs: 0, checkTimeoutMs: 400, maxWaitMs: 20 });
  const status = await health.status();
  assert.equal(status.ready, false);
  assert.equal(status.reason, "The first health check is still running");
  assert.equal(health.last, undefined);
  held.open();
  const done = await health.refresh();
  assert.equal(done.ready, true);
  assert.equal(health.last, done);
});

Deno.test("HealthChecker.refresh runs one check at a time", async () => {
  const { runner, health } = setup({});
  const [a, b] = await Promise.all([health.refresh(), health.refresh()]);
  assert.equal(a, b);
  assert.equal(runner.calls.length, 3);
});

Deno.test("HealthChecker logs a change of state once, not on every check", async () => {
  const { health, logs } = setup({ pool: { stdout: "tank\tFAULTED\n" } });
  await health.refresh();
  await health.refresh();
  assert.deepEqual(logs().map((r) => [r.level, r.msg, r.reason]), [
    ["warn", "plugin not ready", 'Pool "tank" is FAULTED'],
  ]);
});

Deno.test("HealthChecker.status answers a stale result at once and refreshes it behind", async () => {
  let pool: FakeResponse = { stdout: "tank\tONLINE\n" };
  const { health } = setup({ pool: () => pool }, {
    ttlMs: 0,
    checkTimeoutMs: 400,
    maxWaitMs: 1000,
  });
  const first = await health.status();
  assert.equal(first.ready, true);
  // The pool fails; the next status is the old result (ttl 0 makes it stale), not a wait.
  pool = { stdout: "tank\tSUSPENDED\n" };
  const second = await health.status();
  assert.equal(second, first);
  // ...and the check it started in the background brings the news.
  await health.refresh();
  const third = await health.status();
  assert.equal(third.ready, false);
  assert.equal(third.reason, 'Pool "tank" is SUSPENDED');
});

Deno.test("HealthChecker learns the ZFS mount type from the parent's mount", async () => {
  const { health, mounter } = setup({});
  assert.equal(mounter.judge().fsType, undefined);
  await health.refresh();
  assert.equal(mounter.judge().fsType, "zfs");
});

Deno.test("HealthChecker does not take a user's FUSE mount at the parent's mountpoint for it", async () => {
  const { health, mounter } = setup({
    mounts: {
      stdout: "tank/nomad on /tank/nomad type fuse.zfs " +
        "(rw,nosuid,nodev,relatime,user_id=1000,group_id=1000)\n",
    },
  });
  const status = await health.refresh();
  assert.equal(status.ready, false);
  assert.match(status.reason, /not visible to the plugin/);
  assert.equal(mounter.judge().fsType, undefined);
});
