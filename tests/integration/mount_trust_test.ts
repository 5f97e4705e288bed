/**
 * How far the plugin trusts the mount table, on a real pool (issue 11, items 9 and 11): what a
 * process sees at a dataset's mountpoint is its top mount, so that must be the dataset before it
 * is bind-mounted; a FUSE mount a user makes with a dataset's name is not the dataset; a bind
 * mount must land at the path that was checked; and unpublish deletes no file.
 */

import assert from "node:assert/strict";
import { Code } from "../../src/errors.ts";
import { claimPaths, mountCapability, mountsAt } from "../support/nomad.ts";
import { PluginProcess } from "../support/plugin_process.ts";
import { sh, TestPool, tryRun } from "../support/zfs_pool.ts";

const CAP = mountCapability();

/** The fake FUSE mounts need the FUSE device; a machine without it skips those cases. */
// Asked of `test`: Deno reads nothing below /dev without --allow-all.
const HAVE_FUSE = (await tryRun("test", "-c", "/dev/fuse")).code === 0;
if (!HAVE_FUSE) {
  Deno.stdout.writeSync(
    new TextEncoder().encode("mount trust: FUSE cases skipped, this machine has no /dev/fuse\n"),
  );
}

/** Stages volume `id` (creating its dataset) and unstages it again; returns its mountpoint. */
async function createVolume(plugin: PluginProcess, pool: TestPool, id: string): Promise<string> {
  const p = await claimPaths(plugin.baseDir, { volumeId: id, allocId: "setup" });
  await plugin.client.node("NodeStageVolume", {
    volume_id: id,
    staging_target_path: p.staging,
    volume_capability: CAP,
    volume_context: { size: "32MiB" },
  });
  await plugin.client.node("NodeUnstageVolume", { volume_id: id, staging_target_path: p.staging });
  return `${pool.mountRoot}/nomad/${id}`;
}

/**
 * Mounts at `path` what a user's `fusermount -o fsname=<source>,subtype=zfs` mounts: a FUSE
 * filesystem listed as "<source> on <path> type fuse.zfs (...,user_id=65534,...)". No FUSE
 * program serves it (accessing it fails); only its entry in the mount table matters here. The
 * kernel takes a FUSE mount from root with any user_id, so no FUSE package is needed.
 */
async function fakeUserFuseMount(source: string, path: string): Promise<void> {
  const options = "nosuid,nodev,fd=3,rootmode=40000,user_id=65534,group_id=65534";
  // -i: no mount.fuse helper (it would start a program named after the subtype: zfs).
  await sh(
    "bash",
    "-c",
    'exec 3<>/dev/fuse && exec mount -i -t fuse.zfs -o "$1" "$2" "$3"',
    "fake-fuse",
    options,
    source,
    path,
  );
}

Deno.test("mount trust: a mount stacked on a volume's mountpoint is never bind-mounted", async (t) => {
  await using pool = await TestPool.create();
  await using plugin = await PluginProcess.start({ parentDataset: pool.parent, dir: pool.dir });
  const c = plugin.client;
  const dataset = `${pool.parent}/vol`;
  const mountpoint = await createVolume(plugin, pool, "vol");
  await Deno.writeTextFile(`${mountpoint}/own.txt`, "the volume's data");
  const p = await claimPaths(plugin.baseDir, { volumeId: "vol", allocId: "a1" });
  const stage = {
    volume_id: "vol",
    staging_target_path: p.staging,
    volume_capability: CAP,
    volume_context: { size: "32MiB" },
  };

  await t.step(
    "a bind mount of another directory on top: refused, nothing bind-mounted",
    async () => {
      const other = await Deno.makeTempDir({ dir: pool.dir });
      await Deno.writeTextFile(`${other}/not-the-volume.txt`, "someone else's");
      await sh("mount", "--bind", other, mountpoint);
      try {
        const err = await c.node("NodeStageVolume", stage).catch((e) => e);
        assert.equal(err.code, Code.FAILED_PRECONDITION, String(err.details));
        assert.match(
          err.details,
          new RegExp(
            `^Dataset "${dataset}" is mounted at "${mountpoint}", but another mount lies on top ` +
              `of it there: `,
          ),
        );
        assert.deepEqual(await mountsAt(p.staging), []);
      } finally {
        await sh("umount", mountpoint);
      }
    },
  );

  await t.step({
    name: "a user's FUSE mount named like the volume, on top: refused too",
    ignore: !HAVE_FUSE,
    fn: async () => {
      await fakeUserFuseMount(dataset, mountpoint);
      try {
        const top = (await mountsAt(mountpoint)).at(-1)!;
        assert.equal(top.fsType, "fuse.zfs");
        assert.equal(top.source, dataset);
        assert.ok(top.options.includes("user_id=65534"), top.options.join(","));
        const err = await c.node("NodeStageVolume", stage).catch((e) => e);
        assert.equal(err.code, Code.FAILED_PRECONDITION, String(err.details));
        assert.match(err.details, /another mount lies on top of it there: .*user_id=65534/);
        assert.deepEqual(await mountsAt(p.staging), []);
      } finally {
        await sh("umount", mountpoint);
      }
    },
  });

  await t.step("with nothing on top, the volume stages and shows its own data", async () => {
    await c.node("NodeStageVolume", stage);
    assert.equal(await Deno.readTextFile(`${p.staging}/own.txt`), "the volume's data");
    await c.node("NodeUnstageVolume", { volume_id: "vol", staging_target_path: p.staging });
  });
});

Deno.test({
  name: "mount trust: a user's FUSE mount named like a volume is no use of it",
  ignore: !HAVE_FUSE,
}, async () => {
  await using pool = await TestPool.create();
  await using plugin = await PluginProcess.start({ parentDataset: pool.parent, dir: pool.dir });
  const dataset = `${pool.parent}/web`;
  await createVolume(plugin, pool, "web");
  const fake = `${pool.dir}/fake`;
  await Deno.mkdir(fake);
  await fakeUserFuseMount(dataset, fake);
  try {
    assert.equal((await mountsAt(fake))[0]?.source, dataset);
    // Before the fix this answered "in use: mounted at <fake>", for as long as the user liked.
    const del = () =>
      plugin.client.controller("DeleteVolume", { volume_id: "web@node-a" }).then(
        () => undefined,
        (e) => e,
      );
    const first = await del();
    if (first !== undefined) {
      // zfs-fuse's `zfs unmount` can take the user's mount for the dataset's own (its libzfs
      // finds a mount by source name among fuse.zfs ones), and its rename then calls the
      // still-mounted dataset busy. OpenZFS looks at "zfs" mounts only. That is a refusal an
      // operator retries, never "in use": the retry must then delete it.
      assert.equal(first.code, Code.FAILED_PRECONDITION, `DeleteVolume: ${first.details}`);
      assert.match(first.details, /"zfs rename" failed \(busy\)/);
      assert.deepEqual(await mountsAt(fake), [], "zfs-fuse's unmount took the user's mount");
      const again = await del();
      assert.equal(again, undefined, `DeleteVolume again: ${again?.details}`);
    }
    assert.equal(
      (await tryRun("zfs", "get", "-H", "-o", "value", "type", dataset)).code,
      1,
      "the volume was deleted (set aside)",
    );
    // The plugin learned which type this ZFS mounts as, from the parent's own mount: only the
    // zfs-fuse daemon's mounts (fuse.zfs, user_id=0) count here, only "zfs" ones on OpenZFS.
    const learned = plugin.records().find((r) =>
      r.msg === "ZFS mounts datasets with this filesystem type"
    );
    assert.equal(learned?.fsType, (await mountsAt(`${pool.mountRoot}/nomad`))[0]?.fsType);
  } finally {
    // zfs-fuse's own `zfs unmount` of the dataset (in the delete) may have taken it already.
    await tryRun("umount", fake);
  }
});

Deno.test("mount trust: NodeUnpublishVolume leaves a regular file at the target path", async () => {
  await using pool = await TestPool.create();
  await using plugin = await PluginProcess.start({ parentDataset: pool.parent, dir: pool.dir });
  const p = await claimPaths(plugin.baseDir, { volumeId: "vol", allocId: "a1" });
  await Deno.writeTextFile(p.target, "a file, not a mount point");
  await plugin.client.node("NodeUnpublishVolume", { volume_id: "vol", target_path: p.target });
  assert.equal(await Deno.readTextFile(p.target), "a file, not a mount point");
  assert.ok(
    plugin.records().some((r) =>
      r.msg === "target path is not a directory; left in place" && r.targetPath === p.target
    ),
  );
  // An empty target directory that is not a mount point is removed, as before.
  const q = await claimPaths(plugin.baseDir, { volumeId: "vol", allocId: "a2" });
  await Deno.mkdir(q.target);
  await plugin.client.node("NodeUnpublishVolume", { volume_id: "vol", target_path: q.target });
  await assert.rejects(Deno.lstat(q.target), Deno.errors.NotFound);
});

/**
 * A `mount` first on the plugin's PATH that, right before the bind mount at `target`, swaps the
 * directory `swap` for a symlink to `outside`: the worst moment an attacker could hit, after
 * every check the plugin makes and before the kernel looks the path up.
 */
async function swappingMount(dir: string, opts: {
  realMount: string;
  target: string;
  swap: string;
  outside: string;
}): Promise<void> {
  const q = (s: string) => `'${s.replaceAll("'", `'\\''`)}'`;
  await Deno.mkdir(dir, { recursive: true });
  await Deno.writeTextFile(
    `${dir}/mount`,
    [
      "#!/bin/bash",
      `if [ "\${@: -1}" = ${q(opts.target)} ] && [[ " $* " == *" --bind "* ]] && [ ! -L ${
        q(opts.swap)
      } ]; then`,
      `  mv ${q(opts.swap)} ${q(opts.swap + ".moved")} && ln -s ${q(opts.outside)} ${q(opts.swap)}`,
      "fi",
      `exec ${q(opts.realMount)} "$@"`,
      "",
    ].join("\n"),
  );
  await Deno.chmod(`${dir}/mount`, 0o755);
}

Deno.test("mount trust: a symlink swapped in between the check and the bind leaves no mount outside", async () => {
  await using pool = await TestPool.create();
  const base = `${pool.dir}/base`;
  const target = `${base}/per-alloc/a9/vol/rw`;
  const swap = `${base}/per-alloc/a9`;
  const outside = `${pool.dir}/outside`;
  await Deno.mkdir(`${outside}/vol/rw`, { recursive: true });
  const realMount = (await sh("bash", "-c", "command -v mount")).trim();
  const shims = `${pool.dir}/shims`;
  await swappingMount(shims, { realMount, target, swap, outside });
  // The plugin runs `mount` as found on its PATH, which it inherits: the shim, which this test's
  // flags allow besides the listed programs (a shipped build would refuse it).
  const oldPath = Deno.env.get("PATH") ?? "";
  Deno.env.set("PATH", `${shims}:${oldPath}`);
  let plugin: PluginProcess;
  try {
    plugin = await PluginProcess.start({
      parentDataset: pool.parent,
      dir: pool.dir,
      scope: { extraPrograms: [`${shims}/mount`] },
    });
  } finally {
    Deno.env.set("PATH", oldPath);
  }
  await using _plugin = plugin;
  try {
    const staging = `${base}/staging/default/vol/rw`;
    await Deno.mkdir(staging, { recursive: true, mode: 0o700 });
    await Deno.mkdir(`${swap}/vol`, { recursive: true });
    await plugin.client.node("NodeStageVolume", {
      volume_id: "vol",
      staging_target_path: staging,
      volume_capability: CAP,
      volume_context: { size: "32MiB" },
    });
    const err = await plugin.client.node("NodePublishVolume", {
      volume_id: "vol",
      staging_target_path: staging,
      target_path: target,
      volume_capability: CAP,
      readonly: false,
    }).catch((e) => e);
    // The shim did swap the path; the kernel followed the symlink, and the plugin saw it.
    assert.ok((await Deno.lstat(swap)).isSymlink, "the path was swapped");
    assert.equal(err.code, Code.INVALID_ARGUMENT, String(err.details));
    assert.match(err.details, /changed while volume "vol" was being mounted there/);
    assert.deepEqual(await mountsAt(`${outside}/vol/rw`), [], "no mount left outside");
    assert.deepEqual(await mountsAt(target), []);
    assert.ok(
      plugin.records().some((r) =>
        r.msg === "undoing a mount made in error" && r.path === `${outside}/vol/rw`
      ),
    );
    await plugin.client.node("NodeUnstageVolume", {
      volume_id: "vol",
      staging_target_path: staging,
    });
  } finally {
    // Undo whatever was left, so the pool can be destroyed.
    await tryRun("umount", `${outside}/vol/rw`);
    if ((await Deno.lstat(swap).catch(() => undefined))?.isSymlink) {
      await Deno.remove(swap);
      await Deno.rename(`${swap}.moved`, swap);
    }
  }
});
