import assert from "node:assert/strict";
import { FakeRunner } from "../../tests/support/fake_runner.ts";
import { FakePool } from "../../tests/support/fake_pool.ts";
import { run } from "./adopt.ts";
import { memoryIo, TEST_FLAGS } from "./test_io.ts";

function setup() {
  const runner = new FakeRunner();
  const pool = new FakePool(runner);
  pool.add("tank/nomad");
  return { runner, pool };
}

Deno.test("adopt sets the marker on a direct child filesystem, once", async () => {
  const { runner, pool } = setup();
  pool.add("tank/nomad/legacy-data");
  const io = memoryIo();
  assert.equal(await run([...TEST_FLAGS, "legacy-data"], io, { runner }), 0);
  assert.equal(pool.value("tank/nomad/legacy-data", "org.zfs-csi:managed"), "yes");
  assert.match(io.stdout.join("\n"), /volume "legacy-data@node-a"/);
  const again = memoryIo();
  assert.equal(
    await run([...TEST_FLAGS, "tank/nomad/legacy-data", "--json"], again, { runner }),
    0,
  );
  assert.equal(JSON.parse(again.stdout.join("\n")).changed, false);
  assert.equal(runner.argvs.filter((a) => a[1] === "set").length, 1);
  runner.assertNoUnexpected();
});

Deno.test("adopt refuses what cannot be a volume of the parent, changing nothing", async () => {
  const { runner, pool } = setup();
  pool.add("tank/other");
  pool.add("tank/nomad/a");
  pool.add("tank/nomad/a/b");
  pool.add("tank/nomad/.deleted-1-x");
  pool.add("tank/nomad/a@snap");
  for (
    const [target, re] of [
      ["tank/other", /cannot be a volume/],
      ["a/b", /cannot be a volume/],
      [".deleted-1-x", /cannot be a volume/],
      ["missing", /No dataset "tank\/nomad\/missing"/],
    ] as const
  ) {
    await assert.rejects(() => run([...TEST_FLAGS, target], memoryIo(), { runner }), re);
  }
  assert.ok(!runner.argvs.some((a) => a[1] === "set"));
});
