import assert from "node:assert/strict";
import { Code } from "../errors.ts";
import { assertCsiError, thrown } from "../../tests/support/assert_errors.ts";
import { classifyZfsError } from "../zfs/zfs.ts";
import type { PropertyValue } from "../zfs/parse.ts";
import { openZfsFixture, openZfsProperties } from "../../tests/support/openzfs_fixtures.ts";
import { reservationPlan, reservationRecord } from "./zvol_reservation.ts";

const local = (value: string): PropertyValue => ({ value, source: "local" });

Deno.test("reservationRecord records the bytes a zvol reserves, nothing for a sparse one", () => {
  assert.equal(reservationRecord("70254592"), "70254592");
  // OpenZFS's `zfs get -p` says 0 for none; zfs without -p says none.
  for (const none of ["0", "none", "-", undefined]) {
    assert.equal(reservationRecord(none), undefined);
  }
  assert.throws(() => reservationRecord("64M"), SyntaxError);
});

Deno.test("reservationPlan: auto for at least the whole volsize, the value for less, nothing unrecorded", () => {
  const props = (record?: PropertyValue) =>
    new Map<string, PropertyValue>([
      ["volsize", local("67108864")],
      ["refreservation", { value: "0", source: "local" }],
      ...(record ? [["org.zfs-csi:deleted-refreservation", record] as const] : []),
    ]);
  assert.deepEqual(reservationPlan("h", props(local("70254592"))), {
    kind: "auto",
    bytes: 70254592,
  });
  assert.deepEqual(reservationPlan("h", props(local("67108864"))), {
    kind: "auto",
    bytes: 67108864,
  });
  assert.deepEqual(reservationPlan("h", props(local("1048576"))), {
    kind: "value",
    bytes: 1048576,
  });
  assert.deepEqual(reservationPlan("h", props()), { kind: "none" });
  // Only its own record counts: one inherited or received is not the plugin's of this zvol.
  for (const source of ["inherited from tank/nomad", "received", "-"]) {
    assert.deepEqual(reservationPlan("h", props({ value: "70254592", source })), { kind: "none" });
  }
  assertCsiError(
    thrown(() => reservationPlan("h", props(local("64M")))),
    Code.FAILED_PRECONDITION,
    { includes: `"h" records its reservation as "64M", not a positive byte count` },
  );
});

Deno.test("a zvol's reservation as captured on OpenZFS: recorded, dropped, put back by auto as it was", () => {
  const reserved = (file: string, zvol = "tpool/nomad/z1") =>
    openZfsProperties(file, zvol).get("refreservation")?.value;
  // A full zvol of 64 MiB and a sparse one, as `zfs create -V` (and `-s`) made them.
  const full = reserved("zfs_get_zvol_reservation.txt");
  assert.match(full ?? "", /^\d+$/);
  assert.equal(reservationRecord(full), full);
  assert.equal(
    reservationRecord(reserved("zfs_get_zvol_reservation.txt", "tpool/nomad/z2")),
    undefined,
  );
  // After refreservation=none (as set aside) it reads 0; refreservation=auto (as undelete) gives
  // back what the create reserved.
  assert.equal(reserved("zfs_get_zvol_reservation_none.txt"), "0");
  assert.equal(reservationRecord(reserved("zfs_get_zvol_reservation_none.txt")), undefined);
  assert.equal(reserved("zfs_get_zvol_reservation_auto.txt"), full);
  const props = new Map(openZfsProperties("zfs_get_zvol_reservation.txt", "tpool/nomad/z1"));
  props.set("org.zfs-csi:deleted-refreservation", local(full!));
  assert.deepEqual(reservationPlan("h", props), { kind: "auto", bytes: Number(full) });
  // A reservation the pool has no room for: what undelete refuses as RESOURCE_EXHAUSTED.
  assert.equal(
    classifyZfsError(openZfsFixture("stderr_set_zvol_refreservation_no_space.txt")),
    "no_space",
  );
});
