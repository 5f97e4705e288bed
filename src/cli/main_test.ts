import assert from "node:assert/strict";
import { RESERVED_NAMES, SUBCOMMANDS } from "./commands.ts";
import { EXIT_USAGE, runCli, subcommandsHelp } from "./main.ts";
import { memoryIo } from "./test_io.ts";

Deno.test("runCli: an unknown subcommand gives one line naming the subcommands, exit 2", async () => {
  const io = memoryIo();
  assert.equal(await runCli(["lsit"], io), EXIT_USAGE);
  assert.equal(io.stderr.length, 1);
  assert.match(io.stderr[0]!, /^zfs-csi: unknown subcommand "lsit"; subcommands: list, undelete/);
  assert.equal(io.stdout.length, 0);
});

Deno.test("runCli: help lists every subcommand; help and --help show each one's usage", async () => {
  const io = memoryIo();
  assert.equal(await runCli(["help"], io), 0);
  for (const name of Object.keys(SUBCOMMANDS)) {
    assert.match(io.stdout[0]!, new RegExp(`\\n  ${name} `));
  }
  for (const name of Object.keys(SUBCOMMANDS)) {
    const a = memoryIo();
    const b = memoryIo();
    assert.equal(await runCli(["help", name], a), 0);
    assert.equal(await runCli([name, "--help"], b), 0);
    assert.match(a.stdout[0]!, new RegExp(`^Usage: zfs-csi ${name} `));
    assert.deepEqual(a.stdout, b.stdout);
  }
  assert.equal(await runCli(["help", "nope"], memoryIo()), EXIT_USAGE);
});

Deno.test("no subcommand takes a name of Nomad's host volume operations", () => {
  for (const name of RESERVED_NAMES) assert.ok(!Object.hasOwn(SUBCOMMANDS, name), name);
  assert.ok(!Object.hasOwn(SUBCOMMANDS, "help"));
});

Deno.test("runCli: a wrong command line, or one this build may not run, is one line and exit 2", async () => {
  const io = memoryIo();
  assert.equal(await runCli(["list", "--node-id", "n1"], io), EXIT_USAGE);
  assert.deepEqual(io.stderr, [
    "zfs-csi list: Missing required flag --parent-dataset (for example tank/nomad)",
  ]);
  // This test may not run zfs: the build's refusal is one line too.
  const denied = memoryIo();
  assert.equal(
    await runCli(["list", "--parent-dataset", "tank/nomad", "--node-id", "n1"], denied),
    EXIT_USAGE,
  );
  assert.match(denied.stderr[0]!, /^zfs-csi list: this build may not run "zfs"/);
});

Deno.test("the server's --help ends with every subcommand; a subcommand typo names the one meant", async () => {
  const text = subcommandsHelp();
  assert.match(text, /^\nOperator subcommands/);
  for (const name of Object.keys(SUBCOMMANDS)) assert.match(text, new RegExp(`\n  ${name} +\\S`));
  const io = memoryIo();
  assert.equal(await runCli(["snapshot", "pg"], io), EXIT_USAGE);
  assert.match(io.stderr[0]!, /; did you mean "snapshots"\?$/);
});
