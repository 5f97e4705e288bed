import assert from "node:assert/strict";
import { ZfsError } from "../errors.ts";
import { FakeRunner, fakeTools } from "../../tests/support/fake_runner.ts";
import { parseGet, type PropertyMap, type PropertyValue } from "../zfs/parse.ts";
import {
  CATALOG_PROPERTIES,
  catalogOf,
  PARAMETERS_PROPERTY,
  readCatalog,
  SOURCE_PROPERTY,
  userValue,
  volumeRecord,
} from "./catalog.ts";

function fixture(name: string): Promise<string> {
  return Deno.readTextFile(new URL(`../../tests/fixtures/${name}`, import.meta.url));
}

function props(entries: Record<string, string | PropertyValue>): PropertyMap {
  return new Map(
    Object.entries(entries).map((
      [k, v],
    ) => [k, typeof v === "string" ? { value: v, source: v === "-" ? "-" : "local" } : v]),
  );
}

/** `zfs get` lines of one dataset, as zfs prints them. */
function lines(name: string, entries: Record<string, string>): string {
  return Object.entries(entries)
    .map(([k, v]) => `${name}\t${k}\t${v}\t${v === "-" ? "-" : "local"}\n`)
    .join("");
}

const VOLUMES_IN_FIXTURE = [
  {
    dataset: "tpool/nomad/copy",
    name: "copy",
    refquota: 67108864,
    parameters: "{}",
    source: "volume:pg@node-a",
  },
  {
    dataset: "tpool/nomad/db:5b0:5d",
    name: "db[0]",
    refquota: 33554432,
    parameters: "{}",
    source: "",
  },
  {
    dataset: "tpool/nomad/pg",
    name: "pg",
    refquota: 67108864,
    parameters: '{"compression":"on"}',
    source: "",
  },
  {
    dataset: "tpool/nomad/restored",
    name: "restored",
    refquota: 67108864,
    parameters: "{}",
    source: "snapshot:pg@snap1@node-a",
  },
];

const SNAPSHOTS_IN_FIXTURE = [
  {
    snapshot: "tpool/nomad/db:5b0:5d@before:20upgrade",
    dataset: "tpool/nomad/db:5b0:5d",
    volumeName: "db[0]",
    component: "before:20upgrade",
    name: "before upgrade",
    creation: 1795393179,
    referenced: 114688,
  },
  {
    snapshot: "tpool/nomad/pg@snap1",
    dataset: "tpool/nomad/pg",
    volumeName: "pg",
    component: "snap1",
    name: "snap1",
    creation: 1795393178,
    referenced: 118784,
  },
];

Deno.test("the zfs_get_tree fixture holds exactly the catalog's properties", async () => {
  const tree = parseGet(await fixture("zfs_get_tree.txt"));
  assert.equal(tree.size, 14);
  for (const [name, p] of tree) {
    assert.deepEqual([...p.keys()], [...CATALOG_PROPERTIES], name);
  }
});

Deno.test("catalogOf reads the volumes and snapshots of real zfs get -r output", async () => {
  const tree = parseGet(await fixture("zfs_get_tree.txt"));
  const catalog = catalogOf("tpool/nomad", tree);
  // Left out: the parent, the hidden .deleted-… dataset, the foreign dataset and its child.
  assert.deepEqual(catalog.volumes, VOLUMES_IN_FIXTURE);
  // Left out: pg's hidden .clone-… and .deleted-… snapshots, the foreign dataset's snapshot,
  // and the snapshot of the hidden dataset.
  assert.deepEqual(catalog.snapshots, SNAPSHOTS_IN_FIXTURE);
});

Deno.test("catalogOf of another parent finds nothing", async () => {
  const tree = parseGet(await fixture("zfs_get_tree.txt"));
  assert.deepEqual(catalogOf("tpool/other", tree), { volumes: [], snapshots: [] });
  assert.deepEqual(catalogOf("tpool", tree), { volumes: [], snapshots: [] });
  assert.deepEqual(catalogOf("tpool/nomad", new Map()), { volumes: [], snapshots: [] });
});

Deno.test("catalogOf skips zvols, unmarked datasets and snapshots of non-volumes", () => {
  const stdout = [
    lines("t/n", { type: "filesystem", "org.zfs-csi:managed": "-" }),
    lines("t/n/zvol", { type: "volume", "org.zfs-csi:managed": "yes", refquota: "-" }),
    lines("t/n/zvol@s", { type: "snapshot", creation: "1", referenced: "1" }),
    lines("t/n/no", { type: "filesystem", "org.zfs-csi:managed": "no", refquota: "0" }),
    lines("t/n/no@s", { type: "snapshot", creation: "1", referenced: "1" }),
    lines("t/n/v", { type: "filesystem", "org.zfs-csi:managed": "yes", refquota: "0" }),
    // Named like a snapshot but not of type snapshot: no snapshot.
    lines("t/n/v@odd", { type: "filesystem", creation: "1", referenced: "1" }),
    lines("t/n/v@x:zz", { type: "snapshot", creation: "1", referenced: "1" }),
    lines("t/n/v@ok", { type: "snapshot", creation: "x", referenced: "-" }),
  ].join("");
  const catalog = catalogOf("t/n", parseGet(stdout));
  assert.deepEqual(catalog.volumes, [
    { dataset: "t/n/v", name: "v", refquota: 0, parameters: "{}", source: "" },
  ]);
  assert.deepEqual(catalog.snapshots, [
    {
      snapshot: "t/n/v@ok",
      dataset: "t/n/v",
      volumeName: "v",
      component: "ok",
      name: "ok",
      creation: 0,
      referenced: 0,
    },
  ]);
});

Deno.test("catalogOf finds a snapshot listed before its volume", () => {
  const stdout = [
    lines("t/n/v@s", { type: "snapshot", creation: "7", referenced: "9" }),
    lines("t/n/v", { type: "filesystem", "org.zfs-csi:managed": "yes", refquota: "5" }),
  ].join("");
  assert.deepEqual(catalogOf("t/n", parseGet(stdout)).snapshots.map((s) => s.snapshot), [
    "t/n/v@s",
  ]);
});

Deno.test("volumeRecord reads one volume, or undefined for datasets that hold none", () => {
  const managed = props({
    type: "filesystem",
    refquota: "1024",
    "org.zfs-csi:managed": "yes",
    [PARAMETERS_PROPERTY]: '{"atime":"off"}',
    [SOURCE_PROPERTY]: "volume:pg@node-a",
  });
  assert.deepEqual(volumeRecord("t/n", "t/n/my:20vol", managed), {
    dataset: "t/n/my:20vol",
    name: "my vol",
    refquota: 1024,
    parameters: '{"atime":"off"}',
    source: "volume:pg@node-a",
  });
  const table = [
    "t/n",
    "t/nx/v",
    "t/other/v",
    "t/n/a/b",
    "t/n/.deleted-1700000000-v",
    "t/n/.hidden",
    "t/n/v@snap",
  ];
  for (const dataset of table) {
    assert.equal(volumeRecord("t/n", dataset, managed), undefined, dataset);
  }
  const unmarked = props({ type: "filesystem", refquota: "0", "org.zfs-csi:managed": "-" });
  assert.equal(volumeRecord("t/n", "t/n/v", unmarked), undefined);
  assert.equal(volumeRecord("t/n", "t/n/v", props({ type: "filesystem" })), undefined);
  const zvol = props({ type: "volume", "org.zfs-csi:managed": "yes" });
  assert.equal(volumeRecord("t/n", "t/n/v", zvol), undefined);
});

Deno.test("userValue reads a user property, empty when unset", () => {
  const p = props({
    set: "x",
    dash: { value: "-", source: "-" },
    unsetSource: { value: "y", source: "-" },
    inherited: { value: "yes", source: "inherited from t/n" },
  });
  assert.equal(userValue(p, "set"), "x");
  assert.equal(userValue(p, "dash"), "");
  assert.equal(userValue(p, "unsetSource"), "");
  assert.equal(userValue(p, "inherited"), "yes");
  assert.equal(userValue(p, "missing"), "");
});

Deno.test("readCatalog runs one zfs get -r of depth 2 with snapshots, 1 without", async () => {
  const stdout = await fixture("zfs_get_tree.txt");
  const expectedArgv = (depth: string) => [
    "zfs",
    "get",
    "-Hp",
    "-r",
    "-d",
    depth,
    "-o",
    "name,property,value,source",
    "type,creation,referenced,refquota,org.zfs-csi:managed,org.zfs-csi:parameters," +
    "org.zfs-csi:source,volsize,org.zfs-csi:fs-type",
    "tpool/nomad",
  ];
  const runner = new FakeRunner().on(["zfs", "get"], { stdout });
  const { zfs } = fakeTools(runner);
  const catalog = await readCatalog(zfs, "tpool/nomad", { snapshots: true });
  assert.deepEqual(catalog, { volumes: VOLUMES_IN_FIXTURE, snapshots: SNAPSHOTS_IN_FIXTURE });
  await readCatalog(zfs, "tpool/nomad", { snapshots: false });
  assert.deepEqual(runner.argvs, [expectedArgv("2"), expectedArgv("1")]);
});

Deno.test("readCatalog of a missing parent is empty", async () => {
  const runner = new FakeRunner().on(["zfs", "get"], {
    code: 1,
    stderr: await fixture("stderr_get_not_found.txt"),
  });
  const { zfs } = fakeTools(runner);
  assert.deepEqual(await readCatalog(zfs, "tpool/nomad", { snapshots: true }), {
    volumes: [],
    snapshots: [],
  });
});

Deno.test("readCatalog passes other zfs failures on", async () => {
  const runner = new FakeRunner().on(["zfs", "get"], {
    code: 1,
    stderr: "cannot open 'tpool/nomad': permission denied\n",
  });
  const { zfs } = fakeTools(runner);
  await assert.rejects(
    readCatalog(zfs, "tpool/nomad", { snapshots: false }),
    (err: unknown) => err instanceof ZfsError && err.kind === "permission",
  );
});

Deno.test("catalogOf reads a captured OpenZFS 2.1 tree: own markers only, snapshots of volumes", async () => {
  const catalog = catalogOf("tpool/nomad", parseGet(await fixture("openzfs/zfs_get_tree.txt")));
  // c1 is a clone made by hand, without our marker: not a volume.
  assert.deepEqual(catalog.volumes.map((v) => [v.name, v.refquota]).sort(), [
    ["db[0]", 209715200],
    ["v1", 104857600],
  ]);
  assert.deepEqual(
    catalog.snapshots.map((s) => [s.snapshot, s.volumeName, s.name, s.referenced]),
    [["tpool/nomad/v1@snap1", "v1", "snap1", 24576]],
  );
  assert.ok(catalog.snapshots.every((s) => s.creation > 1_700_000_000));
});
