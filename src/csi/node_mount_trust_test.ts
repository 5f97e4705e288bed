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
import type { NodeService } from "./node.ts";
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
        row(MANAGED_PROPERTY, "yes", "local"),
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

async function setup(
  before?: (runner: FakeRunner, host: () => Host) => void,
): Promise<Harness> {
  const base = await Deno.makeTempDir({ prefix: "zfs-csi-trust-" });
  const parts = fakeServices({
    parent: "tank/nomad",
    flags: ["--stage-publish-base-dir", base],
    host: (runner) => new Host(runner),
    ...(before ? { before } : {}),
  });
  const { runner } = parts;
  const node = fakeNode(parts);
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
