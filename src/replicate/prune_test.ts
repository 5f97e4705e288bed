import assert from "node:assert/strict";
import { Logger } from "../log.ts";
import { parseVolumeRecord } from "../store/chain.ts";
import { streamKey, volumeRecordKey } from "../store/layout.ts";
import { StoreError } from "../store/store.ts";
import {
  type BackupHarness,
  backupHarness,
  type LogLine,
  T0,
} from "../../tests/support/backup_harness.ts";
import { backupVolume } from "./backup.ts";
import { StorePruner } from "./prune.ts";

const MINUTE = 60_000;
const HOUR = 60 * MINUTE;
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

/**
 * The pruner's wall and monotonic clocks, and the store's own clock (stamping each write, as
 * S3's LastModified does); without `store` the store gives no times.
 */
interface Clocks {
  wall: number;
  mono: number;
  store?: number;
}

function pruner(
  h: BackupHarness,
  clocks: Clocks,
  options: { retentionMs?: number; logs?: LogLine[] } = {},
) {
  h.store.clock = clocks.store === undefined ? undefined : () => clocks.store!;
  const logs = options.logs;
  return new StorePruner({
    store: h.store,
    log: new Logger("info", {}, (line) => logs?.push(JSON.parse(line))),
    node: "n1",
    deletedRetentionMs: options.retentionMs ?? 7 * DAY,
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
  const clocks: Clocks = { wall: T0 + 7 * DAY, mono: 0, store: T0 };
  const p = pruner(h, clocks);
  markDeleted(h, "pg", T0 + 1);
  const before = h.store.keys();
  const deletes = recordDeletes(h);
  // The store says 7 days; the wall clock that 7 days after deletedAt is a millisecond away.
  clocks.store = T0 + 7 * DAY;
  assert.deepEqual(await p.prune(), { volumes: [], orphans: [] });
  assert.deepEqual(h.store.keys(), before);
  clocks.wall += 1;
  assert.deepEqual(await p.prune(), { volumes: ["pg"], orphans: [] });
  assert.ok(h.store.keys().every((k) => k.startsWith("v1/volumes/web/")), h.store.keys().join());
  // Every manifest first, the newest (the leaf) first, then the streams, the record last.
  const shapes = deletes.map((d) => d.replace(/[0-9a-f]{16}/, "G"));
  assert.deepEqual(shapes, [
    "v1/probe/clock-n1",
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
  const clocks: Clocks = { wall: T0 + 30 * DAY, mono: 0, store: T0 };
  const p = pruner(h, clocks);
  markDeleted(h, "pg", T0);
  clocks.store = T0 + 30 * DAY;
  const deletes = recordDeletes(h);
  const del = h.store.delete;
  h.store.delete = async (key: string) => {
    await del(key);
    // A backup of the same uid clears deletedAt after the first removal (after the probe's).
    if (deletes.length === 2) {
      const record = parseVolumeRecord(h.store.peek(volumeRecordKey("pg"))!);
      const { deletedAt: _, ...live } = record;
      h.store.poke(volumeRecordKey("pg"), encoder.encode(JSON.stringify(live)));
    }
  };
  const result = await p.prune();
  assert.deepEqual(result.volumes, []);
  // The store clock's probe, then the first manifest and its stream went (nothing listed
  // needs it); nothing after.
  assert.equal(deletes.length, 3, deletes.join());
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
    node: "n1",
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

// The deleted retention counts on the store's clock (issue 21): `deletedAt` is the deleting
// node's wall clock, and comparing it with the pruning node's would let two clocks that
// disagree remove a deleted volume's backups early.

/** When the delete really happened, on the store's clock. */
const S0 = T0 + 100 * DAY;
const RETENTION = 30 * DAY;

/** A store whose "pg" was marked deleted at store time S0, with `deletedAt` as given. */
async function deletedAtS0(deletedAtMs: number): Promise<{ h: BackupHarness; clocks: Clocks }> {
  const h = await twoVolumes();
  const clocks: Clocks = { wall: S0, mono: 0, store: S0 };
  h.store.clock = () => clocks.store!;
  markDeleted(h, "pg", deletedAtMs);
  return { h, clocks };
}

function probes(h: BackupHarness): string[] {
  return h.store.keys().filter((k) => k.startsWith("v1/probe/"));
}

Deno.test("StorePruner keeps a deleted volume whose deleting node's clock was 40 days behind until the store says the retention passed", async () => {
  const { h, clocks } = await deletedAtS0(S0 - 40 * DAY);
  // The pruner's clock agrees with the store's; one minute after the delete.
  clocks.wall = clocks.store = S0 + MINUTE;
  const p = pruner(h, clocks, { retentionMs: RETENTION });
  assert.deepEqual((await p.prune()).volumes, []);
  assert.ok(h.store.peek(volumeRecordKey("pg")));
  assert.deepEqual(probes(h), []);
  clocks.wall = clocks.store = S0 + RETENTION - 1;
  assert.deepEqual((await p.prune()).volumes, []);
  clocks.wall = clocks.store = S0 + RETENTION;
  assert.deepEqual((await p.prune()).volumes, ["pg"]);
  assert.deepEqual(probes(h), []);
});

Deno.test("StorePruner keeps a deleted volume while the pruning node's clock is 40 days ahead, until the store says the retention passed", async () => {
  const { h, clocks } = await deletedAtS0(S0);
  clocks.store = S0 + MINUTE;
  clocks.wall = S0 + 40 * DAY + MINUTE;
  const p = pruner(h, clocks, { retentionMs: RETENTION });
  assert.deepEqual((await p.prune()).volumes, []);
  assert.ok(h.store.peek(volumeRecordKey("pg")));
  clocks.store = S0 + RETENTION - 1;
  clocks.wall = S0 + 40 * DAY + RETENTION - 1;
  assert.deepEqual((await p.prune()).volumes, []);
  clocks.store += 1;
  assert.deepEqual((await p.prune()).volumes, ["pg"]);
});

Deno.test("StorePruner removes only when both the store's clock and the wall clock say the retention passed", async () => {
  // The deleting node's clock 40 days ahead: the store says 30 days, deletedAt says not yet.
  const ahead = await deletedAtS0(S0 + 40 * DAY);
  ahead.clocks.wall = ahead.clocks.store = S0 + RETENTION;
  const p = pruner(ahead.h, ahead.clocks, { retentionMs: RETENTION });
  assert.deepEqual((await p.prune()).volumes, []);
  ahead.clocks.wall = ahead.clocks.store = S0 + 40 * DAY + RETENTION;
  assert.deepEqual((await p.prune()).volumes, ["pg"]);

  // The store's clock stepped 40 days forward; the nodes' clocks are right.
  const stepped = await deletedAtS0(S0);
  stepped.clocks.store = S0 + 40 * DAY;
  stepped.clocks.wall = S0 + MINUTE;
  const q = pruner(stepped.h, stepped.clocks, { retentionMs: RETENTION });
  assert.deepEqual((await q.prune()).volumes, []);
  assert.ok(stepped.h.store.peek(volumeRecordKey("pg")));
});

Deno.test("StorePruner counts a deleted record rewritten later from the rewrite: the retention only gets longer", async () => {
  const { h, clocks } = await deletedAtS0(S0);
  // Rewritten 20 days later with the same deletedAt (as a record rewritten in place would be).
  clocks.store = S0 + 20 * DAY;
  h.store.poke(volumeRecordKey("pg"), h.store.peek(volumeRecordKey("pg"))!);
  clocks.wall = clocks.store = S0 + RETENTION;
  const p = pruner(h, clocks, { retentionMs: RETENTION });
  assert.deepEqual((await p.prune()).volumes, []);
  clocks.wall = clocks.store = S0 + 20 * DAY + RETENTION - 1;
  assert.deepEqual((await p.prune()).volumes, []);
  clocks.wall = clocks.store += 1;
  assert.deepEqual((await p.prune()).volumes, ["pg"]);
});

Deno.test("StorePruner does not age a record by a listing of another version of it", async () => {
  const h = await twoVolumes();
  const clocks: Clocks = { wall: S0, mono: 0, store: S0 - 60 * DAY };
  const p = pruner(h, clocks, { retentionMs: RETENTION });
  const key = volumeRecordKey("pg");
  // The live record, written 60 days ago by the store's clock.
  h.store.poke(key, h.store.peek(key)!);
  clocks.store = S0;
  // Deleted by a node whose clock is 40 days behind, right after the pruner listed the store.
  const list = h.store.list.bind(h.store);
  h.store.list = async (prefix, options) => {
    const listed = await list(prefix, options);
    if (prefix === "v1/volumes/" && h.store.peek(key) && !isDeleted(h, "pg")) {
      markDeleted(h, "pg", S0 - 40 * DAY);
    }
    return listed;
  };
  assert.deepEqual((await p.prune()).volumes, []);
  assert.ok(isDeleted(h, "pg"));
  // The next pass sees the deleted version: written just now.
  clocks.wall = clocks.store = S0 + MINUTE;
  assert.deepEqual((await p.prune()).volumes, []);
  clocks.wall = clocks.store = S0 + RETENTION;
  assert.deepEqual((await p.prune()).volumes, ["pg"]);
});

function isDeleted(h: BackupHarness, volumeKey: string): boolean {
  return parseVolumeRecord(h.store.peek(volumeRecordKey(volumeKey))!).deletedAt !== undefined;
}

Deno.test("StorePruner keeps a deleted volume when the store gives no times, and says why once", async () => {
  const h = await twoVolumes();
  markDeleted(h, "pg", T0);
  const logs: LogLine[] = [];
  const p = pruner(h, { wall: T0 + 365 * DAY, mono: 0 }, { logs });
  assert.deepEqual((await p.prune()).volumes, []);
  assert.deepEqual((await p.prune()).volumes, []);
  assert.ok(h.store.peek(volumeRecordKey("pg")));
  assert.deepEqual(probes(h), []);
  const why = logs.filter((l) => l.level === "warn");
  assert.equal(why.length, 1, JSON.stringify(logs));
  assert.match(why[0]!.msg, /no modification times/);
  assert.equal(why[0]!.volumeKey, "pg");
});

Deno.test("StorePruner keeps deleted volumes when it cannot read the store's clock, and goes on with orphans", async () => {
  const h = await twoVolumes();
  const clocks: Clocks = { wall: S0, mono: 0, store: S0 - RETENTION };
  const logs: LogLine[] = [];
  const p = pruner(h, clocks, { retentionMs: RETENTION, logs });
  markDeleted(h, "pg", S0 - RETENTION);
  markDeleted(h, "web", S0 - RETENTION);
  clocks.store = S0;
  const orphan = streamKey("pg", "12345", "00ff00ff");
  await h.store.putStream(orphan, ReadableStream.from([new Uint8Array([1])]));
  const put = h.store.putBytes.bind(h.store);
  h.store.putBytes = (key, bytes, condition, options) =>
    key.startsWith("v1/probe/")
      ? Promise.reject(new StoreError("unavailable", "the store is down"))
      : put(key, bytes, condition, options);
  assert.deepEqual(await p.prune(), { volumes: [], orphans: [] });
  clocks.mono += DAY;
  assert.deepEqual(await p.prune(), { volumes: [], orphans: [orphan] });
  assert.ok(h.store.peek(volumeRecordKey("pg")));
  assert.ok(h.store.peek(volumeRecordKey("web")));
  // Read once a pass, and said once a pass.
  const why = logs.filter((l) => /could not read the store's clock/.test(l.msg));
  assert.equal(why.length, 2, JSON.stringify(logs));
});
