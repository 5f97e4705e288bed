/**
 * The node service trusts the mount table only as far as it must (issue 11, items 9 and 11): the
 * top mount at a dataset's mountpoint must be the dataset before it is bind-mounted, a bind must
 * land where it was asked for, paths are checked under the volume's lock, and unpublish removes
 * nothing but an empty directory.
 */

import assert from "node:assert/strict";
import { Code } from "../errors.ts";
import { MANAGED_PROPERTY } from "../zfs/names.ts";
import { assertRejectsCsi } from "../../tests/support/assert_errors.ts";
import {
  type FakeResponse,
  type FakeRunner,
  gate,
  hasPrefix,
  mountLine,
} from "../../tests/support/fake_runner.ts";
import {
  fakeNode,
  type FakeServices,
  fakeServices,
  fsCap,
} from "../../tests/support/service_harness.ts";
import { NodeService } from "./node.ts";
import { Datasets } from "../volume/datasets.ts";
import type { LstatFn } from "../mount/identity.ts";
import type { NodePublishVolumeRequest, NodeStageVolumeRequest } from "./types.ts";

const OWN = ["rw", "relatime", "xattr", "noacl"];
/** What fusermount lists for a FUSE filesystem that user 1000 mounts with a dataset's name. */
const USER_FUSE = ["rw", "nosuid", "nodev", "relatime", "user_id=1000", "group_id=1000"];

interface Mount {
  source: string;
  mountPoint: string;
  fsType: string;
  options: string[];
}

/**
 * An OpenZFS host with one volume dataset, tank/nomad/v1, mounted at /mnt/v1. `mount -c --bind`
 * copies the top mount at the source to the target, unless `redirect` sends it elsewhere (as
 * the kernel does when a symlink was swapped into the path) or `onBind` changes the table first.
 */
class Host {
  readonly mounts: Mount[] = [];
  /** Where the next bind really lands, if not at its target. */
  redirect: string | undefined;
  /** Runs just before a bind takes the source's top mount. */
  onBind: (() => void) | undefined;
  /** Whether tank/nomad/v1 carries the marker (an admin may take it off). */
  managed = true;

  constructor(runner: FakeRunner) {
    runner
      .on(["zfs", "get"], () => this.#get())
      .on(["zfs", "set"], {})
      .onExact(["mount"], () => ({ stdout: this.#list() }))
      .on(["mount", "-c", "--bind"], (argv) => this.#bind(argv))
      .on(["mount", "-c", "-o"], {})
      .on(["umount", "-c"], (argv) => this.#umount(argv.at(-1)!));
    this.add("tank/nomad/v1", "/mnt/v1", "zfs", OWN);
  }

  add(source: string, mountPoint: string, fsType: string, options: string[]): void {
    this.mounts.push({ source, mountPoint, fsType, options });
  }

  at(path: string): Mount[] {
    return this.mounts.filter((m) => m.mountPoint === path);
  }

  #get(): FakeResponse {
    const row = (p: string, v: string, s = "-") => `tank/nomad/v1\t${p}\t${v}\t${s}`;
    return {
      stdout: [
        row("type", "filesystem"),
        row("mountpoint", "/mnt/v1", "default"),
        row("mounted", "yes"),
        row("refquota", "1073741824", "local"),
        ...this.managed ? [row(MANAGED_PROPERTY, "yes", "local")] : [],
      ].join("\n") + "\n",
    };
  }

  #list(): string {
    return this.mounts.map((m) => mountLine(m.source, m.mountPoint, m.fsType, m.options.join(",")))
      .join("\n") + "\n";
  }

  #bind(argv: readonly string[]): FakeResponse {
    const [source, target] = argv.slice(-2) as [string, string];
    this.onBind?.();
    const top = this.at(source).at(-1);
    if (!top) return { code: 32, stderr: `mount: ${target}: special device does not exist.\n` };
    this.add(top.source, this.redirect ?? target, top.fsType, [...top.options]);
    return {};
  }

  #umount(target: string): FakeResponse {
    const top = this.at(target).at(-1);
    if (!top) return { code: 32, stderr: `umount: ${target}: not mounted.\n` };
    this.mounts.splice(this.mounts.lastIndexOf(top), 1);
    return {};
  }
}

interface Harness extends AsyncDisposable, FakeServices<Host> {
  readonly node: NodeService;
  readonly base: string;
}

/**
 * lstat as the kernel answers it on `host`: the top mount at a path shows its filesystem's
 * device (one per source, type and options, which a bind copies) and root inode 1; any other
 * path that exists lies on device 1, the base directory's, as does a mount with the option
 * "x-samefs" (a bind mount of a directory of the base directory's filesystem: only its inode
 * differs). `deny` answers EACCES, as a FUSE mount of another user does.
 */
function hostLstat(host: Host, deny: Set<string> = new Set()): LstatFn {
  const devs = new Map<string, number>();
  return async (path) => {
    if (deny.has(path)) throw new Deno.errors.PermissionDenied(`lstat ${path}: EACCES`);
    const top = host.at(path).at(-1);
    if (top?.options.includes("x-samefs")) return { dev: 1, ino: 999_999, isDirectory: true };
    if (top) {
      const key = `${top.source}\0${top.fsType}\0${top.options.join(",")}`;
      if (!devs.has(key)) devs.set(key, 100 + devs.size);
      return { dev: devs.get(key)!, ino: 1, isDirectory: true };
    }
    const real = await Deno.lstat(path);
    return { dev: 1, ino: real.ino ?? 0, isDirectory: real.isDirectory };
  };
}

async function setup(
  before?: (runner: FakeRunner, host: () => Host) => void,
  opts: { lstat?: (host: Host) => LstatFn; realPath?: (path: string) => Promise<string> } = {},
): Promise<Harness> {
  const base = await Deno.makeTempDir({ prefix: "zfs-csi-trust-" });
  const parts = fakeServices({
    parent: "tank/nomad",
    flags: ["--stage-publish-base-dir", base],
    host: (runner) => new Host(runner),
    ...(before ? { before } : {}),
  });
  const { runner } = parts;
  const { config, zfs, mounter, health, locks, log } = parts;
  const node = opts.lstat
    ? new NodeService({
      config,
      zfs,
      mounter,
      datasets: new Datasets(zfs, mounter),
      health,
      locks,
      log,
      lstat: opts.lstat(parts.host),
      ...(opts.realPath ? { realPath: opts.realPath } : {}),
    })
    : fakeNode(parts);
  return {
    ...parts,
    node,
    base,
    [Symbol.asyncDispose]: async () => {
      await Deno.remove(base, { recursive: true });
      runner.assertNoUnexpected();
    },
  };
}

function stageReq(staging: string): NodeStageVolumeRequest {
  return {
    volume_id: "v1",
    publish_context: {},
    staging_target_path: staging,
    volume_capability: fsCap(),
    secrets: {},
    volume_context: {},
  };
}

function publishReq(staging: string, target: string): NodePublishVolumeRequest {
  return {
    volume_id: "v1",
    publish_context: {},
    staging_target_path: staging,
    target_path: target,
    volume_capability: fsCap(),
    readonly: false,
    secrets: {},
    volume_context: {},
  };
}

const binds = (h: Harness) => h.runner.argvs.filter((a) => hasPrefix(a, ["mount", "-c", "--bind"]));

function logged(h: Harness, msg: string): Record<string, unknown>[] {
  return h.logs.map((l) => JSON.parse(l)).filter((r) => r.msg === msg);
}

Deno.test("NodeStageVolume refuses a mount stacked on the dataset's mountpoint and binds nothing", async () => {
  const onTop: ReadonlyArray<readonly [string, Mount, string]> = [
    [
      "a user's FUSE mount named like the dataset",
      { source: "tank/nomad/v1", mountPoint: "/mnt/v1", fsType: "fuse.zfs", options: USER_FUSE },
      '"tank/nomad/v1" (fuse.zfs, user_id=1000)',
    ],
    [
      "an admin's bind mount of another directory",
      { source: "/dev/vda", mountPoint: "/mnt/v1", fsType: "ext4", options: ["rw"] },
      '"/dev/vda" (ext4)',
    ],
    [
      "another dataset with the same mountpoint",
      { source: "tank/nomad/copy", mountPoint: "/mnt/v1", fsType: "zfs", options: OWN },
      '"tank/nomad/copy" (zfs)',
    ],
  ];
  for (const [name, mount, shown] of onTop) {
    await using h = await setup();
    h.host.mounts.push(mount);
    const staging = `${h.base}/staging/v1/rw`;
    await assertRejectsCsi(
      h.node.NodeStageVolume(stageReq(staging)),
      Code.FAILED_PRECONDITION,
      `Dataset "tank/nomad/v1" is mounted at "/mnt/v1", but another mount lies on top of it ` +
        `there: ${shown}; unmount that (umount "/mnt/v1") and retry`,
    );
    assert.deepEqual(binds(h), [], name);
    assert.deepEqual(h.host.at(staging), [], name);
  }
});

Deno.test("NodeStageVolume undoes a bind that landed elsewhere than the checked path", async () => {
  await using h = await setup();
  const staging = `${h.base}/staging/v1/rw`;
  // What the kernel does when a directory on the way became a symlink after the check.
  h.host.redirect = "/elsewhere/rw";
  await assertRejectsCsi(
    h.node.NodeStageVolume(stageReq(staging)),
    Code.INVALID_ARGUMENT,
    `staging_target_path "${staging}" changed while volume "v1" was being mounted there: the ` +
      `mount landed at "/elsewhere/rw" and was unmounted again (is a directory on the way a ` +
      `symbolic link now?)`,
  );
  assert.deepEqual(h.runner.argvs.slice(-3), [
    ["mount", "-c", "--bind", "/mnt/v1", staging],
    ["mount"],
    ["umount", "-c", "/elsewhere/rw"],
  ]);
  assert.deepEqual(h.host.at("/elsewhere/rw"), []);
  assert.deepEqual(h.host.at(staging), []);
  assert.deepEqual(
    logged(h, "undoing a mount made in error").map((r) => [r.level, r.path, r.reason]),
    [["error", "/elsewhere/rw", `it was meant for staging_target_path "${staging}"`]],
  );
});

Deno.test("NodeStageVolume undoes a bind that took a mount stacked on the source meanwhile", async () => {
  await using h = await setup();
  const staging = `${h.base}/staging/v1/rw`;
  // Between the check of the mountpoint and the bind, someone mounts over the dataset.
  h.host.onBind = () => h.host.add("tank/nomad/v1", "/mnt/v1", "fuse.zfs", [...USER_FUSE]);
  await assertRejectsCsi(
    h.node.NodeStageVolume(stageReq(staging)),
    Code.FAILED_PRECONDITION,
    `The bind mount of volume "v1" at staging_target_path "${staging}" shows "tank/nomad/v1" ` +
      `(fuse.zfs, user_id=1000), not dataset "tank/nomad/v1"; it was unmounted again`,
  );
  assert.deepEqual(h.runner.argvs.at(-1), ["umount", "-c", staging]);
  assert.deepEqual(h.host.at(staging), []);
});

Deno.test("NodePublishVolume undoes a bind that landed elsewhere than the checked target", async () => {
  await using h = await setup();
  const staging = `${h.base}/staging/v1/rw`;
  h.host.add("tank/nomad/v1", staging, "zfs", OWN);
  const target = `${h.base}/per-alloc/a1/v1/rw`;
  h.host.redirect = "/elsewhere/target";
  await assertRejectsCsi(
    h.node.NodePublishVolume(publishReq(staging, target)),
    Code.INVALID_ARGUMENT,
    { includes: `the mount landed at "/elsewhere/target" and was unmounted again` },
  );
  assert.deepEqual(h.runner.argvs, [
    ["mount"],
    ["mount", "-c", "--bind", staging, target],
    ["mount"],
    ["umount", "-c", "/elsewhere/target"],
  ]);
  assert.deepEqual(h.host.at("/elsewhere/target"), []);
});

Deno.test("NodePublishVolume checks that its bind shows the volume, and is done when it does", async () => {
  await using h = await setup();
  const staging = `${h.base}/staging/v1/rw`;
  h.host.add("tank/nomad/v1", staging, "zfs", OWN);
  const target = `${h.base}/per-alloc/a1/v1/rw`;
  assert.deepEqual(await h.node.NodePublishVolume(publishReq(staging, target)), {});
  assert.deepEqual(h.runner.argvs, [
    ["mount"],
    ["mount", "-c", "--bind", staging, target],
    ["mount"],
  ]);
  assert.equal(h.host.at(target).length, 1);
});

Deno.test("NodeStageVolume checks its staging path only once it holds the volume's lock", async () => {
  const held = gate();
  const reached = Promise.withResolvers<void>();
  await using h = await setup((runner, host) => {
    runner.on(["zfs", "get"], async () => {
      reached.resolve();
      await held.promise;
      return { code: 1, stderr: "cannot open 'tank/nomad/v1': dataset does not exist\n" };
    }, { times: 1 });
    void host;
  });
  const first = h.node.NodeStageVolume(stageReq(`${h.base}/staging/v1/a`)).catch((e) => e);
  await reached.promise;
  // A second call for the volume arrives while the first holds it; its path is fine now...
  const staging = `${h.base}/staging/v1/b`;
  const second = h.node.NodeStageVolume(stageReq(staging));
  // ...but by the time it holds the volume, the base directory is gone (say, being cleaned up).
  await Deno.remove(h.base, { recursive: true });
  held.open();
  await first;
  await assertRejectsCsi(
    second,
    Code.INVALID_ARGUMENT,
    `staging_target_path "${staging}" is inside base directory "${h.base}", which does not exist`,
  );
  assert.deepEqual(binds(h), []);
  await assert.rejects(Deno.lstat(h.base), Deno.errors.NotFound, "nothing made it again");
  await Deno.mkdir(h.base);
});

Deno.test("NodeUnpublishVolume keeps a regular file at the target, naming it in the log", async () => {
  await using h = await setup();
  await Deno.mkdir(`${h.base}/per-alloc/a1/v1`, { recursive: true });
  const target = `${h.base}/per-alloc/a1/v1/rw`;
  await Deno.writeTextFile(target, "not ours to delete");
  assert.deepEqual(await h.node.NodeUnpublishVolume({ volume_id: "v1", target_path: target }), {});
  assert.equal(await Deno.readTextFile(target), "not ours to delete");
  const warned = logged(h, "target path is not a directory; left in place");
  assert.deepEqual(warned.map((r) => [r.level, r.targetPath, r.kind]), [
    ["warn", target, "regular file"],
  ]);
});

Deno.test("NodeUnpublishVolume keeps a directory with content and removes an empty one", async () => {
  await using h = await setup();
  const full = `${h.base}/per-alloc/a1/v1/rw`;
  await Deno.mkdir(full, { recursive: true });
  await Deno.writeTextFile(`${full}/data`, "left behind");
  assert.deepEqual(await h.node.NodeUnpublishVolume({ volume_id: "v1", target_path: full }), {});
  assert.equal(await Deno.readTextFile(`${full}/data`), "left behind");
  assert.equal(logged(h, "target path left in place")[0]?.targetPath, full);

  const empty = `${h.base}/per-alloc/a2/v1/rw`;
  await Deno.mkdir(empty, { recursive: true });
  h.host.add("tank/nomad/v1", empty, "zfs", OWN);
  assert.deepEqual(await h.node.NodeUnpublishVolume({ volume_id: "v1", target_path: empty }), {});
  assert.deepEqual(h.runner.argvs.at(-1), ["umount", "-c", empty]);
  await assert.rejects(Deno.lstat(empty), Deno.errors.NotFound);
});

// The fast paths (issue 15): with lstat that sees the host's mounts, a volume whose root identity
// a mount table read has confirmed is staged, published, unpublished and unstaged without
// reading the table again; every case lstat cannot decide goes back to the table.

/** A harness whose node sees the host through lstat, with v1's root identity learned. */
async function setupFast(
  deny?: Set<string>,
  realPath?: (path: string) => Promise<string>,
): Promise<Harness & { staging: string }> {
  const h = await setup(undefined, {
    lstat: (host) => hostLstat(host, deny),
    ...(realPath ? { realPath } : {}),
  });
  const staging = `${h.base}/staging/v1/rw`;
  // The first stage reads the table (nothing learned yet) and learns the identity from it.
  await h.node.NodeStageVolume(stageReq(staging));
  assert.deepEqual(h.runner.argvs.filter((a) => a.length === 1), [["mount"], ["mount"]]);
  await h.node.NodeUnstageVolume({ volume_id: "v1", staging_target_path: staging });
  return Object.assign(h, { staging });
}

/** The commands run since `from`, without zfs get's property list. */
function since(h: Harness, from: number): string[][] {
  return h.runner.argvs.slice(from).map((a) => a[0] === "zfs" ? a.slice(0, 2) : a);
}

Deno.test("fast path: a lifecycle reads the table only at publish into a new directory", async () => {
  await using h = await setupFast();
  const { staging } = h;
  // The unstage of the warm-up already ran without the table.
  assert.deepEqual(h.runner.argvs.at(-1), ["umount", "-c", staging]);
  // Nomad makes a new per-allocation directory for each allocation: never seen before.
  const target = `${h.base}/per-alloc/a1/v1/rw`;
  await Deno.mkdir(`${h.base}/per-alloc/a1/v1`, { recursive: true });
  for (const seen of [false, true]) {
    const from = h.runner.argvs.length;
    await h.node.NodeStageVolume(stageReq(staging));
    await h.node.NodePublishVolume(publishReq(staging, target));
    assert.equal(h.host.at(staging).length, 1);
    assert.equal(h.host.at(target).length, 1);
    await h.node.NodeUnpublishVolume({ volume_id: "v1", target_path: target });
    await h.node.NodeUnstageVolume({ volume_id: "v1", staging_target_path: staging });
    // (This fake host does not keep the staged mark: each stage sets it again.)
    assert.deepEqual(since(h, from), [
      ["zfs", "get"],
      ["zfs", "set"],
      ["mount", "-c", "--bind", "/mnt/v1", staging],
      ...seen ? [] : [["mount"]],
      ["mount", "-c", "--bind", staging, target],
      ["umount", "-c", target],
      ["umount", "-c", staging],
    ], seen ? "a second allocation in the same directory" : "a new allocation");
    assert.deepEqual([h.host.at(staging), h.host.at(target)], [[], []]);
    await assert.rejects(Deno.lstat(target), Deno.errors.NotFound, "the target directory is gone");
  }
});

Deno.test("fast path: a target below a same-filesystem bind mount on a new directory goes to the table", async () => {
  await using h = await setupFast();
  const { staging } = h;
  await h.node.NodeStageVolume(stageReq(staging));
  await Deno.mkdir(`${h.base}/per-alloc/a1`, { recursive: true });
  // Same device as the base directory, and never seen: lstat cannot tell it from a directory.
  h.host.add("/tmp/outside", `${h.base}/per-alloc/a1`, "none", ["rw", "x-samefs"]);
  const target = `${h.base}/per-alloc/a1/v1/rw`;
  const from = h.runner.argvs.length;
  await assertRejectsCsi(
    h.node.NodePublishVolume(publishReq(staging, target)),
    Code.INVALID_ARGUMENT,
    { includes: `lies below another mount ("${h.base}/per-alloc/a1")` },
  );
  assert.deepEqual(since(h, from), [["mount"]]);
  await assert.rejects(Deno.lstat(`${h.base}/per-alloc/a1/v1`), Deno.errors.NotFound);
});

Deno.test("fast path: a bind that took a mount stacked on the dataset is undone, then the table rules", async () => {
  await using h = await setupFast();
  const { staging } = h;
  h.host.onBind = () => h.host.add("tank/nomad/v1", "/mnt/v1", "fuse.zfs", [...USER_FUSE]);
  const from = h.runner.argvs.length;
  const covered =
    `Dataset "tank/nomad/v1" is mounted at "/mnt/v1", but another mount lies on top ` +
    `of it there: "tank/nomad/v1" (fuse.zfs, user_id=1000); unmount that (umount "/mnt/v1") ` +
    `and retry`;
  await assertRejectsCsi(
    h.node.NodeStageVolume(stageReq(staging)),
    Code.FAILED_PRECONDITION,
    covered,
  );
  assert.deepEqual(since(h, from), [
    ["zfs", "get"],
    ["zfs", "set"],
    ["mount", "-c", "--bind", "/mnt/v1", staging],
    // Not the volume's identity: the table judges the bind, which is undone...
    ["mount"],
    ["umount", "-c", staging],
    // ...and the table path's first check names what lies on the mountpoint.
    ["zfs", "get"],
    ["mount"],
  ]);
  assert.deepEqual(h.host.at(staging), []);
  assert.deepEqual(
    logged(h, "undoing a mount made in error").map((r) => r.path),
    [staging],
  );
  // The identity is forgotten: the next stage checks the mountpoint in the table first.
  h.host.onBind = undefined;
  await assertRejectsCsi(h.node.NodeStageVolume(stageReq(staging)), Code.FAILED_PRECONDITION, {
    includes: "another mount lies on top of it there",
  });
  assert.deepEqual(binds(h).length, 2, "no second bind");
});

Deno.test("fast path: a mount stacked on the staging path sends publish to the table, which refuses", async () => {
  await using h = await setupFast();
  const { staging } = h;
  await h.node.NodeStageVolume(stageReq(staging));
  // A user whose job made the volume's root its own mounts a FUSE filesystem over it.
  h.host.add("tank/nomad/v1", staging, "fuse.zfs", [...USER_FUSE]);
  const target = `${h.base}/per-alloc/a1/v1/rw`;
  const from = h.runner.argvs.length;
  await assertRejectsCsi(
    h.node.NodePublishVolume(publishReq(staging, target)),
    Code.FAILED_PRECONDITION,
    { includes: "is not staged at" },
  );
  assert.deepEqual(since(h, from), [["mount"]]);
});

Deno.test("fast path: unpublish leaves a foreign mount at the target alone", async () => {
  await using h = await setupFast();
  const target = `${h.base}/per-alloc/a1/v1/rw`;
  await Deno.mkdir(target, { recursive: true });
  h.host.add("tmpfs", target, "tmpfs", ["rw"]);
  const from = h.runner.argvs.length;
  await assertRejectsCsi(
    h.node.NodeUnpublishVolume({ volume_id: "v1", target_path: target }),
    Code.FAILED_PRECONDITION,
    `"${target}" holds a mount of "tmpfs", not of volume "v1"; leaving it alone`,
  );
  assert.deepEqual(since(h, from), [["mount"]]);
  assert.equal(h.host.at(target).length, 1);
});

Deno.test("fast path: unpublish of two stacked mounts of the volume unmounts one, then asks the table", async () => {
  await using h = await setupFast();
  const { staging } = h;
  await h.node.NodeStageVolume(stageReq(staging));
  const target = `${h.base}/per-alloc/a1/v1/rw`;
  await h.node.NodePublishVolume(publishReq(staging, target));
  h.host.add("tank/nomad/v1", target, "zfs", OWN);
  const from = h.runner.argvs.length;
  await h.node.NodeUnpublishVolume({ volume_id: "v1", target_path: target });
  assert.deepEqual(since(h, from), [
    ["umount", "-c", target],
    ["mount"],
    ["umount", "-c", target],
  ]);
  assert.deepEqual(h.host.at(target), []);
});

Deno.test("fast path: a publish whose target became a symlink is undone where the bind landed", async () => {
  // Between the checks and the bind, a directory on the way becomes a symlink to /elsewhere
  // (unit tests may not make symlinks: realpath answers as it would then).
  let swapped = false;
  await using h = await setupFast(undefined, (path) => {
    if (!swapped) return Deno.realPath(path);
    return Promise.resolve(path.replace(/^.*\/per-alloc\/a1\/v1\//, "/elsewhere/"));
  });
  const { staging } = h;
  await h.node.NodeStageVolume(stageReq(staging));
  const elsewhere = "/elsewhere";
  const target = `${h.base}/per-alloc/a1/v1/rw`;
  h.host.onBind = () => swapped = true;
  h.host.redirect = `${elsewhere}/rw`;
  const from = h.runner.argvs.length;
  await assertRejectsCsi(
    h.node.NodePublishVolume(publishReq(staging, target)),
    Code.INVALID_ARGUMENT,
    { includes: `the mount landed at "${elsewhere}/rw" and was unmounted again` },
  );
  assert.deepEqual(since(h, from), [
    ["mount", "-c", "--bind", staging, target],
    ["mount"],
    ["umount", "-c", `${elsewhere}/rw`],
  ]);
  assert.deepEqual(h.host.at(`${elsewhere}/rw`), []);
});

Deno.test("fast path: a mount between the base directory and the target sends the call to the table", async () => {
  await using h = await setupFast();
  const { staging } = h;
  await h.node.NodeStageVolume(stageReq(staging));
  await Deno.mkdir(`${h.base}/per-alloc`);
  h.host.add("tmpfs", `${h.base}/per-alloc`, "tmpfs", ["rw"]);
  const target = `${h.base}/per-alloc/a1/v1/rw`;
  const from = h.runner.argvs.length;
  for (
    const call of [
      () => h.node.NodePublishVolume(publishReq(staging, target)),
      () => h.node.NodeUnpublishVolume({ volume_id: "v1", target_path: target }),
    ]
  ) {
    await assertRejectsCsi(call(), Code.INVALID_ARGUMENT, {
      includes: `lies below another mount ("${h.base}/per-alloc")`,
    });
  }
  assert.deepEqual(since(h, from), [["mount"], ["mount"]]);
  await assert.rejects(Deno.lstat(`${h.base}/per-alloc/a1`), Deno.errors.NotFound, "made nothing");
});

Deno.test("fast path: a path lstat cannot read is judged by the mount table", async () => {
  const deny = new Set<string>();
  await using h = await setupFast(deny);
  const { staging } = h;
  await h.node.NodeStageVolume(stageReq(staging));
  deny.add(staging);
  const from = h.runner.argvs.length;
  await h.node.NodeUnstageVolume({ volume_id: "v1", staging_target_path: staging });
  assert.deepEqual(since(h, from), [["mount"], ["umount", "-c", staging]]);
});

Deno.test("fast path: a bind mount of a same-filesystem directory at the staging path is left alone", async () => {
  await using h = await setupFast();
  const { staging } = h;
  // lstat shows the base directory's device there: only the inode tells it from the directory.
  h.host.add("/tmp/other", staging, "none", ["rw", "x-samefs"]);
  const from = h.runner.argvs.length;
  await assertRejectsCsi(
    h.node.NodeUnstageVolume({ volume_id: "v1", staging_target_path: staging }),
    Code.FAILED_PRECONDITION,
    `"${staging}" holds a mount of "/tmp/other", not of volume "v1"; leaving it alone`,
  );
  await assertRejectsCsi(h.node.NodeStageVolume(stageReq(staging)), Code.ALREADY_EXISTS);
  assert.deepEqual(since(h, from), [["mount"], ["zfs", "get"], ["mount"]]);
  assert.equal(h.host.at(staging).length, 1);
});

Deno.test("fast path: a same-filesystem bind mount on a directory seen before sends publish to the table", async () => {
  await using h = await setupFast();
  const { staging } = h;
  await h.node.NodeStageVolume(stageReq(staging));
  const target = `${h.base}/per-alloc/a1/v1/rw`;
  await h.node.NodePublishVolume(publishReq(staging, target));
  await h.node.NodeUnpublishVolume({ volume_id: "v1", target_path: target });
  h.host.add("/tmp/other", `${h.base}/per-alloc`, "none", ["rw", "x-samefs"]);
  const from = h.runner.argvs.length;
  await assertRejectsCsi(
    h.node.NodePublishVolume(publishReq(staging, target)),
    Code.INVALID_ARGUMENT,
    { includes: `lies below another mount ("${h.base}/per-alloc")` },
  );
  assert.deepEqual(since(h, from), [["mount"]]);
});

Deno.test("fast path: a stage still refuses a dataset that lost its marker, binding nothing", async () => {
  await using h = await setupFast();
  h.host.managed = false;
  const from = h.runner.argvs.length;
  await assertRejectsCsi(h.node.NodeStageVolume(stageReq(h.staging)), Code.FAILED_PRECONDITION, {
    includes: "exists but is not managed by zfs-csi",
  });
  assert.deepEqual(since(h, from), [["zfs", "get"]]);
  assert.deepEqual(h.host.at(h.staging), []);
});
