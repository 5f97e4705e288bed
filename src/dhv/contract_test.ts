import assert from "node:assert/strict";
import { ALLOWED_ENV } from "../permissions.ts";
import { DHV_ENV } from "../host_volume_env.ts";
import { Code, CsiError, ZfsError } from "../errors.ts";
import {
  checkDirectory,
  DhvError,
  exitCodeOf,
  parseBytesVariable,
  volumePath,
} from "./contract.ts";

Deno.test("every DHV_* variable Nomad sets is one the build may read, and no other DHV_*", () => {
  for (const name of DHV_ENV) assert.ok((ALLOWED_ENV as readonly string[]).includes(name), name);
  assert.deepEqual(ALLOWED_ENV.filter((n) => n.startsWith("DHV_")), [...DHV_ENV]);
});

Deno.test("volumePath is always <volumes dir>/<id>", () => {
  assert.equal(
    volumePath("/opt/nomad/data/host_volumes", "abc"),
    "/opt/nomad/data/host_volumes/abc",
  );
  assert.equal(volumePath("/", "abc"), "/abc");
});

Deno.test("checkDirectory takes only absolute, normalized paths", () => {
  assert.equal(checkDirectory("D", "/a/b"), "/a/b");
  assert.equal(checkDirectory("D", "/"), "/");
  for (const bad of ["a", "/a/", "/a//b", "/a/./b", "/a/../b", "/a\nb", ""]) {
    assert.throws(() => checkDirectory("D", bad), DhvError, JSON.stringify(bad));
  }
});

Deno.test("parseBytesVariable reads Nomad's decimal byte counts", () => {
  assert.equal(parseBytesVariable("V", undefined), 0);
  assert.equal(parseBytesVariable("V", "0"), 0);
  assert.equal(parseBytesVariable("V", "10737418240"), 10737418240);
  for (const bad of ["-1", "1e9", "10GiB", " 1", "99999999999999999"]) {
    assert.throws(() => parseBytesVariable("V", bad), DhvError, bad);
  }
});

Deno.test("exitCodeOf: bad input exits 2, every other failure 1", () => {
  assert.equal(exitCodeOf(new DhvError(2, "x")), 2);
  assert.equal(exitCodeOf(new CsiError(Code.INVALID_ARGUMENT, "x")), 2);
  assert.equal(exitCodeOf(new CsiError(Code.OUT_OF_RANGE, "x")), 2);
  assert.equal(exitCodeOf(new CsiError(Code.ALREADY_EXISTS, "x")), 1);
  assert.equal(exitCodeOf(new CsiError(Code.FAILED_PRECONDITION, "x")), 1);
  assert.equal(exitCodeOf(new ZfsError("busy", ["zfs"], "busy")), 1);
  assert.equal(exitCodeOf(new ZfsError("invalid", ["zfs"], "'compression' must be one of")), 2);
  assert.equal(exitCodeOf(new Error("x")), 1);
});
