/**
 * AWS Signature Version 4 for S3 requests sent with fetch: the signed headers to add to a
 * request, nothing else (no SDK; the body is never read here, its hash is given). Pure apart
 * from hashing (node:crypto, which needs no permission).
 *
 * The canonical request is: the method; the path with each segment URI-encoded (S3 keeps "/");
 * the query sorted by encoded name then value, a bare name as `name=`; every signed header as
 * `name:value` (lowercase names, trimmed values, inner runs of spaces collapsed) sorted by name;
 * the signed header names joined by ";"; the payload's hex SHA-256.
 */

import { createHash, createHmac } from "node:crypto";

/** An access key pair, with the session token of temporary credentials. */
export interface Credentials {
  readonly accessKeyId: string;
  readonly secretAccessKey: string;
  readonly sessionToken?: string;
}

/** What is signed: every header in `headers` is signed, and must be sent as given. */
export interface CanonicalInput {
  readonly method: string;
  /** The path as it goes on the wire (raw or percent-encoded: both give the same result). */
  readonly path: string;
  /** The query string without "?" (raw or percent-encoded). */
  readonly query: string;
  readonly headers: Readonly<Record<string, string>>;
  /** Hex SHA-256 of the body (or "UNSIGNED-PAYLOAD"). */
  readonly payloadHash: string;
}

/** Where and when a signature is valid. */
export interface SigningScope {
  /** e.g. "us-east-1". */
  readonly region: string;
  /** "s3" for S3. */
  readonly service: string;
  readonly date: Date;
}

/** Hex SHA-256 of an empty body. */
export const EMPTY_SHA256 = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855";

/** Hex SHA-256 of bytes or a UTF-8 string. */
export function sha256Hex(data: Uint8Array | string): string {
  return createHash("sha256").update(data).digest("hex");
}

function hmac(key: Uint8Array | string, data: string): Uint8Array {
  return createHmac("sha256", key).update(data).digest();
}

/**
 * AWS's URI encoding: every byte but the unreserved `A-Z a-z 0-9 - . _ ~` becomes %XY
 * (uppercase hex); "/" too unless `keepSlash`. encodeURIComponent differs on `!'()*`.
 */
export function uriEncode(value: string, keepSlash = false): string {
  let out = "";
  for (const byte of new TextEncoder().encode(value)) {
    const c = String.fromCharCode(byte);
    if (/[A-Za-z0-9\-._~]/.test(c) || (keepSlash && c === "/")) out += c;
    else out += `%${byte.toString(16).toUpperCase().padStart(2, "0")}`;
  }
  return out;
}

/** Decodes %XY escapes (and "+" as a space, as S3 servers read a query). */
function uriDecode(value: string, plusIsSpace: boolean): string {
  return decodeURIComponent(plusIsSpace ? value.replaceAll("+", " ") : value);
}

/** The canonical path: each segment decoded then encoded once, "/" kept. */
export function canonicalPath(path: string): string {
  if (path === "") return "/";
  return path.split("/").map((s) => uriEncode(uriDecode(s, false))).join("/");
}

/** The canonical query: pairs encoded, sorted by name then value, a bare name as `name=`. */
export function canonicalQuery(query: string): string {
  const q = query.startsWith("?") ? query.slice(1) : query;
  if (q === "") return "";
  const pairs = q.split("&").filter((p) => p !== "").map((p) => {
    const eq = p.indexOf("=");
    const name = eq < 0 ? p : p.slice(0, eq);
    const value = eq < 0 ? "" : p.slice(eq + 1);
    return [uriEncode(uriDecode(name, true)), uriEncode(uriDecode(value, true))] as const;
  });
  pairs.sort((a, b) => compare(a[0], b[0]) || compare(a[1], b[1]));
  return pairs.map(([n, v]) => `${n}=${v}`).join("&");
}

function compare(a: string, b: string): number {
  return a < b ? -1 : a > b ? 1 : 0;
}

function canonicalHeaderEntries(headers: Readonly<Record<string, string>>): [string, string][] {
  const entries = Object.entries(headers).map((
    [name, value],
  ): [string, string] => [name.toLowerCase(), value.trim().replace(/ +/g, " ")]);
  entries.sort((a, b) => compare(a[0], b[0]));
  return entries;
}

/** The signed header names, lowercase, sorted, joined by ";". */
export function signedHeaderNames(headers: Readonly<Record<string, string>>): string {
  return canonicalHeaderEntries(headers).map(([n]) => n).join(";");
}

/** The canonical request string (what AWS's documentation calls CanonicalRequest). */
export function canonicalRequest(input: CanonicalInput): string {
  const entries = canonicalHeaderEntries(input.headers);
  return [
    input.method.toUpperCase(),
    canonicalPath(input.path),
    canonicalQuery(input.query),
    entries.map(([n, v]) => `${n}:${v}\n`).join(""),
    entries.map(([n]) => n).join(";"),
    input.payloadHash,
  ].join("\n");
}

/** `YYYYMMDDTHHMMSSZ` (x-amz-date) of a date. */
export function amzDate(date: Date): string {
  return date.toISOString().replace(/[-:]/g, "").replace(/\.\d{3}/, "");
}

/** The string to sign of a canonical request. */
export function stringToSign(canonical: string, scope: SigningScope): string {
  const stamp = amzDate(scope.date);
  return [
    "AWS4-HMAC-SHA256",
    stamp,
    `${stamp.slice(0, 8)}/${scope.region}/${scope.service}/aws4_request`,
    sha256Hex(canonical),
  ].join("\n");
}

/** The Authorization header value of a request whose headers are all signed. */
export function authorization(
  input: CanonicalInput,
  scope: SigningScope,
  credentials: Credentials,
): string {
  const day = amzDate(scope.date).slice(0, 8);
  let key = hmac(`AWS4${credentials.secretAccessKey}`, day);
  for (const part of [scope.region, scope.service, "aws4_request"]) key = hmac(key, part);
  const signature = createHmac("sha256", key)
    .update(stringToSign(canonicalRequest(input), scope))
    .digest("hex");
  return `AWS4-HMAC-SHA256 Credential=${credentials.accessKeyId}/${day}/${scope.region}/` +
    `${scope.service}/aws4_request,SignedHeaders=${signedHeaderNames(input.headers)},` +
    `Signature=${signature}`;
}

/** An S3 request to sign. */
export interface S3SignInput {
  readonly method: string;
  readonly url: URL;
  /** Headers to send and sign besides host and the x-amz-* ones added here. */
  readonly headers?: Readonly<Record<string, string>>;
  /** Hex SHA-256 of the body ({@linkcode EMPTY_SHA256} for none). */
  readonly payloadHash: string;
  readonly region: string;
  /** Defaults to now. */
  readonly date?: Date;
}

/**
 * The headers to send with an S3 request: the given ones plus x-amz-date, x-amz-content-sha256
 * (always: some servers, versitygw among them, require it), x-amz-security-token for temporary
 * credentials, and Authorization. Host is signed as fetch sends it (the URL's host) but not
 * returned, since fetch sets it.
 */
export function signS3Request(input: S3SignInput, credentials: Credentials): Headers {
  const date = input.date ?? new Date();
  const signed: Record<string, string> = {};
  for (const [name, value] of Object.entries(input.headers ?? {})) {
    signed[name.toLowerCase()] = value;
  }
  signed["host"] = input.url.host;
  signed["x-amz-date"] = amzDate(date);
  signed["x-amz-content-sha256"] = input.payloadHash;
  if (credentials.sessionToken) signed["x-amz-security-token"] = credentials.sessionToken;
  const auth = authorization(
    {
      method: input.method,
      path: input.url.pathname,
      query: input.url.search,
      headers: signed,
      payloadHash: input.payloadHash,
    },
    { region: input.region, service: "s3", date },
    credentials,
  );
  const headers = new Headers();
  for (const [name, value] of Object.entries(signed)) {
    if (name !== "host") headers.set(name, value);
  }
  headers.set("authorization", auth);
  return headers;
}
