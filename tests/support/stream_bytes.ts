/**
 * What a stream costs the store against what the pool holds, shared by the store bench (its byte
 * rows, bench/stream_bytes.ts) and tests/integration/store_stream_form_test.ts: a volume with
 * compression holding text-like data is backed up through the plugin (CreateSnapshot, a full
 * stream), part of it rewritten and backed up again (an incremental, the stream a move sends),
 * and each stored stream's size set against the space the data takes in the pool and against
 * the plain `zfs send` of the same snapshots (what every stream cost before compressed sends).
 */

import { parseManifest } from "../../src/store/chain.ts";
import { manifestKey, type SnapshotManifest } from "../../src/store/layout.ts";
import { parseStoredSnapshotId } from "../../src/store/snapshot_ids.ts";
import type { CsiClient } from "./csi_client.ts";
import { type ClaimingPlugin, claimVolume, createVolumeRequest } from "./nomad.ts";
import { Prng } from "./prng.ts";
import { sh } from "./zfs_pool.ts";

const MiB = 1024 * 1024;

/** Whether the machine's zfs is OpenZFS (`zfs version` answers) or zfs-fuse (it does not). */
export async function openZfs(): Promise<boolean> {
  const out = await new Deno.Command("zfs", { args: ["version"], stdout: "null", stderr: "null" })
    .output();
  return out.success;
}

/**
 * Text-like bytes: lines of words from a vocabulary of 2,048 made-up words, the common ones far
 * more often, picked by a seeded generator. lz4 and gzip compress it about as they do prose or
 * logs; no two records are alike, so nothing deduplicates or compresses away.
 */
export class TextLike {
  readonly #prng: Prng;
  readonly #words: Uint8Array[];

  constructor(seed: number) {
    this.#prng = new Prng(seed);
    const letters = "etaoinshrdlcumwfgypbvkjxqz";
    this.#words = Array.from({ length: 2048 }, () => {
      const length = this.#prng.int(2, 10);
      // Common letters more often, as in a language.
      return Uint8Array.from({ length }, () => {
        const r = this.#prng.next();
        return letters.charCodeAt(Math.floor(r * r * letters.length));
      });
    });
  }

  /** Fills `buffer` with text. */
  fill(buffer: Uint8Array): void {
    for (let at = 0; at < buffer.length;) {
      // Some words far more often than others, as in a language (about Zipf's law).
      const r = this.#prng.next();
      const word = this.#words[Math.floor(r * r * r * this.#words.length)]!;
      const n = Math.min(word.length, buffer.length - at);
      buffer.set(word.subarray(0, n), at);
      at += n;
      if (at < buffer.length) buffer[at++] = this.#prng.chance(1 / 12) ? 0x0a : 0x20;
    }
  }
}

/** Writes `mib` MiB of text-like data into `path` at `offsetMiB`, then flushes it to disk. */
export async function writeTextLike(
  path: string,
  mib: number,
  seed: number,
  offsetMiB = 0,
): Promise<void> {
  const text = new TextLike(seed);
  const buffer = new Uint8Array(MiB);
  const file = await Deno.open(path, { write: true, create: true });
  try {
    await file.seek(offsetMiB * MiB, Deno.SeekMode.Start);
    for (let i = 0; i < mib; i++) {
      text.fill(buffer);
      for (let at = 0; at < buffer.length;) at += await file.write(buffer.subarray(at));
    }
    await file.sync();
  } finally {
    file.close();
  }
}

/**
 * A dataset's `used` once it stopped changing: zfs accounts new blocks only when their
 * transaction group is written (every few seconds), so it is read until two reads a second
 * apart agree (at most 60 s).
 */
export async function settledUsed(dataset: string): Promise<number> {
  await sh("sync");
  const read = async () =>
    Number((await sh("zfs", "get", "-Hp", "-o", "value", "used", dataset)).trim());
  let last = await read();
  for (let i = 0; i < 60; i++) {
    await new Promise((r) => setTimeout(r, 1000));
    const now = await read();
    if (now === last && i >= 5) return now;
    last = now;
  }
  return last;
}

/** Bytes of `zfs send [-i base] snapshot`, plain (no -c, -L, -e): what was stored before. */
export async function plainSendBytes(snapshot: string, base?: string): Promise<number> {
  const out = await sh(
    "bash",
    "-c",
    `set -o pipefail; zfs send ${base ? `-i '${base}' ` : ""}'${snapshot}' | wc -c`,
  );
  return Number(out.trim());
}

/** The manifest of a stored snapshot in a directory store. */
export async function fileManifest(
  storeDir: string,
  snapshotId: string,
): Promise<SnapshotManifest> {
  const ref = parseStoredSnapshotId(snapshotId);
  if (!ref) throw new Error(`"${snapshotId}" is not a stored snapshot id`);
  const key = manifestKey(ref.volumeKey, ref.guid);
  return parseManifest(await Deno.readFile(`${storeDir}/${key}`), { key });
}

/** One stored stream against the space its data takes and its plain send. */
export interface StreamCost {
  /** Bytes stored (the manifest's size). */
  readonly stored: number;
  /** Bytes the data takes in the pool: the dataset's `used`, or its growth for an increment. */
  readonly used: number;
  /** Bytes of the plain `zfs send` of the same snapshot(s). */
  readonly plain: number;
  readonly manifest: SnapshotManifest;
}

/** What {@linkcode measureStreamCosts} did. */
export interface StreamCosts {
  /** The volume as CreateVolume answered (id and context, to claim it again). */
  readonly volume: { readonly volume_id: string; readonly volume_context: Record<string, string> };
  readonly dataset: string;
  /** The full backup's and the increment's stored snapshot ids. */
  readonly fullId: string;
  readonly incrementId: string;
  readonly full: StreamCost;
  readonly increment: StreamCost;
}

/** What {@linkcode measureStreamCosts} needs. */
export interface StreamCostOptions {
  readonly plugin: ClaimingPlugin & { readonly client: CsiClient };
  readonly storeDir: string;
  readonly name: string;
  /** CreateVolume parameters: the compression (and record size) to measure. */
  readonly parameters: Record<string, string>;
  readonly dataMiB: number;
  readonly changedMiB: number;
}

/**
 * Creates a volume with `parameters`, writes `dataMiB` of text-like data through a claim, backs
 * it up (CreateSnapshot: a full stream), rewrites `changedMiB` of it in its middle, backs it up
 * again (an incremental), and measures both streams (see the module doc).
 */
export async function measureStreamCosts(o: StreamCostOptions): Promise<StreamCosts> {
  const c = o.plugin.client;
  const created = await c.controller(
    "CreateVolume",
    createVolumeRequest(o.name, {
      capacity_range: { required_bytes: String(o.dataMiB * 2 * MiB), limit_bytes: "0" },
      parameters: o.parameters,
    }),
  );
  const volume = created.volume;
  const dataset: string = volume.volume_context.dataset;
  const claim = await claimVolume(o.plugin, volume, `alloc-${o.name}`);
  await writeTextLike(`${claim.target}/data.txt`, o.dataMiB, 1);
  await claim.release();
  const usedFull = await settledUsed(dataset);
  const full = await backup(c, volume.volume_id, `${o.name}-full`, o.storeDir);
  const again = await claimVolume(o.plugin, volume, `alloc-${o.name}-2`);
  await writeTextLike(
    `${again.target}/data.txt`,
    o.changedMiB,
    2,
    Math.floor((o.dataMiB - o.changedMiB) / 2),
  );
  await again.release();
  const usedAfter = await settledUsed(dataset);
  const increment = await backup(c, volume.volume_id, `${o.name}-inc`, o.storeDir);
  const snap = (m: SnapshotManifest) => `${dataset}@${m.snapshot}`;
  return {
    volume,
    dataset,
    fullId: full.id,
    incrementId: increment.id,
    full: {
      stored: full.manifest.size,
      used: usedFull,
      plain: await plainSendBytes(snap(full.manifest)),
      manifest: full.manifest,
    },
    increment: {
      stored: increment.manifest.size,
      used: usedAfter - usedFull,
      plain: await plainSendBytes(snap(increment.manifest), snap(full.manifest)),
      manifest: increment.manifest,
    },
  };
}

/** CreateSnapshot until stored; its id and manifest. */
async function backup(
  c: CsiClient,
  volumeId: string,
  name: string,
  storeDir: string,
): Promise<{ id: string; manifest: SnapshotManifest }> {
  let snap = (await c.controller(
    "CreateSnapshot",
    { source_volume_id: volumeId, name, parameters: {} },
    300_000,
  )).snapshot;
  for (let i = 0; snap.ready_to_use !== true; i++) {
    if (i > 3000) throw new Error(`"${name}" was never stored`);
    await new Promise((r) => setTimeout(r, 200));
    snap = (await c.controller("ListSnapshots", { snapshot_id: snap.snapshot_id })).entries?.[0]
      ?.snapshot;
    if (!snap) throw new Error(`the upload of "${name}" failed`);
  }
  return { id: snap.snapshot_id, manifest: await fileManifest(storeDir, snap.snapshot_id) };
}
