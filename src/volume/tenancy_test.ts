import assert from "node:assert/strict";
import { Code } from "../errors.ts";
import { NAME_PROPERTY, STAGED_PROPERTY } from "../zfs/names.ts";
import type { PropertyMap } from "../zfs/parse.ts";
import { fittedVolumeName } from "../zfs/fit.ts";
import { assertRejectsCsi, assertThrowsCsi } from "../../tests/support/assert_errors.ts";
import { fails, type FakeResponse, type FakeRunner } from "../../tests/support/fake_runner.ts";
import {
  fakeController,
  fakeNode,
  fakeServices,
  fsCap,
} from "../../tests/support/service_harness.ts";
import type { ControllerService } from "../csi/controller.ts";
import {
  checkRecordedName,
  checkRetry,
  recordedName,
  RETRY_WINDOW_SECONDS,
  stagedAt,
} from "./tenancy.ts";
import type { CreateVolumeRequest, VolumeContentSource } from "../csi/types.ts";

const PARENT = "tank/nomad";
const MiB = 1024 * 1024;
/** 2025-06-01T10:00:00Z */
const T0 = 1_748_772_000;

// ---------------------------------------------------------------------------------------------
// The rule, on properties

type Props = Record<string, string | [string, string]>;

/** A property map: a value is set locally unless given as [value, source]. */
function props(p: Props): PropertyMap {
  return new Map(
    Object.entries(p).map(([k, v]) => {
      const [value, source] = typeof v === "string" ? [v, "local"] : v;
      return [k, { value, source }];
    }),
  );
}

const fresh = (over: Props = {}) =>
  props({ creation: [String(T0), "-"], [NAME_PROPERTY]: "postgres", ...over });

Deno.test("checkRetry takes a repeat for a retry while the volume is new, unstaged and named", () => {
  checkRetry("postgres@node-a", "postgres", fresh(), T0);
  checkRetry("postgres@node-a", "postgres", fresh(), T0 + RETRY_WINDOW_SECONDS - 1);
  // A clock that went back a little does not make the volume old.
  checkRetry("postgres@node-a", "postgres", fresh(), T0 - 30);
  assert.equal(RETRY_WINDOW_SECONDS, 600);
});

Deno.test("checkRetry refuses a volume that was staged, naming when and what to do", () => {
  assertThrowsCsi(
    () =>
      checkRetry(
        "postgres@node-a",
        "postgres",
        fresh({ [STAGED_PROPERTY]: String(T0 + 60) }),
        T0 + 61,
      ),
    Code.ALREADY_EXISTS,
    'Volume "postgres@node-a" already exists: created 2025-06-01T10:00:00Z and staged since ' +
      "2025-06-01T10:01:00Z, so it holds data; a CreateVolume of its name is a retry only " +
      "within 10 minutes of its creation and before it is staged. Nomad sends the plugin only " +
      "a volume's name, not its id or namespace, so give each volume a name of its own across " +
      'all namespaces (e.g. "postgres-prod" rather than "postgres")',
  );
  // Whatever the marker holds, it marks the volume as used.
  assertThrowsCsi(
    () => checkRetry("v@n", "v", fresh({ [STAGED_PROPERTY]: "yes" }), T0),
    Code.ALREADY_EXISTS,
    /staged since unknown/,
  );
});

Deno.test("checkRetry refuses a volume created more than the window ago, even unstaged", () => {
  assertThrowsCsi(
    () => checkRetry("postgres@node-a", "postgres", fresh(), T0 + RETRY_WINDOW_SECONDS),
    Code.ALREADY_EXISTS,
    /^Volume "postgres@node-a" already exists: created 2025-06-01T10:00:00Z, more than 10 minutes ago \(never staged\); .* \(e\.g\. "postgres-prod" rather than "postgres"\)$/,
  );
  assertThrowsCsi(
    () => checkRetry("v@n", "v", props({ [NAME_PROPERTY]: "v" }), T0),
    Code.ALREADY_EXISTS,
    /created unknown, more than 10 minutes ago/,
  );
});

Deno.test("checkRetry refuses a volume made before names were recorded, however new", () => {
  assertThrowsCsi(
    () => checkRetry("postgres@node-a", "postgres", props({ creation: [String(T0), "-"] }), T0),
    Code.ALREADY_EXISTS,
    /^Volume "postgres@node-a" already exists: created 2025-06-01T10:00:00Z by an earlier zfs-csi, which did not record the name asked for/,
  );
});

Deno.test("stagedAt and recordedName read only values set on the dataset itself", () => {
  assert.equal(stagedAt(props({ [STAGED_PROPERTY]: "1748772060" })), 1748772060);
  assert.equal(stagedAt(props({ [STAGED_PROPERTY]: ["-", "-"] })), undefined);
  assert.equal(stagedAt(props({})), undefined);
  // Set on the parent and inherited: says nothing about this volume.
  const inherited = props({
    [STAGED_PROPERTY]: ["1748772060", "inherited from tank/nomad"],
    [NAME_PROPERTY]: ["postgres", "inherited from tank/nomad"],
  });
  assert.equal(stagedAt(inherited), undefined);
  assert.equal(recordedName(inherited), undefined);
  // Received with zfs receive: still the volume's own.
  assert.equal(recordedName(props({ [NAME_PROPERTY]: ["pg", "received"] })), "pg");
});

Deno.test("checkRecordedName refuses a dataset made for another name", () => {
  checkRecordedName("a@n", "tank/nomad/a", "a", fresh({ [NAME_PROPERTY]: "a" }));
  checkRecordedName("a@n", "tank/nomad/a", "a", props({}));
  assertThrowsCsi(
    () =>
      checkRecordedName(
        "a..0123456789abcdef@n",
        "tank/nomad/a..0123456789abcdef",
        "ab",
        fresh({ [NAME_PROPERTY]: "ac" }),
      ),
    Code.ALREADY_EXISTS,
    'Volume "a..0123456789abcdef@n" already exists for another name: dataset ' +
      '"tank/nomad/a..0123456789abcdef" was created for "ac", not "ab"; choose another name',
  );
});

// ---------------------------------------------------------------------------------------------
// A small fake zfs: datasets with properties that get, create, set and snapshot see and change

interface Prop {
  value: string;
  source: string;
}

class FakeZfs {
  readonly objects = new Map<string, Map<string, Prop>>();
  /** The time zfs stamps on what it creates. */
  now = T0;

  constructor(runner: FakeRunner) {
    runner
      .on(["zfs", "get"], (argv) => this.get(argv))
      .on(["zfs", "create"], (argv) => this.create(argv))
      .on(["zfs", "set"], (argv) => this.set(argv))
      .onExact(["mount"], () => ({ stdout: "" }));
  }

  add(name: string, p: Record<string, string> = {}, type = "filesystem"): void {
    const m = new Map<string, Prop>([
      ["type", { value: type, source: "-" }],
      ["creation", { value: String(this.now), source: "-" }],
      ["referenced", { value: "98304", source: "-" }],
      ["mountpoint", { value: `/${name}`, source: "default" }],
    ]);
    for (const [k, v] of Object.entries(p)) m.set(k, { value: v, source: "local" });
    this.objects.set(name, m);
  }

  value(name: string, property: string): string | undefined {
    return this.objects.get(name)?.get(property)?.value;
  }

  get(argv: readonly string[]): FakeResponse {
    const o = argv.indexOf("-o");
    const wanted = argv[o + 2]!.split(",");
    const root = argv[o + 3]!;
    const d = argv.indexOf("-d");
    const depth = d >= 0 ? Number(argv[d + 1]) : 0;
    if (!this.objects.has(root)) return fails(`cannot open '${root}': dataset does not exist\n`);
    const below = (n: string) =>
      n === root ||
      (depth >= 1 && (n.startsWith(`${root}/`) || n.startsWith(`${root}@`)) &&
        n.slice(root.length + 1).split(/[/@]/).length <= depth);
    const lines: string[] = [];
    for (const [name, p] of [...this.objects].filter(([n]) => below(n)).sort()) {
      for (const w of wanted) {
        const v = p.get(w);
        lines.push(`${name}\t${w}\t${v?.value ?? "-"}\t${v?.source ?? "-"}\n`);
      }
    }
    return { stdout: lines.join("") };
  }

  create(argv: readonly string[]): FakeResponse {
    const name = argv.at(-1)!;
    if (this.objects.has(name)) return fails(`cannot create '${name}': dataset already exists\n`);
    const p: Record<string, string> = {};
    for (let i = 2; i < argv.length - 1; i += 2) {
      const kv = argv[i + 1]!;
      p[kv.slice(0, kv.indexOf("="))] = kv.slice(kv.indexOf("=") + 1);
    }
    this.add(name, p);
    return {};
  }

  set(argv: readonly string[]): FakeResponse {
    const kv = argv[2]!;
    const p = this.objects.get(argv[3]!);
    if (!p) return fails(`cannot open '${argv[3]}': dataset does not exist\n`);
    p.set(kv.slice(0, kv.indexOf("=")), { value: kv.slice(kv.indexOf("=") + 1), source: "local" });
    return {};
  }
}

function controllerWith(flags: readonly string[] = []) {
  const parts = fakeServices({
    parent: PARENT,
    flags,
    host: (runner) => {
      const host = new FakeZfs(runner);
      host.add(PARENT);
      return host;
    },
  });
  const controller = fakeController(parts);
  return { ...parts, controller };
}

function createReq(name: string, over: Partial<CreateVolumeRequest> = {}): CreateVolumeRequest {
  return {
    name,
    capacity_range: { required_bytes: String(64 * MiB), limit_bytes: "0" },
    volume_capabilities: [fsCap()],
    parameters: { compression: "on" },
    secrets: {},
    volume_content_source: null,
    accessibility_requirements: null,
    mutable_parameters: {},
    ...over,
  };
}

/** Runs `fn` with Date.now() at `seconds`. */
async function at<T>(seconds: number, fn: () => Promise<T>): Promise<T> {
  const real = Date.now;
  Date.now = () => seconds * 1000;
  try {
    return await fn();
  } finally {
    Date.now = real;
  }
}

/** A volume as this version's CreateVolume leaves it. */
function made(name: string, extra: Record<string, string> = {}): Record<string, string> {
  return {
    "org.zfs-csi:managed": "yes",
    [NAME_PROPERTY]: name,
    "org.zfs-csi:parameters": '{"compression":"on"}',
    compression: "on",
    refquota: String(64 * MiB),
    ...extra,
  };
}

// ---------------------------------------------------------------------------------------------
// CreateVolume: a retry, or a second volume of the same name

Deno.test("CreateVolume records the name asked for on the dataset", async () => {
  const h = controllerWith();
  await at(T0, () => h.controller.CreateVolume(createReq("postgres")));
  assert.deepEqual(h.runner.argvs, [[
    "zfs",
    "create",
    ...["-o", "compression=on", "-o", "org.zfs-csi:managed=yes", "-o", "org.zfs-csi:name=postgres"],
    ...["-o", 'org.zfs-csi:parameters={"compression":"on"}', "-o", "refquota=67108864"],
    "tank/nomad/postgres",
  ]]);
  h.runner.assertNoUnexpected();
});

Deno.test("CreateVolume of a name again: a retry within the window gets the volume; once it was staged, ALREADY_EXISTS", async () => {
  const h = controllerWith();
  const first = await at(T0, () => h.controller.CreateVolume(createReq("postgres")));
  // An operator runs "nomad volume create" again after a failure: the same volume.
  assert.deepEqual(
    await at(T0 + 120, () => h.controller.CreateVolume(createReq("postgres"))),
    first,
  );
  // A job in namespace "staging" stages it (the node marks it) ...
  h.host.objects.get("tank/nomad/postgres")!.set(STAGED_PROPERTY, {
    value: String(T0 + 180),
    source: "local",
  });
  const before = JSON.stringify([...h.host.objects.get("tank/nomad/postgres")!]);
  // ... and "postgres" in namespace "prod", the same spec, comes a minute later.
  await assertRejectsCsi(
    at(T0 + 240, () => h.controller.CreateVolume(createReq("postgres"))),
    Code.ALREADY_EXISTS,
    /^Volume "postgres@n1" already exists: created 2025-06-01T10:00:00Z and staged since 2025-06-01T10:03:00Z, so it holds data; .* give each volume a name of its own across all namespaces \(e\.g\. "postgres-prod" rather than "postgres"\)$/,
  );
  assert.equal(JSON.stringify([...h.host.objects.get("tank/nomad/postgres")!]), before);
  assert.ok(h.logs.some((l) => l.includes("CreateVolume repeated: answered with the volume")));
  h.runner.assertNoUnexpected();
});

Deno.test("CreateVolume of a name again after the window is ALREADY_EXISTS, even unstaged", async () => {
  const h = controllerWith();
  await at(T0, () => h.controller.CreateVolume(createReq("postgres")));
  await at(T0 + RETRY_WINDOW_SECONDS - 1, () => h.controller.CreateVolume(createReq("postgres")));
  await assertRejectsCsi(
    at(T0 + RETRY_WINDOW_SECONDS, () => h.controller.CreateVolume(createReq("postgres"))),
    Code.ALREADY_EXISTS,
    /created 2025-06-01T10:00:00Z, more than 10 minutes ago \(never staged\)/,
  );
});

Deno.test("CreateVolume of a clone again: the same rule, judged before anything is cloned", async () => {
  const h = controllerWith();
  h.host.add("tank/nomad/src", made("src"));
  h.host.add("tank/nomad/src@s1", {}, "snapshot");
  h.host.add("tank/nomad/copy", made("copy", { "org.zfs-csi:source": "snapshot:src@s1@n1" }));
  h.host.objects.get("tank/nomad/copy")!.set(STAGED_PROPERTY, { value: "1", source: "local" });
  const source: VolumeContentSource = { snapshot: { snapshot_id: "src@s1@n1" } };
  await assertRejectsCsi(
    at(T0, () => h.controller.CreateVolume(createReq("copy", { volume_content_source: source }))),
    Code.ALREADY_EXISTS,
    /staged since 1970-01-01T00:00:01Z/,
  );
  assert.ok(h.runner.argvs.every((a) => a[1] === "get"), JSON.stringify(h.runner.argvs));
});

Deno.test("CreateVolume answers ALREADY_EXISTS for a volume made before names were recorded", async () => {
  const h = controllerWith();
  const old = made("postgres");
  delete old[NAME_PROPERTY];
  h.host.add("tank/nomad/postgres", old);
  await assertRejectsCsi(
    at(T0 + 5, () => h.controller.CreateVolume(createReq("postgres"))),
    Code.ALREADY_EXISTS,
    /by an earlier zfs-csi, which did not record the name asked for/,
  );
});

Deno.test("CreateVolume refuses a name equal to another name's shortened form, before any zfs call", async () => {
  const h = controllerWith();
  const long = "postgres-" + "x".repeat(119);
  const res = await at(T0, () => h.controller.CreateVolume(createReq(long))) as {
    volume: { volume_id: string; volume_context: { dataset: string } };
  };
  const short = fittedVolumeName(long, PARENT, "n1");
  assert.match(short, /^postgres-x+\.\.[0-9a-f]{16}$/);
  assert.equal(res.volume.volume_id, `${short}@n1`);
  // The full name is on the dataset.
  assert.equal(h.host.value(`tank/nomad/${short}`, NAME_PROPERTY), long);
  const calls = h.runner.calls.length;
  await assertRejectsCsi(
    at(T0, () => h.controller.CreateVolume(createReq(short))),
    Code.INVALID_ARGUMENT,
    `Volume name "${short}" must not contain ".."`,
  );
  assert.equal(h.runner.calls.length, calls);
  // The long name again is a retry of its own create.
  assert.deepEqual(await at(T0 + 1, () => h.controller.CreateVolume(createReq(long))), res);
});

Deno.test("CreateVolume answers ALREADY_EXISTS when a shortened dataset was made for another name", async () => {
  const h = controllerWith();
  const long = "a".repeat(128);
  const short = fittedVolumeName(long, PARENT, "n1");
  h.host.add(`tank/nomad/${short}`, made("b".repeat(128)));
  await assertRejectsCsi(
    at(T0, () => h.controller.CreateVolume(createReq(long))),
    Code.ALREADY_EXISTS,
    `Volume "${short}@n1" already exists for another name: dataset "tank/nomad/${short}" was ` +
      `created for "${"b".repeat(128)}", not "${long}"; choose another name`,
  );
});

Deno.test("CreateVolume leaves a dataset of the earlier shortened form alone: the literal is refused, the long name gets a new one", async () => {
  const h = controllerWith();
  const long = "a".repeat(128);
  const short = fittedVolumeName(long, PARENT, "n1");
  const legacy = short.replace("..", "-");
  const old = made(legacy);
  delete old[NAME_PROPERTY];
  h.host.add(`tank/nomad/${legacy}`, old);
  // The literal of the earlier form reaches it, and is refused: it records no name.
  await assertRejectsCsi(
    at(T0, () => h.controller.CreateVolume(createReq(legacy))),
    Code.ALREADY_EXISTS,
    /earlier zfs-csi/,
  );
  // The long name now makes its own dataset, in the new form.
  await at(T0, () => h.controller.CreateVolume(createReq(long)));
  assert.equal(h.host.value(`tank/nomad/${short}`, NAME_PROPERTY), long);
  assert.equal(h.host.value(`tank/nomad/${legacy}`, NAME_PROPERTY), undefined);
});

// ---------------------------------------------------------------------------------------------
// Ids without a node

const nodeless: ReadonlyArray<readonly [string, (c: ControllerService) => Promise<unknown>]> = [
  ["DeleteVolume cache", (c) => c.DeleteVolume({ volume_id: "cache", secrets: {} })],
  [
    "DeleteVolume by the full dataset name",
    (c) => c.DeleteVolume({ volume_id: "tank/nomad/cache", secrets: {} }),
  ],
  [
    "ControllerExpandVolume",
    (c) =>
      c.ControllerExpandVolume({
        volume_id: "cache",
        capacity_range: { required_bytes: String(128 * MiB), limit_bytes: "0" },
        secrets: {},
        volume_capability: null,
      }),
  ],
  [
    "CreateSnapshot",
    (c) => c.CreateSnapshot({ source_volume_id: "cache", name: "s2", secrets: {}, parameters: {} }),
  ],
  ["DeleteSnapshot", (c) => c.DeleteSnapshot({ snapshot_id: "cache@s1", secrets: {} })],
  [
    "CreateVolume from a snapshot",
    (c) =>
      c.CreateVolume(
        createReq("copy", { volume_content_source: { snapshot: { snapshot_id: "cache@s1" } } }),
      ),
  ],
  [
    "CreateVolume from a volume",
    (c) =>
      c.CreateVolume(
        createReq("copy", { volume_content_source: { volume: { volume_id: "cache" } } }),
      ),
  ],
];

Deno.test("Controller calls that change a volume refuse an id without a node, running nothing", async () => {
  for (const [what, call] of nodeless) {
    const h = controllerWith();
    h.host.add("tank/nomad/cache", made("cache"));
    h.host.add("tank/nomad/cache@s1", {}, "snapshot");
    await assertRejectsCsi(
      call(h.controller),
      Code.FAILED_PRECONDITION,
      /names no node, and this plugin \(node "n1"\) changes, deletes or copies nothing by such an id: .*--node-local-plugin-id$/,
      what,
    );
    assert.deepEqual(h.runner.argvs, [], what);
  }
});

Deno.test("Controller calls that only read take an id without a node", async () => {
  const h = controllerWith();
  h.host.add("tank/nomad/cache", made("cache"));
  const got = await h.controller.ControllerGetVolume({ volume_id: "cache" }) as {
    volume: { volume_id: string };
  };
  assert.equal(got.volume.volume_id, "cache@n1");
  const valid = await h.controller.ValidateVolumeCapabilities({
    volume_id: "cache",
    volume_context: {},
    volume_capabilities: [fsCap()],
    parameters: {},
    secrets: {},
    mutable_parameters: {},
  }) as { confirmed?: unknown };
  assert.ok(valid.confirmed);
});

Deno.test("With --node-local-plugin-id, calls that change a volume take an id without a node", async () => {
  for (const [what, call] of nodeless) {
    const h = controllerWith(["--node-local-plugin-id"]);
    // Nothing of that name here: each call answers as for any missing volume, not about nodes.
    const err = await call(h.controller).then(() => undefined, (e: unknown) => e);
    assert.ok(
      err === undefined || (err instanceof Error && !/names no node/.test(err.message)),
      `${what}: ${String(err)}`,
    );
  }
  const h = controllerWith(["--node-local-plugin-id"]);
  assert.deepEqual(await h.controller.DeleteVolume({ volume_id: "cache", secrets: {} }), {});
  await assertRejectsCsi(
    h.controller.ControllerExpandVolume({
      volume_id: "cache",
      capacity_range: { required_bytes: String(128 * MiB), limit_bytes: "0" },
      secrets: {},
      volume_capability: null,
    }),
    Code.NOT_FOUND,
  );
});

// ---------------------------------------------------------------------------------------------
// NodeStageVolume marks the volume, once

/** A node host: a dataset with VOLUME_PROPERTIES, `zfs set`, and bind mounts in a mount table. */
class FakeNodeHost {
  readonly props = new Map<string, Prop>([
    ["type", { value: "filesystem", source: "-" }],
    ["mountpoint", { value: "/mnt/tank/nomad/v1", source: "default" }],
    ["mounted", { value: "yes", source: "-" }],
    ["refquota", { value: "0", source: "default" }],
    ["org.zfs-csi:managed", { value: "yes", source: "local" }],
  ]);
  readonly mounts: { source: string; target: string }[] = [
    { source: "tank/nomad/v1", target: "/mnt/tank/nomad/v1" },
  ];
  readonly sets: string[][] = [];

  constructor(runner: FakeRunner) {
    runner
      .on(["zfs", "get"], (argv) => {
        const wanted = argv[argv.indexOf("-o") + 2]!.split(",");
        return {
          stdout: wanted.map((w) => {
            const v = this.props.get(w);
            return `tank/nomad/v1\t${w}\t${v?.value ?? "-"}\t${v?.source ?? "-"}\n`;
          }).join(""),
        };
      })
      .on(["zfs", "set"], (argv) => {
        this.sets.push([...argv]);
        const kv = argv[2]!;
        this.props.set(kv.slice(0, kv.indexOf("=")), {
          value: kv.slice(kv.indexOf("=") + 1),
          source: "local",
        });
        return {};
      })
      .onExact(["mount"], () => ({
        stdout: this.mounts.map((m) =>
          `${m.source} on ${m.target} type fuse.zfs (rw,relatime,user_id=0,group_id=0)\n`
        ).join(""),
      }))
      .when((argv) => argv[0] === "mount" && argv.includes("--bind"), (argv) => {
        const [source, target] = argv.slice(-2) as [string, string];
        const from = this.mounts.findLast((m) => m.target === source)!;
        this.mounts.push({ source: from.source, target });
        return {};
      })
      .on(["umount"], (argv) => {
        const i = this.mounts.findLastIndex((m) => m.target === argv.at(-1));
        if (i >= 0) this.mounts.splice(i, 1);
        return i >= 0 ? {} : fails(`umount: ${argv.at(-1)}: not mounted.\n`, 32);
      });
  }
}

Deno.test("NodeStageVolume marks the volume staged at its first stage only", async () => {
  const base = await Deno.makeTempDir({ prefix: "zfs-csi-tenancy-" });
  try {
    const parts = fakeServices({
      parent: PARENT,
      flags: ["--stage-publish-base-dir", base],
      host: (runner) => new FakeNodeHost(runner),
    });
    const node = fakeNode(parts);
    const stage = (path: string) =>
      node.NodeStageVolume({
        volume_id: "v1@n1",
        publish_context: {},
        staging_target_path: path,
        volume_capability: fsCap(),
        secrets: {},
        volume_context: {},
      });
    const before = Math.floor(Date.now() / 1000);
    await stage(`${base}/staging/v1/a`);
    const after = Math.floor(Date.now() / 1000);
    assert.equal(parts.host.sets.length, 1);
    const [set] = parts.host.sets;
    assert.deepEqual(set!.slice(0, 2), ["zfs", "set"]);
    assert.equal(set![3], "tank/nomad/v1");
    const [key, value] = set![2]!.split("=");
    assert.equal(key, STAGED_PROPERTY);
    assert.ok(Number(value) >= before && Number(value) <= after, `staged-at ${value}`);
    // Unstaged, and staged again by another allocation: the first time stays.
    await node.NodeUnstageVolume({
      volume_id: "v1@n1",
      staging_target_path: `${base}/staging/v1/a`,
    });
    await stage(`${base}/staging/v1/b`);
    assert.equal(parts.host.sets.length, 1);
    assert.equal(parts.host.props.get(STAGED_PROPERTY)?.value, value);
    parts.runner.assertNoUnexpected();
  } finally {
    await Deno.remove(base, { recursive: true });
  }
});
