import assert from "node:assert/strict";
import { Code } from "../errors.ts";
import { assertRejectsCsi } from "../../tests/support/assert_errors.ts";
import { type DeviceProbe, waitForZvolDevice } from "./device.ts";

/** A probe whose link appears after `appearAfterMs` (never: Infinity), leading to `target`. */
function probe(
  target: string,
  appearAfterMs: number,
  dataset = "tank/nomad/db",
): DeviceProbe & { looked: string[] } {
  let now = 0;
  const looked: string[] = [];
  return {
    looked,
    blockDevice: (link) => {
      looked.push(link);
      return Promise.resolve(now < appearAfterMs ? undefined : { name: target, rdev: 230 * 256 });
    },
    rdev: () => Promise.resolve(undefined),
    // What zvol_id says the device is.
    datasetOf: () => Promise.resolve(dataset),
    sleep: (ms) => {
      now += ms;
      return Promise.resolve();
    },
    now: () => now,
  };
}

Deno.test("waitForZvolDevice waits for /dev/zvol/<dataset> and returns its /dev/zdN", async () => {
  const p = probe("/dev/zd16", 1000);
  assert.deepEqual(await waitForZvolDevice("tank/nomad/db", p), {
    name: "/dev/zd16",
    rdev: 230 * 256,
  });
  assert.ok(p.looked.every((l) => l === "/dev/zvol/tank/nomad/db"));
  assert.ok(p.looked.length > 1);
});

Deno.test("waitForZvolDevice gives up after its bound with UNAVAILABLE", async () => {
  await assertRejectsCsi(
    waitForZvolDevice("tank/nomad/db", probe("/dev/zd0", Infinity), 30_000),
    Code.UNAVAILABLE,
    /did not appear within 30 s/,
  );
});

Deno.test("waitForZvolDevice refuses a link leading anywhere but a /dev/zdN block device", async () => {
  for (const target of ["/dev/sda", "/dev/loop0", "/dev/zd0p1", "/dev/vda"]) {
    await assertRejectsCsi(
      waitForZvolDevice("tank/nomad/db", probe(target, 0)),
      Code.FAILED_PRECONDITION,
      /not a zvol's block device/,
    );
  }
});

Deno.test("waitForZvolDevice refuses a link swapped to another zvol: the kernel's name of the device decides", async () => {
  for (const other of ["tank/outside", "tank/nomad/other", "tank/nomad/db/x", ""]) {
    await assertRejectsCsi(
      waitForZvolDevice("tank/nomad/db", probe("/dev/zd32", 0, other)),
      Code.FAILED_PRECONDITION,
      /which is the zvol ".*", not "tank\/nomad\/db": refused/,
    );
  }
});
