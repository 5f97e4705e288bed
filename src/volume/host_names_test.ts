import assert from "node:assert/strict";
import { Code, CsiError } from "../errors.ts";
import { catalogOf } from "./catalog.ts";
import { encodeVolumeId, volumeForDataset } from "../zfs/names.ts";
import { resolveVolume } from "../zfs/ids.ts";
import type { PropertyValue } from "../zfs/parse.ts";
import { HOST_PREFIX, hostDataset, isHostDataset } from "./host_names.ts";

const PARENT = "tank/nomad";

Deno.test("hostDataset names one child per namespace and name, escaping like CSI names", () => {
  assert.equal(hostDataset(PARENT, "default", "pgdata"), "tank/nomad/.host-default_pgdata");
  assert.equal(hostDataset(PARENT, "prod", "pgdata"), "tank/nomad/.host-prod_pgdata");
  assert.equal(hostDataset(PARENT, "a-b", "db[0]"), "tank/nomad/.host-a-b_db:5b0:5d");
  // The namespace ends at the first "_": "a" + "b_c" and "a_b" + "c" cannot meet (no "_" in
  // a namespace).
  assert.throws(() => hostDataset(PARENT, "a_b", "c"), CsiError);
  assert.notEqual(hostDataset(PARENT, "a", "b_c"), hostDataset(PARENT, "ab", "c"));
});

Deno.test("hostDataset refuses names that could escape or do not fit", () => {
  for (const bad of ["", "a/b", "..", "a@b"]) {
    assert.throws(
      () => hostDataset(PARENT, "default", bad),
      (e: unknown) => e instanceof CsiError && e.code === Code.INVALID_ARGUMENT,
      bad,
    );
  }
  const long = "x".repeat(120);
  assert.throws(
    () => hostDataset(`tank/${"p".repeat(120)}`, "default", long),
    (e: unknown) => e instanceof CsiError && /would exceed 255 bytes/.test(e.message),
  );
});

Deno.test("isHostDataset knows only direct children with the host prefix", () => {
  assert.ok(isHostDataset(PARENT, `${PARENT}/${HOST_PREFIX}default_x`));
  assert.ok(!isHostDataset(PARENT, `${PARENT}/default_x`));
  assert.ok(!isHostDataset(PARENT, `${PARENT}/${HOST_PREFIX}default_x/child`));
  assert.ok(!isHostDataset(PARENT, `tank/other/${HOST_PREFIX}default_x`));
});

Deno.test("CSI never names, lists or resolves a host volume's dataset", () => {
  const host = hostDataset(PARENT, "default", "pgdata");
  // No CSI volume id encodes to a name starting with ".".
  assert.equal(encodeVolumeId(".host-default_pgdata"), ":2ehost-default_pgdata");
  assert.equal(volumeForDataset(PARENT, host), undefined);
  // Given as a full dataset name (as `nomad volume register` external_id), it is refused.
  assert.throws(
    () => resolveVolume(host, { parentDataset: PARENT, nodeId: "n1" }),
    (e: unknown) => e instanceof CsiError && e.code === Code.INVALID_ARGUMENT,
  );
  // ListVolumes' catalog skips it, marker or not.
  const props = (v: Record<string, string>) =>
    new Map<string, PropertyValue>(
      Object.entries(v).map(([k, value]) => [k, { value, source: k === "type" ? "-" : "local" }]),
    );
  const tree = new Map([
    [PARENT, props({ type: "filesystem" })],
    [host, props({ type: "filesystem", "org.zfs-csi:managed": "yes" })],
    [`${PARENT}/pg`, props({ type: "filesystem", "org.zfs-csi:managed": "yes" })],
  ]);
  assert.deepEqual(catalogOf(PARENT, tree).volumes.map((v) => v.dataset), [`${PARENT}/pg`]);
});
