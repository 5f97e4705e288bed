/**
 * The bench runs (quick mode: few trials, 10 and 100 volumes) and its numbers hold together:
 * every section measured, every ratio computed, and the per-call process counts of ListVolumes,
 * GetCapacity and NodeGetVolumeStats the same with 100 volumes as with 10.
 */

import assert from "node:assert/strict";
import { fileURLToPath } from "node:url";
import type { Row } from "../../bench/stats.ts";

const ROOT = fileURLToPath(new URL("../../", import.meta.url));

Deno.test("deno task bench (quick) measures every section and process counts stay flat", async () => {
  const dir = await Deno.makeTempDir({ prefix: "zfs-csi-bench-smoke-" });
  try {
    const json = `${dir}/bench.json`;
    const res = await new Deno.Command(Deno.execPath(), {
      args: ["run", "--frozen", "--allow-all", "bench/bench.ts"],
      cwd: ROOT,
      env: { ZFS_CSI_BENCH_QUICK: "1", ZFS_CSI_BENCH_JSON: json },
      stdout: "piped",
      stderr: "piped",
    }).output();
    const stdout = new TextDecoder().decode(res.stdout);
    assert.equal(res.code, 0, new TextDecoder().decode(res.stderr));
    const result = JSON.parse(await Deno.readTextFile(json)) as {
      quick: boolean;
      rows: Row[];
      scale: { call: string; volumes: number; zfs: number; processes: number; ms: number }[];
    };
    assert.equal(result.quick, true);
    assert.deepEqual(
      [...new Set(result.rows.map((r) => r.section))].sort(),
      ["1", "2", "3", "4", "5", "6", "7", "8", "9"],
    );
    for (const row of result.rows) {
      assert.match(row.plugin, /\d/, `${row.what} has no figure`);
      // The table prints what the JSON holds.
      assert.ok(stdout.includes(row.what), row.what);
    }
    // Every comparison with a target (the lifecycle, create and delete, the store) has its ratio.
    const targeted = result.rows.filter((r) => r.target !== undefined);
    assert.deepEqual([...new Set(targeted.map((r) => r.section))].sort(), ["1", "2", "8", "9"]);
    for (const row of targeted) {
      // An RSS row's figure is growth above idle, which a transfer may not cause at all (0 MiB,
      // ratio 0); every other row times work, so its ratio is above 0.
      const least = row.what.startsWith("RSS ") ? 0 : Number.MIN_VALUE;
      assert.ok(
        Number.isFinite(row.ratio) && row.ratio! >= least,
        `${row.what}: ratio ${row.ratio}`,
      );
    }
    // Follow-the-job (section 9): switchovers, bytes moved and RPO, each with a figure.
    const follow = result.rows.filter((r) => r.section === "9");
    for (const want of [/^switchover, .* cold/, /^switchover, .* warm/, /^bytes moved/, /^RPO, /]) {
      assert.ok(follow.some((r) => want.test(r.what)), `no follow row ${want}`);
    }
    // The store (section 8): every row measured, with a finite figure and, against a floor, a
    // finite ratio.
    const store = result.rows.filter((r) => r.section === "8");
    for (
      const want of [
        /^backup of .* to the file store/,
        /^backup of .* to S3/,
        /^restore of .* from the file store/,
        /^restore of .* from S3/,
        /^incremental backup, .* file store/,
        /^incremental backup, .* S3/,
        /^RSS during .* backups to the file store/,
        /^RSS during .* restores from the file store/,
        /^RSS during .* backups to S3/,
        /^RSS during .* restores from S3/,
        /^stage\+publish of another volume during a .* backup vs without/,
      ]
    ) {
      assert.ok(store.some((r) => want.test(r.what)), `no store row ${want}`);
    }
    for (const row of store) {
      assert.ok(Number.isFinite(Number.parseFloat(row.plugin)), `${row.what}: ${row.plugin}`);
      if (row.base !== undefined) {
        const least = row.what.startsWith("RSS ") ? 0 : Number.MIN_VALUE;
        assert.ok(
          Number.isFinite(row.ratio) && row.ratio! >= least,
          `${row.what}: ratio ${row.ratio}`,
        );
      }
      if (row.what.startsWith("incremental")) assert.match(row.note ?? "", /bytes moved .* \d/);
    }
    for (const call of ["ListVolumes", "GetCapacity", "NodeGetVolumeStats"]) {
      const runs = result.scale.filter((s) => s.call === call);
      assert.deepEqual(runs.map((s) => s.volumes), [10, 100], call);
      assert.equal(runs[0]!.zfs, 1, `${call} runs one zfs process`);
      assert.equal(runs[1]!.zfs, runs[0]!.zfs, `${call}: zfs processes grow with volumes`);
      assert.equal(runs[1]!.processes, runs[0]!.processes, `${call}: processes grow`);
    }
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
});
