import assert from "node:assert/strict";
import { FakeRunner, fakeTools } from "../../tests/support/fake_runner.ts";
import { openZfsExitCode, openZfsFixture } from "../../tests/support/openzfs_fixtures.ts";
import { BlockTools } from "./tools.ts";

Deno.test("BlockTools looks for its programs only when one is first run (a plugin without zvols never does)", async () => {
  const runner = new FakeRunner().on(["/sbin/wipefs"], {});
  const asked: string[] = [];
  const tools = new BlockTools(runner, {
    timeoutMs: 1000,
    log: fakeTools(runner).log,
    program: (name) => {
      asked.push(name);
      return `/sbin/${name}`;
    },
  });
  assert.deepEqual(asked, []);
  await tools.wipe("/dev/zd0");
  await tools.wipe("/dev/zd0");
  assert.deepEqual(asked, ["wipefs"]);
  assert.deepEqual(runner.argvs.map((a) => a[0]), ["/sbin/wipefs", "/sbin/wipefs"]);
});

Deno.test("BlockTools reads lsblk and zvol_id as captured on OpenZFS; a missing link is no device", async () => {
  const link = "/dev/zvol/tpool/nomad/z1";
  const runner = new FakeRunner()
    .onExact(["lsblk", "-adnrp", "-o", "NAME,MAJ:MIN,TYPE", link], {
      stdout: openZfsFixture("lsblk_zvol.txt"),
    })
    .on(["lsblk"], {
      code: openZfsExitCode("lsblk_missing"),
      stderr: openZfsFixture("stderr_lsblk_missing.txt"),
    })
    .onExact(["zvol_id", "/dev/zd0"], { stdout: openZfsFixture("zvol_id.txt") });
  const tools = new BlockTools(runner, {
    timeoutMs: 1000,
    log: fakeTools(runner).log,
    program: (name) => name,
  });
  assert.deepEqual(await tools.blockDevice(link), { name: "/dev/zd0", rdev: 230 * 256 });
  assert.equal(await tools.blockDevice("/dev/zvol/tpool/nomad/none"), undefined);
  assert.equal(await tools.datasetOf("/dev/zd0"), "tpool/nomad/z1");
  runner.assertNoUnexpected();
});
