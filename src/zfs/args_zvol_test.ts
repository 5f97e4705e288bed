import assert from "node:assert/strict";
import { createVolumeArgs, setVolsizeArgs } from "./args.ts";

Deno.test("createVolumeArgs makes a reserved zvol of the size, properties sorted", () => {
  assert.deepEqual(
    createVolumeArgs("tank/nomad/db", { sizeBytes: 1073741824 }, {
      volblocksize: "16K",
      "org.zfs-csi:managed": "yes",
    }),
    [
      "create",
      "-V",
      "1073741824",
      "-o",
      "org.zfs-csi:managed=yes",
      "-o",
      "volblocksize=16K",
      "tank/nomad/db",
    ],
  );
});

Deno.test("createVolumeArgs makes a thin zvol with -s only when asked", () => {
  assert.deepEqual(createVolumeArgs("tank/nomad/db", { sizeBytes: 131072, sparse: true }), [
    "create",
    "-V",
    "131072",
    "-s",
    "tank/nomad/db",
  ]);
  assert.deepEqual(createVolumeArgs("tank/nomad/db", { sizeBytes: 131072, sparse: false }), [
    "create",
    "-V",
    "131072",
    "tank/nomad/db",
  ]);
});

Deno.test("createVolumeArgs and setVolsizeArgs refuse sizes that are not positive whole bytes", () => {
  for (const bad of [0, -1, 1.5, Number.NaN, 2 ** 60]) {
    assert.throws(() => createVolumeArgs("tank/nomad/db", { sizeBytes: bad }), RangeError);
    assert.throws(() => setVolsizeArgs("tank/nomad/db", bad), RangeError);
  }
});

Deno.test("setVolsizeArgs sets volsize in bytes", () => {
  assert.deepEqual(setVolsizeArgs("tank/nomad/db", 2147483648), [
    "set",
    "volsize=2147483648",
    "tank/nomad/db",
  ]);
});

Deno.test("createVolumeArgs refuses a property value with control characters", () => {
  assert.throws(
    () => createVolumeArgs("tank/nomad/db", { sizeBytes: 131072 }, { volblocksize: "16K\n" }),
    TypeError,
  );
});
