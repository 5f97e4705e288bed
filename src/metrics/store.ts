/**
 * Whether the plugin's store answers, for `zfs_csi_store_up`: one small read of a key that never
 * exists, in each collection (shared by every scrape for a few seconds, metrics.ts). The store
 * answering "no such object" is the store working; a time-out, a refusal (credentials) or an
 * error is 0. Never a listing, whose cost grows with the store.
 */

import type { Logger } from "../log.ts";
import type { Store } from "../store/store.ts";
import type { MetricSource } from "./collector.ts";
import { gauge } from "./exposition.ts";

/** The key read: a valid key no zfs-csi version writes. */
export const PROBE_KEY = "v1/zfs-csi-reachability-probe";

/** The `store` source: zfs_csi_store_up and how long the probe took. */
export function storeSource(
  store: Store,
  opts: { readonly timeoutMs: number; readonly log: Logger },
): MetricSource {
  let down = false;
  return {
    name: "store",
    async collect() {
      const started = performance.now();
      let timer: ReturnType<typeof setTimeout> | undefined;
      let up = 1;
      try {
        await Promise.race([
          store.getBytes(PROBE_KEY),
          new Promise((_, reject) => {
            timer = setTimeout(
              () => reject(new Error(`no answer within ${opts.timeoutMs} ms`)),
              opts.timeoutMs,
            );
          }),
        ]);
        if (down) opts.log.info("the store answers again", { store: store.description });
        down = false;
      } catch (err) {
        up = 0;
        if (!down) {
          opts.log.warn("the store does not answer", { store: store.description, error: err });
        }
        down = true;
      } finally {
        clearTimeout(timer);
      }
      return [
        gauge(
          "zfs_csi_store_up",
          "1 when the backup store answered a small read at the last collection, else 0.",
          [{ labels: {}, value: up }],
        ),
        gauge(
          "zfs_csi_store_probe_duration_seconds",
          "How long that read took (to its answer or its time-out).",
          [{ labels: {}, value: (performance.now() - started) / 1000 }],
        ),
      ];
    },
  };
}
