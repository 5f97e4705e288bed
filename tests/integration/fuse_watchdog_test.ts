/**
 * tools/fuse_watchdog.ts against a zfs-fuse daemon that stops answering: SIGSTOP stands in for
 * its deadlock (its threads then answer nothing, as when they wait on each other). Only where
 * zfs-fuse runs; OpenZFS has no daemon to stop.
 */

import assert from "node:assert/strict";
import { fileURLToPath } from "node:url";
import { TestPool, tryRun } from "../support/zfs_pool.ts";

const TOOLS = fileURLToPath(new URL("../../tools/", import.meta.url));

async function daemonPid(): Promise<number | undefined> {
  const r = await tryRun("pgrep", "-x", "zfs-fuse");
  const pid = Number(r.stdout.trim().split("\n")[0]);
  return r.code === 0 && pid > 0 ? pid : undefined;
}

/** Resolves with the child's status, or undefined if it has not ended within `ms`. */
async function endsWithin(
  child: Deno.ChildProcess,
  ms: number,
): Promise<Deno.CommandStatus | undefined> {
  let timer: ReturnType<typeof setTimeout> | undefined;
  const late = new Promise<undefined>((r) => timer = setTimeout(() => r(undefined), ms));
  try {
    return await Promise.race([child.status, late]);
  } finally {
    clearTimeout(timer);
  }
}

Deno.test({
  name: "fuse watchdog: a zfs-fuse that stops answering is restarted and its waiters set free",
  ignore: (await daemonPid()) === undefined,
  fn: async () => {
    await using pool = await TestPool.create();
    const report = await Deno.makeTempFile();
    const watchdog = new Deno.Command(Deno.execPath(), {
      args: [
        "run",
        "--quiet",
        "--frozen",
        `--allow-write=${report}`,
        `--allow-run=ps,cat,${TOOLS}zfs-env.sh`,
        `${TOOLS}fuse_watchdog.ts`,
        "--report",
        report,
        "--stuck-seconds",
        "4",
        "--every-seconds",
        "1",
      ],
      stdout: "null",
      stderr: "piped",
    }).spawn();
    const stopped = (await daemonPid())!;
    const waiters: Deno.ChildProcess[] = [];
    try {
      // Give the watchdog time to start before anything waits.
      await new Promise((r) => setTimeout(r, 1500));
      // fsync: the daemon is killed, and zfs-fuse keeps only what its log or a txg holds.
      using f = await Deno.open(`${pool.mountRoot}/nomad/before`, { write: true, create: true });
      await f.write(new TextEncoder().encode("written before"));
      await f.sync();
      Deno.kill(stopped, "SIGSTOP");
      // A directory listing on one of its filesystems, and a zfs command on its socket.
      for (const [program, ...args] of [["ls", `${pool.mountRoot}/nomad`], ["zfs", "list"]]) {
        waiters.push(
          new Deno.Command(program!, { args, stdout: "null", stderr: "null" }).spawn(),
        );
      }
      assert.equal(await endsWithin(waiters[0]!, 2000), undefined, "ls waits on the daemon");
      for (const [i, w] of waiters.entries()) {
        const status = await endsWithin(w, 30_000);
        assert.ok(status, `waiter ${i} was set free`);
      }
      // The report is written once the daemon runs again.
      let said = "";
      for (let i = 0; i < 300 && said === ""; i++) {
        said = await Deno.readTextFile(report);
        if (said === "") await new Promise((r) => setTimeout(r, 100));
      }
      assert.match(said, /^fuse-watchdog .*: zfs-fuse stopped answering FUSE requests/);
      assert.match(said, /\(ls\) waits in \S+ for \d+s: \S*ls /, said);
      assert.match(said, /\(zfs\) waits in unix_stream\S+ for \d+s: \S*zfs list/, said);
      const restarted = await daemonPid();
      assert.ok(restarted !== undefined && restarted !== stopped, "a new daemon runs");
      // The new daemon imported the pool again and mounted it: zfs answers, the files are there.
      const r = await tryRun("zfs", "list", "-H", "-o", "name,mounted", pool.parent);
      assert.equal(r.code, 0, r.stderr);
      assert.equal(r.stdout, `${pool.parent}\tyes\n`);
      assert.equal(await Deno.readTextFile(`${pool.mountRoot}/nomad/before`), "written before");
    } finally {
      // If the test failed before the watchdog acted, the daemon must not stay stopped.
      if ((await daemonPid()) === stopped) Deno.kill(stopped, "SIGCONT");
      for (const w of waiters) {
        try {
          w.kill("SIGKILL");
        } catch {
          // Ended.
        }
        await w.status;
      }
      watchdog.kill("SIGKILL");
      await watchdog.status;
      await watchdog.stderr.cancel();
      await Deno.remove(report);
    }
  },
});
