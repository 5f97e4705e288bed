/**
 * Block volumes where zfs cannot make zvols (zfs-fuse, this machine): with --block-volumes the
 * plugin probes its zfs (`zfs version`, which zfs-fuse lacks) and refuses every zvol request,
 * saying why; without the flag it names the flag. ZFS datasets are served as before either way.
 * The zvols themselves are proven in the OpenZFS VM (tests/integration/block_volumes_test.ts).
 */

import { Code } from "../../src/errors.ts";
import { rejects } from "../support/csi_client.ts";
import { createVolumeRequest, mountCapability } from "../support/nomad.ts";
import { PluginProcess } from "../support/plugin_process.ts";
import { poolState, TestPool } from "../support/zfs_pool.ts";
import assert from "node:assert/strict";

const BLOCK = { block: {}, access_mode: { mode: "SINGLE_NODE_WRITER" } };
const EXT4 = {
  mount: { fs_type: "ext4", mount_flags: [] },
  access_mode: { mode: "SINGLE_NODE_WRITER" },
};

Deno.test("block volumes on zfs-fuse: refused saying why, with and without --block-volumes; datasets as before", async (t) => {
  await using pool = await TestPool.create();
  for (const flag of [true, false]) {
    await t.step(flag ? "with --block-volumes" : "without it", async () => {
      await using plugin = await PluginProcess.start({
        parentDataset: pool.parent,
        dir: pool.dir,
        // PluginProcess gives a plugin with --block-volumes a block build's flags.
        ...(flag ? { extraArgs: ["--block-volumes"] } : {}),
      });
      const c = plugin.client;
      const before = await poolState(pool);
      const why = flag ? /this node's zfs cannot make zvols \(zfs-fuse/ : /--block-volumes/;
      for (
        const req of [
          createVolumeRequest("raw", { volume_capabilities: [BLOCK] }),
          createVolumeRequest("e", { volume_capabilities: [EXT4] }),
          createVolumeRequest("x", {
            volume_capabilities: [mountCapability()],
            parameters: { fs_type: "xfs" },
          }),
        ]
      ) {
        await rejects(c.controller("CreateVolume", req), Code.INVALID_ARGUMENT, why);
      }
      assert.deepEqual(await poolState(pool), before, "nothing made");
      const name = flag ? "plain-on" : "plain-off";
      const made = await c.controller("CreateVolume", createVolumeRequest(name)) as {
        volume: { volume_context: Record<string, string> };
      };
      assert.deepEqual(made.volume.volume_context, { dataset: `${pool.parent}/${name}` });
      // A dataset's ValidateVolumeCapabilities refuses block and ext4 alike.
      for (const cap of [BLOCK, EXT4]) {
        const res = await c.controller("ValidateVolumeCapabilities", {
          volume_id: `${name}@node-a`,
          volume_capabilities: [cap],
        }) as { confirmed: unknown; message: string };
        assert.equal(res.confirmed, null);
        assert.match(res.message, flag ? /ZFS dataset/ : /--block-volumes/);
      }
    });
  }
});
