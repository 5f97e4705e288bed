/** Streaming an open file out, and writing chunks into one, for the directory store. */

import { createHash } from "node:crypto";
import { updateInSlices } from "./hash_slices.ts";

/** Options of {@linkcode fileReadable}. */
export interface FileReadableOptions {
  /** Bytes per chunk read. */
  readonly chunkBytes: number;
  /** Aborting errors the stream with the signal's reason and closes the file. */
  readonly signal?: AbortSignal | undefined;
  /** Turns a failed read into the error the stream ends with. */
  readonly mapError: (err: unknown) => Error;
}

/**
 * The content of `file` as a byte stream that reads when the reader wants bytes (nothing is read
 * ahead), so memory stays bounded whatever the size. A reader that brings its own buffer (a
 * BYOB reader) gets the file read straight into it; any other reader gets chunks of
 * `chunkBytes`. The stream owns the file: it closes it at the end, on an error, on cancel and
 * on abort.
 */
export function fileReadable(
  file: Deno.FsFile,
  options: FileReadableOptions,
): ReadableStream<Uint8Array> {
  const { chunkBytes, signal, mapError } = options;
  let finished = false;
  let onAbort = () => {};
  const finish = () => {
    if (finished) return false;
    finished = true;
    signal?.removeEventListener("abort", onAbort);
    file.close();
    return true;
  };
  return new ReadableStream({
    type: "bytes",
    autoAllocateChunkSize: chunkBytes,
    start(controller) {
      onAbort = () => {
        if (finish()) controller.error(signal?.reason);
      };
      if (signal?.aborted) onAbort();
      else signal?.addEventListener("abort", onAbort, { once: true });
    },
    async pull(controller) {
      if (finished) return;
      const request = controller.byobRequest!;
      const view = request.view!;
      let n: number | null;
      try {
        n = await file.read(new Uint8Array(view.buffer, view.byteOffset, view.byteLength));
      } catch (err) {
        if (finish()) controller.error(mapError(err));
        return;
      }
      if (finished) return; // aborted while reading
      if (n === null) {
        finish();
        controller.close();
        request.respond(0);
      } else {
        request.respond(n);
      }
    },
    cancel() {
      finish();
    },
  });
}

/** Writes all of `chunk` (a write may take only part of it). */
export async function writeAll(file: Deno.FsFile, chunk: Uint8Array): Promise<void> {
  for (let at = 0; at < chunk.length;) at += await file.write(chunk.subarray(at));
}

/** Flushes a directory's entries to disk; best effort, as some file systems refuse it. */
export async function syncDir(path: string): Promise<void> {
  let dir: Deno.FsFile | undefined;
  try {
    dir = await Deno.open(path, { read: true });
    await dir.sync();
  } catch {
    // The rename is done and visible; only its durability on power loss is in question.
  } finally {
    dir?.close();
  }
}

/** Size and SHA-256 (lowercase hex) of bytes read. */
export interface FileDigest {
  readonly size: number;
  readonly sha256: string;
}

/** How long {@linkcode followFile} waits at the end of a file that is still being written. */
const FOLLOW_POLL_MS = 5;

/** Options of {@linkcode followFile}. */
export interface FollowOptions {
  /** Bytes per read; two buffers of this size are held. */
  readonly chunkBytes: number;
  /**
   * Start writing the file's pages to disk (fdatasync, one at a time, not waited for) each time
   * this many more bytes were hashed, so that the writer's final fsync finds little left to do
   * instead of the whole file. Off when absent.
   */
  readonly writeBackEvery?: number;
}

/** One read of {@linkcode followFile}, and whether the writer had ended before it began. */
interface FollowRead {
  readonly n: number;
  readonly afterEnd: boolean;
}

/**
 * Hashes the file at `path` while another process appends to it (a command writing it as its
 * stdout), reading behind the writer, until `writerEnded` has settled and the end of the file is
 * reached. The next read runs while the last one is hashed (two buffers taken in turn), so the
 * copy from the page cache costs the hash no time of its own. Nothing is written and nothing is
 * held but the two buffers. The writer must only append (as `zfs send > file` does).
 * @throws the error of a failed read or write-back
 */
export async function followFile(
  path: string,
  writerEnded: Promise<unknown>,
  options: FollowOptions,
): Promise<FileDigest> {
  const { chunkBytes, writeBackEvery } = options;
  let ended = false;
  const settled = () => ended = true;
  writerEnded.then(settled, settled);
  const file = await Deno.open(path, { read: true });
  // The buffer the pending read fills, and the other one.
  let filling = new Uint8Array(chunkBytes);
  let spare = new Uint8Array(chunkBytes);
  // A read begun after the writer ended that finds the end of the file found the end of its
  // output.
  const readInto = (buffer: Uint8Array): Promise<FollowRead> => {
    const afterEnd = ended;
    return file.read(buffer).then((n) => ({ n: n ?? 0, afterEnd }));
  };
  let pending = readInto(filling);
  let writingBack: Promise<void> | undefined;
  let writeBackFailed: unknown;
  try {
    const hash = createHash("sha256");
    let size = 0;
    let writtenBackTo = 0;
    for (;;) {
      const { n, afterEnd } = await pending;
      if (n === 0) {
        if (afterEnd) break;
        await new Promise((r) => setTimeout(r, FOLLOW_POLL_MS));
        pending = readInto(filling);
        continue;
      }
      const bytes = filling.subarray(0, n);
      [filling, spare] = [spare, filling];
      pending = readInto(filling);
      await updateInSlices(hash, bytes);
      size += n;
      if (writeBackEvery !== undefined && !writingBack && size - writtenBackTo >= writeBackEvery) {
        writtenBackTo = size;
        writingBack = file.syncData().then(
          () => writingBack = undefined,
          (err) => {
            writeBackFailed ??= err;
            writingBack = undefined;
          },
        );
      }
      if (writeBackFailed !== undefined) throw writeBackFailed;
    }
    await writingBack;
    if (writeBackFailed !== undefined) throw writeBackFailed;
    return { size, sha256: hash.digest("hex") };
  } finally {
    // Neither a read nor a write-back may still use the file when it closes.
    await Promise.allSettled([pending, writingBack]);
    file.close();
  }
}
