/**
 * The real command runner (src/run.ts) against real programs: it needs --allow-run, so it lives
 * here rather than with the unit tests, which run without it.
 */

import assert from "node:assert/strict";
import { open } from "node:fs/promises";
import { DenoCommandRunner, DenoStreamRunner, KILL_GRACE_MS } from "../../src/run.ts";

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

/**
 * Starts, through `start`, a shell that leaves a background `sleep` holding its stdout and
 * stderr: killing the shell then does not end its output, as with a command blocked in the
 * kernel (which cannot be made here). Kills the sleep afterwards.
 */
async function withOrphanHoldingOutput<T>(start: (argv: string[]) => Promise<T>): Promise<T> {
  const pidFile = await Deno.makeTempFile();
  try {
    return await start(["sh", "-c", `sleep 60 & echo $! > ${pidFile}; wait`]);
  } finally {
    const pid = Number((await Deno.readTextFile(pidFile)).trim());
    if (pid > 0) Deno.kill(pid, "SIGKILL");
    await Deno.remove(pidFile);
  }
}

// The abandoned wait for the orphan's output ends after the test, once the sleep is killed.
const ORPHAN = { sanitizeOps: false, sanitizeResources: false };

Deno.test({
  name: "DenoCommandRunner stops waiting for a killed command whose output does not end",
  ...ORPHAN,
  fn: async () => {
    const runner = new DenoCommandRunner(60_000);
    const started = performance.now();
    const res = await withOrphanHoldingOutput((argv) => runner.run(argv, { timeoutMs: 200 }));
    const elapsed = performance.now() - started;
    assert.equal(res.timedOut, true);
    assert.equal(res.code, -1);
    assert.match(res.stderr, /^sh \(pid \d+\) did not end within 5000 ms of SIGKILL/);
    assert.ok(elapsed >= KILL_GRACE_MS && elapsed < KILL_GRACE_MS + 5_000, `took ${elapsed} ms`);
  },
});

Deno.test({
  name: "DenoStreamRunner settles a killed command whose output does not end, piped or to a file",
  ...ORPHAN,
  fn: async () => {
    const runner = new DenoStreamRunner();
    const out = await Deno.makeTempFile();
    const file = await open(out, "w");
    try {
      for (const stdout of ["piped", { fd: file.fd }] as const) {
        const started = performance.now();
        const exit = await withOrphanHoldingOutput(async (argv) => {
          const cmd = runner.spawn(argv, { stdout });
          await new Promise((r) => setTimeout(r, 200));
          cmd.kill();
          return await cmd.exit;
        });
        const elapsed = performance.now() - started;
        const kind = typeof stdout === "string" ? stdout : "file";
        assert.equal(exit.killed, true, kind);
        assert.equal(exit.code, -1, kind);
        assert.match(exit.stderr, /did not end within 5000 ms of SIGKILL/, kind);
        assert.ok(elapsed < KILL_GRACE_MS + 5_000, `${kind}: took ${elapsed} ms`);
      }
    } finally {
      await file.close();
      await Deno.remove(out);
    }
  },
});

Deno.test("DenoStreamRunner: a killed command that ends is not held for the grace", async () => {
  const runner = new DenoStreamRunner();
  const started = performance.now();
  const cmd = runner.spawn(["sleep", "30"]);
  cmd.kill();
  const exit = await cmd.exit;
  assert.equal(exit.killed, true);
  assert.notEqual(exit.code, -1, "the real exit, not the abandoned one");
  assert.ok(performance.now() - started < 2_000);
});
