import assert from "node:assert/strict";
import { FakeRunner, fakeTools } from "../../tests/support/fake_runner.ts";
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
