/**
 * zfs send into the store and back out through zfs receive, on two real pools standing for two
 * nodes: a full then an incremental stream restore the same file tree; a damaged stored stream
 * restores nothing; an aborted send leaves nothing in the store. Also reports (without tight
 * bounds) how much the process's RSS grows while a 256 MiB dataset goes through.
 *
 * zfs-fuse cannot show: `zfs send -w` (no encryption), resumable receive (`-s`), bookmarks.
 */

import assert from "node:assert/strict";
import { ZfsError } from "../../src/errors.ts";
import { Logger } from "../../src/log.ts";
import { receiveFromStore, restoreChain } from "../../src/replicate/receive.ts";
import { ReplicateError } from "../../src/replicate_errors.ts";
import { sendToStore } from "../../src/replicate/send.ts";
import { DenoCommandRunner, DenoStreamRunner } from "../../src/run.ts";
import { manifestKey, type SnapshotManifest, streamKey } from "../../src/store/layout.ts";
import { FileStore } from "../../src/store/file_store.ts";
import type { Store } from "../../src/store/store.ts";
import { Zfs } from "../../src/zfs/zfs.ts";
import { treeHash } from "../support/tree_hash.ts";
import { destroyRetrying, sh, TestPool, tryRun } from "../support/zfs_pool.ts";

const VOLUME = "vol";
const UID = "0123456789abcdef0123456789abcdef";
const log = new Logger("error", {}, () => {});
const encoder = new TextEncoder();
const MiB = 1024 * 1024;

async function openStore(dir: string): Promise<FileStore> {
  await Deno.mkdir(dir);
  return new FileStore(dir);
}

/** `store`, with `seen` told of every chunk that goes up or down. */
function tapped(store: Store, seen: (bytes: number) => void): Store {
  const tap = (body: ReadableStream<Uint8Array>) =>
    body.pipeThrough(
      new TransformStream<Uint8Array, Uint8Array>({
        transform(chunk, c) {
          seen(chunk.length);
          c.enqueue(chunk);
        },
      }),
    );
  return {
    description: store.description,
    putStream: (key, body, options) => store.putStream(key, tap(body), options),
    putBytes: (key, bytes, condition) => store.putBytes(key, bytes, condition),
    getStream: async (key, options) => tap(await store.getStream(key, options)),
    getBytes: (key) => store.getBytes(key),
    list: (prefix) => store.list(prefix),
    delete: (key) => store.delete(key),
  };
}

/** Files in the store's directory for writes in progress. */
async function tempFiles(store: FileStore): Promise<string[]> {
  const names: string[] = [];
  try {
    for await (const e of Deno.readDir(`${store.root}/.tmp`)) names.push(e.name);
  } catch (err) {
    if (!(err instanceof Deno.errors.NotFound)) throw err;
  }
  return names;
}

function deps(store: Store) {
  const zfs = new Zfs(new DenoCommandRunner(), {
    zfsPath: "zfs",
    zpoolPath: "zpool",
    timeoutMs: 60_000,
    log,
  });
  return { streams: new DenoStreamRunner(), zfsPath: "zfs", zfs, store, log };
}

async function guidOf(snapshot: string): Promise<string> {
  return (await sh("zfs", "get", "-Hp", "-o", "value", "guid", snapshot)).trim();
}

/** Snapshots `dataset@name`, sends it (incremental from `base` if given), stores a manifest. */
async function backup(
  store: Store,
  dataset: string,
  name: string,
  base?: SnapshotManifest,
): Promise<SnapshotManifest> {
  const snapshot = `${dataset}@${name}`;
  await sh("zfs", "snapshot", snapshot);
  const guid = await guidOf(snapshot);
  const key = streamKey(VOLUME, guid, crypto.randomUUID().replaceAll("-", ""));
  const sent = await sendToStore(deps(store), {
    snapshot,
    raw: false,
    key,
    ...(base && { base: `${dataset}@${base.snapshot}` }),
  });
  const manifest: SnapshotManifest = {
    format: 1,
    volume: VOLUME,
    volumeUid: UID,
    guid,
    baseGuid: base?.guid ?? null,
    snapshot: name,
    kind: "scheduled",
    createdAt: new Date().toISOString(),
    stream: key,
    size: sent.size,
    sha256: sent.sha256,
    raw: false,
    node: "node-a",
    capacityBytes: 0,
  };
  await store.putBytes(
    manifestKey(VOLUME, guid),
    encoder.encode(JSON.stringify(manifest, null, 2) + "\n"),
    { ifNoneMatch: "*" },
  );
  return manifest;
}

/** Writes `mib` MiB of random bytes (incompressible, like most volumes' data) to `path`. */
async function fill(path: string, mib: number): Promise<void> {
  await sh("dd", "if=/dev/urandom", `of=${path}`, "bs=1M", `count=${mib}`, "status=none");
}

/** Every dataset and snapshot of a pool (what a failed restore must not add to). */
async function everything(pool: TestPool): Promise<string[]> {
  const out = await sh("zfs", "list", "-H", "-r", "-t", "all", "-o", "name", pool.pool);
  return out.split("\n").filter((l) => l !== "").sort();
}

/** Mounts a received (unmounted) filesystem, gives its tree hash, and unmounts it. */
async function restoredHash(dataset: string): Promise<string> {
  await sh("zfs", "mount", dataset);
  try {
    return await treeHash(
      (await sh("zfs", "get", "-H", "-o", "value", "mountpoint", dataset)).trim(),
    );
  } finally {
    await tryRun("zfs", "unmount", dataset);
  }
}

/** Writes a tree of files of several kinds and modes below `root`. */
async function writeTree(root: string): Promise<void> {
  await Deno.mkdir(`${root}/etc/conf.d`, { recursive: true });
  await Deno.mkdir(`${root}/data`, { recursive: true });
  await Deno.writeTextFile(`${root}/etc/app.conf`, "listen = 5432\n");
  await Deno.writeTextFile(`${root}/etc/conf.d/secret`, "s3cr3t\n", { mode: 0o600 });
  await Deno.chmod(`${root}/etc/conf.d/secret`, 0o600);
  await Deno.writeTextFile(`${root}/run.sh`, "#!/bin/sh\necho hi\n");
  await Deno.chmod(`${root}/run.sh`, 0o755);
  await Deno.writeFile(`${root}/empty`, new Uint8Array(0));
  await Deno.writeTextFile(`${root}/data/näme with spaces.txt`, "unicode\n");
  await Deno.symlink("etc/app.conf", `${root}/link`);
  const big = new Uint8Array(3 * 1024 * 1024 + 17);
  for (let at = 0; at < big.length; at += 65536) {
    crypto.getRandomValues(big.subarray(at, Math.min(at + 65536, big.length)));
  }
  await Deno.writeFile(`${root}/data/big.bin`, big);
}

/** Changes the tree: content, deletion, addition, mode, rename. */
async function changeTree(root: string): Promise<void> {
  const f = await Deno.open(`${root}/data/big.bin`, { write: true });
  await f.seek(1_000_000, Deno.SeekMode.Start);
  await f.write(new Uint8Array([1, 2, 3]));
  f.close();
  await Deno.remove(`${root}/empty`);
  await Deno.writeTextFile(`${root}/data/new.txt`, "added after the first backup\n");
  await Deno.chmod(`${root}/etc/app.conf`, 0o640);
  await Deno.rename(`${root}/etc/conf.d`, `${root}/etc/conf.e`);
}

// First in the file, so that the baseline is a fresh process's, not the other test's garbage.
Deno.test("replicate: RSS while 256 MiB go to the store and back (reported)", async () => {
  await using src = await TestPool.create(1024);
  await using dst = await TestPool.create(1024);
  const store = await openStore(`${src.dir}/store`);
  const ds = `${src.parent}/big`;
  await sh("zfs", "create", ds);
  await fill(`${src.mountRoot}/nomad/big/f`, 256);
  const rss = new RssSampler();
  const m = await backup(store, ds, "s");
  const send = rss.take();
  await restoreChain(deps(store), { chain: [m], target: `${dst.parent}/big` });
  const receive = rss.take();
  rss.stop();
  assert.ok(m.size > 256 * MiB, `stream of ${m.size} bytes`);
  const mib = (n: number) => `${n < 0 ? "-" : "+"}${(Math.abs(n) / MiB).toFixed(1)} MiB`;
  await Deno.stderr.write(encoder.encode(
    `replicate RSS: ${(rss.baseline / MiB).toFixed(1)} MiB before; ` +
      `${mib(send - rss.baseline)} at most while sending ${(m.size / MiB).toFixed(1)} MiB, ` +
      `${mib(receive - rss.baseline)} at most while receiving it; ` +
      `${mib(Deno.memoryUsage().rss - rss.baseline)} after\n`,
  ));
  // Loose: a stream held whole would add its 256 MiB.
  assert.ok(Math.max(send, receive) - rss.baseline < 128 * MiB);
});

Deno.test("replicate: send to the store and restore on another pool", async (t) => {
  await using src = await TestPool.create(1024);
  await using dst = await TestPool.create(1024);
  const store = await openStore(`${src.dir}/store`);
  const dataset = `${src.parent}/${VOLUME}`;
  await sh("zfs", "create", dataset);
  const root = `${src.mountRoot}/nomad/${VOLUME}`;
  await writeTree(root);
  const hash1 = await treeHash(root);
  const full = await backup(store, dataset, ".backup-1");
  await changeTree(root);
  const hash2 = await treeHash(root);
  assert.notEqual(hash1, hash2);
  const inc = await backup(store, dataset, ".backup-2", full);

  await t.step("a full stream, then an incremental, restore the same trees", async () => {
    const one = `${dst.parent}/one`;
    await restoreChain(deps(store), { chain: [full], target: one });
    assert.equal(await restoredHash(one), hash1);
    const two = `${dst.parent}/two`;
    await restoreChain(deps(store), { chain: [full, inc], target: two });
    assert.equal(await guidOf(`${two}@.backup-2`), inc.guid);
    assert.equal(await restoredHash(two), hash2);
  });

  await t.step("a flipped byte in a stored stream restores nothing from it", async () => {
    const before = await everything(dst);
    for (const [m, at] of [[full, 0.5], [inc, 0.5], [full, 1]] as const) {
      // A stream is over the cap on what the plugin reads whole: read it as the plugin does.
      const good = await new Response(await store.getStream(m.stream)).bytes();
      const bad = good.slice();
      const i = Math.min(bad.length - 1, Math.floor(bad.length * at));
      bad[i]! ^= 0x40;
      await store.putBytes(m.stream, bad);
      const target = `${dst.parent}/bad`;
      const err = await restoreChain(deps(store), { chain: [full, inc], target })
        .then(() => undefined, (e: unknown) => e);
      await store.putBytes(m.stream, good);
      assert.ok(err instanceof ReplicateError && err.kind === "checksum", String(err));
      const after = await everything(dst);
      if (m === full) {
        assert.deepEqual(after, before, `byte ${i} of ${bad.length} of the full stream`);
      } else {
        // The full stream was good and stays received; nothing of the damaged incremental.
        assert.deepEqual(after, [...before, target, `${target}@.backup-1`].sort());
        await destroyRetrying(`${target}@.backup-1`);
        await destroyRetrying(target);
      }
    }
  });

  await t.step("a zfs send that fails stores nothing and says why", async () => {
    const listed = await store.list("");
    const err = await sendToStore(deps(store), {
      snapshot: `${dataset}@.backup-2`,
      base: `${dataset}@missing`,
      raw: false,
      key: streamKey(VOLUME, inc.guid, "00bb00bb"),
    }).then(() => undefined, (e: unknown) => e);
    assert.ok(err instanceof ZfsError && err.kind === "not_found", String(err));
    assert.deepEqual(await store.list(""), listed);
    assert.deepEqual(await tempFiles(store), []);
  });

  await t.step("an aborted zfs send leaves nothing in the store", async () => {
    const bigDs = `${src.parent}/aborted`;
    await sh("zfs", "create", bigDs);
    await fill(`${src.mountRoot}/nomad/aborted/f`, 48);
    await sh("zfs", "snapshot", `${bigDs}@s`);
    const listed = await store.list("");
    const controller = new AbortController();
    let seen = 0;
    const watching = tapped(store, (n) => {
      seen += n;
      if (seen >= 4 * MiB) controller.abort();
    });
    const key = streamKey(VOLUME, await guidOf(`${bigDs}@s`), "00aa00aa");
    await assert.rejects(
      sendToStore(deps(watching), {
        snapshot: `${bigDs}@s`,
        raw: false,
        key,
        signal: controller.signal,
      }),
      { name: "AbortError" },
    );
    assert.ok(seen >= 4 * MiB && seen < 48 * MiB, `${seen} bytes went through`);
    assert.deepEqual(await store.list(""), listed);
    assert.deepEqual(await tempFiles(store), []);
  });

  await t.step("an aborted restore leaves nothing on the pool", async () => {
    const before = await everything(dst);
    const big = await backup(store, `${src.parent}/aborted`, "full");
    const controller = new AbortController();
    let seen = 0;
    const watching = tapped(store, (n) => {
      seen += n;
      if (seen >= 8 * MiB) controller.abort();
    });
    await assert.rejects(
      restoreChain(deps(watching), {
        chain: [big],
        target: `${dst.parent}/aborted`,
        signal: controller.signal,
      }),
      { name: "AbortError" },
    );
    assert.ok(seen < 48 * MiB, `${seen} bytes went through`);
    assert.deepEqual(await everything(dst), before);
  });

  await t.step("a receive into a dataset that exists is refused, never forced", async () => {
    const target = `${dst.parent}/two`;
    const before = await everything(dst);
    await assert.rejects(receiveFromStore(deps(store), { manifest: full, target }), {
      name: "ZfsError",
    });
    assert.deepEqual(await everything(dst), before);
  });
});

/** The highest RSS seen, sampled every 10 ms, since the last take(). */
class RssSampler {
  readonly baseline = Deno.memoryUsage().rss;
  #peak = this.baseline;
  readonly #timer = setInterval(() => this.#sample(), 10);

  #sample(): void {
    this.#peak = Math.max(this.#peak, Deno.memoryUsage().rss);
  }

  take(): number {
    this.#sample();
    const peak = this.#peak;
    this.#peak = Deno.memoryUsage().rss;
    return peak;
  }

  stop(): void {
    clearInterval(this.#timer);
  }
}
