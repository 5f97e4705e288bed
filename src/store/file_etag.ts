/**
 * Version tags of the directory store's objects, which have no stored etag. One rule for every
 * reader, so putBytes, getBytes and list agree: an object of at most
 * {@linkcode SMALL_OBJECT_BYTES} (every manifest and volume record) is tagged by its content
 * (32 hex digits of its SHA-256), a larger one (a stream) by its size, mtime and inode.
 *
 * Why: conditional writes compare etags of small objects, and a content tag cannot be fooled by
 * an inode number reused within one mtime tick (timestamps are coarse, and NFS servers vary);
 * two versions with the same bytes share a tag, as S3's MD5 etags do. Large objects are never
 * replaced under a condition (streams get unique keys), so a tag that list() can compute from a
 * stat, without reading gigabytes, is enough: a replacement is a new inode (the old file still
 * exists when the new one is renamed over it). Inode numbers are stable on local file systems
 * and NFS (the fileid); some FUSE file systems renumber after a remount, which only changes
 * streams' tags.
 */

import { createHash, type Hash } from "node:crypto";
import type { ObjectBytes } from "./store.ts";

/** Objects up to this many bytes are tagged by their content. */
export const SMALL_OBJECT_BYTES = 64 * 1024;

/** The etag of a small object's bytes. */
export function contentEtag(bytes: Uint8Array): string {
  return createHash("sha256").update(bytes).digest("hex").slice(0, 32);
}

/** The etag of a large object, from a stat of its file. */
export function statEtag(info: Deno.FileInfo): string {
  const stamp = `${info.size}:${info.mtime?.getTime()}:${info.ino}`;
  return createHash("sha256").update(stamp).digest("hex").slice(0, 32);
}

/** Works out the etag of content as it is written, hashing only while it is small. */
export class EtagBuilder {
  #hash: Hash | undefined = createHash("sha256");
  #size = 0;

  /** Bytes seen so far. */
  get size(): number {
    return this.#size;
  }

  /** Adds the next chunk of content. */
  update(chunk: Uint8Array): void {
    this.#size += chunk.length;
    if (this.#size > SMALL_OBJECT_BYTES) this.#hash = undefined;
    else this.#hash?.update(chunk);
  }

  /** The etag, given a stat of the finished file (used when the content is large). */
  etag(info: Deno.FileInfo): string {
    return this.#hash === undefined ? statEtag(info) : this.#hash.digest("hex").slice(0, 32);
  }
}

/**
 * Size and etag of an open object file, reading it only when it is small. Through one handle,
 * so a concurrent replacement (a rename over the path) cannot mix two versions.
 */
export async function fileEtag(file: Deno.FsFile): Promise<{ size: number; etag: string }> {
  const info = await file.stat();
  if (info.size > SMALL_OBJECT_BYTES) return { size: info.size, etag: statEtag(info) };
  const read = await readObjectFile(file, info);
  // Without a cap the read is whole (the union's other side never comes).
  if (read === "too_large") return { size: info.size, etag: statEtag(info) };
  return { size: read.bytes.length, etag: read.etag };
}

/**
 * The whole content of an open object file and its etag, or "too_large" once it is over
 * `maxBytes` (by its size, or by what was read of a file that grew meanwhile).
 */
export async function readFileBytes(
  file: Deno.FsFile,
  maxBytes: number = Infinity,
): Promise<ObjectBytes | "too_large"> {
  return await readObjectFile(file, await file.stat(), maxBytes);
}

async function readObjectFile(
  file: Deno.FsFile,
  info: Deno.FileInfo,
  maxBytes: number = Infinity,
): Promise<ObjectBytes | "too_large"> {
  if (info.size > maxBytes) return "too_large";
  const bytes = await readToEnd(file, info.size, maxBytes);
  if (bytes === undefined) return "too_large";
  const etag = bytes.length > SMALL_OBJECT_BYTES ? statEtag(info) : contentEtag(bytes);
  return { bytes, etag };
}

/**
 * Reads the rest of `file`, expecting `expected` bytes (a stat's size) but trusting only EOF;
 * undefined once more than `maxBytes` were read.
 */
async function readToEnd(
  file: Deno.FsFile,
  expected: number,
  maxBytes: number,
): Promise<Uint8Array | undefined> {
  let buffer = new Uint8Array(expected);
  let length = 0;
  const probe = new Uint8Array(8192);
  for (;;) {
    const full = length === buffer.length;
    const n = await file.read(full ? probe : buffer.subarray(length));
    if (n === null) return length === buffer.length ? buffer : buffer.slice(0, length);
    if (length + n > maxBytes) return undefined;
    if (full) {
      // The file grew since the stat: make room and keep what the probe read.
      const bigger = new Uint8Array(Math.max(buffer.length * 2, length + n));
      bigger.set(buffer);
      bigger.set(probe.subarray(0, n), length);
      buffer = bigger;
    }
    length += n;
  }
}
