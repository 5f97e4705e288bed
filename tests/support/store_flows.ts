/**
 * Issue 12's behaviour end to end, through the plugin as it ships (PluginProcess: the production
 * permission flags plus the store's grant), on real pools, against any store: the same checks run
 * for the directory store (tests/integration/store_csi_test.ts) and for a real S3 server
 * (tests/integration/store_s3_csi_test.ts). The store is looked at independently of the plugin's
 * own store code: files for the directory, signed S3 requests for the bucket.
 */

import assert from "node:assert/strict";
import { createHash } from "node:crypto";
import { Code } from "../../src/errors.ts";
import type { SnapshotManifest, VolumeRecord } from "../../src/store/layout.ts";
import { sha256Hex, signS3Request } from "../../src/store/sigv4.ts";
import { childrenNamed, childText, parseXml } from "../../src/store/s3_xml.ts";
import { type CsiClient, rejects } from "./csi_client.ts";
import { type Claim, claimVolume, createVolumeRequest } from "./nomad.ts";
import { type PluginOptions, PluginProcess } from "./plugin_process.ts";
import { type S3Server, signedFetch } from "./s3_server.ts";
import { treeHash } from "./tree_hash.ts";
import { destroyRetrying, sh, TestPool, tryRun } from "./zfs_pool.ts";

const KiB = 1024;
const MiB = 1024 * KiB;
/**
 * The scheduled volume's interval: the scheduler backs it up that often (src/replicate/
 * scheduler.ts), so it must outlast the checks made between two backups.
 */
const SCHED_INTERVAL_S = 20;
/** One interval, and a backup of a few MiB takes a second or two. */
const TICK_WAIT_MS = 45_000;
/** CreateSnapshot and restores answer within 90 s; the client waits longer. */
const SLOW_CALL_MS = 120_000;

/** A store as the tests see it: how a plugin is given it, and its keys read without the plugin. */
export interface StoreUnderTest {
  /** For messages: "file store", "S3 store". */
  readonly label: string;
  /** The flags, permission grant and environment that give a plugin this store. */
  readonly plugin: Pick<PluginOptions, "extraArgs" | "scope" | "env">;
  /** Every key below `prefix` (keys as the layout names them, without an S3 prefix). */
  keys(prefix: string): Promise<string[]>;
  /** An object's bytes, or undefined when it does not exist. */
  read(key: string): Promise<Uint8Array | undefined>;
  /** Overwrites an object (to damage it). */
  write(key: string, bytes: Uint8Array): Promise<void>;
}

/** A directory store at `dir`, read and written as plain files. */
export function fileStoreUnderTest(dir: string): StoreUnderTest {
  return {
    label: "file store",
    plugin: { extraArgs: ["--store", `file://${dir}`], scope: { extraDirs: [dir] } },
    async keys(prefix) {
      const out: string[] = [];
      async function walk(rel: string): Promise<void> {
        let entries;
        try {
          entries = await Array.fromAsync(Deno.readDir(`${dir}/${rel}`));
        } catch (e) {
          if (e instanceof Deno.errors.NotFound) return;
          throw e;
        }
        for (const e of entries) {
          const key = `${rel}${e.name}`;
          if (e.isDirectory) await walk(`${key}/`);
          else if (key.startsWith(prefix)) out.push(key);
        }
      }
      await walk(prefix.slice(0, prefix.lastIndexOf("/") + 1));
      return out.sort();
    },
    async read(key) {
      try {
        return await Deno.readFile(`${dir}/${key}`);
      } catch (e) {
        if (e instanceof Deno.errors.NotFound) return undefined;
        throw e;
      }
    },
    async write(key, bytes) {
      await Deno.writeFile(`${dir}/${key}`, bytes);
    },
  };
}

/**
 * The S3 server's bucket under `prefix`, path-style, credentials given to the plugin in its
 * environment and the server's host:port as its only network grant.
 */
export function s3StoreUnderTest(server: S3Server, prefix: string): StoreUnderTest {
  const objectUrl = (key: string) => new URL(`/${server.bucket}/${prefix}/${key}`, server.endpoint);
  return {
    label: "S3 store",
    plugin: {
      extraArgs: [
        "--store",
        `s3://${server.bucket}/${prefix}`,
        "--store-endpoint",
        server.endpoint.origin,
        "--store-path-style",
        "--store-region",
        server.region,
      ],
      scope: { netHosts: [server.endpoint.host] },
      env: { AWS_ACCESS_KEY_ID: server.accessKeyId, AWS_SECRET_ACCESS_KEY: server.secretAccessKey },
    },
    async keys(keyPrefix) {
      const out: string[] = [];
      let token: string | undefined;
      do {
        const url = new URL(`/${server.bucket}`, server.endpoint);
        url.searchParams.set("list-type", "2");
        url.searchParams.set("prefix", `${prefix}/${keyPrefix}`);
        if (token) url.searchParams.set("continuation-token", token);
        const r = await signedFetch(server, "GET", url);
        const xml = await r.text();
        assert.equal(r.status, 200, xml);
        const root = parseXml(xml);
        for (const c of childrenNamed(root, "Contents")) {
          out.push((childText(c, "Key") ?? "").slice(prefix.length + 1));
        }
        token = childText(root, "IsTruncated") === "true"
          ? childText(root, "NextContinuationToken")
          : undefined;
      } while (token);
      return out.sort();
    },
    async read(key) {
      const r = await signedFetch(server, "GET", objectUrl(key));
      if (r.status === 404) {
        await r.body?.cancel();
        return undefined;
      }
      const bytes = new Uint8Array(await r.arrayBuffer());
      assert.equal(r.status, 200, new TextDecoder().decode(bytes));
      return bytes;
    },
    async write(key, bytes) {
      // signedFetch sends no body: sign the payload's hash here (same signer).
      const url = objectUrl(key);
      const headers = signS3Request(
        { method: "PUT", url, payloadHash: sha256Hex(bytes), region: server.region },
        server,
      );
      const r = await fetch(url, { method: "PUT", headers, body: new Uint8Array(bytes) });
      const text = await r.text();
      assert.equal(r.status, 200, text);
    },
  };
}

// ---------------------------------------------------------------------------------------------
// Helpers

/** A volume as CreateVolume answered it. */
interface CsiVolume {
  volume_id: string;
  volume_context: Record<string, string>;
  content_source?: { snapshot?: { snapshot_id: string } } | null;
}

/** Writes `bytes` random bytes to `path`. */
async function writeRandom(path: string, bytes: number): Promise<void> {
  const data = new Uint8Array(bytes);
  for (let i = 0; i < bytes; i += 65_536) {
    crypto.getRandomValues(data.subarray(i, Math.min(bytes, i + 65_536)));
  }
  await Deno.writeFile(path, data);
}

/** The 16 hex digits of a decimal guid, computed here rather than by the plugin's code. */
function hexOf(guid: string): string {
  return BigInt(guid).toString(16).padStart(16, "0");
}

/** Polls `probe` until it returns a value, or fails after `ms` saying what it waited for. */
async function waitFor<T>(
  what: string,
  ms: number,
  probe: () => Promise<T | undefined>,
  context: () => string = () => "",
): Promise<T> {
  const deadline = Date.now() + ms;
  for (;;) {
    const got = await probe();
    if (got !== undefined) return got;
    if (Date.now() > deadline) assert.fail(`Waited ${ms} ms for ${what}${context()}`);
    await new Promise((r) => setTimeout(r, 500));
  }
}

/** The last lines of a plugin's log, for failure messages. */
function logTail(plugin: PluginProcess | undefined, n = 15): string {
  if (!plugin) return "";
  return `\n--- last log lines ---\n${plugin.logs().slice(-n).join("\n")}`;
}

/** The volume's manifests in the store, oldest first (by createdAt, then guid). */
async function manifestsOf(store: StoreUnderTest, volume: string): Promise<SnapshotManifest[]> {
  const keys = await store.keys(`v1/volumes/${volume}/snapshots/`);
  const out: SnapshotManifest[] = [];
  for (const key of keys.filter((k) => k.endsWith(".json"))) {
    const bytes = await store.read(key);
    if (bytes) out.push(JSON.parse(new TextDecoder().decode(bytes)) as SnapshotManifest);
  }
  return out.sort((a, b) => a.createdAt.localeCompare(b.createdAt) || a.guid.localeCompare(b.guid));
}

/** The volume's stream keys in the store. */
async function streamsOf(store: StoreUnderTest, volume: string): Promise<string[]> {
  return await store.keys(`v1/volumes/${volume}/streams/`);
}

/** Reads the volume's record (volume.json). */
async function recordOf(store: StoreUnderTest, volume: string): Promise<VolumeRecord | undefined> {
  const bytes = await store.read(`v1/volumes/${volume}/volume.json`);
  return bytes && JSON.parse(new TextDecoder().decode(bytes)) as VolumeRecord;
}

/** Checks a manifest's stream object against its recorded size and SHA-256. */
async function assertStreamMatches(store: StoreUnderTest, m: SnapshotManifest): Promise<void> {
  const bytes = await store.read(m.stream);
  assert.ok(bytes, `stream ${m.stream} of manifest ${m.guid} is missing`);
  assert.equal(bytes.length, m.size, `size of ${m.stream}`);
  assert.equal(createHash("sha256").update(bytes).digest("hex"), m.sha256, `sha256 of ${m.stream}`);
}

/** The `.backup-*` snapshots of a dataset: name and guid. */
async function backupSnapshots(dataset: string): Promise<{ name: string; guid: string }[]> {
  const out = await sh("zfs", "get", "-Hp", "-r", "-o", "name,value", "guid", dataset);
  return out.split("\n").filter((l) => l.startsWith(`${dataset}@.backup-`)).map((l) => {
    const [name, guid] = l.split("\t");
    return { name: name!, guid: guid! };
  });
}

/** The names of the pool's filesystems and snapshots (no mount table: other tests mount too). */
async function poolDatasets(pool: TestPool): Promise<string[]> {
  const out = await sh("zfs", "list", "-H", "-r", "-t", "all", "-o", "name", pool.pool);
  return out.split("\n").filter((l) => l !== "").sort();
}

/**
 * The stored snapshot id the store holds for `m` (`store:<volume>:<guid hex>`); the volume
 * names used here need no encoding.
 */
function storedId(m: SnapshotManifest): string {
  return `store:${m.volume}:${hexOf(m.guid)}`;
}

/**
 * Restores a stored snapshot on `plugin` as volume `name` and reads it through a claim. With
 * `repeat`, the CreateVolume is sent twice first (Nomad retries): the repeat must answer the
 * same volume.
 */
async function restoreAndHash(
  plugin: PluginProcess,
  name: string,
  snapshotId: string,
  options: { repeat?: boolean } = {},
): Promise<{ volume: CsiVolume; hash: string }> {
  const req = createVolumeRequest(name, {
    volume_content_source: { snapshot: { snapshot_id: snapshotId } },
  });
  const res = await plugin.client.controller("CreateVolume", req, SLOW_CALL_MS);
  const volume = res.volume as CsiVolume;
  if (options.repeat) {
    const again = await plugin.client.controller("CreateVolume", req, SLOW_CALL_MS);
    assert.deepEqual(again.volume, volume, "a repeated CreateVolume answers the same volume");
  }
  const c = await claimVolume(() => plugin, volume, `alloc-${name}`);
  try {
    return { volume, hash: await treeHash(c.target) };
  } finally {
    await c.release();
  }
}

// ---------------------------------------------------------------------------------------------
// The flows

/**
 * Runs checks 1 to 8 of issue 12 against `store`, each a step: a schedule that fires and
 * grows an incremental chain, pruning that keeps chains restorable, CreateSnapshot to the store,
 * restores on a second node (also after the first node's pool is gone, and after DeleteVolume),
 * a damaged stream refused with DATA_LOSS, and a plugin without a store refusing what needs one.
 * Two pools ("nodes" a and b), each with its own plugin, share the store.
 */
export async function storeCsiFlows(t: Deno.TestContext, store: StoreUnderTest): Promise<void> {
  const a = await TestPool.create();
  let b: TestPool | undefined;
  let pa: PluginProcess | undefined;
  let pb: PluginProcess | undefined;
  const claims: { plugin: () => PluginProcess | undefined; claim: Claim }[] = [];
  try {
    b = await TestPool.create();
    const startA = () =>
      PluginProcess.start({
        parentDataset: a.parent,
        dir: a.dir,
        nodeId: "node-a",
        ...store.plugin,
      });
    const startB = () =>
      PluginProcess.start({
        parentDataset: b!.parent,
        dir: b!.dir,
        nodeId: "node-b",
        ...store.plugin,
      });
    pa = await startA();
    pb = await startB();
    const ca = (): CsiClient => pa!.client;
    const cb = (): CsiClient => pb!.client;
    const schedDataset = `${a.parent}/sched`;
    /** What each scheduled backup of "sched" must restore to: tree hash by guid. */
    const expected = new Map<string, string>();
    let sched: Claim | undefined;
    let full: SnapshotManifest | undefined;

    /** Waits for a manifest of "sched" that is not in `known`; returns it. */
    const nextBackup = async (known: readonly SnapshotManifest[]) => {
      const guids = new Set(known.map((m) => m.guid));
      return await waitFor(
        `a new scheduled backup of "sched" in the ${store.label}`,
        TICK_WAIT_MS,
        async () => (await manifestsOf(store, "sched")).find((m) => !guids.has(m.guid)),
        () => logTail(pa),
      );
    };
    /** Waits until the local prune after a backup left one `.backup-*` snapshot. */
    const localPruned = async () =>
      await waitFor("the local prune to leave one .backup-* snapshot", 20_000, async () => {
        const snaps = await backupSnapshots(schedDataset);
        return snaps.length === 1 ? snaps[0]! : undefined;
      }, () => logTail(pa));
    /** Waits until the scheduled volume is due again after backup `m`. */
    const dueAfter = async (m: SnapshotManifest) => {
      const wait = Date.parse(m.createdAt) + (SCHED_INTERVAL_S + 1) * 1000 - Date.now();
      if (wait > 0) await new Promise((r) => setTimeout(r, wait));
    };
    /** Stops plugin a: no scheduled backups until {@linkcode startA} again. */
    const stopA = async () => {
      assert.equal((await pa!.stop("SIGTERM")).code, 0, "plugin a stops cleanly");
    };

    await t.step(
      "check 1: the schedule fires, a full backup then a much smaller incremental",
      async () => {
        const res = await ca().controller(
          "CreateVolume",
          createVolumeRequest("sched", {
            parameters: { backup_interval: `${SCHED_INTERVAL_S}s`, backup_keep: "last=2" },
          }),
        );
        sched = await claimVolume(() => pa!, res.volume, "alloc-sched");
        claims.push({ plugin: () => pa, claim: sched });
        await Deno.mkdir(`${sched.target}/dir`);
        for (let i = 0; i < 4; i++) await writeRandom(`${sched.target}/dir/f${i}.bin`, MiB);
        const h1 = await treeHash(sched.target);
        const started = Date.now();
        full = await nextBackup([]);
        const firstMs = Date.now() - started;
        expected.set(full.guid, h1);
        assert.equal(full.kind, "scheduled");
        assert.equal(full.baseGuid, null, "the first backup is a full stream");
        assert.equal(full.volume, "sched");
        assert.equal(full.node, "node-a");
        assert.ok(full.size > 4 * MiB, `full stream of ${full.size} bytes holds the 4 MiB written`);
        assert.ok(firstMs < 40_000, `first backup after ${firstMs} ms`);
        await assertStreamMatches(store, full);
        await localPruned();

        await writeRandom(`${sched.target}/more.bin`, 64 * KiB);
        const h2 = await treeHash(sched.target);
        const inc = await nextBackup([full]);
        expected.set(inc.guid, h2);
        assert.equal(inc.kind, "scheduled");
        assert.equal(inc.baseGuid, full.guid, "the second backup is incremental on the first");
        assert.ok(
          inc.size * 10 < full.size,
          `incremental moved ${inc.size} bytes, full ${full.size}: not much smaller`,
        );
        await assertStreamMatches(store, inc);
        const local = await localPruned();
        assert.equal(local.guid, inc.guid, "the one local .backup-* snapshot is the newest stored");
        const record = await recordOf(store, "sched");
        assert.equal(record?.schedule?.intervalSeconds, SCHED_INTERVAL_S);
        assert.equal(record?.schedule?.keep.last, 2);
      },
    );

    /**
     * Stops plugin a (no backup can come between), writes a file to "sched", starts plugin a
     * once the volume is due (its scheduler looks at start) and returns the backup that
     * follows, recording the data it must restore to.
     */
    const backupAfterRestart = async (file: string) => {
      await stopA();
      const known = await manifestsOf(store, "sched");
      await dueAfter(known.at(-1)!);
      await writeRandom(`${sched!.target}/${file}`, 64 * KiB);
      const hash = await treeHash(sched!.target);
      pa = await startA();
      const m = await nextBackup(known);
      expected.set(m.guid, hash);
      return { m, before: known };
    };

    let pruned: SnapshotManifest[] = [];
    await t.step(
      "check 2: pruning (last=2) keeps every remaining chain restorable, one local base",
      async () => {
        assert.ok(sched, "step 1 made the volume");
        try {
          // One more incremental, from a restarted plugin.
          const third = await backupAfterRestart("third.bin");
          assert.equal(third.m.baseGuid, third.before.at(-1)!.guid, "incremental after a restart");
          await localPruned();

          // The local base lost (destroyed by hand): the next backup is a new full stream...
          const [base] = await backupSnapshots(schedDataset);
          await destroyRetrying(base!.name);
          const newFull = await backupAfterRestart("fourth.bin");
          assert.equal(newFull.m.baseGuid, null, "no local base: a full stream");
          await localPruned();

          // ...and once two newer backups stand, last=2 lets the old chain go.
          const fifth = await backupAfterRestart("fifth.bin");
          assert.equal(fifth.m.baseGuid, newFull.m.guid);
          const all = [...fifth.before, fifth.m];
          // What last=2 keeps, computed here: the newest two and every base they need.
          const byGuid = new Map(all.map((m) => [m.guid, m]));
          const keep = new Set<string>();
          for (const m of all.slice(-2)) {
            for (let x: SnapshotManifest | undefined = m; x; x = byGuid.get(x.baseGuid ?? "")) {
              keep.add(x.guid);
            }
          }
          const guidsOf = (ms: readonly SnapshotManifest[]) => ms.map((m) => m.guid).sort();
          // The prune removes the old chain one snapshot at a time (leaves first, manifest
          // then stream): wait for it to finish, not for its first change, which a slow machine
          // (OpenZFS under TCG) catches half done, two manifests of the old chain still there.
          let seen: string[] = [];
          await waitFor(
            "the store prune to leave exactly the kept snapshots and their streams",
            20_000,
            async () => {
              const now = await manifestsOf(store, "sched");
              seen = guidsOf(now);
              const streams = (await streamsOf(store, "sched")).join();
              return seen.join() === [...keep].sort().join() &&
                  streams === now.map((m) => m.stream).sort().join()
                ? seen
                : undefined;
            },
            () => `; to keep ${[...keep].sort()}, the store holds ${seen}${logTail(pa)}`,
          );
          await localPruned();
          // No more backups while the store is looked at.
          assert.equal((await pa!.stop("SIGTERM")).code, 0);
          pa = undefined;
          const remaining = await manifestsOf(store, "sched");
          const later = remaining.filter((m) => !byGuid.has(m.guid));
          assert.deepEqual(
            later,
            [],
            `no scheduled backup after the fifth before plugin a stopped (the next is due ` +
              `${SCHED_INTERVAL_S} s later; the checks above took too long)`,
          );
          assert.deepEqual(
            guidsOf(remaining),
            [...keep].sort(),
            "the store holds exactly the kept snapshots and their bases",
          );
          pruned = all.filter((m) => !keep.has(m.guid));
          assert.equal(pruned.length, 3, "the old chain (3 backups) was pruned");
          assert.deepEqual(
            await streamsOf(store, "sched"),
            remaining.map((m) => m.stream).sort(),
            "the pruned snapshots' streams are gone, the kept ones' are there",
          );
          for (const m of remaining) await assertStreamMatches(store, m);
          const local = await backupSnapshots(schedDataset);
          assert.deepEqual(
            local.map((s) => s.guid),
            [fifth.m.guid],
            `one local .backup-* snapshot, the base of the next backup: ${JSON.stringify(local)}`,
          );

          // Every remaining snapshot restores on node b, each to the data it was taken of.
          for (const [i, m] of remaining.entries()) {
            const { hash } = await restoreAndHash(pb!, `sched-kept-${i}`, storedId(m));
            assert.equal(hash, expected.get(m.guid), `restore of ${storedId(m)}`);
          }
          assert.equal(
            expected.get(remaining.at(-1)!.guid),
            await treeHash(sched.target),
            "the newest backup holds the volume's current data",
          );
          const listed = (await cb().controller("ListSnapshots", {})).entries.map(
            (e: { snapshot: { snapshot_id: string } }) => e.snapshot.snapshot_id,
          );
          for (const m of pruned) {
            assert.ok(!listed.includes(storedId(m)), `pruned ${storedId(m)} is not listed`);
          }
          await rejects(
            cb().controller(
              "CreateVolume",
              createVolumeRequest("from-pruned", {
                volume_content_source: { snapshot: { snapshot_id: storedId(pruned[0]!) } },
              }),
            ),
            Code.NOT_FOUND,
          );
        } finally {
          pa ??= await startA();
        }
      },
    );

    let snap1: { id: string; hash: string } | undefined;
    let dataClaim: Claim | undefined;
    await t.step(
      "check 3: CreateSnapshot stores a snapshot that another node lists",
      async () => {
        const res = await ca().controller("CreateVolume", createVolumeRequest("data"));
        dataClaim = await claimVolume(() => pa!, res.volume, "alloc-data");
        claims.push({ plugin: () => pa, claim: dataClaim });
        await Deno.mkdir(`${dataClaim.target}/db`);
        await writeRandom(`${dataClaim.target}/db/table.bin`, 2 * MiB);
        await Deno.writeTextFile(`${dataClaim.target}/db/notes.txt`, "snapshot one\n");
        await Deno.symlink("db/notes.txt", `${dataClaim.target}/link`);
        const hash = await treeHash(dataClaim.target);
        const req = { source_volume_id: "data@node-a", name: "data-snap-1", parameters: {} };
        const made = (await ca().controller("CreateSnapshot", req, SLOW_CALL_MS)).snapshot;
        assert.match(made.snapshot_id, /^store:data:[0-9a-f]{16}$/);
        assert.equal(made.ready_to_use, true);
        assert.equal(made.source_volume_id, "data@node-a");
        snap1 = { id: made.snapshot_id, hash };
        const [m] = await manifestsOf(store, "data");
        assert.ok(m, `a manifest of "data" in the ${store.label}`);
        assert.equal(storedId(m), made.snapshot_id);
        assert.equal(m.kind, "requested");
        assert.equal(m.csiName, "data-snap-1");
        assert.equal(m.baseGuid, null);
        await assertStreamMatches(store, m);

        const listed = (await cb().controller("ListSnapshots", {})).entries
          .map((e: { snapshot: Record<string, unknown> }) => e.snapshot)
          .find((s: Record<string, unknown>) => s.snapshot_id === made.snapshot_id);
        assert.ok(listed, "node b lists the stored snapshot");
        assert.equal(listed.ready_to_use, true);
        assert.equal(listed.source_volume_id, "data@node-a");
        // Its size, on either node, is the volume's referenced at the snapshot (recorded in the
        // manifest; zfs-fuse has no logicalreferenced), never its stream's bytes.
        const referenced = Number(
          await sh(
            "zfs",
            "get",
            "-Hp",
            "-o",
            "value",
            "referenced",
            `${a.parent}/data@.stored-data-snap-1`,
          ),
        );
        assert.ok(referenced >= 2 * MiB, `referenced ${referenced}`);
        assert.equal(m.referencedBytes, referenced);
        assert.deepEqual([made.size_bytes, listed.size_bytes], [
          String(referenced),
          String(referenced),
        ]);
        const one = await cb().controller("ListSnapshots", { snapshot_id: made.snapshot_id });
        assert.equal(one.entries.length, 1, "ListSnapshots by id on node b");

        const again = (await ca().controller("CreateSnapshot", req, SLOW_CALL_MS)).snapshot;
        assert.equal(again.snapshot_id, made.snapshot_id, "a repeat answers the same id");
        assert.equal((await manifestsOf(store, "data")).length, 1, "and stores nothing more");
        await rejects(
          ca().controller("CreateSnapshot", { ...req, source_volume_id: "sched@node-a" }),
          Code.ALREADY_EXISTS,
          /data-snap-1/,
        );
        // Names are unique in the whole store: another node's volume cannot take it either.
        await rejects(
          cb().controller("CreateSnapshot", { ...req, source_volume_id: "sched-kept-0@node-b" }),
          Code.ALREADY_EXISTS,
        );
        // The source moves on after the snapshot.
        await Deno.writeTextFile(
          `${dataClaim.target}/db/notes.txt`,
          "changed after snapshot one\n",
        );
        await writeRandom(`${dataClaim.target}/db/later.bin`, 256 * KiB);
        assert.notEqual(await treeHash(dataClaim.target), hash);
      },
    );

    await t.step("check 4: a restore on another node gives the data at snapshot time", async () => {
      assert.ok(snap1, "step 3 stored a snapshot");
      const { volume, hash } = await restoreAndHash(pb!, "data-copy", snap1.id, { repeat: true });
      assert.equal(volume.volume_id, "data-copy@node-b");
      assert.equal(volume.content_source?.snapshot?.snapshot_id, snap1.id);
      assert.equal(hash, snap1.hash, "same tree as the source when the snapshot was taken");
      const left = (await poolDatasets(b!)).filter((d) => d.includes("/.restore-"));
      assert.deepEqual(left, [], "no temporary restore dataset left");
    });

    let snap2: { id: string; hash: string } | undefined;
    await t.step("check 6: DeleteVolume keeps the backups, which still restore", async () => {
      assert.ok(dataClaim && snap1, "step 3 made the volume");
      const hash = await treeHash(dataClaim.target);
      const made = (await ca().controller("CreateSnapshot", {
        source_volume_id: "data@node-a",
        name: "data-snap-2",
        parameters: { store: "true" },
      }, SLOW_CALL_MS)).snapshot;
      snap2 = { id: made.snapshot_id, hash };
      await dataClaim.release();
      claims.splice(claims.findIndex((c) => c.claim === dataClaim), 1);
      const manifests = await manifestsOf(store, "data");
      const streams = await streamsOf(store, "data");
      assert.equal(manifests.length, 2);
      await ca().controller("DeleteVolume", { volume_id: "data@node-a" });
      assert.ok(!(await a.datasets()).includes(`${a.parent}/data`), "the volume is gone from a");
      assert.deepEqual(
        (await manifestsOf(store, "data")).map((m) => m.guid),
        manifests.map((m) => m.guid),
        "every manifest stays",
      );
      assert.deepEqual(await streamsOf(store, "data"), streams, "every stream stays");
      const record = await recordOf(store, "data");
      assert.ok(record?.deletedAt, `volume.json marks the delete: ${JSON.stringify(record)}`);
      assert.ok(Math.abs(Date.parse(record.deletedAt) - Date.now()) < 120_000, record.deletedAt);
      const restored = await restoreAndHash(pb!, "data-undelete", snap2.id);
      assert.equal(restored.hash, snap2.hash, "the deleted volume's last snapshot restores");
    });

    await t.step(
      "check 5: a restore after the source node's pool is destroyed for good",
      async () => {
        assert.ok(snap2, "step 6 stored a snapshot");
        for (const c of claims.splice(0)) await c.claim.release();
        assert.equal((await pa!.stop("SIGTERM")).code, 0);
        pa = undefined;
        await a.destroy();
        const gone = await tryRun("zpool", "list", a.pool);
        assert.notEqual(gone.code, 0, `pool ${a.pool} is destroyed`);
        // The volume comes back under its own name, on node b.
        const { volume, hash } = await restoreAndHash(pb!, "data", snap2.id);
        assert.equal(volume.volume_id, "data@node-b");
        assert.equal(hash, snap2.hash, "same bytes as the source had");
      },
    );

    await t.step(
      "check 7: a damaged stored stream answers DATA_LOSS and leaves nothing",
      async () => {
        assert.ok(snap1, "step 3 stored a snapshot");
        const m = (await manifestsOf(store, "data")).find((x) => storedId(x) === snap1!.id);
        assert.ok(m, "the snapshot's manifest");
        const bytes = await store.read(m.stream);
        assert.ok(bytes);
        const at = Math.floor(bytes.length / 2);
        bytes[at] = bytes[at]! ^ 0x01;
        await store.write(m.stream, bytes);
        const before = await poolDatasets(b!);
        const details = await rejects(
          cb().controller(
            "CreateVolume",
            createVolumeRequest("data-damaged", {
              volume_content_source: { snapshot: { snapshot_id: snap1.id } },
            }),
            SLOW_CALL_MS,
          ),
          Code.DATA_LOSS,
        );
        assert.ok(details.includes(m.stream), `the error names the stream: ${details}`);
        // A snapshot built on the damaged one, and a repeat: refused the same way (nothing was
        // left in their way).
        for (const id of [snap2?.id ?? snap1.id, snap1.id]) {
          const again = await rejects(
            cb().controller(
              "CreateVolume",
              createVolumeRequest("data-damaged", {
                volume_content_source: { snapshot: { snapshot_id: id } },
              }),
              SLOW_CALL_MS,
            ),
            Code.DATA_LOSS,
          );
          assert.ok(again.includes(m.stream), `the error names the damaged stream: ${again}`);
        }
        // zfs-fuse's daemon may finish a stopped receive after the call: look again later too.
        for (const wait of [0, 2_000]) {
          await new Promise((r) => setTimeout(r, wait));
          const after = await poolDatasets(b!);
          assert.ok(!after.some((d) => d.endsWith("/data-damaged")), "no volume dataset");
          assert.deepEqual(
            after.filter((d) => d.includes("/.restore-")),
            [],
            "no .restore-* dataset",
          );
          assert.deepEqual(after, before, "pool b is as it was");
        }
      },
    );

    await t.step("check 8: a plugin without --store refuses what needs one", async () => {
      assert.equal((await pb!.stop("SIGTERM")).code, 0);
      pb = await PluginProcess.start({ parentDataset: b!.parent, dir: b!.dir, nodeId: "node-b" });
      const before = await poolDatasets(b!);
      await rejects(
        cb().controller(
          "CreateVolume",
          createVolumeRequest("wants-backups", { parameters: { backup_interval: "5s" } }),
        ),
        Code.INVALID_ARGUMENT,
        /store/,
      );
      await rejects(
        cb().controller("CreateSnapshot", {
          source_volume_id: "data-copy@node-b",
          name: "wants-store",
          parameters: { store: "true" },
        }),
        Code.INVALID_ARGUMENT,
        /store/,
      );
      await rejects(
        cb().controller(
          "CreateVolume",
          createVolumeRequest("from-store", {
            volume_content_source: { snapshot: { snapshot_id: snap2?.id ?? "store:data:00" } },
          }),
        ),
        Code.FAILED_PRECONDITION,
        /--store/,
      );
      assert.deepEqual(await poolDatasets(b!), before, "nothing was made on pool b");
    });
  } finally {
    for (const c of claims) {
      if (c.plugin()) await c.claim.release().catch(() => {});
    }
    await pa?.stop("SIGKILL");
    await pb?.stop("SIGKILL");
    await b?.destroy();
    await a.destroy();
  }
}
