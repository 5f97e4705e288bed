import assert from "node:assert/strict";
import {
  type CommandEvent,
  DenoCommandRunner,
  DenoStreamRunner,
  ObservedRunner,
  ObservedStreamRunner,
  type StreamedExit,
} from "./run.ts";
import { FakeRunner, UnexpectedCommandError } from "../tests/support/fake_runner.ts";

// The runner's time limit is covered by the integration tests, which may start programs;
// unit tests run without --allow-run.

Deno.test("DenoCommandRunner.run refuses an empty argument list before starting anything", async () => {
  await assert.rejects(new DenoCommandRunner(1000).run([]), {
    name: "TypeError",
    message: "Cannot run an empty argument list",
  });
});

Deno.test("DenoStreamRunner refuses a pipe beside a file descriptor before starting anything", () => {
  // A command given a file (node:child_process) has no Web streams to hand out.
  const runner = new DenoStreamRunner();
  assert.throws(() => runner.spawn(["zfs", "receive"], { stdin: "piped", stdout: { fd: 1 } }), {
    name: "TypeError",
    message: "A command with a file as stdin or stdout pipes nothing else",
  });
  assert.throws(() => runner.spawn([], { stdout: { fd: 1 } }), {
    name: "TypeError",
    message: "Cannot run an empty argument list",
  });
});

// The scripted runner every unit test relies on must itself behave as documented.

Deno.test("FakeRunner replays scripted results and records every argv with its options", async () => {
  const runner = new FakeRunner()
    .on(["zfs", "get"], { stdout: "t\ttype\tfilesystem\t-\n" })
    .onExact(["mount"], { code: 0, stdout: "listing" })
    .on(["mount"], { code: 32, stderr: "mount failed" });
  assert.deepEqual(await runner.run(["zfs", "get", "-Hp", "type", "t"], { timeoutMs: 5 }), {
    code: 0,
    stdout: "t\ttype\tfilesystem\t-\n",
    stderr: "",
    timedOut: false,
  });
  assert.equal((await runner.run(["mount"])).stdout, "listing");
  assert.equal((await runner.run(["mount", "--bind", "a", "b"])).code, 32);
  assert.deepEqual(runner.argvs, [["zfs", "get", "-Hp", "type", "t"], ["mount"], [
    "mount",
    "--bind",
    "a",
    "b",
  ]]);
  assert.deepEqual(runner.calls[0]?.options, { timeoutMs: 5 });
});

Deno.test("FakeRunner uses a rule limited by times only that often", async () => {
  const runner = new FakeRunner()
    .on(["zfs"], { code: 1, stderr: "first" }, { times: 1 })
    .when((argv) => argv[0] === "zfs", (argv) => ({ stdout: argv.join(" ") }));
  assert.equal((await runner.run(["zfs", "a"])).stderr, "first");
  assert.equal((await runner.run(["zfs", "b"])).stdout, "zfs b");
  assert.equal((await runner.run(["zfs", "c"])).stdout, "zfs c");
});

Deno.test("FakeRunner fails loudly on an unexpected command", async () => {
  const runner = new FakeRunner().on(["zfs", "get"], {});
  await assert.rejects(runner.run(["zfs", "destroy", "-r", "tank"]), (err: unknown) => {
    assert.ok(err instanceof UnexpectedCommandError);
    assert.deepEqual(err.argv, ["zfs", "destroy", "-r", "tank"]);
    assert.match(
      err.message,
      /^Unexpected command \["zfs","destroy","-r","tank"\]; scripted: prefix/,
    );
    return true;
  });
  assert.throws(() => runner.assertNoUnexpected(), UnexpectedCommandError);
  assert.equal(runner.calls.length, 1);
  assert.doesNotThrow(() => new FakeRunner().assertNoUnexpected());
});

Deno.test("ObservedRunner reports every command's argv, code, kill and duration", async () => {
  const events: CommandEvent[] = [];
  const inner = new FakeRunner()
    .on(["zfs", "get"], { stdout: "x" })
    .on(["zfs", "destroy"], { code: 1, stderr: "busy" })
    .on(["mount"], { code: 137, timedOut: true });
  const runner = new ObservedRunner(inner, (e) => events.push(e));
  assert.equal((await runner.run(["zfs", "get", "used", "t/v"])).stdout, "x");
  assert.equal((await runner.run(["zfs", "destroy", "t/v"])).code, 1);
  await runner.run(["mount"]);
  await assert.rejects(runner.run(["umount", "/x"]), UnexpectedCommandError);
  assert.deepEqual(events.map(({ seconds: _, ...e }) => e), [
    { argv: ["zfs", "get", "used", "t/v"], code: 0, killed: false },
    { argv: ["zfs", "destroy", "t/v"], code: 1, killed: false },
    { argv: ["mount"], code: 137, killed: true },
    { argv: ["umount", "/x"], code: -1, killed: false },
  ]);
  assert.ok(events.every((e) => e.seconds >= 0 && e.seconds < 10));
});

Deno.test("ObservedStreamRunner reports a streamed command when it ends, not when it starts", async () => {
  const events: CommandEvent[] = [];
  const { promise: exit, resolve: end } = Promise.withResolvers<StreamedExit>();
  const runner = new ObservedStreamRunner({
    spawn: () => ({ stdin: null, stdout: null, exit, kill() {} }),
  }, (e) => events.push(e));
  const cmd = runner.spawn(["zfs", "send", "t/v@s"]);
  await Promise.resolve();
  assert.equal(events.length, 0);
  end({ code: 0, stderr: "", killed: true });
  await cmd.exit;
  await new Promise((r) => setTimeout(r, 0));
  assert.deepEqual(events.map(({ seconds: _, ...e }) => e), [
    { argv: ["zfs", "send", "t/v@s"], code: 0, killed: true },
  ]);
});
