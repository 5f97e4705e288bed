/**
 * A node's mount table and one zvol's device for the unit tests of the node's zvol side
 * (src/csi/volume_kinds/node_zvol.ts and node_follow_zvol.ts): `mount`, `umount`, blkid, mkfs,
 * wipefs and the grow tools behind a {@linkcode FakeRunner}, changing the device's signature as
 * the real tools do, and a device probe for `/dev/zvol/<dataset>` → `/dev/zd0`.
 */

import type { DeviceProbe } from "../../src/block/device.ts";
import { type FakeRunner, mountLine } from "./fake_runner.ts";
import { openZfsFixture } from "./openzfs_fixtures.ts";

/** The zvol's block device. */
export const DEVICE = "/dev/zd0";
/** `blkid -p -o export` of an ext4 and an xfs zvol, captured on OpenZFS (tests/fixtures/openzfs/). */
export const EXT4 = openZfsFixture("blkid_ext4.txt");
export const XFS = openZfsFixture("blkid_xfs.txt");

/** A node's mounts and the zvol device of `dataset`, as mount, blkid, mkfs and wipefs see them. */
export class BlockHost {
  readonly mounts: { source: string; mountPoint: string; fsType: string; options: string }[] = [];
  /** What blkid finds on the device; undefined: nothing. */
  signature: string | undefined;
  /** Where /dev/zvol/<dataset> leads; undefined: missing. */
  link: string | undefined = DEVICE;
  /** The dataset zvol_id says /dev/zd0 is (another: the link was swapped to another zvol). */
  zvolOfDevice: string;
  /** Targets the device is bound onto. */
  readonly bound = new Set<string>();
  readonly #dataset: string;
  /** Whether the zvol exists now (its device is there only then); default: always. */
  readonly #exists: () => boolean;

  constructor(runner: FakeRunner, dataset: string, exists: () => boolean = () => true) {
    this.#dataset = dataset;
    this.zvolOfDevice = dataset;
    this.#exists = exists;
    runner
      .onExact(["mount"], () => ({
        stdout: this.mounts.map((m) =>
          mountLine(m.source, m.mountPoint, m.fsType, m.options) + "\n"
        ).join(""),
      }))
      .on(["mount", "-c", "-t"], (argv) => {
        const opts = argv[4] === "-o" ? argv[5]! : "rw";
        this.mounts.push({
          source: argv.at(-2)!,
          mountPoint: argv.at(-1)!,
          fsType: argv[3]!,
          options: opts,
        });
        return {};
      })
      .on(["mount", "-c", "--bind"], (argv) => {
        const [source, target] = [argv[3]!, argv[4]!];
        if (source === DEVICE) {
          this.bound.add(target);
          this.mounts.push({
            source: "udev",
            mountPoint: target,
            fsType: "devtmpfs",
            options: "rw",
          });
        } else {
          const top = this.mounts.filter((m) => m.mountPoint === source).at(-1)!;
          this.mounts.push({ ...top, mountPoint: target });
        }
        return {};
      })
      .on(["mount", "-c", "-o"], () => ({}))
      .on(["umount", "-c"], (argv) => {
        const at = this.mounts.findLastIndex((m) => m.mountPoint === argv[2]);
        if (at < 0) return { code: 32, stderr: `umount: ${argv[2]}: not mounted.\n` };
        this.mounts.splice(at, 1);
        this.bound.delete(argv[2]!);
        return {};
      })
      .on(["blkid"], () => this.signature === undefined ? { code: 2 } : { stdout: this.signature })
      .on(["mkfs.ext4"], () => {
        if (this.signature !== undefined) return { code: 1, stderr: "contains a file system\n" };
        this.signature = EXT4;
        return {};
      })
      .on(["mkfs.xfs"], () => {
        if (this.signature !== undefined) return { code: 1, stderr: "appears to contain\n" };
        this.signature = XFS;
        return {};
      })
      .on(["wipefs", "-a"], () => {
        this.signature = undefined;
        return {};
      })
      .on(["resize2fs"], () => ({}))
      .on(["xfs_growfs"], () => ({}));
  }

  readonly probe: DeviceProbe = {
    // What lsblk says /dev/zvol/<dataset> leads to.
    blockDevice: (link: string) =>
      Promise.resolve(
        link === `/dev/zvol/${this.#dataset}` && this.link !== undefined && this.#exists()
          ? { name: this.link, rdev: 230 * 256 }
          : undefined,
      ),
    datasetOf: (device: string) =>
      Promise.resolve(device === DEVICE ? this.zvolOfDevice : "tank/elsewhere"),
    // A device bound onto a target file shows the device's number there.
    rdev: (path: string) => Promise.resolve(this.bound.has(path) ? 230 * 256 : undefined),
    sleep: () => Promise.resolve(),
    now: (() => {
      let t = 0;
      return () => (t += 1000);
    })(),
  };
}
