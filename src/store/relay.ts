/**
 * One stream passed on through another that watches its reads (a time limit, a stall clock).
 * A byte stream stays one: a reader with buffers of its own (a restore, an upload's parts) has
 * the bytes land in them, through every layer, with no buffer allocated per read. A layer that
 * gave each read a buffer of its own made a 1 GiB restore allocate gigabytes, and under the
 * plugin's small heap flags V8 then marked the whole heap every few dozen MiB.
 */

/** What a relay does around each read of its source. */
export interface RelayHooks {
  /** Runs one read of the source (`read`); what it throws ends the relayed stream. */
  readonly read: <T>(read: () => Promise<T>) => Promise<T>;
  /** Told once when the source ends or the relayed stream is cancelled. */
  readonly end?: () => void;
}

/** Bytes per read that a relay gives a default reader of a byte source, by default. */
const RELAY_READ_BYTES = 1024 * 1024;

/**
 * `source` as a stream whose every read goes through the hooks that `watch` makes; `watch` is
 * given the source's cancel (for a stall, or a failure that leaves the source open). A default
 * reader of a byte source gets a buffer of `readBytes` per read; a short read is copied out, so
 * a chunk held on to never holds a whole buffer.
 */
export function relayStream(
  source: ReadableStream<Uint8Array>,
  watch: (cancelSource: (reason?: unknown) => void) => RelayHooks,
  readBytes = RELAY_READ_BYTES,
): ReadableStream<Uint8Array> {
  let byob: ReadableStreamBYOBReader | undefined;
  try {
    byob = source.getReader({ mode: "byob" });
  } catch {
    // Not a byte stream: chunks are passed on as they are.
  }
  const reader = byob ?? source.getReader();
  const hooks = watch((reason) => void reader.cancel(reason).catch(() => {}));
  let ended = false;
  const end = () => {
    if (ended) return;
    ended = true;
    hooks.end?.();
  };
  const read = async <T>(fn: () => Promise<T>): Promise<T> => {
    try {
      return await hooks.read(fn);
    } catch (err) {
      end();
      throw err;
    }
  };
  const cancel = (reason: unknown) => {
    end();
    return reader.cancel(reason);
  };
  if (byob === undefined) {
    const chunks = reader as ReadableStreamDefaultReader<Uint8Array>;
    return new ReadableStream<Uint8Array>({
      async pull(controller) {
        const r = await read(() => chunks.read());
        if (r.done) {
          end();
          controller.close();
        } else controller.enqueue(r.value);
      },
      cancel,
    }, { highWaterMark: 0 });
  }
  const bytes = byob;
  return new ReadableStream({
    type: "bytes",
    async pull(controller: ReadableByteStreamController) {
      const request = controller.byobRequest;
      const given = request?.view;
      // A BYOB reader's buffer is filled in place; a default reader's read gets one of its own.
      const view = request && given
        ? new Uint8Array(given.buffer, given.byteOffset, given.byteLength)
        : new Uint8Array(readBytes);
      const r = await read(() => bytes.read(view));
      if (r.done) {
        end();
        controller.close();
      }
      if (request && given) {
        // The source took the buffer over: the reader gets the view over it back (none when
        // the source was cancelled, and then the stream is closed already).
        if (r.value !== undefined) request.respondWithNewView(r.value);
      } else if (!r.done && r.value !== undefined) {
        const short = r.value.length < r.value.buffer.byteLength / 2;
        controller.enqueue(short ? r.value.slice() : r.value);
      }
    },
    cancel,
  });
}
