/**
 * The directory store (`file:///mnt/backup/zfs-csi`): each object is a file `<root>/<key>`, so
 * an operator can read the store with ls, cat and jq. Often an NFS mount or a second disk.
 *
 * - Writes go to a temporary file in `<root>/.tmp/` (same file system), are fsynced, then
 *   renamed into place (the parent directory is fsynced after): nothing partial is ever at a
 *   key. A failed or aborted write removes its temporary file; {@linkcode FileStore.cleanTemp}
 *   removes those left by a crash.
 * - `ifNoneMatch: "*"` hard-links the temporary file to the key: link(2) fails if the key
 *   exists, atomically, also over NFS (where a lost reply is told apart from a lost race by
 *   comparing inodes). Every other write of small objects, and delete, run under a per-key lock
 *   (src/store/file_lock.ts) in `<root>/.locks/`, so an ifMatch compare-then-rename is atomic
 *   against every other writer that uses the store, in any process on any machine.
 * - Etags: see src/store/file_etag.ts (content for small objects, stat for streams).
 * - Symbolic links below the root are never followed: a key whose path has one is refused with
 *   "denied" (checked with lstat before each call; a link swapped in during the call by someone
 *   who can write the store is not caught), and list() skips them. The root itself may be a
 *   link. The root is never created: a missing root (an NFS mount that is not there) makes
 *   every call fail with "unavailable" instead of writing to the empty mount point's parent.
 * - Keys with a segment starting with "." are refused, and such names never listed: `.tmp` and
 *   `.locks` are the store's, `.nfsXXXX` are NFS clients' (a file deleted while open).
 * - New files are mode 0600 and directories 0700: streams hold volumes' data.
 */

import { createHash } from "node:crypto";
import { open as openNode } from "node:fs/promises";
import { errorCode, fileStoreError, writerStoreError } from "./file_errors.ts";
import {
  contentEtag,
  EtagBuilder,
  fileEtag,
  readFileBytes,
  SMALL_OBJECT_BYTES,
  statEtag,
} from "./file_etag.ts";
import { type FileLock, type FileLockOptions, FileLocks } from "./file_lock.ts";
import { fileReadable, syncDir, writeAll } from "./file_stream.ts";
import {
  checkKey,
  checkPrefix,
  MAX_OBJECT_BYTES,
  type ObjectBytes,
  type PutResult,
  type RequestOptions,
  type Store,
  type StoredFile,
  type StoredObject,
  StoreError,
  tooLargeError,
  type TransferOptions,
  type WriteCondition,
  type WrittenFile,
} from "./store.ts";

const TEMP_DIR = ".tmp";
const LOCK_DIR = ".locks";
const DAY_MS = 24 * 60 * 60 * 1000;
/** Files looked at in parallel by list() (helps on NFS, where each is a round trip). */
const LIST_PARALLEL = 8;
/** Times a rename or link is retried after a concurrent delete removed the empty parent. */
const PARENT_RETRIES = 5;
/** Errors of link(2) on file systems without hard links. */
const NO_HARD_LINKS = new Set(["EPERM", "ENOTSUP", "EOPNOTSUPP", "EMLINK", "ENOSYS"]);

/** Options of a {@linkcode FileStore}. */
export interface FileStoreOptions extends FileLockOptions {
  /** Bytes per chunk of a download (256 KiB). */
  readonly readChunkBytes?: number;
}

/** What lies at a key's path, looked at without following links. */
type PathState =
  | { readonly kind: "missing" }
  | { readonly kind: "file"; readonly info: Deno.FileInfo }
  | { readonly kind: "directory" | "other" }
  /** A component before the last is not a directory. */
  | { readonly kind: "blocked"; readonly path: string };

/** A temporary file being written. */
interface Temp {
  readonly path: string;
  readonly file: Deno.FsFile;
}

/** A {@linkcode Store} in a directory; see the module doc. */
export class FileStore implements Store {
  readonly description: string;
  /** The store's directory (absolute, no trailing "/"). */
  readonly root: string;
  readonly #locks: FileLocks;
  readonly #readChunkBytes: number;
  #ownDirsChecked = false;

  /**
   * @param root absolute path of the store's directory, which must exist when used
   * @throws {TypeError} when `root` is not absolute or has "." or ".." segments
   */
  constructor(root: string, options: FileStoreOptions = {}) {
    const trimmed = root.replace(/\/+$/, "");
    if (!root.startsWith("/") || trimmed === "" || /\/\.\.?(\/|$)/.test(trimmed)) {
      throw new TypeError(
        `File store directory "${root}" must be an absolute path other than "/", without "." ` +
          `or ".." segments`,
      );
    }
    this.root = trimmed;
    this.description = `file://${trimmed}`;
    this.#locks = new FileLocks(`${trimmed}/${LOCK_DIR}`, options);
    this.#readChunkBytes = options.readChunkBytes ?? 256 * 1024;
  }

  async putStream(
    key: string,
    body: ReadableStream<Uint8Array>,
    options: TransferOptions = {},
  ): Promise<PutResult> {
    const { signal } = options;
    let temp: Temp;
    try {
      this.#checkKey(key);
      signal?.throwIfAborted();
      await this.#probeForWrite(key);
      temp = await this.#createTemp(key);
    } catch (err) {
      // Nobody will read the body now: let its producer (zfs send) stop.
      await body.cancel(err).catch(() => {});
      throw err;
    }
    const reader = body.getReader();
    const onAbort = () => void reader.cancel(signal?.reason).catch(() => {});
    signal?.addEventListener("abort", onAbort, { once: true });
    let open = true;
    let committed = false;
    try {
      const etag = new EtagBuilder();
      for (;;) {
        // The body's own error (the sender died) is passed on as it is.
        const { done, value } = await reader.read();
        signal?.throwIfAborted();
        if (done) break;
        etag.update(value);
        await this.#io(() => writeAll(temp.file, value), "write", key);
        options.onProgress?.();
      }
      const info = await this.#io(() => syncAndStat(temp.file), "write", key);
      temp.file.close();
      open = false;
      await this.#renameInto(temp.path, key, info);
      committed = true;
      return { etag: etag.etag(info), size: etag.size };
    } catch (err) {
      await reader.cancel(err).catch(() => {});
      throw err;
    } finally {
      signal?.removeEventListener("abort", onAbort);
      if (open) temp.file.close();
      if (!committed) await removeQuietly(temp.path);
    }
  }

  async putWritten<T>(
    key: string,
    write: (file: WrittenFile) => Promise<T>,
    options: TransferOptions = {},
  ): Promise<PutResult & { readonly value: T }> {
    const { signal } = options;
    this.#checkKey(key);
    signal?.throwIfAborted();
    await this.#probeForWrite(key);
    await this.#checkOwnDirs(key);
    const path = `${this.root}/${TEMP_DIR}/${randomHex(16)}.part`;
    // A node:fs handle: its descriptor is what a command can be given as stdout.
    const handle = await this.#io(() => openNode(path, "wx", 0o600), "write", key);
    let open = true;
    let committed = false;
    try {
      const value = await write({
        fd: handle.fd,
        path,
        writerError: (message) => writerStoreError(message, key, this.description),
      });
      signal?.throwIfAborted();
      await this.#io(() => handle.sync(), "write", key);
      await handle.close();
      open = false;
      const info = await this.#io(() => Deno.lstat(path), "write", key);
      // The same etag rule as every reader's: a small object is tagged by its content.
      const etag = info.size > SMALL_OBJECT_BYTES
        ? statEtag(info)
        : await this.#io(() => fileEtagAt(path), "write", key);
      await this.#renameInto(path, key, info);
      committed = true;
      return { etag, size: info.size, value };
    } finally {
      if (open) await handle.close().catch(() => {});
      if (!committed) await removeQuietly(path);
    }
  }

  async putBytes(
    key: string,
    bytes: Uint8Array,
    condition?: WriteCondition,
    options: RequestOptions = {},
  ): Promise<PutResult> {
    this.#checkKey(key);
    options.signal?.throwIfAborted();
    await this.#probeForWrite(key);
    const temp = await this.#writeTemp(key, bytes);
    try {
      const etag = bytes.length > SMALL_OBJECT_BYTES ? statEtag(temp.info) : contentEtag(bytes);
      if (condition !== undefined && "ifNoneMatch" in condition) {
        await this.#linkInto(temp.path, key, temp.info);
      } else {
        await using lock = await this.#lock(key, options.signal);
        if (condition !== undefined) {
          const current = await this.#currentEtag(key);
          if (current !== condition.ifMatch) {
            throw new StoreError(
              "precondition_failed",
              `"${key}" in ${this.description} ${
                current === undefined ? "does not exist" : "changed"
              } since it was read (expected etag ${condition.ifMatch})`,
            );
          }
        }
        lock.checkHeld();
        await this.#renameInto(temp.path, key, temp.info);
      }
      return { etag, size: bytes.length };
    } finally {
      // After a link the temporary file is a second name of the object; after a rename, gone.
      await removeQuietly(temp.path);
    }
  }

  async getStream(key: string, options: TransferOptions = {}): Promise<ReadableStream<Uint8Array>> {
    this.#checkKey(key);
    options.signal?.throwIfAborted();
    const file = await this.#openObject(key);
    if (file === undefined) {
      throw new StoreError("not_found", `"${key}" is not in ${this.description}`);
    }
    return fileReadable(file, {
      chunkBytes: this.#readChunkBytes,
      signal: options.signal,
      mapError: (err) => fileStoreError(err, "read", key, this.description),
    });
  }

  async openFile(key: string, options: RequestOptions = {}): Promise<StoredFile> {
    this.#checkKey(key);
    options.signal?.throwIfAborted();
    if ((await this.#probe(key, "read")).kind !== "file") {
      await this.#requireRoot("read", key);
      throw new StoreError("not_found", `"${key}" is not in ${this.description}`);
    }
    // A node:fs handle: its descriptor is what a command can be given as stdin. Objects are
    // written to a temporary file and renamed into place, never changed in place, so the bytes
    // of this open file stay what they are while it is read, whatever the key names later.
    const handle = await this.#io(() => openNode(this.#path(key), "r"), "read", key);
    return {
      fd: handle.fd,
      read: (buffer, position) =>
        this.#io(
          async () => (await handle.read(buffer, 0, buffer.length, position)).bytesRead,
          "read",
          key,
        ),
      close: () => handle.close(),
    };
  }

  async getBytes(key: string, options: RequestOptions = {}): Promise<ObjectBytes | undefined> {
    this.#checkKey(key);
    options.signal?.throwIfAborted();
    const file = await this.#openObject(key);
    if (file === undefined) return undefined;
    try {
      const read = await this.#io(() => readFileBytes(file, MAX_OBJECT_BYTES), "read", key);
      if (read === "too_large") {
        throw tooLargeError(`Reading "${key}" from ${this.description}`, MAX_OBJECT_BYTES);
      }
      return read;
    } finally {
      file.close();
    }
  }

  async list(prefix: string, options: RequestOptions = {}): Promise<StoredObject[]> {
    checkPrefix(prefix);
    options.signal?.throwIfAborted();
    if (hasDotSegment(prefix)) return [];
    const slash = prefix.lastIndexOf("/");
    const dirKey = slash < 0 ? "" : prefix.slice(0, slash);
    if (dirKey !== "") {
      const state = await this.#probe(dirKey, "list");
      if (state.kind !== "directory") {
        await this.#requireRoot("list", prefix);
        return [];
      }
    }
    const files: string[] = [];
    await this.#walk(dirKey, prefix.slice(slash + 1), files, prefix);
    const objects = await mapLimit(files, LIST_PARALLEL, (key) => this.#describe(key));
    return objects
      .filter((o): o is StoredObject => o !== undefined)
      .sort((a, b) => a.key < b.key ? -1 : a.key > b.key ? 1 : 0);
  }

  async delete(key: string, options: RequestOptions = {}): Promise<void> {
    this.#checkKey(key);
    options.signal?.throwIfAborted();
    const state = await this.#probe(key, "delete");
    if (state.kind !== "file") {
      // Nothing to delete (a directory or the like is no object), unless the store is gone.
      await this.#requireRoot("delete", key);
      return;
    }
    {
      await using _lock = await this.#lock(key, options.signal);
      try {
        await Deno.remove(this.#path(key));
      } catch (err) {
        if (errorCode(err) === "ENOENT") return;
        throw await this.#fail(err, "delete", key);
      }
    }
    await this.#removeEmptyParents(key);
  }

  /**
   * Removes temporary files and lock directories older than `maxAgeMs` (a day), which only a
   * crashed writer leaves: a write takes seconds, a lock is held for at most seconds.
   * @returns how many were removed
   * @throws {StoreError} unavailable, denied
   */
  async cleanTemp(maxAgeMs: number = DAY_MS): Promise<number> {
    const cutoff = Date.now() - maxAgeMs;
    let removed = 0;
    for (const name of [TEMP_DIR, LOCK_DIR]) {
      const dir = `${this.root}/${name}`;
      try {
        for await (const entry of Deno.readDir(dir)) {
          const path = `${dir}/${entry.name}`;
          const info = await lstatOrUndefined(path);
          if (info !== undefined && (info.mtime?.getTime() ?? Infinity) < cutoff) {
            if (await removeQuietly(path)) removed++;
          }
        }
      } catch (err) {
        if (errorCode(err) === "ENOENT") continue;
        throw await this.#fail(err, "clean", name);
      }
    }
    return removed;
  }

  // --- paths and checks ---

  #path(key: string): string {
    return `${this.root}/${key}`;
  }

  #checkKey(key: string): void {
    checkKey(key);
    if (hasDotSegment(key)) {
      throw new StoreError(
        "invalid",
        `Store key "${key}" is not valid in ${this.description}: names starting with "." are ` +
          `the file store's own (${TEMP_DIR}, ${LOCK_DIR}) or the file system's (.nfs*)`,
      );
    }
  }

  /**
   * Looks at each component of `key`'s path below the root with lstat, stopping at the first
   * missing one.
   * @throws {StoreError} denied when a component is a symbolic link
   */
  async #probe(key: string, action: string): Promise<PathState> {
    const segments = key.split("/");
    let path = this.root;
    for (const [i, segment] of segments.entries()) {
      path += `/${segment}`;
      let info: Deno.FileInfo | undefined;
      try {
        info = await lstatOrUndefined(path);
      } catch (err) {
        throw await this.#fail(err, action, key);
      }
      if (info === undefined) return { kind: "missing" };
      if (info.isSymlink) {
        throw new StoreError(
          "denied",
          `Cannot ${action} "${key}" in ${this.description}: ${path} is a symbolic link, and ` +
            `the file store never follows links below its directory; replace it with the ` +
            `directory or file it points to`,
        );
      }
      if (i < segments.length - 1) {
        if (!info.isDirectory) return { kind: "blocked", path };
      } else if (info.isFile) {
        return { kind: "file", info };
      } else {
        return { kind: info.isDirectory ? "directory" : "other" };
      }
    }
    return { kind: "missing" };
  }

  /** Refuses a write whose key's path is blocked by something that is not an object. */
  async #probeForWrite(key: string): Promise<void> {
    const state = await this.#probe(key, "write");
    if (state.kind === "missing" || state.kind === "file") return;
    const what = state.kind === "blocked"
      ? `${state.path} is a file, not a directory`
      : `${this.#path(key)} is a ${state.kind === "directory" ? "directory" : "special file"}`;
    throw new StoreError(
      "invalid",
      `Cannot write "${key}" in ${this.description}: ${what}; remove it or use another key`,
    );
  }

  /** Throws "unavailable" when the root directory is missing (an NFS mount that is not there). */
  async #requireRoot(action: string, key: string): Promise<void> {
    let info: Deno.FileInfo;
    try {
      info = await Deno.stat(this.root);
    } catch (err) {
      if (errorCode(err) !== "ENOENT") throw fileStoreError(err, action, key, this.description);
      throw new StoreError(
        "unavailable",
        `Cannot ${action} "${key}" in ${this.description}: the directory ${this.root} does not ` +
          `exist; mount the store there (the plugin never creates it)`,
      );
    }
    if (!info.isDirectory) {
      throw new StoreError(
        "unavailable",
        `Cannot ${action} "${key}" in ${this.description}: ${this.root} is not a directory`,
      );
    }
  }

  /** The StoreError for a failed call; a not-found root is "unavailable", not "not_found". */
  async #fail(err: unknown, action: string, key: string): Promise<StoreError> {
    if (errorCode(err) === "ENOENT") await this.#requireRoot(action, key);
    return fileStoreError(err, action, key, this.description);
  }

  /** Runs a file-system call, turning its failure into a StoreError. */
  async #io<T>(call: () => Promise<T>, action: string, key: string): Promise<T> {
    try {
      return await call();
    } catch (err) {
      throw await this.#fail(err, action, key);
    }
  }

  /** Makes sure `.tmp` and `.locks` are real directories, not links out of the root. */
  async #checkOwnDirs(key: string): Promise<void> {
    if (this.#ownDirsChecked) return;
    await this.#requireRoot("write", key);
    for (const name of [TEMP_DIR, LOCK_DIR]) {
      const path = `${this.root}/${name}`;
      await this.#io(
        async () => {
          try {
            await Deno.mkdir(path, { mode: 0o700 });
          } catch (err) {
            if (errorCode(err) !== "EEXIST") throw err;
          }
        },
        "write",
        key,
      );
      const info = await this.#io(() => Deno.lstat(path), "write", key);
      if (info.isSymlink || !info.isDirectory) {
        throw new StoreError(
          "denied",
          `Cannot write "${key}" in ${this.description}: ${path} must be a directory of the ` +
            `store's own, not a ${info.isSymlink ? "symbolic link" : "file"}; remove it`,
        );
      }
    }
    this.#ownDirsChecked = true;
  }

  // --- writing ---

  async #createTemp(key: string): Promise<Temp> {
    await this.#checkOwnDirs(key);
    const path = `${this.root}/${TEMP_DIR}/${randomHex(16)}.part`;
    for (let attempt = 0;; attempt++) {
      try {
        return { path, file: await Deno.open(path, { write: true, createNew: true, mode: 0o600 }) };
      } catch (err) {
        if (errorCode(err) !== "ENOENT" || attempt > 0) throw await this.#fail(err, "write", key);
        // Someone removed .tmp since it was checked: make it again.
        this.#ownDirsChecked = false;
        await this.#checkOwnDirs(key);
      }
    }
  }

  /** A temporary file holding `bytes`, fsynced and closed, with its stat. */
  async #writeTemp(key: string, bytes: Uint8Array): Promise<{ path: string; info: Deno.FileInfo }> {
    const temp = await this.#createTemp(key);
    let info: Deno.FileInfo;
    try {
      await this.#io(() => writeAll(temp.file, bytes), "write", key);
      info = await this.#io(() => syncAndStat(temp.file), "write", key);
    } catch (err) {
      temp.file.close();
      await removeQuietly(temp.path);
      throw err;
    }
    temp.file.close();
    return { path: temp.path, info };
  }

  /** Renames a finished temporary file to `key`, making missing parent directories. */
  async #renameInto(tempPath: string, key: string, info: Deno.FileInfo): Promise<void> {
    const target = this.#path(key);
    for (let attempt = 0;; attempt++) {
      try {
        await Deno.rename(tempPath, target);
        break;
      } catch (err) {
        const missing = errorCode(err) === "ENOENT";
        // Over NFS a retransmitted rename that already happened answers ENOENT.
        if (missing && await isSameFile(target, info)) break;
        if (!missing || attempt >= PARENT_RETRIES) throw await this.#fail(err, "write", key);
        await this.#makeParents(key);
      }
    }
    await syncDir(parentOf(target));
  }

  /** Hard-links a finished temporary file to `key` if nothing is there yet. */
  async #linkInto(tempPath: string, key: string, info: Deno.FileInfo): Promise<void> {
    const target = this.#path(key);
    for (let attempt = 0;; attempt++) {
      try {
        await Deno.link(tempPath, target);
        break;
      } catch (err) {
        const code = errorCode(err);
        if (code === "EEXIST") {
          // Over NFS a retransmitted link that already happened answers EEXIST.
          if (await isSameFile(target, info)) break;
          throw new StoreError(
            "precondition_failed",
            `"${key}" already exists in ${this.description}`,
          );
        }
        if (code !== undefined && NO_HARD_LINKS.has(code)) {
          throw new StoreError(
            "denied",
            `Cannot write "${key}" in ${this.description}: its file system refused a hard ` +
              `link (${code}); the file store needs link(2) for conditional writes (NFS, ext4, ` +
              `XFS and ZFS have it)`,
            { cause: err },
          );
        }
        if (code !== "ENOENT" || attempt >= PARENT_RETRIES) {
          throw await this.#fail(err, "write", key);
        }
        await this.#makeParents(key);
      }
    }
    await syncDir(parentOf(target));
  }

  async #makeParents(key: string): Promise<void> {
    await this.#requireRoot("write", key);
    const dir = parentOf(this.#path(key));
    if (dir !== this.root) {
      await this.#io(() => Deno.mkdir(dir, { recursive: true, mode: 0o700 }), "write", key);
    }
  }

  async #lock(key: string, signal?: AbortSignal): Promise<FileLock> {
    const name = createHash("sha256").update(key).digest("hex").slice(0, 32);
    await this.#checkOwnDirs(key);
    try {
      return await this.#locks.acquire(name, `"${key}" in ${this.description}`, signal);
    } catch (err) {
      // A caller that stopped waiting gets its own reason back, not a file-system error.
      if (signal?.aborted) throw signal.reason;
      throw await this.#fail(err, "lock", key);
    }
  }

  /** The etag of the object at `key` now, or undefined. */
  async #currentEtag(key: string): Promise<string | undefined> {
    const file = await this.#openObject(key);
    if (file === undefined) return undefined;
    try {
      return (await this.#io(() => fileEtag(file), "read", key)).etag;
    } finally {
      file.close();
    }
  }

  // --- reading ---

  /** Opens the object at `key` for reading, or undefined when there is none. */
  async #openObject(key: string): Promise<Deno.FsFile | undefined> {
    if ((await this.#probe(key, "read")).kind === "file") {
      try {
        return await Deno.open(this.#path(key), { read: true });
      } catch (err) {
        if (errorCode(err) !== "ENOENT") throw await this.#fail(err, "read", key);
      }
    }
    await this.#requireRoot("read", key);
    return undefined;
  }

  /** Collects the keys of files below `dirKey` whose names (at this level) start with `start`. */
  async #walk(dirKey: string, start: string, into: string[], prefix: string): Promise<void> {
    const dir = dirKey === "" ? this.root : this.#path(dirKey);
    const entries: Deno.DirEntry[] = [];
    try {
      for await (const entry of Deno.readDir(dir)) entries.push(entry);
    } catch (err) {
      const code = errorCode(err);
      // A directory removed meanwhile (a concurrent delete) holds nothing.
      if (dirKey !== "" && (code === "ENOENT" || code === "ENOTDIR")) return;
      throw await this.#fail(err, "list", prefix);
    }
    for (const entry of entries) {
      if (!entry.name.startsWith(start) || entry.isSymlink || entry.name.startsWith(".")) {
        continue;
      }
      const key = dirKey === "" ? entry.name : `${dirKey}/${entry.name}`;
      if (!isKey(key)) continue; // lost+found, an operator's notes.txt~: never objects
      if (entry.isDirectory) await this.#walk(key, "", into, prefix);
      else if (entry.isFile) into.push(key);
    }
  }

  /**
   * A listed file as an object, or undefined when it vanished meanwhile. Its time is its mtime
   * (the file system's clock, which stamps every object alike), read from the file its etag is.
   */
  async #describe(key: string): Promise<StoredObject | undefined> {
    const path = this.#path(key);
    const info = await this.#io(() => lstatOrUndefined(path), "list", key);
    if (info === undefined || !info.isFile) return undefined;
    if (info.size > SMALL_OBJECT_BYTES) {
      return { key, size: info.size, etag: statEtag(info), ...modified(info) };
    }
    let file: Deno.FsFile;
    try {
      file = await Deno.open(path, { read: true });
    } catch (err) {
      if (errorCode(err) === "ENOENT") return undefined;
      throw await this.#fail(err, "list", key);
    }
    try {
      const tagged = await this.#io(() => fileEtag(file), "list", key);
      // The same open file: a rename over the path meanwhile cannot mix two versions.
      return { key, ...tagged, ...modified(await this.#io(() => file.stat(), "list", key)) };
    } finally {
      file.close();
    }
  }

  /** Removes the now empty directories above a deleted key, up to the root (best effort). */
  async #removeEmptyParents(key: string): Promise<void> {
    for (let dir = parentOf(this.#path(key)); dir.length > this.root.length; dir = parentOf(dir)) {
      try {
        await Deno.remove(dir);
      } catch {
        return; // not empty (the usual case), or a writer is using it
      }
    }
  }
}

/** Whether a segment of `key` starts with "." (see FileStore's module doc). */
function hasDotSegment(key: string): boolean {
  return key.startsWith(".") || key.includes("/.");
}

function isKey(key: string): boolean {
  try {
    checkKey(key);
    return true;
  } catch {
    return false;
  }
}

/** A file's mtime as an object's `lastModifiedMs`, left out when the system gives none. */
function modified(info: Deno.FileInfo): { lastModifiedMs?: number } {
  const ms = info.mtime?.getTime();
  return ms !== undefined && Number.isFinite(ms) ? { lastModifiedMs: ms } : {};
}

function parentOf(path: string): string {
  return path.slice(0, path.lastIndexOf("/"));
}

function randomHex(bytes: number): string {
  return Array.from(crypto.getRandomValues(new Uint8Array(bytes)))
    .map((b) => b.toString(16).padStart(2, "0")).join("");
}

async function fileEtagAt(path: string): Promise<string> {
  using file = await Deno.open(path, { read: true });
  return (await fileEtag(file)).etag;
}

async function syncAndStat(file: Deno.FsFile): Promise<Deno.FileInfo> {
  await file.sync();
  return await file.stat();
}

async function lstatOrUndefined(path: string): Promise<Deno.FileInfo | undefined> {
  try {
    return await Deno.lstat(path);
  } catch (err) {
    const code = errorCode(err);
    if (code === "ENOENT" || code === "ENOTDIR") return undefined;
    throw err;
  }
}

/** Whether `path` is the file `info` describes (same inode). */
async function isSameFile(path: string, info: Deno.FileInfo): Promise<boolean> {
  const now = await lstatOrUndefined(path).catch(() => undefined);
  return now !== undefined && now.ino === info.ino && now.dev === info.dev;
}

/** Removes a file or empty directory; false when it was not there or could not be removed. */
async function removeQuietly(path: string): Promise<boolean> {
  try {
    await Deno.remove(path);
    return true;
  } catch {
    return false;
  }
}

/** `fn` over `items`, at most `limit` at a time, results in order. */
async function mapLimit<T, R>(
  items: readonly T[],
  limit: number,
  fn: (item: T) => Promise<R>,
): Promise<R[]> {
  const results: R[] = new Array(items.length);
  let next = 0;
  const worker = async () => {
    while (next < items.length) {
      const i = next++;
      results[i] = await fn(items[i]!);
    }
  };
  await Promise.all(Array.from({ length: Math.min(limit, items.length) }, worker));
  return results;
}
