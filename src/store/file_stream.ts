/** Streaming an open file out, and writing chunks into one, for the directory store. */

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
 * The content of `file` as a stream that reads a chunk when the reader wants one (one chunk
 * ahead), so memory stays bounded whatever the size. The stream owns the file: it closes it at
 * the end, on an error, on cancel and on abort.
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
  return new ReadableStream<Uint8Array>({
    start(controller) {
      onAbort = () => {
        if (finish()) controller.error(signal?.reason);
      };
      if (signal?.aborted) onAbort();
      else signal?.addEventListener("abort", onAbort, { once: true });
    },
    async pull(controller) {
      if (finished) return;
      const buffer = new Uint8Array(chunkBytes);
      let n: number | null;
      try {
        n = await file.read(buffer);
      } catch (err) {
        if (finish()) controller.error(mapError(err));
        return;
      }
      if (finished) return; // aborted while reading
      if (n === null) {
        finish();
        controller.close();
      } else {
        controller.enqueue(n === buffer.length ? buffer : buffer.slice(0, n));
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
