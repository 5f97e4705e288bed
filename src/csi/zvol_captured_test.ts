/**
 * What the controller and the node read of a zvol, as OpenZFS answers it: `zfs get` with the
 * controller's and the node's property lists (ZVOL_STATE, NODE_ZVOL_STATE), captured in the
 * OpenZFS VM (tests/fixtures/openzfs/, tools/openzfs-vm/in-vm.sh) of a 64 MiB zvol made as the
 * plugin makes an ext4 one.
 */

import assert from "node:assert/strict";
import { openZfsProperties } from "../../tests/support/openzfs_fixtures.ts";
import { volumeRecord } from "../volume/catalog.ts";
import { parseBytes } from "../zfs/parse.ts";
import { NODE_ZVOL_STATE } from "./volume_kinds/node_zvol.ts";
import { checkOwnedZvol, ZVOL_STATE } from "./volume_kinds/zvol.ts";

const ZVOL = "tpool/nomad/z1";
const MiB = 1024 * 1024;

Deno.test("a zvol's properties as the controller reads them, captured on OpenZFS, are a zvol of ours", () => {
  const props = openZfsProperties("zfs_get_zvol.txt", ZVOL);
  // The capture asks what the controller asks, in its order.
  assert.deepEqual([...props.keys()], [...ZVOL_STATE]);
  assert.equal(checkOwnedZvol(ZVOL, props), "ext4");
  assert.deepEqual(volumeRecord("tpool/nomad", ZVOL, props), {
    dataset: ZVOL,
    name: "z1",
    refquota: 64 * MiB,
    content: "ext4",
    parameters: "{}",
    source: "",
  });
  // What does not apply to a zvol reads "-", and a full reservation is more than the volsize.
  assert.deepEqual(props.get("refquota"), { value: "-", source: "-" });
  assert.deepEqual(props.get("mountpoint"), { value: "-", source: "-" });
  assert.ok(parseBytes(props.get("refreservation")!.value) > 64 * MiB);
  assert.equal(props.get("volblocksize")?.source, "default");
});

Deno.test("a zvol's properties as the node reads them, captured on OpenZFS, are a zvol of ours", () => {
  const props = openZfsProperties("zfs_get_zvol_node.txt", ZVOL);
  assert.deepEqual([...props.keys()], [...NODE_ZVOL_STATE]);
  assert.equal(checkOwnedZvol(ZVOL, props), "ext4");
  assert.equal(parseBytes(props.get("volsize")!.value), 64 * MiB);
  // Not formatted, attached or staged yet: unset user properties read "-".
  for (const p of ["org.zfs-csi:format", "org.zfs-csi:attached", "org.zfs-csi:staged-at"]) {
    assert.deepEqual(props.get(p), { value: "-", source: "-" }, p);
  }
});
