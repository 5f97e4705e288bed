/**
 * An in-memory S3 behind a fetch function, for unit tests of src/store/s3_*.ts without a
 * network: path-style requests for one bucket, the calls the S3 store uses, conditional writes,
 * listings paged by `pageSize`. Tests intercept requests with `intercept` (to fail, delay or
 * block them) and read what was asked in `requests`.
 */

import { createHash } from "node:crypto";

/** One request the fake received. */
export interface FakeRequest {
  readonly method: string;
  readonly url: URL;
  readonly headers: Headers;
  /** The operation, as S3 names it. */
  readonly operation: string;
  /** The request's signal (time limit and caller's abort). */
  readonly signal: AbortSignal | undefined;
}

interface Stored {
  readonly bytes: Uint8Array;
  readonly etag: string;
}

function md5(bytes: Uint8Array): string {
  return createHash("md5").update(bytes).digest("hex");
}

function xmlError(status: number, code: string): Response {
  return new Response(`<Error><Code>${code}</Code><Message>fake</Message></Error>`, { status });
}

/** The fake S3; `fetch` is what S3Store gets. */
export class FakeS3 {
  readonly objects = new Map<string, Stored>();
  readonly uploads = new Map<string, Map<number, Uint8Array>>();
  readonly requests: FakeRequest[] = [];
  /** Keys per ListObjectsV2 page. */
  pageSize = 1000;
  /** Runs before each request; an answer it returns replaces the fake's own. */
  intercept: (r: FakeRequest) => Promise<Response | undefined> | Response | undefined = () =>
    undefined;
  readonly #bucket: string;
  #nextUpload = 1;

  constructor(bucket: string) {
    this.#bucket = bucket;
  }

  readonly fetch: typeof fetch = async (input, init) => {
    const url = new URL(input instanceof Request ? input.url : String(input));
    const method = init?.method ?? "GET";
    const headers = new Headers(init?.headers);
    const body = init?.body instanceof Uint8Array ? init.body : new Uint8Array(0);
    const signal = init?.signal ?? undefined;
    const request = { method, url, headers, operation: operationOf(method, url), signal };
    this.requests.push(request);
    if (!headers.get("authorization")?.startsWith("AWS4-HMAC-SHA256 Credential=")) {
      return xmlError(403, "AccessDenied");
    }
    init?.signal?.throwIfAborted();
    const intercepted = await this.intercept(request);
    init?.signal?.throwIfAborted();
    return intercepted ?? this.#answer(request, new Uint8Array(body));
  };

  #answer(r: FakeRequest, body: Uint8Array): Response {
    const [, bucket, ...rest] = r.url.pathname.split("/");
    if (bucket !== this.#bucket) return xmlError(404, "NoSuchBucket");
    const key = rest.map(decodeURIComponent).join("/");
    const q = r.url.searchParams;
    switch (r.operation) {
      case "ListObjectsV2":
        return this.#list(q.get("prefix") ?? "", q.get("continuation-token"));
      case "PutObject": {
        const now = this.objects.get(key);
        const ifMatch = r.headers.get("if-match");
        if (r.headers.get("if-none-match") === "*" && now) {
          return xmlError(412, "PreconditionFailed");
        }
        if (ifMatch !== null && !now) return xmlError(404, "NoSuchKey");
        if (ifMatch !== null && ifMatch !== `"${now?.etag}"`) {
          return xmlError(412, "PreconditionFailed");
        }
        const etag = md5(body);
        this.objects.set(key, { bytes: body, etag });
        return new Response(null, { headers: { etag: `"${etag}"` } });
      }
      case "GetObject":
      case "HeadObject": {
        const now = this.objects.get(key);
        if (!now) {
          return r.method === "HEAD"
            ? new Response(null, { status: 404 })
            : xmlError(404, "NoSuchKey");
        }
        const headers = { etag: `"${now.etag}"`, "content-length": String(now.bytes.length) };
        return new Response(r.method === "HEAD" ? null : now.bytes.slice(), { headers });
      }
      case "DeleteObject":
        this.objects.delete(key);
        return new Response(null, { status: 204 });
      case "CreateMultipartUpload": {
        const id = `upload-${this.#nextUpload++}`;
        this.uploads.set(id, new Map());
        return new Response(
          `<InitiateMultipartUploadResult><UploadId>${id}</UploadId></InitiateMultipartUploadResult>`,
        );
      }
      case "UploadPart": {
        const parts = this.uploads.get(q.get("uploadId") ?? "");
        if (!parts) return xmlError(404, "NoSuchUpload");
        parts.set(Number(q.get("partNumber")), body);
        return new Response(null, { headers: { etag: `"${md5(body)}"` } });
      }
      case "CompleteMultipartUpload": {
        const id = q.get("uploadId") ?? "";
        const parts = this.uploads.get(id);
        if (!parts) return xmlError(404, "NoSuchUpload");
        const numbers = [...parts.keys()].sort((a, b) => a - b);
        const all = new Uint8Array(numbers.reduce((n, p) => n + parts.get(p)!.length, 0));
        numbers.reduce((at, p) => (all.set(parts.get(p)!, at), at + parts.get(p)!.length), 0);
        const etag = `${md5(all)}-${numbers.length}`;
        this.objects.set(key, { bytes: all, etag });
        this.uploads.delete(id);
        return new Response(
          `<CompleteMultipartUploadResult><ETag>"${etag}"</ETag></CompleteMultipartUploadResult>`,
        );
      }
      case "AbortMultipartUpload":
        this.uploads.delete(q.get("uploadId") ?? "");
        return new Response(null, { status: 204 });
      default:
        return xmlError(501, "NotImplemented");
    }
  }

  #list(prefix: string, token: string | null): Response {
    const keys = [...this.objects.keys()].filter((k) => k.startsWith(prefix)).sort();
    const start = token === null ? 0 : Number(token);
    const page = keys.slice(start, start + this.pageSize);
    const more = start + this.pageSize < keys.length;
    const contents = page.map((k) =>
      `<Contents><Key>${k}</Key><ETag>"${this.objects.get(k)!.etag}"</ETag>` +
      `<Size>${this.objects.get(k)!.bytes.length}</Size></Contents>`
    );
    return new Response(
      `<ListBucketResult><IsTruncated>${more}</IsTruncated>` +
        (more ? `<NextContinuationToken>${start + this.pageSize}</NextContinuationToken>` : "") +
        `${contents.join("")}</ListBucketResult>`,
    );
  }
}

function operationOf(method: string, url: URL): string {
  const q = url.searchParams;
  const onBucket = url.pathname.split("/").filter((s) => s !== "").length === 1;
  if (method === "GET" && onBucket) return "ListObjectsV2";
  if (method === "POST" && q.has("uploads")) return "CreateMultipartUpload";
  if (method === "POST" && q.has("uploadId")) return "CompleteMultipartUpload";
  if (method === "PUT" && q.has("partNumber")) return "UploadPart";
  if (method === "DELETE" && q.has("uploadId")) return "AbortMultipartUpload";
  return { PUT: "PutObject", GET: "GetObject", HEAD: "HeadObject", DELETE: "DeleteObject" }[
    method
  ] ?? method;
}
