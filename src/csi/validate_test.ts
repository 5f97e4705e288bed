import assert from "node:assert/strict";
import { Code, CsiError, type GrpcCode } from "../errors.ts";
import type { VolumeCapability } from "./types.ts";
import {
  BLOCK_VOLUMES_OFF_MESSAGE,
  checkCapability,
  checkCapacity,
  int64Field,
  required,
} from "./validate.ts";

function assertCode(fn: () => unknown, code: GrpcCode, message: string | RegExp): void {
  assert.throws(fn, (err: unknown) => {
    assert.ok(err instanceof CsiError, String(err));
    assert.equal(err.code, code);
    if (typeof message === "string") assert.equal(err.message, message);
    else assert.match(err.message, message);
    return true;
  });
}

function mountCap(
  mode: string,
  mountFlags: string[] = [],
  extra: Partial<VolumeCapability["mount"] & object> = {},
): VolumeCapability {
  return {
    mount: { fs_type: "", mount_flags: mountFlags, volume_mount_group: "", ...extra },
    access_mode: { mode },
    access_type: "mount",
  };
}

Deno.test("required returns a non-empty string and refuses anything else", () => {
  assert.equal(required("volume_id", "v1"), "v1");
  for (const value of ["", undefined, null, 5, {}]) {
    assertCode(() => required("volume_id", value), Code.INVALID_ARGUMENT, "volume_id is required");
  }
});

Deno.test("checkCapability accepts every filesystem access mode", () => {
  const table: ReadonlyArray<readonly [string, boolean]> = [
    ["SINGLE_NODE_WRITER", false],
    ["SINGLE_NODE_READER_ONLY", true],
    ["SINGLE_NODE_SINGLE_WRITER", false],
    ["SINGLE_NODE_MULTI_WRITER", false],
    ["MULTI_NODE_READER_ONLY", true],
    ["MULTI_NODE_SINGLE_WRITER", false],
    ["MULTI_NODE_MULTI_WRITER", false],
  ];
  for (const [mode, readOnlyMode] of table) {
    assert.deepEqual(checkCapability(mountCap(mode)), {
      kind: "zfs",
      accessMode: mode,
      flags: [],
      readOnlyMode,
    });
  }
});

Deno.test("checkCapability refuses block volumes without --block-volumes, naming the flag", () => {
  const message = BLOCK_VOLUMES_OFF_MESSAGE;
  assert.match(message, /^Block volumes are not supported.*--block-volumes/);
  assertCode(
    () =>
      checkCapability({
        block: {},
        access_mode: { mode: "SINGLE_NODE_WRITER" },
        access_type: "block",
      }),
    Code.INVALID_ARGUMENT,
    message,
  );
  assertCode(
    () => checkCapability({ block: {}, mount: null, access_mode: { mode: "SINGLE_NODE_WRITER" } }),
    Code.INVALID_ARGUMENT,
    message,
  );
});

Deno.test("checkCapability refuses missing capability, access type or mode", () => {
  assertCode(() => checkCapability(null), Code.INVALID_ARGUMENT, "volume_capability is required");
  assertCode(
    () => checkCapability({ access_mode: { mode: "SINGLE_NODE_WRITER" } }),
    Code.INVALID_ARGUMENT,
    "volume_capability needs a mount access type",
  );
  assertCode(
    () => checkCapability(mountCap("UNKNOWN")),
    Code.INVALID_ARGUMENT,
    'volume_capability.access_mode "UNKNOWN" is not supported',
  );
  assertCode(
    () => checkCapability(mountCap("")),
    Code.INVALID_ARGUMENT,
    'volume_capability.access_mode "UNKNOWN" is not supported',
  );
});

Deno.test("checkCapability refuses other filesystems and mount groups", () => {
  assert.equal(
    checkCapability(mountCap("SINGLE_NODE_WRITER", [], { fs_type: "zfs" })).accessMode,
    "SINGLE_NODE_WRITER",
  );
  assertCode(
    () => checkCapability(mountCap("SINGLE_NODE_WRITER", [], { fs_type: "ext4" })),
    Code.INVALID_ARGUMENT,
    /^fs_type "ext4" is made on a zvol: Block volumes are not supported .*--block-volumes/,
  );
  assertCode(
    () => checkCapability(mountCap("SINGLE_NODE_WRITER", [], { fs_type: "btrfs" })),
    Code.INVALID_ARGUMENT,
    /^fs_type "btrfs" is not supported/,
  );
  assertCode(
    () => checkCapability(mountCap("SINGLE_NODE_WRITER", [], { volume_mount_group: "1000" })),
    Code.INVALID_ARGUMENT,
    "volume_mount_group is not supported",
  );
});

Deno.test("checkCapability keeps known mount flags, deduplicated, and drops defaults", () => {
  const cap = checkCapability(
    mountCap("SINGLE_NODE_WRITER", [
      "noexec,nosuid",
      " nodev ",
      "rw",
      "defaults",
      "nosuid",
      "",
      "ro",
    ]),
  );
  assert.deepEqual(cap.flags, ["noexec", "nosuid", "nodev", "ro"]);
});

Deno.test("checkCapability refuses unknown mount flags", () => {
  for (const flag of ["bind", "remount", "uid=0", "x-mount.mkdir", "loop"]) {
    assertCode(
      () => checkCapability(mountCap("SINGLE_NODE_WRITER", ["nosuid", flag])),
      Code.INVALID_ARGUMENT,
      new RegExp(
        `^Mount flag "${flag.replace(/[.]/g, "\\.")}" is not supported; allowed: ro, rw, nosuid`,
      ),
    );
  }
});

Deno.test("int64Field reads decimal strings and numbers", () => {
  assert.equal(int64Field("f", "1073741824"), 1073741824);
  assert.equal(int64Field("f", 42), 42);
  assert.equal(int64Field("f", "0"), 0);
  assert.equal(int64Field("f", ""), 0);
  assert.equal(int64Field("f", undefined), 0);
  assert.equal(int64Field("f", null), 0);
  assert.equal(int64Field("f", "9007199254740991"), 9007199254740991);
});

Deno.test("int64Field refuses negative and non-decimal values with INVALID_ARGUMENT", () => {
  assertCode(
    () => int64Field("capacity_range.required_bytes", "-1"),
    Code.INVALID_ARGUMENT,
    "capacity_range.required_bytes must not be negative",
  );
  assertCode(() => int64Field("f", -5), Code.INVALID_ARGUMENT, "f must not be negative");
  for (const text of ["1.5", "1e3", "0x10", "ten", " 1"]) {
    assertCode(
      () => int64Field("f", text),
      Code.INVALID_ARGUMENT,
      `f "${text}" is not a whole number`,
    );
  }
});

Deno.test("int64Field answers OUT_OF_RANGE for values of 2^53 and more", () => {
  for (const text of ["9007199254740992", "9007199254740993", "9223372036854775807"]) {
    assertCode(
      () => int64Field("capacity_range.limit_bytes", text),
      Code.OUT_OF_RANGE,
      `capacity_range.limit_bytes ${text} is larger than this plugin supports`,
    );
  }
});

Deno.test("checkCapacity returns both bounds and refuses required above limit", () => {
  assert.deepEqual(checkCapacity({ required_bytes: "100", limit_bytes: "200" }), {
    requiredBytes: 100,
    limitBytes: 200,
  });
  assert.deepEqual(checkCapacity({ required_bytes: "300", limit_bytes: "0" }), {
    requiredBytes: 300,
    limitBytes: 0,
  });
  assert.deepEqual(checkCapacity(null), { requiredBytes: 0, limitBytes: 0 });
  assertCode(
    () => checkCapacity({ required_bytes: "300", limit_bytes: "200" }),
    Code.INVALID_ARGUMENT,
    "capacity_range.required_bytes is larger than limit_bytes",
  );
});

const BLOCK_ON = { blockVolumes: true };

Deno.test("checkCapability with --block-volumes tells a ZFS mount, ext4/xfs on a zvol and raw block apart", () => {
  assert.deepEqual(checkCapability(mountCap("SINGLE_NODE_WRITER"), BLOCK_ON), {
    kind: "zfs",
    accessMode: "SINGLE_NODE_WRITER",
    flags: [],
    readOnlyMode: false,
  });
  assert.deepEqual(
    checkCapability(mountCap("SINGLE_NODE_WRITER", ["noatime"], { fs_type: "zfs" }), BLOCK_ON)
      .kind,
    "zfs",
  );
  for (const fsType of ["ext4", "xfs"] as const) {
    assert.deepEqual(
      checkCapability(
        mountCap("SINGLE_NODE_READER_ONLY", ["noexec"], { fs_type: fsType }),
        BLOCK_ON,
      ),
      {
        kind: "fs",
        fsType,
        accessMode: "SINGLE_NODE_READER_ONLY",
        flags: ["noexec"],
        readOnlyMode: true,
      },
    );
  }
  assert.deepEqual(
    checkCapability(
      { block: {}, access_mode: { mode: "MULTI_NODE_READER_ONLY" }, access_type: "block" },
      BLOCK_ON,
    ),
    { kind: "block", accessMode: "MULTI_NODE_READER_ONLY", flags: [], readOnlyMode: true },
  );
});

Deno.test("checkCapability with --block-volumes still refuses other filesystems, unknown modes and both access types", () => {
  assertCode(
    () => checkCapability(mountCap("SINGLE_NODE_WRITER", [], { fs_type: "btrfs" }), BLOCK_ON),
    Code.INVALID_ARGUMENT,
    /^fs_type "btrfs" is not supported.*"ext4" or "xfs" on a zvol/,
  );
  assertCode(
    () => checkCapability({ block: {}, access_mode: { mode: "BOGUS" } }, BLOCK_ON),
    Code.INVALID_ARGUMENT,
    'volume_capability.access_mode "BOGUS" is not supported',
  );
  assertCode(
    () =>
      checkCapability({
        block: {},
        mount: { fs_type: "ext4", mount_flags: [], volume_mount_group: "" },
        access_mode: { mode: "SINGLE_NODE_WRITER" },
      }, BLOCK_ON),
    Code.INVALID_ARGUMENT,
    "volume_capability has both a block and a mount access type",
  );
  assertCode(
    () =>
      checkCapability(
        mountCap("SINGLE_NODE_WRITER", ["bind,remount"], { fs_type: "ext4" }),
        BLOCK_ON,
      ),
    Code.INVALID_ARGUMENT,
    /^Mount flag "bind" is not supported/,
  );
});
