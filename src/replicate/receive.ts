/**
 * Store to `zfs receive`: a stored stream reaches zfs only once it is known to be the one its
 * manifest describes. The stream is hashed as it downloads and passed on with its last chunk
 * held back; only when the whole download's size and SHA-256 match the manifest is that chunk
 * written and stdin closed. Otherwise zfs receive is stopped short of that chunk (its stdin cut,
 * then a kill if it does not exit), and a receive without `-s` that fails leaves nothing: zfs
 * never completes a stream that was not checked. Where the stream is a local file (the
 * directory store) and the caller asks for it, the whole file is checked first and zfs then
 * reads the file itself: no pipe, and the same guarantee.
 */

import { createHash } from "node:crypto";
import { ZfsError } from "../errors.ts";
import { stepAside } from "../foreground.ts";
import type { Logger } from "../log.ts";
import type { StreamedExit, StreamRunner } from "../run.ts";
import { updateInSlices } from "../store/hash_slices.ts";
import type { SnapshotManifest } from "../store/layout.ts";
import type { Store, StoredFile } from "../store/store.ts";
import { type Properties, receiveArgs, type ReceiveOptions } from "../zfs/args.ts";
import type { Zfs } from "../zfs/zfs.ts";
import { ReplicateError } from "../replicate_errors.ts";
import { checkStreamProperties, receiveExclusions } from "./stream_properties.ts";
import { checkReceivable } from "./receivable.ts";
import { streamedZfsError } from "./zfs_stream.ts";

/** What {@linkcode receiveFromStore} works with. */
export interface ReceiveDeps {
  readonly streams: StreamRunner;
  readonly zfsPath: string;
  /** Reads the received snapshot's guid. */
  readonly zfs: Zfs;
  readonly store: Store;
  readonly log: Logger;
  /**
   * How long a stopped zfs receive may take to fail on its own and clean up before it is killed,
   * and one reading a file that failed its check to end (default {@linkcode STOP_WAIT_MS}).
   */
  readonly stopWaitMs?: number;
}

/**
 * Default of {@linkcode ReceiveDeps.stopWaitMs}: removing a large partly received dataset
 * takes a while, and zfs removes it only if it is not killed first.
 */
export const STOP_WAIT_MS = 60_000;

/** One stored stream and the dataset it is received into. */
export interface ReceiveSpec {
  readonly manifest: SnapshotManifest;
  /** The dataset to receive into: absent for a full stream; for an incremental, holding the base. */
  readonly target: string;
  /** Stops the download and zfs receive. */
  readonly signal?: AbortSignal;
  /**
   * Where the store holds the stream as a local file (the directory store): give zfs receive
   * the file itself as stdin and check it meanwhile (see receiveFile). Only for a caller that
   * receives into a dataset it hands out after this returned and destroys when this throws, and
   * copes with a receive that goes on after this process died (restore.ts): such a receive runs
   * to its end on its own, unchecked.
   */
  readonly readFile?: boolean;
  /**
   * User properties the dataset a full stream creates must carry from its creation: set by zfs
   * as it creates the dataset where receive takes `-o` (OpenZFS), else right after zfs receive
   * exits, before anything reads the result (restore.ts marks its temporary dataset so).
   */
  readonly createdWith?: Properties;
  /**
   * Properties the stream may have decided because the caller sets its own value locally (which
   * then wins) before anything uses the dataset (restore.ts: the volume's properties). Every
   * other property the stream decided is refused (stream_properties.ts).
   */
  readonly settles?: ReadonlySet<string>;
  /**
   * Whether an incremental refused after zfs received it (guid, properties) is undone: the
   * local properties a stream with properties cleared are set back (stream_properties.ts), the
   * snapshot it made is destroyed and the dataset rolled back to the base, so that the copy is
   * as it was before (default true). restore.ts destroys its temporary dataset instead.
   */
  readonly undoesRefusal?: boolean;
}

/** A failed write to zfs receive's stdin: zfs stopped reading, and its stderr says why. */
class StdinClosed extends Error {}

/**
 * Receives one stored stream into `spec.target` (unmounted), checked against its manifest, and
 * makes sure the snapshot zfs made has the manifest's guid and that the stream decided no
 * property (stream_properties.ts: excluded with `-x` where zfs can, checked after on any zfs).
 * Destroys or rolls back nothing but a refused incremental's own snapshot, checked against
 * what is there (see {@linkcode ReceiveSpec.undoesRefusal}); what a refused stream set is
 * overridden where zfs allows.
 * @throws {ReplicateError} checksum when the download is not the manifest's bytes (nothing was
 *   received); guid when the received snapshot is another one; properties when the stream
 *   decided properties
 * @throws {ZfsError} classified, when zfs receive fails
 * @throws {StoreError} when the download fails
 * @throws the signal's reason when aborted
 */
export async function receiveFromStore(deps: ReceiveDeps, spec: ReceiveSpec): Promise<void> {
  const { manifest, target, signal } = spec;
  signal?.throwIfAborted();
  // A form this pool cannot receive is refused before anything is downloaded (receivable.ts).
  await checkReceivable(deps.zfs, target, [manifest]);
  const log = deps.log.child({ target, snapshot: manifest.snapshot, key: manifest.stream });
  const started = performance.now();
  const exclude = await receiveExclusions(
    deps.zfs,
    target,
    manifest.raw,
    manifest.zvol !== undefined,
  );
  const created = spec.createdWith !== undefined && Object.keys(spec.createdWith).length > 0
    ? spec.createdWith
    : undefined;
  // Only a full stream creates the dataset; OpenZFS would set an incremental's on the copy.
  const override = exclude && manifest.baseGuid === null ? created : undefined;
  const options: ReceiveOptions = {
    unmounted: true,
    // zfs refuses a property both excluded and set: what is set is not the stream's anyway.
    ...(exclude ? { exclude: exclude.filter((p) => override?.[p] === undefined) } : {}),
    ...(override ? { override } : {}),
  };
  // Without -o: set as soon as zfs made the dataset (see createdWith).
  const mark = !exclude && created && manifest.baseGuid === null
    ? () => deps.zfs.setProperties(target, Object.entries(created), { inAnyOrder: true })
    : undefined;
  const argv = [deps.zfsPath, ...receiveArgs(target, options)];
  const undoes = manifest.baseGuid !== null && spec.undoesRefusal !== false;
  // An incremental lands in a dataset that has local properties a stream with properties
  // clears (stream_properties.ts): read them first, to set them back if it is refused.
  const localBefore = undoes ? await deps.zfs.localProperties(target) : undefined;
  if (spec.readFile && deps.store.openFile) {
    await receiveFile(deps, spec, argv, mark, log);
  } else {
    await receivePiped(deps, spec, argv, mark, log);
  }
  const undo = undoes ? () => undoIncrement(deps, spec, log) : undefined;
  try {
    await checkReceivedGuid(deps, spec);
  } catch (err) {
    if (!(err instanceof ReplicateError) || !undo) throw err;
    throw new ReplicateError(err.kind, `${err.message}. ${await undo()}`, { cause: err });
  }
  await checkStreamProperties(deps.zfs, log, {
    manifest,
    store: deps.store.description,
    dataset: target,
    settles: spec.settles ?? new Set(),
    ...(localBefore ? { localBefore } : {}),
    ...(undo ? { undo } : {}),
  });
  log.info("receive done", { size: manifest.size, ms: Math.round(performance.now() - started) });
}

/** Attempts of a destroy zfs-fuse calls busy right after the receive. */
const BUSY_ATTEMPTS = 5;

/**
 * Undoes a refused incremental into an existing dataset, checked against what is there: the
 * newest snapshot must be the one the receive made (the manifest's name, after the base) and
 * the one before it the base (the manifest's base guid); then that snapshot is destroyed and
 * the dataset rolled back to the base (zfs received the increment only onto an unchanged base,
 * so nothing else is lost). Never throws for zfs's failures: says what it did, for the error.
 */
async function undoIncrement(deps: ReceiveDeps, spec: ReceiveSpec, log: Logger): Promise<string> {
  const { manifest, target } = spec;
  try {
    const tree = await deps.zfs.getTree(target, 1, ["type", "guid", "createtxg"]);
    const snapshots = [...tree ?? []]
      .filter(([name, p]) => name.startsWith(`${target}@`) && p.get("type")?.value === "snapshot")
      .map(([name, p]) => ({
        name,
        guid: p.get("guid")?.value,
        txg: Number(p.get("createtxg")?.value),
      }))
      .sort((a, b) => a.txg - b.txg);
    const [base, made] = snapshots.slice(-2);
    if (made?.name !== `${target}@${manifest.snapshot}` || base?.guid !== manifest.baseGuid) {
      log.warn("a refused increment was left as it is: its snapshots are not as received", {
        newest: made?.name,
        base: base?.name,
      });
      return `What it received stays on "${target}", which this node does not use`;
    }
    for (let attempt = 1;; attempt++) {
      try {
        await deps.zfs.destroy(made.name);
        break;
      } catch (err) {
        if (!(err instanceof ZfsError && err.kind === "busy") || attempt >= BUSY_ATTEMPTS) {
          throw err;
        }
        await new Promise((r) => setTimeout(r, 200 * attempt));
      }
    }
    await deps.zfs.rollback(base.name);
    log.info("a refused increment was undone", { destroyed: made.name, rolledBackTo: base.name });
    return `"${target}" was put back as it was before the receive (at "${base.name}")`;
  } catch (err) {
    if (!(err instanceof ZfsError)) throw err;
    log.warn("a refused increment could not be undone", { error: err });
    return `What it received stays on "${target}" (undoing it failed: ${err.message}), which ` +
      `this node does not use`;
  }
}

/** Bytes per read of a download into our buffers. */
const READ_BYTES = 1024 * 1024;
/**
 * Bytes per positional read when hashing a local file: larger reads cost less CPU per byte (a
 * 1 GiB file hashed in 4 MiB reads took about 10% less time than in 1 MiB reads), and that CPU
 * is taken from zfs receive running at the same time.
 */
const HASH_READ_BYTES = 4 * 1024 * 1024;

/**
 * {@linkcode receiveFromStore} from a local file: zfs receive gets the open file as its stdin
 * and reads it itself, with no pipe (zfs-fuse reads a pipe slowly), while this process hashes
 * the same file by position (pread: zfs's offset is untouched) from the page cache. The two run
 * at once, so the check costs no time of its own; zfs may therefore complete the snapshot before
 * the check ends. That is safe only because the caller (restore.ts) receives into a hidden
 * temporary dataset, hands it out only after this returned, destroys it when this throws, and
 * checks the file again before keeping a snapshot some earlier receive completed
 * ({@linkcode checkStoredFile}). After a failed check zfs receive is left to end by itself (it
 * reads a file, which ends), so that what it made is there to clean up when it exits; killed only
 * after {@linkcode ReceiveDeps.stopWaitMs}. The store never changes a file in place (a
 * temporary file renamed over the key), so the bytes hashed are the bytes zfs reads.
 */
async function receiveFile(
  deps: ReceiveDeps,
  spec: ReceiveSpec,
  argv: readonly string[],
  mark: (() => Promise<void>) | undefined,
  log: Logger,
): Promise<void> {
  const { manifest, signal } = spec;
  const file = await deps.store.openFile!(manifest.stream);
  try {
    signal?.throwIfAborted();
    log.debug("receive started", { argv, from: "file" });
    const child = deps.streams.spawn(argv, {
      stdin: { fd: file.fd },
      ...(signal ? { signal } : {}),
    });
    let zfsDone = false;
    let checkFailed: unknown;
    let exited = false;
    let killTimer: ReturnType<typeof setTimeout> | undefined;
    const checking = hashFile(file, manifest, () => zfsDone).catch((err) => {
      checkFailed = err;
      // zfs reads the file to its end and exits by itself; until then what it makes is not
      // known. Killed, zfs-fuse's zfs process ends but its daemon, which reads the file
      // itself, goes on and makes (or removes) the dataset after the caller looked. Killed only
      // when it does not exit within stopWaitMs (restore.ts then waits for the dataset).
      if (!exited) killTimer = setTimeout(() => child.kill(), deps.stopWaitMs ?? STOP_WAIT_MS);
    });
    const exit = await child.exit;
    exited = true;
    clearTimeout(killTimer);
    const refused = exit.code === 0 ? undefined : streamedZfsError(argv, exit);
    // A receive that failed needs no check (stop reading), unless zfs found the stream itself
    // invalid (zfs-fuse checks a stream's checksum at its end, maybe before this check ended):
    // then whether the file is the manifest's decides the answer (a damaged store, DATA_LOSS).
    zfsDone = refused !== undefined && refused.kind !== "invalid";
    // Marked while the check may still run: a dataset it fails is then known as the caller's.
    let markFailed: { readonly err: unknown } | undefined;
    if (exit.code === 0) await mark?.().catch((err: unknown) => (markFailed = { err }));
    await checking;
    signal?.throwIfAborted();
    if (checkFailed !== undefined) throw checkFailed;
    if (refused) throw refused;
    if (markFailed) throw markFailed.err;
  } finally {
    await file.close();
  }
}

/**
 * Hashes a stored file by position and checks it against its manifest; `stop` ends the reading
 * early without a verdict.
 * @throws {ReplicateError} checksum when the file is not the manifest's bytes
 */
async function hashFile(
  file: StoredFile,
  manifest: SnapshotManifest,
  stop: () => boolean = () => false,
): Promise<void> {
  const digest = new Digest(manifest);
  const buffer = new Uint8Array(HASH_READ_BYTES);
  for (let position = 0;;) {
    if (stop()) return;
    const n = await file.read(buffer, position);
    if (n === 0) break;
    await digest.update(buffer.subarray(0, n));
    position += n;
  }
  digest.check();
}

/**
 * Checks a stream the store holds as a local file against its manifest (size and SHA-256), for
 * a snapshot that a receive from that file completed before its check ended (a plugin killed
 * meanwhile): restore.ts keeps such a snapshot only after this passed.
 * @throws {ReplicateError} checksum when the file is not the manifest's bytes
 */
export async function checkStoredFile(
  deps: ReceiveDeps,
  manifest: SnapshotManifest,
  signal?: AbortSignal,
): Promise<void> {
  const file = await deps.store.openFile!(manifest.stream);
  try {
    await hashFile(file, manifest, () => signal?.aborted === true);
    signal?.throwIfAborted();
  } finally {
    await file.close();
  }
}

/**
 * {@linkcode receiveFromStore} through a pipe: the download is hashed as it is written to zfs
 * receive's stdin, its last chunk held back until the whole download checked (module doc).
 */
async function receivePiped(
  deps: ReceiveDeps,
  spec: ReceiveSpec,
  argv: readonly string[],
  mark: (() => Promise<void>) | undefined,
  log: Logger,
): Promise<void> {
  const { manifest, signal } = spec;
  const download = await deps.store.getStream(manifest.stream, signal ? { signal } : {});
  log.debug("receive started", { argv });
  // No signal for spawn: an abort stops zfs receive the careful way below, not by a kill.
  let child;
  try {
    child = deps.streams.spawn(argv, { stdin: "piped" });
  } catch (err) {
    await download.cancel().catch(() => {});
    throw err;
  }
  const reader = new Chunks(download);
  const writer = child.stdin!.getWriter();
  const digest = new Digest(manifest);
  let stopping: Promise<StreamedExit> | undefined;
  // zfs sees its input end short of the last chunk (which holds the END record's last bytes), so
  // it fails, removes what it made, and exits. A kill comes only if it does not exit in time:
  // zfs-fuse's daemon, which does the receive, goes on after its client is killed until the pipe
  // closes, and removes the partial dataset later, after this call returned.
  const stop = () =>
    stopping ??= (async () => {
      const closed = writer.abort(new Error("stopped")).catch(() => {});
      const timer = setTimeout(() => child.kill(), deps.stopWaitMs ?? STOP_WAIT_MS);
      try {
        return await child.exit;
      } finally {
        clearTimeout(timer);
        await closed;
      }
    })();
  signal?.addEventListener("abort", stop, { once: true });
  try {
    await pump(reader, writer, digest);
  } catch (err) {
    const exit = await stop();
    signal?.throwIfAborted();
    if (!(err instanceof StdinClosed)) throw err;
    const zfsError = streamedZfsError(argv, exit);
    throw await damagedInstead(zfsError, reader, digest, log) ?? zfsError;
  } finally {
    signal?.removeEventListener("abort", stop);
    await reader.cancel().catch(() => {});
  }
  const exit = await child.exit;
  if (exit.code !== 0) throw streamedZfsError(argv, exit);
  await mark?.();
}

/** Makes sure the snapshot zfs made has the manifest's guid. */
async function checkReceivedGuid(deps: ReceiveDeps, spec: ReceiveSpec): Promise<void> {
  const { manifest, target } = spec;
  const snapshot = `${target}@${manifest.snapshot}`;
  const guid = (await deps.zfs.getProperties(snapshot, ["guid"]))?.get("guid")?.value;
  if (guid !== manifest.guid) {
    throw new ReplicateError(
      "guid",
      `Received "${snapshot}" from "${manifest.stream}" in ${deps.store.description}, but its ` +
        `guid is ${guid ?? "missing"}, not the manifest's ${manifest.guid}`,
    );
  }
}

/**
 * Chunks a restore holds at once: the one being read, the one held back, and the one before it,
 * still being written to zfs receive (see pump).
 */
const CHUNKS_HELD = 3;

/**
 * A download, chunk by chunk. A byte stream (a file store's file) is read into buffers of ours
 * taken in turn, so a restore of any size allocates {@linkcode CHUNKS_HELD} buffers, not one per
 * chunk.
 */
class Chunks {
  readonly #byob: ReadableStreamBYOBReader | undefined;
  readonly #chunks: ReadableStreamDefaultReader<Uint8Array> | undefined;
  readonly #buffers: Uint8Array<ArrayBuffer>[] = [];
  #turn = 0;

  constructor(download: ReadableStream<Uint8Array>) {
    try {
      this.#byob = download.getReader({ mode: "byob" });
    } catch {
      this.#chunks = download.getReader();
    }
  }

  /**
   * The next chunk, or undefined at the end. From a byte stream it lives in a buffer that the
   * read {@linkcode CHUNKS_HELD} reads later fills again: a chunk must be written before that.
   */
  async read(): Promise<Uint8Array | undefined> {
    if (this.#byob === undefined) {
      const r = await this.#chunks!.read();
      return r.done ? undefined : r.value;
    }
    const k = this.#turn++ % CHUNKS_HELD;
    const r = await this.#byob.read(this.#buffers[k] ?? new Uint8Array(READ_BYTES));
    // The read hands the buffer's memory over and back: keep what came back.
    if (r.value !== undefined) this.#buffers[k] = new Uint8Array(r.value.buffer);
    return r.done ? undefined : r.value;
  }

  cancel(): Promise<void> {
    return (this.#byob ?? this.#chunks)!.cancel();
  }
}

/**
 * Copies the download to stdin, holding back the last chunk until the whole download checks.
 * One write is left going while the next chunk downloads and is hashed: a pipe holds only 64
 * KiB, so a write awaited before the next read left zfs receive idle for every read and hash.
 */
async function pump(
  reader: Chunks,
  writer: WritableStreamDefaultWriter<Uint8Array>,
  digest: Digest,
): Promise<void> {
  const toZfs = (p: Promise<void>) =>
    p.catch((err: unknown) => {
      throw new StdinClosed("zfs receive stopped reading", { cause: err });
    });
  let held: Uint8Array | undefined;
  let writing: Promise<void> | undefined;
  for (;;) {
    const value = await reader.read();
    if (value === undefined) break;
    // An empty chunk must not push out the held one: the held chunk holds the last byte.
    if (value.length === 0) continue;
    await digest.update(value);
    // While a volume call is served the download waits, and the store's server with it.
    await stepAside(value.length);
    if (held !== undefined) {
      await writing;
      writing = inFlight(toZfs(writer.write(held)));
    }
    held = value;
  }
  await writing;
  digest.check();
  if (held !== undefined) await toZfs(writer.write(held));
  await toZfs(writer.close());
}

/**
 * A promise awaited later: its failure is marked handled now, so that one arriving while a read
 * is awaited is not an unhandled rejection; the later await still throws it.
 */
function inFlight(p: Promise<void>): Promise<void> {
  p.catch(() => {});
  return p;
}

/**
 * When zfs refused the stream as malformed (OpenZFS checks each record as it reads), whether
 * the stored bytes are damaged: reads the rest of the download (hashing only) to tell. A zfs
 * failure of another kind (no space, a target that exists) is zfs's to report.
 */
async function damagedInstead(
  zfsError: ZfsError,
  reader: Chunks,
  digest: Digest,
  log: Logger,
): Promise<ReplicateError | undefined> {
  if (zfsError.kind !== "invalid" && zfsError.kind !== "unknown") return undefined;
  try {
    for (let value; (value = await reader.read()) !== undefined;) await digest.update(value);
    digest.check();
    return undefined;
  } catch (err) {
    if (err instanceof ReplicateError) {
      return new ReplicateError(err.kind, err.message, { cause: zfsError });
    }
    log.warn("could not read the rest of a stream zfs refused", { error: err });
    return undefined;
  }
}

/** Size and SHA-256 of a download so far, and the check of both against the manifest. */
class Digest {
  readonly #manifest: SnapshotManifest;
  readonly #hash = createHash("sha256");
  #size = 0;
  #sha256: string | undefined;

  constructor(manifest: SnapshotManifest) {
    this.#manifest = manifest;
  }

  /**
   * Adds a chunk, hashed in slices (hash_slices.ts); a download longer than the manifest's size
   * fails at once.
   */
  async update(chunk: Uint8Array): Promise<void> {
    this.#size += chunk.length;
    if (this.#size > this.#manifest.size) this.#fail(`more than ${this.#manifest.size} bytes`);
    await updateInSlices(this.#hash, chunk);
  }

  /** Checks the whole download. */
  check(): void {
    const { size, sha256 } = this.#manifest;
    if (this.#size !== size) this.#fail(`${this.#size} bytes, not ${size}`);
    // A hash gives its digest once; a second check (after zfs refused the last chunk) reuses it.
    const got = this.#sha256 ??= this.#hash.digest("hex");
    if (got !== sha256) this.#fail(`SHA-256 ${got}, not ${sha256}`);
  }

  #fail(what: string): never {
    const m = this.#manifest;
    throw new ReplicateError(
      "checksum",
      `Stored stream "${m.stream}" of snapshot "${m.snapshot}" of volume "${m.volume}" is not ` +
        `what its manifest says (${what}): the stored bytes changed or are damaged; nothing was ` +
        `received from it`,
    );
  }
}

/** A chain of stored snapshots and the dataset it is received into. */
export interface RestoreSpec {
  /** Manifests, the full stream first, each next one incremental from the one before. */
  readonly chain: readonly SnapshotManifest[];
  /** The dataset to receive into; it must not exist yet. */
  readonly target: string;
  readonly signal?: AbortSignal;
}

/**
 * Receives a chain of stored streams into `target`, the full stream first, each incremental
 * on the one before. The chain's links are checked before anything is received.
 * @throws {ReplicateError} chain when the manifests do not form one chain; and whatever
 *   {@linkcode receiveFromStore} throws, for the first stream that failed (the ones before it
 *   stay received: the caller restores into a temporary dataset it destroys on failure)
 */
export async function restoreChain(deps: ReceiveDeps, spec: RestoreSpec): Promise<void> {
  checkChain(spec.chain);
  await checkReceivable(deps.zfs, spec.target, spec.chain);
  for (const manifest of spec.chain) {
    await receiveFromStore(deps, {
      manifest,
      target: spec.target,
      ...(spec.signal && { signal: spec.signal }),
    });
  }
}

/**
 * Refuses manifests that are not one chain of one volume: a full stream, then each stream
 * incremental from the one before.
 * @throws {ReplicateError} chain, naming the first broken link
 */
export function checkChain(chain: readonly SnapshotManifest[]): void {
  const first = chain[0];
  if (first === undefined) throw new ReplicateError("chain", "No stored snapshots to restore");
  if (first.baseGuid !== null) {
    throw new ReplicateError(
      "chain",
      `Stored snapshot "${first.snapshot}" (guid ${first.guid}) of volume "${first.volume}" is ` +
        `incremental from guid ${first.baseGuid}, which is not part of the restore: a restore ` +
        `starts from a full stream`,
    );
  }
  for (let i = 1; i < chain.length; i++) {
    const [prev, cur] = [chain[i - 1]!, chain[i]!];
    if (cur.volumeUid !== first.volumeUid) {
      throw new ReplicateError(
        "chain",
        `Stored snapshot "${cur.snapshot}" belongs to volume uid ${cur.volumeUid}, not ` +
          `${first.volumeUid} like "${first.snapshot}": one restore reads one volume's backups`,
      );
    }
    if (cur.baseGuid !== prev.guid) {
      throw new ReplicateError(
        "chain",
        `Stored snapshot "${cur.snapshot}" (guid ${cur.guid}) of volume "${cur.volume}" is ` +
          (cur.baseGuid === null ? "a full stream" : `incremental from guid ${cur.baseGuid}`) +
          `, not from "${prev.snapshot}" (guid ${prev.guid}) before it: the chain has a gap`,
      );
    }
  }
}
