/**
 * Issue 13 (plugin side) end to end with a directory store: a volume that follows its job moves
 * between two plugins on two pools sharing the store, cleanly and after a lost holder. The
 * checks are tests/support/follow_flows.ts, which follow_move_s3_test.ts runs against a real S3
 * server too.
 *
 * zfs-fuse cannot resume a receive, and has no `written` property: a copy released here is
 * trusted by its release marker and `readonly=on` alone (OpenZFS also checks `written` = 0).
 */

import { followFlows } from "../support/follow_flows.ts";
import { fileStoreUnderTest } from "../support/store_flows.ts";

Deno.test("follow: moves between two nodes, lost holder and takeover, file store", async (t) => {
  const dir = await Deno.makeTempDir({ prefix: "zfs-csi-follow-" });
  try {
    await followFlows(t, fileStoreUnderTest(dir));
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
});
