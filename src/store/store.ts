/**
 * The store: where volumes' `zfs send` streams and their manifests live outside any node. Two
 * backends implement {@linkcode Store}: a directory (`file:///…`, src/store/file_store.ts) and an
 * S3-compatible bucket (`s3://bucket/prefix`, src/store/s3_store.ts). Nothing here knows about
 * CSI or ZFS; src/store/layout.ts says which keys hold what.
 *
 * Keys are relative to the store's root (the directory, or the bucket's prefix): segments joined
 * by "/", each of letters, digits and `._:-`, never "." or "..", at most 512 bytes in all (see
 * {@linkcode checkKey}).
 */

/** Why a store operation failed; callers switch on this, never on message text. */
export type StoreErrorKind =
  /** The object does not exist. */
  | "not_found"
  /** A conditional write lost: the object exists (If-None-Match) or changed (If-Match). */
  | "precondition_failed"
  /** The store cannot be reached, timed out or answered a server error: try again later. */
  | "unavailable"
  /** The store is full (a full disk, a bucket quota). */
  | "no_space"
  /** The credentials or permissions do not allow the operation. */
  | "denied"
  /** The request itself was wrong (a bad key, an answer the store should not give). */
  | "invalid"
  /**
   * The store is not set up as the plugin needs (a bucket that does not exist, a server that
   * does not enforce conditional writes): the operator's to fix, not worth retrying as it is.
   */
  | "misconfigured";

/** A failed store operation. The message names the key and the store, never credentials. */
export class StoreError extends Error {
  readonly kind: StoreErrorKind;

  constructor(kind: StoreErrorKind, message: string, options?: ErrorOptions) {
    super(message, options);
    this.name = "StoreError";
    this.kind = kind;
  }
}

/** One object as a listing shows it. */
export interface StoredObject {
  readonly key: string;
  readonly size: number;
  /** Opaque version tag: changes whenever the object's content is replaced. */
  readonly etag: string;
  /**
   * When this version was written, in ms since the epoch, by the STORE's clock (S3's
   * LastModified, the directory store's file mtime): comparable only with other times from
   * the same store (src/store/store_clock.ts), never with a node's clock. Absent when the
   * store does not say.
   */
  readonly lastModifiedMs?: number;
}

/** A write that succeeds only if the object is absent, or still at a version read before. */
export type WriteCondition =
  | { readonly ifNoneMatch: "*" }
  | { readonly ifMatch: string };

/** What a finished write left. */
export interface PutResult {
  /** The new version tag (see {@linkcode StoredObject.etag}). */
  readonly etag: string;
  /** Bytes written. */
  readonly size: number;
}

/** Options of a request for a small object or a listing. */
export interface RequestOptions {
  /**
   * Stops the request (the S3 store closes its connection); it rejects with the signal's
   * reason. A write it stops may or may not have landed, as any unanswered write.
   */
  readonly signal?: AbortSignal;
}

/** Options of a streamed transfer. */
export interface TransferOptions {
  /** Stops the transfer; for a write, nothing becomes visible. */
  readonly signal?: AbortSignal;
  /**
   * Told, for a write, whenever bytes of it reach the store or the store answers a part of it:
   * how a caller tells a slow upload from a stalled one (src/store/wait.ts). Not every store
   * tells (a fake may not).
   */
  readonly onProgress?: () => void;
}

/** A small object read whole, with its version tag for a later conditional write. */
export interface ObjectBytes {
  readonly bytes: Uint8Array;
  readonly etag: string;
}

/** The temporary file of a {@linkcode Store.putWritten} write. */
export interface WrittenFile {
  /** Its node:fs descriptor, open for writing: give it to a command as stdout (run.ts). */
  readonly fd: number;
  /** Its path, to read it back while it is written. */
  readonly path: string;
  /**
   * The store's error for a writer that failed saying `message` (a command's stderr), when
   * that names a failure of the store's file system (full, read-only, gone); else undefined.
   */
  writerError(message: string): StoreError | undefined;
}

/** A stored object open as a local file ({@linkcode Store.openFile}). */
export interface StoredFile {
  /** Its node:fs descriptor, at offset 0: give it to a command as stdin (run.ts). */
  readonly fd: number;
  /**
   * Reads up to `buffer.length` bytes at byte `position` (pread: the descriptor's offset stays
   * at 0 for the command); 0 at the end of the file.
   * @throws {StoreError} when the read fails
   */
  read(buffer: Uint8Array, position: number): Promise<number>;
  close(): Promise<void>;
}

/** Where volumes' streams and manifests are kept. */
export interface Store {
  /** The store as the operator named it, without credentials: for logs and error messages. */
  readonly description: string;

  /**
   * Writes `body` to `key` as it is read, in bounded memory (an S3 multipart upload; a
   * temporary file renamed into place). The object becomes visible only once all of it is
   * stored; a failed or aborted write leaves no object (an earlier one at the key stays).
   * Unconditional: keys written this way must be unique to the writer (see layout.ts).
   * @throws {StoreError} unavailable, no_space, denied, invalid
   */
  putStream(
    key: string,
    body: ReadableStream<Uint8Array>,
    options?: TransferOptions,
  ): Promise<PutResult>;

  /**
   * Only where the store is a local file system (the directory store): writes `key` by giving
   * its temporary file to `write`, which has another program fill it (`zfs send` with the file
   * as stdout), so no byte passes through this process. Visible only once `write` resolved (the
   * file is then synced and renamed into place); removed if `write` throws or the signal aborts.
   * @returns the write's result and `write`'s value
   * @throws {StoreError} unavailable, no_space, denied, invalid; whatever `write` throws
   */
  putWritten?<T>(
    key: string,
    write: (file: WrittenFile) => Promise<T>,
    options?: TransferOptions,
  ): Promise<PutResult & { readonly value: T }>;

  /**
   * Writes a small object (a manifest) in one request, under `condition` if given: with
   * `ifNoneMatch: "*"` only when no object has the key, with `ifMatch` only while the object
   * still has that etag. Of two writers racing under a condition exactly one wins.
   * @throws {StoreError} precondition_failed when the condition does not hold; unavailable,
   * no_space, denied, invalid
   */
  putBytes(
    key: string,
    bytes: Uint8Array,
    condition?: WriteCondition,
    options?: RequestOptions,
  ): Promise<PutResult>;

  /**
   * Streams an object's content as it downloads.
   * @throws {StoreError} not_found, unavailable, denied
   */
  getStream(key: string, options?: TransferOptions): Promise<ReadableStream<Uint8Array>>;

  /**
   * Only where the store is a local file system (the directory store): opens an object's file
   * for reading by position and for a command to read as its stdin (`zfs receive < file`), so
   * its bytes need not pass through this process. The caller closes it.
   * @throws {StoreError} not_found, unavailable, denied
   */
  openFile?(key: string, options?: RequestOptions): Promise<StoredFile>;

  /**
   * Reads a small object whole, or `undefined` when there is none. Small means at most
   * {@linkcode MAX_OBJECT_BYTES}: what the store holds is untrusted, and a larger object is
   * refused before more than that is read.
   * @throws {StoreError} unavailable, denied; invalid for an object over the cap
   */
  getBytes(key: string, options?: RequestOptions): Promise<ObjectBytes | undefined>;

  /**
   * Every object whose key starts with `prefix` (a plain string prefix, "" for all), sorted by
   * key. Objects still being written by {@linkcode putStream} are not listed.
   * @throws {StoreError} unavailable, denied
   */
  list(prefix: string, options?: RequestOptions): Promise<StoredObject[]>;

  /**
   * Removes an object; a missing one is not an error.
   * @throws {StoreError} unavailable, denied
   */
  delete(key: string, options?: RequestOptions): Promise<void>;
}

/**
 * The most {@linkcode Store.getBytes} reads of one object. Manifests, records and owner objects
 * take a few KiB; anything near this is not one the plugin wrote.
 */
export const MAX_OBJECT_BYTES = 1024 * 1024;

/** The error of an object or answer over the bytes the plugin reads whole. */
export function tooLargeError(what: string, cap: number): StoreError {
  return new StoreError(
    "invalid",
    `${what} failed: the answer is over the ${cap} bytes the plugin reads whole, so it is not ` +
      `one the plugin wrote`,
  );
}

const KEY_SEGMENT = /^[A-Za-z0-9._:-]+$/;
/** Longest key, in bytes (S3 allows 1024 with the prefix; room is left for the prefix). */
export const MAX_KEY_BYTES = 512;

/**
 * Refuses a key that is not made of safe segments: a key never escapes the store's root.
 * @throws {StoreError} invalid, naming the key
 */
export function checkKey(key: string): void {
  const segments = key.split("/");
  const ok = key.length > 0 && key.length <= MAX_KEY_BYTES &&
    segments.every((s) => KEY_SEGMENT.test(s) && s !== "." && s !== "..");
  if (!ok) {
    throw new StoreError(
      "invalid",
      `Store key "${key}" is not valid: use "/"-separated segments of letters, digits and "._:-"`,
    );
  }
}

/**
 * Refuses a listing prefix that could not start a valid key (a trailing "/" is fine).
 * @throws {StoreError} invalid
 */
export function checkPrefix(prefix: string): void {
  if (prefix === "") return;
  checkKey(prefix.endsWith("/") ? prefix.slice(0, -1) : prefix);
}
