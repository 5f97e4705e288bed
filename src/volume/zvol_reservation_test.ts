import assert from "node:assert/strict";
import { Code } from "../errors.ts";
import { assertCsiError, thrown } from "../../tests/support/assert_errors.ts";
import type { PropertyValue } from "../zfs/parse.ts";
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
