import assert from "node:assert/strict";
import { FakeRunner, fakeTools } from "../../tests/support/fake_runner.ts";
import { FakePool } from "../../tests/support/fake_pool.ts";
import { Logger } from "../log.ts";
import {
  currentMark,
  Heartbeat,
  type KernelClock,
  parseMark,
  removeStaleScratch,
  scratchRows,
  ScratchSweep,
  STALE_MS,
  VERIFY_PROPERTY,
} from "./scratch.ts";

const P = "tank/nomad";

/** A kernel clock the test sets. */
function kernel(up: number): KernelClock & { up: number } {
  const clock = { up, uptimeSeconds: () => clock.up };
  return clock;
}

/** A scratch dataset as verify makes it: marked, with `data` and a snapshot below it. */
function scratch(pool: FakePool, name: string, mark: string | undefined): string {
  const dataset = `${P}/${name}`;
  pool.add(dataset, mark === undefined ? {} : { [VERIFY_PROPERTY]: mark, used: "314572800" });
  const inherited = mark === undefined ? {} : {
    [VERIFY_PROPERTY]: [mark, `inherited from ${dataset}`] as const,
  };
  pool.add(`${dataset}/data`, inherited);
  pool.add(`${dataset}/data@.backup-1`, inherited);
  return dataset;
}

Deno.test("marks carry the kernel's uptime and the pid, and read back", () => {
  const mark = currentMark(kernel(1234.5), 42)!;
  assert.equal(mark, "up=1234 pid=42");
  assert.deepEqual(parseMark(mark), { up: 1234, pid: 42 });
  assert.equal(parseMark("up=x pid=2"), undefined);
  assert.equal(currentMark({ uptimeSeconds: () => undefined }, 1), undefined);
});

Deno.test("scratch datasets are stale after a restart or a silent heartbeat, running otherwise; never by name", () => {
  const runner = new FakeRunner();
  const pool = new FakePool(runner);
  pool.add(P);
  const clock = kernel(10_000);
  scratch(pool, ".verify-reboot", "up=20000 pid=7");
  scratch(pool, ".verify-silent", `up=${10_000 - STALE_MS / 1000} pid=8`);
  scratch(pool, ".verify-alive", "up=9990 pid=9");
  scratch(pool, ".verify-byhand", undefined);
  pool.add(`${P}/pg`, { [VERIFY_PROPERTY]: "up=1 pid=1" });
  const tree = new Map(
    [...pool.objects].filter(([n]) => !n.slice(P.length + 1).includes("/") && !n.includes("@")),
  );
  const rows = scratchRows(P, tree, clock);
  assert.deepEqual(rows.map((r) => [r.dataset.slice(P.length + 1), r.state]), [
    [".verify-alive", "running"],
    [".verify-byhand", "unmarked"],
    [".verify-reboot", "stale"],
    [".verify-silent", "stale"],
  ]);
  assert.match(rows[2]!.reason, /before the machine restarted/);
  assert.equal(rows[2]!.usedBytes, 314572800);
  const blind = scratchRows(P, tree, { uptimeSeconds: () => undefined });
  assert.ok(blind.every((r) => r.state === "unknown" || r.state === "unmarked"));
});

Deno.test("removeStaleScratch destroys only stale marked ones, read again, holding only verify's data", async () => {
  const runner = new FakeRunner();
  const pool = new FakePool(runner);
  const { zfs } = fakeTools(runner);
  pool.add(P);
  const clock = kernel(10_000);
  const gone = scratch(pool, ".verify-gone", "up=1 pid=7");
  const alive = scratch(pool, ".verify-alive", "up=9999 pid=9");
  const byhand = scratch(pool, ".verify-byhand", undefined);
  const foreign = scratch(pool, ".verify-foreign", "up=1 pid=5");
  pool.add(`${foreign}/data@mine`, {});
  // Its verify refreshes the mark between the listing and the removal: kept.
  const woke = scratch(pool, ".verify-woke", "up=1 pid=6");
  pool.hook = (argv) => {
    if (argv[1] === "get" && argv.at(-1) === woke) {
      pool.setValue(woke, VERIFY_PROPERTY, "up=10000 pid=6");
    }
    return undefined;
  };
  const { removed, kept } = await removeStaleScratch(zfs, P, clock);
  assert.deepEqual(removed.map((r) => r.dataset), [gone]);
  assert.deepEqual(kept.map((k) => k.dataset).sort(), [foreign, woke].sort());
  assert.match(kept.find((k) => k.dataset === foreign)!.why, /data@mine/);
  assert.ok(!pool.has(gone) && !pool.has(`${gone}/data`));
  for (const d of [alive, byhand, foreign, woke]) assert.ok(pool.has(d), d);
  assert.deepEqual(runner.argvs.filter((a) => a[1] === "destroy"), [
    ["zfs", "destroy", "-r", gone],
  ]);
  runner.assertNoUnexpected();
});

Deno.test("the plugin's sweep logs what it removed and kept, and never throws", async () => {
  const runner = new FakeRunner();
  const pool = new FakePool(runner);
  const { zfs } = fakeTools(runner);
  pool.add(P);
  scratch(pool, ".verify-gone", "up=1 pid=7");
  const lines: Array<Record<string, unknown>> = [];
  const log = new Logger("info", {}, (l) => lines.push(JSON.parse(l)));
  const sweep = new ScratchSweep({ zfs, parentDataset: P, log, clock: kernel(500) });
  await sweep.sweep();
  assert.equal(lines.length, 1);
  assert.match(
    String(lines[0]!.msg),
    /removed the scratch dataset of an interrupted zfs-csi verify/,
  );
  assert.equal(lines[0]!.dataset, `${P}/.verify-gone`);
  pool.hook = () => ({ code: 1, stderr: "internal error: out of memory\n" });
  await sweep.sweep();
  assert.match(String(lines[1]!.msg), /could not look for scratch datasets/);
});

Deno.test("Heartbeat refreshes the mark until stopped", async () => {
  const runner = new FakeRunner();
  const pool = new FakePool(runner);
  const { zfs } = fakeTools(runner);
  pool.add(P);
  const d = scratch(pool, ".verify-1", "up=1 pid=3");
  const clock = kernel(1);
  const beat = new Heartbeat(zfs, d, clock, 3, 5);
  clock.up = 2;
  for (let i = 0; i < 100 && pool.value(d, VERIFY_PROPERTY) === "up=1 pid=3"; i++) {
    await new Promise((r) => setTimeout(r, 5));
  }
  await beat.stop();
  assert.equal(pool.value(d, VERIFY_PROPERTY), "up=2 pid=3");
});
