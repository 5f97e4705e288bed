/**
 * `zfs send` straight into the store: the stream is counted and hashed on its way and never
 * held whole in memory; each side waits for the other (backpressure), so memory stays bounded
 * by a few chunks whatever the volume's size. A store on the local file system (the directory
 * store) gets `zfs send` writing its temporary file itself, hashed by reading it back behind
 * the writer (from the page cache): no byte is piped through this process, which is what made
 * a piped send cost 1.6 times `zfs send > file`.
 */

import { createHash } from "node:crypto";
import type { ZfsError } from "../errors.ts";
import { stepAside } from "../foreground.ts";
import type { Logger } from "../log.ts";
import type { StreamRunner } from "../run.ts";
import { followFile } from "../store/file_stream.ts";
import { type Store, StoreError } from "../store/store.ts";
import { sendArgs } from "../zfs/args.ts";
import {
  PLAIN_FORM,
  type RecordedForm,
  sendFormFor,
  STREAM_HEADER_BYTES,
  type StreamForm,
  streamHeaderFeatures,
} from "../zfs/stream_form.ts";
import type { Zfs } from "../zfs/zfs.ts";
import { streamedZfsError } from "./zfs_stream.ts";

/** What {@linkcode sendToStore} works with. */
export interface SendDeps {
  readonly streams: StreamRunner;
  readonly zfsPath: string;
  readonly store: Store;
  readonly log: Logger;
  /**
   * What each pool's zfs can send (read once per pool): streams go `-c -L -e` where it can
   * (src/zfs/stream_form.ts). Without it every stream is plain, as before forms existed.
   */
  readonly zfs?: Pick<Zfs, "streamSupport">;
}

/** One stream to send and where it goes. */
export interface SendToStoreSpec {
  /** The snapshot to send, `<dataset>@<name>`. */
  readonly snapshot: string;
  /** The snapshot it is incremental from (full name); a full stream without. */
  readonly base?: string;
  /** `zfs send -w` (an encrypted dataset, OpenZFS). */
  readonly raw: boolean;
  /**
   * For an incremental, the form of its base's stream (PLAIN_FORM for a manifest without one):
   * the chain's `-L` is kept (see stream_form.ts sendFormFor).
   */
  readonly baseForm?: StreamForm;
  /** The stream's store key (layout.ts streamKey: unique to this upload). */
  readonly key: string;
  /** Stops zfs send and the upload; nothing becomes visible in the store. */
  readonly signal?: AbortSignal;
}

/** The stored stream's size, SHA-256 (lowercase hex) and form, as the manifest records them. */
export interface SentStream {
  readonly size: number;
  readonly sha256: string;
  /** The flags it was sent with, and the feature flags its header states. */
  readonly form?: RecordedForm;
}

/** The first bytes of a stream, kept as they pass, for its header's feature flags. */
class StreamHead {
  readonly #bytes = new Uint8Array(STREAM_HEADER_BYTES);
  #length = 0;

  add(chunk: Uint8Array): void {
    if (this.#length === this.#bytes.length) return;
    const n = Math.min(chunk.length, this.#bytes.length - this.#length);
    this.#bytes.set(chunk.subarray(0, n), this.#length);
    this.#length += n;
  }

  /** The form the stream was sent with, and its header's feature flags where it has one. */
  form(sent: StreamForm): RecordedForm {
    const features = streamHeaderFeatures(this.#bytes.subarray(0, this.#length));
    return { ...sent, ...(features ? { features } : {}) };
  }
}

/** The pool of a dataset or snapshot name. */
function poolOf(name: string): string {
  return name.split(/[/@]/, 1)[0]!;
}

/** The flags to send `spec` with on this node (plain without a way to ask zfs). */
async function formFor(deps: SendDeps, spec: SendToStoreSpec): Promise<StreamForm> {
  if (!deps.zfs) return PLAIN_FORM;
  const support = await deps.zfs.streamSupport(poolOf(spec.snapshot));
  return sendFormFor(support, {
    raw: spec.raw,
    ...(spec.base === undefined ? {} : { base: spec.baseForm ?? PLAIN_FORM }),
  });
}

/**
 * Sends a snapshot (or the changes since `base`) to the store at `spec.key`. If zfs send fails,
 * the upload fails with it and leaves no object; if the store fails, zfs send is killed.
 * @throws {ZfsError} classified from zfs's stderr when zfs send fails
 * @throws {StoreError} when the store fails
 * @throws the signal's reason when aborted
 */
export async function sendToStore(deps: SendDeps, spec: SendToStoreSpec): Promise<SentStream> {
  const { signal } = spec;
  signal?.throwIfAborted();
  const form = await formFor(deps, spec);
  const argv = [
    deps.zfsPath,
    ...sendArgs({
      snapshot: spec.snapshot,
      raw: spec.raw,
      form,
      ...(spec.base && { base: spec.base }),
    }),
  ];
  const log = deps.log.child({ snapshot: spec.snapshot, key: spec.key });
  const started = performance.now();
  log.debug("send started", { argv });
  if (deps.store.putWritten) {
    const sent = await sendToFile(deps, argv, spec, form);
    log.info("send stored", { ...sent, ms: Math.round(performance.now() - started) });
    return sent;
  }
  const child = deps.streams.spawn(argv, { stdout: "piped", ...(signal && { signal }) });
  const hash = createHash("sha256");
  const head = new StreamHead();
  let size = 0;
  let zfsFailure: ZfsError | undefined;
  const counted = counting(child.stdout!, (chunk) => {
    head.add(chunk);
    hash.update(chunk);
    size += chunk.length;
  }, async () => {
    // Only a zfs send that exited 0 sent a whole stream: otherwise the body errors, so the
    // store drops the upload instead of keeping a truncated object.
    const exit = await child.exit;
    if (exit.code !== 0) throw zfsFailure = streamedZfsError(argv, exit);
  });
  let put;
  try {
    put = await deps.store.putStream(spec.key, counted, signal ? { signal } : {});
  } catch (err) {
    child.kill();
    // A store that failed before reading the body left zfs's stdout open.
    await counted.cancel().catch(() => {});
    await child.exit;
    signal?.throwIfAborted();
    throw zfsFailure ?? err;
  }
  const exit = await child.exit;
  if (exit.code !== 0 || put.size !== size) {
    // A store that kept a body it did not read to its end: take the object back.
    await deps.store.delete(spec.key);
    throw exit.code !== 0 ? streamedZfsError(argv, exit) : new StoreError(
      "invalid",
      `${deps.store.description} stored ${put.size} bytes at "${spec.key}" of the ${size} sent`,
    );
  }
  const sha256 = hash.digest("hex");
  const sent = { size, sha256, form: head.form(form) };
  log.info("send stored", { ...sent, ms: Math.round(performance.now() - started) });
  return sent;
}

/** Bytes a reader of {@linkcode counting} gets per read when it brings no buffer of its own. */
const CHUNK_BYTES = 64 * 1024;

/**
 * `source` passed on as it is read, each chunk shown to `seen` first and held back while a
 * volume call is served (src/foreground.ts); `atEnd` runs at its end and may fail it. A byte
 * stream (a command's stdout) stays one: a reader that brings its own buffer (the S3 upload,
 * filling a part) gets the bytes read straight into it, with no chunk allocated or copied on
 * the way.
 */
function counting(
  source: ReadableStream<Uint8Array>,
  seen: (chunk: Uint8Array) => void,
  atEnd: () => Promise<void>,
): ReadableStream<Uint8Array> {
  let reader: ReadableStreamBYOBReader;
  try {
    reader = source.getReader({ mode: "byob" });
  } catch {
    return source.pipeThrough(
      new TransformStream<Uint8Array, Uint8Array>({
        async transform(chunk, controller) {
          seen(chunk);
          await stepAside(chunk.length);
          controller.enqueue(chunk);
        },
        flush: atEnd,
      }),
    );
  }
  return new ReadableStream({
    type: "bytes",
    autoAllocateChunkSize: CHUNK_BYTES,
    async pull(controller) {
      const request = controller.byobRequest!;
      const view = request.view!;
      const { done, value } = await reader.read(
        new Uint8Array(view.buffer as ArrayBuffer, view.byteOffset, view.byteLength),
      );
      if (value === undefined) throw new TypeError("zfs send's output was cancelled");
      if (done) {
        await atEnd();
        controller.close();
        // The reader's buffer came back empty: hand it back so the request is answered.
        request.respondWithNewView(value);
        return;
      }
      seen(value);
      // While a volume call is served, zfs send waits on a full pipe (src/foreground.ts).
      await stepAside(value.length);
      request.respondWithNewView(value);
    },
    cancel(reason) {
      return reader.cancel(reason);
    },
  });
}

/**
 * Reading back the file `zfs send` writes: 4 MiB reads (fewer, larger reads cost less CPU, which
 * zfs send needs too), and its pages pushed to disk every 64 MiB while the send runs, so the
 * fsync before the manifest finds little left instead of the whole stream. On 2 cores with
 * zfs-fuse this took a 1 GiB backup from 1.51 to 1.08 s against a floor of 0.90 s (a side run,
 * 6 trials, medians; docs/benchmarks.md, "The directory store against a fair floor").
 */
const FOLLOW = { chunkBytes: 4 * 1024 * 1024, writeBackEvery: 64 * 1024 * 1024 } as const;

/** {@linkcode sendToStore} where the store gives `zfs send` its file to write. */
async function sendToFile(
  deps: SendDeps,
  argv: readonly string[],
  spec: SendToStoreSpec,
  form: StreamForm,
): Promise<SentStream> {
  const { signal } = spec;
  const put = await deps.store.putWritten!(spec.key, async (file) => {
    const child = deps.streams.spawn(argv, { stdout: { fd: file.fd }, ...(signal && { signal }) });
    let digest;
    try {
      digest = await followFile(file.path, child.exit, FOLLOW);
    } catch (err) {
      child.kill();
      await child.exit;
      throw err;
    }
    const exit = await child.exit;
    signal?.throwIfAborted();
    // Only a zfs send that exited 0 wrote a whole stream; the store then drops the file. A
    // write that failed (a full store) is the store's failure, as with a piped send.
    if (exit.code !== 0) throw file.writerError(exit.stderr) ?? streamedZfsError(argv, exit);
    return { ...digest, form: await readForm(file.path, form) };
  }, signal ? { signal } : {});
  if (put.size !== put.value.size) {
    // Something else wrote the file: the manifest could not describe what is stored.
    await deps.store.delete(spec.key);
    throw new StoreError(
      "invalid",
      `${deps.store.description} stored ${put.size} bytes at "${spec.key}" of the ` +
        `${put.value.size} sent`,
    );
  }
  return put.value;
}

/** The form a written stream file was sent with, with its header's feature flags. */
async function readForm(path: string, sent: StreamForm): Promise<RecordedForm> {
  const head = new StreamHead();
  const bytes = new Uint8Array(STREAM_HEADER_BYTES);
  const file = await Deno.open(path, { read: true });
  try {
    for (let at = 0; at < bytes.length;) {
      const n = await file.read(bytes.subarray(at));
      if (n === null) break;
      head.add(bytes.subarray(at, at + n));
      at += n;
    }
  } finally {
    file.close();
  }
  return head.form(sent);
}
