import assert from "node:assert/strict";
import {
  excludedOnReceive,
  KEY_PROPERTIES,
  NATIVE_PROPERTIES,
  OTHER_TOOLS_PROPERTIES,
  OWN_PROPERTIES,
} from "./stream_properties.ts";

/** Every `export const X = "org.zfs-csi:..."` of the plugin's sources (tests left out). */
async function ownConstants(): Promise<string[]> {
  const found = new Set<string>();
  const walk = async (dir: URL): Promise<void> => {
    for await (const e of Deno.readDir(dir)) {
      if (e.isDirectory) await walk(new URL(`${e.name}/`, dir));
      else if (e.name.endsWith(".ts") && !e.name.endsWith("_test.ts")) {
        const text = await Deno.readTextFile(new URL(e.name, dir));
        for (const m of text.matchAll(/export const \w+ = "(org\.zfs-csi:[a-z0-9-]+)"/g)) {
          found.add(m[1]!);
        }
      }
    }
  };
  await walk(new URL("../", import.meta.url));
  return [...found].sort();
}

Deno.test("OWN_PROPERTIES lists every marker the plugin defines", async () => {
  const constants = await ownConstants();
  assert.ok(constants.length >= 15, `found ${constants.length}`);
  assert.deepEqual([...OWN_PROPERTIES].sort(), constants);
});

Deno.test("excludedOnReceive leaves a raw stream's key properties alone", () => {
  const plain = excludedOnReceive(false);
  const raw = excludedOnReceive(true);
  for (const p of KEY_PROPERTIES) assert.ok(plain.includes(p) && !raw.includes(p), p);
  for (const p of [...NATIVE_PROPERTIES, ...OWN_PROPERTIES, ...OTHER_TOOLS_PROPERTIES]) {
    assert.ok(raw.includes(p), p);
  }
  assert.equal(new Set(plain).size, plain.length, "no name twice (zfs refuses it)");
  for (const p of ["mountpoint", "canmount", "setuid", "devices", "exec", "sharenfs"]) {
    assert.ok(plain.includes(p), p);
  }
  // encryption itself is never on the list: OpenZFS refuses -x of it for a raw stream, and a
  // plain stream's dataset takes its encryption from its parent.
  assert.ok(!plain.includes("encryption"));
});
