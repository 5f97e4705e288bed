import assert from "node:assert/strict";
import type { PropertyMap } from "../zfs/parse.ts";
import { checkSubtree, isStoreComponent } from "./subtree.ts";

const snap: PropertyMap = new Map([
  ["type", { value: "snapshot", source: "-" }],
  ["userrefs", { value: "0", source: "-" }],
  ["clones", { value: "", source: "-" }],
]);
const fs: PropertyMap = new Map([
  ["type", { value: "filesystem", source: "-" }],
  ["org.zfs-csi:managed", { value: "yes", source: "local" }],
]);

Deno.test("isStoreComponent takes the backup and stored-snapshot forms only", () => {
  for (
    const c of [
      ".backup-1700000000",
      ".backup-1",
      ".backup-1700000000-12",
      ".backup-1700000000-999999999999999",
      ".stored-nightly",
      ".stored-db:5b0:5d",
    ]
  ) {
    assert.equal(isStoreComponent(c), true, c);
  }
  for (
    const c of [
      ".backup-",
      ".backup-17x",
      ".backup-1234567890123",
      ".backup-1700000000-",
      ".backup-1700000000-1234567890123456",
      ".backup-1700000000-1-2",
      "backup-1700000000",
      ".stored-",
      ".stored-.x",
      ".stored-a/b",
      "autosnap_2024-01-01_00:00:00_hourly",
    ]
  ) {
    assert.equal(isStoreComponent(c), false, c);
  }
});

Deno.test("checkSubtree counts backup snapshots as the plugin's own, and look-alikes as obstacles", () => {
  const c = checkSubtree({
    parent: "tank/nomad",
    root: "tank/nomad/v1",
    tree: new Map([
      ["tank/nomad/v1", fs],
      ["tank/nomad/v1@.backup-1700000000", snap],
      ["tank/nomad/v1@.stored-nightly", snap],
      ["tank/nomad/v1@.backup-soon", snap],
    ]),
  });
  assert.deepEqual(c.ownSnapshots, [
    "tank/nomad/v1@.backup-1700000000",
    "tank/nomad/v1@.stored-nightly",
  ]);
  assert.deepEqual(c.obstacles, [{ kind: "snapshot", name: "tank/nomad/v1@.backup-soon" }]);
  assert.deepEqual(c.csiSnapshots, []);
});
