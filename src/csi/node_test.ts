import assert from "node:assert/strict";
import { Code } from "../errors.ts";
import { MANAGED_PROPERTY, STAGED_PROPERTY } from "../zfs/names.ts";
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
import { MANAGED_OPTION, zfsArgv } from "../../tests/support/zfs_argv.ts";
import { VOLUME_PROPERTIES } from "../volume/datasets.ts";
import type { FsStats, NodeService } from "./node.ts";
import { SIZE_STATE } from "../volume/sizing.ts";
import type {
  NodeExpandVolumeRequest,
  NodePublishVolumeRequest,
  NodeStageVolumeRequest,
} from "./types.ts";

const PARENT = "tank/nomad";
const zfs = zfsArgv("zfs");
const GET = zfs.get(VOLUME_PROPERTIES.join(","));
/** The `zfs set` with which the first stage marks a volume as used, at the time it recorded. */
const markStaged = (h: { host: FakeHost }, dataset: string) => [
  "zfs",
  "set",
  `${STAGED_PROPERTY}=${h.host.datasets.get(dataset)?.stagedAt}`,
  dataset,
];

/** A dataset as the fake zfs knows it. */
interface FakeDataset {
  managed: boolean;
  type: string;
  mountpoint: string;
  mounted: boolean;
  refquota: number;
  /** The staged marker's value, once a stage has set it. */
  stagedAt?: string;
  /** Other properties set locally (the backup settings). */
  extra?: Record<string, string>;
}

interface FakeMount {
  source: string;
  mountPoint: string;
  fsType: string;
  options: string[];
}

/**
 * A fake host behind the FakeRunner: datasets that `zfs get/create/mount/set` see and change,
 * and a mount table that `mount`, `mount --bind`, `mount -o remount,...` and `umount` see and
 * change. Every argv is still recorded by the runner, and anything else is unexpected.
 */
class FakeHost {
  readonly datasets = new Map<string, FakeDataset>();
  readonly mounts: FakeMount[] = [];

  constructor(runner: FakeRunner) {
    runner
      .on(["zfs", "get"], (argv) => this.zfsGet(argv))
      .on(["zfs", "create"], (argv) => this.zfsCreate(argv))
      .on(["zfs", "mount"], (argv) => this.zfsMount(argv))
      .on(["zfs", "set"], (argv) => this.zfsSet(argv))
      .onExact(["mount"], () => ({ stdout: this.mountList() }))
      .on(["mount", "-c", "--bind"], (argv) => this.bind(argv))
      .on(["mount", "-c", "-o"], (argv) => this.remount(argv))
      .on(["umount"], (argv) => this.umount(argv));
  }

  /** Adds a dataset owned by the plugin, mounted at /mnt/<dataset>. */
  addDataset(name: string, opts: Partial<FakeDataset> = {}): FakeDataset {
    const ds: FakeDataset = {
      managed: true,
      type: "filesystem",
      mountpoint: `/mnt/${name}`,
      mounted: true,
      refquota: 0,
      ...opts,
    };
    this.datasets.set(name, ds);
    if (ds.mounted) this.addMount(name, ds.mountpoint);
    return ds;
  }

  addMount(source: string, mountPoint: string, fsType = "zfs", options = ["rw", "xattr"]): void {
    this.mounts.push({ source, mountPoint, fsType, options });
  }

  top(path: string): FakeMount | undefined {
    return this.mounts.filter((m) => m.mountPoint === path).at(-1);
  }

  mountList(): string {
    return this.mounts.map((m) => mountLine(m.source, m.mountPoint, m.fsType, m.options.join(",")))
      .join("\n") + "\n";
  }

  zfsGet(argv: readonly string[]): FakeResponse {
    const name = argv.at(-1)!;
    const ds = this.datasets.get(name);
    if (!ds) return { code: 1, stderr: `cannot open '${name}': dataset does not exist\n` };
    const row = (p: string, v: string, s: string) => `${name}\t${p}\t${v}\t${s}`;
    return {
      stdout: [
        row("type", ds.type, "-"),
        row("mountpoint", ds.mountpoint, "default"),
        row("mounted", ds.mounted ? "yes" : "no", "-"),
        row("refquota", String(ds.refquota), ds.refquota ? "local" : "default"),
        row("used", "98304", "-"),
        row("available", "1073643520", "-"),
        row(MANAGED_PROPERTY, ds.managed ? "yes" : "-", ds.managed ? "local" : "-"),
        row(STAGED_PROPERTY, ds.stagedAt ?? "-", ds.stagedAt ? "local" : "-"),
        ...Object.entries(ds.extra ?? {}).map(([k, v]) => row(k, v, "local")),
      ].join("\n") + "\n",
    };
  }

  zfsCreate(argv: readonly string[]): FakeResponse {
    const name = argv.at(-1)!;
    if (this.datasets.has(name)) {
      return { code: 1, stderr: `cannot create '${name}': dataset already exists\n` };
    }
    const props = new Map<string, string>();
    for (let i = 2; i < argv.length - 1; i += 2) {
      assert.equal(argv[i], "-o");
      const [k, v] = argv[i + 1]!.split("=");
      props.set(k!, v!);
    }
    this.addDataset(name, {
      managed: props.get(MANAGED_PROPERTY) === "yes",
      refquota: Number(props.get("refquota") ?? "0"),
    });
    return {};
  }

  zfsMount(argv: readonly string[]): FakeResponse {
    const ds = this.datasets.get(argv[2]!)!;
    if (ds.mounted) {
      return { code: 1, stderr: `cannot mount '${argv[2]}': filesystem already mounted\n` };
    }
    ds.mounted = true;
    this.addMount(argv[2]!, ds.mountpoint);
    return {};
  }

  zfsSet(argv: readonly string[]): FakeResponse {
    const ds = this.datasets.get(argv.at(-1)!)!;
    for (const pair of argv.slice(2, -1)) {
      const eq = pair.indexOf("=");
      const [k, v] = [pair.slice(0, eq), pair.slice(eq + 1)];
      if (k === STAGED_PROPERTY) ds.stagedAt = v;
      else if (k === "refquota") ds.refquota = Number(v);
      else if (k.startsWith("org.zfs-csi:backup-")) ds.extra = { ...ds.extra, [k]: v };
      else assert.fail(`unexpected zfs set ${pair}`);
    }
    return {};
  }

  bind(argv: readonly string[]): FakeResponse {
    const [source, target] = argv.slice(-2);
    const from = this.top(source!);
    if (!from) {
      return { code: 32, stderr: `mount: ${target}: special device ${source} does not exist.\n` };
    }
    this.addMount(from.source, target!, from.fsType, [...from.options]);
    return {};
  }

  remount(argv: readonly string[]): FakeResponse {
    const [options, target] = argv.slice(-2);
    const top = this.top(target!);
    if (!top) return { code: 32, stderr: `mount: ${target}: mount point not mounted.\n` };
    const flags = options!.split(",").filter((f) => f !== "remount" && f !== "bind");
    top.options = [...flags, ...top.options.filter((o) => o !== "rw" && !flags.includes(o))];
    return {};
  }

  umount(argv: readonly string[]): FakeResponse {
    const target = argv.at(-1)!;
    const top = this.top(target);
    if (!top) return { code: 32, stderr: `umount: ${target}: not mounted.\n` };
    this.mounts.splice(this.mounts.lastIndexOf(top), 1);
    return {};
  }
}

interface Harness extends AsyncDisposable, FakeServices<FakeHost> {
  readonly node: NodeService;
  readonly base: string;
}

async function setup(
  opts: {
    flags?: readonly string[];
    before?: (runner: FakeRunner, host: () => FakeHost) => void;
    statfs?: (path: string) => Promise<FsStats>;
  } = {},
): Promise<Harness> {
  const base = await Deno.makeTempDir({ prefix: "zfs-csi-node-" });
  const parts = fakeServices({
    parent: PARENT,
    flags: ["--stage-publish-base-dir", base, ...opts.flags ?? []],
    host: (runner) => new FakeHost(runner),
    ...(opts.before ? { before: opts.before } : {}),
  });
  const { runner } = parts;
  const node = fakeNode(parts, opts.statfs ? { statfs: opts.statfs } : {});
  return {
    ...parts,
    node,
    base,
    [Symbol.asyncDispose]: async () => {
      await Deno.remove(base, { recursive: true });
      // Even a command whose failure the service swallowed must have been scripted.
      runner.assertNoUnexpected();
    },
  };
}

function stageReq(
  volumeId: string,
  staging: string,
  over: Partial<NodeStageVolumeRequest> = {},
): NodeStageVolumeRequest {
  return {
    volume_id: volumeId,
    publish_context: {},
    staging_target_path: staging,
    volume_capability: fsCap(),
    secrets: {},
    volume_context: {},
    ...over,
  };
}

function publishReq(
  volumeId: string,
  staging: string,
  target: string,
  over: Partial<NodePublishVolumeRequest> = {},
): NodePublishVolumeRequest {
  return {
    volume_id: volumeId,
    publish_context: {},
    staging_target_path: staging,
    target_path: target,
    volume_capability: fsCap(),
    readonly: false,
    secrets: {},
    volume_context: {},
    ...over,
  };
}

function expandReq(
  volumeId: string,
  path: string,
  required: string,
  limit = "0",
): NodeExpandVolumeRequest {
  return {
    volume_id: volumeId,
    volume_path: path,
    capacity_range: { required_bytes: required, limit_bytes: limit },
    staging_target_path: "",
    volume_capability: null,
    secrets: {},
  };
}

async function isDirectory(path: string): Promise<boolean> {
  try {
    return (await Deno.lstat(path)).isDirectory;
  } catch {
    return false;
  }
}

const hasArgv = (argvs: string[][], prefix: readonly string[]) =>
  argvs.some((a) => hasPrefix(a, prefix));

Deno.test("NodeService.NodeStageVolume creates a missing dataset with refquota and the marker", async () => {
  await using h = await setup();
  const staging = `${h.base}/staging/v1/rw-file-system-single-node-writer`;
  assert.deepEqual(
    await h.node.NodeStageVolume(stageReq("v1", staging, { volume_context: { size: "1GiB" } })),
    {},
  );
  // The first mount table read (alongside the first zfs get) predates the dataset: read again.
  assert.deepEqual(h.runner.argvs, [
    [...GET, "tank/nomad/v1"],
    ["mount"],
    zfs.create("tank/nomad/v1", MANAGED_OPTION, "refquota=1073741824"),
    [...GET, "tank/nomad/v1"],
    ["mount"],
    markStaged(h, "tank/nomad/v1"),
    ["mount", "-c", "--bind", "/mnt/tank/nomad/v1", staging],
    // Read again to check that the bind landed at the staging path and shows the dataset.
    ["mount"],
  ]);
  assert.equal(await isDirectory(staging), true);
  assert.equal((await Deno.lstat(staging)).mode! & 0o777, 0o700);
  assert.equal(h.host.top(staging)?.source, "tank/nomad/v1");
  assert.equal(h.locks.isHeld("tank/nomad/v1"), false);
  h.runner.assertNoUnexpected();
});

Deno.test("NodeService.NodeStageVolume maps a volume id with brackets to its escaped dataset", async () => {
  await using h = await setup();
  const staging = `${h.base}/staging/db[0]/rw`;
  await h.node.NodeStageVolume(stageReq("db[0]", staging, { volume_context: { size: "64M" } }));
  assert.deepEqual(
    h.runner.argvs[2],
    zfs.create("tank/nomad/db:5b0:5d", MANAGED_OPTION, "refquota=67108864"),
  );
  assert.deepEqual(h.runner.argvs.at(-2), [
    "mount",
    "-c",
    "--bind",
    "/mnt/tank/nomad/db:5b0:5d",
    staging,
  ]);
});

Deno.test("NodeService.NodeStageVolume mounts an existing unmounted dataset first", async () => {
  await using h = await setup();
  h.host.addDataset("tank/nomad/v1", { mounted: false, refquota: 1024 });
  const staging = `${h.base}/staging/v1/rw`;
  await h.node.NodeStageVolume(stageReq("v1", staging));
  assert.deepEqual(h.runner.argvs, [
    [...GET, "tank/nomad/v1"],
    ["mount"],
    ["zfs", "mount", "tank/nomad/v1"],
    ["mount"],
    markStaged(h, "tank/nomad/v1"),
    ["mount", "-c", "--bind", "/mnt/tank/nomad/v1", staging],
    ["mount"],
  ]);
});

Deno.test("NodeService.NodeStageVolume stages a created volume by its node-qualified id and context", async () => {
  await using h = await setup();
  h.host.addDataset("tank/nomad/v1", { refquota: 1024 });
  const staging = `${h.base}/staging/v1/rw`;
  await h.node.NodeStageVolume(
    stageReq("v1@n1", staging, { volume_context: { dataset: "tank/nomad/v1" } }),
  );
  assert.deepEqual(h.runner.argvs, [
    [...GET, "tank/nomad/v1"],
    ["mount"],
    markStaged(h, "tank/nomad/v1"),
    ["mount", "-c", "--bind", "/mnt/tank/nomad/v1", staging],
    ["mount"],
  ]);
});

Deno.test("NodeService.NodeStageVolume of another node's volume runs nothing, even with a size", async () => {
  await using h = await setup();
  await assertRejectsCsi(
    h.node.NodeStageVolume(
      stageReq("v1@n2", `${h.base}/staging/v1/rw`, { volume_context: { size: "1G" } }),
    ),
    Code.FAILED_PRECONDITION,
    /^Volume "v1@n2" lives on node "n2", but this plugin runs on node "n1"/,
  );
  assert.deepEqual(h.runner.argvs, []);
});

Deno.test("NodeService.NodeStageVolume refuses a dataset without the marker and says how to adopt it", async () => {
  await using h = await setup();
  h.host.addDataset("tank/nomad/v1", { managed: false });
  await assertRejectsCsi(
    h.node.NodeStageVolume(
      stageReq("v1", `${h.base}/staging/v1/rw`, { volume_context: { size: "1G" } }),
    ),
    Code.FAILED_PRECONDITION,
    'Dataset "tank/nomad/v1" exists but is not managed by zfs-csi; to hand it over, run ' +
      '"zfs set org.zfs-csi:managed=yes tank/nomad/v1"',
  );
  // Only reads: the properties and, alongside them, the mount table.
  assert.deepEqual(h.runner.argvs, [[...GET, "tank/nomad/v1"], ["mount"]]);
});

Deno.test("NodeService.NodeStageVolume answers NOT_FOUND for a missing dataset without size", async () => {
  await using h = await setup();
  const err = await assertRejectsCsi(
    h.node.NodeStageVolume(stageReq("v1", `${h.base}/staging/v1/rw`)),
    Code.NOT_FOUND,
  );
  assert.match(err.message, /^Volume "v1" not found: dataset "tank\/nomad\/v1" does not exist/);
  assert.deepEqual(h.runner.argvs, [[...GET, "tank/nomad/v1"], ["mount"]]);
});

Deno.test("NodeService.NodeStageVolume is OK without mounting when the volume is already staged", async () => {
  await using h = await setup();
  h.host.addDataset("tank/nomad/v1");
  const staging = `${h.base}/staging/v1/rw`;
  h.host.addMount("tank/nomad/v1", staging);
  assert.deepEqual(await h.node.NodeStageVolume(stageReq("v1", staging)), {});
  assert.deepEqual(h.runner.argvs, [[...GET, "tank/nomad/v1"], ["mount"]]);
  assert.equal(hasArgv(h.runner.argvs, ["mount", "-c", "--bind"]), false);
});

Deno.test("NodeService.NodeStageVolume twice binds only once", async () => {
  await using h = await setup();
  const staging = `${h.base}/staging/v1/rw`;
  const req = stageReq("v1", staging, { volume_context: { size: "1G" } });
  await h.node.NodeStageVolume(req);
  await h.node.NodeStageVolume(req);
  assert.equal(h.runner.argvs.filter((a) => hasPrefix(a, ["mount", "-c", "--bind"])).length, 1);
  assert.equal(h.runner.argvs.filter((a) => hasPrefix(a, ["zfs", "create"])).length, 1);
});

Deno.test("NodeService.NodeStageVolume answers ALREADY_EXISTS when another mount holds the staging path", async () => {
  await using h = await setup();
  h.host.addDataset("tank/nomad/v1");
  h.host.addDataset("tank/nomad/v2");
  const staging = `${h.base}/staging/v1/rw`;
  h.host.addMount("tank/nomad/v2", staging);
  await assertRejectsCsi(
    h.node.NodeStageVolume(stageReq("v1", staging)),
    Code.ALREADY_EXISTS,
    `staging_target_path "${staging}" already holds another mount ("tank/nomad/v2")`,
  );
  assert.equal(hasArgv(h.runner.argvs, ["mount", "-c", "--bind"]), false);
});

Deno.test("NodeService.NodeStageVolume answers FAILED_PRECONDITION when the dataset mount is not visible", async () => {
  await using h = await setup();
  h.host.addDataset("tank/nomad/v1");
  h.host.mounts.length = 0; // mounted on the host, but not in the plugin's mount namespace
  await assertRejectsCsi(
    h.node.NodeStageVolume(stageReq("v1", `${h.base}/staging/v1/rw`)),
    Code.FAILED_PRECONDITION,
    /^Dataset "tank\/nomad\/v1" is mounted at "\/mnt\/tank\/nomad\/v1" but the plugin cannot see it/,
  );
});

Deno.test("NodeService.NodeStageVolume refuses a block capability with INVALID_ARGUMENT", async () => {
  await using h = await setup();
  await assertRejectsCsi(
    h.node.NodeStageVolume(stageReq("v1", `${h.base}/staging/v1/rw`, {
      volume_capability: {
        block: {},
        access_mode: { mode: "SINGLE_NODE_WRITER" },
        access_type: "block",
      },
    })),
    Code.INVALID_ARGUMENT,
    /^Block volumes are not supported/,
  );
  assert.deepEqual(h.runner.argvs, []);
});

Deno.test("NodeService.NodeStageVolume refuses bad ids, paths and contexts before running anything", async () => {
  await using h = await setup();
  const staging = `${h.base}/staging/v1/rw`;
  const table: ReadonlyArray<readonly [NodeStageVolumeRequest, RegExp]> = [
    [stageReq("", staging), /^volume_id is required$/],
    [stageReq("../etc", staging), /must not contain "\/"/],
    [stageReq("v1", "/etc/x"), /^staging_target_path "\/etc\/x" is outside/],
    [stageReq("v1", `${h.base}/../x`), /must not contain "\." or "\.\."/],
    [stageReq("v1", ""), /^staging_target_path is required$/],
    [
      stageReq("v1", staging, { volume_context: { sise: "1G" } }),
      /volume_context key "sise" is not known/,
    ],
    [
      // A context from CreateVolume that names another dataset than the id maps to.
      stageReq("v1@n1", staging, { volume_context: { dataset: "tank/nomad/v2" } }),
      /^volume_context names dataset "tank\/nomad\/v2", but the volume id maps to "tank\/nomad\/v1"$/,
    ],
    [stageReq("v1@n1@x", staging), /is not of the form name or name@node/],
    [
      stageReq("v1", staging, {
        volume_capability: fsCap("SINGLE_NODE_WRITER", ["exec,suid,bind"]),
      }),
      /Mount flag "bind"/,
    ],
  ];
  for (const [req, message] of table) {
    await assertRejectsCsi(h.node.NodeStageVolume(req), Code.INVALID_ARGUMENT, message);
  }
  assert.deepEqual(h.runner.argvs, []);
});

Deno.test("NodeService.NodeStageVolume waits for a concurrent call on the same volume, then finds it staged", async () => {
  // Nomad before 1.11 sends overlapping calls for one volume and fails the allocation on any
  // error, ABORTED included: the second call waits its turn instead.
  const held = gate();
  const reached = Promise.withResolvers<void>();
  await using h = await setup({
    before: (runner, host) => {
      runner.on(["zfs", "get"], async (argv) => {
        reached.resolve();
        await held.promise;
        return host().zfsGet(argv);
      }, { times: 1 });
    },
  });
  h.host.addDataset("tank/nomad/v1");
  const staging = `${h.base}/staging/v1/rw`;
  const first = h.node.NodeStageVolume(stageReq("v1", staging));
  await reached.promise;
  let secondDone = false;
  const second = h.node.NodeStageVolume(stageReq("v1", staging)).finally(() => secondDone = true);
  // Another volume is not blocked.
  h.host.addDataset("tank/nomad/v2");
  await h.node.NodeStageVolume(stageReq("v2", `${h.base}/staging/v2/rw`));
  assert.equal(secondDone, false, "the second call waits while the first holds the volume");
  assert.equal(h.locks.waiting("tank/nomad/v1"), 1);
  held.open();
  assert.deepEqual(await first, {});
  assert.deepEqual(await second, {}, "then it finds the volume staged: OK");
  assert.equal(h.host.top(staging)?.source, "tank/nomad/v1");
  assert.equal(
    h.runner.argvs.filter((a) => a[0] === "mount" && a.includes(staging)).length,
    1,
    "one bind mount at the staging path, not two",
  );
  assert.equal(h.locks.isHeld("tank/nomad/v1"), false);
});

Deno.test("NodeService.NodeUnstageVolume unmounts the staging path", async () => {
  await using h = await setup();
  h.host.addDataset("tank/nomad/v1");
  const staging = `${h.base}/staging/v1/rw`;
  h.host.addMount("tank/nomad/v1", staging);
  assert.deepEqual(
    await h.node.NodeUnstageVolume({ volume_id: "v1", staging_target_path: staging }),
    {},
  );
  // One mount at the path: unmounted without reading the table again.
  assert.deepEqual(h.runner.argvs, [["mount"], ["umount", "-c", staging]]);
  assert.equal(h.host.top(staging), undefined);
});

Deno.test("NodeService.NodeUnstageVolume of a volume that is not staged is OK", async () => {
  await using h = await setup();
  const staging = `${h.base}/staging/v1/rw`;
  assert.deepEqual(
    await h.node.NodeUnstageVolume({ volume_id: "v1", staging_target_path: staging }),
    {},
  );
  assert.deepEqual(h.runner.argvs, [["mount"]]);
});

Deno.test("NodeService.NodePublishVolume refuses a volume that is not staged", async () => {
  await using h = await setup();
  h.host.addDataset("tank/nomad/v1");
  const staging = `${h.base}/staging/v1/rw`;
  const target = `${h.base}/per-alloc/a1/v1/rw`;
  await assertRejectsCsi(
    h.node.NodePublishVolume(publishReq("v1", staging, target)),
    Code.FAILED_PRECONDITION,
    `Volume "v1" is not staged at "${staging}"; call NodeStageVolume first`,
  );
  assert.deepEqual(h.runner.argvs, [["mount"]]);
  assert.equal(await isDirectory(target), false);
});

Deno.test("NodeService.NodePublishVolume refuses a staging path holding another volume", async () => {
  await using h = await setup();
  h.host.addDataset("tank/nomad/v2");
  const staging = `${h.base}/staging/v1/rw`;
  h.host.addMount("tank/nomad/v2", staging);
  await assertRejectsCsi(
    h.node.NodePublishVolume(publishReq("v1", staging, `${h.base}/per-alloc/a1/v1/rw`)),
    Code.FAILED_PRECONDITION,
  );
  assert.equal(hasArgv(h.runner.argvs, ["mount", "-c", "--bind"]), false);
});

Deno.test("NodeService.NodePublishVolume bind-mounts the staging path at the target", async () => {
  await using h = await setup();
  h.host.addDataset("tank/nomad/v1");
  const staging = `${h.base}/staging/v1/rw`;
  h.host.addMount("tank/nomad/v1", staging);
  const target = `${h.base}/per-alloc/a1/v1/rw`;
  assert.deepEqual(await h.node.NodePublishVolume(publishReq("v1", staging, target)), {});
  assert.deepEqual(h.runner.argvs, [
    ["mount"],
    ["mount", "-c", "--bind", staging, target],
    // Read again to check that the bind landed at the target and shows the dataset.
    ["mount"],
  ]);
  assert.equal(await isDirectory(target), true);
  assert.equal(h.host.top(target)?.source, "tank/nomad/v1");
  // Again: already published the same way, nothing to do.
  assert.deepEqual(await h.node.NodePublishVolume(publishReq("v1", staging, target)), {});
  assert.equal(h.runner.argvs.filter((a) => hasPrefix(a, ["mount", "-c", "--bind"])).length, 1);
});

Deno.test("NodeService.NodePublishVolume readonly binds and then remounts read-only", async () => {
  await using h = await setup();
  h.host.addDataset("tank/nomad/v1");
  const staging = `${h.base}/staging/v1/rw`;
  h.host.addMount("tank/nomad/v1", staging);
  const target = `${h.base}/per-alloc/a1/v1/ro`;
  await h.node.NodePublishVolume(publishReq("v1", staging, target, { readonly: true }));
  assert.deepEqual(h.runner.argvs, [
    ["mount"],
    ["mount", "-c", "--bind", staging, target],
    ["mount", "-c", "-o", "remount,bind,ro", target],
    ["mount"],
  ]);
  assert.equal(h.host.top(target)?.options.includes("ro"), true);
  // The same call again is OK; asking for read-write at that target is a conflict.
  assert.deepEqual(
    await h.node.NodePublishVolume(publishReq("v1", staging, target, { readonly: true })),
    {},
  );
  await assertRejectsCsi(
    h.node.NodePublishVolume(publishReq("v1", staging, target)),
    Code.ALREADY_EXISTS,
    `target_path "${target}" already holds this volume with a different read-only setting`,
  );
});

Deno.test("NodeService.NodePublishVolume finishes a publish interrupted before its remount", async () => {
  await using h = await setup();
  h.host.addDataset("tank/nomad/v1");
  const staging = `${h.base}/staging/v1/rw`;
  h.host.addMount("tank/nomad/v1", staging);
  const target = `${h.base}/per-alloc/a1/v1/ro`;
  // What a crash right after `mount --bind` leaves: the bind, read-write, without its flags.
  h.host.addMount("tank/nomad/v1", target);
  const req = publishReq("v1", staging, target, {
    readonly: true,
    volume_capability: fsCap("SINGLE_NODE_WRITER", ["nosuid", "noexec"]),
  });
  assert.deepEqual(await h.node.NodePublishVolume(req), {});
  assert.deepEqual(h.runner.argvs, [
    ["mount"],
    ["mount", "-c", "-o", "remount,bind,ro,nosuid,noexec", target],
  ]);
  assert.equal(h.host.mounts.filter((m) => m.mountPoint === target).length, 1);
  for (const f of ["ro", "nosuid", "noexec"]) {
    assert.equal(h.host.top(target)?.options.includes(f), true, f);
  }
  // Finished: the same call again has nothing left to do.
  assert.deepEqual(await h.node.NodePublishVolume(req), {});
  assert.deepEqual(h.runner.argvs.at(-1), ["mount"]);
});

Deno.test("NodeService.NodePublishVolume applies ro for reader-only modes, before other flags", async () => {
  await using h = await setup();
  h.host.addDataset("tank/nomad/v1");
  const staging = `${h.base}/staging/v1/rw`;
  h.host.addMount("tank/nomad/v1", staging);
  const target = `${h.base}/per-alloc/a1/v1/ro`;
  await h.node.NodePublishVolume(publishReq("v1", staging, target, {
    volume_capability: fsCap("MULTI_NODE_READER_ONLY", ["nosuid", "nodev"]),
  }));
  assert.deepEqual(h.runner.argvs.at(-2), [
    "mount",
    "-c",
    "-o",
    "remount,bind,ro,nosuid,nodev",
    target,
  ]);
});

Deno.test("NodeService.NodePublishVolume undoes the bind when the read-only remount fails", async () => {
  await using h = await setup({
    before: (runner) => {
      runner.on(["mount", "-c", "-o"], { code: 32, stderr: "mount: /x: permission denied.\n" });
    },
  });
  h.host.addDataset("tank/nomad/v1");
  const staging = `${h.base}/staging/v1/rw`;
  h.host.addMount("tank/nomad/v1", staging);
  const target = `${h.base}/per-alloc/a1/v1/ro`;
  await assertRejectsCsi(
    h.node.NodePublishVolume(publishReq("v1", staging, target, { readonly: true })),
    Code.INTERNAL,
    /^Cannot apply mount flags "ro"/,
  );
  assert.deepEqual(h.runner.argvs.slice(-3), [
    ["mount", "-c", "--bind", staging, target],
    ["mount", "-c", "-o", "remount,bind,ro", target],
    ["umount", "-c", target],
  ]);
  assert.equal(h.host.top(target), undefined);
});

Deno.test("NodeService.NodePublishVolume answers ALREADY_EXISTS when another mount holds the target", async () => {
  await using h = await setup();
  h.host.addDataset("tank/nomad/v1");
  const staging = `${h.base}/staging/v1/rw`;
  const target = `${h.base}/per-alloc/a1/v1/rw`;
  h.host.addMount("tank/nomad/v1", staging);
  h.host.addMount("tmpfs", target, "tmpfs", ["rw"]);
  await assertRejectsCsi(
    h.node.NodePublishVolume(publishReq("v1", staging, target)),
    Code.ALREADY_EXISTS,
    `target_path "${target}" already holds another mount ("tmpfs")`,
  );
  assert.equal(hasArgv(h.runner.argvs, ["mount", "-c", "--bind"]), false);
});

Deno.test("NodeService.NodePublishVolume refuses a target equal to the staging path", async () => {
  await using h = await setup();
  const path = `${h.base}/x`;
  await assertRejectsCsi(
    h.node.NodePublishVolume(publishReq("v1", path, path)),
    Code.INVALID_ARGUMENT,
    "target_path must differ from staging_target_path",
  );
});

Deno.test("NodeService.NodePublishVolume refuses a block capability with INVALID_ARGUMENT", async () => {
  await using h = await setup();
  await assertRejectsCsi(
    h.node.NodePublishVolume(publishReq("v1", `${h.base}/s`, `${h.base}/t`, {
      volume_capability: { block: {}, access_mode: { mode: "SINGLE_NODE_WRITER" } },
    })),
    Code.INVALID_ARGUMENT,
    /^Block volumes are not supported/,
  );
  assert.deepEqual(h.runner.argvs, []);
});

Deno.test("NodeService.NodeUnpublishVolume of a path that is not a mount is OK and runs no umount", async () => {
  await using h = await setup();
  const target = `${h.base}/per-alloc/a1/v1/rw`;
  await Deno.mkdir(target, { recursive: true });
  assert.deepEqual(await h.node.NodeUnpublishVolume({ volume_id: "v1", target_path: target }), {});
  assert.deepEqual(h.runner.argvs, [["mount"]]);
  assert.equal(await isDirectory(target), false, "the empty target directory is removed");
  // A target that does not exist at all is fine too.
  assert.deepEqual(await h.node.NodeUnpublishVolume({ volume_id: "v1", target_path: target }), {});
});

Deno.test("NodeService.NodeUnpublishVolume leaves a foreign mount alone with FAILED_PRECONDITION", async () => {
  await using h = await setup();
  const target = `${h.base}/per-alloc/a1/v1/rw`;
  await Deno.mkdir(target, { recursive: true });
  h.host.addMount("tank/nomad/other", target);
  await assertRejectsCsi(
    h.node.NodeUnpublishVolume({ volume_id: "v1", target_path: target }),
    Code.FAILED_PRECONDITION,
    `"${target}" holds a mount of "tank/nomad/other", not of volume "v1"; leaving it alone`,
  );
  assert.deepEqual(h.runner.argvs, [["mount"]]);
  assert.equal(hasArgv(h.runner.argvs, ["umount"]), false);
  assert.equal(await isDirectory(target), true);
});

Deno.test("NodeService.NodeUnpublishVolume unmounts every stacked mount of the volume, then removes the directory", async () => {
  await using h = await setup();
  const target = `${h.base}/per-alloc/a1/v1/rw`;
  await Deno.mkdir(target, { recursive: true });
  h.host.addMount("tank/nomad/v1", target);
  h.host.addMount("tank/nomad/v1", target);
  assert.deepEqual(await h.node.NodeUnpublishVolume({ volume_id: "v1", target_path: target }), {});
  // Two mounts: the table is read again after the first umount, not after the last.
  assert.deepEqual(h.runner.argvs, [
    ["mount"],
    ["umount", "-c", target],
    ["mount"],
    ["umount", "-c", target],
  ]);
  assert.equal(await isDirectory(target), false);
});

Deno.test("NodeService.NodeUnpublishVolume stops at a foreign mount below the volume's mount", async () => {
  await using h = await setup();
  const target = `${h.base}/per-alloc/a1/v1/rw`;
  h.host.addMount("tmpfs", target, "tmpfs", ["rw"]);
  h.host.addMount("tank/nomad/v1", target);
  await assertRejectsCsi(
    h.node.NodeUnpublishVolume({ volume_id: "v1", target_path: target }),
    Code.FAILED_PRECONDITION,
    /holds a mount of "tmpfs"/,
  );
  assert.deepEqual(h.runner.argvs, [["mount"], ["umount", "-c", target], ["mount"]]);
});

Deno.test("NodeService.NodeUnpublishVolume of a busy target answers FAILED_PRECONDITION", async () => {
  await using h = await setup({
    before: (runner) => {
      runner.on(["umount"], { code: 32, stderr: "umount: /x: target is busy.\n" });
    },
  });
  const target = `${h.base}/per-alloc/a1/v1/rw`;
  h.host.addMount("tank/nomad/v1", target);
  await assertRejectsCsi(
    h.node.NodeUnpublishVolume({ volume_id: "v1", target_path: target }),
    Code.FAILED_PRECONDITION,
    `Cannot unmount "${target}": umount: /x: target is busy.`,
  );
});

/** What NodeExpandVolume reads of a volume: its size properties and recorded parameters. */
const sizeState = (dataset: string) => zfs.get(SIZE_STATE.join(","), dataset);

Deno.test("NodeService.NodeExpandVolume raises refquota to the required bytes", async () => {
  await using h = await setup();
  h.host.addDataset("tank/nomad/v1", { refquota: 209715200 });
  const path = `${h.base}/per-alloc/a1/v1/rw`;
  h.host.addMount("tank/nomad/v1", path);
  assert.deepEqual(await h.node.NodeExpandVolume(expandReq("v1", path, "314572800")), {
    capacity_bytes: 314572800,
  });
  assert.deepEqual(h.runner.argvs, [
    sizeState("tank/nomad/v1"),
    ["mount"],
    ["zfs", "set", "refquota=314572800", "tank/nomad/v1"],
  ]);
  assert.equal(h.host.datasets.get("tank/nomad/v1")?.refquota, 314572800);
});

Deno.test("NodeService.NodeExpandVolume sets quota and refreservation as the recorded parameters say", async () => {
  const MiB = 1024 * 1024;
  const props = [
    ["type", "filesystem", "-"],
    [MANAGED_PROPERTY, "yes", "local"],
    ["org.zfs-csi:parameters", '{"quota":"capacity","refreservation":"capacity"}', "local"],
    ["refquota", String(64 * MiB), "local"],
    ["quota", String(64 * MiB), "local"],
    ["refreservation", String(64 * MiB), "local"],
  ];
  await using h = await setup({
    before: (runner) =>
      runner
        .onExact(sizeState("tank/nomad/v1"), {
          stdout: props.map((p) => `tank/nomad/v1\t${p.join("\t")}\n`).join(""),
        })
        .on(["zfs", "set"], {}),
  });
  h.host.addDataset("tank/nomad/v1", { refquota: 64 * MiB });
  const path = `${h.base}/per-alloc/a1/v1/rw`;
  h.host.addMount("tank/nomad/v1", path);
  assert.deepEqual(await h.node.NodeExpandVolume(expandReq("v1", path, String(128 * MiB))), {
    capacity_bytes: 128 * MiB,
  });
  assert.deepEqual(h.runner.argvs.at(-1), [
    "zfs",
    "set",
    `quota=${128 * MiB}`,
    `refquota=${128 * MiB}`,
    `refreservation=${128 * MiB}`,
    "tank/nomad/v1",
  ]);
});

Deno.test("NodeService.NodeExpandVolume answers NOT_FOUND for a volume_path that does not hold the volume", async () => {
  await using h = await setup();
  h.host.addDataset("tank/nomad/v1", { refquota: 209715200 });
  h.host.addDataset("tank/nomad/v2", { refquota: 209715200 });
  const empty = `${h.base}/per-alloc/a1/v1/rw`;
  const other = `${h.base}/per-alloc/a2/v2/rw`;
  h.host.addMount("tank/nomad/v2", other);
  for (const path of [empty, other]) {
    await assertRejectsCsi(
      h.node.NodeExpandVolume(expandReq("v1", path, "314572800")),
      Code.NOT_FOUND,
      `volume_path "${path}" does not hold volume "v1"`,
    );
  }
  assert.equal(hasArgv(h.runner.argvs, ["zfs", "set"]), false);
  assert.equal(h.host.datasets.get("tank/nomad/v1")?.refquota, 209715200);
});

Deno.test("NodeService.NodeExpandVolume never shrinks a volume", async () => {
  await using h = await setup();
  h.host.addDataset("tank/nomad/v1", { refquota: 209715200 });
  const path = `${h.base}/per-alloc/a1/v1/rw`;
  h.host.addMount("tank/nomad/v1", path);
  assert.deepEqual(await h.node.NodeExpandVolume(expandReq("v1", path, "104857600")), {
    capacity_bytes: 209715200,
  });
  await assertRejectsCsi(
    h.node.NodeExpandVolume(expandReq("v1", path, "0", "104857600")),
    Code.OUT_OF_RANGE,
    'Volume "v1" has 209715200 bytes; shrinking to 104857600 is not supported',
  );
  assert.equal(hasArgv(h.runner.argvs, ["zfs", "set"]), false);
  assert.equal(h.host.datasets.get("tank/nomad/v1")?.refquota, 209715200);
});

Deno.test("NodeService.NodeExpandVolume leaves a volume without refquota unlimited", async () => {
  await using h = await setup();
  h.host.addDataset("tank/nomad/v1", { refquota: 0 });
  h.host.addMount("tank/nomad/v1", `${h.base}/p`);
  assert.deepEqual(
    await h.node.NodeExpandVolume(expandReq("v1", `${h.base}/p`, "104857600")),
    { capacity_bytes: 0 },
  );
  assert.equal(hasArgv(h.runner.argvs, ["zfs", "set"]), false);
});

Deno.test("NodeService.NodeExpandVolume without capacity_range answers the current size", async () => {
  await using h = await setup();
  h.host.addDataset("tank/nomad/v1", { refquota: 209715200 });
  h.host.addMount("tank/nomad/v1", `${h.base}/p`);
  const req = { ...expandReq("v1", `${h.base}/p`, "1"), capacity_range: null };
  assert.deepEqual(await h.node.NodeExpandVolume(req), { capacity_bytes: 209715200 });
  assert.deepEqual(h.runner.argvs, [sizeState("tank/nomad/v1"), ["mount"]]);
  await assertRejectsCsi(
    h.node.NodeExpandVolume({ ...req, volume_id: "v2" }),
    Code.NOT_FOUND,
    'Volume "v2" not found (no dataset "tank/nomad/v2")',
  );
});

Deno.test("NodeService.NodeExpandVolume refuses block volumes, huge sizes and unknown volumes", async () => {
  await using h = await setup();
  const path = `${h.base}/p`;
  await assertRejectsCsi(
    h.node.NodeExpandVolume({
      ...expandReq("v1", path, "1"),
      volume_capability: { block: {}, access_mode: { mode: "SINGLE_NODE_WRITER" } },
    }),
    Code.INVALID_ARGUMENT,
    /^Block volumes are not supported/,
  );
  await assertRejectsCsi(
    h.node.NodeExpandVolume(expandReq("v1", path, "9007199254740993")),
    Code.OUT_OF_RANGE,
  );
  assert.deepEqual(h.runner.argvs, []);
  await assertRejectsCsi(
    h.node.NodeExpandVolume(expandReq("v1", path, "1")),
    Code.NOT_FOUND,
    'Volume "v1" not found (no dataset "tank/nomad/v1")',
  );
});

Deno.test("NodeService.NodeGetInfo reports the node id and topology", async () => {
  await using h = await setup();
  assert.deepEqual(await h.node.NodeGetInfo(), {
    node_id: "n1",
    max_volumes_per_node: 0,
    accessible_topology: { segments: { zone: "eu1", "org.zfs-csi/node": "n1" } },
  });
  assert.deepEqual(await h.node.NodeGetCapabilities(), {
    capabilities: [
      { rpc: { type: "STAGE_UNSTAGE_VOLUME" } },
      { rpc: { type: "GET_VOLUME_STATS" } },
      { rpc: { type: "EXPAND_VOLUME" } },
      { rpc: { type: "VOLUME_CONDITION" } },
    ],
  });
});

Deno.test("NodeService.NodeGetVolumeStats reports bytes and inodes of a published volume", async () => {
  const seen: string[] = [];
  await using h = await setup({
    statfs: (path) => {
      seen.push(path);
      return Promise.resolve({
        bsize: 4096,
        blocks: 1000,
        bfree: 600,
        bavail: 500,
        files: 200,
        ffree: 150,
      });
    },
  });
  h.host.addDataset("tank/nomad/v1");
  const target = `${h.base}/per-alloc/a1/v1/rw`;
  h.host.addMount("tank/nomad/v1", target);
  assert.deepEqual(
    await h.node.NodeGetVolumeStats({
      volume_id: "v1",
      volume_path: target,
      staging_target_path: "",
    }),
    {
      usage: [
        { unit: "BYTES", total: 4096000, available: 2048000, used: 1638400 },
        { unit: "INODES", total: 200, available: 150, used: 50 },
      ],
      volume_condition: { abnormal: false, message: "Volume is healthy" },
    },
  );
  assert.deepEqual(seen, [target]);
});

Deno.test("NodeService.NodeGetVolumeStats answers NOT_FOUND for a path not holding the volume", async () => {
  await using h = await setup({
    statfs: () => Promise.reject(new Error("statfs must not be called")),
  });
  h.host.addDataset("tank/nomad/v1");
  const target = `${h.base}/per-alloc/a1/v1/rw`;
  await assertRejectsCsi(
    h.node.NodeGetVolumeStats({ volume_id: "v1", volume_path: target, staging_target_path: "" }),
    Code.NOT_FOUND,
    `volume_path "${target}" does not hold volume "v1"`,
  );
});

Deno.test("NodeService stats and expand answer NOT_FOUND for a relative volume_path, INVALID_ARGUMENT for none", async () => {
  await using h = await setup({
    statfs: () => Promise.reject(new Error("statfs must not be called")),
  });
  // A published volume and an unknown one: a relative path holds neither.
  h.host.addDataset("tank/nomad/v1");
  h.host.addMount("tank/nomad/v1", `${h.base}/per-alloc/a1/v1/rw`);
  for (const id of ["v1", "v2"]) {
    await assertRejectsCsi(
      h.node.NodeGetVolumeStats({
        volume_id: id,
        volume_path: "some/path",
        staging_target_path: "",
      }),
      Code.NOT_FOUND,
      `volume_path "some/path" is not absolute, so volume "${id}" is not there`,
    );
    await assertRejectsCsi(
      h.node.NodeExpandVolume({ ...expandReq(id, "some/path", "1"), capacity_range: null }),
      Code.NOT_FOUND,
      `volume_path "some/path" is not absolute, so volume "${id}" is not there`,
    );
    await assertRejectsCsi(
      h.node.NodeGetVolumeStats({ volume_id: id, volume_path: "", staging_target_path: "" }),
      Code.INVALID_ARGUMENT,
      "volume_path is required",
    );
    await assertRejectsCsi(
      h.node.NodeExpandVolume(expandReq(id, "", "1")),
      Code.INVALID_ARGUMENT,
      "volume_path is required",
    );
  }
  // Control characters are shown escaped, never written raw into the message or the log.
  await assertRejectsCsi(
    h.node.NodeGetVolumeStats({ volume_id: "v1", volume_path: "a\nb", staging_target_path: "" }),
    Code.NOT_FOUND,
    'volume_path "a\\nb" is not absolute, so volume "v1" is not there',
  );
  // Absolute paths are still held to the base directories.
  await assertRejectsCsi(
    h.node.NodeGetVolumeStats({ volume_id: "v1", volume_path: "/etc", staging_target_path: "" }),
    Code.INVALID_ARGUMENT,
    /^volume_path "\/etc" is outside the staging\/publish base directories/,
  );
  assert.deepEqual(h.runner.argvs, []);
});

Deno.test("NodeService refuses stage, publish and unpublish paths below another mount in the base dir", async () => {
  await using h = await setup();
  h.host.addDataset("tank/nomad/v1");
  const staging = `${h.base}/staging/v1/rw`;
  h.host.addMount("tank/nomad/v1", staging);
  // Someone else's mount below the base dir, say a bind mount of a directory elsewhere.
  const foreign = `${h.base}/per-alloc/bind`;
  await Deno.mkdir(`${foreign}/empty`, { recursive: true });
  h.host.addMount("/srv/elsewhere", foreign, "none", ["rw"]);
  const below = (field: string, path: string, mount: string) =>
    `${field} "${path}" lies below another mount ("${mount}"); it must be a directory of the ` +
    `base directory's own filesystem`;
  await assertRejectsCsi(
    h.node.NodePublishVolume(publishReq("v1", staging, `${foreign}/x`)),
    Code.INVALID_ARGUMENT,
    below("target_path", `${foreign}/x`, foreign),
  );
  await assertRejectsCsi(
    h.node.NodePublishVolume(publishReq("v1", staging, `${staging}/x`)),
    Code.INVALID_ARGUMENT,
    below("target_path", `${staging}/x`, staging),
  );
  await assertRejectsCsi(
    h.node.NodeStageVolume(stageReq("v1", `${foreign}/s`)),
    Code.INVALID_ARGUMENT,
    below("staging_target_path", `${foreign}/s`, foreign),
  );
  await assertRejectsCsi(
    h.node.NodeUnpublishVolume({ volume_id: "v1", target_path: `${foreign}/empty` }),
    Code.INVALID_ARGUMENT,
    below("target_path", `${foreign}/empty`, foreign),
  );
  assert.equal(await isDirectory(`${foreign}/empty`), true, "nothing removed below the mount");
  assert.equal(await isDirectory(`${foreign}/x`), false, "nothing made below the mount");
  assert.equal(hasArgv(h.runner.argvs, ["mount", "-c", "--bind"]), false);
  assert.equal(hasArgv(h.runner.argvs, ["umount"]), false);
});

Deno.test("NodeService.NodeStageVolume records a registered volume's backup context on its dataset, once", async () => {
  await using h = await setup();
  const ds = h.host.addDataset("tank/nomad/v1", { stagedAt: "1700000000" });
  const staging = `${h.base}/staging/v1/rw`;
  const req = stageReq("v1", staging, {
    volume_context: { backup_interval: "15m", backup_keep: "daily=14,last=4" },
  });
  // Refused without a store: the volume must not look backed up when it is not.
  await assertRejectsCsi(
    h.node.NodeStageVolume(req),
    Code.FAILED_PRECONDITION,
    'Volume "v1" asks for backups (volume_context backup_interval), and this plugin has no ' +
      "store: start it with --store, or remove backup_interval from the volume",
  );
  assert.equal(ds.extra, undefined);
  await using s = await setup({ flags: ["--store", "file:///srv/backups"] });
  const ds2 = s.host.addDataset("tank/nomad/v1", { stagedAt: "1700000000" });
  const staging2 = `${s.base}/staging/v1/rw`;
  const req2 = { ...req, staging_target_path: staging2 };
  assert.deepEqual(await s.node.NodeStageVolume(req2), {});
  assert.deepEqual(ds2.extra, {
    "org.zfs-csi:backup-interval": "900",
    "org.zfs-csi:backup-keep": "last=4,hourly=0,daily=14,weekly=0",
  });
  const sets = s.runner.argvs.filter((a) => a[1] === "set").length;
  assert.deepEqual(await s.node.NodeStageVolume(req2), {});
  assert.equal(s.runner.argvs.filter((a) => a[1] === "set").length, sets, "a repeat sets nothing");
});
