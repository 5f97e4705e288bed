import assert from "node:assert/strict";
import { Code, type GrpcCode, toGrpcStatus } from "../errors.ts";
import { cloneSnapshotComponent, MANAGED_PROPERTY } from "../zfs/names.ts";
import { assertRejectsCsi, rejected } from "../../tests/support/assert_errors.ts";
import {
  fails,
  type FakeResponse,
  FakeRunner,
  gate,
  mountLine,
  type RuleOptions,
} from "../../tests/support/fake_runner.ts";
import {
  blockCap,
  type FakeServices,
  fakeServices,
  fsCap,
} from "../../tests/support/service_harness.ts";
import { MANAGED_OPTION, zfsArgv } from "../../tests/support/zfs_argv.ts";
import { CONTROLLER_CAPABILITIES, ControllerService, MIN_VOLUME_BYTES } from "./controller.ts";
import { Trash } from "../volume/trash.ts";
import type {
  ControllerExpandVolumeRequest,
  CreateSnapshotRequest,
  CreateVolumeRequest,
  GetCapacityRequest,
  ListSnapshotsRequest,
  ListVolumesRequest,
  ValidateVolumeCapabilitiesRequest,
  VolumeContentSource,
} from "./types.ts";

const PARENT = "tank/nomad";
const NOW = 1_700_000_000;
const MiB = 1024 * 1024;
const TOPOLOGY = { zone: "eu1", "org.zfs-csi/node": "n1" };
const PARAMS = "org.zfs-csi:parameters";
const SOURCE = "org.zfs-csi:source";

/** What the controller reads of a volume before acting on it. */
const STATE_PROPS =
  "type,creation,referenced,refquota,org.zfs-csi:managed,org.zfs-csi:parameters," +
  "org.zfs-csi:source,volsize,org.zfs-csi:fs-type,quota,refreservation,mountpoint," +
  "org.zfs-csi:name,org.zfs-csi:staged-at";
/** What the catalog (ListVolumes, ListSnapshots, CreateSnapshot) reads. */
const CATALOG_PROPS =
  "type,creation,referenced,refquota,org.zfs-csi:managed,org.zfs-csi:parameters,org.zfs-csi:source," +
  "volsize,org.zfs-csi:fs-type";

const zfs = zfsArgv("zfs");
const getProps = (props: string, name: string) => zfs.get(props, name);
const getState = (dataset: string) => getProps(STATE_PROPS, dataset);
const catalog = (depth: 1 | 2, parent = PARENT) => zfs.tree(parent, depth, CATALOG_PROPS);
/** How DeleteVolume reads the volume's subtree: everything the delete judges it by. */
const deleteTree = (dataset: string) =>
  zfs.tree(
    dataset,
    1,
    "type,mountpoint,org.zfs-csi:managed,org.zfs-csi:deleted-at,org.zfs-csi:deleted-name," +
      "userrefs,defer_destroy,clones",
  );
/** How DeleteVolume reads the parent's children when the volume's snapshots have clones. */
const siblingTree = (parent = PARENT) => zfs.tree(parent, 1, "type,origin,org.zfs-csi:managed");
const snapshotTree = (dataset: string) => zfs.tree(dataset, 1, "type,org.zfs-csi:managed");
/** How a deleted snapshot is marked when set aside: the plugin's own, its old name, the time. */
const snapshotMarks = (snapshot: string, hidden: string) => [
  [
    "zfs",
    "set",
    "org.zfs-csi:managed=yes",
    `org.zfs-csi:deleted-name=${snapshot}`,
    `org.zfs-csi:deleted-at=${NOW}`,
    hidden,
  ],
];
/**
 * How a deleted volume is kept for the retention: renamed aside, marked with its old name and
 * the time (NOW), and not mounted at boot.
 */
const setAside = (dataset: string, hidden: string) => [
  ["zfs", "rename", dataset, hidden],
  [
    "zfs",
    "set",
    `org.zfs-csi:deleted-name=${dataset}`,
    `org.zfs-csi:deleted-at=${NOW}`,
    "canmount=noauto",
    hidden,
  ],
];
/** The `-o` option recording the canonical parameters of a volume. */
const params = (json = "{}") => `${PARAMS}=${json}`;
/** The `-o` option recording the name a volume was created for. */
const named = (name: string) => `org.zfs-csi:name=${name}`;
/** The `-o` options of volume `name` made with no parameters: ours, and recorded as none. */
const ours = (name: string) => [MANAGED_OPTION, named(name), params()] as const;
/** A new volume's commands: the create alone (a repeat is told by zfs's refusal). */
const created = (dataset: string, ...options: string[]) => [zfs.create(dataset, ...options)];

interface Prop {
  value: string;
  source: string;
}

/** Properties zfs computes; everything else a test sets is reported as set locally. */
const READ_ONLY = new Set(["type", "creation", "referenced", "available", "origin", "mounted"]);

function prop(name: string, value: string): Prop {
  return { value, source: READ_ONLY.has(name) ? "-" : "local" };
}

/** Parses `-o name=value` pairs of a create or clone argv. */
function parseOptions(args: readonly string[]): Record<string, string> {
  const out: Record<string, string> = {};
  for (let i = 0; i < args.length; i += 2) {
    assert.equal(args[i], "-o", `expected -o in ${JSON.stringify(args)}`);
    const kv = args[i + 1]!;
    const eq = kv.indexOf("=");
    out[kv.slice(0, eq)] = kv.slice(eq + 1);
  }
  return out;
}

/** How far below `root` a dataset or snapshot is, as `zfs get -r -d` counts; Infinity if not. */
function depthBelow(root: string, name: string): number {
  if (name === root) return 0;
  if (!name.startsWith(root + "/") && !name.startsWith(root + "@")) return Infinity;
  const rest = name.slice(root.length);
  const at = rest.indexOf("@");
  const path = at >= 0 ? rest.slice(0, at) : rest;
  return path.split("/").length - 1 + (at >= 0 ? 1 : 0);
}

function notFound(name: string): FakeResponse {
  return fails(`cannot open '${name}': dataset does not exist\n`);
}

/**
 * A fake zfs behind the FakeRunner: datasets and snapshots with properties that `zfs get`,
 * `create`, `clone`, `snapshot`, `destroy`, `rename`, `set` and `unmount` see and change as
 * zfs does (dependent clones, deferred destroy, "already exists"), and a mount table that
 * `mount` lists. Every argv is still recorded by the runner; anything else is unexpected.
 */
class FakeZfs {
  readonly objects = new Map<string, Map<string, Prop>>();
  mounts: { source: string; mountPoint: string; fsType: string }[] = [];
  /** Properties this zfs does not know (as zfs-fuse does not know OpenZFS's). */
  readonly unknown = new Set<string>();
  /** Creation time of snapshots taken now. */
  clock = NOW + 100;

  constructor(runner: FakeRunner) {
    runner
      .on(["zfs", "get"], (argv) => this.get(argv))
      .on(["zfs", "create"], (argv) => this.create(argv))
      .on(["zfs", "clone"], (argv) => this.clone(argv))
      .on(["zfs", "snapshot"], (argv) => this.snapshot(argv))
      .on(["zfs", "destroy"], (argv) => this.destroy(argv))
      .on(["zfs", "rename"], (argv) => this.rename(argv))
      .on(["zfs", "set"], (argv) => this.set(argv))
      .on(["zfs", "unmount"], (argv) => this.unmount(argv))
      .onExact(["mount"], () => ({ stdout: this.mountList() }));
  }

  /** Adds a filesystem, ours unless `managed` is false, mounted at /mnt/<name> unless told. */
  addFilesystem(
    name: string,
    opts: { managed?: boolean; mounted?: boolean; props?: Record<string, string> } = {},
  ): void {
    const mounted = opts.mounted ?? true;
    const p = new Map<string, Prop>([
      ["type", prop("type", "filesystem")],
      ["creation", prop("creation", String(NOW - 86400))],
      ["referenced", prop("referenced", "98304")],
      ["available", prop("available", "1073643520")],
      ["refquota", { value: "0", source: "default" }],
      ["quota", { value: "0", source: "default" }],
      ["refreservation", { value: "0", source: "default" }],
      ["mountpoint", { value: `/mnt/${name}`, source: "default" }],
      ["canmount", { value: "on", source: "default" }],
      ["mounted", prop("mounted", mounted ? "yes" : "no")],
    ]);
    if (opts.managed ?? true) p.set(MANAGED_PROPERTY, prop(MANAGED_PROPERTY, "yes"));
    for (const [k, v] of Object.entries(opts.props ?? {})) p.set(k, prop(k, v));
    this.objects.set(name, p);
    if (mounted) {
      this.mounts.push({ source: name, mountPoint: p.get("mountpoint")!.value, fsType: "zfs" });
    }
  }

  /** Adds a snapshot `<dataset>@<name>` referring to what its dataset refers to. */
  addSnapshot(name: string, props: Record<string, string> = {}): void {
    const dataset = this.objects.get(name.slice(0, name.indexOf("@")));
    assert.ok(dataset, `no dataset for snapshot ${name}`);
    const p = new Map<string, Prop>([
      ["type", prop("type", "snapshot")],
      ["creation", prop("creation", String(this.clock))],
      ["referenced", dataset.get("referenced")!],
      ["defer_destroy", { value: "off", source: "-" }],
    ]);
    for (const [k, v] of Object.entries(props)) p.set(k, prop(k, v));
    this.objects.set(name, p);
  }

  /** Sets `creation` to now, as zfs does on create and clone (a repeat then may be a retry). */
  createdNow(name: string): void {
    this.objects.get(name)!.set(
      "creation",
      prop("creation", String(Math.floor(Date.now() / 1000))),
    );
  }

  /** A property's value, or undefined when the object or property is missing. */
  value(name: string, property: string): string | undefined {
    return this.objects.get(name)?.get(property)?.value;
  }

  has(name: string): boolean {
    return this.objects.has(name);
  }

  clonesOf(snapshot: string): string[] {
    return [...this.objects].filter(([, p]) => p.get("origin")?.value === snapshot)
      .map(([n]) => n);
  }

  mountList(): string {
    return this.mounts.map((m) => mountLine(m.source, m.mountPoint, m.fsType, "rw,xattr,noacl"))
      .join("\n") + "\n";
  }

  get(argv: readonly string[]): FakeResponse {
    const o = argv.indexOf("-o");
    const props = argv[o + 2]!.split(",");
    const roots = argv.slice(o + 3);
    const bad = props.find((p) => this.unknown.has(p));
    if (bad !== undefined) {
      return {
        code: 2,
        stderr: `bad property list: invalid property '${bad}'\nusage:\n\tget [-rHp] ...\n`,
      };
    }
    const d = argv.indexOf("-d");
    const depth = d >= 0 ? Number(argv[d + 1]) : 0;
    const lines: string[] = [];
    for (const root of roots) {
      if (!this.objects.has(root)) return notFound(root);
      const names = [...this.objects.keys()].filter((n) => depthBelow(root, n) <= depth).sort();
      for (const name of names) {
        const p = this.objects.get(name)!;
        for (const property of props) {
          // OpenZFS lists a snapshot's clones; DeleteVolume reads them.
          const v = property === "clones" && p.get("type")?.value === "snapshot"
            ? { value: this.clonesOf(name).join(","), source: "-" }
            : p.get(property);
          lines.push(`${name}\t${property}\t${v?.value ?? "-"}\t${v?.source ?? "-"}`);
        }
      }
    }
    return { stdout: lines.map((l) => l + "\n").join("") };
  }

  create(argv: readonly string[]): FakeResponse {
    const name = argv.at(-1)!;
    const props = parseOptions(argv.slice(2, -1));
    if (this.objects.has(name)) {
      return fails(`cannot create '${name}': dataset already exists\n`);
    }
    if (!this.objects.has(name.slice(0, name.lastIndexOf("/")))) {
      return fails(`cannot create '${name}': parent does not exist\n`);
    }
    this.addFilesystem(name, { managed: false, props });
    this.createdNow(name);
    return {};
  }

  clone(argv: readonly string[]): FakeResponse {
    const snapshot = argv.at(-2)!;
    const target = argv.at(-1)!;
    const props = parseOptions(argv.slice(2, -2));
    const snap = this.objects.get(snapshot);
    if (!snap) return notFound(snapshot);
    if (this.objects.has(target)) {
      return fails(`cannot create '${target}': dataset already exists\n`);
    }
    this.addFilesystem(target, { managed: false, props });
    this.createdNow(target);
    const p = this.objects.get(target)!;
    p.set("origin", prop("origin", snapshot));
    p.set("referenced", snap.get("referenced")!);
    return {};
  }

  snapshot(argv: readonly string[]): FakeResponse {
    const name = argv[2]!;
    const dataset = name.slice(0, name.indexOf("@"));
    if (!this.objects.has(dataset)) return notFound(dataset);
    if (this.objects.has(name)) {
      return fails(`cannot create snapshot '${name}': dataset already exists\n`);
    }
    this.addSnapshot(name);
    return {};
  }

  destroy(argv: readonly string[]): FakeResponse {
    const name = argv.at(-1)!;
    const recursive = argv.includes("-r");
    const deferred = argv.includes("-d");
    if (!this.objects.has(name)) {
      return name.includes("@")
        ? fails("could not find any snapshots to destroy; check snapshot names.\n")
        : notFound(name);
    }
    if (name.includes("@")) {
      const clones = this.clonesOf(name);
      if (clones.length > 0) {
        if (deferred) {
          this.objects.get(name)!.set("defer_destroy", { value: "on", source: "-" });
          return {};
        }
        return {
          code: 1,
          stderr: `cannot destroy '${name}': snapshot has dependent clones\n` +
            `use '-R' to destroy the following datasets:\n${clones.join("\n")}\n`,
        };
      }
      this.objects.delete(name);
      return {};
    }
    const below = [...this.objects.keys()].filter((n) =>
      n.startsWith(name + "/") || n.startsWith(name + "@")
    );
    if (below.length > 0 && !recursive) {
      return {
        code: 1,
        stderr: `cannot destroy '${name}': filesystem has children\n` +
          `use '-r' to destroy the following datasets:\n${below.join("\n")}\n`,
      };
    }
    const dependents = below.filter((n) => n.includes("@")).flatMap((s) => this.clonesOf(s))
      .filter((c) => !below.includes(c));
    if (dependents.length > 0) {
      return {
        code: 1,
        stderr: `cannot destroy '${name}': filesystem has dependent clones\n` +
          `use '-R' to destroy the following datasets:\n${dependents.join("\n")}\n`,
      };
    }
    const origin = this.value(name, "origin");
    for (const n of [name, ...below]) this.objects.delete(n);
    this.mounts = this.mounts.filter((m) => m.source !== name);
    // A snapshot marked for deferred destroy goes with its last clone.
    if (
      origin && this.value(origin, "defer_destroy") === "on" && this.clonesOf(origin).length === 0
    ) {
      this.objects.delete(origin);
    }
    return {};
  }

  rename(argv: readonly string[]): FakeResponse {
    const from = argv[2]!;
    const to = argv[3]!;
    if (!this.objects.has(from)) return notFound(from);
    if (this.objects.has(to)) {
      return fails(`cannot rename to '${to}': dataset already exists\n`);
    }
    const moves = (n: string) => n === from || n.startsWith(from + "/") || n.startsWith(from + "@");
    for (const [n, p] of [...this.objects]) {
      if (!moves(n)) continue;
      this.objects.delete(n);
      this.objects.set(to + n.slice(from.length), p);
    }
    for (const p of this.objects.values()) {
      const origin = p.get("origin")?.value;
      if (origin && moves(origin)) p.set("origin", prop("origin", to + origin.slice(from.length)));
    }
    return {};
  }

  /** `zfs set name=value... <dataset>`: several at once, as OpenZFS takes them. */
  set(argv: readonly string[]): FakeResponse {
    const name = argv.at(-1)!;
    const p = this.objects.get(name);
    if (!p) return notFound(name);
    for (const kv of argv.slice(2, -1)) {
      const eq = kv.indexOf("=");
      p.set(kv.slice(0, eq), prop(kv.slice(0, eq), kv.slice(eq + 1)));
    }
    return {};
  }

  unmount(argv: readonly string[]): FakeResponse {
    const dataset = argv[2]!;
    const p = this.objects.get(dataset);
    if (!p) return notFound(dataset);
    if (p.get("mounted")?.value !== "yes") {
      return fails(`cannot unmount '${dataset}': not currently mounted\n`);
    }
    p.set("mounted", prop("mounted", "no"));
    const mountpoint = p.get("mountpoint")!.value;
    this.mounts = this.mounts.filter((m) => !(m.source === dataset && m.mountPoint === mountpoint));
    return {};
  }
}

interface Harness extends Disposable, FakeServices<FakeZfs> {
  readonly controller: ControllerService;
  /** The argv of every call made after the first `mark` calls. */
  since(mark: number): string[][];
  /** How many calls were made so far. */
  mark(): number;
}

function setup(
  opts: {
    retention?: string;
    parent?: string;
    /** More command-line flags, e.g. a parameter policy. */
    flags?: readonly string[];
    before?: (runner: FakeRunner, host: () => FakeZfs) => void;
  } = {},
): Harness {
  const parent = opts.parent ?? PARENT;
  const parts = fakeServices({
    parent,
    // Node-less ids ("v1") in mutating calls need a node-local plugin id (tenancy_test.ts tests
    // the refusal without it).
    flags: [
      "--deleted-retention",
      opts.retention ?? "7d",
      "--node-local-plugin-id",
      ...opts.flags ?? [],
    ],
    host: (runner) => {
      const host = new FakeZfs(runner);
      host.addFilesystem(parent, { managed: false });
      return host;
    },
    ...(opts.before ? { before: opts.before } : {}),
  });
  const { config, runner, zfs, mounter, health, locks, log } = parts;
  const trash = new Trash({
    zfs,
    parentDataset: parent,
    retentionSeconds: config.deletedRetentionSeconds,
    locks,
    log,
    now: () => NOW,
  });
  const controller = new ControllerService({ config, zfs, mounter, health, locks, trash, log });
  return {
    ...parts,
    controller,
    since: (mark) => runner.argvs.slice(mark),
    mark: () => runner.calls.length,
    // Even a command whose failure the service swallowed must have been scripted.
    [Symbol.dispose]: () => runner.assertNoUnexpected(),
  };
}

/** A harness with the volumes, snapshots and other datasets of {@linkcode populate}. */
function populated(): Harness {
  const h = setup();
  populate(h.host);
  return h;
}

/** A harness with volume "v1" and its snapshot "s1", keeping what is deleted for `retention`. */
function withSnapshot(retention: string): Harness {
  const h = setup({ retention });
  addVolume(h.host, "v1");
  h.host.addSnapshot("tank/nomad/v1@s1");
  return h;
}

/** Answers `zfs destroy tank/nomad/v1` with "dataset is busy" (`times` times, or always). */
function destroyBusy(options: RuleOptions = {}) {
  return (runner: FakeRunner) =>
    runner.onExact(
      ["zfs", "destroy", "tank/nomad/v1"],
      fails("cannot destroy 'tank/nomad/v1': dataset is busy\n"),
      options,
    );
}

function createReq(name: string, over: Partial<CreateVolumeRequest> = {}): CreateVolumeRequest {
  return {
    name,
    capacity_range: { required_bytes: String(64 * MiB), limit_bytes: "0" },
    volume_capabilities: [fsCap()],
    parameters: {},
    secrets: {},
    volume_content_source: null,
    accessibility_requirements: null,
    mutable_parameters: {},
    ...over,
  };
}

/** A CreateVolume request for a copy of `source`. */
function cloneReq(
  name: string,
  source: VolumeContentSource,
  over: Partial<CreateVolumeRequest> = {},
): CreateVolumeRequest {
  return createReq(name, { volume_content_source: source, ...over });
}

const fromSnapshot = (snapshot_id: string): VolumeContentSource => ({ snapshot: { snapshot_id } });
const fromVolume = (volume_id: string): VolumeContentSource => ({ volume: { volume_id } });

function range(required: number, limit = 0) {
  return { required_bytes: String(required), limit_bytes: String(limit) };
}

/** The request DeleteVolume takes, and DeleteSnapshot's. */
const volumeRef = (volume_id: string) => ({ volume_id, secrets: {} });
const snapshotRef = (snapshot_id: string) => ({ snapshot_id, secrets: {} });

function snapshotReq(source: string, name: string, over: Partial<CreateSnapshotRequest> = {}) {
  return { source_volume_id: source, name, secrets: {}, parameters: {}, ...over };
}

function expandReq(
  volumeId: string,
  required: number,
  limit = 0,
  over: Partial<ControllerExpandVolumeRequest> = {},
): ControllerExpandVolumeRequest {
  return {
    volume_id: volumeId,
    capacity_range: range(required, limit),
    secrets: {},
    volume_capability: null,
    ...over,
  };
}

/** What ControllerExpandVolume answers for a volume of `bytes`. */
function expanded(bytes: number) {
  return { capacity_bytes: String(bytes), node_expansion_required: false };
}

function listVolumesReq(over: Partial<ListVolumesRequest> = {}): ListVolumesRequest {
  return { max_entries: 0, starting_token: "", ...over };
}

function listSnapshotsReq(over: Partial<ListSnapshotsRequest> = {}): ListSnapshotsRequest {
  return {
    max_entries: 0,
    starting_token: "",
    source_volume_id: "",
    snapshot_id: "",
    secrets: {},
    ...over,
  };
}

function validateReq(
  volumeId: string,
  over: Partial<ValidateVolumeCapabilitiesRequest> = {},
): ValidateVolumeCapabilitiesRequest {
  return {
    volume_id: volumeId,
    volume_context: {},
    volume_capabilities: [fsCap()],
    parameters: {},
    secrets: {},
    mutable_parameters: {},
    ...over,
  };
}

function capacityReq(over: Partial<GetCapacityRequest> = {}): GetCapacityRequest {
  return { volume_capabilities: [], parameters: {}, accessible_topology: null, ...over };
}

/** The volume message CreateVolume, ListVolumes and ControllerGetVolume answer with. */
function volumeMessage(
  id: string,
  dataset: string,
  capacity: number,
  contentSource?: VolumeContentSource,
) {
  return {
    volume_id: id,
    capacity_bytes: String(capacity),
    volume_context: { dataset },
    ...(contentSource ? { content_source: contentSource } : {}),
    accessible_topology: [{ segments: TOPOLOGY }],
  };
}

function snapshotMessage(
  id: string,
  sourceVolumeId: string,
  sizeBytes: number,
  creation: number,
) {
  return {
    size_bytes: String(sizeBytes),
    snapshot_id: id,
    source_volume_id: sourceVolumeId,
    creation_time: { seconds: String(creation), nanos: 0 },
    ready_to_use: true,
  };
}

/** A ListVolumes or ListSnapshots answer with nothing in it. */
const EMPTY_PAGE = { entries: [], next_token: "" };

const HEALTHY = {
  published_node_ids: [],
  volume_condition: { abnormal: false, message: "Volume is healthy" },
};

/** The hidden snapshot of "src" that a clone "v2" made at `seconds` comes from. */
const cloneSnapshotOfSrc = (seconds: number) =>
  `tank/nomad/src@${cloneSnapshotComponent("tank/nomad/v2", seconds)}`;

/**
 * Runs `fn` with Date.now() at `seconds`: the controller names the hidden snapshot of a clone
 * by the time.
 */
async function atTime<T>(seconds: number, fn: () => Promise<T>): Promise<T> {
  const real = Date.now;
  Date.now = () => seconds * 1000;
  try {
    return await fn();
  } finally {
    Date.now = real;
  }
}

/** A volume as CreateVolume leaves it: ours, with its refquota and recorded parameters. */
function addVolume(
  host: FakeZfs,
  name: string,
  opts: { refquota?: number; parameters?: string; props?: Record<string, string> } = {},
): void {
  host.addFilesystem(`${PARENT}/${name}`, {
    props: {
      refquota: String(opts.refquota ?? 64 * MiB),
      [PARAMS]: opts.parameters ?? "{}",
      ...opts.props,
    },
  });
}

// ---------------------------------------------------------------------------------------------
// ControllerGetCapabilities

Deno.test("ControllerService.ControllerGetCapabilities lists every controller RPC it serves", async () => {
  using h = setup();
  assert.deepEqual(await h.controller.ControllerGetCapabilities(), {
    capabilities: CONTROLLER_CAPABILITIES.map((type) => ({ rpc: { type } })),
  });
  assert.ok(!CONTROLLER_CAPABILITIES.includes("PUBLISH_UNPUBLISH_VOLUME" as never));
  assert.equal(h.runner.calls.length, 0);
});

// ---------------------------------------------------------------------------------------------
// CreateVolume

Deno.test("ControllerService.CreateVolume creates a new dataset with refquota, parameters and our user properties", async () => {
  using h = setup();
  const res = await h.controller.CreateVolume(createReq("v1", {
    parameters: { compression: "lz4", "com.example:team": "db" },
    accessibility_requirements: {
      requisite: [{ segments: { "org.zfs-csi/node": "n1" } }],
      preferred: [{ segments: { zone: "eu1" } }],
    },
  }));
  assert.deepEqual(h.runner.argvs, [
    ...created(
      "tank/nomad/v1",
      "com.example:team=db",
      "compression=lz4",
      MANAGED_OPTION,
      named("v1"),
      params('{"com.example:team":"db","compression":"lz4"}'),
      "refquota=67108864",
    ),
  ]);
  assert.deepEqual(res, { volume: volumeMessage("v1@n1", "tank/nomad/v1", 64 * MiB) });
  assert.ok(h.logs.some((l) => l.includes('"volume created"') && l.includes('"v1@n1"')));
});

Deno.test("ControllerService.CreateVolume encodes the name into one dataset component and reports the name in the id", async () => {
  using h = setup();
  const res = await h.controller.CreateVolume(createReq("db[0]", { capacity_range: null }));
  assert.deepEqual(h.runner.argvs, created("tank/nomad/db:5b0:5d", ...ours("db[0]")));
  assert.deepEqual(res, { volume: volumeMessage("db[0]@n1", "tank/nomad/db:5b0:5d", 0) });
});

Deno.test("ControllerService.CreateVolume gives a 128-byte name a shortened dataset, the same on a repeat", async () => {
  using h = setup();
  const name = "max-" + "a".repeat(124);
  const first = await h.controller.CreateVolume(createReq(name));
  const id = (first as { volume: { volume_id: string } }).volume.volume_id;
  const short = id.slice(0, -"@n1".length);
  assert.match(short, /^max-a+\.\.[0-9a-f]{16}$/);
  assert.ok(name.startsWith(short.slice(0, -18)));
  assert.ok(new TextEncoder().encode(id).length <= 128);
  assert.deepEqual(first, { volume: volumeMessage(id, `tank/nomad/${short}`, 64 * MiB) });
  const mark = h.mark();
  assert.deepEqual(await h.controller.CreateVolume(createReq(name)), first);
  // zfs refuses the create of the same shortened name, and the repeat is judged from its state.
  assert.deepEqual(h.since(mark), [
    zfs.create(`tank/nomad/${short}`, ...ours(name), "refquota=67108864"),
    getState(`tank/nomad/${short}`),
  ]);
});

Deno.test("ControllerService.CreateVolume repeated for an existing compatible dataset: zfs refuses the create, nothing changes, and the answer is the same", async () => {
  using h = setup();
  const req = createReq("v1", { parameters: { compression: "lz4" } });
  const first = await h.controller.CreateVolume(req);
  const mark = h.mark();
  const second = await h.controller.CreateVolume(req);
  const lz4 = ["compression=lz4", MANAGED_OPTION, named("v1"), params('{"compression":"lz4"}')];
  const refused = zfs.create("tank/nomad/v1", ...lz4, "refquota=67108864");
  assert.deepEqual(h.since(mark), [refused, getState("tank/nomad/v1")]);
  assert.deepEqual(second, first);
  // A smaller or equal request, and a limit the volume fits in, are the same volume too.
  const third = await h.controller.CreateVolume(
    createReq("v1", { parameters: { compression: "lz4" }, capacity_range: range(MiB, 64 * MiB) }),
  );
  assert.deepEqual(third, first);
  assert.deepEqual(h.since(mark), [
    refused,
    getState("tank/nomad/v1"),
    zfs.create("tank/nomad/v1", ...lz4, "refquota=1048576"),
    getState("tank/nomad/v1"),
  ]);
  // The refused creates left the volume as it was.
  assert.equal(h.host.value("tank/nomad/v1", "refquota"), "67108864");
});

Deno.test("ControllerService.CreateVolume answers ALREADY_EXISTS for other parameters, capacity or source, writing nothing", async () => {
  using h = setup();
  await h.controller.CreateVolume(createReq("v1", { parameters: { compression: "lz4" } }));
  const lz4 = ["compression=lz4", MANAGED_OPTION, named("v1"), params('{"compression":"lz4"}')];
  // A plain create is tried, refused by zfs (no write), then judged from the state; a clone
  // reads the state first and gets no further.
  const cases: [string, CreateVolumeRequest, RegExp, string[][]][] = [
    [
      "other parameters",
      createReq("v1", { parameters: { compression: "gzip" } }),
      /^Volume "v1@n1" already exists with other parameters \(\{"compression":"lz4"\}\)$/,
      [
        zfs.create(
          "tank/nomad/v1",
          "compression=gzip",
          MANAGED_OPTION,
          named("v1"),
          params('{"compression":"gzip"}'),
          "refquota=67108864",
        ),
        getState("tank/nomad/v1"),
      ],
    ],
    [
      "no parameters",
      createReq("v1"),
      /^Volume "v1@n1" already exists with other parameters/,
      [zfs.create("tank/nomad/v1", ...ours("v1"), "refquota=67108864"), getState("tank/nomad/v1")],
    ],
    [
      "more capacity",
      createReq("v1", { parameters: { compression: "lz4" }, capacity_range: range(128 * MiB) }),
      /^Volume "v1@n1" already exists with another capacity \(67108864 bytes\)$/,
      [zfs.create("tank/nomad/v1", ...lz4, "refquota=134217728"), getState("tank/nomad/v1")],
    ],
    [
      "a lower limit",
      createReq("v1", {
        parameters: { compression: "lz4" },
        capacity_range: range(0, 32 * MiB),
      }),
      /^Volume "v1@n1" already exists with another capacity \(67108864 bytes\)$/,
      [zfs.create("tank/nomad/v1", ...lz4, "refquota=33554432"), getState("tank/nomad/v1")],
    ],
    [
      "a content source",
      cloneReq("v1", fromSnapshot("src@s1@n1"), { parameters: { compression: "lz4" } }),
      /^Volume "v1@n1" already exists with another content source \(none\)$/,
      [getState("tank/nomad/v1")],
    ],
  ];
  for (const [what, req, message, argvs] of cases) {
    const mark = h.mark();
    await assertRejectsCsi(h.controller.CreateVolume(req), Code.ALREADY_EXISTS, message);
    assert.deepEqual(h.since(mark), argvs, what);
  }
  // The volume is as the first call made it.
  assert.equal(h.host.value("tank/nomad/v1", "compression"), "lz4");
  assert.equal(h.host.value("tank/nomad/v1", PARAMS), '{"compression":"lz4"}');
  assert.equal(h.host.value("tank/nomad/v1", "refquota"), "67108864");
});

Deno.test("ControllerService.CreateVolume answers ALREADY_EXISTS for an unlimited volume asked with a capacity", async () => {
  using h = setup();
  await h.controller.CreateVolume(createReq("v1", { capacity_range: null }));
  const mark = h.mark();
  await assertRejectsCsi(
    h.controller.CreateVolume(createReq("v1")),
    Code.ALREADY_EXISTS,
    'Volume "v1@n1" already exists with another capacity (unlimited)',
  );
  assert.deepEqual(h.since(mark), [
    zfs.create("tank/nomad/v1", ...ours("v1"), "refquota=67108864"),
    getState("tank/nomad/v1"),
  ]);
  assert.equal(h.host.value("tank/nomad/v1", "refquota"), "0");
});

Deno.test("ControllerService.CreateVolume answers ALREADY_EXISTS for a foreign dataset of the same name", async () => {
  using h = setup();
  h.host.addFilesystem("tank/nomad/v1", { managed: false, props: { refquota: String(64 * MiB) } });
  await assertRejectsCsi(
    h.controller.CreateVolume(createReq("v1")),
    Code.ALREADY_EXISTS,
    'Volume "v1@n1" already exists as dataset "tank/nomad/v1", which zfs-csi does not manage',
  );
  // zfs refuses the create; the foreign dataset is only read, never changed.
  assert.deepEqual(h.runner.argvs, [
    zfs.create("tank/nomad/v1", ...ours("v1"), "refquota=67108864"),
    getState("tank/nomad/v1"),
  ]);
  assert.equal(h.host.value("tank/nomad/v1", MANAGED_PROPERTY), undefined);
  assert.equal(h.host.value("tank/nomad/v1", PARAMS), undefined);
});

Deno.test("ControllerService.CreateVolume rounds required_bytes below 1 MiB up to MIN_VOLUME_BYTES", async () => {
  using h = setup();
  assert.equal(MIN_VOLUME_BYTES, 1048576);
  const res = await h.controller.CreateVolume(createReq("v1", { capacity_range: range(1000) }));
  assert.deepEqual(h.runner.argvs, created("tank/nomad/v1", ...ours("v1"), "refquota=1048576"));
  assert.deepEqual(res, { volume: volumeMessage("v1@n1", "tank/nomad/v1", MIN_VOLUME_BYTES) });
  // The repeat of that request is the same volume.
  assert.deepEqual(
    await h.controller.CreateVolume(createReq("v1", { capacity_range: range(1000) })),
    res,
  );
});

for (
  const [when, required, limit] of [
    ["when the limit is below the smallest volume", 1000, 2000],
    ["for only a limit below the smallest volume", 0, 1000],
  ] as const
) {
  Deno.test(`ControllerService.CreateVolume answers OUT_OF_RANGE ${when}`, async () => {
    using h = setup();
    await assertRejectsCsi(
      h.controller.CreateVolume(createReq("v1", { capacity_range: range(required, limit) })),
      Code.OUT_OF_RANGE,
      new RegExp(`limit_bytes ${limit} is below the smallest volume, 1048576 bytes`),
    );
    assert.equal(h.runner.calls.length, 0);
  });
}

Deno.test("ControllerService.CreateVolume with only a limit creates a volume of the limit", async () => {
  using h = setup();
  const res = await h.controller.CreateVolume(
    createReq("v1", { capacity_range: range(0, 32 * MiB) }),
  );
  assert.deepEqual(h.runner.argvs, created("tank/nomad/v1", ...ours("v1"), "refquota=33554432"));
  assert.deepEqual(res, { volume: volumeMessage("v1@n1", "tank/nomad/v1", 32 * MiB) });
});

Deno.test("ControllerService.CreateVolume without a capacity range sets no refquota", async () => {
  using h = setup();
  const res = await h.controller.CreateVolume(createReq("v1", { capacity_range: null }));
  assert.deepEqual(h.runner.argvs, created("tank/nomad/v1", ...ours("v1")));
  assert.deepEqual(res, { volume: volumeMessage("v1@n1", "tank/nomad/v1", 0) });
});

for (
  const [what, parameters, json, sizes] of [
    [
      "sets quota and refreservation to the capacity when asked for capacity",
      { quota: "capacity", refreservation: "capacity" },
      '{"quota":"capacity","refreservation":"capacity"}',
      ["quota=67108864", "refquota=67108864", "refreservation=67108864"],
    ],
    [
      "sets a fixed quota in bytes above the capacity",
      { quota: "1GiB" },
      '{"quota":"1GiB"}',
      ["quota=1073741824", "refquota=67108864"],
    ],
  ] as const
) {
  Deno.test(`ControllerService.CreateVolume ${what}`, async () => {
    using h = setup();
    await h.controller.CreateVolume(createReq("v1", { parameters }));
    assert.deepEqual(
      h.runner.argvs,
      created("tank/nomad/v1", MANAGED_OPTION, named("v1"), params(json), ...sizes),
    );
  });
}

Deno.test("ControllerService.CreateVolume refuses bad parameters before any zfs call", async () => {
  using h = setup();
  const withParameters = (parameters: Record<string, string>) => createReq("v1", { parameters });
  const cases: [CreateVolumeRequest, string | RegExp][] = [
    [withParameters({ mountpoint: "/etc" }), /Parameter "mountpoint" is not supported/],
    [
      withParameters({ "org.zfs-csi:managed": "yes" }),
      /Parameter "org.zfs-csi:managed" is not supported/,
    ],
    [withParameters({ compression: "bogus" }), /compression="bogus" is not a value zfs accepts/],
    [withParameters({ quota: "1MiB" }), /quota is below the volume's capacity of 67108864 bytes/],
    [withParameters({ refreservation: "1GiB" }), /refreservation is above the volume's capacity/],
    [createReq("v1", { volume_capabilities: [blockCap()] }), /Block volumes are not supported/],
    [createReq("v1", { volume_capabilities: [] }), "volume_capabilities is required"],
    [createReq(""), "name is required"],
    [createReq("a/b"), /must not contain "\/"/],
  ];
  for (const [req, message] of cases) {
    await assertRejectsCsi(h.controller.CreateVolume(req), Code.INVALID_ARGUMENT, message);
  }
  assert.equal(h.runner.calls.length, 0);
});

Deno.test("ControllerService.CreateVolume asks once whether zfs knows an OpenZFS-only parameter, then remembers", async () => {
  using h = setup({ flags: ["--key-dir", "/etc/zfs/keys"] });
  const parameters = {
    encryption: "aes-256-gcm",
    keyformat: "passphrase",
    keylocation: "file:///etc/zfs/keys/v1",
  };
  const createKeyed = (name: string) =>
    zfs.create(
      `tank/nomad/${name}`,
      "encryption=aes-256-gcm",
      "keyformat=passphrase",
      "keylocation=file:///etc/zfs/keys/v1",
      MANAGED_OPTION,
      named(name),
      params(
        '{"encryption":"aes-256-gcm","keyformat":"passphrase","keylocation":"file:///etc/zfs/keys/v1"}',
      ),
      "refquota=67108864",
    );
  await h.controller.CreateVolume(createReq("v1", { parameters }));
  assert.deepEqual(h.runner.argvs, [
    getProps("encryption,keyformat,keylocation", "tank/nomad"),
    createKeyed("v1"),
  ]);
  const mark = h.mark();
  await h.controller.CreateVolume(createReq("v2", { parameters }));
  // Remembered: the next volume is the create alone.
  assert.deepEqual(h.since(mark), [
    createKeyed("v2"),
  ]);
});

Deno.test("ControllerService.CreateVolume refuses an OpenZFS-only parameter that zfs does not know with INVALID_ARGUMENT", async () => {
  const usage = (await Deno.readTextFile(
    new URL("../../tests/fixtures/stderr_get_bad_property.txt", import.meta.url),
  )).replace("'bogusprop'", "'encryption'");
  assert.match(usage, /^bad property list: invalid property 'encryption'\n/);
  using h = setup({
    before: (runner) =>
      runner.onExact(getProps("encryption", "tank/nomad"), { code: 2, stderr: usage }),
  });
  for (let i = 0; i < 2; i++) {
    const mark = h.mark();
    await assertRejectsCsi(
      h.controller.CreateVolume(createReq("v1", { parameters: { encryption: "on" } })),
      Code.INVALID_ARGUMENT,
      'Parameter "encryption" is not supported by the ZFS on node "n1" (it needs OpenZFS)',
    );
    // Not remembered as supported: asked again, and never created.
    assert.deepEqual(h.since(mark), [getProps("encryption", "tank/nomad")]);
  }
  assert.ok(!h.host.has("tank/nomad/v1"));
});

Deno.test("ControllerService.CreateVolume names every OpenZFS-only parameter zfs does not know", async () => {
  using h = setup({ flags: ["--allow-parameter", "keylocation=file:///k"] });
  h.host.unknown.add("encryption").add("keyformat").add("keylocation");
  await assertRejectsCsi(
    h.controller.CreateVolume(createReq("v1", {
      parameters: {
        encryption: "on",
        keyformat: "passphrase",
        keylocation: "file:///k",
        relatime: "on",
      },
    })),
    Code.INVALID_ARGUMENT,
    'Parameter "encryption", "keyformat", "keylocation" is not supported by the ZFS on node ' +
      '"n1" (it needs OpenZFS)',
  );
  assert.deepEqual(h.runner.argvs, [
    getProps("encryption,keyformat,keylocation,relatime", "tank/nomad"),
    getProps("keyformat,keylocation,relatime", "tank/nomad"),
    getProps("keylocation,relatime", "tank/nomad"),
    getProps("relatime", "tank/nomad"),
  ]);
  // relatime was found supported: a create asking only for it needs no question.
  const mark = h.mark();
  await h.controller.CreateVolume(createReq("v1", { parameters: { relatime: "on" } }));
  assert.deepEqual(
    h.since(mark),
    created(
      "tank/nomad/v1",
      MANAGED_OPTION,
      named("v1"),
      params('{"relatime":"on"}'),
      "refquota=67108864",
      "relatime=on",
    ),
  );
});

Deno.test("ControllerService.CreateVolume from a snapshot clones it with the properties and records the source", async () => {
  using h = setup();
  addVolume(h.host, "src", { props: { referenced: String(10 * MiB) } });
  h.host.addSnapshot("tank/nomad/src@s1");
  const req = cloneReq("v2", { ...fromSnapshot("src@s1@n1"), type: "snapshot" }, {
    capacity_range: range(128 * MiB),
    parameters: { compression: "lz4" },
  });
  const res = await h.controller.CreateVolume(req);
  assert.deepEqual(h.runner.argvs, [
    getState("tank/nomad/v2"),
    getState("tank/nomad/src"),
    getProps("referenced", "tank/nomad/src@s1"),
    zfs.clone(
      "tank/nomad/src@s1",
      "tank/nomad/v2",
      "compression=lz4",
      MANAGED_OPTION,
      named("v2"),
      params('{"compression":"lz4"}'),
      "org.zfs-csi:source=snapshot:src@s1@n1",
      "refquota=134217728",
    ),
  ]);
  const expected = {
    volume: volumeMessage("v2@n1", "tank/nomad/v2", 128 * MiB, fromSnapshot("src@s1@n1")),
  };
  assert.deepEqual(res, expected);
  // A repeat answers the same without cloning again.
  const mark = h.mark();
  assert.deepEqual(await h.controller.CreateVolume(req), expected);
  assert.deepEqual(h.since(mark), [getState("tank/nomad/v2")]);
});

Deno.test("ControllerService.CreateVolume from a snapshot without a capacity takes the source's refquota", async () => {
  using h = setup();
  addVolume(h.host, "src", { refquota: 256 * MiB });
  h.host.addSnapshot("tank/nomad/src@s1");
  const res = await h.controller.CreateVolume(
    cloneReq("v2", fromSnapshot("src@s1"), { capacity_range: null }),
  );
  assert.deepEqual(
    h.runner.argvs[3],
    zfs.clone(
      "tank/nomad/src@s1",
      "tank/nomad/v2",
      ...ours("v2"),
      "org.zfs-csi:source=snapshot:src@s1",
      "refquota=268435456",
    ),
  );
  assert.deepEqual(res, {
    volume: volumeMessage("v2@n1", "tank/nomad/v2", 256 * MiB, fromSnapshot("src@s1")),
  });
});

Deno.test("ControllerService.CreateVolume from a volume clones a hidden snapshot and marks it for deferred destroy", async () => {
  using h = setup();
  addVolume(h.host, "src");
  const hidden = cloneSnapshotOfSrc(NOW);
  assert.match(hidden, /^tank\/nomad\/src@\.clone-[0-9a-f]{16}-1700000000$/);
  const req = cloneReq("v2", { ...fromVolume("src@n1"), type: "volume" });
  const res = await atTime(NOW, () => h.controller.CreateVolume(req));
  assert.deepEqual(h.runner.argvs, [
    getState("tank/nomad/v2"),
    getState("tank/nomad/src"),
    ["zfs", "snapshot", hidden],
    zfs.clone(
      hidden,
      "tank/nomad/v2",
      ...ours("v2"),
      "org.zfs-csi:source=volume:src@n1",
      "refquota=67108864",
    ),
    ["zfs", "destroy", "-d", hidden],
  ]);
  assert.deepEqual(res, {
    volume: volumeMessage("v2@n1", "tank/nomad/v2", 64 * MiB, fromVolume("src@n1")),
  });
  // The hidden snapshot stays while the clone needs it, marked to go with it.
  assert.equal(h.host.value(hidden, "defer_destroy"), "on");
  assert.equal(h.host.value("tank/nomad/v2", "origin"), hidden);
});

Deno.test("ControllerService.CreateVolume from a volume tolerates the hidden snapshot of an attempt in the same second", async () => {
  using h = setup();
  addVolume(h.host, "src");
  const hidden = cloneSnapshotOfSrc(NOW);
  h.host.addSnapshot(hidden);
  const res = await atTime(
    NOW,
    () => h.controller.CreateVolume(cloneReq("v2", fromVolume("src@n1"))),
  );
  assert.deepEqual(h.runner.argvs.map((a) => a.slice(0, 3)), [
    ["zfs", "get", "-Hp"],
    ["zfs", "get", "-Hp"],
    ["zfs", "snapshot", hidden],
    ["zfs", "clone", "-o"],
    ["zfs", "destroy", "-d"],
  ]);
  assert.equal(h.host.value("tank/nomad/v2", "origin"), hidden);
  assert.deepEqual(res, {
    volume: volumeMessage("v2@n1", "tank/nomad/v2", 64 * MiB, fromVolume("src@n1")),
  });
});

Deno.test("ControllerService.CreateVolume from a volume again after the clone was deleted clones the source as it is now", async () => {
  using h = setup();
  addVolume(h.host, "src");
  const req = cloneReq("v2", fromVolume("src@n1"));
  await atTime(NOW, () => h.controller.CreateVolume(req));
  await h.controller.DeleteVolume(volumeRef("v2@n1"));
  const first = cloneSnapshotOfSrc(NOW);
  // The deleted clone, set aside for the retention, still holds the first hidden snapshot.
  assert.equal(h.host.value(`tank/nomad/.deleted-${NOW}-v2`, "origin"), first);
  // Time passes and the source changes; then the volume is created again.
  h.host.clock = NOW + 5000;
  const mark = h.mark();
  await atTime(NOW + 5000, () => h.controller.CreateVolume(req));
  const second = cloneSnapshotOfSrc(NOW + 5000);
  assert.deepEqual(h.since(mark)[2], ["zfs", "snapshot", second]);
  assert.equal(h.host.value("tank/nomad/v2", "origin"), second);
  assert.equal(h.host.value(second, "creation"), String(NOW + 5000));
  assert.ok(h.host.has(first));
});

Deno.test("ControllerService.CreateVolume answers OUT_OF_RANGE for a capacity below what the source holds", async () => {
  using h = setup();
  addVolume(h.host, "src", { refquota: 256 * MiB, props: { referenced: String(100 * MiB) } });
  h.host.addSnapshot("tank/nomad/src@s1");
  await assertRejectsCsi(
    h.controller.CreateVolume(cloneReq("v2", fromVolume("src@n1"))),
    Code.OUT_OF_RANGE,
    "The source holds 104857600 bytes, more than the requested capacity of 67108864 bytes",
  );
  assert.deepEqual(h.runner.argvs, [getState("tank/nomad/v2"), getState("tank/nomad/src")]);
  const mark = h.mark();
  await assertRejectsCsi(
    h.controller.CreateVolume(cloneReq("v3", fromSnapshot("src@s1@n1"))),
    Code.OUT_OF_RANGE,
    /holds 104857600 bytes/,
  );
  assert.deepEqual(h.since(mark), [
    getState("tank/nomad/v3"),
    getState("tank/nomad/src"),
    getProps("referenced", "tank/nomad/src@s1"),
  ]);
  assert.ok(!h.host.has("tank/nomad/v2") && !h.host.has("tank/nomad/v3"));
});

Deno.test("ControllerService.CreateVolume answers NOT_FOUND for a missing source", async () => {
  using h = setup();
  addVolume(h.host, "src");
  const cases: [VolumeContentSource, string | RegExp][] = [
    [fromSnapshot("src@nosuch@n1"), 'Snapshot "src@nosuch@n1" not found'],
    [fromVolume("gone@n1"), 'Volume "gone@n1" not found'],
    [fromSnapshot("reallyfakesnapshotid"), /^Snapshot "reallyfakesnapshotid" not found/],
  ];
  for (const [source, message] of cases) {
    await assertRejectsCsi(
      h.controller.CreateVolume(cloneReq("v2", source)),
      Code.NOT_FOUND,
      message,
    );
  }
  assert.ok(!h.runner.argvs.some((a) => a[1] !== "get"));
});

Deno.test("ControllerService.CreateVolume answers RESOURCE_EXHAUSTED for requisite topology of another node before any zfs call", async () => {
  using h = setup();
  await assertRejectsCsi(
    h.controller.CreateVolume(createReq("v1", {
      accessibility_requirements: {
        requisite: [{ segments: { "org.zfs-csi/node": "n2" } }],
        preferred: [{ segments: { "org.zfs-csi/node": "n1" } }],
      },
    })),
    Code.RESOURCE_EXHAUSTED,
    /excludes node "n1"/,
  );
  assert.equal(h.runner.calls.length, 0);
});

Deno.test("ControllerService.CreateVolume makes a second call for the same name wait for the first, then answers it as a repeat", async () => {
  const held = gate();
  const entered = gate();
  const create = zfs.create("tank/nomad/v1", ...ours("v1"), "refquota=67108864");
  using h = setup({
    before: (runner, host) =>
      runner.onExact(create, async (argv) => {
        entered.open();
        await held.promise;
        return host().create(argv);
      }, { times: 1 }),
  });
  const first = h.controller.CreateVolume(createReq("v1"));
  await entered.promise;
  const settled: string[] = [];
  const repeat = h.controller.CreateVolume(createReq("v1")).finally(() => settled.push("repeat"));
  // The source of a clone is locked too.
  const clone = h.controller.CreateVolume(cloneReq("v9", fromVolume("v1@n1")))
    .finally(() => settled.push("clone"));
  await new Promise((r) => setTimeout(r, 10));
  assert.deepEqual(settled, [], "both wait while the first create holds the volume");
  assert.equal(h.locks.waiting("tank/nomad/v1"), 2);
  // The waiting calls ran nothing yet: only the first call's create.
  assert.deepEqual(h.runner.argvs, [create]);
  held.open();
  const made = { volume: volumeMessage("v1@n1", "tank/nomad/v1", 64 * MiB) };
  assert.deepEqual(await first, made);
  assert.deepEqual(await repeat, made, "the repeat finds the volume the first call made");
  assert.equal((await clone as { volume: { volume_id: string } }).volume.volume_id, "v9@n1");
  assert.deepEqual(settled, ["repeat", "clone"], "in the order they came");
  assert.equal(h.locks.isHeld("tank/nomad/v1"), false);
});

Deno.test("ControllerService.CreateVolume judges a dataset made meanwhile by someone else like a repeat", async () => {
  using h = setup({
    before: (runner, host) =>
      runner.on(["zfs", "create"], () => {
        host().addFilesystem("tank/nomad/v1", { managed: false });
        return fails("cannot create 'tank/nomad/v1': dataset already exists\n");
      }, { times: 1 }),
  });
  await assertRejectsCsi(
    h.controller.CreateVolume(createReq("v1")),
    Code.ALREADY_EXISTS,
    /which zfs-csi does not manage/,
  );
  // The refused create is judged from the dataset's state, read after it; nothing is written.
  assert.deepEqual(h.runner.argvs, [
    zfs.create("tank/nomad/v1", ...ours("v1"), "refquota=67108864"),
    getState("tank/nomad/v1"),
  ]);
  assert.equal(h.host.value("tank/nomad/v1", MANAGED_PROPERTY), undefined);
});

// ---------------------------------------------------------------------------------------------
// DeleteVolume

Deno.test("ControllerService.DeleteVolume of a missing volume succeeds without a destructive call", async () => {
  using h = setup();
  assert.deepEqual(await h.controller.DeleteVolume(volumeRef("v9@n1")), {});
  // The mount table is read beside the dataset, so a delete waits for one process fewer.
  assert.deepEqual(h.runner.argvs, [deleteTree("tank/nomad/v9"), ["mount"]]);
});

Deno.test("ControllerService.DeleteVolume never reaches a hidden dataset through a volume id", async () => {
  using h = setup();
  h.host.addFilesystem("tank/nomad/.deleted-1699990000-v0", { mounted: false });
  assert.deepEqual(await h.controller.DeleteVolume(volumeRef(".deleted-1699990000-v0")), {});
  assert.deepEqual(h.runner.argvs, [deleteTree("tank/nomad/:2edeleted-1699990000-v0"), ["mount"]]);
  assert.ok(h.host.has("tank/nomad/.deleted-1699990000-v0"));
});

Deno.test("ControllerService.DeleteVolume refuses a foreign dataset with FAILED_PRECONDITION and changes nothing", async () => {
  using h = setup();
  h.host.addFilesystem("tank/nomad/v1", { managed: false });
  await assertRejectsCsi(
    h.controller.DeleteVolume(volumeRef("v1@n1")),
    Code.FAILED_PRECONDITION,
    /^Dataset "tank\/nomad\/v1" exists but is not managed by zfs-csi/,
  );
  assert.deepEqual(h.runner.argvs, [deleteTree("tank/nomad/v1"), ["mount"]]);
  assert.ok(h.host.has("tank/nomad/v1"));
});

Deno.test("ControllerService.DeleteVolume refuses a volume bind-mounted elsewhere, naming the path", async () => {
  using h = setup();
  addVolume(h.host, "v1");
  h.host.mounts.push({
    source: "tank/nomad/v1",
    mountPoint: "/local/csi/per-alloc/a1/v1/rw",
    fsType: "zfs",
  });
  await assertRejectsCsi(
    h.controller.DeleteVolume(volumeRef("v1@n1")),
    Code.FAILED_PRECONDITION,
    'Volume "v1@n1" is in use: mounted at "/local/csi/per-alloc/a1/v1/rw"; ' +
      "stop the jobs using it first",
  );
  assert.deepEqual(h.runner.argvs, [deleteTree("tank/nomad/v1"), ["mount"]]);
  assert.ok(h.host.has("tank/nomad/v1"));
});

for (
  const [flavour, fixture, volumeId, dataset, mountpoint, users] of [
    [
      "zfs-fuse",
      "mount_list_binds.txt",
      "db[0]@n1",
      "tpool/nomad/db:5b0:5d",
      "/tmp/zp/mnt/nomad/db:5b0:5d",
      [
        "/local/csi/staging/db[0]/rw-file-system-single-node-writer",
        "/local/csi/per-alloc/a1/db[0]/rw",
        "/local/csi/per-alloc/a2/my vol/rw",
      ],
    ],
    [
      "OpenZFS",
      "openzfs/mount_list_binds.txt",
      "v1@n1",
      "tpool/nomad/v1",
      "/tmp/t/zfs/nomad/v1",
      ["/tmp/t/base/staging/v1/rw", "/tmp/t/base/per-alloc/a 2/v1/rw"],
    ],
  ] as const
) {
  Deno.test(`ControllerService.DeleteVolume reads bind mounts from a real ${flavour} mount table`, async () => {
    const table = await Deno.readTextFile(
      new URL(`../../tests/fixtures/${fixture}`, import.meta.url),
    );
    using h = setup({
      parent: "tpool/nomad",
      before: (runner) => runner.onExact(["mount"], { stdout: table }),
    });
    h.host.addFilesystem(dataset, { mounted: false, props: { mountpoint } });
    await assertRejectsCsi(
      h.controller.DeleteVolume(volumeRef(volumeId)),
      Code.FAILED_PRECONDITION,
      `Volume "${volumeId}" is in use: mounted at ${users.map((u) => `"${u}"`).join(", ")}; ` +
        "stop the jobs using it first",
    );
    assert.deepEqual(h.runner.argvs, [deleteTree(dataset), ["mount"]]);
  });
}

Deno.test("ControllerService.DeleteVolume refuses a volume with a snapshot, naming the snapshot id", async () => {
  using h = setup();
  addVolume(h.host, "v1");
  h.host.addSnapshot("tank/nomad/v1@s1");
  h.host.addSnapshot("tank/nomad/v1@.clone-0123456789abcdef");
  await assertRejectsCsi(
    h.controller.DeleteVolume(volumeRef("v1@n1")),
    Code.FAILED_PRECONDITION,
    'Volume "v1@n1" has snapshots ("v1@s1@n1"); delete them first (nomad volume snapshot delete)',
  );
  assert.deepEqual(h.runner.argvs, [deleteTree("tank/nomad/v1"), ["mount"]]);
  assert.ok(h.host.has("tank/nomad/v1@s1"));
});

/** A hidden snapshot of the form CreateVolume clones a volume from. */
const CLONE_SNAPSHOT = ".clone-0123456789abcdef-1699990000";
/** The marks a delete sets on a snapshot it sets aside. */
const DELETED_MARKS = {
  [MANAGED_PROPERTY]: "yes",
  "org.zfs-csi:deleted-at": "1699990000",
  "org.zfs-csi:deleted-name": "tank/nomad/v1@s0",
};

Deno.test("ControllerService.DeleteVolume sets aside a volume with hidden snapshots only", async () => {
  using h = setup();
  addVolume(h.host, "v1");
  h.host.addSnapshot(`tank/nomad/v1@${CLONE_SNAPSHOT}`);
  h.host.addSnapshot("tank/nomad/v1@.deleted-1699990000-s0", DELETED_MARKS);
  assert.deepEqual(await h.controller.DeleteVolume(volumeRef("v1@n1")), {});
  assert.deepEqual(h.runner.argvs.slice(2).map((a) => a[1]), ["unmount", "rename", "set"]);
  assert.ok(h.host.has(`tank/nomad/.deleted-${NOW}-v1@${CLONE_SNAPSHOT}`));
});

Deno.test("ControllerService.DeleteVolume with a retention unmounts, renames aside and stops mounting at boot", async () => {
  using h = setup({ retention: "7d" });
  addVolume(h.host, "v1");
  assert.deepEqual(await h.controller.DeleteVolume(volumeRef("v1@n1")), {});
  const hidden = `tank/nomad/.deleted-${NOW}-v1`;
  assert.deepEqual(h.runner.argvs, [
    deleteTree("tank/nomad/v1"),
    ["mount"],
    ["zfs", "unmount", "tank/nomad/v1"],
    ...setAside("tank/nomad/v1", hidden),
  ]);
  assert.ok(!h.host.has("tank/nomad/v1"));
  assert.equal(h.host.value(hidden, "canmount"), "noauto");
  assert.ok(h.logs.some((l) => l.includes('"volume set aside"') && l.includes(hidden)));
  // A repeat finds nothing and does nothing.
  const mark = h.mark();
  assert.deepEqual(await h.controller.DeleteVolume(volumeRef("v1@n1")), {});
  assert.deepEqual(h.since(mark), [deleteTree("tank/nomad/v1"), ["mount"]]);
});

Deno.test("ControllerService.DeleteVolume with retention 0 unmounts and destroys its hidden snapshots, then the dataset, never with -r", async () => {
  using h = setup({ retention: "0" });
  addVolume(h.host, "v1");
  h.host.addSnapshot("tank/nomad/v1@.deleted-1699990000-s0", DELETED_MARKS);
  assert.deepEqual(await h.controller.DeleteVolume(volumeRef("v1")), {});
  assert.deepEqual(h.runner.argvs, [
    deleteTree("tank/nomad/v1"),
    ["mount"],
    ["zfs", "unmount", "tank/nomad/v1"],
    ["zfs", "destroy", "tank/nomad/v1@.deleted-1699990000-s0"],
    ["zfs", "destroy", "tank/nomad/v1"],
  ]);
  assert.deepEqual([...h.host.objects.keys()], ["tank/nomad"]);
});

Deno.test("ControllerService.DeleteVolume with retention 0 sets aside a volume a clone depends on", async () => {
  using h = setup({ retention: "0" });
  addVolume(h.host, "v1");
  await h.controller.CreateVolume(cloneReq("v2", fromVolume("v1@n1")));
  const mark = h.mark();
  assert.deepEqual(await h.controller.DeleteVolume(volumeRef("v1@n1")), {});
  const hidden = `tank/nomad/.deleted-${NOW}-v1`;
  // Its hidden snapshot has the plugin's clone: set aside at once, no destroy tried.
  assert.deepEqual(h.since(mark), [
    deleteTree("tank/nomad/v1"),
    ["mount"],
    siblingTree(),
    ["zfs", "unmount", "tank/nomad/v1"],
    ...setAside("tank/nomad/v1", hidden),
  ]);
  assert.ok(h.host.has(hidden));
  assert.ok(h.host.value("tank/nomad/v2", "origin")!.startsWith(`${hidden}@.clone-`));
});

Deno.test("ControllerService.DeleteVolume retries a destroy that finds the volume busy right after the unmount", async () => {
  using h = setup({
    retention: "0",
    before: destroyBusy({ times: 2 }),
  });
  addVolume(h.host, "v1");
  assert.deepEqual(await h.controller.DeleteVolume(volumeRef("v1@n1")), {});
  assert.deepEqual(h.runner.argvs.slice(2), [
    ["zfs", "unmount", "tank/nomad/v1"],
    ["zfs", "destroy", "tank/nomad/v1"],
    ["zfs", "destroy", "tank/nomad/v1"],
    ["zfs", "destroy", "tank/nomad/v1"],
  ]);
  assert.ok(!h.host.has("tank/nomad/v1"));
});

Deno.test("ControllerService.DeleteVolume sets aside a volume that stays busy after the unmount", async () => {
  using h = setup({
    retention: "0",
    before: destroyBusy(),
  });
  addVolume(h.host, "v1");
  assert.deepEqual(await h.controller.DeleteVolume(volumeRef("v1@n1")), {});
  const hidden = `tank/nomad/.deleted-${NOW}-v1`;
  assert.deepEqual(h.runner.argvs.slice(2), [
    ["zfs", "unmount", "tank/nomad/v1"],
    ...Array.from({ length: 5 }, () => ["zfs", "destroy", "tank/nomad/v1"]),
    ...setAside("tank/nomad/v1", hidden),
  ]);
  assert.ok(h.host.has(hidden));
});

Deno.test("ControllerService.DeleteVolume stops before any change when the unmount finds the volume busy", async () => {
  using h = setup({
    before: (runner) =>
      runner.onExact(
        ["zfs", "unmount", "tank/nomad/v1"],
        fails("cannot unmount '/mnt/tank/nomad/v1': pool or dataset is busy\n"),
      ),
  });
  addVolume(h.host, "v1");
  const err = await rejected(h.controller.DeleteVolume(volumeRef("v1@n1")));
  assert.equal(toGrpcStatus(err).code, Code.FAILED_PRECONDITION);
  assert.deepEqual(h.runner.argvs.slice(2), [["zfs", "unmount", "tank/nomad/v1"]]);
  assert.ok(h.host.has("tank/nomad/v1"));
});

Deno.test("ControllerService.DeleteVolume of another node's volume answers FAILED_PRECONDITION without any zfs call", async () => {
  using h = setup();
  addVolume(h.host, "v1");
  await assertRejectsCsi(
    h.controller.DeleteVolume(volumeRef("v1@n2")),
    Code.FAILED_PRECONDITION,
    /^Volume "v1@n2" lives on node "n2", but this plugin runs on node "n1"/,
  );
  await assertRejectsCsi(
    h.controller.DeleteVolume(volumeRef("")),
    Code.INVALID_ARGUMENT,
    "volume_id is required",
  );
  assert.equal(h.runner.calls.length, 0);
});

// ---------------------------------------------------------------------------------------------
// CreateSnapshot

Deno.test("ControllerService.CreateSnapshot takes a snapshot and answers its id, source, size and time", async () => {
  using h = setup();
  addVolume(h.host, "v1", { props: { referenced: "4194304" } });
  const res = await h.controller.CreateSnapshot(snapshotReq("v1@n1", "s1"));
  assert.deepEqual(h.runner.argvs, [
    catalog(2),
    ["zfs", "snapshot", "tank/nomad/v1@s1"],
    getProps("creation,referenced", "tank/nomad/v1@s1"),
  ]);
  const expected = { snapshot: snapshotMessage("v1@s1@n1", "v1@n1", 4194304, NOW + 100) };
  assert.deepEqual(res, expected);
  // Repeated: found in the catalog, not taken again.
  const mark = h.mark();
  assert.deepEqual(await h.controller.CreateSnapshot(snapshotReq("v1@n1", "s1")), expected);
  assert.deepEqual(h.since(mark), [catalog(2)]);
});

Deno.test("ControllerService.CreateSnapshot encodes names and answers them decoded", async () => {
  using h = setup();
  addVolume(h.host, "db:5b0:5d");
  const res = await h.controller.CreateSnapshot(snapshotReq("db[0]", "nightly 1"));
  assert.deepEqual(h.runner.argvs[1], ["zfs", "snapshot", "tank/nomad/db:5b0:5d@nightly:201"]);
  assert.deepEqual(res, {
    snapshot: snapshotMessage("db[0]@nightly 1@n1", "db[0]@n1", 98304, NOW + 100),
  });
});

Deno.test("ControllerService.CreateSnapshot answers ALREADY_EXISTS for the same name on another volume", async () => {
  using h = setup();
  addVolume(h.host, "v1");
  addVolume(h.host, "v2");
  h.host.addSnapshot("tank/nomad/v1@s1");
  await assertRejectsCsi(
    h.controller.CreateSnapshot(snapshotReq("v2@n1", "s1")),
    Code.ALREADY_EXISTS,
    'A snapshot named "s1" already exists, of another volume ("v1@n1")',
  );
  assert.deepEqual(h.runner.argvs, [catalog(2)]);
});

Deno.test("ControllerService.CreateSnapshot shortens a name that does not fit, keeps it idempotent and unique across volumes", async () => {
  using h = setup();
  const long = "v".repeat(51);
  addVolume(h.host, long);
  addVolume(h.host, "v2");
  const name = "s".repeat(128);
  const res = await h.controller.CreateSnapshot(snapshotReq(`${long}@n1`, name)) as {
    snapshot: { snapshot_id: string };
  };
  const id = res.snapshot.snapshot_id;
  assert.equal(new TextEncoder().encode(id).length, 128);
  const component = id.split("@")[1]!;
  assert.match(component, /^s+\.\.[0-9a-f]{16}$/);
  assert.deepEqual(h.runner.argvs[1], ["zfs", "snapshot", `tank/nomad/${long}@${component}`]);
  assert.deepEqual(await h.controller.CreateSnapshot(snapshotReq(`${long}@n1`, name)), res);
  // On a volume with a short name the same name fits as it is; it is still the same name.
  await assertRejectsCsi(
    h.controller.CreateSnapshot(snapshotReq("v2@n1", name)),
    Code.ALREADY_EXISTS,
    new RegExp(`already exists, of another volume \\("${long}@n1"\\)`),
  );
});

Deno.test("ControllerService.CreateSnapshot answers NOT_FOUND for a missing source and FAILED_PRECONDITION for a foreign one", async () => {
  using h = setup();
  h.host.addFilesystem("tank/nomad/legacy", { managed: false });
  const cases = [
    ["v9@n1", "tank/nomad/v9", Code.NOT_FOUND, 'Source volume "v9@n1" not found'],
    ["legacy", "tank/nomad/legacy", Code.FAILED_PRECONDITION, /not managed by zfs-csi/],
  ] as const;
  for (const [source, dataset, code, message] of cases) {
    const mark = h.mark();
    await assertRejectsCsi(h.controller.CreateSnapshot(snapshotReq(source, "s1")), code, message);
    assert.deepEqual(h.since(mark), [
      catalog(2),
      getProps("type,org.zfs-csi:managed", dataset),
    ], source);
  }
});

Deno.test("ControllerService.CreateSnapshot refuses a missing name or parameters before any zfs call", async () => {
  using h = setup();
  const cases: [CreateSnapshotRequest, GrpcCode, string | RegExp][] = [
    [snapshotReq("v1@n1", ""), Code.INVALID_ARGUMENT, "name is required"],
    [snapshotReq("", "s1"), Code.INVALID_ARGUMENT, "source_volume_id is required"],
    [
      snapshotReq("v1@n1", "s1", { parameters: { foo: "bar" } }),
      Code.INVALID_ARGUMENT,
      'Snapshot parameter "foo" is not supported (only "store": "true" or "false")',
    ],
    [snapshotReq("v1@n2", "s1"), Code.FAILED_PRECONDITION, /lives on node "n2"/],
  ];
  for (const [req, code, message] of cases) {
    await assertRejectsCsi(h.controller.CreateSnapshot(req), code, message);
  }
  assert.equal(h.runner.calls.length, 0);
});

// ---------------------------------------------------------------------------------------------
// DeleteSnapshot

Deno.test("ControllerService.DeleteSnapshot of an id this plugin never makes succeeds without a zfs call", async () => {
  using h = setup();
  for (const id of ["reallyfakesnapshotid", "a@b@c@d", "@s1", "v1@"]) {
    assert.deepEqual(await h.controller.DeleteSnapshot(snapshotRef(id)), {}, id);
  }
  assert.equal(h.runner.calls.length, 0);
});

Deno.test("ControllerService.DeleteSnapshot of a missing snapshot succeeds without a destructive call", async () => {
  using h = setup();
  addVolume(h.host, "v1");
  assert.deepEqual(await h.controller.DeleteSnapshot(snapshotRef("v1@s1@n1")), {});
  assert.deepEqual(await h.controller.DeleteSnapshot(snapshotRef("v9@s1@n1")), {});
  assert.deepEqual(h.runner.argvs, [
    snapshotTree("tank/nomad/v1"),
    snapshotTree("tank/nomad/v9"),
  ]);
});

Deno.test("ControllerService.DeleteSnapshot never reaches a hidden snapshot through a snapshot id", async () => {
  using h = setup();
  addVolume(h.host, "v1");
  const hidden = "tank/nomad/v1@.clone-0123456789abcdef";
  h.host.addSnapshot(hidden);
  assert.deepEqual(
    await h.controller.DeleteSnapshot(snapshotRef("v1@.clone-0123456789abcdef@n1")),
    {},
  );
  assert.deepEqual(h.runner.argvs, [snapshotTree("tank/nomad/v1")]);
  assert.ok(h.host.has(hidden));
});

Deno.test("ControllerService.DeleteSnapshot with a retention renames the snapshot aside", async () => {
  using h = withSnapshot("1h");
  assert.deepEqual(await h.controller.DeleteSnapshot(snapshotRef("v1@s1@n1")), {});
  assert.deepEqual(h.runner.argvs, [
    snapshotTree("tank/nomad/v1"),
    ["zfs", "rename", "tank/nomad/v1@s1", `tank/nomad/v1@.deleted-${NOW}-s1`],
    ...snapshotMarks("tank/nomad/v1@s1", `tank/nomad/v1@.deleted-${NOW}-s1`),
  ]);
  assert.ok(h.host.has(`tank/nomad/v1@.deleted-${NOW}-s1`));
  // Gone from the listing, and the volume can now be deleted.
  assert.deepEqual(await h.controller.ListSnapshots(listSnapshotsReq()), EMPTY_PAGE);
});

Deno.test("ControllerService.DeleteSnapshot with retention 0 destroys the snapshot", async () => {
  using h = withSnapshot("0");
  assert.deepEqual(await h.controller.DeleteSnapshot(snapshotRef("v1@s1")), {});
  assert.deepEqual(h.runner.argvs, [
    snapshotTree("tank/nomad/v1"),
    ["zfs", "destroy", "tank/nomad/v1@s1"],
  ]);
  assert.ok(!h.host.has("tank/nomad/v1@s1"));
});

Deno.test("ControllerService.DeleteSnapshot with retention 0 sets aside a snapshot clones depend on, for deferred destroy", async () => {
  using h = withSnapshot("0");
  await h.controller.CreateVolume(cloneReq("v2", fromSnapshot("v1@s1@n1")));
  const mark = h.mark();
  assert.deepEqual(await h.controller.DeleteSnapshot(snapshotRef("v1@s1@n1")), {});
  const hidden = `tank/nomad/v1@.deleted-${NOW}-s1`;
  assert.deepEqual(h.since(mark), [
    snapshotTree("tank/nomad/v1"),
    ["zfs", "destroy", "tank/nomad/v1@s1"],
    ["zfs", "rename", "tank/nomad/v1@s1", hidden],
    ...snapshotMarks("tank/nomad/v1@s1", hidden),
    ["zfs", "destroy", "-d", hidden],
  ]);
  assert.equal(h.host.value(hidden, "defer_destroy"), "on");
  assert.equal(h.host.value("tank/nomad/v2", "origin"), hidden);
});

Deno.test("ControllerService.DeleteSnapshot of a snapshot of a foreign dataset answers FAILED_PRECONDITION", async () => {
  using h = setup();
  h.host.addFilesystem("tank/nomad/legacy", { managed: false });
  h.host.addSnapshot("tank/nomad/legacy@s1");
  await assertRejectsCsi(
    h.controller.DeleteSnapshot(snapshotRef("legacy@s1@n1")),
    Code.FAILED_PRECONDITION,
    /not managed by zfs-csi/,
  );
  assert.deepEqual(h.runner.argvs, [snapshotTree("tank/nomad/legacy")]);
});

// ---------------------------------------------------------------------------------------------
// ListVolumes

/** Volumes, a clone, a foreign dataset, a hidden one and snapshots below the parent. */
function populate(host: FakeZfs): void {
  addVolume(host, "v1", { parameters: '{"compression":"lz4"}', props: { compression: "lz4" } });
  addVolume(host, "db:5b0:5d", { refquota: 1024 * MiB });
  host.addSnapshot("tank/nomad/v1@s1", { referenced: "4096", creation: String(NOW - 50) });
  host.clock = NOW - 40;
  host.addSnapshot("tank/nomad/v1@s2");
  host.addSnapshot("tank/nomad/v1@.clone-0123456789abcdef");
  host.addSnapshot(`tank/nomad/v1@.deleted-${NOW - 10}-s0`);
  addVolume(host, "v2", {
    refquota: 32 * MiB,
    props: { origin: "tank/nomad/v1@s1", [SOURCE]: "snapshot:v1@s1@n1" },
  });
  host.addSnapshot("tank/nomad/v2@s3", { referenced: "8192", creation: String(NOW - 30) });
  host.addFilesystem("tank/nomad/legacy", { managed: false });
  host.addSnapshot("tank/nomad/legacy@s9");
  host.addFilesystem(`tank/nomad/.deleted-${NOW - 10}-v0`, { mounted: false });
  host.addSnapshot(`tank/nomad/.deleted-${NOW - 10}-v0@s5`);
  host.addFilesystem("tank/nomad/v1/child");
}

Deno.test("ControllerService.ListVolumes lists our volumes from one zfs call, without hidden or foreign datasets", async () => {
  using h = populated();
  const res = await h.controller.ListVolumes(listVolumesReq());
  assert.deepEqual(h.runner.argvs, [catalog(1)]);
  assert.deepEqual(res, {
    entries: [
      { volume: volumeMessage("db[0]@n1", "tank/nomad/db:5b0:5d", 1024 * MiB), status: HEALTHY },
      { volume: volumeMessage("v1@n1", "tank/nomad/v1", 64 * MiB), status: HEALTHY },
      {
        volume: volumeMessage("v2@n1", "tank/nomad/v2", 32 * MiB, fromSnapshot("v1@s1@n1")),
        status: HEALTHY,
      },
    ],
    next_token: "",
  });
});

Deno.test("ControllerService.ListVolumes pages with tokens, one zfs call per page", async () => {
  using h = populated();
  const first = await h.controller.ListVolumes(listVolumesReq({ max_entries: 2 })) as {
    entries: { volume: { volume_id: string } }[];
    next_token: string;
  };
  assert.deepEqual(first.entries.map((e) => e.volume.volume_id), ["db[0]@n1", "v1@n1"]);
  assert.notEqual(first.next_token, "");
  const second = await h.controller.ListVolumes(
    listVolumesReq({ max_entries: 2, starting_token: first.next_token }),
  ) as typeof first;
  assert.deepEqual(second.entries.map((e) => e.volume.volume_id), ["v2@n1"]);
  assert.equal(second.next_token, "");
  assert.deepEqual(h.runner.argvs, [catalog(1), catalog(1)]);
});

Deno.test("ControllerService.ListVolumes answers ABORTED for a token it did not make", async () => {
  using h = populated();
  await assertRejectsCsi(
    h.controller.ListVolumes(listVolumesReq({ starting_token: "garbage" })),
    Code.ABORTED,
    /starting_token "garbage" is not valid/,
  );
  await assertRejectsCsi(
    h.controller.ListVolumes(listVolumesReq({ max_entries: -1 })),
    Code.INVALID_ARGUMENT,
  );
});

Deno.test("ControllerService.ListVolumes and ListSnapshots run one zfs process however many datasets there are", async () => {
  using h = setup();
  for (let i = 0; i < 300; i++) {
    const name = `vol-${String(i).padStart(3, "0")}`;
    addVolume(h.host, name);
    h.host.addSnapshot(`tank/nomad/${name}@a${i}`);
    h.host.addSnapshot(`tank/nomad/${name}@b${i}`);
  }
  const volumes = await h.controller.ListVolumes(listVolumesReq()) as { entries: unknown[] };
  assert.equal(volumes.entries.length, 300);
  assert.deepEqual(h.runner.argvs, [catalog(1)]);
  const snapshots = await h.controller.ListSnapshots(listSnapshotsReq()) as { entries: unknown[] };
  assert.equal(snapshots.entries.length, 600);
  assert.deepEqual(h.runner.argvs, [catalog(1), catalog(2)]);
  // Paging through them costs one process per page.
  let token = "";
  let pages = 0;
  const mark = h.mark();
  do {
    const page = await h.controller.ListSnapshots(
      listSnapshotsReq({ max_entries: 250, starting_token: token }),
    ) as { entries: unknown[]; next_token: string };
    token = page.next_token;
    pages++;
  } while (token !== "");
  assert.equal(pages, 3);
  assert.deepEqual(h.since(mark), [catalog(2), catalog(2), catalog(2)]);
});

Deno.test("ControllerService.ListVolumes reports an abnormal condition when the storage is unhealthy", async () => {
  using h = setup({
    before: (runner) =>
      runner.onExact(["zpool", "list", "-H", "-o", "name,health", "tank"], {
        stdout: "tank\tDEGRADED\n",
      }),
  });
  addVolume(h.host, "v1");
  await h.health.refresh();
  const res = await h.controller.ListVolumes(listVolumesReq()) as {
    entries: { status: unknown }[];
  };
  assert.deepEqual(res.entries[0]!.status, {
    published_node_ids: [],
    volume_condition: { abnormal: true, message: "pool is DEGRADED" },
  });
});

// ---------------------------------------------------------------------------------------------
// ListSnapshots

Deno.test("ControllerService.ListSnapshots lists CSI snapshots from one zfs call, without hidden or foreign ones", async () => {
  using h = populated();
  const res = await h.controller.ListSnapshots(listSnapshotsReq());
  assert.deepEqual(h.runner.argvs, [catalog(2)]);
  assert.deepEqual(res, {
    entries: [
      { snapshot: snapshotMessage("v1@s1@n1", "v1@n1", 4096, NOW - 50) },
      { snapshot: snapshotMessage("v1@s2@n1", "v1@n1", 98304, NOW - 40) },
      { snapshot: snapshotMessage("v2@s3@n1", "v2@n1", 8192, NOW - 30) },
    ],
    next_token: "",
  });
});

Deno.test("ControllerService.ListSnapshots filters by snapshot id and by source volume", async () => {
  using h = populated();
  const ids = async (over: Partial<ListSnapshotsRequest>) =>
    ((await h.controller.ListSnapshots(listSnapshotsReq(over))) as {
      entries: { snapshot: { snapshot_id: string } }[];
    }).entries.map((e) => e.snapshot.snapshot_id);
  assert.deepEqual(await ids({ snapshot_id: "v1@s2@n1" }), ["v1@s2@n1"]);
  assert.deepEqual(await ids({ snapshot_id: "v1@s2" }), ["v1@s2@n1"]);
  assert.deepEqual(await ids({ source_volume_id: "v1@n1" }), ["v1@s1@n1", "v1@s2@n1"]);
  assert.deepEqual(await ids({ source_volume_id: "v2@n1", snapshot_id: "v1@s1@n1" }), []);
  assert.deepEqual(await ids({ snapshot_id: "v1@nosuch@n1" }), []);
  assert.deepEqual(await ids({ snapshot_id: "legacy@s9@n1" }), []);
  assert.equal(h.runner.calls.length, 6);
});

Deno.test("ControllerService.ListSnapshots answers an empty list without a zfs call for ids that cannot be here", async () => {
  using h = populated();
  const cases: Partial<ListSnapshotsRequest>[] = [
    { snapshot_id: "reallyfakesnapshotid" },
    { snapshot_id: "v1@s1@n2" },
    { snapshot_id: "v1@s1@bad node" },
    { source_volume_id: "v1@n2" },
    { source_volume_id: "a@b@c" },
    { source_volume_id: "a/b" },
  ];
  for (const over of cases) {
    assert.deepEqual(
      await h.controller.ListSnapshots(listSnapshotsReq(over)),
      EMPTY_PAGE,
      JSON.stringify(over),
    );
  }
  assert.equal(h.runner.calls.length, 0);
});

Deno.test("ControllerService.ListSnapshots pages with tokens and answers ABORTED for a bad one", async () => {
  using h = populated();
  type Page = { entries: { snapshot: { snapshot_id: string } }[]; next_token: string };
  const first = await h.controller.ListSnapshots(listSnapshotsReq({ max_entries: 2 })) as Page;
  assert.deepEqual(first.entries.map((e) => e.snapshot.snapshot_id), ["v1@s1@n1", "v1@s2@n1"]);
  const second = await h.controller.ListSnapshots(
    listSnapshotsReq({ max_entries: 2, starting_token: first.next_token }),
  ) as Page;
  assert.deepEqual(second.entries.map((e) => e.snapshot.snapshot_id), ["v2@s3@n1"]);
  assert.equal(second.next_token, "");
  await assertRejectsCsi(
    h.controller.ListSnapshots(listSnapshotsReq({ starting_token: "after:!!" })),
    Code.ABORTED,
  );
});

// ---------------------------------------------------------------------------------------------
// ControllerGetVolume

Deno.test("ControllerService.ControllerGetVolume answers the volume and NOT_FOUND for a missing or foreign one", async () => {
  using h = populated();
  assert.deepEqual(await h.controller.ControllerGetVolume({ volume_id: "v1@n1" }), {
    volume: volumeMessage("v1@n1", "tank/nomad/v1", 64 * MiB),
    status: HEALTHY,
  });
  assert.deepEqual(h.runner.argvs, [getState("tank/nomad/v1")]);
  for (const volume_id of ["v9@n1", "legacy"]) {
    await assertRejectsCsi(
      h.controller.ControllerGetVolume({ volume_id }),
      Code.NOT_FOUND,
      `Volume "${volume_id}" not found`,
    );
  }
});

// ---------------------------------------------------------------------------------------------
// ControllerExpandVolume

Deno.test("ControllerService.ControllerExpandVolume sets quota, refquota and refreservation=capacity in one zfs set; a repeat sets nothing", async () => {
  using h = setup();
  addVolume(h.host, "v1", {
    parameters: '{"quota":"capacity","refreservation":"capacity"}',
    props: { quota: String(64 * MiB), refreservation: String(64 * MiB) },
  });
  const res = await h.controller.ControllerExpandVolume(expandReq("v1@n1", 128 * MiB));
  assert.deepEqual(h.runner.argvs, [
    getState("tank/nomad/v1"),
    [
      "zfs",
      "set",
      `quota=${128 * MiB}`,
      `refquota=${128 * MiB}`,
      `refreservation=${128 * MiB}`,
      "tank/nomad/v1",
    ],
  ]);
  assert.deepEqual(res, expanded(128 * MiB));
  // Repeated: already that size and shape, nothing set.
  const mark = h.mark();
  assert.deepEqual(await h.controller.ControllerExpandVolume(expandReq("v1@n1", 128 * MiB)), res);
  assert.deepEqual(h.since(mark), [getState("tank/nomad/v1")]);
});

Deno.test("ControllerService.ControllerExpandVolume finishes on retry what a refused zfs set left undone", async () => {
  // OpenZFS sets what it can of a `zfs set`: here quota and refquota, not the reservation.
  const noRoom = "cannot set property for 'tank/nomad/v1': size is greater than available space\n";
  using h = setup({
    before: (runner, host) =>
      runner.when((argv) => argv[1] === "set", (argv) => {
        host().set(["zfs", "set", ...argv.slice(2, -2), argv.at(-1)!]);
        return fails(noRoom);
      }, { times: 1 }),
  });
  addVolume(h.host, "v1", {
    parameters: '{"quota":"capacity","refreservation":"capacity"}',
    props: { quota: String(64 * MiB), refreservation: String(64 * MiB) },
  });
  assert.deepEqual(
    toGrpcStatus(
      await rejected(h.controller.ControllerExpandVolume(expandReq("v1@n1", 128 * MiB))),
    ),
    {
      code: Code.RESOURCE_EXHAUSTED,
      details: `ZFS operation "zfs set" failed (no space): ${noRoom.trim()}`,
    },
  );
  assert.equal(h.host.value("tank/nomad/v1", "refquota"), String(128 * MiB));
  assert.equal(h.host.value("tank/nomad/v1", "refreservation"), String(64 * MiB));
  // The retry finds the capacity reached and sets the reservation still missing, nothing more.
  const mark = h.mark();
  assert.deepEqual(
    await h.controller.ControllerExpandVolume(expandReq("v1@n1", 128 * MiB)),
    expanded(128 * MiB),
  );
  assert.deepEqual(h.since(mark), [
    getState("tank/nomad/v1"),
    ["zfs", "set", `refreservation=${128 * MiB}`, "tank/nomad/v1"],
  ]);
  assert.equal(h.host.value("tank/nomad/v1", "quota"), String(128 * MiB));
});

Deno.test("ControllerService.ControllerExpandVolume keeps a fixed quota and refuses to grow past it", async () => {
  using h = setup();
  addVolume(h.host, "v1", {
    parameters: '{"quota":"96MiB"}',
    // Moved by hand (or by an older plugin's interrupted expansion): put back.
    props: { quota: String(160 * MiB) },
  });
  assert.deepEqual(
    await h.controller.ControllerExpandVolume(expandReq("v1@n1", 80 * MiB)),
    expanded(80 * MiB),
  );
  assert.deepEqual(h.runner.argvs, [
    getState("tank/nomad/v1"),
    ["zfs", "set", `refquota=${80 * MiB}`, `quota=${96 * MiB}`, "tank/nomad/v1"],
  ]);
  const mark = h.mark();
  await assertRejectsCsi(
    h.controller.ControllerExpandVolume(expandReq("v1@n1", 128 * MiB)),
    Code.OUT_OF_RANGE,
    /^Volume "v1@n1" cannot grow to 134217728 bytes: it was created with quota=100663296 bytes/,
  );
  assert.deepEqual(h.since(mark), [getState("tank/nomad/v1")]);
});

Deno.test("ControllerService.ControllerExpandVolume with a fixed refreservation sets refquota only", async () => {
  using h = setup();
  addVolume(h.host, "v1", {
    parameters: '{"refreservation":"1MiB"}',
    props: { refreservation: String(MiB) },
  });
  const res = await h.controller.ControllerExpandVolume(
    expandReq("v1@n1", 100 * MiB, 200 * MiB),
  );
  assert.deepEqual(h.runner.argvs, [
    getState("tank/nomad/v1"),
    ["zfs", "set", `refquota=${100 * MiB}`, "tank/nomad/v1"],
  ]);
  assert.deepEqual(res, expanded(100 * MiB));
});

Deno.test("ControllerService.ControllerExpandVolume never shrinks", async () => {
  using h = setup();
  addVolume(h.host, "v1");
  await assertRejectsCsi(
    h.controller.ControllerExpandVolume(expandReq("v1@n1", 0, 32 * MiB)),
    Code.OUT_OF_RANGE,
    'Volume "v1@n1" has 67108864 bytes; shrinking to 33554432 is not supported',
  );
  // A smaller request is met by the current size.
  assert.deepEqual(
    await h.controller.ControllerExpandVolume(expandReq("v1@n1", 32 * MiB)),
    expanded(64 * MiB),
  );
  assert.deepEqual(h.runner.argvs, [getState("tank/nomad/v1"), getState("tank/nomad/v1")]);
  assert.equal(h.host.value("tank/nomad/v1", "refquota"), String(64 * MiB));
});

Deno.test("ControllerService.ControllerExpandVolume of an unlimited volume sets nothing", async () => {
  using h = setup();
  addVolume(h.host, "v1", { refquota: 0 });
  assert.deepEqual(
    await h.controller.ControllerExpandVolume(expandReq("v1@n1", 128 * MiB)),
    expanded(128 * MiB),
  );
  assert.deepEqual(h.runner.argvs, [getState("tank/nomad/v1")]);
});

Deno.test("ControllerService.ControllerExpandVolume answers NOT_FOUND, FAILED_PRECONDITION and INVALID_ARGUMENT", async () => {
  using h = setup();
  h.host.addFilesystem("tank/nomad/legacy", { managed: false });
  const refused = (req: ControllerExpandVolumeRequest, code: GrpcCode, message: string | RegExp) =>
    assertRejectsCsi(h.controller.ControllerExpandVolume(req), code, message);
  await refused(expandReq("v9@n1", 128 * MiB), Code.NOT_FOUND, 'Volume "v9@n1" not found');
  await refused(expandReq("legacy", 128 * MiB), Code.FAILED_PRECONDITION, /not managed by zfs-csi/);
  // Refused before any zfs call.
  const mark = h.mark();
  await refused(
    expandReq("v1@n1", 0, 0, { capacity_range: null }),
    Code.INVALID_ARGUMENT,
    "capacity_range is required",
  );
  await refused(
    expandReq("v1@n1", 128 * MiB, 0, { volume_capability: blockCap() }),
    Code.INVALID_ARGUMENT,
    /Block volumes are not supported/,
  );
  await refused(expandReq("v1@n2", 128 * MiB), Code.FAILED_PRECONDITION, /lives on node "n2"/);
  assert.deepEqual(h.since(mark), []);
});

// ---------------------------------------------------------------------------------------------
// ValidateVolumeCapabilities

Deno.test("ControllerService.ValidateVolumeCapabilities answers NOT_FOUND for a missing volume", async () => {
  using h = setup();
  await assertRejectsCsi(
    h.controller.ValidateVolumeCapabilities(validateReq("v9@n1")),
    Code.NOT_FOUND,
    'Volume "v9@n1" not found',
  );
  assert.deepEqual(h.runner.argvs, [getState("tank/nomad/v9")]);
});

Deno.test("ControllerService.ValidateVolumeCapabilities confirms mount capabilities as plain objects", async () => {
  using h = setup();
  addVolume(h.host, "v1");
  const res = await h.controller.ValidateVolumeCapabilities(validateReq("v1@n1", {
    volume_context: { dataset: "tank/nomad/v1" },
    volume_capabilities: [
      { ...fsCap("SINGLE_NODE_WRITER", ["noatime"]), block: null },
      fsCap("MULTI_NODE_READER_ONLY"),
    ],
    parameters: { compression: "lz4" },
  })) as { confirmed: { volume_capabilities: Record<string, unknown>[] } };
  assert.deepEqual(res, {
    confirmed: {
      volume_context: { dataset: "tank/nomad/v1" },
      volume_capabilities: [
        {
          access_mode: { mode: "SINGLE_NODE_WRITER" },
          mount: { fs_type: "", mount_flags: ["noatime"], volume_mount_group: "" },
        },
        {
          access_mode: { mode: "MULTI_NODE_READER_ONLY" },
          mount: { fs_type: "", mount_flags: [], volume_mount_group: "" },
        },
      ],
      parameters: { compression: "lz4" },
    },
  });
  for (const cap of res.confirmed.volume_capabilities) {
    assert.equal(Object.getPrototypeOf(cap), Object.prototype);
    assert.ok(!("block" in cap) && !("access_type" in cap), JSON.stringify(cap));
  }
  assert.deepEqual(h.runner.argvs, [getState("tank/nomad/v1")]);
});

Deno.test("ControllerService.ValidateVolumeCapabilities answers a message and no confirmation for block or unknown parameters", async () => {
  using h = setup();
  addVolume(h.host, "v1");
  const block = await h.controller.ValidateVolumeCapabilities(
    validateReq("v1@n1", { volume_capabilities: [fsCap(), blockCap()] }),
  ) as Record<string, unknown>;
  assert.match(String(block.message), /Block volumes are not supported/);
  assert.ok(!("confirmed" in block));
  const param = await h.controller.ValidateVolumeCapabilities(
    validateReq("v1@n1", { parameters: { mountpoint: "/etc" } }),
  ) as Record<string, unknown>;
  assert.deepEqual(param, {
    message: 'Parameter "mountpoint" is not supported; use ZFS properties such as compression, ' +
      "recordsize, atime, quota or a user property (module:name)",
  });
});

Deno.test("ControllerService.ValidateVolumeCapabilities answers INVALID_ARGUMENT for no capabilities or an unknown context key", async () => {
  using h = setup();
  addVolume(h.host, "v1");
  await assertRejectsCsi(
    h.controller.ValidateVolumeCapabilities(validateReq("v1@n1", { volume_capabilities: [] })),
    Code.INVALID_ARGUMENT,
    "volume_capabilities is required",
  );
  await assertRejectsCsi(
    h.controller.ValidateVolumeCapabilities(validateReq("v1@n1", { volume_context: { x: "1" } })),
    Code.INVALID_ARGUMENT,
    /volume_context key "x" is not known/,
  );
  assert.equal(h.runner.calls.length, 0);
});

// ---------------------------------------------------------------------------------------------
// GetCapacity

Deno.test("ControllerService.GetCapacity answers the parent's available space with Int64Value size limits", async () => {
  using h = setup();
  const expected = {
    available_capacity: "1073643520",
    maximum_volume_size: { value: "1073643520" },
    minimum_volume_size: { value: String(MIN_VOLUME_BYTES) },
  };
  assert.deepEqual(
    await h.controller.GetCapacity(
      capacityReq({ volume_capabilities: [fsCap()], parameters: { compression: "lz4" } }),
    ),
    expected,
  );
  assert.deepEqual(
    await h.controller.GetCapacity(capacityReq({ accessible_topology: { segments: TOPOLOGY } })),
    expected,
  );
  assert.deepEqual(h.runner.argvs, [
    getProps("available", "tank/nomad"),
    getProps("available", "tank/nomad"),
  ]);
});

Deno.test("ControllerService.GetCapacity answers 0 for another node's topology or a block capability", async () => {
  using h = setup();
  const none = {
    available_capacity: "0",
    minimum_volume_size: { value: String(MIN_VOLUME_BYTES) },
  };
  assert.deepEqual(
    await h.controller.GetCapacity(
      capacityReq({ accessible_topology: { segments: { "org.zfs-csi/node": "n2" } } }),
    ),
    none,
  );
  assert.deepEqual(
    await h.controller.GetCapacity(capacityReq({ volume_capabilities: [blockCap()] })),
    none,
  );
  assert.equal(h.runner.calls.length, 0);
});

Deno.test("ControllerService.GetCapacity answers FAILED_PRECONDITION when the parent dataset is missing", async () => {
  using h = setup();
  h.host.objects.delete(PARENT);
  await assertRejectsCsi(
    h.controller.GetCapacity(capacityReq()),
    Code.FAILED_PRECONDITION,
    'Parent dataset "tank/nomad" does not exist',
  );
});
