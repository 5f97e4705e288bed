import assert from "node:assert/strict";
import { checkCapability } from "./validate.ts";
import { capabilityMisfit } from "./zvol_request.ts";
import type { VolumeCapability } from "./types.ts";
import type { ZvolContent } from "../volume/zvol.ts";

const ON = { blockVolumes: true };
const mount = (fsType: string): VolumeCapability => ({
  mount: { fs_type: fsType, mount_flags: [], volume_mount_group: "" },
  access_mode: { mode: "SINGLE_NODE_WRITER" },
});
const block: VolumeCapability = { block: {}, access_mode: { mode: "SINGLE_NODE_WRITER" } };

Deno.test("capabilityMisfit: block fits only a raw zvol, a mount only a filesystem of its type", () => {
  // [capability, what the volume is, fits]
  const table: [VolumeCapability, ZvolContent | undefined, boolean][] = [
    [mount(""), undefined, true],
    [mount("zfs"), undefined, true],
    [mount("ext4"), undefined, false],
    [block, undefined, false],
    [block, "block", true],
    [mount(""), "block", false],
    [mount("ext4"), "block", false],
    [mount("ext4"), "ext4", true],
    [mount(""), "ext4", true],
    [mount("zfs"), "ext4", false],
    [mount("xfs"), "ext4", false],
    [block, "ext4", false],
    [mount("xfs"), "xfs", true],
    [block, "xfs", false],
  ];
  for (const [cap, content, fits] of table) {
    const misfit = capabilityMisfit(checkCapability(cap, ON), cap.mount?.fs_type ?? "", content);
    assert.equal(misfit === undefined, fits, `${JSON.stringify(cap)} on ${content}: ${misfit}`);
  }
});
