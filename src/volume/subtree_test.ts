import assert from "node:assert/strict";
import type { PropertyMap, PropertyValue } from "../zfs/parse.ts";
import {
  checkSubtree,
  deletedMarks,
  isCloneComponent,
  listedClones,
  needsSiblings,
  obstacleMessage,
  type SubtreeInput,
} from "./subtree.ts";

const PARENT = "tank/nomad";
const MANAGED = "org.zfs-csi:managed";
const AT = "org.zfs-csi:deleted-at";
const NAME = "org.zfs-csi:deleted-name";
const CLONE = ".clone-0123456789abcdef-1700000000";

/** A property set on the object itself, unless a source is given. */
type Value = string | readonly [string, string];

function props(values: Readonly<Record<string, Value>>): PropertyMap {
  return new Map(
    Object.entries(values).map(([k, v]): [string, PropertyValue] =>
      typeof v === "string"
        ? [k, { value: v, source: "local" }]
        : [k, { value: v[0], source: v[1] }]
    ),
  );
}

const fs = (extra: Record<string, Value> = {}) =>
  props({ type: ["filesystem", "-"], [MANAGED]: "yes", ...extra });
/** A snapshot as OpenZFS reports it: `clones` listed (empty unless given). */
const snap = (extra: Record<string, Value> = {}) =>
  props({
    type: ["snapshot", "-"],
    userrefs: ["0", "-"],
    clones: ["", "-"],
    [MANAGED]: ["yes", "inherited from tank/nomad/v1"],
    ...extra,
  });
/** A snapshot as zfs-fuse reports it: no `clones`. */
const fuseSnap = (extra: Record<string, Value> = {}) =>
  props({ type: ["snapshot", "-"], userrefs: ["0", "-"], ...extra });
/** The marks a delete sets on a snapshot it sets aside. */
const marked = (at = "1700000000") => ({ [MANAGED]: "yes", [AT]: at, [NAME]: "tank/nomad/v1@s0" });

function check(rows: Record<string, PropertyMap>, over: Partial<SubtreeInput> = {}) {
  return checkSubtree({
    parent: PARENT,
    root: "tank/nomad/v1",
    tree: new Map(Object.entries(rows)),
    ...over,
  });
}

Deno.test("checkSubtree finds nothing in the way of a volume holding only the plugin's own snapshots", () => {
  const c = check({
    "tank/nomad/v1": fs(),
    [`tank/nomad/v1@${CLONE}`]: snap({ defer_destroy: ["on", "-"] }),
    "tank/nomad/v1@.deleted-1700000000-s0": snap(marked()),
  });
  assert.deepEqual(c, {
    root: "tank/nomad/v1",
    csiSnapshots: [],
    ownSnapshots: [`tank/nomad/v1@${CLONE}`, "tank/nomad/v1@.deleted-1700000000-s0"],
    clonedSnapshots: [],
    obstacles: [],
  });
});

Deno.test("checkSubtree keeps CSI snapshots of a volume apart, for DeleteVolume's own refusal", () => {
  const c = check({ "tank/nomad/v1": fs(), "tank/nomad/v1@nightly": snap() });
  assert.deepEqual(c.csiSnapshots, ["tank/nomad/v1@nightly"]);
  assert.deepEqual(c.obstacles, []);
});

Deno.test("checkSubtree puts snapshots the plugin did not make in the way (sanoid, by hand)", () => {
  const sanoid = "tank/nomad/v1@autosnap_2024-01-01_00:00:00_hourly";
  const c = check({
    "tank/nomad/v1": fs(),
    [sanoid]: snap(),
    // Close to the plugin's own names, but not theirs.
    "tank/nomad/v1@.clone-0123456789abcdef": snap(),
    "tank/nomad/v1@.clone-xyz-1": snap(),
    "tank/nomad/v1@.hidden": snap(),
  });
  assert.deepEqual(c.obstacles, [
    { kind: "snapshot", name: "tank/nomad/v1@.clone-0123456789abcdef" },
    { kind: "snapshot", name: "tank/nomad/v1@.clone-xyz-1" },
    { kind: "snapshot", name: "tank/nomad/v1@.hidden" },
    { kind: "snapshot", name: sanoid },
  ]);
  assert.deepEqual(c.ownSnapshots, []);
});

Deno.test("checkSubtree counts a set-aside dataset's snapshots with decodable names as in the way", () => {
  const root = "tank/nomad/.deleted-1700000000-v1";
  const c = check({ [root]: fs(marked()), [`${root}@nightly`]: snap() }, { root });
  assert.deepEqual(c.csiSnapshots, []);
  assert.deepEqual(c.obstacles, [{ kind: "snapshot", name: `${root}@nightly` }]);
});

Deno.test("checkSubtree puts .deleted-* snapshots without the plugin's own local marks in the way", () => {
  const c = check({
    "tank/nomad/v1": fs(),
    // By hand.
    "tank/nomad/v1@.deleted-1-x": snap(),
    // Marks inherited from the dataset, or received, are not the snapshot's own.
    "tank/nomad/v1@.deleted-2-x": snap({ [AT]: ["1700000000", "inherited from tank/nomad/v1"] }),
    "tank/nomad/v1@.deleted-3-x": snap({ ...marked(), [AT]: ["1700000000", "received"] }),
    // A deletion time that is not plain seconds.
    "tank/nomad/v1@.deleted-4-x": snap(marked("soon")),
    // The time alone, without the plugin's marker set on it.
    "tank/nomad/v1@.deleted-5-x": snap({ [AT]: "1700000000" }),
    "tank/nomad/v1@.deleted-6-x": snap(marked()),
  });
  assert.deepEqual(c.obstacles.map((o) => [o.kind, o.name.slice(-13)]), [
    ["unmarked", "@.deleted-1-x"],
    ["unmarked", "@.deleted-2-x"],
    ["unmarked", "@.deleted-3-x"],
    ["unmarked", "@.deleted-4-x"],
    ["unmarked", "@.deleted-5-x"],
  ]);
  assert.deepEqual(c.ownSnapshots, ["tank/nomad/v1@.deleted-6-x"]);
});

Deno.test("checkSubtree puts child datasets in the way", () => {
  const c = check({
    "tank/nomad/v1": fs(),
    "tank/nomad/v1/wal": props({ type: ["filesystem", "-"] }),
    "tank/nomad/v1/zvol": props({ type: ["volume", "-"] }),
    // Not below v1, though its name starts the same.
    "tank/nomad/v10": fs(),
  });
  assert.deepEqual(c.obstacles, [
    { kind: "child", name: "tank/nomad/v1/wal" },
    { kind: "child", name: "tank/nomad/v1/zvol" },
  ]);
});

Deno.test("checkSubtree puts holds in the way, even on the plugin's own snapshots", () => {
  const c = check({
    "tank/nomad/v1": fs(),
    [`tank/nomad/v1@${CLONE}`]: snap({ userrefs: ["1", "-"] }),
    "tank/nomad/v1@.deleted-1700000000-s0": snap({ ...marked(), userrefs: ["2", "-"] }),
    "tank/nomad/v1@nightly": snap({ userrefs: ["1", "-"] }),
  });
  assert.deepEqual(c.obstacles, [
    { kind: "hold", name: `tank/nomad/v1@${CLONE}` },
    { kind: "hold", name: "tank/nomad/v1@.deleted-1700000000-s0" },
    { kind: "hold", name: "tank/nomad/v1@nightly" },
  ]);
});

Deno.test("checkSubtree tells the plugin's volumes cloned from a snapshot from foreign clones (OpenZFS clones)", () => {
  const siblings = new Map([
    ["tank/nomad", props({ type: ["filesystem", "-"], origin: ["-", "-"] })],
    ["tank/nomad/v2", fs({ origin: [`tank/nomad/v1@${CLONE}`, "-"] })],
    ["tank/nomad/.deleted-1700000000-v3", fs({ origin: [`tank/nomad/v1@${CLONE}`, "-"] })],
    // Below the parent but not the plugin's.
    [
      "tank/nomad/mine",
      props({ type: ["filesystem", "-"], origin: [`tank/nomad/v1@${CLONE}`, "-"] }),
    ],
  ]);
  const c = check({
    "tank/nomad/v1": fs(),
    [`tank/nomad/v1@${CLONE}`]: snap({
      clones: ["tank/nomad/v2,tank/nomad/.deleted-1700000000-v3,tank/other/copy", "-"],
    }),
    "tank/nomad/v1@.deleted-1700000000-s0": snap({ ...marked(), clones: ["tank/nomad/v2", "-"] }),
  }, { siblings });
  assert.deepEqual(c.obstacles, [
    { kind: "clone", name: "tank/nomad/mine", of: `tank/nomad/v1@${CLONE}` },
    { kind: "clone", name: "tank/other/copy", of: `tank/nomad/v1@${CLONE}` },
  ]);
  assert.deepEqual(c.clonedSnapshots, [
    `tank/nomad/v1@${CLONE}`,
    "tank/nomad/v1@.deleted-1700000000-s0",
  ]);
});

Deno.test("checkSubtree finds clones by the origin of the parent's children where zfs has no clones property (zfs-fuse)", () => {
  const siblings = new Map([
    ["tank/nomad/v2", fs({ origin: [`tank/nomad/v1@${CLONE}`, "-"] })],
    [
      "tank/nomad/x",
      props({ type: ["filesystem", "-"], origin: ["tank/nomad/v1@.deleted-9-s", "-"] }),
    ],
  ]);
  const c = check({
    "tank/nomad/v1": fs(),
    [`tank/nomad/v1@${CLONE}`]: fuseSnap(),
    "tank/nomad/v1@.deleted-9-s": fuseSnap(marked()),
  }, { siblings });
  assert.deepEqual(c.clonedSnapshots, [`tank/nomad/v1@${CLONE}`]);
  assert.deepEqual(c.obstacles, [{
    kind: "clone",
    name: "tank/nomad/x",
    of: "tank/nomad/v1@.deleted-9-s",
  }]);
  // A clone's marker counts only when set on the clone itself, not inherited from the parent.
  const inherited = new Map([
    [
      "tank/nomad/v2",
      fs({
        origin: [`tank/nomad/v1@${CLONE}`, "-"],
        [MANAGED]: ["yes", "inherited from tank/nomad"],
      }),
    ],
  ]);
  const d = check({ "tank/nomad/v1": fs(), [`tank/nomad/v1@${CLONE}`]: fuseSnap() }, {
    siblings: inherited,
  });
  assert.deepEqual(d.obstacles, [{
    kind: "clone",
    name: "tank/nomad/v2",
    of: `tank/nomad/v1@${CLONE}`,
  }]);
});

Deno.test("needsSiblings asks for the parent's children only when snapshots may have clones", () => {
  const tree = (rows: Record<string, PropertyMap>) => new Map(Object.entries(rows));
  assert.equal(needsSiblings(tree({ "tank/nomad/v1": fs() })), false);
  assert.equal(
    needsSiblings(tree({ "tank/nomad/v1": fs(), [`tank/nomad/v1@${CLONE}`]: snap() })),
    false,
  );
  assert.equal(
    needsSiblings(
      tree({ "tank/nomad/v1": fs(), "tank/nomad/v1@a": snap({ clones: ["tank/nomad/v2", "-"] }) }),
    ),
    true,
  );
  assert.equal(needsSiblings(tree({ "tank/nomad/v1": fs(), "tank/nomad/v1@a": fuseSnap() })), true);
});

Deno.test("listedClones reads OpenZFS's comma-separated clones, and undefined without the property", () => {
  assert.deepEqual(listedClones(snap({ clones: ["a/b,a/c", "-"] })), ["a/b", "a/c"]);
  assert.deepEqual(listedClones(snap({ clones: ["", "-"] })), []);
  assert.deepEqual(listedClones(snap({ clones: ["-", "-"] })), []);
  assert.equal(listedClones(fuseSnap()), undefined);
});

Deno.test("deletedMarks wants the marker and a plain deletion time set locally on the object", () => {
  assert.deepEqual(deletedMarks(props(marked())), { at: 1700000000, name: "tank/nomad/v1@s0" });
  assert.deepEqual(deletedMarks(props({ [MANAGED]: "yes", [AT]: "5" })), { at: 5, name: "" });
  for (
    const values of [
      {},
      { [AT]: "5" },
      { [MANAGED]: "yes" },
      { [MANAGED]: "no", [AT]: "5" },
      { [MANAGED]: ["yes", "received"], [AT]: "5" },
      { [MANAGED]: ["yes", "inherited from tank/nomad"], [AT]: "5" },
      { [MANAGED]: "yes", [AT]: ["5", "inherited from tank/nomad/x"] },
      { [MANAGED]: "yes", [AT]: "-" },
      { [MANAGED]: "yes", [AT]: "5.5" },
    ] as Record<string, Value>[]
  ) {
    assert.equal(deletedMarks(props(values)), undefined, JSON.stringify(values));
  }
});

Deno.test("isCloneComponent accepts only the exact form CreateVolume makes", () => {
  assert.ok(isCloneComponent(CLONE));
  assert.ok(isCloneComponent(".clone-ffffffffffffffff-1"));
  for (
    const c of [
      ".clone-0123456789abcdef",
      ".clone-0123456789ABCDEF-1",
      ".clone-0123456789abcde-1",
      ".clone-0123456789abcdef-1-x",
      "x.clone-0123456789abcdef-1",
      ".clone-0123456789abcdef-1234567890123",
      "Xclone-0123456789abcdef-1",
    ]
  ) {
    assert.equal(isCloneComponent(c), false, c);
  }
});

Deno.test("obstacleMessage names what is in the way and the command for each, then how many more", () => {
  const few = obstacleMessage('Volume "v1@n1" is not deleted', "tank/nomad/v1", [
    { kind: "child", name: "tank/nomad/v1/wal" },
    { kind: "snapshot", name: "tank/nomad/v1@autosnap_x" },
    { kind: "hold", name: "tank/nomad/v1@.clone-x" },
    { kind: "clone", name: "tank/other/copy", of: "tank/nomad/v1@.clone-x" },
    { kind: "unmarked", name: "tank/nomad/v1@.deleted-1-x" },
  ]);
  assert.equal(
    few,
    'Volume "v1@n1" is not deleted: it holds what zfs-csi did not make, which it never destroys: ' +
      'child dataset "tank/nomad/v1/wal": move it out ("zfs rename tank/nomad/v1/wal <new name>") ' +
      'or destroy it ("zfs destroy -r tank/nomad/v1/wal"); ' +
      'snapshot "tank/nomad/v1@autosnap_x", not made by zfs-csi: destroy it ' +
      '("zfs destroy tank/nomad/v1@autosnap_x") and stop the tool that takes it (sanoid, zrepl, ...) ' +
      "from snapshotting this dataset; " +
      'snapshot "tank/nomad/v1@.clone-x" is held: list the holds ("zfs holds tank/nomad/v1@.clone-x") ' +
      'and release them ("zfs release <tag> tank/nomad/v1@.clone-x"); ' +
      'dataset "tank/other/copy", not a zfs-csi volume, is a clone of "tank/nomad/v1@.clone-x": ' +
      'make it independent ("zfs promote tank/other/copy") or destroy it ("zfs destroy tank/other/copy"); ' +
      'snapshot "tank/nomad/v1@.deleted-1-x" has a set-aside name but not zfs-csi\'s marks (made by ' +
      "hand, by an older zfs-csi, or interrupted): destroy it " +
      '("zfs destroy tank/nomad/v1@.deleted-1-x") or rename it',
  );
  const many = obstacleMessage(
    "X",
    "tank/nomad/v1",
    Array.from(
      { length: 8 },
      (_, i) => ({ kind: "snapshot" as const, name: `tank/nomad/v1@s${i}` }),
    ),
  );
  assert.match(many, /"zfs destroy tank\/nomad\/v1@s4"\)/);
  assert.doesNotMatch(many, /@s5/);
  assert.match(many, /; and 3 more \("zfs list -r -t all -o name,userrefs tank\/nomad\/v1"\)$/);
});
