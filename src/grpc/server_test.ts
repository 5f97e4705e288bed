import assert from "node:assert/strict";
import { Logger } from "../log.ts";
import { startServer } from "./server.ts";

const silent = new Logger("error", {}, () => {});

Deno.test("startServer takes over a socket that accepts connections nobody answers, but not a live server's", async () => {
  const dir = await Deno.makeTempDir({ dir: "/tmp", prefix: "zfs-csi-server-" });
  const path = `${dir}/csi.sock`;
  try {
    // What a killed plugin's subprocess holds: its listening socket, queueing connections that
    // no one accepts or answers.
    const held = Deno.listen({ transport: "unix", path });
    try {
      const t0 = performance.now();
      const server = await startServer(path, { Identity: {} }, silent);
      assert.ok(performance.now() - t0 >= 2_500, "it waited for an answer first");
      // A live gRPC server answers at once: a second one must not take its socket.
      const t1 = performance.now();
      await assert.rejects(
        startServer(path, { Identity: {} }, silent),
        /another process is serving on it/,
      );
      assert.ok(performance.now() - t1 < 2_500, "a live server answered at once");
      await server.stop(100);
    } finally {
      held.close();
    }
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
});
