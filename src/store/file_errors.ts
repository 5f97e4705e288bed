/**
 * How the directory store turns a failed file-system call into a {@linkcode StoreError}: by the
 * OS error code (`err.code`, e.g. "ENOSPC"), with a message that names the key, the store and
 * what to check. A dead NFS mount shows as EIO, ESTALE, ETIMEDOUT or ENOTCONN: "unavailable".
 */

import { StoreError, type StoreErrorKind } from "./store.ts";

const KIND_BY_CODE: Readonly<Record<string, StoreErrorKind>> = {
  ENOENT: "not_found",
  ENOSPC: "no_space",
  EDQUOT: "no_space",
  EFBIG: "no_space",
  EACCES: "denied",
  EPERM: "denied",
  EROFS: "denied",
  EIO: "unavailable",
  ESTALE: "unavailable",
  ETIMEDOUT: "unavailable",
  ENOTCONN: "unavailable",
  EHOSTDOWN: "unavailable",
  EHOSTUNREACH: "unavailable",
  ENETUNREACH: "unavailable",
  ECONNREFUSED: "unavailable",
  ECONNRESET: "unavailable",
  ENODEV: "unavailable",
  ENXIO: "unavailable",
  EAGAIN: "unavailable",
  EBUSY: "unavailable",
  EINTR: "unavailable",
  // Something other than an object is at the key's path (a directory, a file where a
  // directory should be): the key cannot be used in this store as it is.
  ENOTDIR: "invalid",
  EISDIR: "invalid",
  ENOTEMPTY: "invalid",
  EEXIST: "invalid",
  ENAMETOOLONG: "invalid",
  ELOOP: "invalid",
  EXDEV: "invalid",
};

const HINTS: Readonly<Record<StoreErrorKind, string>> = {
  not_found: "there is no such object",
  precondition_failed: "the object changed meanwhile",
  no_space: "the store's file system is full or over quota: free space in it or grow it",
  denied: "not allowed: check the directory's owner and mode, that it is not mounted " +
    "read-only, and that the plugin's write permission covers it",
  unavailable: "the store's file system does not answer: check that it is mounted " +
    "(for NFS, that the server is up and reachable) and try again",
  invalid: "something other than an object is in the way at this path: " +
    "look at the store's directory",
  misconfigured: "the store's directory is not set up as the plugin needs",
};

/** The OS error code of a failed Deno file-system call ("ENOSPC"), if it has one. */
export function errorCode(err: unknown): string | undefined {
  if (typeof err !== "object" || err === null || !("code" in err)) return undefined;
  return typeof err.code === "string" ? err.code : undefined;
}

/**
 * The store error kind of a failed file-system call: by its OS error code; Deno's own
 * permission refusal is "denied"; anything unknown is "unavailable" (try again later).
 */
export function fileErrorKind(err: unknown): StoreErrorKind {
  if (err instanceof StoreError) return err.kind;
  if (err instanceof Deno.errors.NotCapable || err instanceof Deno.errors.PermissionDenied) {
    return "denied";
  }
  const code = errorCode(err);
  return (code === undefined ? undefined : KIND_BY_CODE[code]) ?? "unavailable";
}

/**
 * A {@linkcode StoreError} for a failed file-system call while doing `action` ("write", "read",
 * ...) on `key` of the store described as `store`; a StoreError passes through unchanged.
 */
export function fileStoreError(
  err: unknown,
  action: string,
  key: string,
  store: string,
): StoreError {
  if (err instanceof StoreError) return err;
  const kind = fileErrorKind(err);
  const detail = err instanceof Error ? err.message : String(err);
  return new StoreError(
    kind,
    `Cannot ${action} "${key}" in ${store}: ${HINTS[kind]} (${detail})`,
    { cause: err },
  );
}

/** strerror(3) texts of failures that are the file system's, as a program writing a file says them. */
const KIND_BY_TEXT: readonly (readonly [RegExp, StoreErrorKind])[] = [
  [/No space left on device|Disk quota exceeded|File too large/, "no_space"],
  [/Read-only file system/, "denied"],
  [/Stale file handle|Transport endpoint is not connected|Host is down/, "unavailable"],
];

/**
 * The {@linkcode StoreError} for another program that failed writing `key`'s file itself (`zfs
 * send` given the file as stdout), when its message names a failure of the file system the
 * file is on; undefined when it does not (then the failure is the program's own).
 */
export function writerStoreError(
  message: string,
  key: string,
  store: string,
): StoreError | undefined {
  const kind = KIND_BY_TEXT.find(([text]) => text.test(message))?.[1];
  if (kind === undefined) return undefined;
  return new StoreError(
    kind,
    `Cannot write "${key}" in ${store}: ${HINTS[kind]} (${message.trim()})`,
  );
}
