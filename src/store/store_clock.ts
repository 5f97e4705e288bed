/**
 * The store's own clock, read the only way every backend allows: write a small probe object
 * and look at the time its listing gives it (S3's LastModified, the directory store's mtime:
 * the clock that stamps every other object too). Times from one store can then be compared
 * with each other without trusting any node's wall clock, and without two nodes' clocks ever
 * being compared: how the store pruner ages a deleted volume's record (src/replicate/prune.ts).
 *
 * Why a probe and not an answer's `Date` header: that header may come from another machine
 * (a proxy, a load balancer) than the one stamping objects, and a directory store has none. A
 * probe's time is on the stamping clock, and it is never later than the store's "now" at any
 * moment after it was listed, so an age measured against it is never too long.
 */

import { PROBE_PREFIX } from "./check.ts";
import { type RequestOptions, type Store, StoreError } from "./store.ts";

/** The key of `node`'s clock probe: one per node, rewritten at each reading. */
export function clockProbeKey(node: string): string {
  return `${PROBE_PREFIX}clock-${node}`;
}

/**
 * The store's clock now, in ms since the epoch, or undefined when its listings give no time.
 * Writes `node`'s probe, lists it, and deletes it again (best effort: the next reading
 * rewrites it). Two readers of one node may meet on the key; either time read is one the
 * store stamped before the listing, so still never later than its "now".
 * @throws {StoreError} when the store fails, or does not list the probe just written (another
 * reader deleted it, or the listing lags behind writes): unavailable, try again later
 */
export async function readStoreClock(
  store: Store,
  node: string,
  options: RequestOptions = {},
): Promise<number | undefined> {
  const key = clockProbeKey(node);
  const bytes = new TextEncoder().encode(`zfs-csi store clock probe of ${node}\n`);
  await store.putBytes(key, bytes, undefined, options);
  try {
    const probe = (await store.list(key, options)).find((o) => o.key === key);
    if (probe === undefined) {
      throw new StoreError(
        "unavailable",
        `${store.description} did not list "${key}" right after it was written`,
      );
    }
    const time = probe.lastModifiedMs;
    return time !== undefined && Number.isFinite(time) ? time : undefined;
  } finally {
    await store.delete(key, options).catch(() => {});
  }
}
