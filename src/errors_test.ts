import assert from "node:assert/strict";
import { Code, codeName, CsiError, toGrpcStatus, ZfsError, type ZfsErrorKind } from "./errors.ts";

Deno.test("toGrpcStatus keeps the code and message of a CsiError", () => {
  const err = new CsiError(Code.NOT_FOUND, 'Volume "v1" not found', { cause: new Error("x") });
  assert.deepEqual(toGrpcStatus(err), { code: Code.NOT_FOUND, details: 'Volume "v1" not found' });
});

Deno.test("toGrpcStatus maps each ZfsError kind to its gRPC code", () => {
  const table: ReadonlyArray<readonly [ZfsErrorKind, number]> = [
    ["not_found", Code.NOT_FOUND],
    ["exists", Code.ALREADY_EXISTS],
    ["busy", Code.FAILED_PRECONDITION],
    ["no_space", Code.RESOURCE_EXHAUSTED],
    ["permission", Code.PERMISSION_DENIED],
    ["invalid", Code.INVALID_ARGUMENT],
    ["unsupported", Code.INVALID_ARGUMENT],
    ["timeout", Code.DEADLINE_EXCEEDED],
    ["unavailable", Code.UNAVAILABLE],
    ["unknown", Code.INTERNAL],
  ];
  for (const [kind, code] of table) {
    assert.equal(toGrpcStatus(new ZfsError(kind, ["zfs", "get"], "x")).code, code, kind);
  }
});

Deno.test("toGrpcStatus names the zfs operation and the first stderr line of a ZfsError", () => {
  const err = new ZfsError(
    "not_found",
    ["/sbin/zfs", "create", "-o", "refquota=1", "tank/nomad/a/b"],
    "cannot create 'tank/nomad/a/b': parent does not exist\nusage: ...\n",
  );
  assert.deepEqual(toGrpcStatus(err), {
    code: Code.NOT_FOUND,
    details:
      `ZFS operation "/sbin/zfs create" failed (not found): cannot create 'tank/nomad/a/b': parent does not exist`,
  });
});

Deno.test("toGrpcStatus sends a ZfsError's detail instead of zfs's first line, which ZfsError keeps in its message", () => {
  const cause = new Error("first read");
  const err = new ZfsError(
    "unavailable",
    ["zfs", "get", "-Hp", "type", "t/n/v"],
    "connect: No such file or directory\nPlease make sure that the zfs-fuse daemon is running.\n",
    { detail: "ZFS cannot be reached; this command changed nothing", cause },
  );
  assert.deepEqual(toGrpcStatus(err), {
    code: Code.UNAVAILABLE,
    details: `ZFS operation "zfs get" failed (unavailable): ` +
      `ZFS cannot be reached; this command changed nothing`,
  });
  assert.equal(err.detail, "ZFS cannot be reached; this command changed nothing");
  assert.equal(err.cause, cause);
  assert.equal(
    err.message,
    `Command "zfs get -Hp type t/n/v" failed (unavailable): ZFS cannot be reached; this ` +
      `command changed nothing (zfs said: connect: No such file or directory\n` +
      `Please make sure that the zfs-fuse daemon is running.)`,
  );
});

Deno.test("toGrpcStatus sends a generic INTERNAL message for any other error", () => {
  const secretish = "open /etc/shadow: token=abc123 at Object.<anonymous> (/src/x.ts:1:1)";
  for (const thrown of [new Error(secretish), new TypeError(secretish), secretish, undefined, 42]) {
    const status = toGrpcStatus(thrown);
    assert.deepEqual(status, {
      code: Code.INTERNAL,
      details: "Internal error, see the plugin logs",
    });
    assert.equal(status.details.includes("abc123"), false);
  }
});

Deno.test("CsiError carries its code, name and cause", () => {
  const cause = new Error("root");
  const err = new CsiError(Code.ABORTED, "busy", { cause });
  assert.ok(err instanceof Error);
  assert.equal(err.name, "CsiError");
  assert.equal(err.code, 10);
  assert.equal(err.cause, cause);
});

Deno.test("ZfsError builds its message from argv, kind and stderr", () => {
  const err = new ZfsError(
    "busy",
    ["zfs", "destroy", "t/v"],
    "  cannot destroy: dataset is busy\n",
  );
  assert.equal(err.name, "ZfsError");
  assert.equal(
    err.message,
    'Command "zfs destroy t/v" failed (busy): cannot destroy: dataset is busy',
  );
  assert.equal(
    new ZfsError("unknown", ["zfs"], "").message,
    'Command "zfs" failed (unknown): no output',
  );
});

Deno.test("codeName names known codes and numbers unknown ones", () => {
  assert.equal(codeName(0), "OK");
  assert.equal(codeName(5), "NOT_FOUND");
  assert.equal(codeName(13), "INTERNAL");
  assert.equal(codeName(99), "CODE_99");
});
