import assert from "node:assert/strict";
import { fileErrorKind, fileStoreError, writerStoreError } from "./file_errors.ts";
import { StoreError } from "./store.ts";

function osError(code: string): Error {
  return Object.assign(new Error(`os error: ${code}`), { code });
}

Deno.test("fileErrorKind maps OS error codes to store error kinds", () => {
  const table: Array<[string, string]> = [
    ["ENOENT", "not_found"],
    ["ENOSPC", "no_space"],
    ["EDQUOT", "no_space"],
    ["EACCES", "denied"],
    ["EPERM", "denied"],
    ["EROFS", "denied"],
    ["EIO", "unavailable"],
    ["ESTALE", "unavailable"],
    ["ETIMEDOUT", "unavailable"],
    ["ENOTCONN", "unavailable"],
    ["ENOTDIR", "invalid"],
    ["EISDIR", "invalid"],
    ["ESOMETHINGNEW", "unavailable"],
  ];
  for (const [code, kind] of table) assert.equal(fileErrorKind(osError(code)), kind, code);
});

Deno.test("fileErrorKind: Deno's permission refusal is denied, a StoreError keeps its kind", () => {
  assert.equal(fileErrorKind(new Deno.errors.NotCapable("Requires write access")), "denied");
  assert.equal(fileErrorKind(new Deno.errors.PermissionDenied("no")), "denied");
  assert.equal(fileErrorKind(new StoreError("precondition_failed", "x")), "precondition_failed");
  assert.equal(fileErrorKind("not an error"), "unavailable");
});

Deno.test("fileErrorKind reads the code Deno puts on real file-system errors", async () => {
  const error = await Deno.readFile("/tmp/zfs-csi-surely-missing/x").catch((err) => err);
  assert.equal(fileErrorKind(error), "not_found");
});

Deno.test("fileStoreError names the action, key, store and what to check", () => {
  const err = osError("ENOSPC");
  const e = fileStoreError(err, "write", "v1/a.zfs", "file:///mnt/backup");
  assert.equal(e.kind, "no_space");
  assert.equal(e.cause, err);
  assert.match(e.message, /^Cannot write "v1\/a\.zfs" in file:\/\/\/mnt\/backup: /);
  assert.match(e.message, /full or over quota/);
  assert.match(e.message, /os error: ENOSPC/);
  const dead = fileStoreError(osError("ESTALE"), "read", "k", "file:///nfs");
  assert.equal(dead.kind, "unavailable");
  assert.match(dead.message, /mounted/);
  const passed = new StoreError("invalid", "as it was");
  assert.equal(fileStoreError(passed, "read", "k", "s"), passed);
});

Deno.test("writerStoreError tells a file-system failure in a writer's message from its own", () => {
  const at = (m: string) => writerStoreError(m, "v1/s.zfs", "file:///mnt/b");
  assert.equal(at("warning: cannot send 'p/v@s': No space left on device\n")?.kind, "no_space");
  assert.equal(at("cannot send: Disk quota exceeded")?.kind, "no_space");
  assert.equal(at("cannot send: Read-only file system")?.kind, "denied");
  assert.equal(at("cannot send: Stale file handle")?.kind, "unavailable");
  assert.match(
    at("x: No space left on device")!.message,
    /^Cannot write "v1\/s.zfs" in file:\/\/\/mnt\/b: .*full/,
  );
  assert.equal(at("cannot open 'p/v@s': dataset does not exist"), undefined);
  assert.equal(at("warning: cannot send 'p/v@s': Input/output error"), undefined);
});
