/**
 * The device node of a zvol: `/dev/zvol/<dataset>`, a link udev makes a moment after the zvol
 * appears, which must lead to a `/dev/zd<N>` block device. Waited for, within a bound: NodeStage
 * has no deadline in Nomad, so the wait must end by itself. Where the link leads is asked of
 * lsblk (tools.ts): Deno lets no narrow build read below /dev.
 */

import { Code, CsiError } from "../errors.ts";
import type { BlockDevice } from "./args.ts";

/** How long a stage waits for a zvol's device node to appear. */
export const DEVICE_WAIT_MS = 30_000;
/** How often it looks. */
const POLL_MS = 250;

/** What the node looks at; replaceable in tests. */
export interface DeviceProbe {
  /** The block device `link` leads to (lsblk), or undefined while there is none. */
  readonly blockDevice: (link: string) => Promise<BlockDevice | undefined>;
  /** The dataset a zvol device is, as the kernel says (zvol_id). */
  readonly datasetOf: (device: string) => Promise<string>;
  /**
   * The device number of the block device at `path`, a path in the plugin's own directories
   * (a device bound onto a target file shows its own), or undefined when there is none.
   */
  readonly rdev: (path: string) => Promise<number | undefined>;
  /** Waits `ms`. */
  readonly sleep: (ms: number) => Promise<void>;
  /** Milliseconds by a clock that never jumps. */
  readonly now: () => number;
}

/** The real probe: lsblk through `tools`, stat, the clock. */
export function realDeviceProbe(
  tools: {
    blockDevice(link: string): Promise<BlockDevice | undefined>;
    datasetOf(device: string): Promise<string>;
  },
): DeviceProbe {
  return {
    blockDevice: (link) => tools.blockDevice(link),
    datasetOf: (device) => tools.datasetOf(device),
    rdev: async (path) => {
      try {
        const info = await Deno.stat(path);
        return info.isBlockDevice ? info.rdev ?? undefined : undefined;
      } catch (err) {
        if (err instanceof Deno.errors.NotFound) return undefined;
        throw err;
      }
    },
    sleep: (ms) => new Promise((resolve) => setTimeout(resolve, ms)),
    now: () => performance.now(),
  };
}

/** The link udev makes for a zvol. */
export function zvolLink(dataset: string): string {
  return `/dev/zvol/${dataset}`;
}

/**
 * The zvol's device, checked: the link leads to a `/dev/zd<N>` block device. Undefined while
 * the link is missing.
 * @throws {CsiError} FAILED_PRECONDITION when it leads to any other device, or to the zvol of
 *   another dataset
 */
export async function resolveZvolDevice(
  dataset: string,
  probe: DeviceProbe,
): Promise<BlockDevice | undefined> {
  const link = zvolLink(dataset);
  const device = await probe.blockDevice(link);
  if (device === undefined) return undefined;
  if (!/^\/dev\/zd\d+$/.test(device.name)) {
    throw new CsiError(
      Code.FAILED_PRECONDITION,
      `"${link}" leads to "${device.name}", which is not a zvol's block device (/dev/zdN): refused`,
    );
  }
  // The link says which device; the kernel says which dataset that device is. A link swapped
  // to another zvol (outside the parent, or another volume) is refused, never followed.
  const actual = await probe.datasetOf(device.name);
  if (actual !== dataset) {
    throw new CsiError(
      Code.FAILED_PRECONDITION,
      `"${link}" leads to "${device.name}", which is the zvol "${actual}", not "${dataset}": refused`,
    );
  }
  return device;
}

/**
 * Waits, at most `limitMs`, for the zvol's device node.
 * @throws {CsiError} UNAVAILABLE when it did not appear in time; FAILED_PRECONDITION when the
 *   link leads elsewhere
 */
export async function waitForZvolDevice(
  dataset: string,
  probe: DeviceProbe,
  limitMs = DEVICE_WAIT_MS,
): Promise<BlockDevice> {
  const start = probe.now();
  for (;;) {
    const device = await resolveZvolDevice(dataset, probe);
    if (device !== undefined) return device;
    if (probe.now() - start >= limitMs) {
      throw new CsiError(
        Code.UNAVAILABLE,
        `The device of zvol "${dataset}" (${zvolLink(dataset)}) did not appear within ` +
          `${Math.round(limitMs / 1000)} s: is udev running on this node?`,
      );
    }
    await probe.sleep(POLL_MS);
  }
}
