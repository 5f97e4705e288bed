/**
 * The store pruner on a real store (a directory, an S3 server): a deleted volume's age is
 * measured on the store's own clock, read from real listings, so that neither a deleting node
 * whose clock is behind nor a pruning node whose clock is ahead makes its backups go early
 * (src/replicate/prune.ts). Called by the file store's test and the S3 store's integration
 * test with an empty store.
 */

import assert from "node:assert/strict";
import { Logger } from "../../src/log.ts";
import { StorePruner } from "../../src/replicate/prune.ts";
import { encodeJson } from "../../src/store/chain.ts";
import {
  LAYOUT_PREFIX,
  streamKey,
  type VolumeRecord,
  volumeRecordKey,
} from "../../src/store/layout.ts";
import type { Store } from "../../src/store/store.ts";

const DAY = 86_400_000;

/** Writes the record of volume "pg", deleted at `deletedAtMs` by some node's clock. */
async function deletedVolume(store: Store, deletedAtMs: number): Promise<void> {
  const record: VolumeRecord = {
    format: 1,
    name: "pg",
    uid: "0123456789abcdef0123456789abcdef",
    createdAt: new Date(deletedAtMs - DAY).toISOString(),
    capacityBytes: 1024,
    parameters: {},
    node: "a",
    deletedAt: new Date(deletedAtMs).toISOString(),
  };
  await store.putBytes(volumeRecordKey("pg"), encodeJson(record));
}

/**
 * Checks the pruner on `store` (empty: it lists the whole layout). Ends with the store empty.
 */
export async function checkDeletedRetentionOnStoreClock(store: Store): Promise<void> {
  const pruner = (wallMs: number, retentionMs: number) =>
    new StorePruner({
      store,
      log: new Logger("error", {}, () => {}),
      node: `test-${crypto.randomUUID()}`,
      deletedRetentionMs: retentionMs,
      now: () => wallMs,
    });
  const stream = streamKey("pg", "12345", "00ff00ff");
  await store.putStream(stream, ReadableStream.from([new Uint8Array([1, 2, 3])]));

  // Deleted by a node whose clock is 40 days behind: by the store's clock, seconds ago.
  await deletedVolume(store, Date.now() - 40 * DAY);
  assert.deepEqual((await pruner(Date.now(), DAY).prune()).volumes, []);
  // Deleted by a node whose clock is right, pruned by one whose clock is 40 days ahead.
  await deletedVolume(store, Date.now());
  assert.deepEqual((await pruner(Date.now() + 40 * DAY, DAY).prune()).volumes, []);
  assert.ok(await store.getBytes(volumeRecordKey("pg")), "the record is still there");
  assert.ok((await store.list(stream)).length === 1, "the stream is still there");

  // With no retention, the store's clock says it passed: all of it goes, the probe too.
  assert.deepEqual((await pruner(Date.now() + 40 * DAY, 0).prune()).volumes, ["pg"]);
  assert.deepEqual(await store.list(`${LAYOUT_PREFIX}/`), []);
}
