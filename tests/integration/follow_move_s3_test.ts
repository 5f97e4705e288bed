/**
 * Issue 13 (plugin side) end to end with an S3 store: the checks of
 * tests/support/follow_flows.ts against a real S3 server (versitygw, tests/support/s3_server.ts)
 * on 127.0.0.1, whose conditional writes (If-None-Match, If-Match) decide who holds the volume.
 */

import { followFlows } from "../support/follow_flows.ts";
import { S3Server } from "../support/s3_server.ts";
import { s3StoreUnderTest } from "../support/store_flows.ts";

Deno.test("follow: moves between two nodes, lost holder and takeover, S3 store", async (t) => {
  const server = await S3Server.start();
  try {
    await followFlows(t, s3StoreUnderTest(server, "clusters/follow"));
  } finally {
    await server.stop();
  }
});
