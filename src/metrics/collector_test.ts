import assert from "node:assert/strict";
import { Logger } from "../log.ts";
import { MANAGED_PROPERTY } from "../zfs/names.ts";
import { BACKUP_LAST_PROPERTY } from "../replicate/local.ts";
import { fails, FakeRunner, fakeTools, mountLine } from "../../tests/support/fake_runner.ts";
import { StateCollector } from "./collector.ts";
import { render } from "./exposition.ts";

const PARENT = "tank/nomad";
const BASE = "/local/csi";

/** `zfs get -Hp -r -d 2` output of the parent with `n` volumes, each with `snaps` snapshots. */
function treeOutput(n: number, snaps = 2): string {
  const line = (name: string, prop: string, value: string, source = "-") =>
    `${name}\t${prop}\t${value}\t${source}\n`;
  let out = line(PARENT, "type", "filesystem") + line(PARENT, "used", "9000") +
    line(PARENT, "available", "1000000");
  for (let i = 0; i < n; i++) {
    const ds = `${PARENT}/vol-${i}`;
    out += line(ds, "type", "filesystem") +
      line(ds, MANAGED_PROPERTY, "yes", "local") +
      line(ds, "used", String(1000 + i)) +
      line(ds, "referenced", String(900 + i)) +
      line(ds, "available", "5000") +
      line(ds, "quota", "0", "default") +
      line(ds, "refquota", "1048576", "local") +
      line(ds, "compressratio", "1.50x") +
      line(ds, BACKUP_LAST_PROPERTY, i === 0 ? "1700000000" : "-", i === 0 ? "local" : "-");
    for (let s = 0; s < snaps; s++) out += line(`${ds}@s${s}`, "type", "snapshot");
  }
  // Not volumes: no marker, and a marker inherited from the parent.
  out += line(`${PARENT}/foreign`, "type", "filesystem") +
    line(`${PARENT}/inherited`, "type", "filesystem") +
    line(`${PARENT}/inherited`, MANAGED_PROPERTY, "yes", `inherited from ${PARENT}`);
  return out;
}

function scripted(volumes: number): FakeRunner {
  return new FakeRunner()
    .on(["zfs", "get", "-Hp", "-r", "-d", "2"], { stdout: treeOutput(volumes) })
    .on(["zpool", "list"], {
      stdout: "tank\tONLINE\t10737418240\t1073741824\t9663676416\n",
    })
    .onExact(["mount"], {
      stdout: [
        mountLine(
          `${PARENT}/vol-0`,
          `${BASE}/staging/default/vol-0/rw-file-system-single-node-writer`,
        ),
        mountLine(
          `${PARENT}/vol-0`,
          `${BASE}/per-alloc/a1/vol-0/rw-file-system-single-node-writer`,
        ),
        mountLine(
          `${PARENT}/vol-1`,
          `${BASE}/staging/default/vol-1/rw-file-system-single-node-writer`,
        ),
        // Outside the base dir: zfs's own mount of the dataset is neither.
        mountLine(`${PARENT}/vol-2`, `/tank/nomad/vol-2`),
        "",
      ].join("\n"),
    });
}

function collector(runner: FakeRunner, node = true): StateCollector {
  const log = new Logger("error", {}, () => {});
  const { zfs, mounter } = fakeTools(runner, log);
  return new StateCollector({
    zfs,
    runner,
    zpoolPath: "zpool",
    parentDataset: PARENT,
    timeoutMs: 1000,
    ...(node ? { mounts: { mounter, dirs: [BASE] } } : {}),
    log,
  });
}

Deno.test("StateCollector starts three processes per collection, for 1 volume as for 500", async () => {
  for (const n of [1, 500]) {
    const runner = scripted(n);
    const text = render(await collector(runner).collect());
    runner.assertNoUnexpected();
    assert.deepEqual(runner.argvs.map((a) => a.slice(0, 2)), [
      ["zfs", "get"],
      ["mount"],
      ["zpool", "list"],
    ]);
    assert.equal(
      text.split("\n").filter((l) => l.startsWith("zfs_csi_volume_used_bytes{")).length,
      n,
    );
  }
});

Deno.test("StateCollector reads the parent's tree to depth 2 with every property in one zfs get", async () => {
  const runner = scripted(1);
  await collector(runner).collect();
  assert.deepEqual(runner.argvs[0], [
    "zfs",
    "get",
    "-Hp",
    "-r",
    "-d",
    "2",
    "-o",
    "name,property,value,source",
    `type,used,referenced,available,quota,refquota,compressratio,${MANAGED_PROPERTY},${BACKUP_LAST_PROPERTY}`,
    PARENT,
  ]);
  assert.deepEqual(runner.argvs[2], [
    "zpool",
    "list",
    "-H",
    "-p",
    "-o",
    "name,health,size,allocated,free",
    "tank",
  ]);
});

Deno.test("StateCollector reports each volume's properties, snapshots and mounts here", async () => {
  const text = render(await collector(scripted(3)).collect());
  const v0 = 'volume="vol-0",dataset="tank/nomad/vol-0"';
  const v1 = 'volume="vol-1",dataset="tank/nomad/vol-1"';
  const v2 = 'volume="vol-2",dataset="tank/nomad/vol-2"';
  for (
    const line of [
      `zfs_csi_volume_used_bytes{${v0}} 1000`,
      `zfs_csi_volume_referenced_bytes{${v1}} 901`,
      `zfs_csi_volume_available_bytes{${v2}} 5000`,
      `zfs_csi_volume_quota_bytes{${v0}} 0`,
      `zfs_csi_volume_refquota_bytes{${v0}} 1048576`,
      `zfs_csi_volume_compression_ratio{${v0}} 1.5`,
      `zfs_csi_volume_snapshots{${v2}} 2`,
      `zfs_csi_volume_staged{${v0}} 1`,
      `zfs_csi_volume_published{${v0}} 1`,
      `zfs_csi_volume_staged{${v1}} 1`,
      `zfs_csi_volume_published{${v1}} 0`,
      `zfs_csi_volume_staged{${v2}} 0`,
      `zfs_csi_volume_published{${v2}} 0`,
      `zfs_csi_volume_last_backup_timestamp_seconds{${v0}} 1700000000`,
      'zfs_csi_parent_used_bytes{dataset="tank/nomad"} 9000',
      'zfs_csi_parent_available_bytes{dataset="tank/nomad"} 1000000',
      'zfs_csi_pool_health{pool="tank",health="ONLINE"} 1',
      'zfs_csi_pool_health{pool="tank",health="DEGRADED"} 0',
      'zfs_csi_pool_free_bytes{pool="tank"} 9663676416',
      'zfs_csi_pool_size_bytes{pool="tank"} 10737418240',
      'zfs_csi_metrics_source_up{source="zfs"} 1',
      'zfs_csi_metrics_source_up{source="mount"} 1',
      'zfs_csi_metrics_source_up{source="zpool"} 1',
    ]
  ) {
    assert.ok(text.split("\n").includes(line), `missing: ${line}\n${text}`);
  }
  // Only volumes: no foreign or inherited-marker dataset, and no backup time for vol-1.
  assert.doesNotMatch(text, /foreign|inherited/);
  assert.doesNotMatch(text, /last_backup_timestamp_seconds\{volume="vol-1"/);
});

Deno.test("StateCollector on a controller reads no mount table and shows no mount state", async () => {
  const runner = scripted(2);
  const text = render(await collector(runner, false).collect());
  assert.deepEqual(runner.argvs.map((a) => a[0]), ["zfs", "zpool"]);
  assert.doesNotMatch(text, /zfs_csi_volume_staged|zfs_csi_volume_published|source="mount"/);
});

Deno.test("StateCollector answers with what it could read when a source fails, and says which", async () => {
  const lines: string[] = [];
  const log = new Logger("warn", {}, (l) => lines.push(l));
  const runner = new FakeRunner()
    .on(["zfs", "get"], { stdout: treeOutput(1) })
    .on(["zpool", "list"], fails("internal error: out of memory\n"))
    .onExact(["mount"], fails("mount: cannot read the table\n", 32));
  const { zfs, mounter } = fakeTools(runner, log);
  const c = new StateCollector({
    zfs,
    runner,
    zpoolPath: "zpool",
    parentDataset: PARENT,
    timeoutMs: 1000,
    mounts: { mounter, dirs: [BASE] },
    log,
  });
  const text = render(await c.collect());
  assert.match(
    text,
    /^zfs_csi_volume_used_bytes\{volume="vol-0",dataset="tank\/nomad\/vol-0"\} 1000$/m,
  );
  assert.match(text, /^zfs_csi_metrics_source_up\{source="zpool"\} 0$/m);
  assert.match(text, /^zfs_csi_metrics_source_up\{source="mount"\} 0$/m);
  assert.doesNotMatch(text, /zfs_csi_pool_|zfs_csi_volume_staged/);
  // A lasting failure is logged once, not at every scrape.
  await c.collect();
  const warned = lines.map((l) => JSON.parse(l)).filter((r) => r.msg.startsWith("metrics source"));
  assert.deepEqual(warned.map((r) => r.source).sort(), ["mount", "zpool"]);
});

Deno.test("StateCollector falls back to zpool list without -p once, on a zpool that refuses it", async () => {
  const runner = new FakeRunner()
    .on(["zfs", "get"], { stdout: treeOutput(1) })
    .on(["zpool", "list", "-H", "-p"], fails("invalid option 'p'\nusage:\n", 2))
    .on(["zpool", "list", "-H", "-o"], { stdout: "tank\tONLINE\t1.98G\t515M\t1.48G\n" })
    .onExact(["mount"], { stdout: "" });
  const c = collector(runner);
  const first = render(await c.collect());
  const second = render(await c.collect());
  runner.assertNoUnexpected();
  const pools = runner.argvs.filter((a) => a[0] === "zpool");
  assert.equal(pools.length, 3, "the -p attempt once, then the plain listing each time");
  assert.ok(!pools[2]!.includes("-p"));
  for (const text of [first, second]) {
    assert.match(text, /^zfs_csi_pool_free_bytes\{pool="tank"\} 1589137900$/m);
    assert.match(text, /^zfs_csi_pool_allocated_bytes\{pool="tank"\} 540016640$/m);
  }
});

Deno.test("StateCollector runs added sources in the same collection and marks a failed one down", async () => {
  const c = collector(scripted(1));
  c.addSource({
    name: "lease",
    collect: () =>
      Promise.resolve([{
        name: "zfs_csi_lease_generation",
        help: "Generation.",
        type: "gauge",
        samples: [{ labels: { volume: "vol-0" }, value: 7 }],
      }]),
  });
  c.addSource({ name: "lag", collect: () => Promise.reject(new Error("store unreachable")) });
  c.addSource({
    name: "holder",
    collect: () => {
      throw new Error("thrown at once");
    },
  });
  assert.throws(() => c.addSource({ name: "zfs", collect: () => Promise.resolve([]) }), /taken/);
  const text = render(await c.collect());
  assert.match(text, /^zfs_csi_lease_generation\{volume="vol-0"\} 7$/m);
  assert.match(text, /^zfs_csi_metrics_source_up\{source="lease"\} 1$/m);
  assert.match(text, /^zfs_csi_metrics_source_up\{source="lag"\} 0$/m);
  assert.match(text, /^zfs_csi_metrics_source_up\{source="holder"\} 0$/m);
});
