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
