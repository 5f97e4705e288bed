/**
 * The device node of a zvol: `/dev/zvol/<dataset>`, a link udev makes a moment after the zvol
 * appears, which must lead to a `/dev/zd<N>` block device. Waited for, within a bound: NodeStage
 * has no deadline in Nomad, so the wait must end by itself.
 */

import { Code, CsiError } from "../errors.ts";

/** How long a stage waits for a zvol's device node to appear. */
export const DEVICE_WAIT_MS = 30_000;
/** How often it looks. */
const POLL_MS = 250;

/** What the wait looks at; replaceable in tests. */
export interface DeviceProbe {
  /** realpath(3) of a path; throws NotFound while it does not exist. */
  readonly realPath: (path: string) => Promise<string>;
  /** Whether `path` is a block device (stat, following links). */
  readonly isBlockDevice: (path: string) => Promise<boolean>;
  /**
   * The device number of the block device at `path` (stat, following links; a device bound onto
   * a file shows its own), or undefined when there is none.
   */
  readonly rdev: (path: string) => Promise<number | undefined>;
  /** Waits `ms`. */
  readonly sleep: (ms: number) => Promise<void>;
  /** Milliseconds by a clock that never jumps. */
  readonly now: () => number;
}

/** The real filesystem and clock. */
export const REAL_DEVICE_PROBE: DeviceProbe = {
  realPath: (path) => Deno.realPath(path),
  isBlockDevice: async (path) => (await Deno.stat(path)).isBlockDevice === true,
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

/** The link udev makes for a zvol. */
export function zvolLink(dataset: string): string {
  return `/dev/zvol/${dataset}`;
}

/**
 * Where a zvol's link leads, checked: a `/dev/zd<N>` block device. Undefined while the link is
 * missing.
 * @throws {CsiError} FAILED_PRECONDITION when it leads anywhere else
 */
export async function resolveZvolDevice(
  dataset: string,
  probe: DeviceProbe = REAL_DEVICE_PROBE,
): Promise<string | undefined> {
  const link = zvolLink(dataset);
  let target: string;
  try {
    target = await probe.realPath(link);
  } catch (err) {
    if (err instanceof Deno.errors.NotFound) return undefined;
    throw err;
  }
  if (!/^\/dev\/zd\d+$/.test(target) || !(await probe.isBlockDevice(target))) {
    throw new CsiError(
      Code.FAILED_PRECONDITION,
      `"${link}" leads to "${target}", which is not a zvol's block device (/dev/zdN): refused`,
    );
  }
  return target;
}

/**
 * Waits, at most `limitMs`, for the zvol's device node.
 * @returns the `/dev/zd<N>` device
 * @throws {CsiError} UNAVAILABLE when it did not appear in time; FAILED_PRECONDITION when the
 *   link leads elsewhere
 */
export async function waitForZvolDevice(
  dataset: string,
  probe: DeviceProbe = REAL_DEVICE_PROBE,
  limitMs = DEVICE_WAIT_MS,
): Promise<string> {
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
