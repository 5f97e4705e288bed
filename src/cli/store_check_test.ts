import assert from "node:assert/strict";
import { memoryIo, TEST_FLAGS } from "./test_io.ts";
import { run, usage } from "./store_check.ts";
import { runCli } from "./main.ts";

Deno.test("store check passes a directory store, printing each check", async () => {
  const dir = await Deno.makeTempDir({ dir: "/tmp", prefix: "zfs-csi-store-check-" });
  try {
    const io = memoryIo();
    const code = await run(["check", ...TEST_FLAGS, "--store", `file://${dir}`], io);
    assert.equal(code, 0, io.stdout.join("\n") + io.stderr.join("\n"));
    assert.equal(io.stdout[0], `Checking file://${dir}:`);
    assert.deepEqual(io.stdout.slice(1, -1).map((l) => l.trim().split(":")[0]), [
      "ok       reachable",
      "ok       listing",
      "ok       put, get and delete",
      "ok       conditional writes",
    ]);
    assert.match(io.stdout.at(-1)!, /^Every check passed/);
    // The probe leaves nothing behind but the layout's own empty directory.
    const left = [...Deno.readDirSync(dir)].map((e) => e.name).filter((n) => !n.startsWith("."));
    assert.deepEqual(left.length <= 1, true, left.join(","));
    const json = memoryIo();
    assert.equal(
      await run(["check", ...TEST_FLAGS, "--store", `file://${dir}`, "--json"], json),
      0,
    );
    const report = JSON.parse(json.stdout.join("\n"));
    assert.equal(report.ok, true);
    assert.deepEqual(report.conditional, { kind: "enforced" });
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
});

Deno.test("store check fails a directory store that is not there, and needs --store", async () => {
  const io = memoryIo();
  const code = await run(
    ["check", ...TEST_FLAGS, "--store", "file:///tmp/zfs-csi-no-such-dir"],
    io,
  );
  assert.equal(code, 1);
  assert.match(io.stdout[1]!, /^ {2}FAILED +reachable: .*does not exist/);
  assert.match(io.stdout.at(-1)!, /check\(s\) failed\.$/);
  const without = memoryIo();
  assert.equal(await runCli(["store", "check", ...TEST_FLAGS], without), 2);
  assert.match(without.stderr.join("\n"), /store check needs the store/);
  const wrong = memoryIo();
  assert.equal(await runCli(["store", "fix", ...TEST_FLAGS, "--store", "file:///tmp"], wrong), 2);
  assert.match(wrong.stderr.join("\n"), /store takes one action: check/);
  assert.match(usage, /^Usage: zfs-csi store check /);
});
