import assert from "node:assert/strict";
import { Code, toGrpcStatus } from "./errors.ts";
import { ReplicateError } from "./replicate/errors.ts";
import { StoreError } from "./store/store.ts";

Deno.test("toGrpcStatus maps each store failure to a code a caller can act on", () => {
  const cases = [
    ["not_found", Code.NOT_FOUND],
    ["precondition_failed", Code.ABORTED],
    ["unavailable", Code.UNAVAILABLE],
    ["no_space", Code.RESOURCE_EXHAUSTED],
    ["denied", Code.PERMISSION_DENIED],
    ["invalid", Code.INTERNAL],
    // A missing bucket, a server without conditional writes: the operator's to fix.
    ["misconfigured", Code.FAILED_PRECONDITION],
  ] as const;
  for (const [kind, code] of cases) {
    const status = toGrpcStatus(new StoreError(kind, `Cannot read "k" in s3://b/p`));
    assert.deepEqual(status, { code, details: `Cannot read "k" in s3://b/p` }, kind);
  }
});

Deno.test("toGrpcStatus answers DATA_LOSS for stored bytes that fail their checksum", () => {
  assert.equal(toGrpcStatus(new ReplicateError("checksum", "x")).code, Code.DATA_LOSS);
  assert.equal(toGrpcStatus(new ReplicateError("guid", "x")).code, Code.DATA_LOSS);
  assert.equal(toGrpcStatus(new ReplicateError("chain", "x")).code, Code.FAILED_PRECONDITION);
});
