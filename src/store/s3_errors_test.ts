import assert from "node:assert/strict";
import { answerError, badAnswerError, classifyS3Error, unreachableError } from "./s3_errors.ts";

Deno.test("classifyS3Error maps statuses and S3 codes to store error kinds", () => {
  const table: ReadonlyArray<readonly [number, string, string, boolean]> = [
    [412, "PreconditionFailed", "precondition_failed", false],
    [412, "", "precondition_failed", false],
    [409, "ConditionalRequestConflict", "precondition_failed", false],
    [404, "NoSuchKey", "not_found", false],
    // The bucket is the operator's to create: never "not found", never an internal error.
    [404, "NoSuchBucket", "misconfigured", false],
    [404, "NoSuchUpload", "unavailable", false],
    // Only NoSuchKey is a missing object: a web server that is not S3 is not "nothing there".
    [404, "", "invalid", false],
    [404, "XAdminUserNotFound", "denied", false],
    [403, "InvalidAccessKeyId", "denied", false],
    [403, "AccessDenied", "denied", false],
    [403, "SignatureDoesNotMatch", "denied", false],
    [403, "RequestTimeTooSkewed", "denied", false],
    [401, "", "denied", false],
    [403, "QuotaExceeded", "no_space", false],
    [400, "EntityTooLarge", "no_space", false],
    [507, "InsufficientStorage", "no_space", false],
    [507, "", "no_space", false],
    [500, "InternalError", "unavailable", true],
    [502, "", "unavailable", true],
    [503, "SlowDown", "unavailable", true],
    [503, "ServiceUnavailable", "unavailable", true],
    [504, "", "unavailable", true],
    [429, "", "unavailable", true],
    [400, "RequestTimeout", "unavailable", true],
    [200, "InternalError", "unavailable", true],
    [501, "NotImplemented", "invalid", false],
    [400, "InvalidArgument", "invalid", false],
    [200, "InvalidPart", "invalid", false],
    [301, "PermanentRedirect", "invalid", false],
  ];
  for (const [status, code, kind, retryable] of table) {
    const c = classifyS3Error(status, code);
    assert.deepEqual([c.kind, c.retryable], [kind, retryable], `${status} ${code}`);
  }
});

Deno.test("answerError names what failed and the answer, with a hint", () => {
  const what = 'Writing "v1/x.json" to s3://b/p (https://s3.example)';
  const full = answerError(what, 507, { code: "InsufficientStorage", message: "Disk full." });
  assert.equal(full.kind, "no_space");
  assert.equal(
    full.message,
    `${what} failed: the store answered 507 InsufficientStorage (Disk full.): ` +
      "free space or raise the bucket's quota",
  );
  assert.equal(full.name, "StoreError");
  assert.equal(full.status, 507);
  assert.equal(full.code, "InsufficientStorage");
  const bare = answerError(what, 502, { code: "", message: "" });
  assert.equal(bare.message, `${what} failed: the store answered 502`);
  assert.equal(bare.retryable, true);
});

Deno.test("answerError names the bucket that does not exist", () => {
  const what = 'Listing "v1/" in s3://nope/p (http://127.0.0.1:7070)';
  const e = answerError(what, 404, { code: "NoSuchBucket", message: "no bucket" }, {
    bucket: "nope",
  });
  assert.equal(e.kind, "misconfigured");
  assert.equal(
    e.message,
    `${what} failed: the store answered 404 NoSuchBucket (no bucket): the bucket "nope" ` +
      "does not exist: create it, or name another in --store",
  );
});

Deno.test("answerError leaves out the server's message of a denial and long or odd text", () => {
  const denied = answerError("Reading", 403, {
    code: "SignatureDoesNotMatch",
    message: "Signature=abcdef was calculated from secret s3cr3t",
  });
  assert.equal(
    denied.message,
    "Reading failed: the store answered 403 SignatureDoesNotMatch: " +
      "check the access key, the secret key and the bucket's policy",
  );
  const long = answerError("Reading", 500, { code: "InternalError", message: "x\n".repeat(300) });
  assert.ok(long.message.length < 300, long.message);
  assert.ok(!long.message.includes("\n"));
});

Deno.test("unreachableError says the store is unreachable and why", () => {
  const refused = unreachableError(
    "Listing",
    new TypeError("error sending request: Connection refused (os error 111)"),
  );
  assert.equal(refused.kind, "unavailable");
  assert.equal(refused.retryable, true);
  assert.equal(refused.status, undefined);
  assert.match(
    refused.message,
    /^Listing failed: the store is unreachable \(error sending .*refused/,
  );
  const slow = unreachableError("Listing", new DOMException("x", "TimeoutError"));
  assert.equal(
    slow.message,
    "Listing failed: the store is unreachable (it did not answer in time)",
  );
});

Deno.test("badAnswerError is invalid and names the parse failure", () => {
  const e = badAnswerError("Listing", new SyntaxError("Expected <ListBucketResult>, got <html>"));
  assert.equal(e.kind, "invalid");
  assert.match(e.message, /not what S3 sends: Expected <ListBucketResult>, got <html>$/);
});
