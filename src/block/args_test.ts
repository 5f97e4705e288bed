import assert from "node:assert/strict";
import {
  blkidArgs,
  growArgs,
  lsblkArgs,
  makedev,
  mkfsArgs,
  parseBlkid,
  parseLsblk,
  wipefsArgs,
} from "./args.ts";
import { mountDeviceArgs } from "../mount/mounter.ts";

Deno.test("block argv builders return the exact argument lists", () => {
  assert.deepEqual(blkidArgs("/dev/zd0"), ["blkid", "-p", "-o", "export", "/dev/zd0"]);
  assert.deepEqual(wipefsArgs("/dev/zd16"), ["wipefs", "-a", "/dev/zd16"]);
  assert.deepEqual(mkfsArgs("ext4", "/dev/zd0"), [
    "mkfs.ext4",
    "-q",
    "-E",
    "nodiscard",
    "/dev/zd0",
  ]);
  assert.deepEqual(mkfsArgs("xfs", "/dev/zd0"), ["mkfs.xfs", "-q", "-K", "/dev/zd0"]);
  assert.deepEqual(growArgs("ext4", "/dev/zd0", "/csi/staging/v"), ["resize2fs", "/dev/zd0"]);
  assert.deepEqual(growArgs("xfs", "/dev/zd0", "/csi/staging/v"), ["xfs_growfs", "/csi/staging/v"]);
  assert.deepEqual(mountDeviceArgs("ext4", "/dev/zd0", "/csi/s", []), [
    "-c",
    "-t",
    "ext4",
    "/dev/zd0",
    "/csi/s",
  ]);
  assert.deepEqual(mountDeviceArgs("xfs", "/dev/zd0", "/csi/s", ["nosuid", "nodev"]), [
    "-c",
    "-t",
    "xfs",
    "-o",
    "nosuid,nodev",
    "/dev/zd0",
    "/csi/s",
  ]);
});

Deno.test("block argv builders take nothing but a zvol's /dev/zdN device", () => {
  for (
    const bad of [
      "/dev/sda",
      "/dev/zvol/tank/nomad/v",
      "/dev/zd0p1",
      "/dev/zd",
      "/tmp/dev/zd0",
      "/dev/zd0 ",
      "-F",
    ]
  ) {
    assert.throws(() => blkidArgs(bad), TypeError, bad);
    assert.throws(() => wipefsArgs(bad), TypeError, bad);
    assert.throws(() => mkfsArgs("ext4", bad), TypeError, bad);
    assert.throws(() => growArgs("ext4", bad, "/m"), TypeError, bad);
    assert.throws(() => mountDeviceArgs("xfs", bad, "/m", []), TypeError, bad);
  }
  assert.throws(() => growArgs("xfs", "/dev/zd0", "relative"), TypeError);
});

// The documented `blkid -p -o export` formats (util-linux blkid(8)); to be replaced by output
// captured in the OpenZFS VM.
const EXT4 = "DEVNAME=/dev/zd0\nUUID=0b7e2c1e-1d7a-4a5f-9d1e-3c1f5b2a9e01\nVERSION=1.0\n" +
  "BLOCK_SIZE=4096\nTYPE=ext4\nUSAGE=filesystem\n";
const XFS = "DEVNAME=/dev/zd16\nUUID=5d7c1c5a-6a1e-4f0e-8f5e-2b9e1c7d4a33\nBLOCK_SIZE=512\n" +
  "TYPE=xfs\nUSAGE=filesystem\n";
const GPT = "DEVNAME=/dev/zd32\nPTUUID=1c2d3e4f-0000-4000-8000-000000000001\nPTTYPE=gpt\n";

Deno.test("parseBlkid reads the type, a partition table, and exit 2 as nothing", () => {
  assert.deepEqual(parseBlkid(EXT4, 0), { type: "ext4" });
  assert.deepEqual(parseBlkid(XFS, 0), { type: "xfs" });
  assert.deepEqual(parseBlkid(GPT, 0), { ptType: "gpt" });
  assert.equal(parseBlkid("", 2), undefined);
  // Exit 0 and only the device name: no signature either.
  assert.equal(parseBlkid("DEVNAME=/dev/zd0\n", 0), undefined);
  assert.throws(() => parseBlkid('/dev/zd0: TYPE="ext4"\n', 0), SyntaxError);
});

Deno.test("lsblkArgs asks where a zvol link leads, and takes nothing but /dev/zvol/<dataset>", () => {
  assert.deepEqual(lsblkArgs("/dev/zvol/tank/nomad/db"), [
    "lsblk",
    "-adnrp",
    "-o",
    "NAME,MAJ:MIN,TYPE",
    "/dev/zvol/tank/nomad/db",
  ]);
  for (const bad of ["/dev/zd0", "/dev/zvol/../sda", "/dev/zvol/tank/..", "/dev/zvol/a b", "x"]) {
    assert.throws(() => lsblkArgs(bad), TypeError, bad);
  }
});

Deno.test("parseLsblk reads the kernel name and device number (lsblk -r, as util-linux 2.38 prints it)", () => {
  // `lsblk -adnrp -o NAME,MAJ:MIN,TYPE` of a link to /dev/vda on this machine printed
  // "/dev/vda 254:0 disk"; a zvol's major is the zvol driver's (230 on OpenZFS here).
  assert.deepEqual(parseLsblk("/dev/vda 254:0 disk\n"), { name: "/dev/vda", rdev: 254 * 256 });
  assert.deepEqual(parseLsblk("/dev/zd16 230:16 disk\n"), {
    name: "/dev/zd16",
    rdev: 230 * 256 + 16,
  });
  assert.throws(() => parseLsblk(""), SyntaxError);
  assert.throws(() => parseLsblk("/dev/zd0 230:0 disk\n/dev/zd16 230:16 disk\n"), SyntaxError);
});

Deno.test("makedev encodes major and minor as Linux's st_rdev does", () => {
  assert.equal(makedev(7, 0), 0x700);
  assert.equal(makedev(230, 16), 0xe610);
  // Minors above 255 go to bits 20 and up.
  assert.equal(makedev(230, 256), 0x10e600);
  assert.equal(makedev(230, 4096 + 5), 0x100e605);
});
