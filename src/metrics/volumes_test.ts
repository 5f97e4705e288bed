import assert from "node:assert/strict";
import { MountJudge } from "../mount/mountinfo.ts";
import { mountState, parseRatio } from "./volumes.ts";

Deno.test("parseRatio reads OpenZFS's and older releases' compressratio", () => {
  assert.equal(parseRatio("1.00"), 1);
  assert.equal(parseRatio("2.37x"), 2.37);
  assert.equal(parseRatio("-"), undefined);
});

Deno.test("mountState tells staging mounts from targets by Nomad's layout below the base dirs", () => {
  const entry = (source: string, mountPoint: string, fsType = "zfs") => ({
    source,
    mountPoint,
    fsType,
    options: ["rw"],
  });
  const view = (table: ReturnType<typeof entry>[]) => ({
    table,
    judge: new MountJudge("zfs"),
    dirs: ["/local/csi", "/other/"],
  });
  assert.deepEqual(mountState(view([entry("t/v", "/local/csi/staging/ns/v/rw")]), "t/v"), {
    staged: true,
    published: false,
  });
  assert.deepEqual(mountState(view([entry("t/v", "/other/per-alloc/a/v/rw")]), "t/v"), {
    staged: false,
    published: true,
  });
  // Not ours: another dataset, outside the base dirs, a prefix that is not a directory, or a
  // FUSE mount named like the dataset where ZFS is the kernel's.
  for (
    const e of [
      entry("t/w", "/local/csi/staging/ns/w/rw"),
      entry("t/v", "/t/v"),
      entry("t/v", "/local/csi-x/staging/v"),
      entry("t/v", "/local/csi/staging/ns/v/rw", "fuse.zfs"),
    ]
  ) {
    assert.deepEqual(mountState(view([e]), "t/v"), { staged: false, published: false });
  }
});
