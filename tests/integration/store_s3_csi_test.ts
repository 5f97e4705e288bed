/**
 * Issue 12 end to end with an S3 store: the plugin as it ships, against a real S3 server
 * (versitygw, tests/support/s3_server.ts) on 127.0.0.1, path-style, under a key prefix, with
 * the credentials in its environment and the server's host:port as its only network grant. The
 * checks are tests/support/store_flows.ts, the same as the file store's
 * (tests/integration/store_csi_test.ts); the bucket is read and damaged with signed requests of
 * the test's own, never through the plugin's store code.
 */

import { S3Server } from "../support/s3_server.ts";
import { s3StoreUnderTest, storeCsiFlows } from "../support/store_flows.ts";

Deno.test("store: backups, snapshots and restores through the plugin, S3 store", async (t) => {
  const server = await S3Server.start();
  try {
    await storeCsiFlows(t, s3StoreUnderTest(server, "clusters/test"));
  } finally {
    await server.stop();
  }
});
