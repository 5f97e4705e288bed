import assert from "node:assert/strict";
import { Code, toGrpcStatus, ZfsError, type ZfsErrorKind } from "../errors.ts";
import { Logger } from "../log.ts";
import { FakeRunner } from "../../tests/support/fake_runner.ts";
import { classifyZfsError, Zfs } from "./zfs.ts";

function fixture(name: string): Promise<string> {
  return Deno.readTextFile(new URL(`../../tests/fixtures/${name}`, import.meta.url));
}

function setup(): { runner: FakeRunner; zfs: Zfs; lines: string[] } {
  const runner = new FakeRunner();
  const lines: string[] = [];
  const zfs = new Zfs(runner, {
    zfsPath: "/sbin/zfs",
    zpoolPath: "/sbin/zpool",
    timeoutMs: 5000,
    log: new Logger("debug", {}, (line) => lines.push(line)),
  });
  return { runner, zfs, lines };
}

const GET_PREFIX = ["/sbin/zfs", "get", "-Hp", "-o", "name,property,value,source"];

async function rejectsWithKind(p: Promise<unknown>, kind: ZfsErrorKind): Promise<ZfsError> {
  let caught: unknown;
  try {
    await p;
  } catch (err) {
    caught = err;
  }
  assert.ok(caught instanceof ZfsError, `expected a ZfsError, got ${String(caught)}`);
  assert.equal(caught.kind, kind);
  return caught;
}

Deno.test("classifyZfsError classifies captured zfs-fuse stderr", async () => {
  const table: ReadonlyArray<readonly [string, ZfsErrorKind]> = [
    ["stderr_get_not_found.txt", "not_found"],
    ["stderr_create_no_parent.txt", "not_found"],
    ["stderr_zpool_no_such_pool.txt", "not_found"],
    ["stderr_create_exists.txt", "exists"],
    ["stderr_get_bad_property.txt", "invalid"],
    // "already mounted" is no failure kind of its own: Zfs.mount recognises it.
    ["stderr_mount_already_mounted.txt", "unknown"],
  ];
  for (const [file, kind] of table) {
    assert.equal(classifyZfsError(await fixture(file)), kind, file);
    // The same commands on OpenZFS 2.1 say the same things.
    assert.equal(classifyZfsError(await fixture(`openzfs/${file}`)), kind, `openzfs/${file}`);
  }
});

Deno.test("classifyZfsError classifies OpenZFS messages", () => {
  const table: ReadonlyArray<readonly [string, ZfsErrorKind]> = [
    ["cannot destroy 'tank/nomad/v': dataset is busy", "busy"],
    ["cannot unmount '/tank/nomad/v': pool or dataset is busy", "busy"],
    ["cannot create 'tank/nomad/v': out of space", "no_space"],
    ["cannot create 'tank/nomad/v': permission denied", "permission"],
    ["cannot mount 'tank/nomad/v': Operation not permitted", "permission"],
    ["cannot set property for 'tank/v': bad numeric value 'abc'", "invalid"],
    ["cannot create 'tank/v': invalid property 'foo'", "invalid"],
    ["cannot create 'tank/x': dataset name is too long", "invalid"],
    [
      "cannot set property for 'tank/v': pool and or dataset must be upgraded to set this property or value",
      "unsupported",
    ],
    ["cannot open 'tank': no such pool", "not_found"],
    ["", "unknown"],
    ["something else entirely", "unknown"],
  ];
  for (const [stderr, kind] of table) assert.equal(classifyZfsError(stderr), kind, stderr);
});

Deno.test("Zfs.getProperties runs zfs get with the exact argv and parses the output", async () => {
  const { runner, zfs } = setup();
  const stdout = await fixture("zfs_get_parent.txt");
  runner.on(GET_PREFIX, { stdout });
  const props = await zfs.getProperties("tpool/nomad", ["type", "mounted", "mountpoint"]);
  assert.deepEqual(runner.argvs, [[...GET_PREFIX, "type,mounted,mountpoint", "tpool/nomad"]]);
  assert.deepEqual(runner.calls[0]?.options, { timeoutMs: 5000 });
  assert.deepEqual(props?.get("type"), { value: "filesystem", source: "-" });
  assert.deepEqual(props?.get("mounted"), { value: "yes", source: "-" });
  assert.deepEqual(props?.get("mountpoint"), {
    value: "/tmp/zp/mnt/nomad",
    source: "inherited from tpool",
  });
});

Deno.test("Zfs.getProperties passes its own time limit to the runner", async () => {
  const { runner, zfs } = setup();
  runner.on(GET_PREFIX, { stdout: "t/x\ttype\tfilesystem\t-\n" });
  await zfs.getProperties("t/x", ["type"], 1234);
  assert.deepEqual(runner.calls[0]?.options, { timeoutMs: 1234 });
});

Deno.test("Zfs.getProperties returns undefined when the dataset does not exist", async () => {
  const { runner, zfs } = setup();
  runner.on(GET_PREFIX, { code: 1, stderr: await fixture("stderr_get_not_found.txt") });
  assert.equal(await zfs.getProperties("tpool/nomad/does-not-exist", ["type"]), undefined);
  assert.equal(runner.calls.length, 1);
});

Deno.test("Zfs.getProperties throws a classified ZfsError for other failures", async () => {
  const { runner, zfs } = setup();
  runner.on(GET_PREFIX, { code: 2, stderr: await fixture("stderr_get_bad_property.txt") });
  const err = await rejectsWithKind(zfs.getProperties("tpool/nomad", ["type"]), "invalid");
  assert.deepEqual(err.argv, [...GET_PREFIX, "type", "tpool/nomad"]);
  assert.match(err.stderr, /^bad property list: invalid property 'bogusprop'/);
});

Deno.test("Zfs.getProperties throws a SyntaxError for unparseable output", async () => {
  const { runner, zfs } = setup();
  runner.on(GET_PREFIX, { stdout: "NAME PROPERTY VALUE SOURCE\n" });
  await assert.rejects(zfs.getProperties("t/x", ["type"]), SyntaxError);
});

Deno.test("Zfs.create runs zfs create with sorted -o properties", async () => {
  const { runner, zfs } = setup();
  runner.on(["/sbin/zfs", "create"], {});
  await zfs.create("tpool/nomad/v", { refquota: "1073741824", "org.zfs-csi:managed": "yes" });
  assert.deepEqual(runner.argvs, [[
    "/sbin/zfs",
    "create",
    "-o",
    "org.zfs-csi:managed=yes",
    "-o",
    "refquota=1073741824",
    "tpool/nomad/v",
  ]]);
});

Deno.test("Zfs.create throws ZfsError exists when the dataset exists", async () => {
  const { runner, zfs } = setup();
  runner.on(["/sbin/zfs", "create"], {
    code: 1,
    stderr: await fixture("stderr_create_exists.txt"),
  });
  const err = await rejectsWithKind(zfs.create("tpool/nomad", {}), "exists");
  assert.equal(toGrpcStatus(err).code, Code.ALREADY_EXISTS);
});

Deno.test("Zfs.set runs zfs set with one name=value argument", async () => {
  const { runner, zfs } = setup();
  runner.on(["/sbin/zfs", "set"], {});
  await zfs.set("tpool/nomad/v", "refquota", "2147483648");
  assert.deepEqual(runner.argvs, [["/sbin/zfs", "set", "refquota=2147483648", "tpool/nomad/v"]]);
});

Deno.test("Zfs.mount runs zfs mount and succeeds", async () => {
  const { runner, zfs } = setup();
  runner.on(["/sbin/zfs", "mount"], {});
  await zfs.mount("tpool/nomad/v");
  assert.deepEqual(runner.argvs, [["/sbin/zfs", "mount", "tpool/nomad/v"]]);
});

Deno.test("Zfs.mount treats an already mounted filesystem as success", async () => {
  const { runner, zfs } = setup();
  runner.on(["/sbin/zfs", "mount"], {
    code: 1,
    stderr: await fixture("stderr_mount_already_mounted.txt"),
  });
  await zfs.mount("tpool/nomad");
  assert.equal(runner.calls.length, 1);
});

Deno.test("Zfs.mount throws for other failures", async () => {
  const { runner, zfs } = setup();
  runner.on(["/sbin/zfs", "mount"], {
    code: 1,
    stderr: "cannot open 'tpool/nomad/x': dataset does not exist\n",
  });
  await rejectsWithKind(zfs.mount("tpool/nomad/x"), "not_found");
});

Deno.test("Zfs.poolHealth runs zpool list and returns the health of the pool", async () => {
  const { runner, zfs } = setup();
  runner.on(["/sbin/zpool", "list"], { stdout: await fixture("zpool_list_health.txt") });
  assert.equal(await zfs.poolHealth("tpool", 700), "ONLINE");
  assert.deepEqual(runner.argvs, [["/sbin/zpool", "list", "-H", "-o", "name,health", "tpool"]]);
  assert.deepEqual(runner.calls[0]?.options, { timeoutMs: 700 });
});

Deno.test("Zfs.poolHealth returns undefined for no such pool", async () => {
  const { runner, zfs } = setup();
  runner.on(["/sbin/zpool", "list"], {
    code: 1,
    stderr: await fixture("stderr_zpool_no_such_pool.txt"),
  });
  assert.equal(await zfs.poolHealth("nosuchpool"), undefined);
});

Deno.test("Zfs.poolHealth returns undefined when the output names another pool", async () => {
  const { runner, zfs } = setup();
  runner.on(["/sbin/zpool", "list"], { stdout: "other\tONLINE\n" });
  assert.equal(await zfs.poolHealth("tank"), undefined);
});

Deno.test("Zfs turns a timed-out command into ZfsError timeout", async () => {
  const { runner, zfs } = setup();
  runner.on(GET_PREFIX, { code: 137, timedOut: true });
  const err = await rejectsWithKind(zfs.getProperties("tpool/nomad", ["type"]), "timeout");
  assert.equal(err.stderr, "timed out after 5000ms");
  assert.equal(toGrpcStatus(err).code, Code.DEADLINE_EXCEEDED);
});

Deno.test("Zfs reports the time limit it passed when a call with its own limit times out", async () => {
  const { runner, zfs } = setup();
  runner.on(["/sbin/zpool", "list"], { code: 137, timedOut: true });
  const err = await rejectsWithKind(zfs.poolHealth("tpool", 250), "timeout");
  assert.equal(err.stderr, "timed out after 250ms");
});

Deno.test("Zfs logs each argv at debug", async () => {
  const { runner, zfs, lines } = setup();
  runner.on(["/sbin/zfs", "set"], {});
  await zfs.set("t/x", "refquota", "1");
  const records = lines.map((l) => JSON.parse(l));
  assert.equal(records[0].level, "debug");
  assert.equal(records[0].msg, "exec");
  assert.deepEqual(records[0].argv, ["/sbin/zfs", "set", "refquota=1", "t/x"]);
});
