import assert from "node:assert/strict";
import { MemoryStore } from "../../tests/support/memory_store.ts";
import {
  followVolumesPrefix,
  listMarked,
  removeMarkers,
  standbyPrefix,
  writeMarkers,
} from "./markers.ts";

Deno.test("markers: each follow volume once, each standby node's own; removed with the volume", async () => {
  const store = new MemoryStore();
  await writeMarkers(store, "pg", "pg", ["n2", "n3"]);
  await writeMarkers(store, "web:20data", "web data", ["n3"]);
  // A repeat writes the same objects.
  await writeMarkers(store, "pg", "pg", ["n2", "n3"]);
  assert.deepEqual(await listMarked(store, followVolumesPrefix()), [
    { volumeKey: "pg", name: "pg" },
    { volumeKey: "web:20data", name: "web data" },
  ]);
  assert.deepEqual((await listMarked(store, standbyPrefix("n2"))).map((v) => v.name), ["pg"]);
  assert.deepEqual((await listMarked(store, standbyPrefix("n3"))).map((v) => v.name), [
    "pg",
    "web data",
  ]);
  assert.deepEqual(await listMarked(store, standbyPrefix("n1")), []);
  await removeMarkers(store, "pg", ["n2", "n3"]);
  assert.deepEqual((await listMarked(store, followVolumesPrefix())).map((v) => v.name), [
    "web data",
  ]);
  assert.deepEqual(await listMarked(store, standbyPrefix("n2")), []);
  // Not a single encoded name: skipped.
  await store.putBytes(`${followVolumesPrefix()}x/y`, new Uint8Array());
  assert.equal((await listMarked(store, followVolumesPrefix())).length, 1);
});
