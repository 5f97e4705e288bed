import assert from "node:assert/strict";
import { MemoryStore } from "../../tests/support/memory_store.ts";
import { Logger } from "../log.ts";
import { type Store, StoreError } from "../store/store.ts";
import { render } from "./exposition.ts";
import { PROBE_KEY, storeSource } from "./store.ts";

const log = new Logger("error", {}, () => {});

Deno.test("zfs_csi_store_up is 1 when the store answers a small read, 0 when it fails or hangs", async () => {
  const ok = storeSource(new MemoryStore(), { timeoutMs: 1000, log });
  assert.match(render(await ok.collect()), /^zfs_csi_store_up 1$/m);
  let reads = 0;
  const store = new MemoryStore();
  const failing: Store = Object.assign(Object.create(store), {
    description: "failing store",
    getBytes: (key: string) => {
      reads++;
      assert.equal(key, PROBE_KEY);
      return Promise.reject(new StoreError("unavailable", "connection refused"));
    },
  });
  const down = storeSource(failing, { timeoutMs: 1000, log });
  assert.match(render(await down.collect()), /^zfs_csi_store_up 0$/m);
  assert.equal(reads, 1);
  const hanging: Store = Object.assign(Object.create(store), {
    getBytes: () => new Promise(() => {}),
  });
  const slow = storeSource(hanging, { timeoutMs: 20, log });
  const text = render(await slow.collect());
  assert.match(text, /^zfs_csi_store_up 0$/m);
  assert.match(text, /^zfs_csi_store_probe_duration_seconds 0\.0\d+/m);
});
