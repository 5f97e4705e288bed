import assert from "node:assert/strict";
import { CSI_SPEC_VERSION, NODE_TOPOLOGY_KEY, PLUGIN_NAME, PLUGIN_VERSION } from "./version.ts";

Deno.test("PLUGIN_VERSION equals the version in deno.json, or is semver when it has none", async () => {
  const json: unknown = JSON.parse(
    await Deno.readTextFile(new URL("../deno.json", import.meta.url)),
  );
  assert.ok(json !== null && typeof json === "object");
  if ("version" in json) {
    assert.equal(PLUGIN_VERSION, json.version);
  } else {
    assert.match(PLUGIN_VERSION, /^\d+\.\d+\.\d+$/);
  }
});

Deno.test("PLUGIN_NAME and the node topology key are what Nomad sees", () => {
  assert.equal(PLUGIN_NAME, "org.zfs-csi");
  assert.equal(NODE_TOPOLOGY_KEY, "org.zfs-csi/node");
  assert.match(CSI_SPEC_VERSION, /^1\.\d+\.\d+$/);
});
