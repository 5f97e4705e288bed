/**
 * How an S3 answer turns into a {@linkcode StoreError}: the kind from the HTTP status and S3's
 * error code, whether the request may be sent again, and a message that names the operation,
 * the key and the store but never credentials, signatures or signed URLs. Pure.
 */

import { StoreError, type StoreErrorKind } from "./store.ts";

/** What a failed answer means for the caller. */
export interface Classification {
  readonly kind: StoreErrorKind;
  /** A transient failure: an idempotent request may be sent again after a pause. */
  readonly retryable: boolean;
  /** What to do about it, appended to the message (may be ""). */
  readonly hint: string;
}

const TRANSIENT_CODES = new Set([
  "SlowDown",
  "InternalError",
  "ServiceUnavailable",
  "RequestTimeout",
  "OperationAborted",
]);
const NO_SPACE_CODES = new Set([
  "InsufficientStorage",
  "EntityTooLarge",
  "QuotaExceeded",
  "NoSpaceLeftOnDevice",
]);

/**
 * Classifies a failed S3 answer by status and error code (the code is "" when the body was not
 * an S3 `<Error>`). Codes are checked first: S3 sends QuotaExceeded as 403 and RequestTimeout as
 * 400. Only NoSuchKey means a missing object: other 404s (a missing bucket, a web server that is
 * not S3) must never read as "not there".
 */
export function classifyS3Error(status: number, code: string): Classification {
  if (status === 412 || code === "PreconditionFailed") {
    return { kind: "precondition_failed", retryable: false, hint: "" };
  }
  if (code === "ConditionalRequestConflict") {
    // S3's answer to a conditional write racing another one on the same key: the other won.
    return { kind: "precondition_failed", retryable: false, hint: "" };
  }
  if (status === 507 || NO_SPACE_CODES.has(code)) {
    return { kind: "no_space", retryable: false, hint: "free space or raise the bucket's quota" };
  }
  if (code === "NoSuchBucket") {
    return {
      kind: "misconfigured",
      retryable: false,
      hint: "the bucket does not exist: create it, or name another in --store",
    };
  }
  if (code === "NoSuchUpload") {
    return {
      kind: "unavailable",
      retryable: false,
      hint: "the multipart upload was removed meanwhile (a lifecycle rule?): try again",
    };
  }
  if (code === "NoSuchKey") return { kind: "not_found", retryable: false, hint: "" };
  if (code === "InvalidAccessKeyId" || code === "XAdminUserNotFound") {
    // versitygw answers an unknown access key with 404 XAdminUserNotFound: never "not found".
    return { kind: "denied", retryable: false, hint: "the access key is not known to the store" };
  }
  if (code === "RequestTimeTooSkewed") {
    return { kind: "denied", retryable: false, hint: "set this node's clock right (NTP)" };
  }
  if (status === 401 || status === 403) {
    return {
      kind: "denied",
      retryable: false,
      hint: "check the access key, the secret key and the bucket's policy",
    };
  }
  if (status === 501) {
    return {
      kind: "invalid",
      retryable: false,
      hint:
        "the store does not implement this request (conditional writes need a recent S3 server)",
    };
  }
  if (status >= 500 || status === 429 || TRANSIENT_CODES.has(code)) {
    return { kind: "unavailable", retryable: true, hint: "" };
  }
  if (status === 404) {
    // Not NoSuchKey: an answer S3 does not give, so the endpoint is likely not the store.
    return { kind: "invalid", retryable: false, hint: "is the endpoint an S3 server?" };
  }
  return { kind: "invalid", retryable: false, hint: "" };
}

/** The text of an answer's error, at most 200 printable characters. */
function shortText(text: string): string {
  const clean = text.replace(/[^\x20-\x7e]+/g, " ").trim();
  return clean.length > 200 ? `${clean.slice(0, 200)}…` : clean;
}

/** A {@linkcode StoreError} from S3, with what the store answered (nothing when it did not). */
export class S3StoreError extends StoreError {
  /** The HTTP status, or undefined when no answer came. */
  readonly status: number | undefined;
  /** S3's error code ("" when none). */
  readonly code: string;
  /** A transient failure: an idempotent request may be sent again after a pause. */
  readonly retryable: boolean;

  constructor(
    kind: StoreErrorKind,
    message: string,
    details: { status?: number; code?: string; retryable: boolean },
    options?: ErrorOptions,
  ) {
    super(kind, message, options);
    this.status = details.status;
    this.code = details.code ?? "";
    this.retryable = details.retryable;
  }
}

/** What a request was sent to, for the hints of some answers. */
export interface AnswerContext {
  /** The bucket, named in the hint of NoSuchBucket. */
  readonly bucket?: string;
}

/**
 * The error of a failed answer. Only the status, S3's code and (except for denials, whose
 * messages may echo what was signed) S3's short message are kept.
 */
export function answerError(
  what: string,
  status: number,
  body: { readonly code: string; readonly message: string },
  context: AnswerContext = {},
): S3StoreError {
  const c = classifyS3Error(status, body.code);
  const answered = `the store answered ${status}${body.code ? ` ${body.code}` : ""}`;
  const detail = c.kind === "denied" || body.message === "" ? "" : ` (${shortText(body.message)})`;
  const named = body.code === "NoSuchBucket" && context.bucket !== undefined
    ? c.hint.replace("the bucket", `the bucket "${context.bucket}"`)
    : c.hint;
  const hint = named ? `: ${named}` : "";
  return new S3StoreError(c.kind, `${what} failed: ${answered}${detail}${hint}`, {
    status,
    code: body.code,
    retryable: c.retryable,
  });
}

/** The error of a request that got no answer (refused, reset, timed out): retryable. */
export function unreachableError(what: string, cause: unknown): S3StoreError {
  const reason = cause instanceof DOMException && cause.name === "TimeoutError"
    ? "it did not answer in time"
    : shortText(cause instanceof Error ? cause.message : String(cause));
  return new S3StoreError(
    "unavailable",
    `${what} failed: the store is unreachable (${reason})`,
    { retryable: true },
    { cause },
  );
}

/** The error of a 2xx answer whose body is not what S3 sends (a proxy's page, a cut answer). */
export function badAnswerError(what: string, cause: unknown): S3StoreError {
  const reason = cause instanceof Error ? `: ${shortText(cause.message)}` : "";
  return new S3StoreError(
    "invalid",
    `${what} failed: the store's answer is not what S3 sends${reason}`,
    { retryable: false },
    { cause },
  );
}
