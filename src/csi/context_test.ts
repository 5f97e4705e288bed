import assert from "node:assert/strict";
import { Code, CsiError } from "../errors.ts";
import { assertThrowsCsi } from "../../tests/support/assert_errors.ts";
import { parseVolumeContext } from "./context.ts";

function assertInvalid(fn: () => unknown, message: string): void {
  assert.throws(fn, (err: unknown) => {
    assert.ok(err instanceof CsiError, String(err));
    assert.equal(err.code, Code.INVALID_ARGUMENT);
    assert.equal(err.message, message);
    return true;
  });
}

Deno.test("parseVolumeContext reads size into bytes", () => {
  assert.deepEqual(parseVolumeContext({ size: "10GiB" }), { sizeBytes: 10 * 1024 ** 3 });
  assert.deepEqual(parseVolumeContext({ size: "1073741824" }), { sizeBytes: 1073741824 });
});

Deno.test("parseVolumeContext returns nothing for an empty or missing context", () => {
  assert.deepEqual(parseVolumeContext({}), {});
  assert.deepEqual(parseVolumeContext(null), {});
  assert.deepEqual(parseVolumeContext(undefined), {});
  assert.deepEqual(parseVolumeContext({ size: "" }), {});
});

Deno.test("parseVolumeContext reads the dataset CreateVolume reports", () => {
  assert.deepEqual(parseVolumeContext({ dataset: "tank/nomad/pg" }), { dataset: "tank/nomad/pg" });
  assert.deepEqual(parseVolumeContext({ dataset: "tank/nomad/pg", size: "1M" }), {
    dataset: "tank/nomad/pg",
    sizeBytes: 1048576,
  });
});

Deno.test("parseVolumeContext refuses a size below the smallest volume with OUT_OF_RANGE", () => {
  // zfs would answer "out of space" for a refquota below what an empty filesystem uses.
  for (const size of ["1", "100K", "1048575"]) {
    assertThrowsCsi(
      () => parseVolumeContext({ size }),
      Code.OUT_OF_RANGE,
      `volume_context size "${size}" is below the smallest volume, 1048576 bytes`,
    );
  }
  assert.deepEqual(parseVolumeContext({ size: "1048576" }), { sizeBytes: 1048576 });
});

Deno.test("parseVolumeContext refuses unknown keys, naming them", () => {
  assertInvalid(
    () => parseVolumeContext({ size: "1G", sise: "2G" }),
    'volume_context key "sise" is not known; known keys: size, dataset, backup_interval, backup_keep, fs_type',
  );
  assertInvalid(
    () => parseVolumeContext({ Size: "1G" }),
    'volume_context key "Size" is not known; known keys: size, dataset, backup_interval, backup_keep, fs_type',
  );
});

Deno.test("parseVolumeContext refuses a malformed size", () => {
  assertInvalid(
    () => parseVolumeContext({ size: "ten gigs" }),
    'volume_context size: Size "ten gigs" is not a size such as 10GiB, 500M or 1073741824',
  );
  assertInvalid(
    () => parseVolumeContext({ size: "0" }),
    'volume_context size: Size "0" is out of range',
  );
});

Deno.test("parseVolumeContext reads fs_type: what a zvol holds, or a dataset ('zfs', none)", () => {
  for (const zvol of ["block", "ext4", "xfs"] as const) {
    assert.deepEqual(parseVolumeContext({ dataset: "tank/nomad/db", fs_type: zvol }), {
      dataset: "tank/nomad/db",
      zvol,
    });
  }
  assert.deepEqual(parseVolumeContext({ fs_type: "zfs" }), {});
  assert.deepEqual(parseVolumeContext({ fs_type: "" }), {});
  assertInvalid(
    () => parseVolumeContext({ fs_type: "btrfs" }),
    'volume_context fs_type "btrfs" is not one of block, ext4, xfs, zfs',
  );
  // A dataset made at first stage is a filesystem: never a zvol.
  assertThrowsCsi(
    () => parseVolumeContext({ fs_type: "ext4", size: "1G" }),
    Code.INVALID_ARGUMENT,
    /a zvol is made by CreateVolume/,
  );
});
