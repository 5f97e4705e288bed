import assert from "node:assert/strict";
import { Logger } from "../log.ts";
import { backupHarness, PARENT } from "../../tests/support/backup_harness.ts";
import { MemoryStore } from "../../tests/support/memory_store.ts";
import { BACKUP_INTERVAL_PROPERTY, backupVolume } from "../replicate/backup.ts";
import { BackupScheduler } from "../replicate/scheduler.ts";
import { parseManifest, parseVolumeRecord } from "../store/chain.ts";
import { StoreError } from "../store/store.ts";
import { keepHostBackups } from "./backups.ts";
import { hostStoreName } from "../volume/host_names.ts";

const HOST = `${PARENT}/.host-default_pgdata`;
const HOST_KEY = "v1/volumes/:2ehost-default_pgdata/";

/** A host volume as the DHV create leaves it, with a 15-minute schedule. */
function hostVolume(h: ReturnType<typeof backupHarness>, dataset = HOST): string {
  h.pool.add(dataset, {
    "org.zfs-csi:managed": "yes",
    "org.zfs-csi:host-volume-id": "7b0e9c34-52f1-4c1e-9d7e-0a1b2c3d4e5f",
    "org.zfs-csi:host-namespace": "default",
    refquota: String(1 << 30),
    [BACKUP_INTERVAL_PROPERTY]: "900",
  });
  return dataset;
}

Deno.test("the scheduler backs up host volumes under their own store key, apart from a CSI volume of the same name", async () => {
  const h = backupHarness();
  const host = hostVolume(h);
  const csi = h.volume("pgdata", { [BACKUP_INTERVAL_PROPERTY]: "900" });
  // Hidden children other than host volumes, and a host name without the marker, stay out.
  h.pool.add(`${PARENT}/.host-default_foreign`, { [BACKUP_INTERVAL_PROPERTY]: "900" });
  h.pool.add(`${PARENT}/.deleted-1-.host-default_old`, {
    "org.zfs-csi:managed": "yes",
    [BACKUP_INTERVAL_PROPERTY]: "900",
  });
  const backedUp: string[] = [];
  const s = new BackupScheduler({
    zfs: h.deps.zfs,
    parentDataset: PARENT,
    log: new Logger("error", {}, () => {}),
    backup: (dataset, options) => {
      backedUp.push(dataset);
      return backupVolume(h.deps, dataset, options);
    },
    now: () => h.clock.ms,
  });
  await s.tick();
  assert.deepEqual(backedUp.sort(), [host, csi].sort());
  assert.equal(s.status(host)?.failures, 0, JSON.stringify(s.status(host)));
  const hostKeys = h.store.keys().filter((k) => k.startsWith(HOST_KEY));
  const csiKeys = h.store.keys().filter((k) => k.startsWith("v1/volumes/pgdata/"));
  assert.equal(hostKeys.filter((k) => k.includes("/snapshots/")).length, 1);
  assert.equal(csiKeys.filter((k) => k.includes("/snapshots/")).length, 1);
  const record = parseVolumeRecord(h.store.peek(`${HOST_KEY}volume.json`)!);
  assert.equal(record.name, ".host-default_pgdata");
  assert.equal(record.uid, h.pool.value(host, "org.zfs-csi:store-uid"));
  assert.notEqual(record.uid, h.pool.value(csi, "org.zfs-csi:store-uid"));
  const manifestKey = hostKeys.find((k) => k.includes("/snapshots/"))!;
  const manifest = parseManifest(h.store.peek(manifestKey)!, { key: manifestKey });
  assert.equal(manifest.volume, ".host-default_pgdata");
  assert.ok(manifest.stream.startsWith(`${HOST_KEY}streams/`));
  assert.match(h.pool.value(host, "org.zfs-csi:backup-last") ?? "", /^\d+$/);
});

Deno.test("keepHostBackups marks the record of the dataset's uid deleted; a failing store does not stop the delete", async () => {
  const h = backupHarness();
  const host = hostVolume(h);
  await backupVolume(h.deps, host);
  const logs: Record<string, unknown>[] = [];
  const deps = {
    zfs: h.deps.zfs,
    parentDataset: PARENT,
    openStore: () => Promise.resolve(h.store),
    log: new Logger("debug", {}, (line) => logs.push(JSON.parse(line))),
    now: () => Date.UTC(2026, 0, 2),
  };
  assert.equal(await keepHostBackups(deps, host), true);
  const record = parseVolumeRecord(h.store.peek(`${HOST_KEY}volume.json`)!);
  assert.equal(record.deletedAt, "2026-01-02T00:00:00.000Z");
  // Marked already: left as it is.
  assert.equal(await keepHostBackups({ ...deps, now: () => Date.UTC(2027, 0, 1) }, host), false);
  assert.equal(
    parseVolumeRecord(h.store.peek(`${HOST_KEY}volume.json`)!).deletedAt,
    "2026-01-02T00:00:00.000Z",
  );
  // Never backed up (no uid of its own): nothing to mark, the store is not opened.
  const fresh = hostVolume(h, `${PARENT}/.host-default_fresh`);
  let opened = false;
  const watch = { ...deps, openStore: () => ((opened = true), Promise.resolve(h.store)) };
  assert.equal(await keepHostBackups(watch, fresh), false);
  assert.equal(opened, false);
  // An unreachable store: warned, not thrown.
  const down = new MemoryStore();
  down.getBytes = () => Promise.reject(new StoreError("unavailable", "store is down"));
  h.pool.setValue(fresh, "org.zfs-csi:store-uid", "a".repeat(32));
  assert.equal(
    await keepHostBackups({ ...deps, openStore: () => Promise.resolve(down) }, fresh),
    false,
  );
  assert.ok(
    logs.some((l) =>
      l.msg === "could not mark the host volume's backups deleted; they stay in the store"
    ),
  );
});

Deno.test("hostStoreName is the dataset component; other children and overlong names are refused", () => {
  assert.equal(hostStoreName(PARENT, HOST), ".host-default_pgdata");
  assert.throws(() => hostStoreName(PARENT, `${PARENT}/pgdata`), /is not a host volume/);
  assert.throws(() => hostStoreName(PARENT, `${PARENT}/.host-a/b`), /is not a host volume/);
  assert.throws(
    () => hostStoreName(PARENT, `${PARENT}/.host-default_${"x".repeat(120)}`),
    /longer than 128 bytes/,
  );
});
