/**
 * Errors that carry a gRPC status code, and the single mapping from any thrown value to the
 * status a client sees. Handlers throw; only {@linkcode toGrpcStatus} decides what is sent.
 */

import { ReplicateError, type ReplicateErrorKind } from "./replicate_errors.ts";
import { StoreError, type StoreErrorKind } from "./store/store.ts";

/** gRPC status codes (the numeric values are fixed by the gRPC protocol). */
export const Code = {
  OK: 0,
  CANCELLED: 1,
  UNKNOWN: 2,
  INVALID_ARGUMENT: 3,
  DEADLINE_EXCEEDED: 4,
  NOT_FOUND: 5,
  ALREADY_EXISTS: 6,
  PERMISSION_DENIED: 7,
  RESOURCE_EXHAUSTED: 8,
  FAILED_PRECONDITION: 9,
  ABORTED: 10,
  OUT_OF_RANGE: 11,
  UNIMPLEMENTED: 12,
  INTERNAL: 13,
  UNAVAILABLE: 14,
  DATA_LOSS: 15,
} as const;

/** One of the gRPC status codes in {@linkcode Code}. */
export type GrpcCode = typeof Code[keyof typeof Code];

/** Reverse lookup used for logs: 5 → "NOT_FOUND". */
export function codeName(code: number): string {
  for (const [name, value] of Object.entries(Code)) {
    if (value === code) return name;
  }
  return `CODE_${code}`;
}

/** An error whose message is safe to send to the client, with the gRPC code to send it with. */
export class CsiError extends Error {
  readonly code: GrpcCode;

  constructor(code: GrpcCode, message: string, options?: ErrorOptions) {
    super(message, options);
    this.name = "CsiError";
    this.code = code;
  }
}

/** What kind of failure a zfs/zpool command reported, read from its stderr once, in one place. */
export type ZfsErrorKind =
  | "not_found"
  | "exists"
  | "busy"
  | "dependents"
  | "key_unavailable"
  | "no_space"
  | "permission"
  | "invalid"
  | "unsupported"
  | "timeout"
  | "unavailable"
  | "unknown";

/** More about a {@linkcode ZfsError}. */
export interface ZfsErrorOptions extends ErrorOptions {
  /**
   * What went wrong in words a client can act on, sent instead of zfs's first stderr line
   * (which for some failures says little, such as "connect: No such file or directory").
   */
  readonly detail?: string;
}

/** A failed zfs or zpool command, classified by {@linkcode ZfsErrorKind}. */
export class ZfsError extends Error {
  readonly kind: ZfsErrorKind;
  readonly argv: readonly string[];
  readonly stderr: string;
  readonly detail: string | undefined;

  constructor(
    kind: ZfsErrorKind,
    argv: readonly string[],
    stderr: string,
    options: ZfsErrorOptions = {},
  ) {
    const said = stderr.trim() || "no output";
    super(
      `Command "${argv.join(" ")}" failed (${kind}): ` +
        (options.detail === undefined ? said : `${options.detail} (zfs said: ${said})`),
      options,
    );
    this.name = "ZfsError";
    this.kind = kind;
    this.argv = argv;
    this.stderr = stderr;
    this.detail = options.detail;
  }
}

const zfsKindToCode: Record<ZfsErrorKind, GrpcCode> = {
  not_found: Code.NOT_FOUND,
  exists: Code.ALREADY_EXISTS,
  busy: Code.FAILED_PRECONDITION,
  dependents: Code.FAILED_PRECONDITION,
  key_unavailable: Code.FAILED_PRECONDITION,
  no_space: Code.RESOURCE_EXHAUSTED,
  permission: Code.PERMISSION_DENIED,
  invalid: Code.INVALID_ARGUMENT,
  unsupported: Code.INVALID_ARGUMENT,
  timeout: Code.DEADLINE_EXCEEDED,
  // ZFS could not see the pool or could not be reached: worth retrying once it is back.
  unavailable: Code.UNAVAILABLE,
  unknown: Code.INTERNAL,
};

const storeKindToCode: Record<StoreErrorKind, GrpcCode> = {
  not_found: Code.NOT_FOUND,
  // Another writer won a conditional write: the call may be repeated.
  precondition_failed: Code.ABORTED,
  unavailable: Code.UNAVAILABLE,
  no_space: Code.RESOURCE_EXHAUSTED,
  denied: Code.PERMISSION_DENIED,
  invalid: Code.INTERNAL,
  // A missing bucket, a server that ignores conditional writes: the operator's to fix.
  misconfigured: Code.FAILED_PRECONDITION,
};

const replicateKindToCode: Record<ReplicateErrorKind, GrpcCode> = {
  // The stored bytes are not those recorded at backup time: nothing was restored from them.
  checksum: Code.DATA_LOSS,
  chain: Code.FAILED_PRECONDITION,
  guid: Code.DATA_LOSS,
  // The stored stream is not one the plugin made (it carries properties): as unusable as
  // damaged bytes, and no retry or change on the node makes it usable; the store must be repaired.
  properties: Code.DATA_LOSS,
};

/** The status a client receives for a thrown value. */
export interface GrpcStatus {
  readonly code: GrpcCode;
  readonly details: string;
}

/**
 * Maps any thrown value to a gRPC status. CsiError keeps its code and message; ZfsError maps by
 * kind and names the failed zfs operation, with its detail or else zfs's first stderr line;
 * anything else is INTERNAL with a generic message, so internals only reach the log, never the
 * client.
 */
export function toGrpcStatus(err: unknown): GrpcStatus {
  if (err instanceof CsiError) return { code: err.code, details: err.message };
  if (err instanceof StoreError) {
    // Store messages name the key and the store, never credentials (src/store/store.ts).
    return { code: storeKindToCode[err.kind], details: err.message };
  }
  if (err instanceof ReplicateError) {
    return { code: replicateKindToCode[err.kind], details: err.message };
  }
  if (err instanceof ZfsError) {
    const op = err.argv.slice(0, 2).join(" ");
    return {
      code: zfsKindToCode[err.kind],
      details: `ZFS operation "${op}" failed (${err.kind.replace("_", " ")}): ${
        err.detail ?? firstLine(err.stderr)
      }`,
    };
  }
  return { code: Code.INTERNAL, details: "Internal error, see the plugin logs" };
}

function firstLine(text: string): string {
  return text.trim().split("\n")[0]?.slice(0, 300) ?? "";
}
