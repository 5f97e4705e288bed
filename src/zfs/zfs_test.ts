import assert from "node:assert/strict";
import { Code, toGrpcStatus, ZfsError, type ZfsErrorKind } from "../errors.ts";
import { Logger } from "../log.ts";
import { assertRejectsZfs } from "../../tests/support/assert_errors.ts";
import { fails, FakeRunner } from "../../tests/support/fake_runner.ts";
import { zfsArgv } from "../../tests/support/zfs_argv.ts";
import { classifyZfsError, reasonText, Zfs } from "./zfs.ts";

function fixture(name: string): Promise<string> {
  return Deno.readTextFile(new URL(`../../tests/fixtures/${name}`, import.meta.url));
}

function setup(anchor?: string): { runner: FakeRunner; zfs: Zfs; lines: string[] } {
  const runner = new FakeRunner();
  const lines: string[] = [];
  const zfs = new Zfs(runner, {
    zfsPath: "/sbin/zfs",
    zpoolPath: "/sbin/zpool",
    timeoutMs: 5000,
    log: new Logger("debug", {}, (line) => lines.push(line)),
    ...(anchor === undefined ? {} : { anchor }),
  });
  return { runner, zfs, lines };
}

const GET_PREFIX = ["/sbin/zfs", "get", "-Hp", "-o", "name,property,value,source"];

const zfsArgs = zfsArgv("/sbin/zfs");

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

Deno.test("classifyZfsError classifies the controller's captured OpenZFS 2.1 stderr", async () => {
  const table: ReadonlyArray<readonly [string, ZfsErrorKind]> = [
    ["stderr_destroy_snapshot_dependent_clones.txt", "dependents"],
    ["stderr_destroy_filesystem_dependent_clones.txt", "dependents"],
    ["stderr_create_bad_value.txt", "invalid"],
    // A key file that is not there is bad input, not a missing dataset.
    ["stderr_create_missing_key.txt", "invalid"],
  ];
  for (const [file, kind] of table) {
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
  runner.on(GET_PREFIX, fails(await fixture("stderr_get_not_found.txt")));
  assert.equal(await zfs.getProperties("tpool/nomad/does-not-exist", ["type"]), undefined);
  assert.equal(runner.calls.length, 1);
});

Deno.test("Zfs.getProperties throws a classified ZfsError for other failures", async () => {
  const { runner, zfs } = setup();
  runner.on(GET_PREFIX, fails(await fixture("stderr_get_bad_property.txt"), 2));
  const err = await assertRejectsZfs(zfs.getProperties("tpool/nomad", ["type"]), "invalid");
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
  assert.deepEqual(runner.argvs, [
    zfsArgs.create("tpool/nomad/v", "org.zfs-csi:managed=yes", "refquota=1073741824"),
  ]);
});

Deno.test("Zfs.create throws ZfsError exists when the dataset exists", async () => {
  const { runner, zfs } = setup();
  runner.on(["/sbin/zfs", "create"], fails(await fixture("stderr_create_exists.txt")));
  const err = await assertRejectsZfs(zfs.create("tpool/nomad", {}), "exists");
  assert.equal(toGrpcStatus(err).code, Code.ALREADY_EXISTS);
});

Deno.test("Zfs.set runs zfs set with one name=value argument", async () => {
  const { runner, zfs } = setup();
  runner.on(["/sbin/zfs", "set"], {});
  await zfs.set("tpool/nomad/v", "refquota", "2147483648");
  assert.deepEqual(runner.argvs, [["/sbin/zfs", "set", "refquota=2147483648", "tpool/nomad/v"]]);
});

for (const verb of ["mount", "unmount"] as const) {
  Deno.test(`Zfs.${verb} runs zfs ${verb} and succeeds`, async () => {
    const { runner, zfs } = setup();
    runner.on(["/sbin/zfs", verb], {});
    await zfs[verb]("tpool/nomad/v");
    assert.deepEqual(runner.argvs, [["/sbin/zfs", verb, "tpool/nomad/v"]]);
  });
}

Deno.test("Zfs.mount treats an already mounted filesystem as success", async () => {
  const { runner, zfs } = setup();
  runner.on(["/sbin/zfs", "mount"], fails(await fixture("stderr_mount_already_mounted.txt")));
  await zfs.mount("tpool/nomad");
  assert.equal(runner.calls.length, 1);
});

Deno.test("Zfs.mount throws for other failures", async () => {
  const { runner, zfs } = setup();
  runner.on(["/sbin/zfs", "mount"], fails("cannot open 'tpool/nomad/x': dataset does not exist\n"));
  await assertRejectsZfs(zfs.mount("tpool/nomad/x"), "not_found");
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
  runner.on(["/sbin/zpool", "list"], fails(await fixture("stderr_zpool_no_such_pool.txt")));
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
  const err = await assertRejectsZfs(zfs.getProperties("tpool/nomad", ["type"]), "timeout");
  assert.equal(err.stderr, "timed out after 5000ms");
  assert.equal(toGrpcStatus(err).code, Code.DEADLINE_EXCEEDED);
});

Deno.test("Zfs says why when the runner gave up on a command that could not be killed", async () => {
  const { runner, zfs } = setup();
  const stuck = "zfs (pid 7) did not end within 5000 ms of SIGKILL: it is blocked in the kernel";
  runner.on(GET_PREFIX, { code: -1, timedOut: true, stderr: stuck });
  const err = await assertRejectsZfs(zfs.getProperties("tpool/nomad", ["type"]), "timeout");
  assert.equal(err.stderr, `timed out after 5000ms; ${stuck}`);
  assert.equal(toGrpcStatus(err).code, Code.DEADLINE_EXCEEDED);
});

Deno.test("Zfs reports the time limit it passed when a call with its own limit times out", async () => {
  const { runner, zfs } = setup();
  runner.on(["/sbin/zpool", "list"], { code: 137, timedOut: true });
  const err = await assertRejectsZfs(zfs.poolHealth("tpool", 250), "timeout");
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

const TREE_PREFIX = ["/sbin/zfs", "get", "-Hp", "-r", "-d"];

Deno.test("classifyZfsError classifies destroys refused for dependent clones as dependents", async () => {
  for (
    const file of [
      "stderr_destroy_snapshot_dependent_clones.txt",
      "stderr_destroy_filesystem_dependent_clones.txt",
    ]
  ) {
    const stderr = await fixture(file);
    assert.match(stderr, /has dependent clones/, file);
    assert.equal(classifyZfsError(stderr), "dependents", file);
  }
  // OpenZFS words it the same way.
  assert.equal(
    classifyZfsError(
      "cannot destroy 'tank/nomad/pg@s1': snapshot has dependent clones\n" +
        "use '-R' to destroy the following datasets:\ntank/nomad/restored\n",
    ),
    "dependents",
  );
});

Deno.test("classifyZfsError classifies a key that is not loaded as key_unavailable", () => {
  const table = [
    // libzfs names the mountpoint here, not the dataset.
    "cannot mount '/tank/nomad/enc': encryption key not loaded\n",
    // Other wordings the pattern covers.
    "cannot mount 'tank/nomad/enc': encryption key not loaded",
    "Keys are not loaded for 'tank/nomad/enc'",
    "cannot open 'tank/nomad/enc': encryption key is unavailable",
  ];
  for (const stderr of table) assert.equal(classifyZfsError(stderr), "key_unavailable", stderr);
});

Deno.test("classifyZfsError leaves not currently mounted to Zfs.unmount", async () => {
  const stderr = await fixture("stderr_unmount_not_mounted.txt");
  assert.equal(stderr, "cannot unmount 'tpool/nomad/foreign': not currently mounted\n");
  assert.equal(classifyZfsError(stderr), "unknown");
});

Deno.test("ZfsError dependents and key_unavailable reach the client as FAILED_PRECONDITION", async () => {
  const stderr = await fixture("stderr_destroy_snapshot_dependent_clones.txt");
  const dependents = new ZfsError(
    classifyZfsError(stderr),
    ["/sbin/zfs", "destroy", "tpool/nomad/pg@snap1"],
    stderr,
  );
  assert.deepEqual(toGrpcStatus(dependents), {
    code: Code.FAILED_PRECONDITION,
    details: `ZFS operation "/sbin/zfs destroy" failed (dependents): ` +
      `cannot destroy 'tpool/nomad/pg@snap1': snapshot has dependent clones`,
  });
  const key = new ZfsError(
    "key_unavailable",
    ["/sbin/zfs", "mount", "tank/nomad/enc"],
    "cannot mount '/tank/nomad/enc': encryption key not loaded\n",
  );
  assert.deepEqual(toGrpcStatus(key), {
    code: Code.FAILED_PRECONDITION,
    details: `ZFS operation "/sbin/zfs mount" failed (key unavailable): ` +
      `cannot mount '/tank/nomad/enc': encryption key not loaded`,
  });
});

Deno.test("Zfs.getTree runs one zfs get -r -d with the exact argv and parses every dataset", async () => {
  const { runner, zfs } = setup();
  runner.on(TREE_PREFIX, { stdout: await fixture("zfs_get_tree.txt") });
  const props = ["type", "creation", "referenced", "refquota", "org.zfs-csi:managed"];
  const tree = await zfs.getTree("tpool/nomad", 2, props);
  assert.deepEqual(runner.argvs, [
    zfsArgs.tree("tpool/nomad", 2, "type,creation,referenced,refquota,org.zfs-csi:managed"),
  ]);
  assert.deepEqual(runner.calls[0]?.options, { timeoutMs: 5000 });
  assert.ok(tree);
  assert.deepEqual([...tree.keys()], [
    "tpool/nomad",
    "tpool/nomad/.deleted-1700000000-old",
    "tpool/nomad/.deleted-1700000000-old@snap1",
    "tpool/nomad/copy",
    "tpool/nomad/db:5b0:5d",
    "tpool/nomad/db:5b0:5d@before:20upgrade",
    "tpool/nomad/foreign",
    "tpool/nomad/foreign@manual",
    "tpool/nomad/foreign/sub",
    "tpool/nomad/pg",
    "tpool/nomad/pg@snap1",
    "tpool/nomad/pg@.clone-0123456789abcdef",
    "tpool/nomad/pg@.deleted-1700000000-old",
    "tpool/nomad/restored",
  ]);
  assert.deepEqual(tree.get("tpool/nomad/pg")?.get("org.zfs-csi:parameters"), {
    value: '{"compression":"on"}',
    source: "local",
  });
  assert.deepEqual(tree.get("tpool/nomad/pg@snap1")?.get("type"), {
    value: "snapshot",
    source: "-",
  });
  assert.deepEqual(tree.get("tpool/nomad/restored")?.get("org.zfs-csi:source"), {
    value: "snapshot:pg@snap1@node-a",
    source: "local",
  });
});

Deno.test("Zfs.getTree returns undefined when the root does not exist", async () => {
  const { runner, zfs } = setup();
  runner.on(TREE_PREFIX, fails(await fixture("stderr_get_not_found.txt")));
  assert.equal(await zfs.getTree("tpool/nomad/does-not-exist", 1, ["type"]), undefined);
  assert.deepEqual(runner.argvs, [zfsArgs.tree("tpool/nomad/does-not-exist", 1, "type")]);
});

Deno.test("Zfs.getTree throws a classified ZfsError for other failures", async () => {
  const { runner, zfs } = setup();
  runner.on(TREE_PREFIX, fails(await fixture("stderr_get_bad_property.txt"), 2));
  await assertRejectsZfs(zfs.getTree("tpool/nomad", 2, ["bogusprop"]), "invalid");
});

Deno.test("Zfs.getTree refuses a depth below 1 before running anything", async () => {
  const { runner, zfs } = setup();
  await assert.rejects(zfs.getTree("tpool/nomad", 0, ["type"]), RangeError);
  assert.equal(runner.calls.length, 0);
});

Deno.test("Zfs.unknownProperties asks again without each property zfs names", async () => {
  for (const file of ["stderr_get_bad_property.txt", "openzfs/stderr_get_bad_property.txt"]) {
    const { runner, zfs } = setup();
    const bad = await fixture(file);
    const refuse = (prop: string) => fails(bad.replace("bogusprop", prop), 2);
    runner.onExact(
      [...GET_PREFIX, "acltype,compression,dnodesize,relatime", "tpool/nomad"],
      refuse("acltype"),
    );
    runner.onExact(
      [...GET_PREFIX, "compression,dnodesize,relatime", "tpool/nomad"],
      refuse("dnodesize"),
    );
    runner.onExact([...GET_PREFIX, "compression,relatime", "tpool/nomad"], {
      stdout: "tpool/nomad\tcompression\toff\tdefault\ntpool/nomad\trelatime\toff\tdefault\n",
    });
    const unknown = await zfs.unknownProperties("tpool/nomad", [
      "acltype",
      "compression",
      "dnodesize",
      "relatime",
    ]);
    assert.deepEqual(unknown, ["acltype", "dnodesize"], file);
    assert.equal(runner.calls.length, 3, file);
    runner.assertNoUnexpected();
  }
});

Deno.test("Zfs.unknownProperties returns nothing when zfs knows every property", async () => {
  const { runner, zfs } = setup();
  runner.onExact([...GET_PREFIX, "relatime", "tpool/nomad"], {
    stdout: "tpool/nomad\trelatime\toff\tdefault\n",
  });
  assert.deepEqual(await zfs.unknownProperties("tpool/nomad", ["relatime"]), []);
  assert.equal(runner.calls.length, 1);
  // Nothing to ask: nothing runs.
  assert.deepEqual(await zfs.unknownProperties("tpool/nomad", []), []);
  assert.equal(runner.calls.length, 1);
});

Deno.test("Zfs.unknownProperties returns every property when zfs knows none", async () => {
  const { runner, zfs } = setup();
  const bad = await fixture("stderr_get_bad_property.txt");
  runner.on(
    GET_PREFIX,
    (argv) => fails(bad.replace("bogusprop", argv.at(-2)!.split(",")[0]!), 2),
  );
  assert.deepEqual(
    await zfs.unknownProperties("tpool/nomad", ["acltype", "dnodesize", "relatime"]),
    ["acltype", "dnodesize", "relatime"],
  );
  assert.deepEqual(runner.argvs.map((a) => a.at(-2)), [
    "acltype,dnodesize,relatime",
    "dnodesize,relatime",
    "relatime",
  ]);
});

Deno.test("Zfs.unknownProperties throws for other failures", async () => {
  const { runner, zfs } = setup();
  runner.on(GET_PREFIX, fails(await fixture("stderr_get_not_found.txt")));
  await assertRejectsZfs(zfs.unknownProperties("tpool/nomad/x", ["relatime"]), "not_found");
  // An invalid property it did not ask about is no answer either.
  const other = setup();
  const bad = await fixture("stderr_get_bad_property.txt");
  other.runner.on(GET_PREFIX, fails(bad, 2));
  await assertRejectsZfs(other.zfs.unknownProperties("tpool/nomad", ["relatime"]), "invalid");
  assert.equal(other.runner.calls.length, 1);
});

Deno.test("Zfs.unmount treats not currently mounted as success", async () => {
  const { runner, zfs } = setup();
  runner.on(["/sbin/zfs", "unmount"], fails(await fixture("stderr_unmount_not_mounted.txt")));
  await zfs.unmount("tpool/nomad/foreign");
  assert.deepEqual(runner.argvs, [["/sbin/zfs", "unmount", "tpool/nomad/foreign"]]);
});

Deno.test("Zfs.unmount throws for other failures", async () => {
  const { runner, zfs } = setup();
  runner.on(
    ["/sbin/zfs", "unmount"],
    fails("cannot unmount '/tank/nomad/v': pool or dataset is busy\n"),
  );
  await assertRejectsZfs(zfs.unmount("tank/nomad/v"), "busy");
});

Deno.test("Zfs.mount loads the key and mounts again when the encryption key is not loaded", async () => {
  const { runner, zfs } = setup();
  runner.on(
    ["/sbin/zfs", "mount"],
    fails("cannot mount '/tank/nomad/enc': encryption key not loaded\n"),
    { times: 1 },
  );
  runner.on(["/sbin/zfs", "load-key"], {});
  runner.on(["/sbin/zfs", "mount"], {});
  await zfs.mount("tank/nomad/enc");
  assert.deepEqual(runner.argvs, [
    ["/sbin/zfs", "mount", "tank/nomad/enc"],
    ["/sbin/zfs", "load-key", "tank/nomad/enc"],
    ["/sbin/zfs", "mount", "tank/nomad/enc"],
  ]);
});

Deno.test("Zfs.mount throws when loading the key fails, without mounting again", async () => {
  const { runner, zfs } = setup();
  runner.on(
    ["/sbin/zfs", "mount"],
    fails("cannot mount '/tank/nomad/enc': encryption key not loaded\n"),
  );
  runner.on(["/sbin/zfs", "load-key"], fails("Key load error: Permission denied.\n", 255));
  const err = await assertRejectsZfs(zfs.mount("tank/nomad/enc"), "permission");
  assert.deepEqual(err.argv, ["/sbin/zfs", "load-key", "tank/nomad/enc"]);
  assert.equal(runner.calls.length, 2);
});

Deno.test("Zfs.snapshot, clone, destroy and rename run the exact argv", async () => {
  const { runner, zfs } = setup();
  runner.on(["/sbin/zfs"], {});
  await zfs.snapshot("tpool/nomad/pg@snap1");
  await zfs.clone("tpool/nomad/pg@snap1", "tpool/nomad/restored", {
    refquota: "67108864",
    "org.zfs-csi:managed": "yes",
    "org.zfs-csi:source": "snapshot:pg@snap1@node-a",
  });
  await zfs.destroy("tpool/nomad/pg@.clone-0123456789abcdef-1700000000", { deferred: true });
  await zfs.destroy("tpool/nomad/.deleted-1700000000-old", { recursive: true });
  await zfs.destroy("tpool/nomad/v");
  await zfs.rename("tpool/nomad/v", "tpool/nomad/.deleted-1700000000-v");
  await zfs.rename("tpool/nomad/pg@snap1", "tpool/nomad/pg@.deleted-1700000000-snap1");
  assert.deepEqual(runner.argvs, [
    ["/sbin/zfs", "snapshot", "tpool/nomad/pg@snap1"],
    zfsArgs.clone(
      "tpool/nomad/pg@snap1",
      "tpool/nomad/restored",
      "org.zfs-csi:managed=yes",
      "org.zfs-csi:source=snapshot:pg@snap1@node-a",
      "refquota=67108864",
    ),
    ["/sbin/zfs", "destroy", "-d", "tpool/nomad/pg@.clone-0123456789abcdef-1700000000"],
    ["/sbin/zfs", "destroy", "-r", "tpool/nomad/.deleted-1700000000-old"],
    ["/sbin/zfs", "destroy", "tpool/nomad/v"],
    ["/sbin/zfs", "rename", "tpool/nomad/v", "tpool/nomad/.deleted-1700000000-v"],
    ["/sbin/zfs", "rename", "tpool/nomad/pg@snap1", "tpool/nomad/pg@.deleted-1700000000-snap1"],
  ]);
});

Deno.test("Zfs.destroy throws ZfsError dependents when clones depend on the target", async () => {
  const table: ReadonlyArray<readonly [string, string, boolean]> = [
    ["stderr_destroy_snapshot_dependent_clones.txt", "tpool/nomad/pg@snap1", false],
    ["stderr_destroy_filesystem_dependent_clones.txt", "tpool/nomad/pg", true],
  ];
  for (const [file, name, recursive] of table) {
    const { runner, zfs } = setup();
    runner.on(["/sbin/zfs", "destroy"], fails(await fixture(file)));
    const err = await assertRejectsZfs(zfs.destroy(name, { recursive }), "dependents");
    assert.deepEqual(err.argv, ["/sbin/zfs", "destroy", ...(recursive ? ["-r"] : []), name]);
    assert.equal(toGrpcStatus(err).code, Code.FAILED_PRECONDITION);
  }
});

Deno.test("Zfs.snapshot, clone and rename throw classified ZfsErrors", async () => {
  const { runner, zfs } = setup();
  runner.on(
    ["/sbin/zfs", "snapshot"],
    fails("cannot create snapshot 'tpool/nomad/pg@snap1': dataset already exists\n"),
  );
  runner.on(
    ["/sbin/zfs", "clone"],
    fails("cannot open 'tpool/nomad/pg@nope': dataset does not exist\n"),
  );
  runner.on(
    ["/sbin/zfs", "rename"],
    fails("cannot rename to 'tpool/nomad/w': dataset already exists\n"),
  );
  await assertRejectsZfs(zfs.snapshot("tpool/nomad/pg@snap1"), "exists");
  await assertRejectsZfs(zfs.clone("tpool/nomad/pg@nope", "tpool/nomad/w", {}), "not_found");
  await assertRejectsZfs(zfs.rename("tpool/nomad/v", "tpool/nomad/w"), "exists");
});

Deno.test("classifyZfsError reads zfs-fuse's refusals of a property value as invalid", () => {
  for (
    const stderr of [
      "cannot create 'p/n/x': 'compression' must be one of 'on | off | lzjb | gzip | gzip-[1-9] | zle'\n",
      "cannot create 'p/n/x': 'recordsize' must be power of 2 from 512 to 128k\n",
      "cannot create 'p/n/x': 'checksum' must be one of 'on | off | fletcher2 | fletcher4 | sha256'\n",
    ]
  ) {
    assert.equal(classifyZfsError(stderr), "invalid", stderr);
  }
});

Deno.test("classifyZfsError reads OpenZFS's key refusals as invalid input", () => {
  for (
    const stderr of [
      "cannot create 'p/n/x': Keyformat required for new encryption root.\n",
      "Failed to open key material file: No such file or directory\n" +
      "cannot create 'p/n/x': encryption failure\n",
    ]
  ) {
    assert.equal(classifyZfsError(stderr), "invalid", stderr);
  }
});

// ---------------------------------------------------------------------------------------------
// Names never decide the kind; ZFS that cannot be reached is "unavailable"

Deno.test("classifyZfsError reads the reason, not the names of volumes called busy or invalid-orders", async () => {
  // Captured on zfs-fuse, and the same failures in OpenZFS's words (written from libzfs).
  const table: ReadonlyArray<readonly [string, ZfsErrorKind]> = [
    ["stderr_create_busy_out_of_space.txt", "no_space"],
    ["stderr_set_busy_refreservation_no_space.txt", "no_space"],
    ["stderr_set_busy_refquota_below_used.txt", "invalid"],
    ["stderr_destroy_invalid_orders_children.txt", "unknown"],
    ["stderr_get_pool_exported.txt", "not_found"],
  ];
  for (const [file, kind] of table) {
    assert.equal(classifyZfsError(await fixture(file)), kind, file);
    assert.equal(classifyZfsError(await fixture(`openzfs/${file}`)), kind, `openzfs/${file}`);
  }
  const openzfsOnly: ReadonlyArray<readonly [string, ZfsErrorKind]> = [
    // An I/O error is no bad input, whatever the volume is called (quoted or not).
    ["stderr_get_invalid_orders_io_error.txt", "unknown"],
    ["stderr_destroy_snapshot_invalid_orders_io_error.txt", "unknown"],
  ];
  for (const [file, kind] of openzfsOnly) {
    assert.equal(classifyZfsError(await fixture(`openzfs/${file}`)), kind, `openzfs/${file}`);
  }
  // zfs-fuse names the missing pool in quotes too.
  assert.equal(classifyZfsError(await fixture("stderr_create_pool_exported.txt")), "not_found");
});

Deno.test("classifyZfsError ignores names wherever zfs puts them", () => {
  const table: ReadonlyArray<readonly [string, ZfsErrorKind]> = [
    // Quoted names and paths.
    ["cannot create 'tank/nomad/busy': out of space\n", "no_space"],
    ["cannot open 'tank/nomad/invalid-orders': I/O error\n", "unknown"],
    ["cannot mount '/srv/busy/unsupported': Insufficient privileges\n", "unknown"],
    ["cannot create 'tank/nomad/illegal-too-long': permission denied\n", "permission"],
    ["cannot rename to 'tank/nomad/busy': dataset already exists\n", "exists"],
    // A snapshot name after "cannot destroy snapshot", unquoted.
    ["cannot destroy snapshot tank/nomad/invalid@busy: I/O error\n", "unknown"],
    ["cannot destroy snapshot tank/nomad/v@s1: dataset is busy\n", "busy"],
    // Bare names listed on lines of their own.
    [
      "cannot destroy 'tank/nomad/v': filesystem has children\n" +
      "use '-r' to destroy the following datasets:\ntank/nomad/v/busy\ntank/nomad/v@invalid\n",
      "unknown",
    ],
    // A user property's name is quoted too.
    ["bad property list: invalid property 'org.busy:x'\n", "invalid"],
  ];
  for (const [stderr, kind] of table) assert.equal(classifyZfsError(stderr), kind, stderr);
});

Deno.test("reasonText keeps zfs's words and drops the names", () => {
  assert.equal(
    reasonText("cannot set property for 'tank/nomad/busy': size is greater than available space\n"),
    "size is greater than available space\n",
  );
  assert.equal(
    reasonText("cannot destroy snapshot tank/nomad/db:5b0:5d@busy: dataset is busy"),
    "dataset is busy",
  );
  assert.equal(
    reasonText("cannot destroy 't/v': filesystem has children\nuse '-r' to destroy:\nt/v@busy\n"),
    "filesystem has children\nuse '' to destroy:\n",
  );
  assert.equal(
    reasonText("connect: No such file or directory\nPlease make sure that the daemon is running."),
    "connect: No such file or directory\nPlease make sure that the daemon is running.",
  );
});

Deno.test("classifyZfsError reads ZFS that cannot be reached as unavailable, not as a missing dataset", async () => {
  for (
    const file of [
      // zfs-fuse with no daemon socket, and with a socket its dead daemon left behind.
      "stderr_daemon_down.txt",
      "stderr_daemon_stale_socket.txt",
      // OpenZFS without its kernel module, and without /dev/zfs.
      "openzfs/stderr_modules_not_loaded.txt",
      "openzfs/stderr_no_dev_zfs.txt",
    ]
  ) {
    assert.equal(classifyZfsError(await fixture(file)), "unavailable", file);
  }
  // A key file that is missing stays bad input; a missing dataset stays not_found.
  assert.equal(classifyZfsError(await fixture("openzfs/stderr_create_missing_key.txt")), "invalid");
  assert.equal(classifyZfsError(await fixture("stderr_get_not_found.txt")), "not_found");
});

Deno.test("Zfs turns zfs-fuse's daemon-down stderr into ZfsError unavailable that says what to do", async () => {
  const { runner, zfs } = setup("tpool/nomad");
  runner.on(GET_PREFIX, fails(await fixture("stderr_daemon_down.txt")));
  const err = await assertRejectsZfs(zfs.getProperties("tpool/nomad/v1", ["type"]), "unavailable");
  // Known at once: no second read of the parent.
  assert.equal(runner.calls.length, 1);
  assert.deepEqual(toGrpcStatus(err), {
    code: Code.UNAVAILABLE,
    details: `ZFS operation "/sbin/zfs get" failed (unavailable): ZFS cannot be reached ` +
      `(connect: No such file or directory; Please make sure that the zfs-fuse daemon is running.; ` +
      `internal error: failed to initialize ZFS library); this command changed nothing: ` +
      `start the zfs-fuse daemon or load the ZFS kernel module, then retry`,
  });
});

// ---------------------------------------------------------------------------------------------
// "Does not exist" below the anchor counts only while the anchor is visible

const ANCHOR = "tpool/nomad";
const anchorRead = zfsArgs.get("type", ANCHOR);
const parentRow = { stdout: `${ANCHOR}\ttype\tfilesystem\t-\n` };

Deno.test("Zfs.getProperties believes a missing dataset when the parent dataset is visible", async () => {
  for (const name of ["tpool/nomad/v1", "tpool/nomad/v1@s1"]) {
    const { runner, zfs } = setup(ANCHOR);
    runner.onExact(zfsArgs.get("type", name), fails(await fixture("stderr_get_not_found.txt")));
    runner.onExact(anchorRead, parentRow);
    assert.equal(await zfs.getProperties(name, ["type"], 900), undefined, name);
    assert.deepEqual(runner.argvs, [zfsArgs.get("type", name), anchorRead], name);
    // The parent is asked within the caller's time limit too.
    assert.deepEqual(runner.calls[1]?.options, { timeoutMs: 900 });
  }
});

Deno.test("Zfs.getProperties answers unavailable when the pool is not imported", async () => {
  const { runner, zfs } = setup(ANCHOR);
  // What zfs-fuse says of both after `zpool export`.
  runner.onExact(zfsArgs.get("type", "tpool/nomad/busy"), {
    code: 1,
    stderr: await fixture("stderr_get_pool_exported.txt"),
  });
  runner.onExact(anchorRead, fails(await fixture("stderr_get_parent_pool_exported.txt")));
  const err = await assertRejectsZfs(
    zfs.getProperties("tpool/nomad/busy", ["type"]),
    "unavailable",
  );
  assert.deepEqual(err.argv, zfsArgs.get("type", "tpool/nomad/busy"));
  assert.match(
    err.stderr,
    /'tpool\/nomad\/busy': dataset does not exist\ncannot open 'tpool\/nomad'/,
  );
  assert.deepEqual(toGrpcStatus(err), {
    code: Code.UNAVAILABLE,
    details: `ZFS operation "/sbin/zfs get" failed (unavailable): the parent dataset ` +
      `"tpool/nomad" is not visible either, so ZFS cannot see the pool (not imported, the ZFS ` +
      `daemon or module not running, or no such dataset); nothing was changed: retry once ` +
      `"zfs list tpool/nomad" answers`,
  });
});

Deno.test("Zfs.getProperties answers unavailable when the daemon goes away between the two reads", async () => {
  const { runner, zfs } = setup(ANCHOR);
  runner.onExact(
    zfsArgs.get("type", "tpool/nomad/v1"),
    fails(await fixture("stderr_get_not_found.txt")),
  );
  runner.onExact(anchorRead, fails(await fixture("stderr_daemon_stale_socket.txt")));
  await assertRejectsZfs(zfs.getProperties("tpool/nomad/v1", ["type"]), "unavailable");
});

Deno.test("Zfs.getProperties passes on other failures of the parent's read", async () => {
  const { runner, zfs } = setup(ANCHOR);
  runner.onExact(
    zfsArgs.get("type", "tpool/nomad/v1"),
    fails(await fixture("stderr_get_not_found.txt")),
  );
  runner.onExact(anchorRead, { code: 137, timedOut: true });
  const err = await assertRejectsZfs(zfs.getProperties("tpool/nomad/v1", ["type"]), "timeout");
  assert.deepEqual(err.argv, anchorRead);
});

Deno.test("Zfs.getProperties asks nothing more of the parent itself or of names outside it", async () => {
  // The parent's own absence is for its caller to report (health, GetCapacity).
  for (const name of [ANCHOR, "other/nomad/v1", "tpool/nomadic"]) {
    const { runner, zfs } = setup(ANCHOR);
    runner.on(GET_PREFIX, fails(await fixture("stderr_get_not_found.txt")));
    assert.equal(await zfs.getProperties(name, ["type"]), undefined, name);
    assert.equal(runner.calls.length, 1, name);
  }
});

Deno.test("Zfs.getTree believes a missing root below the parent only when the parent is visible", async () => {
  const visible = setup(ANCHOR);
  visible.runner.on(TREE_PREFIX, fails(await fixture("stderr_get_not_found.txt")));
  visible.runner.onExact(anchorRead, parentRow);
  assert.equal(await visible.zfs.getTree("tpool/nomad/v1", 1, ["type"]), undefined);
  assert.deepEqual(visible.runner.argvs, [zfsArgs.tree("tpool/nomad/v1", 1, "type"), anchorRead]);

  const exported = setup(ANCHOR);
  exported.runner.on(TREE_PREFIX, fails(await fixture("stderr_get_pool_exported.txt")));
  exported.runner.onExact(anchorRead, fails(await fixture("stderr_get_parent_pool_exported.txt")));
  const err = await assertRejectsZfs(
    exported.zfs.getTree("tpool/nomad/busy", 1, ["type"]),
    "unavailable",
  );
  assert.equal(toGrpcStatus(err).code, Code.UNAVAILABLE);
});

Deno.test("Zfs.getTree of the parent itself answers unavailable when it is not visible", async () => {
  // A listing that cannot see the parent would read as "no volumes".
  const { runner, zfs } = setup(ANCHOR);
  runner.on(TREE_PREFIX, fails(await fixture("stderr_get_parent_pool_exported.txt")));
  const err = await assertRejectsZfs(zfs.getTree(ANCHOR, 2, ["type"]), "unavailable");
  assert.equal(runner.calls.length, 1);
  assert.match(toGrpcStatus(err).details, /the parent dataset "tpool\/nomad" is not visible/);
});

// ---------------------------------------------------------------------------------------------
// setProperties: one zfs set where zfs takes several, else one at a time, learnt once

const SIZES = [["quota", "209715200"], ["refquota", "104857600"], [
  "refreservation",
  "104857600",
]] as const;

Deno.test("Zfs.setProperties sets several properties in one zfs set, in the order given", async () => {
  const { runner, zfs } = setup();
  runner.on(["/sbin/zfs", "set"], {});
  await zfs.setProperties("tpool/nomad/v", SIZES);
  await zfs.setProperties("tpool/nomad/v", [["refquota", "1"]]);
  await zfs.setProperties("tpool/nomad/v", []);
  assert.deepEqual(runner.argvs, [
    [
      "/sbin/zfs",
      "set",
      "quota=209715200",
      "refquota=104857600",
      "refreservation=104857600",
      "tpool/nomad/v",
    ],
    ["/sbin/zfs", "set", "refquota=1", "tpool/nomad/v"],
  ]);
});

Deno.test("Zfs.setProperties falls back to one at a time on a zfs that takes one, and remembers", async () => {
  const { runner, zfs, lines } = setup();
  // zfs-fuse reads the second property as a dataset name.
  const refused = (await fixture("stderr_set_many_one_at_a_time.txt"))
    .replace("refquota=80M", "refquota=104857600");
  runner.when((argv) => argv[1] === "set" && argv.length > 4, fails(refused));
  runner.on(["/sbin/zfs", "set"], {});
  await zfs.setProperties("tpool/nomad/v", SIZES);
  await zfs.setProperties("tpool/nomad/w", SIZES.slice(0, 2));
  assert.deepEqual(runner.argvs, [
    [
      "/sbin/zfs",
      "set",
      "quota=209715200",
      "refquota=104857600",
      "refreservation=104857600",
      "tpool/nomad/v",
    ],
    ["/sbin/zfs", "set", "quota=209715200", "tpool/nomad/v"],
    ["/sbin/zfs", "set", "refquota=104857600", "tpool/nomad/v"],
    ["/sbin/zfs", "set", "refreservation=104857600", "tpool/nomad/v"],
    // Learnt: no second try of several at once.
    ["/sbin/zfs", "set", "quota=209715200", "tpool/nomad/w"],
    ["/sbin/zfs", "set", "refquota=104857600", "tpool/nomad/w"],
  ]);
  assert.equal(
    lines.map((l) => JSON.parse(l)).filter((r) => r.level === "info").length,
    1,
  );
});

Deno.test("Zfs.setProperties in any order runs the one-at-a-time sets at once", async () => {
  const { runner, zfs } = setup();
  const refused = (await fixture("stderr_set_many_one_at_a_time.txt"))
    .replace("refquota=80M", "refquota=104857600");
  runner.when((argv) => argv[1] === "set" && argv.length > 4, fails(refused));
  // Each single set takes a few milliseconds: count how many were running together.
  let running = 0;
  let most = 0;
  runner.on(["/sbin/zfs", "set"], async () => {
    most = Math.max(most, ++running);
    await new Promise((r) => setTimeout(r, 5));
    running--;
    return {};
  });
  await zfs.setProperties("tpool/nomad/v", SIZES, { inAnyOrder: true });
  assert.equal(most, SIZES.length);
  assert.deepEqual(
    runner.argvs.slice(1).map((a) => a[2]).sort(),
    SIZES.map(([n, v]) => `${n}=${v}`).sort(),
  );
});

Deno.test("Zfs.setProperties in any order throws the first property zfs refused", async () => {
  const { runner, zfs } = setup();
  const refused = (await fixture("stderr_set_many_one_at_a_time.txt"))
    .replace("refquota=80M", "refquota=104857600");
  runner.when((argv) => argv[1] === "set" && argv.length > 4, fails(refused));
  runner.on(
    ["/sbin/zfs", "set", "refreservation=104857600"],
    fails(await fixture("stderr_set_busy_refreservation_no_space.txt")),
  );
  runner.on(["/sbin/zfs", "set"], {});
  await assertRejectsZfs(
    zfs.setProperties("tpool/nomad/v", SIZES, { inAnyOrder: true }),
    "no_space",
  );
  // The others were still set.
  assert.equal(runner.argvs.length, 1 + SIZES.length);
});

Deno.test("Zfs.setProperties throws what zfs refused, without falling back", async () => {
  for (
    const file of [
      "stderr_set_busy_refreservation_no_space.txt",
      "openzfs/stderr_set_busy_refreservation_no_space.txt",
    ]
  ) {
    const { runner, zfs } = setup();
    runner.on(["/sbin/zfs", "set"], fails(await fixture(file)));
    const err = await assertRejectsZfs(zfs.setProperties("tpool/nomad/busy", SIZES), "no_space");
    assert.equal(toGrpcStatus(err).code, Code.RESOURCE_EXHAUSTED, file);
    assert.equal(runner.calls.length, 1, file);
  }
});

const PROBE = ["/sbin/zfs", "receive", "-n", "-u", "-x", "mountpoint", "tpool/nomad/.restore-x"];

Deno.test("Zfs.receiveOverrides learns once that zfs-fuse's receive takes no -x", async () => {
  const { runner, zfs, lines } = setup();
  runner.onExact(PROBE, fails(await fixture("stderr_receive_exclude.txt"), 2));
  assert.equal(await zfs.receiveOverrides("tpool/nomad/.restore-x"), false);
  assert.equal(await zfs.receiveOverrides("tpool/nomad/other"), false);
  assert.equal(runner.calls.length, 1, "asked once per Zfs");
  assert.ok(lines.some((l) => l.includes("zfs receive takes no -x or -o")));
  runner.assertNoUnexpected();
});

Deno.test("Zfs.receiveOverrides takes OpenZFS's failure to read an empty stream as a yes", async () => {
  const { runner, zfs } = setup();
  // OpenZFS parsed -x, then found no stream on its empty stdin.
  runner.onExact(PROBE, fails("cannot receive: failed to read from stream\n"));
  assert.equal(await zfs.receiveOverrides("tpool/nomad/.restore-x"), true);
  assert.equal(await zfs.receiveOverrides("tpool/nomad/.restore-x"), true);
  assert.equal(runner.calls.length, 1);
});

Deno.test("Zfs.receiveOverrides asks again after zfs could not be reached", async () => {
  const { runner, zfs } = setup();
  runner.onExact(PROBE, fails(await fixture("stderr_daemon_down.txt")), { times: 1 });
  runner.onExact(PROBE, fails(await fixture("stderr_receive_exclude.txt"), 2));
  await assertRejectsZfs(zfs.receiveOverrides("tpool/nomad/.restore-x"), "unavailable");
  assert.equal(await zfs.receiveOverrides("tpool/nomad/.restore-x"), false);
  assert.equal(runner.calls.length, 2);
});

Deno.test("Zfs.propertiesFrom reads what a zfs send -p stream decided (captured zfs-fuse output)", async () => {
  const { runner, zfs } = setup();
  runner.onExact(
    [
      "/sbin/zfs",
      "get",
      "-Hp",
      "-s",
      "received",
      "-o",
      "name,property,value,source",
      "all",
      "tpool/nomad/pg",
      "tpool/nomad/pg@s1",
    ],
    { stdout: await fixture("zfs_get_received.txt") },
  );
  const got = await zfs.propertiesFrom(["tpool/nomad/pg", "tpool/nomad/pg@s1"], ["received"]);
  assert.deepEqual([...got.keys()], ["tpool/nomad/pg"]);
  assert.deepEqual(
    Object.fromEntries([...got.get("tpool/nomad/pg")!].map(([k, v]) => [k, v.value])),
    {
      mountpoint: "/tmp/t/host-path",
      devices: "on",
      setuid: "on",
      "org.zfs-csi:managed": "yes",
      "other.tool:x": "1",
    },
  );
});

Deno.test("Zfs.propertiesFrom keeps only what zfs says comes from the sources asked", async () => {
  const { runner, zfs } = setup();
  runner.on(["/sbin/zfs", "get"], {
    stdout: "tpool/nomad/pg\tmountpoint\t/x\tlocal\ntpool/nomad/pg\tcompression\ton\treceived\n" +
      "tpool/nomad/pg@s\tsnapprop:z\t2\treceived\n",
  });
  const got = await zfs.propertiesFrom(["tpool/nomad/pg", "tpool/nomad/pg@s"], ["received"]);
  assert.deepEqual([...got.get("tpool/nomad/pg")!.keys()], ["compression"]);
  assert.deepEqual([...got.get("tpool/nomad/pg@s")!.keys()], ["snapprop:z"]);
});

Deno.test("Zfs.knownProperties asks zfs about each name once", async () => {
  const { runner, zfs } = setup();
  const bad = await fixture("stderr_get_bad_property.txt");
  runner.onExact(
    [...GET_PREFIX, "aclmode,mountpoint", "tpool/nomad"],
    fails(bad.replace("bogusprop", "aclmode"), 2),
  );
  runner.onExact([...GET_PREFIX, "mountpoint", "tpool/nomad"], {
    stdout: "tpool/nomad\tmountpoint\t/x\tdefault\n",
  });
  runner.onExact([...GET_PREFIX, "setuid", "tpool/nomad"], {
    stdout: "tpool/nomad\tsetuid\ton\tdefault\n",
  });
  assert.deepEqual(await zfs.knownProperties("tpool/nomad", ["aclmode", "mountpoint"]), [
    "mountpoint",
  ]);
  assert.deepEqual(
    await zfs.knownProperties("tpool/nomad", ["mountpoint", "aclmode", "setuid"]),
    ["mountpoint", "setuid"],
  );
  assert.equal(runner.calls.length, 3, "only setuid was asked the second time");
  runner.assertNoUnexpected();
});

/** `zpool get all tank` of an OpenZFS pool, in the table form. */
const OPENZFS_POOL = [
  "NAME  PROPERTY                     VALUE    SOURCE",
  "tank  version                      -        default",
  "tank  feature@lz4_compress         active   local",
  "tank  feature@large_blocks         enabled  local",
  "tank  feature@embedded_data        active   local",
  "",
].join("\n");

Deno.test("Zfs.streamSupport reads zfs version and the pool's features once per pool", async () => {
  const { runner, zfs } = setup();
  runner
    .onExact(["/sbin/zfs", "version"], { stdout: "zfs-2.1.11-1\nzfs-kmod-2.1.11-1\n" })
    .onExact(["/sbin/zpool", "get", "all", "tank"], { stdout: OPENZFS_POOL })
    .onExact(["/sbin/zpool", "get", "all", "other"], {
      stdout: OPENZFS_POOL.replaceAll("tank", "other"),
    });
  const first = await zfs.streamSupport("tank");
  assert.equal(first.zfsVersion, "2.1.11");
  assert.equal(first.features.get("large_blocks"), "enabled");
  assert.equal(await zfs.streamSupport("tank"), first, "remembered");
  assert.equal((await zfs.streamSupport("other")).pool, "other");
  assert.deepEqual(runner.argvs, [
    ["/sbin/zfs", "version"],
    ["/sbin/zpool", "get", "all", "tank"],
    ["/sbin/zpool", "get", "all", "other"],
  ]);
  // Asked afresh (a refusal an upgrade may have lifted): read again.
  await zfs.streamSupport("tank", { fresh: true });
  assert.equal(runner.argvs.filter((a) => a.includes("tank")).length, 2);
});

Deno.test("Zfs.streamSupport of zfs-fuse: no zfs version, pool version 23", async () => {
  const { runner, zfs } = setup();
  runner
    .onExact(["/sbin/zfs", "version"], fails("unrecognized command 'version'\nusage: ...\n", 2))
    .onExact(["/sbin/zpool", "get", "all", "tpool"], {
      stdout: await fixture("zpool_get_all.txt"),
    });
  const support = await zfs.streamSupport("tpool");
  assert.equal(support.zfsVersion, undefined);
  assert.equal(support.poolVersion, "23");
  assert.equal(support.features.size, 0);
});

Deno.test("Zfs.streamSupport remembers no failure: the next call reads again", async () => {
  const { runner, zfs } = setup();
  runner
    .onExact(["/sbin/zfs", "version"], { stdout: "zfs-2.3.2-2\n" })
    .onExact(
      ["/sbin/zpool", "get", "all", "tank"],
      fails(await fixture("stderr_daemon_down.txt")),
      {
        times: 1,
      },
    )
    .onExact(["/sbin/zpool", "get", "all", "tank"], { stdout: OPENZFS_POOL });
  await assertRejectsZfs(zfs.streamSupport("tank"), "unavailable");
  assert.equal((await zfs.streamSupport("tank")).features.get("lz4_compress"), "active");
});
