import assert from "node:assert/strict";
import { FakeRunner } from "../../tests/support/fake_runner.ts";
import { FakePool } from "../../tests/support/fake_pool.ts";
import { run } from "./purge.ts";
import { memoryIo, TEST_FLAGS, trashMarks } from "./test_io.ts";

function setup() {
  const runner = new FakeRunner();
  const pool = new FakePool(runner);
  pool.add("tank/nomad");
  // Deleted a moment ago: the background purge would wait for the retention and an hour of
  // watching; the operator's purge does not.
  const now = String(Math.floor(Date.now() / 1000));
  pool.add("tank/nomad/.deleted-1-gone", trashMarks("tank/nomad/gone", now));
  pool.add("tank/nomad/.deleted-1-gone@.deleted-1-old", trashMarks("tank/nomad/gone@old", now));
  pool.add("tank/nomad/.deleted-2-held", trashMarks("tank/nomad/held", now));
  pool.add("tank/nomad/.deleted-2-held@autosnap_daily", {});
  pool.add("tank/nomad/.deleted-3-byhand", { "org.zfs-csi:managed": "yes" });
  return { runner, pool };
}

Deno.test("purge without --yes lists what would go and destroys nothing", async () => {
  const { runner } = setup();
  const io = memoryIo();
  assert.equal(await run([...TEST_FLAGS], io, { runner }), 0);
  assert.match(io.stdout.join("\n"), /tank\/nomad\/gone/);
  assert.match(io.stdout.join("\n"), /--yes to destroy these 3 now/);
  assert.ok(!runner.argvs.some((a) => a[1] === "destroy"));
});

Deno.test("purge --yes destroys what is marked now, keeps what holds foreign things and says why", async () => {
  const { runner, pool } = setup();
  const io = memoryIo();
  assert.equal(await run([...TEST_FLAGS, "--yes", "--json"], io, { runner }), 0);
  const outcomes = JSON.parse(io.stdout.join("\n")) as Array<Record<string, unknown>>;
  const by = new Map(outcomes.map((o) => [o.deletedName, o]));
  assert.equal(by.get("tank/nomad/gone")?.purged, true);
  assert.equal(by.get("tank/nomad/held")?.purged, false);
  assert.match(String(by.get("tank/nomad/held")?.reason), /autosnap_daily/);
  assert.ok(!pool.has("tank/nomad/.deleted-1-gone"));
  assert.ok(pool.has("tank/nomad/.deleted-2-held@autosnap_daily"));
  assert.ok(pool.has("tank/nomad/.deleted-3-byhand"), "never what lacks the marks");
  // Its own snapshot one by one, then the dataset without -r (trash.ts).
  assert.deepEqual(runner.argvs.filter((a) => a[1] === "destroy"), [
    ["zfs", "destroy", "tank/nomad/.deleted-1-gone@.deleted-1-old"],
    ["zfs", "destroy", "tank/nomad/.deleted-1-gone"],
  ]);
  runner.assertNoUnexpected();
});

Deno.test("purge lists, then removes, the scratch datasets of verifies that are gone, never a running one", async () => {
  const { runner, pool } = setup();
  const mark = (up: number) => `up=${up} pid=7`;
  for (const [name, up] of [["gone", 10], ["running", 9990]] as const) {
    const d = `tank/nomad/.verify-${name}`;
    pool.add(d, { "org.zfs-csi:verify": mark(up), used: "1048576" });
    pool.add(`${d}/data`, { "org.zfs-csi:verify": [mark(up), `inherited from ${d}`] });
  }
  const clock = { uptimeSeconds: () => 10_000 };
  const dry = memoryIo();
  assert.equal(await run([...TEST_FLAGS], dry, { runner, clock }), 0);
  assert.match(dry.stdout.join("\n"), /stale +1 MiB +tank\/nomad\/\.verify-gone/);
  assert.ok(!dry.stdout.join("\n").includes(".verify-running"));
  assert.match(dry.stdout.join("\n"), /--yes to destroy these 4 now/);
  assert.ok(pool.has("tank/nomad/.verify-gone"));
  const io = memoryIo();
  assert.equal(await run([...TEST_FLAGS, "--yes"], io, { runner, clock }), 0);
  assert.match(
    io.stdout.join("\n"),
    /Removed tank\/nomad\/\.verify-gone \(1 MiB\), left by verify process 7/,
  );
  assert.ok(!pool.has("tank/nomad/.verify-gone"));
  assert.ok(pool.has("tank/nomad/.verify-running/data"));
  runner.assertNoUnexpected();
});
