import assert from "node:assert/strict";
import { Logger } from "../log.ts";
import { FakeRunner, fakeTools } from "../../tests/support/fake_runner.ts";
import { Activity } from "./activity.ts";
import { StateCollector } from "./collector.ts";
import { Metrics } from "./metrics.ts";

const INFO = { version: "0.1.0", node: "node-a", mode: "monolith", parentDataset: "tank/nomad" };

function setUp(ttlMs: number) {
  const runner = new FakeRunner()
    .on(["zfs", "get"], { stdout: "tank/nomad\tused\t1\t-\n" })
    .on(["zpool", "list"], { stdout: "tank\tONLINE\t10\t1\t9\n" })
    .onExact(["mount"], { stdout: "" });
  const log = new Logger("error", {}, () => {});
  const { zfs, mounter } = fakeTools(runner, log);
  const collector = new StateCollector({
    zfs,
    runner,
    zpoolPath: "zpool",
    parentDataset: "tank/nomad",
    timeoutMs: 1000,
    mounts: { mounter, dirs: ["/local/csi"] },
    log,
  });
  const activity = new Activity();
  return { runner, activity, metrics: new Metrics({ activity, collector, info: INFO, ttlMs }) };
}

Deno.test("Metrics.scrape: scrapes within the TTL, at once or one after another, cost one collection", async () => {
  const { runner, metrics } = setUp(60_000);
  const texts = await Promise.all([metrics.scrape(), metrics.scrape(), metrics.scrape()]);
  texts.push(await metrics.scrape());
  assert.equal(runner.argvs.length, 3, runner.argvs.map((a) => a.join(" ")).join("\n"));
  assert.equal(new Set(texts).size, 1);
});

Deno.test("Metrics.scrape: a TTL of 0 collects at every scrape", async () => {
  const { runner, metrics } = setUp(0);
  await metrics.scrape();
  await metrics.scrape();
  assert.equal(runner.argvs.length, 6);
});

Deno.test("Metrics.scrape: counters are live while the state comes from the cache", async () => {
  const { activity, metrics } = setUp(60_000);
  const before = await metrics.scrape();
  assert.doesNotMatch(before, /zfs_csi_grpc_calls_total\{/);
  activity.observeCall("Probe", "OK", 0.002);
  const after = await metrics.scrape();
  assert.match(after, /^zfs_csi_grpc_calls_total\{method="Probe",code="OK"\} 1$/m);
  assert.match(
    after,
    /^zfs_csi_info\{version="0\.1\.0",node="node-a",mode="monolith",parent_dataset="tank\/nomad"\} 1$/m,
  );
});

Deno.test("Metrics.scrape: a volume's backup counters exist at 0 from the first scrape that sees it", async () => {
  const runner = new FakeRunner()
    .on(["zfs", "get"], {
      stdout: [
        "tank/nomad\ttype\tfilesystem\t-",
        "tank/nomad/pg\ttype\tfilesystem\t-",
        "tank/nomad/pg\torg.zfs-csi:managed\tyes\tlocal",
        "tank/nomad/pg\treferenced\t4096\t-",
      ].join("\n") + "\n",
    })
    .on(["zpool", "list"], { stdout: "tank\tONLINE\t10\t1\t9\n" });
  const log = new Logger("error", {}, () => {});
  const { zfs } = fakeTools(runner, log);
  const collector = new StateCollector({
    zfs,
    runner,
    zpoolPath: "zpool",
    parentDataset: "tank/nomad",
    timeoutMs: 1000,
    log,
  });
  const metrics = new Metrics({ activity: new Activity(), collector, info: INFO, ttlMs: 0 });
  const text = await metrics.scrape();
  assert.match(
    text,
    /^zfs_csi_volume_referenced_bytes\{volume="pg",dataset="tank\/nomad\/pg"\} 4096$/m,
  );
  assert.match(text, /^zfs_csi_backups_total\{volume="pg",result="failed"\} 0$/m);
  assert.match(text, /^zfs_csi_volume_last_failed_backup_timestamp_seconds\{volume="pg"\} 0$/m);
});
