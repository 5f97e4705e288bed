/**
 * A real S3 server for tests: versitygw (https://github.com/versity/versitygw), pinned below,
 * serving a temporary directory on 127.0.0.1. The binary is built once per machine from the Go
 * module proxy into ${ZFS_CSI_CACHE:-/var/cache/zfs-csi}/versitygw-<version>/versitygw (like
 * csi-sanity and Nomad, see tests/support/go_tool.ts); without Go the tests fail and say so.
 */

import { EMPTY_SHA256, signS3Request } from "../../src/store/sigv4.ts";
import { ChildServer, ChildServerHolder } from "./child_server.ts";
import { goToolBinaries } from "./go_tool.ts";

/** The one place versitygw's version is pinned. */
export const VERSITYGW_VERSION = "v1.8.0";
const MODULE = "github.com/versity/versitygw/cmd/versitygw";
/** The region versitygw answers for (its default); requests are signed for it. */
export const S3_REGION = "us-east-1";
const START_MS = 15_000;

/**
 * The versitygw binary, built first if the cache lacks it (about 2 minutes, once); see
 * go_tool.ts.
 * @throws {Error} when Go is missing or the build fails
 */
export async function versitygwBinary(): Promise<string> {
  const bins = await goToolBinaries({
    name: "versitygw",
    version: VERSITYGW_VERSION,
    packages: [MODULE],
    neededBy: "The S3 tests",
  });
  return bins.versitygw!;
}

/** A signed request to a test server (bucket creation, raw checks in tests). */
export async function signedFetch(
  server: { readonly accessKeyId: string; readonly secretAccessKey: string },
  method: string,
  url: URL,
  headers: Record<string, string> = {},
): Promise<Response> {
  const signed = signS3Request(
    { method, url, headers, payloadHash: EMPTY_SHA256, region: S3_REGION },
    server,
  );
  return await fetch(url, { method, headers: signed });
}

/** A running versitygw on a temporary directory, with one empty bucket. */
export class S3Server extends ChildServerHolder {
  /** e.g. http://127.0.0.1:40123 (path-style addressing). */
  readonly endpoint: URL;
  readonly bucket: string;
  readonly accessKeyId: string;
  readonly secretAccessKey: string;
  readonly region = S3_REGION;
  /** The directory versitygw serves (buckets are its subdirectories). */
  readonly dir: string;

  private constructor(
    fields: { bucket: string; accessKeyId: string; secretAccessKey: string },
    server: ChildServer,
  ) {
    super(server);
    this.endpoint = server.url;
    this.bucket = fields.bucket;
    this.accessKeyId = fields.accessKeyId;
    this.secretAccessKey = fields.secretAccessKey;
    this.dir = server.dir;
  }

  /** Starts versitygw (building it first if needed) and creates the bucket. */
  static async start(options: { bucket?: string } = {}): Promise<S3Server> {
    const bin = await versitygwBinary();
    const dir = await Deno.makeTempDir({ prefix: "zfs-csi-s3-" });
    const accessKeyId = `test${crypto.randomUUID().slice(0, 8)}`;
    const secretAccessKey = crypto.randomUUID();
    const bucket = options.bucket ?? "zfs-csi-test";
    const server = await ChildServer.start({
      name: "versitygw",
      bin,
      dir,
      args: (port) => [
        "--access",
        accessKeyId,
        "--secret",
        secretAccessKey,
        "--port",
        `127.0.0.1:${port}`,
        "posix",
        dir,
      ],
      probe: async (endpoint) => {
        // Any answer (403 without a signature) means it listens.
        const r = await fetch(endpoint, { signal: AbortSignal.timeout(1000) });
        await r.body?.cancel();
        return true;
      },
      notReady: "did not answer on",
      startMs: START_MS,
      pollMs: 100,
      afterReady: (endpoint) =>
        createBucket({ accessKeyId, secretAccessKey }, new URL(`/${bucket}`, endpoint), bucket),
    });
    return new S3Server({ bucket, accessKeyId, secretAccessKey }, server);
  }
}

async function createBucket(
  keys: { readonly accessKeyId: string; readonly secretAccessKey: string },
  url: URL,
  bucket: string,
): Promise<void> {
  const r = await signedFetch(keys, "PUT", url);
  const body = await r.text();
  if (!r.ok) throw new Error(`Creating bucket ${bucket} answered ${r.status}: ${body}`);
}
