/**
 * Backups of zvols (docs/block-volumes.md): a zvol's manifest says it is one, what it holds
 * and whether its filesystem was made before the snapshot (what a restore sets: see
 * src/csi/volume_kinds/stored.ts restoreZvolFrom), and records its volsize as its capacity.
 */

import assert from "node:assert/strict";
import { Code } from "../errors.ts";
import { parseManifest, parseVolumeRecord } from "../store/chain.ts";
import { manifestsPrefix, type SnapshotManifest, volumeRecordKey } from "../store/layout.ts";
import { assertRejectsCsi } from "../../tests/support/assert_errors.ts";
import { type BackupHarness, backupHarness } from "../../tests/support/backup_harness.ts";
import {
  BACKUP_INTERVAL_PROPERTY,
  BACKUP_LAST_PROPERTY,
  type BackupOutcome,
  backupSnapshot,
  backupVolume,
} from "./backup.ts";
import { BackupScheduler, isScheduledKind } from "./scheduler.ts";
import { Logger } from "../log.ts";
import { PARENT, T0 } from "../../tests/support/backup_harness.ts";

const VOLSIZE = 3 * 128 * 1024 * 1024;

function manifests(h: BackupHarness, key: string): SnapshotManifest[] {
  return h.store.keys().filter((k) => k.startsWith(manifestsPrefix(key)))
    .map((k) => parseManifest(h.store.peek(k)!));
}

function stored(outcome: BackupOutcome) {
  assert.equal(outcome.status, "stored");
  return outcome as Extract<BackupOutcome, { status: "stored" }>;
}

/** A zvol the plugin made: no refquota, a volsize, its records. */
function zvol(h: BackupHarness, name: string, records: Record<string, string>): string {
  const ds = h.volume(name, { volsize: String(VOLSIZE), volblocksize: "16384", ...records });
  h.pool.setValue(ds, "type", "volume");
  h.pool.setValue(ds, "refquota", ["-", "-"]);
  return ds;
}

Deno.test("backupVolume of a formatted ext4 zvol records a zvol holding ext4, formatted, at its volsize", async () => {
  const h = backupHarness();
  const ds = zvol(h, "files", { "org.zfs-csi:fs-type": "ext4", "org.zfs-csi:format": "done" });
  const out = stored(await backupVolume(h.deps, ds));
  const [m] = manifests(h, "files");
  assert.deepEqual(out.manifest, m);
  assert.deepEqual(m!.zvol, { content: "ext4", volblocksize: 16384, formatted: true });
  assert.equal(m!.capacityBytes, VOLSIZE);
  assert.equal(parseVolumeRecord(h.store.peek(volumeRecordKey("files"))!).capacityBytes, VOLSIZE);
  h.runner.assertNoUnexpected();
});

Deno.test("backupVolume of a zvol whose filesystem is not (or only half) made records it unformatted", async () => {
  for (const format of [undefined, "begun"]) {
    const h = backupHarness();
    const ds = zvol(h, "files", {
      "org.zfs-csi:fs-type": "xfs",
      ...(format ? { "org.zfs-csi:format": format } : {}),
    });
    stored(await backupVolume(h.deps, ds));
    assert.deepEqual(manifests(h, "files")[0]!.zvol, {
      content: "xfs",
      volblocksize: 16384,
      formatted: false,
    });
  }
});

Deno.test("backupSnapshot of a zvol: formatted only when the caller read the record done before its snapshot", async () => {
  const h = backupHarness();
  const raw = zvol(h, "disk", { "org.zfs-csi:fs-type": "block" });
  const snap = h.snapshot(raw, ".stored-a");
  stored(await backupSnapshot(h.deps, { dataset: raw, snapshot: snap, csiName: "a" }));
  assert.deepEqual(manifests(h, "disk")[0]!.zvol, {
    content: "block",
    volblocksize: 16384,
    formatted: false,
  });
  const files = zvol(h, "files", {
    "org.zfs-csi:fs-type": "ext4",
    "org.zfs-csi:format": "done",
  });
  const early = h.snapshot(files, ".stored-early");
  stored(await backupSnapshot(h.deps, { dataset: files, snapshot: early, csiName: "early" }));
  h.clock.ms += 1000;
  const late = h.snapshot(files, ".stored-late");
  stored(
    await backupSnapshot(h.deps, {
      dataset: files,
      snapshot: late,
      csiName: "late",
      formattedBefore: true,
    }),
  );
  const byName = new Map(manifests(h, "files").map((m) => [m.csiName, m]));
  assert.equal(byName.get("early")?.zvol?.formatted, false);
  assert.equal(byName.get("late")?.zvol?.formatted, true);
});

Deno.test("backupVolume refuses a zvol without the plugin's fs-type record, and sends nothing", async () => {
  const h = backupHarness();
  const ds = zvol(h, "other", {});
  await assertRejectsCsi(
    backupVolume(h.deps, ds),
    Code.FAILED_PRECONDITION,
    /not a volume of zfs-csi/,
  );
  assert.equal(h.sends.length, 0);
});

Deno.test("parseManifest reads a zvol's record and refuses one that is not right", () => {
  const base = {
    format: 1,
    volume: "disk",
    volumeUid: "0".repeat(32),
    guid: "1234",
    baseGuid: null,
    snapshot: ".backup-1-1",
    kind: "scheduled",
    createdAt: "2024-01-01T00:00:00.000Z",
    stream: `v1/volumes/disk/streams/${(1234).toString(16).padStart(16, "0")}-${
      "0".repeat(32)
    }.zfs`,
    size: 3,
    sha256: "0".repeat(64),
    raw: false,
    node: "n",
    capacityBytes: VOLSIZE,
  };
  const ok = { content: "xfs", volblocksize: 8192, formatted: true };
  assert.deepEqual(parseManifest(JSON.stringify({ ...base, zvol: ok })).zvol, ok);
  assert.equal(parseManifest(JSON.stringify(base)).zvol, undefined);
  for (
    const bad of [
      { ...ok, content: "zfs" },
      { ...ok, volblocksize: 3000 },
      { ...ok, volblocksize: 256 },
      { ...ok, formatted: "yes" },
      { content: "block", volblocksize: 8192 },
      "block",
    ]
  ) {
    assert.throws(() => parseManifest(JSON.stringify({ ...base, zvol: bad })), SyntaxError);
  }
});

Deno.test("BackupScheduler backs up a zvol the plugin made as it does a dataset, and no other zvol", async () => {
  const h = backupHarness();
  const every = { [BACKUP_INTERVAL_PROPERTY]: "900" };
  const disk = zvol(h, "disk", { "org.zfs-csi:fs-type": "block", ...every });
  const files = zvol(h, "files", { "org.zfs-csi:fs-type": "xfs", ...every });
  // A zvol without the plugin's record (made by hand, marked managed): never backed up.
  const foreign = zvol(h, "foreign", every);
  const pg = h.volume("pg", every);
  const s = new BackupScheduler({
    zfs: h.deps.zfs,
    parentDataset: PARENT,
    log: new Logger("error", {}, () => {}),
    backup: (dataset, options) => backupVolume(h.deps, dataset, options),
    now: () => T0,
    monotonic: () => 0,
  });
  await s.tick();
  await s.tick();
  await s.tick();
  assert.deepEqual(
    h.sends.map((x) => x.snapshot.split("@")[0]).sort(),
    [disk, files, pg].sort(),
  );
  for (const ds of [disk, files, pg]) {
    assert.equal(h.pool.value(ds, BACKUP_LAST_PROPERTY), String(T0 / 1000));
  }
  assert.equal(h.pool.value(foreign, BACKUP_LAST_PROPERTY), undefined);
  assert.deepEqual(manifests(h, "disk")[0]!.zvol?.content, "block");
  const props = (values: Record<string, string | readonly [string, string]>) =>
    new Map(
      Object.entries(values).map(([k, v]) => {
        const [value, source] = typeof v === "string" ? [v, "local"] : v;
        return [k, { value, source }];
      }),
    );
  const managed = { "org.zfs-csi:managed": "yes", type: ["volume", "-"] as const };
  assert.equal(
    isScheduledKind(PARENT, `${PARENT}/v`, props({ ...managed, "org.zfs-csi:fs-type": "ext4" })),
    true,
  );
  assert.equal(
    isScheduledKind(
      PARENT,
      `${PARENT}/v`,
      props({ ...managed, "org.zfs-csi:fs-type": ["ext4", `inherited from ${PARENT}`] }),
    ),
    false,
  );
  assert.equal(isScheduledKind(PARENT, `${PARENT}/v`, props(managed)), false);
});
