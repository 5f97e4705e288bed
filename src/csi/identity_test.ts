import assert from "node:assert/strict";
import { FakeRunner, fakeTools } from "../../tests/support/fake_runner.ts";
import { CSI_SPEC_VERSION, PLUGIN_VERSION } from "../version.ts";
import { HealthChecker } from "./health.ts";
import { IdentityService } from "./identity.ts";

function identity(runner: FakeRunner, controller: boolean): IdentityService {
  const { zfs, mounter, log } = fakeTools(runner);
  const health = new HealthChecker({ zfs, mounter, parentDataset: "tank/nomad", log });
  return new IdentityService(health, { controller });
}

Deno.test("IdentityService.GetPluginInfo reports name, version and CSI spec", async () => {
  assert.deepEqual(await identity(new FakeRunner(), false).GetPluginInfo(), {
    name: "org.zfs-csi",
    vendor_version: PLUGIN_VERSION,
    manifest: { "csi-spec": CSI_SPEC_VERSION },
  });
});

Deno.test("IdentityService.GetPluginCapabilities offers the controller only when enabled", async () => {
  assert.deepEqual(await identity(new FakeRunner(), false).GetPluginCapabilities(), {
    capabilities: [{ service: { type: "VOLUME_ACCESSIBILITY_CONSTRAINTS" } }],
  });
  assert.deepEqual(await identity(new FakeRunner(), true).GetPluginCapabilities(), {
    capabilities: [
      { service: { type: "CONTROLLER_SERVICE" } },
      { service: { type: "VOLUME_ACCESSIBILITY_CONSTRAINTS" } },
    ],
  });
});

Deno.test("IdentityService.Probe reports readiness from the health check", async () => {
  const ready = new FakeRunner()
    .on(["zpool", "list"], { stdout: "tank\tONLINE\n" })
    .on(["zfs", "get"], {
      stdout: "tank/nomad\ttype\tfilesystem\t-\ntank/nomad\tmounted\tyes\t-\n" +
        "tank/nomad\tmountpoint\t/tank/nomad\tdefault\n",
    })
    .onExact(["mount"], { stdout: "tank/nomad on /tank/nomad type zfs (rw,xattr)\n" });
  assert.deepEqual(await identity(ready, false).Probe(), { ready: { value: true } });
  const noPool = new FakeRunner()
    .on(["zpool", "list"], { code: 1, stderr: "cannot open 'tank': no such pool\n" })
    .on(["zfs", "get"], { code: 1, stderr: "cannot open 'tank/nomad': dataset does not exist\n" })
    .onExact(["mount"], { stdout: "" });
  assert.deepEqual(await identity(noPool, false).Probe(), { ready: { value: false } });
});

/** Whether `p` has settled after the timers and I/O already due have run. */
async function settled(p: Promise<unknown>): Promise<boolean> {
  let done = false;
  void p.then(() => done = true);
  await new Promise((r) => setTimeout(r, 10));
  return done;
}

Deno.test("IdentityService.firstProbeAnswered waits for the first Probe, ready or not", async () => {
  const noPool = new FakeRunner()
    .on(["zpool", "list"], { code: 1, stderr: "cannot open 'tank': no such pool\n" })
    .on(["zfs", "get"], { code: 1, stderr: "cannot open 'tank/nomad': dataset does not exist\n" })
    .onExact(["mount"], { stdout: "" });
  const id = identity(noPool, false);
  assert.equal(await settled(id.firstProbeAnswered), false, "resolved before any Probe");
  await id.GetPluginInfo();
  await id.GetPluginCapabilities();
  assert.equal(await settled(id.firstProbeAnswered), false, "resolved by another call");
  assert.deepEqual(await id.Probe(), { ready: { value: false } });
  assert.equal(await settled(id.firstProbeAnswered), true, "not resolved by a Probe");
  // Later Probes leave it as it is (and start no more timers).
  await id.Probe();
  await id.firstProbeAnswered;
});
