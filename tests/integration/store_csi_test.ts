/**
 * Issue 12 end to end with a directory store (`--store file:///DIR`): the plugin as it ships,
 * with the store's directory as its only extra grant, on two real pools sharing the store. The
 * checks are tests/support/store_flows.ts, which tests/integration/store_s3_csi_test.ts runs
 * against a real S3 server too.
 *
 * zfs-fuse cannot show raw sends of encrypted datasets (OpenZFS only: tools/openzfs-vm/).
 */

import { fileStoreUnderTest, storeCsiFlows } from "../support/store_flows.ts";

Deno.test("store: backups, snapshots and restores through the plugin, file store", async (t) => {
  const dir = await Deno.makeTempDir({ prefix: "zfs-csi-store-csi-" });
  try {
    await storeCsiFlows(t, fileStoreUnderTest(dir));
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
});
