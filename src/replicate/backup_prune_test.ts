import assert from "node:assert/strict";
import { chainTo, parseManifest } from "../store/chain.ts";
import { manifestsPrefix, type SnapshotManifest } from "../store/layout.ts";
import { StoreError } from "../store/store.ts";
import { type BackupHarness, backupHarness } from "../../tests/support/backup_harness.ts";
import { Prng, seedFrom } from "../../tests/support/prng.ts";
import { BACKUP_KEEP_PROPERTY, backupSnapshot, backupVolume } from "./backup.ts";

const MINUTE = 60_000;

function manifests(h: BackupHarness): SnapshotManifest[] {
  return h.store.keys().filter((k) => k.startsWith(manifestsPrefix("pg")))
    .map((k) => parseManifest(h.store.peek(k)!, { key: k }));
}

/**
 * Random histories of backups, requested snapshots, failed uploads and deleted CSI snapshots,
 * each backup pruning the store by a random keep policy: after every step each manifest's
 * stream and base are there (so every stored snapshot restores), requested snapshots stay,
 * and at most two `.backup-*` snapshots are left on the node.
 */
Deno.test("backups over random histories never leave a manifest without its base", async () => {
  const seed = seedFrom(Deno.env.get("ZFS_CSI_TEST_SEED"), 1212);
  const rng = new Prng(seed);
  for (let trial = 0; trial < 12; trial++) {
    const keep = `last=${rng.int(1, 4)},hourly=${rng.int(0, 5)},daily=${rng.int(0, 3)}`;
    const h = backupHarness({
      maxChainLength: rng.int(2, 8),
      maxChainAgeMs: rng.int(1, 48) * 60 * MINUTE,
    });
    const ds = h.volume("pg", { [BACKUP_KEEP_PROPERTY]: keep });
    const requested = new Set<string>();
    let lastStored: string | undefined;
    let csi = 0;
    for (let step = 0; step < 60; step++) {
      const ctx = `seed ${seed}, trial ${trial}, step ${step}, keep ${keep}`;
      h.clock.ms += rng.pick([MINUTE, 15 * MINUTE, 60 * MINUTE, 6 * 60 * MINUTE, 1440 * MINUTE]);
      const roll = rng.next();
      if (roll < 0.1) {
        const snapshot = h.snapshot(ds, `csi-${++csi}`);
        const out = await backupSnapshot(h.deps, { dataset: ds, snapshot, csiName: `csi-${csi}` });
        if (out.status === "stored") requested.add(out.manifest.guid);
      } else if (roll < 0.15) {
        const mine = h.pool.names().filter((n) => n.startsWith(`${ds}@csi-`));
        if (mine.length > 0) await h.deps.zfs.destroy(rng.pick(mine));
      } else if (roll < 0.22) {
        h.failSend = new StoreError("unavailable", "store down");
        await assert.rejects(backupVolume(h.deps, ds), /store down/, ctx);
        h.failSend = undefined;
      } else {
        const out = await backupVolume(h.deps, ds);
        assert.equal(out.status, "stored", ctx);
        if (out.status === "stored") lastStored = out.manifest.guid;
      }
      const all = manifests(h);
      const guids = new Set(all.map((m) => m.guid));
      for (const m of all) {
        assert.ok(h.store.peek(m.stream), `${ctx}: stream of ${m.guid} is gone`);
        assert.ok(m.baseGuid === null || guids.has(m.baseGuid), `${ctx}: base of ${m.guid}`);
        assert.doesNotThrow(() => chainTo(all, m.guid), ctx);
      }
      for (const g of requested) assert.ok(guids.has(g), `${ctx}: requested ${g} was pruned`);
      if (lastStored) assert.ok(guids.has(lastStored), `${ctx}: the newest backup was pruned`);
      // Streams only of manifests: every prune removed both.
      const streams = h.store.keys().filter((k) => k.includes("/streams/"));
      assert.equal(streams.length, all.length, ctx);
      const backups = h.pool.names().filter((n) => n.startsWith(`${ds}@.backup-`));
      assert.ok(backups.length <= 2, `${ctx}: ${backups.join(", ")}`);
    }
    h.runner.assertNoUnexpected();
  }
});

/**
 * The node's clock steps back (NTP, a VM restored): each backup taken after the step is older
 * by its createdAt than the ones before, yet it is what the node just stored and the newest
 * data: it stays, with its chain, whatever the keep policy.
 */
Deno.test("a backup taken after the clock stepped back is never pruned by its own run", async () => {
  for (const keep of ["last=1", "hourly=1", "daily=1", "weekly=1", "last=2,hourly=3"]) {
    for (const stepMs of [10 * MINUTE, 2 * 60 * MINUTE, 3 * 1440 * MINUTE]) {
      const h = backupHarness();
      const ds = h.volume("pg", { [BACKUP_KEEP_PROPERTY]: keep });
      for (let i = 0; i < 5; i++) {
        h.clock.ms += MINUTE;
        assert.equal((await backupVolume(h.deps, ds)).status, "stored");
      }
      h.clock.ms -= stepMs;
      for (let i = 0; i < 3; i++) {
        h.clock.ms += MINUTE;
        const out = await backupVolume(h.deps, ds);
        const ctx = `keep ${keep}, stepped back ${stepMs / MINUTE} min, backup ${i}`;
        assert.equal(out.status, "stored", ctx);
        if (out.status !== "stored") return;
        const all = manifests(h);
        assert.ok(all.some((m) => m.guid === out.manifest.guid), `${ctx}: the stored one is gone`);
        assert.doesNotThrow(() => chainTo(all, out.manifest.guid), ctx);
        assert.ok(!out.pruned.includes(out.manifest.guid), ctx);
      }
    }
  }
});
