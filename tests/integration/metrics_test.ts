/**
 * The metrics endpoint under a real Prometheus (tests/support/prometheus.ts, built from the Go
 * module proxy): the plugin runs with --metrics-listen under its production permission flags
 * (plus the listen address, as ZFS_CSI_METRICS_LISTEN adds it), Prometheus scrapes it every
 * second on loopback, and the test reads the values back through Prometheus's query API and
 * checks them against the pool: a volume's used and referenced bytes after 8 MiB of random data,
 * its quotas, snapshots and mount state, the pool's health and space, the call and process
 * counters after known calls (at 0 before them), a scheduled backup to a file store, the
 * store's reachability and a failed backup's time. promtool checks a scrape.
 *
 * zfs-fuse cannot show: `zpool list -p` (its sizes are rounded, e.g. "1.48G"; the test compares
 * with zpool's own rounded figure), OpenZFS's "zfs" mount type (unit tests, src/metrics/).
 */

import assert from "node:assert/strict";
import { claimPaths, createVolumeRequest, mountCapability } from "../support/nomad.ts";
import { PluginProcess } from "../support/plugin_process.ts";
import {
  PrometheusServer,
  promtoolCheckConfig,
  promtoolCheckMetrics,
  type VectorSample,
} from "../support/prometheus.ts";
import { freePort } from "../support/go_tool.ts";
import { sh, TestPool } from "../support/zfs_pool.ts";
import { parseSize } from "../../src/metrics/pool.ts";

const MiB = 1024 * 1024;
const VOLUME = "metrics-vol";

/** `count` bytes that do not compress. */
function randomBytes(count: number): Uint8Array {
  const out = new Uint8Array(count);
  // getRandomValues fills at most 64 KiB at a time.
  for (let i = 0; i < count; i += 65536) crypto.getRandomValues(out.subarray(i, i + 65536));
  return out;
}

/** The one value of an answer, or undefined when it has none (or several). */
function single(samples: VectorSample[]): number | undefined {
  return samples.length === 1 ? samples[0]!.value : undefined;
}

/**
 * Polls until Prometheus's value of `expr` equals what `truth()` reads from the system at the
 * same moment (values such as `used` settle only after zfs commits its writes).
 */
async function agrees(
  prometheus: PrometheusServer,
  expr: string,
  truth: () => Promise<number>,
  timeoutMs = 40_000,
): Promise<number> {
  const deadline = Date.now() + timeoutMs;
  let last: [number | undefined, number] = [undefined, NaN];
  while (Date.now() < deadline) {
    const want = await truth();
    const got = single(await prometheus.query(expr));
    if (got === want) return got;
    last = [got, want];
    await new Promise((r) => setTimeout(r, 500));
  }
  throw new Error(`${expr}: Prometheus says ${last[0]}, the pool says ${last[1]}`);
}

Deno.test("metrics: a real Prometheus scrapes the plugin and its values match the pool", async (t) => {
  await using pool = await TestPool.create();
  const store = `${pool.dir}/store`;
  await Deno.mkdir(store);
  const listen = `127.0.0.1:${freePort()}`;
  await using plugin = await PluginProcess.start({
    parentDataset: pool.parent,
    dir: pool.dir,
    logLevel: "info",
    extraArgs: ["--metrics-listen", listen, "--store", `file://${store}`],
    // What ZFS_CSI_METRICS_LISTEN bakes in: the listen address in --allow-net, nothing more.
    scope: { netHosts: [listen] },
  });
  await using prometheus = await PrometheusServer.start({ targets: [listen] });
  const dataset = `${pool.parent}/${VOLUME}`;
  const sel = `volume="${VOLUME}"`;
  let claim: { staging: string; target: string };

  await t.step("Prometheus scrapes the endpoint", async () => {
    await prometheus.waitFor('up{job="zfs-csi"}', (s) => single(s) === 1);
    const [target] = await prometheus.targets();
    assert.equal(target?.scrapeUrl, `http://${listen}/metrics`);
    assert.equal(target?.health, "up", target?.lastError);
  });

  await t.step("counters are there at 0 from the start, and the store is up", async () => {
    // Before any CreateVolume or zfs send: a counter that appeared at 1 would hide its first rise.
    assert.equal(
      single(await prometheus.query('zfs_csi_grpc_calls_total{method="CreateVolume",code="OK"}')),
      0,
    );
    assert.equal(
      single(await prometheus.query('zfs_csi_commands_total{program="zfs",subcommand="send"}')),
      0,
    );
    assert.equal(
      single(
        await prometheus.query('zfs_csi_command_failures_total{program="zfs",subcommand="send"}'),
      ),
      0,
    );
    await prometheus.waitFor("zfs_csi_store_up", (s) => single(s) === 1);
  });

  await t.step(
    "a volume is created, staged, published and given 8 MiB of random data",
    async () => {
      const created = await plugin.client.controller("CreateVolume", createVolumeRequest(VOLUME));
      const id = created.volume.volume_id;
      claim = await claimPaths(plugin.baseDir, { volumeId: VOLUME, allocId: "alloc-1" });
      const cap = mountCapability();
      await plugin.client.node("NodeStageVolume", {
        volume_id: id,
        staging_target_path: claim.staging,
        volume_capability: cap,
        volume_context: created.volume.volume_context,
      });
      await plugin.client.node("NodePublishVolume", {
        volume_id: id,
        staging_target_path: claim.staging,
        target_path: claim.target,
        volume_capability: cap,
        readonly: false,
        volume_context: created.volume.volume_context,
      });
      // A call that fails in a known way, for the code label.
      await assert.rejects(
        plugin.client.controller("ControllerGetVolume", { volume_id: "absent@node-a" }),
      );
      using f = await Deno.open(`${claim.target}/random.bin`, { create: true, write: true });
      const data = randomBytes(8 * MiB);
      for (let off = 0; off < data.length;) off += await f.write(data.subarray(off));
      await f.sync();
      await sh("zfs", "snapshot", `${dataset}@manual`);
    },
  );

  await t.step("the volume's bytes and quotas match zfs get", async () => {
    const get = (prop: string) => async () => Number(await pool.get(dataset, prop));
    const used = await agrees(prometheus, `zfs_csi_volume_used_bytes{${sel}}`, get("used"));
    assert.ok(used >= 8 * MiB, `used ${used} holds the 8 MiB written`);
    const referenced = await agrees(
      prometheus,
      `zfs_csi_volume_referenced_bytes{${sel}}`,
      get("referenced"),
    );
    assert.ok(referenced >= 8 * MiB, `referenced ${referenced}`);
    await agrees(prometheus, `zfs_csi_volume_available_bytes{${sel}}`, get("available"));
    assert.equal(
      await agrees(prometheus, `zfs_csi_volume_refquota_bytes{${sel}}`, get("refquota")),
      64 * MiB,
    );
    assert.equal(await agrees(prometheus, `zfs_csi_volume_quota_bytes{${sel}}`, get("quota")), 0);
    await agrees(
      prometheus,
      `zfs_csi_volume_compression_ratio{${sel}}`,
      async () => parseFloat(await pool.get(dataset, "compressratio")),
    );
    const snapshots = async () =>
      (await sh("zfs", "list", "-H", "-o", "name", "-t", "snapshot", "-r", "-d", "1", dataset))
        .split("\n").filter((l) => l.startsWith(`${dataset}@`)).length;
    assert.ok(await agrees(prometheus, `zfs_csi_volume_snapshots{${sel}}`, snapshots) >= 1);
    assert.equal(single(await prometheus.query(`zfs_csi_volume_staged{${sel}}`)), 1);
    assert.equal(single(await prometheus.query(`zfs_csi_volume_published{${sel}}`)), 1);
    await agrees(
      prometheus,
      `zfs_csi_parent_available_bytes{dataset="${pool.parent}"}`,
      async () => Number(await pool.get(pool.parent, "available")),
    );
  });

  await t.step("the pool's health and space match zpool list", async () => {
    const p = `pool="${pool.pool}"`;
    assert.equal(single(await prometheus.query(`zfs_csi_pool_health{${p},health="ONLINE"}`)), 1);
    assert.equal(single(await prometheus.query(`zfs_csi_pool_health{${p},health="FAULTED"}`)), 0);
    const zpool = (column: string) => async () =>
      parseSize((await sh("zpool", "list", "-H", "-o", column, pool.pool)).trim());
    await agrees(prometheus, `zfs_csi_pool_size_bytes{${p}}`, zpool("size"));
    await agrees(prometheus, `zfs_csi_pool_free_bytes{${p}}`, zpool("free"));
  });

  await t.step("call and process counters count the known calls", async () => {
    const calls = (method: string, code: string) =>
      `zfs_csi_grpc_calls_total{method="${method}",code="${code}"}`;
    for (const method of ["CreateVolume", "NodeStageVolume", "NodePublishVolume"]) {
      await prometheus.waitFor(calls(method, "OK"), (s) => single(s) === 1);
      assert.equal(
        single(
          await prometheus.query(`zfs_csi_grpc_call_duration_seconds_count{method="${method}"}`),
        ),
        1,
      );
    }
    await prometheus.waitFor(calls("ControllerGetVolume", "NOT_FOUND"), (s) => single(s) === 1);
    assert.ok((single(await prometheus.query(calls("Probe", "OK"))) ?? 0) >= 1);
    const commands = async (program: string, sub: string) =>
      single(
        await prometheus.query(
          `zfs_csi_commands_total{program="${program}",subcommand="${sub}"}`,
        ),
      ) ?? 0;
    assert.ok(await commands("zfs", "create") >= 1);
    assert.ok(await commands("zfs", "get") >= 1);
    assert.ok(await commands("mount", "list") >= 1);
    assert.ok(await commands("mount", "bind") >= 1);
    assert.ok(await commands("zpool", "list") >= 1);
  });

  await t.step("promtool check metrics finds nothing wrong in a scrape", async () => {
    const scrape = await fetch(`http://${listen}/metrics`);
    assert.equal(scrape.status, 200);
    assert.equal(scrape.headers.get("content-type"), "text/plain; version=0.0.4; charset=utf-8");
    const text = await scrape.text();
    assert.match(text, /^zfs_csi_volume_used_bytes\{volume="metrics-vol"/m);
    const verdict = await promtoolCheckMetrics(text);
    assert.deepEqual(verdict, { success: true, output: "" });
  });

  await t.step("concurrent scrapes share one collection", async () => {
    const zpoolLists = (text: string) =>
      Number(
        /^zfs_csi_commands_total\{program="zpool",subcommand="list"\} (\d+)$/m.exec(text)?.[1],
      );
    const started = performance.now();
    const before = zpoolLists(await (await fetch(`http://${listen}/metrics`)).text());
    const texts = await Promise.all(
      Array.from({ length: 20 }, async () => (await fetch(`http://${listen}/metrics`)).text()),
    );
    const after = zpoolLists(await (await fetch(`http://${listen}/metrics`)).text());
    const periods = Math.floor((performance.now() - started) / 5000);
    assert.ok(texts.every((x) => x.includes("zfs_csi_pool_health")));
    // 22 scrapes (and Prometheus's own): one collection per 5 s of cache, plus the health
    // checker's own zpool list every 10 s; 2 when the scrapes take under 5 s, as they should.
    const bound = 2 + 2 * periods;
    assert.ok(
      after - before <= bound,
      `zpool list ran ${after - before} times for 22 scrapes (at most ${bound})`,
    );
  });

  await t.step(
    "a volume's backup counters and failure time are at 0 before its first backup",
    async () => {
      await prometheus.waitFor(
        `zfs_csi_backups_total{${sel},result="failed"}`,
        (s) => single(s) === 0,
      );
      assert.equal(
        single(await prometheus.query(`zfs_csi_backups_total{${sel},result="stored"}`)),
        0,
      );
      assert.equal(single(await prometheus.query(`zfs_csi_backup_sent_bytes_total{${sel}}`)), 0);
      assert.equal(
        single(
          await prometheus.query(`zfs_csi_volume_last_failed_backup_timestamp_seconds{${sel}}`),
        ),
        0,
      );
    },
  );

  await t.step("a scheduled backup shows its time and bytes sent", async () => {
    // The operator turns backups on for the volume (the scheduler looks every 30 s).
    await sh("zfs", "set", "org.zfs-csi:backup-interval=1h", dataset);
    await prometheus.waitFor(
      `zfs_csi_backups_total{${sel},result="stored"}`,
      (s) => single(s) === 1,
      60_000,
    );
    const sent = single(await prometheus.query(`zfs_csi_backup_sent_bytes_total{${sel}}`)) ?? 0;
    assert.ok(sent >= 8 * MiB, `sent ${sent} bytes: the full stream holds the 8 MiB written`);
    await agrees(
      prometheus,
      `zfs_csi_volume_last_backup_timestamp_seconds{${sel}}`,
      async () => Number(await pool.get(dataset, "org.zfs-csi:backup-last")),
    );
    const last = single(
      await prometheus.query(`zfs_csi_volume_last_backup_timestamp_seconds{${sel}}`),
    )!;
    assert.ok(Math.abs(last - Date.now() / 1000) < 300, `backup time ${last} is recent`);
    const sends = single(
      await prometheus.query('zfs_csi_commands_total{program="zfs",subcommand="send"}'),
    );
    assert.equal(sends, 1, "the streamed zfs send is counted too");
  });

  await t.step("a store that does not answer, and a backup that fails, show", async () => {
    // The store's directory replaced by a file: every request to it fails.
    await Deno.rename(store, `${store}.away`);
    await Deno.writeTextFile(store, "not a directory\n");
    try {
      await prometheus.waitFor("zfs_csi_store_up", (s) => single(s) === 0, 60_000);
      // Due at once: the scheduler tries within its 30 s, and the backup fails.
      await sh("zfs", "set", "org.zfs-csi:backup-interval=5s", dataset);
      await prometheus.waitFor(
        `zfs_csi_backups_total{${sel},result="failed"}`,
        (s) => (single(s) ?? 0) >= 1,
        90_000,
      );
      const failed = single(
        await prometheus.query(`zfs_csi_volume_last_failed_backup_timestamp_seconds{${sel}}`),
      )!;
      assert.ok(Math.abs(failed - Date.now() / 1000) < 120, `failure time ${failed} is recent`);
    } finally {
      await sh("zfs", "set", "org.zfs-csi:backup-interval=1h", dataset);
      await Deno.remove(store);
      await Deno.rename(`${store}.away`, store);
    }
    await prometheus.waitFor("zfs_csi_store_up", (s) => single(s) === 1, 60_000);
  });

  await t.step("unpublish and unstage show in the mount gauges", async () => {
    const id = `${VOLUME}@node-a`;
    await plugin.client.node("NodeUnpublishVolume", { volume_id: id, target_path: claim.target });
    await prometheus.waitFor(`zfs_csi_volume_published{${sel}}`, (s) => single(s) === 0);
    assert.equal(single(await prometheus.query(`zfs_csi_volume_staged{${sel}}`)), 1);
    await plugin.client.node("NodeUnstageVolume", {
      volume_id: id,
      staging_target_path: claim.staging,
    });
    await prometheus.waitFor(`zfs_csi_volume_staged{${sel}}`, (s) => single(s) === 0);
  });

  assert.ok(
    !plugin.logs().some((l) => /NotCapable|Requires .* access|metrics scrape failed/.test(l)),
    plugin.logs().join("\n"),
  );
});

Deno.test("metrics: the scrape config docs/metrics.md shows is nomad/prometheus.yml, and Prometheus accepts it", async () => {
  const root = new URL("../../", import.meta.url);
  const file = new URL("nomad/prometheus.yml", root);
  const yaml = await Deno.readTextFile(file);
  const doc = await Deno.readTextFile(new URL("docs/metrics.md", root));
  assert.ok(
    doc.includes("```yaml\n" + yaml + "```"),
    "docs/metrics.md shows nomad/prometheus.yml as it is",
  );
  const verdict = await promtoolCheckConfig(file.pathname);
  assert.ok(verdict.success, verdict.output);
  assert.match(verdict.output, /SUCCESS/);
});
