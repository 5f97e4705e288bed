import assert from "node:assert/strict";
import { Logger } from "../log.ts";
import { parseVolumeRecord } from "../store/chain.ts";
import { streamKey, volumeRecordKey } from "../store/layout.ts";
import { type BackupHarness, backupHarness, T0 } from "../../tests/support/backup_harness.ts";
import { backupVolume } from "./backup.ts";
import { StorePruner } from "./prune.ts";

const HOUR = 3_600_000;
const DAY = 24 * HOUR;
const encoder = new TextEncoder();

/** A store holding volumes "pg" (3 backups, one chain) and "web" (1 backup). */
async function twoVolumes(): Promise<BackupHarness> {
  const h = backupHarness();
  const pg = h.volume("pg");
  const web = h.volume("web");
  for (let i = 0; i < 3; i++) {
    await backupVolume(h.deps, pg);
    h.clock.ms += HOUR;
  }
  await backupVolume(h.deps, web);
  return h;
}

/** Marks a volume's record deleted at `atMs`. */
function markDeleted(h: BackupHarness, volumeKey: string, atMs: number): void {
  const key = volumeRecordKey(volumeKey);
  const record = parseVolumeRecord(h.store.peek(key)!);
  const deleted = { ...record, deletedAt: new Date(atMs).toISOString() };
  h.store.poke(key, encoder.encode(JSON.stringify(deleted, null, 2)));
}

function pruner(h: BackupHarness, clocks: { wall: number; mono: number }) {
  return new StorePruner({
    store: h.store,
    log: new Logger("error", {}, () => {}),
    deletedRetentionMs: 7 * DAY,
    now: () => clocks.wall,
    monotonic: () => clocks.mono,
  });
}

/** Records the store's deletions, shortened to "<volume> <what>". */
function recordDeletes(h: BackupHarness): string[] {
  const deletes: string[] = [];
  const del = h.store.delete.bind(h.store);
  h.store.delete = (key: string) => {
    deletes.push(key.replace(/^v1\/volumes\//, "").replace(/-[0-9a-f]+\.zfs$/, ".zfs"));
    return del(key);
  };
  return deletes;
}

Deno.test("StorePruner removes a deleted volume after the retention: leaves first, record last", async () => {
  const h = await twoVolumes();
  const clocks = { wall: T0 + 7 * DAY, mono: 0 };
  markDeleted(h, "pg", T0 + 1);
  const before = h.store.keys();
  const deletes = recordDeletes(h);
  const p = pruner(h, clocks);
  // Not yet: 7 days after deletedAt is a millisecond away.
  assert.deepEqual(await p.prune(), { volumes: [], orphans: [] });
  assert.deepEqual(h.store.keys(), before);
  clocks.wall += 1;
  assert.deepEqual(await p.prune(), { volumes: ["pg"], orphans: [] });
  assert.ok(h.store.keys().every((k) => k.startsWith("v1/volumes/web/")), h.store.keys().join());
  // Every manifest first, the newest (the leaf) first, then the streams, the record last.
  const shapes = deletes.map((d) => d.replace(/[0-9a-f]{16}/, "G"));
  assert.deepEqual(shapes, [
    "pg/snapshots/G.json",
    "pg/snapshots/G.json",
    "pg/snapshots/G.json",
    "pg/streams/G.zfs",
    "pg/streams/G.zfs",
    "pg/streams/G.zfs",
    "pg/volume.json",
  ]);
  const guidsInOrder = deletes.filter((d) => d.includes("/snapshots/"))
    .map((d) => BigInt(`0x${/[0-9a-f]{16}/.exec(d)![0]}`));
  assert.deepEqual(guidsInOrder, [...guidsInOrder].sort((a, b) => (a < b ? 1 : -1)));
});

Deno.test("StorePruner stops when the deleted volume's record changes meanwhile", async () => {
  const h = await twoVolumes();
  markDeleted(h, "pg", T0);
  const deletes = recordDeletes(h);
  const del = h.store.delete;
  h.store.delete = async (key: string) => {
    await del(key);
    // A backup of the same uid clears deletedAt after the first removal.
    if (deletes.length === 1) {
      const record = parseVolumeRecord(h.store.peek(volumeRecordKey("pg"))!);
      const { deletedAt: _, ...live } = record;
      h.store.poke(volumeRecordKey("pg"), encoder.encode(JSON.stringify(live)));
    }
  };
  const result = await pruner(h, { wall: T0 + 30 * DAY, mono: 0 }).prune();
  assert.deepEqual(result.volumes, []);
  // The first manifest and its stream went (nothing listed needs it); nothing after.
  assert.equal(deletes.length, 2);
  assert.ok(h.store.peek(volumeRecordKey("pg")));
});

Deno.test("StorePruner removes an orphan stream a day after it first saw it, by monotonic time", async () => {
  const h = await twoVolumes();
  const orphan = streamKey("pg", "12345", "00ff00ff");
  await h.store.putStream(orphan, ReadableStream.from([new Uint8Array([1])]));
  // The stream of a manifest that cannot be read is no orphan.
  const unreadable = streamKey("pg", "777", "00ff00ff");
  await h.store.putStream(unreadable, ReadableStream.from([new Uint8Array([1])]));
  h.store.poke("v1/volumes/pg/snapshots/0000000000000309.json", encoder.encode("{"));
  const clocks = { wall: T0, mono: 1000 };
  const p = pruner(h, clocks);
  assert.deepEqual(await p.prune(), { volumes: [], orphans: [] });
  // The wall clock jumping ahead changes nothing.
  clocks.wall += 30 * DAY;
  clocks.mono += DAY - 1;
  assert.deepEqual(await p.prune(), { volumes: [], orphans: [] });
  clocks.mono += 1;
  assert.deepEqual(await p.prune(), { volumes: [], orphans: [orphan] });
  assert.equal(h.store.peek(orphan), undefined);
  assert.ok(h.store.peek(unreadable));
  // Every stream a manifest points to is still there.
  assert.equal(h.store.keys().filter((k) => k.includes("/streams/")).length, 5);
});

Deno.test("StorePruner forgets an orphan that got its manifest, and starts its day again", async () => {
  const h = backupHarness();
  const ds = h.volume("pg");
  await backupVolume(h.deps, ds);
  // A stream whose manifest is written while the pruner watches it: hide the manifest first.
  const manifestKey = h.store.keys().find((k) => k.includes("/snapshots/"))!;
  const bytes = h.store.peek(manifestKey)!;
  await h.store.delete(manifestKey);
  const clocks = { wall: T0, mono: 0 };
  const p = pruner(h, clocks);
  await p.prune();
  h.store.poke(manifestKey, bytes);
  clocks.mono += HOUR;
  await p.prune();
  await h.store.delete(manifestKey);
  clocks.mono += DAY - HOUR;
  // Seen orphaned again only now: not a day yet.
  assert.deepEqual((await p.prune()).orphans, []);
});

Deno.test("StorePruner removes the store's temporary leftovers at each pass, and goes on when that fails", async () => {
  const h = backupHarness();
  let calls = 0;
  const p = new StorePruner({
    store: h.store,
    log: new Logger("error", {}, () => {}),
    deletedRetentionMs: 7 * DAY,
    cleanTemp: () => {
      calls++;
      return calls === 1 ? Promise.resolve(2) : Promise.reject(new Error("EIO"));
    },
  });
  await p.prune();
  await p.prune();
  assert.equal(calls, 2);
});
