/**
 * Bad input, foreign datasets and mounts, busy filesystems and concurrency, on a real pool:
 * every case gets a clear gRPC code and leaves everything outside the plugin's reach as it was.
 */

import assert from "node:assert/strict";
import { Code } from "../../src/errors.ts";
import { codeOf } from "../support/csi_client.ts";
import { claimPaths, mountCapability, mountsAt } from "../support/nomad.ts";
import { PluginProcess, READY_MS } from "../support/plugin_process.ts";
import { poolState, sh, TestPool } from "../support/zfs_pool.ts";

Deno.test("node: bad input is refused and changes nothing", async (t) => {
  await using pool = await TestPool.create();
  await using plugin = await PluginProcess.start({ parentDataset: pool.parent, dir: pool.dir });
  const c = plugin.client;
  const p = await claimPaths(plugin.baseDir, { volumeId: "vol", allocId: "a1" });
  const outside = await Deno.makeTempDir({ prefix: "zfs-csi-outside-" });
  const stage = (over: Record<string, unknown>) =>
    c.node("NodeStageVolume", {
      volume_id: "vol",
      staging_target_path: p.staging,
      volume_capability: mountCapability(),
      volume_context: { size: "32MiB" },
      ...over,
    });
  try {
    const before = await poolState(pool);
    const cases: Array<[string, Record<string, unknown>, number]> = [
      ["empty id", { volume_id: "" }, Code.INVALID_ARGUMENT],
      ["id with ..", { volume_id: "../escape" }, Code.INVALID_ARGUMENT],
      ["id with /", { volume_id: "a/b" }, Code.INVALID_ARGUMENT],
      ["id naming another dataset", { volume_id: `${pool.pool}/other` }, Code.INVALID_ARGUMENT],
      ["id with two @", { volume_id: "vol@node-a@x" }, Code.INVALID_ARGUMENT],
      ["id with an empty name", { volume_id: "@node-a" }, Code.INVALID_ARGUMENT],
      ["id of another node", { volume_id: "vol@node-b" }, Code.FAILED_PRECONDITION],
      ["id with %", { volume_id: "vol%x" }, Code.INVALID_ARGUMENT],
      ["id with control character", { volume_id: "vol\u0007" }, Code.INVALID_ARGUMENT],
      ["id too long", { volume_id: "v".repeat(200) }, Code.INVALID_ARGUMENT],
      ["relative staging path", { staging_target_path: "staging/x" }, Code.INVALID_ARGUMENT],
      ["staging path outside base", { staging_target_path: `${outside}/s` }, Code.INVALID_ARGUMENT],
      [
        "staging path with ..",
        { staging_target_path: `${plugin.baseDir}/staging/../../../x` },
        Code.INVALID_ARGUMENT,
      ],
      ["no capability", { volume_capability: null }, Code.INVALID_ARGUMENT],
      ["block capability", {
        volume_capability: { block: {}, access_mode: { mode: "SINGLE_NODE_WRITER" } },
      }, Code.INVALID_ARGUMENT],
      ["other fs type", {
        volume_capability: {
          mount: { fs_type: "ext4", mount_flags: [] },
          access_mode: { mode: "SINGLE_NODE_WRITER" },
        },
      }, Code.INVALID_ARGUMENT],
      ["mount flag injection", {
        volume_capability: mountCapability("SINGLE_NODE_WRITER", ["bind,remount"]),
      }, Code.INVALID_ARGUMENT],
      [
        "unknown context key",
        { volume_context: { size: "1G", mountpoint: "/etc" } },
        Code.INVALID_ARGUMENT,
      ],
      ["bad size", { volume_context: { size: "-5G" } }, Code.INVALID_ARGUMENT],
      ["missing dataset without size", { volume_context: {} }, Code.NOT_FOUND],
    ];
    for (const [name, over, code] of cases) {
      await t.step(`${name} → ${code}`, async () => {
        assert.equal(await codeOf(stage(over)), code);
      });
    }
    await t.step("a symlink below the base dir pointing outside is refused", async () => {
      await Deno.mkdir(`${plugin.baseDir}/per-alloc/evil`, { recursive: true });
      await Deno.symlink(outside, `${plugin.baseDir}/per-alloc/evil/vol`);
      assert.equal(
        await codeOf(stage({ staging_target_path: `${plugin.baseDir}/per-alloc/evil/vol/x` })),
        Code.INVALID_ARGUMENT,
      );
      assert.deepEqual([...Deno.readDirSync(outside)], []);
    });
    await t.step("nothing changed on the pool or in the mount table", async () => {
      assert.equal(await poolState(pool), before);
    });
  } finally {
    await Deno.remove(outside, { recursive: true });
  }
});

Deno.test("node: foreign datasets and mounts are never taken over", async (t) => {
  await using pool = await TestPool.create();
  await using plugin = await PluginProcess.start({ parentDataset: pool.parent, dir: pool.dir });
  const c = plugin.client;
  await sh("zfs", "create", `${pool.parent}/legacy`);
  await Deno.writeTextFile(`${pool.mountRoot}/nomad/legacy/keep.txt`, "precious");
  const p = await claimPaths(plugin.baseDir, { volumeId: "legacy", allocId: "a1" });
  const stageReq = {
    volume_id: "legacy",
    staging_target_path: p.staging,
    volume_capability: mountCapability(),
    volume_context: { size: "32MiB" },
  };

  await t.step("an unmarked dataset is refused with instructions to adopt it", async () => {
    const err = await c.node("NodeStageVolume", stageReq).catch((e) => e);
    assert.equal(err.code, Code.FAILED_PRECONDITION);
    assert.match(err.details, /zfs set org\.zfs-csi:managed=yes/);
    assert.equal(await pool.get(`${pool.parent}/legacy`, "refquota"), "0");
    assert.deepEqual(await mountsAt(p.staging), []);
  });

  await t.step("after adoption the full dataset name works as a volume id", async () => {
    await sh("zfs", "set", "org.zfs-csi:managed=yes", `${pool.parent}/legacy`);
    await c.node("NodeStageVolume", { ...stageReq, volume_id: `${pool.parent}/legacy` });
    assert.equal(await Deno.readTextFile(`${p.staging}/keep.txt`), "precious");
    await c.node("NodeUnstageVolume", {
      volume_id: `${pool.parent}/legacy`,
      staging_target_path: p.staging,
    });
  });

  await t.step("a foreign mount at the staging path is left alone", async () => {
    const other = await Deno.makeTempDir({ dir: pool.dir });
    await sh("mount", "--bind", other, p.staging);
    try {
      assert.equal(await codeOf(c.node("NodeStageVolume", stageReq)), Code.ALREADY_EXISTS);
      assert.equal(
        await codeOf(
          c.node("NodeUnstageVolume", { volume_id: "legacy", staging_target_path: p.staging }),
        ),
        Code.FAILED_PRECONDITION,
      );
      assert.equal((await mountsAt(p.staging)).length, 1, "foreign mount still there");
    } finally {
      await sh("umount", p.staging);
    }
  });

  await t.step("publish before stage is FAILED_PRECONDITION", async () => {
    assert.equal(
      await codeOf(c.node("NodePublishVolume", {
        volume_id: "legacy",
        staging_target_path: p.staging,
        target_path: p.target,
        volume_capability: mountCapability(),
        readonly: false,
      })),
      Code.FAILED_PRECONDITION,
    );
    await assert.rejects(Deno.lstat(p.target), Deno.errors.NotFound);
  });
});

Deno.test("node: read-only publish, busy unmount, stats and expansion", async (t) => {
  await using pool = await TestPool.create();
  await using plugin = await PluginProcess.start({ parentDataset: pool.parent, dir: pool.dir });
  const c = plugin.client;
  const dataset = `${pool.parent}/data`;
  const rw = await claimPaths(plugin.baseDir, { volumeId: "data", allocId: "a1" });
  const ro = await claimPaths(plugin.baseDir, {
    volumeId: "data",
    allocId: "a2",
    usage: "ro-file-system-single-node-reader-only",
  });
  const cap = mountCapability();
  await c.node("NodeStageVolume", {
    volume_id: "data",
    staging_target_path: rw.staging,
    volume_capability: cap,
    volume_context: { size: "32MiB" },
  });
  await c.node("NodePublishVolume", {
    volume_id: "data",
    staging_target_path: rw.staging,
    target_path: rw.target,
    volume_capability: cap,
    readonly: false,
  });

  await t.step("the same volume staged at a second usage path, published read-only", async () => {
    const roCap = mountCapability("SINGLE_NODE_READER_ONLY", ["noexec"]);
    await c.node("NodeStageVolume", {
      volume_id: "data",
      staging_target_path: ro.staging,
      volume_capability: roCap,
      volume_context: { size: "32MiB" },
    });
    await c.node("NodePublishVolume", {
      volume_id: "data",
      staging_target_path: ro.staging,
      target_path: ro.target,
      volume_capability: roCap,
      readonly: true,
    });
    const m = await mountsAt(ro.target);
    assert.equal(m.length, 1);
    assert.ok(m[0]!.options.includes("ro"));
    assert.ok(m[0]!.options.includes("noexec"));
    await assert.rejects(Deno.writeTextFile(`${ro.target}/x`, "no"));
    await Deno.writeTextFile(`${rw.target}/x`, "yes");
    assert.equal(await Deno.readTextFile(`${ro.target}/x`), "yes");
    assert.equal(
      await codeOf(c.node("NodePublishVolume", {
        volume_id: "data",
        staging_target_path: ro.staging,
        target_path: ro.target,
        volume_capability: cap,
        readonly: false,
      })),
      Code.ALREADY_EXISTS,
    );
  });

  await t.step("a busy target is not unmounted (no lazy or forced unmount)", async () => {
    const file = await Deno.open(`${ro.target}/x`, { read: true });
    try {
      assert.equal(
        await codeOf(c.node("NodeUnpublishVolume", { volume_id: "data", target_path: ro.target })),
        Code.FAILED_PRECONDITION,
      );
      assert.equal((await mountsAt(ro.target)).length, 1);
    } finally {
      file.close();
    }
    await c.node("NodeUnpublishVolume", { volume_id: "data", target_path: ro.target });
    await c.node("NodeUnstageVolume", { volume_id: "data", staging_target_path: ro.staging });
    assert.deepEqual(await mountsAt(ro.target), []);
  });

  await t.step("stats report bytes, inodes and a normal condition", async () => {
    // Random bytes: OpenZFS compresses by default, and 4 MiB of one byte would take a few blocks.
    const blob = new Uint8Array(4 * 1024 * 1024);
    for (let i = 0; i < blob.length; i += 65536) {
      crypto.getRandomValues(blob.subarray(i, i + 65536));
    }
    await Deno.writeFile(`${rw.target}/blob`, blob);
    // ZFS accounts writes when a transaction group syncs (OpenZFS: every 5 s): ask until it has.
    const usedBytes = (s: { usage: { unit: string; used: string }[] }) =>
      Number(s.usage.find((u) => u.unit === "BYTES")?.used ?? 0);
    let stats = await c.node("NodeGetVolumeStats", { volume_id: "data", volume_path: rw.target });
    for (let i = 0; i < 40 && usedBytes(stats) < 2 * 1024 * 1024; i++) {
      await new Promise((r) => setTimeout(r, 500));
      stats = await c.node("NodeGetVolumeStats", { volume_id: "data", volume_path: rw.target });
    }
    const bytes = stats.usage.find((u: { unit: string }) => u.unit === "BYTES");
    const inodes = stats.usage.find((u: { unit: string }) => u.unit === "INODES");
    assert.ok(Number(bytes.total) > 30 * 1024 * 1024 && Number(bytes.total) <= 32 * 1024 * 1024);
    assert.ok(Number(bytes.used) >= 2 * 1024 * 1024, `used ${bytes.used}`);
    assert.ok(Number(bytes.used) + Number(bytes.available) <= Number(bytes.total));
    assert.ok(Number(inodes.used) >= 2);
    assert.equal(stats.volume_condition.abnormal, false);
    assert.equal(
      await codeOf(c.node("NodeGetVolumeStats", { volume_id: "nope", volume_path: rw.target })),
      Code.NOT_FOUND,
    );
  });

  await t.step("expansion raises the quota, never shrinks, and lets data grow", async () => {
    const expand = (required: number, limit = 0) =>
      c.node("NodeExpandVolume", {
        volume_id: "data",
        volume_path: rw.target,
        capacity_range: { required_bytes: String(required), limit_bytes: String(limit) },
      });
    const grown = await expand(64 * 1024 * 1024);
    assert.equal(Number(grown.capacity_bytes), 64 * 1024 * 1024);
    assert.equal(await pool.get(dataset, "refquota"), String(64 * 1024 * 1024));
    const same = await expand(16 * 1024 * 1024);
    assert.equal(Number(same.capacity_bytes), 64 * 1024 * 1024, "never shrinks");
    assert.equal(await codeOf(expand(1024, 16 * 1024 * 1024)), Code.OUT_OF_RANGE);
    await Deno.writeFile(`${rw.target}/big`, new Uint8Array(40 * 1024 * 1024).fill(1));
    assert.equal((await Deno.stat(`${rw.target}/big`)).size, 40 * 1024 * 1024);
  });
});

Deno.test("node: concurrent calls on one volume wait their turn and all succeed, other volumes proceed", async () => {
  await using pool = await TestPool.create();
  await using plugin = await PluginProcess.start({ parentDataset: pool.parent, dir: pool.dir });
  const c = plugin.client;
  const same = await claimPaths(plugin.baseDir, { volumeId: "same", allocId: "a" });
  const req = (id: string, staging: string) => ({
    volume_id: id,
    staging_target_path: staging,
    volume_capability: mountCapability(),
    volume_context: { size: "16MiB" },
  });
  const others = await Promise.all(
    ["o1", "o2", "o3", "o4"].map((id) =>
      claimPaths(plugin.baseDir, { volumeId: id, allocId: "a" })
    ),
  );
  const calls = [
    ...Array.from(
      { length: 6 },
      () => codeOf(c.node("NodeStageVolume", req("same", same.staging))),
    ),
    ...others.map((p, i) => codeOf(c.node("NodeStageVolume", req(`o${i + 1}`, p.staging)))),
    ...Array.from({ length: 4 }, async () => (await c.identity("Probe")).ready.value ? 0 : -1),
  ];
  const codes = await Promise.all(calls);
  // Nomad fails an allocation on any error of NodeStage (ABORTED included) and 1.10 clients
  // overlap calls for one volume: every overlapping call must wait and then succeed.
  assert.deepEqual(codes.slice(0, 6), [0, 0, 0, 0, 0, 0], "overlapping calls on one volume");
  assert.deepEqual(codes.slice(6), [0, 0, 0, 0, 0, 0, 0, 0], "other volumes and Probe proceed");
  assert.equal((await mountsAt(same.staging)).length, 1, "exactly one staging mount");
  assert.equal(await codeOf(c.node("NodeStageVolume", req("same", same.staging))), 0);
});

Deno.test("identity: Probe says not ready, with the reason logged, when the parent is missing", async () => {
  await using pool = await TestPool.create();
  await using plugin = await PluginProcess.start({
    parentDataset: `${pool.pool}/missing`,
    dir: pool.dir,
    waitReady: false,
  });
  let ready: boolean | undefined;
  const deadline = Date.now() + READY_MS;
  while (Date.now() < deadline && ready === undefined) {
    try {
      ready = (await plugin.client.identity("Probe")).ready.value;
    } catch {
      await new Promise((r) => setTimeout(r, 50));
    }
  }
  assert.equal(ready, false);
  assert.ok(
    plugin.records().some((r) =>
      r.msg === "plugin not ready" && /does not exist/.test(String(r.reason))
    ),
  );
  // Fingerprinting still works, so Nomad can show the plugin and its health.
  assert.equal((await plugin.client.node("NodeGetInfo")).node_id, "node-a");
});

Deno.test("node: publish without a staging path mounts the dataset directly", async () => {
  await using pool = await TestPool.create();
  await using plugin = await PluginProcess.start({ parentDataset: pool.parent, dir: pool.dir });
  const p = await claimPaths(plugin.baseDir, { volumeId: "direct", allocId: "a1" });
  const req = {
    volume_id: "direct",
    staging_target_path: "",
    target_path: p.target,
    volume_capability: mountCapability(),
    readonly: false,
    volume_context: { size: "16MiB" },
  };
  await plugin.client.node("NodePublishVolume", req);
  await plugin.client.node("NodePublishVolume", req);
  const m = await mountsAt(p.target);
  assert.equal(m.length, 1);
  assert.equal(m[0]!.source, `${pool.parent}/direct`);
  await Deno.writeTextFile(`${p.target}/f`, "direct");
  assert.equal(await Deno.readTextFile(`${pool.mountRoot}/nomad/direct/f`), "direct");
  await plugin.client.node("NodeUnpublishVolume", { volume_id: "direct", target_path: p.target });
  assert.deepEqual(await mountsAt(p.target), []);
});
