/**
 * Issue 12: "OpenZFS encrypted datasets are sent raw, so the store never sees plaintext". A keyed
 * volume (encryption=on, keyformat=hex, its key in a file below --key-dir) gets a known marker
 * written many times; CreateSnapshot puts it in a directory store. The manifest must say raw, and
 * the stored stream must not hold the marker's bytes. A second node restores it with the key's
 * location and reads the marker back; without one it must refuse clearly, never hand out a volume
 * nobody can read. A second snapshot goes raw and incremental, and restores too.
 *
 * The marker search is shown able to fail by the control: an unencrypted volume's stream, sent by
 * the same code, does hold the marker. The control runs on any ZFS; the encrypted test needs
 * OpenZFS (zfs-fuse has no encryption: it says so and passes), run in tools/openzfs-vm/.
 */

import assert from "node:assert/strict";
import { createHash } from "node:crypto";
import { Code } from "../../src/errors.ts";
import type { SnapshotManifest } from "../../src/store/layout.ts";
import type { CallError } from "../support/csi_client.ts";
import { claimPaths, createVolumeRequest, mountCapability, mountsAt } from "../support/nomad.ts";
import { type PluginOptions, PluginProcess } from "../support/plugin_process.ts";
import { sh, TestPool, tryRun } from "../support/zfs_pool.ts";

/** CreateSnapshot and restores answer within 90 s; the client waits longer. */
const SLOW_CALL_MS = 120_000;
/** A stage loads a key and mounts: a few zfs commands, slow under TCG. */
const STAGE_MS = 60_000;
/** How long an upload answered not ready may take to show its manifest. */
const UPLOAD_WAIT_MS = 300_000;

/** A volume as CreateVolume answered it. */
interface CsiVolume {
  volume_id: string;
  volume_context: Record<string, string>;
}

/** A claim of a volume by an alloc: its paths and how to release it. */
interface Claim {
  readonly staging: string;
  readonly target: string;
  release(): Promise<void>;
}

/** A snapshot CreateSnapshot put in the store, as the store's files show it. */
interface Stored {
  readonly id: string;
  readonly manifest: SnapshotManifest;
  /** The stream object's bytes, checked against the manifest's size and SHA-256. */
  readonly stream: Uint8Array;
}

/** A line on stderr, shown with the test's output. */
async function note(text: string): Promise<void> {
  await Deno.stderr.write(new TextEncoder().encode(`${text}\n`));
}

function randomHex(bytes: number): string {
  return [...crypto.getRandomValues(new Uint8Array(bytes))]
    .map((b) => b.toString(16).padStart(2, "0")).join("");
}

/** A marker no stream holds by chance: random per run, in no dataset or snapshot name. */
function newMarker(label: string): string {
  return `zfs-csi-plaintext-${label}-${randomHex(12)}`;
}

/** A file's text: the marker many times (about 100 KiB). */
function markerText(marker: string): string {
  return `${marker}\n`.repeat(2048);
}

/** Whether `needle`'s UTF-8 bytes occur in `hay`. */
function contains(hay: Uint8Array, needle: string): boolean {
  const n = new TextEncoder().encode(needle);
  const first = n[0]!;
  for (
    let i = hay.indexOf(first);
    i >= 0 && i + n.length <= hay.length;
    i = hay.indexOf(first, i + 1)
  ) {
    let j = 1;
    while (j < n.length && hay[i + j] === n[j]) j++;
    if (j === n.length) return true;
  }
  return false;
}

/** Stages and publishes a volume as Nomad does. */
async function claim(plugin: PluginProcess, volume: CsiVolume, allocId: string): Promise<Claim> {
  const p = await claimPaths(plugin.baseDir, { volumeId: volume.volume_id, allocId });
  const base = {
    volume_id: volume.volume_id,
    volume_capability: mountCapability(),
    volume_context: volume.volume_context,
  };
  await plugin.client.node(
    "NodeStageVolume",
    { ...base, staging_target_path: p.staging },
    STAGE_MS,
  );
  await plugin.client.node("NodePublishVolume", {
    ...base,
    staging_target_path: p.staging,
    target_path: p.target,
  });
  return {
    staging: p.staging,
    target: p.target,
    release: async () => {
      await plugin.client.node("NodeUnpublishVolume", {
        volume_id: volume.volume_id,
        target_path: p.target,
      });
      await plugin.client.node("NodeUnstageVolume", {
        volume_id: volume.volume_id,
        staging_target_path: p.staging,
      });
    },
  };
}

/** The plugin of one "node", with the directory store and (when given) a key directory. */
function startPlugin(
  pool: TestPool,
  nodeId: string,
  storeDir: string,
  keyDir?: string,
): Promise<PluginProcess> {
  const opts: PluginOptions = {
    parentDataset: pool.parent,
    dir: pool.dir,
    nodeId,
    extraArgs: ["--store", `file://${storeDir}`, ...(keyDir ? ["--key-dir", keyDir] : [])],
    scope: { extraDirs: [storeDir] },
  };
  return PluginProcess.start(opts);
}

/**
 * CreateSnapshot of `volume` into the store, then its manifest and stream read from the store's
 * files (not through the plugin); waits for the upload if the answer was "not ready yet".
 */
async function storeSnapshot(
  plugin: PluginProcess,
  storeDir: string,
  volume: CsiVolume,
  volumeName: string,
  name: string,
): Promise<Stored> {
  const req = { source_volume_id: volume.volume_id, name, parameters: {} };
  const made = (await plugin.client.controller("CreateSnapshot", req, SLOW_CALL_MS)).snapshot;
  const id: string = made.snapshot_id;
  const hex = new RegExp(`^store:${volumeName}:([0-9a-f]{16})$`).exec(id)?.[1];
  assert.ok(hex, `CreateSnapshot answered a stored snapshot id, got "${id}"`);
  const path = `${storeDir}/v1/volumes/${volumeName}/snapshots/${hex}.json`;
  const deadline = Date.now() + UPLOAD_WAIT_MS;
  let text: string | undefined;
  while (text === undefined) {
    try {
      text = await Deno.readTextFile(path);
    } catch (err) {
      if (!(err instanceof Deno.errors.NotFound)) throw err;
      if (Date.now() > deadline) {
        assert.fail(`No manifest ${path} after ${UPLOAD_WAIT_MS} ms` + logTail(plugin));
      }
      await new Promise((r) => setTimeout(r, 1000));
    }
  }
  const manifest = JSON.parse(text) as SnapshotManifest;
  assert.equal(BigInt(manifest.guid).toString(16).padStart(16, "0"), hex);
  assert.equal(manifest.csiName, name);
  assert.equal(manifest.kind, "requested");
  const stream = await Deno.readFile(`${storeDir}/${manifest.stream}`);
  assert.equal(stream.length, manifest.size, `size of ${manifest.stream}`);
  assert.equal(createHash("sha256").update(stream).digest("hex"), manifest.sha256);
  return { id, manifest, stream };
}

/** The last lines of a plugin's log, for failure messages. */
function logTail(plugin: PluginProcess, n = 15): string {
  return `\n--- last log lines ---\n${plugin.logs().slice(-n).join("\n")}`;
}

/** CreateVolume from a stored snapshot on `plugin`, with `parameters`. */
async function restore(
  plugin: PluginProcess,
  name: string,
  snapshotId: string,
  parameters: Record<string, string>,
): Promise<CsiVolume> {
  const req = createVolumeRequest(name, {
    parameters,
    volume_content_source: { snapshot: { snapshot_id: snapshotId } },
  });
  return (await plugin.client.controller("CreateVolume", req, SLOW_CALL_MS)).volume as CsiVolume;
}

/** The names of the pool's filesystems and snapshots. */
async function poolDatasets(pool: TestPool): Promise<string[]> {
  const out = await sh("zfs", "list", "-H", "-r", "-t", "all", "-o", "name", pool.pool);
  return out.split("\n").filter((l) => l !== "");
}

Deno.test("store, unencrypted volume (control): its stored streams hold the file's plain bytes", async () => {
  await using pool = await TestPool.create();
  const storeDir = await Deno.makeTempDir({ prefix: "zfs-csi-store-plain-" });
  try {
    await using plugin = await startPlugin(pool, "node-a", storeDir);
    const res = await plugin.client.controller("CreateVolume", createVolumeRequest("plain"));
    const volume = res.volume as CsiVolume;
    const dataset = `${pool.parent}/plain`;
    const c = await claim(plugin, volume, "alloc-plain");
    try {
      const one = newMarker("one");
      await Deno.writeTextFile(`${c.target}/marker.txt`, markerText(one));
      const first = await storeSnapshot(plugin, storeDir, volume, "plain", "plain-1");
      assert.equal(first.manifest.raw, false, "an unencrypted volume is not sent raw");
      assert.equal(first.manifest.baseGuid, null);
      assert.ok(contains(first.stream, `${dataset}@${first.manifest.snapshot}`), "its own name");
      assert.ok(contains(first.stream, one), "a plain stream holds the marker: the search works");

      const two = newMarker("two");
      await Deno.writeTextFile(`${c.target}/more.txt`, markerText(two));
      const second = await storeSnapshot(plugin, storeDir, volume, "plain", "plain-2");
      assert.equal(second.manifest.raw, false);
      assert.equal(second.manifest.baseGuid, first.manifest.guid, "incremental from the first");
      assert.ok(contains(second.stream, two), "the incremental holds the new marker");
    } finally {
      await c.release();
    }
  } finally {
    await Deno.remove(storeDir, { recursive: true });
  }
});

Deno.test("store, encrypted volume: sent raw, ciphertext only in the store, restored with its key on another node", async (t) => {
  await using a = await TestPool.create();
  const probe = await tryRun("zfs", "get", "-H", "-o", "value", "encryption", a.parent);
  if (probe.code !== 0) {
    // zfs-fuse: no encryption, so nothing is ever sent raw. The control above still runs.
    const why = probe.stderr.trim().split("\n")[0];
    await note(`store, encrypted volume: skipped, this ZFS has no encryption (${why})`);
    return;
  }
  await using b = await TestPool.create();
  const storeDir = await Deno.makeTempDir({ prefix: "zfs-csi-store-enc-" });
  // One key directory both nodes name with --key-dir: the same key file reachable on each.
  const keyDir = await Deno.makeTempDir({ prefix: "zfs-csi-keys-" });
  try {
    const keylocation = `file://${keyDir}/secret.key`;
    await Deno.writeTextFile(`${keyDir}/secret.key`, randomHex(32));
    await using pa = await startPlugin(a, "node-a", storeDir, keyDir);
    await using pb = await startPlugin(b, "node-b", storeDir, keyDir);
    const source = `${a.parent}/secret`;
    const one = newMarker("one");
    const two = newMarker("two");
    let writer: Claim | undefined;
    let volume: CsiVolume | undefined;
    let first: Stored | undefined;
    try {
      await t.step(
        "a keyed volume's snapshot is stored raw, and its stream holds no plaintext",
        async () => {
          const res = await pa.client.controller(
            "CreateVolume",
            createVolumeRequest("secret", {
              parameters: { encryption: "on", keyformat: "hex", keylocation },
            }),
          );
          volume = res.volume as CsiVolume;
          assert.notEqual(await a.get(source, "encryption"), "off");
          writer = await claim(pa, volume, "alloc-secret");
          await Deno.writeTextFile(`${writer.target}/marker.txt`, markerText(one));
          first = await storeSnapshot(pa, storeDir, volume, "secret", "secret-1");
          assert.equal(first.manifest.raw, true, "an encrypted volume is sent raw");
          assert.equal(first.manifest.baseGuid, null);
          // The stream's header names the snapshot in clear: the search does read this stream.
          assert.ok(contains(first.stream, `${source}@${first.manifest.snapshot}`), "its own name");
          assert.ok(!contains(first.stream, one), "the raw stream does not hold the marker");
        },
      );

      await t.step(
        "restored on node b with keylocation: the key loads at stage, the file reads back",
        async () => {
          assert.ok(first, "needs the stored snapshot of the step before");
          const copy = await restore(pb, "secret-copy", first.id, { keylocation });
          const ds = `${b.parent}/secret-copy`;
          assert.notEqual(await b.get(ds, "encryption"), "off");
          assert.equal(await b.get(ds, "encryptionroot"), ds, "a raw receive makes its own root");
          assert.equal(await b.get(ds, "keylocation"), keylocation);
          // Received raw, the key has never been loaded on this node: the stage must load it.
          await note(`restored raw: keystatus before stage: ${await b.get(ds, "keystatus")}`);
          const c = await claim(pb, copy, "alloc-secret-copy");
          try {
            assert.equal(await b.get(ds, "keystatus"), "available");
            assert.equal(await Deno.readTextFile(`${c.target}/marker.txt`), markerText(one));
          } finally {
            await c.release();
          }
        },
      );

      await t.step(
        "restored without keylocation: refused with a clear error, nothing readable published",
        async () => {
          assert.ok(first, "needs the stored snapshot of the first step");
          const ds = `${b.parent}/secret-nokey`;
          let made: CsiVolume | undefined;
          try {
            made = await restore(pb, "secret-nokey", first.id, {});
          } catch (err) {
            const e = err as CallError;
            await note(
              `restore without keylocation refused at CreateVolume: ${e.code} ${e.details}`,
            );
            assert.ok(
              e.code === Code.INVALID_ARGUMENT || e.code === Code.FAILED_PRECONDITION,
              `CreateVolume refused with code ${e.code}: ${e.details}`,
            );
            assert.match(e.details, /keylocation/);
            const left = (await poolDatasets(b)).filter((n) =>
              n === ds || n.startsWith(`${ds}@`) || n.startsWith(`${b.parent}/.restore-`)
            );
            assert.deepEqual(left, [], "a refused restore leaves nothing in the pool");
            return;
          }
          // Created: the stage must be what refuses, and nothing may be mounted.
          const p = await claimPaths(pb.baseDir, {
            volumeId: made.volume_id,
            allocId: "alloc-nokey",
          });
          let stageError: CallError | undefined;
          try {
            await pb.client.node("NodeStageVolume", {
              volume_id: made.volume_id,
              volume_capability: mountCapability(),
              volume_context: made.volume_context,
              staging_target_path: p.staging,
            }, STAGE_MS);
          } catch (err) {
            stageError = err as CallError;
          }
          assert.ok(stageError, "NodeStageVolume of a volume whose key cannot be loaded must fail");
          await note(
            `restore without keylocation created, refused at NodeStageVolume: ` +
              `${stageError.code} ${stageError.details}`,
          );
          assert.ok(
            stageError.code === Code.FAILED_PRECONDITION ||
              stageError.code === Code.INVALID_ARGUMENT,
            `NodeStageVolume refused with code ${stageError.code}: ${stageError.details}`,
          );
          assert.match(stageError.details, /keylocation/);
          assert.deepEqual(await mountsAt(p.staging), [], "nothing is mounted at the staging path");
          assert.equal(await b.get(ds, "mounted"), "no");
        },
      );

      await t.step(
        "a second snapshot after more writes goes raw and incremental, and restores",
        async () => {
          assert.ok(first && writer && volume, "needs the volume and snapshot of the first step");
          await Deno.writeTextFile(`${writer.target}/more.txt`, markerText(two));
          const second = await storeSnapshot(pa, storeDir, volume, "secret", "secret-2");
          assert.equal(second.manifest.raw, true);
          assert.equal(second.manifest.baseGuid, first.manifest.guid, "incremental from the first");
          assert.ok(contains(second.stream, `${source}@${second.manifest.snapshot}`), "its name");
          assert.ok(!contains(second.stream, two), "the raw incremental does not hold the marker");
          assert.ok(!contains(second.stream, one));

          const restored = await restore(pb, "secret-copy2", second.id, { keylocation });
          const c = await claim(pb, restored, "alloc-secret-copy2");
          try {
            assert.equal(await Deno.readTextFile(`${c.target}/marker.txt`), markerText(one));
            assert.equal(await Deno.readTextFile(`${c.target}/more.txt`), markerText(two));
          } finally {
            await c.release();
          }
        },
      );
    } finally {
      await writer?.release();
    }
  } finally {
    await Deno.remove(storeDir, { recursive: true });
    await Deno.remove(keyDir, { recursive: true });
  }
});
