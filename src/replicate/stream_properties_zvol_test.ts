/**
 * What a received zvol's stream may decide (stream_properties.ts): its `-x` list names only
 * properties that apply to volumes (OpenZFS refuses a whole receive otherwise), and the check
 * after a receive takes its volsize and volblocksize as the shape of its data, but refuses
 * anything else the stream set (volmode, refreservation, user properties).
 */

import assert from "node:assert/strict";
import { FakeRunner, fakeTools } from "../../tests/support/fake_runner.ts";
import type { SnapshotManifest } from "../store/layout.ts";
import { ReplicateError } from "../replicate_errors.ts";
import {
  checkStreamProperties,
  excludedOnReceive,
  KEY_PROPERTIES,
  OTHER_TOOLS_PROPERTIES,
  OWN_PROPERTIES,
  ZVOL_NATIVE_PROPERTIES,
} from "./stream_properties.ts";

/** Properties zfs registers for filesystems (and snapshots) only: `-x` of them fails a zvol. */
const FILESYSTEM_ONLY = [
  "mountpoint",
  "canmount",
  "overlay",
  "zoned",
  "setuid",
  "devices",
  "exec",
  "nbmand",
  "xattr",
  "acltype",
  "aclinherit",
  "aclmode",
  "snapdir",
  "sharenfs",
  "sharesmb",
  "vscan",
  "atime",
  "relatime",
  "quota",
  "refquota",
  "filesystem_limit",
  "recordsize",
  "dnodesize",
  "special_small_blocks",
  "context",
  "fscontext",
  "defcontext",
  "rootcontext",
];

Deno.test("excludedOnReceive of a zvol's stream names no filesystem-only property, and the zvol's own", () => {
  for (const raw of [false, true]) {
    const list = excludedOnReceive(raw, true);
    for (const p of FILESYSTEM_ONLY) assert.ok(!list.includes(p), p);
    for (const p of ["volmode", "snapdev", "refreservation", "readonly", "compression"]) {
      assert.ok(list.includes(p), p);
    }
    for (const p of [...OWN_PROPERTIES, ...OTHER_TOOLS_PROPERTIES]) assert.ok(list.includes(p), p);
    for (const p of KEY_PROPERTIES) assert.equal(list.includes(p), !raw, p);
    assert.equal(new Set(list).size, list.length);
  }
  // A dataset's stream never names the zvol-only ones (they do not apply to filesystems).
  const fs = excludedOnReceive(false);
  assert.ok(!fs.includes("volmode") && !fs.includes("snapdev"));
  for (const p of ZVOL_NATIVE_PROPERTIES.filter((p) => p !== "volmode" && p !== "snapdev")) {
    assert.ok(fs.includes(p), p);
  }
});

const TARGET = "tank/nomad/.restore-disk";
const SNAP = ".backup-1-1";

function manifest(zvol: boolean): SnapshotManifest {
  return {
    format: 1,
    volume: "disk",
    volumeUid: "0".repeat(32),
    guid: "1234",
    baseGuid: null,
    snapshot: SNAP,
    kind: "scheduled",
    createdAt: "2024-01-01T00:00:00.000Z",
    stream: "v1/volumes/disk/streams/x.zfs",
    size: 3,
    sha256: "0".repeat(64),
    raw: false,
    node: "n",
    capacityBytes: 1 << 30,
    ...(zvol ? { zvol: { content: "ext4" as const, volblocksize: 16384, formatted: true } } : {}),
  };
}

/** Checks a receive after which `zfs get -s received` prints `received` (name, prop, value). */
async function check(zvol: boolean, received: readonly (readonly [string, string, string])[]) {
  const runner = new FakeRunner();
  runner.on(["zfs", "get"], () => ({
    stdout: received.map(([n, p, v]) => `${n}\t${p}\t${v}\treceived\n`).join(""),
  }));
  runner.on(["zfs", "inherit"], () => ({}));
  const { zfs, log } = fakeTools(runner);
  return await checkStreamProperties(zfs, log, {
    manifest: manifest(zvol),
    store: "the store",
    dataset: TARGET,
    settles: new Set(["org.zfs-csi:fs-type", "refreservation"]),
  });
}

Deno.test("checkStreamProperties takes a received zvol's volsize and volblocksize as its shape", async () => {
  const shape = [
    [TARGET, "volsize", "1073741824"],
    [TARGET, "volblocksize", "16384"],
    [`${TARGET}@${SNAP}`, "volsize", "1073741824"],
  ] as const;
  await check(true, shape);
  // Of a dataset's stream they are not expected, and refused as any other.
  await assert.rejects(check(false, shape), ReplicateError);
});

Deno.test("checkStreamProperties refuses what a zvol's stream decided besides its shape", async () => {
  for (
    const decided of [
      [TARGET, "volmode", "none"],
      [TARGET, "snapdev", "visible"],
      [TARGET, "org.zfs-csi:format", "done"],
      [TARGET, "other.tool:x", "1"],
      [`${TARGET}@${SNAP}`, "refreservation", "1073741824"],
    ] as const
  ) {
    await assert.rejects(
      check(true, [[TARGET, "volsize", "1073741824"], decided]),
      (err) => err instanceof ReplicateError && err.message.includes(decided[1]),
      decided.join(" "),
    );
  }
  // What the restore sets itself wins over the stream's (a local value): passed.
  await check(true, [[TARGET, "refreservation", "1073741824"]]);
});
