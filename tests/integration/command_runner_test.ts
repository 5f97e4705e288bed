/**
 * The real command runner (src/run.ts) against real programs: it needs --allow-run, so it lives
 * here rather than with the unit tests, which run without it.
 */

import assert from "node:assert/strict";
import { DenoCommandRunner } from "../../src/run.ts";

Deno.test("DenoCommandRunner kills a command that outlives its time limit", async () => {
  const runner = new DenoCommandRunner(60_000);
  const started = performance.now();
  const res = await runner.run(["sleep", "30"], { timeoutMs: 200 });
  const elapsed = performance.now() - started;
  assert.equal(res.timedOut, true);
  assert.notEqual(res.code, 0);
  assert.ok(elapsed < 5_000, `took ${elapsed} ms`);
});

Deno.test("DenoCommandRunner returns output and exit code, with a C locale", async () => {
  const runner = new DenoCommandRunner(10_000);
  const env = await runner.run(["env"]);
  assert.equal(env.code, 0);
  assert.equal(env.timedOut, false);
  assert.match(env.stdout, /^LC_ALL=C$/m);
  const fail = await runner.run(["ls", "/definitely/not/here"]);
  assert.notEqual(fail.code, 0);
  assert.match(fail.stderr, /No such file or directory/);
});

Deno.test("DenoCommandRunner passes arguments without a shell", async () => {
  const runner = new DenoCommandRunner(10_000);
  const res = await runner.run(["echo", "$(id)", ";", "`true`", "a b"]);
  assert.equal(res.stdout, "$(id) ; `true` a b\n");
});
