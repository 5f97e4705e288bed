import assert from "node:assert/strict";
import { render } from "./exposition.ts";
import { fenceFamilies, followFenceSource } from "./follow.ts";

Deno.test("follow gauges: suspended or not per held copy, and the age of its last landed write", async () => {
  const text = render(fenceFamilies([
    {
      volume: "pg",
      dataset: "tank/nomad/pg",
      suspended: true,
      promised: true,
      sinceWriteMs: 23_500,
    },
    {
      volume: "web",
      dataset: "tank/nomad/web",
      suspended: false,
      promised: false,
      sinceWriteMs: 1_000,
    },
    // Adopted after a restart, no write landed yet: no age.
    {
      volume: "db",
      dataset: "tank/nomad/db",
      suspended: false,
      promised: true,
      sinceWriteMs: undefined,
    },
  ]));
  assert.match(text, /^zfs_csi_follow_suspended\{volume="pg",dataset="tank\/nomad\/pg"\} 1$/m);
  assert.match(text, /^zfs_csi_follow_suspended\{volume="web",dataset="tank\/nomad\/web"\} 0$/m);
  assert.match(text, /^zfs_csi_follow_suspended\{volume="db",dataset="tank\/nomad\/db"\} 0$/m);
  assert.match(
    text,
    /^zfs_csi_follow_lease_write_age_seconds\{volume="pg",dataset="tank\/nomad\/pg"\} 23\.5$/m,
  );
  assert.doesNotMatch(text, /zfs_csi_follow_lease_write_age_seconds\{volume="db"/);
  const source = followFenceSource(() => []);
  assert.equal(source.name, "follow");
  const none = render(await source.collect());
  assert.match(none, /^# TYPE zfs_csi_follow_suspended gauge$/m);
});
