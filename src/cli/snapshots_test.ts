import assert from "node:assert/strict";
import { FakeRunner } from "../../tests/support/fake_runner.ts";
import { FakePool } from "../../tests/support/fake_pool.ts";
import { encodeJson } from "../store/chain.ts";
import { FileStore } from "../store/file_store.ts";
import { manifestKey, type SnapshotManifest, streamKey } from "../store/layout.ts";
import { isStoredName, pickLocal, splitTarget } from "./restore.ts";
import { localSnapshots, mergeSnapshots, run, snapshotTable, storedRows } from "./snapshots.ts";
import { buildTools, resolveConfig } from "./setup.ts";
import { memoryIo, TEST_FLAGS } from "./test_io.ts";

const UID = "0123456789abcdef0123456789abcdef";

function manifest(guid: string, base: string | null, at: string, size = 100): SnapshotManifest {
  return {
    format: 1,
    volume: "pg",
    volumeUid: UID,
    guid,
    baseGuid: base,
    snapshot: `.backup-${guid}`,
    kind: "scheduled",
    createdAt: at,
    stream: streamKey("pg", guid, "00000001"),
    size,
    sha256: "0".repeat(64),
    raw: false,
    node: "node-a",
    capacityBytes: 0,
  };
}

function pool() {
  const runner = new FakeRunner();
  const p = new FakePool(runner);
  p.add("tank/nomad");
  p.add("tank/nomad/pg", { "org.zfs-csi:managed": "yes" });
  p.add("tank/nomad/pg@nightly", { guid: "33", creation: "1767312000", referenced: "314572800" });
  p.add("tank/nomad/pg@.stored-weekly", { guid: "22", creation: "1767225600", referenced: "300" });
  p.add("tank/nomad/pg@autosnap_daily", { guid: "44", creation: "1767398400", referenced: "5" });
  p.add("tank/nomad/pg@autosnap_2026-01-01_00:00:00_daily", { guid: "77", creation: "1767100000" });
  p.add("tank/nomad/pg@.deleted-1-old", { guid: "55", creation: "1767000000" });
  p.add("tank/nomad/pg@.clone-x-1", { guid: "66", creation: "1767000000" });
  return { runner, p };
}

Deno.test("stored snapshots restore when their chain is whole, and say why not otherwise", () => {
  const rows = storedRows([
    manifest("11", null, "2026-01-01T00:00:00Z", 1000),
    manifest("22", "11", "2026-01-02T00:00:00Z", 10),
    manifest("44", "33", "2026-01-04T00:00:00Z", 5),
  ]);
  const by = new Map(rows.map((r) => [r.guid, r]));
  assert.equal(by.get("22")!.restorable, true);
  assert.equal(by.get("22")!.sizeBytes, 1010, "no recorded size: the streams a restore receives");
  assert.equal(by.get("22")!.name, "store:pg:0000000000000016");
  assert.equal(by.get("44")!.restorable, false);
  assert.match(by.get("44")!.note, /not restorable: .*needs base 33/);
});

Deno.test("a stored snapshot's size is the volume's referenced at it, not its stream's bytes", () => {
  const full = {
    ...manifest("11", null, "2026-01-01T00:00:00Z", 300 << 20),
    referencedBytes: 300 << 20,
  };
  const inc = { ...manifest("22", "11", "2026-01-02T00:00:00Z", 624), referencedBytes: 301 << 20 };
  // Written before manifests recorded it: the chain's streams, at most the volume's capacity.
  const older = { ...manifest("33", "22", "2026-01-03T00:00:00Z", 624), capacityBytes: 256 << 20 };
  const by = new Map(storedRows([full, inc, older]).map((r) => [r.guid, r.sizeBytes]));
  assert.deepEqual([by.get("11"), by.get("22"), by.get("33")], [300 << 20, 301 << 20, 256 << 20]);
});

Deno.test("local and stored snapshots merge by guid, newest first; set-aside and internal ones are left out", async () => {
  const { runner } = pool();
  const tools = buildTools(resolveConfig([...TEST_FLAGS]), { runner, level: "error" });
  const local = await localSnapshots(tools, "tank/nomad/pg");
  assert.deepEqual(local.map((r) => [r.name, r.kind]).sort(), [
    [".stored-weekly", "stored"],
    ["autosnap_2026-01-01_00:00:00_daily", "other"],
    ["autosnap_daily", "snapshot"],
    ["nightly", "snapshot"],
  ]);
  const merged = mergeSnapshots(
    local,
    storedRows([
      manifest("11", null, "2026-01-01T00:00:00Z"),
      manifest("22", "11", "2026-01-01T00:00:00Z"),
    ]),
  );
  assert.deepEqual(merged.map((r) => [r.name, r.where]), [
    ["autosnap_daily", "local"],
    ["nightly", "local"],
    [".stored-weekly", "both"],
    ["store:pg:000000000000000b", "store"],
    ["autosnap_2026-01-01_00:00:00_daily", "local"],
  ]);
  const text = snapshotTable(merged, 1767398400 + 60);
  assert.match(text[0]!, /^SNAPSHOT +CREATED +AGE +SIZE +WHERE +KIND +RESTORE$/);
  assert.match(
    text[2]!,
    /^nightly +2026-01-02T00:00:00Z +1 day|^nightly +2026-01-02T00:00:00Z +\d+ h/,
  );
});

Deno.test("zfs-csi snapshots lists a volume's snapshots, the store's with --store", async () => {
  const { runner } = pool();
  const dir = await Deno.makeTempDir({ dir: "/tmp", prefix: "zfs-csi-snaps-" });
  try {
    const io = memoryIo();
    assert.equal(await run([...TEST_FLAGS, "pg", "--json"], io, { runner }), 0);
    assert.deepEqual(
      (JSON.parse(io.stdout.join("\n")) as Array<{ name: string }>).map((r) => r.name),
      ["autosnap_daily", "nightly", ".stored-weekly", "autosnap_2026-01-01_00:00:00_daily"],
    );
    const store = new FileStore(dir);
    await store.putBytes(
      manifestKey("pg", "11"),
      encodeJson(manifest("11", null, "2026-01-01T00:00:00Z")),
    );
    const withStore = memoryIo();
    assert.equal(
      await run([...TEST_FLAGS, "--store", `file://${dir}`, "pg"], withStore, { runner }),
      0,
    );
    assert.match(
      withStore.stdout.find((l) => l.startsWith("store:"))!,
      /^store:pg:000000000000000b .* store +backup +yes: received from the store: 1 stream/,
    );
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
});

Deno.test("restore reads VOLUME[@SNAPSHOT] and tells stored snapshots from local ones", () => {
  assert.deepEqual(splitTarget("pg"), { volume: "pg" });
  assert.deepEqual(splitTarget("pg@nightly"), { volume: "pg", snapshot: "nightly" });
  assert.deepEqual(splitTarget("pg@store:pg:000000000000000b"), {
    volume: "pg",
    snapshot: "store:pg:000000000000000b",
  });
  assert.throws(() => splitTarget("pg@"), /give a snapshot/);
  assert.equal(isStoredName("store:pg:000000000000000b"), true);
  assert.equal(isStoredName("000000000000000b"), true);
  assert.equal(isStoredName("nightly"), false);
});

Deno.test("restore picks a local snapshot by its listed name or zfs's, and names the others when missing", async () => {
  const { runner } = pool();
  const tools = buildTools(resolveConfig([...TEST_FLAGS]), { runner, level: "error" });
  const rows = await localSnapshots(tools, "tank/nomad/pg");
  assert.equal(pickLocal(rows, "pg", "nightly").local, "tank/nomad/pg@nightly");
  assert.equal(pickLocal(rows, "pg", ".stored-weekly").guid, "22");
  assert.throws(
    () => pickLocal(rows, "pg", "hourly"),
    /no snapshot "hourly" on this node \(it has /,
  );
});
