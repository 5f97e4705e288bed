import assert from "node:assert/strict";
import type { BackupOutcome } from "../replicate/backup.ts";
import { Activity } from "./activity.ts";
import { meteredBackup, meteredSend, volumeLabel } from "./backups.ts";
import { render } from "./exposition.ts";

const PARENT = "tank/nomad";

Deno.test("volumeLabel is the volume's name for datasets and snapshots below the parent", () => {
  assert.equal(volumeLabel(PARENT, "tank/nomad/pg-data@backup-1"), "pg-data");
  assert.equal(volumeLabel(PARENT, "tank/nomad/pg-data"), "pg-data");
  assert.equal(volumeLabel(PARENT, "other/x@s"), "other/x");
});

Deno.test("meteredSend adds the stored stream's bytes; a failed send adds nothing", async () => {
  const a = new Activity();
  const ok = meteredSend(() => Promise.resolve({ size: 4096, sha256: "00" }), a, PARENT);
  const spec = { snapshot: "tank/nomad/pg@b1", raw: false, key: "k" };
  await ok(spec);
  await ok(spec);
  const bad = meteredSend(() => Promise.reject(new Error("store down")), a, PARENT);
  await assert.rejects(bad(spec), /store down/);
  assert.match(render(a.families()), /^zfs_csi_backup_sent_bytes_total\{volume="pg"\} 8192$/m);
});

Deno.test("meteredBackup counts stored and failed backups, not busy or aborted ones", async () => {
  const a = new Activity();
  const stored = { status: "stored" } as unknown as BackupOutcome;
  await meteredBackup(() => Promise.resolve(stored), a, PARENT)("tank/nomad/pg", {});
  await meteredBackup(() => Promise.resolve({ status: "busy" }), a, PARENT)("tank/nomad/pg", {});
  const failing = meteredBackup(() => Promise.reject(new Error("x")), a, PARENT);
  await assert.rejects(failing("tank/nomad/pg", {}));
  const stopped = new AbortController();
  stopped.abort();
  await assert.rejects(failing("tank/nomad/pg", { signal: stopped.signal }));
  const text = render(a.families());
  assert.match(text, /^zfs_csi_backups_total\{volume="pg",result="stored"\} 1$/m);
  assert.match(text, /^zfs_csi_backups_total\{volume="pg",result="failed"\} 1$/m);
});
