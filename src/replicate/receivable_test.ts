import assert from "node:assert/strict";
import { Code } from "../errors.ts";
import type { SnapshotManifest } from "../store/layout.ts";
import type { PoolStreamSupport } from "../zfs/stream_form.ts";
import { assertRejectsCsi } from "../../tests/support/assert_errors.ts";
import { checkReceivable } from "./receivable.ts";

function manifest(guid: string, over: Partial<SnapshotManifest> = {}): SnapshotManifest {
  return {
    format: 1,
    volume: "pg",
    volumeUid: "0123456789abcdef0123456789abcdef",
    guid,
    baseGuid: null,
    snapshot: `.backup-1700000000-${guid}`,
    kind: "scheduled",
    createdAt: "2026-11-23T10:00:00.000Z",
    stream: `v1/volumes/pg/streams/${BigInt(guid).toString(16).padStart(16, "0")}-0a0b0c0d.zfs`,
    size: 10,
    sha256: "a".repeat(64),
    raw: false,
    node: "n1",
    capacityBytes: 1 << 30,
    ...over,
  };
}

const COMPRESSED = {
  compressed: true,
  largeBlocks: true,
  embedded: true,
  features: ["compressed", "embed_data", "large_blocks", "lz4", "sa_spill"],
};

/** A streamSupport that answers `answers` in turn (the last one again), counting the reads. */
function pools(...answers: Omit<PoolStreamSupport, "pool">[]) {
  const reads: { pool: string; fresh: boolean }[] = [];
  return {
    reads,
    zfs: {
      streamSupport: (pool: string, options: { fresh?: boolean } = {}) => {
        reads.push({ pool, fresh: options.fresh === true });
        const answer = answers[Math.min(reads.length, answers.length) - 1]!;
        return Promise.resolve({ pool, ...answer });
      },
    },
  };
}

const FUSE = { zfsVersion: undefined, poolVersion: "23", features: new Map() };
const OPENZFS = {
  zfsVersion: "2.1.11",
  poolVersion: "-",
  features: new Map([
    ["lz4_compress", "active"],
    ["large_blocks", "enabled"],
    ["embedded_data", "active"],
  ]),
};

Deno.test("checkReceivable asks nothing of zfs for plain streams and old manifests", async () => {
  const { zfs, reads } = pools(FUSE);
  const plain = { compressed: false, largeBlocks: false, embedded: false, features: [] };
  await checkReceivable(zfs, "tank/nomad/v", [manifest("1"), manifest("2", { form: plain })]);
  assert.deepEqual(reads, []);
});

Deno.test("checkReceivable passes a compressed chain on a pool that has its features", async () => {
  const { zfs, reads } = pools(OPENZFS);
  await checkReceivable(zfs, "tank/nomad/.restore-1", [
    manifest("1", { form: COMPRESSED }),
    manifest("2", { baseGuid: "1", form: COMPRESSED }),
  ]);
  assert.deepEqual(reads, [{ pool: "tank", fresh: false }]);
});

Deno.test("checkReceivable refuses on zfs-fuse before anything is received, naming form and lack", async () => {
  const { zfs, reads } = pools(FUSE);
  const err = await assertRejectsCsi(
    checkReceivable(zfs, "tpool/nomad/v", [
      manifest("1"),
      manifest("2", { baseGuid: "1", form: COMPRESSED }),
    ]),
    Code.FAILED_PRECONDITION,
  );
  assert.match(err.message, /cannot receive stored snapshot "\.backup-1700000000-2" \(guid 2\)/);
  assert.match(err.message, /compressed, large-block, embedded-data stream \(zfs send -c -L -e\)/);
  assert.match(err.message, /pool "tpool" lacks pool feature flags \(pool "tpool" is version 23/);
  assert.match(err.message, /Nothing was received/);
  // Read again before refusing: an upgrade since the first read would count.
  assert.deepEqual(reads.map((r) => r.fresh), [false, true]);
});

Deno.test("checkReceivable names the pool feature an OpenZFS pool lacks", async () => {
  const off = {
    ...OPENZFS,
    features: new Map([...OPENZFS.features, ["large_blocks", "disabled"]]),
  };
  const { zfs } = pools(off);
  const err = await assertRejectsCsi(
    checkReceivable(zfs, "tank/v", [manifest("1", { form: COMPRESSED })]),
    Code.FAILED_PRECONDITION,
  );
  assert.match(err.message, /lacks feature@large_blocks \(disabled; the stream has large_blocks\)/);
  assert.match(err.message, /zpool set feature@<name>=enabled tank/);
});

Deno.test("checkReceivable goes on when the fresh read finds the pool upgraded", async () => {
  const { zfs, reads } = pools(FUSE, OPENZFS);
  await checkReceivable(zfs, "tank/v", [manifest("1", { form: COMPRESSED })]);
  assert.equal(reads.length, 2);
});
