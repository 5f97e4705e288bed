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
import { openZfsExitCode, openZfsFixture } from "../../tests/support/openzfs_fixtures.ts";

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

// `blkid -p -o export` of a zvol captured in the OpenZFS VM (tests/fixtures/README.md): empty,
// after mkfs.ext4 and after mkfs.xfs. A partition table was not captured; its lines follow
// util-linux's documented format (blkid(8)).
const GPT = "DEVNAME=/dev/zd32\nPTUUID=1c2d3e4f-0000-4000-8000-000000000001\nPTTYPE=gpt\n";

Deno.test("parseBlkid reads blkid -p of a zvol as captured: nothing (exit 2), ext4, xfs", () => {
  assert.equal(openZfsExitCode("blkid_empty"), 2);
  assert.equal(openZfsFixture("blkid_empty.txt"), "");
  assert.equal(parseBlkid(openZfsFixture("blkid_empty.txt"), 2), undefined);
  assert.deepEqual(parseBlkid(openZfsFixture("blkid_ext4.txt"), 0), { type: "ext4" });
  assert.deepEqual(parseBlkid(openZfsFixture("blkid_xfs.txt"), 0), { type: "xfs" });
  assert.deepEqual(parseBlkid(GPT, 0), { ptType: "gpt" });
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
  // Captured in the OpenZFS VM: lsblk of a zvol's /dev/zvol link, as lsblkArgs asks; a zvol's
  // major is the zvol driver's (230).
  assert.equal(openZfsFixture("lsblk_zvol.txt"), "/dev/zd0 230:0 disk\n");
  assert.deepEqual(parseLsblk(openZfsFixture("lsblk_zvol.txt")), {
    name: "/dev/zd0",
    rdev: 230 * 256,
  });
  // `lsblk -adnrp -o NAME,MAJ:MIN,TYPE` of a link to /dev/vda on this machine printed
  // "/dev/vda 254:0 disk".
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
