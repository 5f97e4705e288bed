import assert from "node:assert/strict";
import {
  getBySourceArgs,
  poolPropertiesArgs,
  receiveArgs,
  rollbackArgs,
  sendArgs,
} from "./args.ts";

Deno.test("sendArgs of a full stream names only the snapshot", () => {
  assert.deepEqual(sendArgs({ snapshot: "tank/v@s1", raw: false }), ["send", "tank/v@s1"]);
});

Deno.test("sendArgs of a raw incremental puts -w, then -i and its base", () => {
  assert.deepEqual(
    sendArgs({ snapshot: "tank/v@s2", base: "tank/v@s1", raw: true }),
    ["send", "-w", "-i", "tank/v@s1", "tank/v@s2"],
  );
});

Deno.test("sendArgs refuses a dataset or a base of another dataset", () => {
  assert.throws(() => sendArgs({ snapshot: "tank/v", raw: false }), /not a snapshot name/);
  assert.throws(
    () => sendArgs({ snapshot: "tank/v@s2", base: "tank/w@s1", raw: false }),
    /not a snapshot of the dataset/,
  );
  assert.throws(
    () => sendArgs({ snapshot: "tank/v@s2", base: "tank/v", raw: false }),
    /not a snapshot of the dataset/,
  );
  assert.deepEqual(
    sendArgs({ snapshot: "tank/v@s2", base: "tank/v#b1", raw: false }),
    ["send", "-i", "tank/v#b1", "tank/v@s2"],
  );
});

Deno.test("receiveArgs receives unmounted and never forces", () => {
  assert.deepEqual(receiveArgs("tank/.restore-v", { unmounted: true }), [
    "receive",
    "-u",
    "tank/.restore-v",
  ]);
  assert.deepEqual(receiveArgs("tank/v", { unmounted: false }), ["receive", "tank/v"]);
  assert.throws(() => receiveArgs("tank/v@s1", { unmounted: true }), /not "tank\/v@s1"/);
});

Deno.test("receiveArgs puts -x and -o before the target, in the order given", () => {
  assert.deepEqual(
    receiveArgs("tank/.restore-v", {
      unmounted: true,
      exclude: ["mountpoint", "setuid", "other.tool:x"],
      override: { "org.zfs-csi:restore-token": "0a1b" },
    }),
    [
      "receive",
      "-u",
      "-x",
      "mountpoint",
      "-x",
      "setuid",
      "-x",
      "other.tool:x",
      "-o",
      "org.zfs-csi:restore-token=0a1b",
      "tank/.restore-v",
    ],
  );
});

Deno.test("receiveArgs dry run checks its options only", () => {
  assert.deepEqual(
    receiveArgs("tank/v", { unmounted: true, dryRun: true, exclude: ["mountpoint"] }),
    ["receive", "-n", "-u", "-x", "mountpoint", "tank/v"],
  );
});

Deno.test("receiveArgs refuses a property named twice or not a property", () => {
  assert.throws(
    () => receiveArgs("tank/v", { unmounted: true, exclude: ["mountpoint", "mountpoint"] }),
    /named twice/,
  );
  assert.throws(
    () => receiveArgs("tank/v", { unmounted: true, exclude: ["a"], override: { a: "1" } }),
    /named twice/,
  );
  assert.throws(() => receiveArgs("tank/v", { unmounted: true, exclude: ["-F"] }), TypeError);
  assert.throws(
    () => receiveArgs("tank/v", { unmounted: true, override: { "x:y": "a\nb" } }),
    /control characters/,
  );
});

Deno.test("getBySourceArgs asks for what a stream decided on a dataset and a snapshot", () => {
  assert.deepEqual(getBySourceArgs(["tank/v", "tank/v@s1"], ["received"]), [
    "get",
    "-Hp",
    "-s",
    "received",
    "-o",
    "name,property,value,source",
    "all",
    "tank/v",
    "tank/v@s1",
  ]);
  assert.deepEqual(getBySourceArgs(["tank/v"], ["local", "received"]).slice(2, 4), [
    "-s",
    "local,received",
  ]);
  assert.throws(() => getBySourceArgs(["tank/v"], []), RangeError);
  assert.throws(() => getBySourceArgs([], ["local"]), RangeError);
});

Deno.test("rollbackArgs rolls back to a snapshot, never past later ones", () => {
  assert.deepEqual(rollbackArgs("tank/v@s1"), ["rollback", "tank/v@s1"]);
  assert.throws(() => rollbackArgs("tank/v"), /not a snapshot name/);
});

Deno.test("sendArgs puts -c, -L and -e before -i, each only when asked", () => {
  const form = { compressed: true, largeBlocks: true, embedded: true };
  assert.deepEqual(
    sendArgs({ snapshot: "tank/v@s2", base: "tank/v@s1", raw: false, form }),
    ["send", "-c", "-L", "-e", "-i", "tank/v@s1", "tank/v@s2"],
  );
  assert.deepEqual(
    sendArgs({ snapshot: "tank/v@s1", raw: false, form: { ...form, largeBlocks: false } }),
    ["send", "-c", "-e", "tank/v@s1"],
  );
  const plain = { compressed: false, largeBlocks: false, embedded: false };
  assert.deepEqual(sendArgs({ snapshot: "tank/v@s1", raw: false, form: plain }), [
    "send",
    "tank/v@s1",
  ]);
  // -w sends blocks as they are on disk already: a form with it is a caller's mistake.
  assert.throws(() => sendArgs({ snapshot: "tank/v@s1", raw: true, form }), /raw send .* no -c/);
  assert.deepEqual(sendArgs({ snapshot: "tank/v@s1", raw: true, form: plain }), [
    "send",
    "-w",
    "tank/v@s1",
  ]);
});

Deno.test("poolPropertiesArgs asks zpool for the table every zpool prints", () => {
  assert.deepEqual(poolPropertiesArgs("tank"), ["get", "all", "tank"]);
  assert.deepEqual(poolPropertiesArgs("my pool"), ["get", "all", "my pool"]);
  assert.throws(() => poolPropertiesArgs("-o"), /not a pool name/);
  assert.throws(() => poolPropertiesArgs("tank/v"), /not a pool name/);
  assert.throws(() => poolPropertiesArgs(""), /not a pool name/);
});
