/**
 * A real S3 server for tests: versitygw (https://github.com/versity/versitygw), pinned below,
 * serving a temporary directory on 127.0.0.1. The binary is built once per machine from the Go
 * module proxy into ${ZFS_CSI_CACHE:-/var/cache/zfs-csi}/versitygw-<version>/versitygw (like
 * csi-sanity and Nomad, see tests/conformance/csi_sanity.sh); without Go the tests fail and say
 * so.
 */

import { EMPTY_SHA256, signS3Request } from "../../src/store/sigv4.ts";

/** The one place versitygw's version is pinned. */
export const VERSITYGW_VERSION = "v1.8.0";
const MODULE = "github.com/versity/versitygw/cmd/versitygw";
/** The region versitygw answers for (its default); requests are signed for it. */
export const S3_REGION = "us-east-1";
const START_MS = 15_000;

function cacheDir(): string {
  return `${Deno.env.get("ZFS_CSI_CACHE") || "/var/cache/zfs-csi"}/versitygw-${VERSITYGW_VERSION}`;
}

async function exists(path: string): Promise<boolean> {
  try {
    await Deno.stat(path);
    return true;
  } catch (e) {
    if (e instanceof Deno.errors.NotFound) return false;
    throw e;
  }
}

/** The Go toolchain on PATH or in /usr/local/go/bin. */
async function findGo(): Promise<string | undefined> {
  for (const dir of (Deno.env.get("PATH") ?? "").split(":").concat("/usr/local/go/bin")) {
    if (dir !== "" && await exists(`${dir}/go`)) return `${dir}/go`;
  }
  return undefined;
}

/**
 * The versitygw binary, built first if the cache lacks it (about 2 minutes, once). Concurrent
 * test processes wait on a lock file for one build.
 * @throws {Error} when Go is missing or the build fails
 */
export async function versitygwBinary(): Promise<string> {
  const dir = cacheDir();
  const bin = `${dir}/versitygw`;
  if (await exists(bin)) return bin;
  await Deno.mkdir(dir, { recursive: true });
  using lock = await Deno.open(`${dir}/.build.lock`, { create: true, write: true });
  await lock.lock(true);
  if (await exists(bin)) return bin;
  const go = await findGo();
  if (go === undefined) {
    throw new Error(
      `The S3 tests need versitygw ${VERSITYGW_VERSION}, built from the Go module proxy, and Go ` +
        `(1.25+) is needed to build it: none on PATH or in /usr/local/go/bin. Install Go, or ` +
        `put a built versitygw at ${bin}`,
    );
  }
  const build = await Deno.makeTempDir({ dir, prefix: "build." });
  try {
    const out = await new Deno.Command(go, {
      args: ["install", `${MODULE}@${VERSITYGW_VERSION}`],
      env: { GOBIN: build, GOTOOLCHAIN: "local", GOFLAGS: "-buildvcs=false" },
      stdout: "piped",
      stderr: "piped",
    }).output();
    if (!out.success) {
      throw new Error(
        `Building versitygw ${VERSITYGW_VERSION} with ${go} failed:\n` +
          new TextDecoder().decode(out.stderr).slice(-4000),
      );
    }
    // A rename in one directory: other processes see no binary or a whole one.
    await Deno.rename(`${build}/versitygw`, bin);
  } finally {
    await Deno.remove(build, { recursive: true }).catch(() => {});
  }
  return bin;
}

/** A port that was free a moment ago on 127.0.0.1. */
function freePort(): number {
  const listener = Deno.listen({ hostname: "127.0.0.1", port: 0 });
  const port = listener.addr.port;
  listener.close();
  return port;
}

/** Keeps the last bytes a child wrote, for error messages. */
async function tail(stream: ReadableStream<Uint8Array>, into: { text: string }): Promise<void> {
  const decoder = new TextDecoder();
  for await (const chunk of stream) {
    into.text = (into.text + decoder.decode(chunk, { stream: true })).slice(-8000);
  }
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
export class S3Server implements AsyncDisposable {
  /** e.g. http://127.0.0.1:40123 (path-style addressing). */
  readonly endpoint: URL;
  readonly bucket: string;
  readonly accessKeyId: string;
  readonly secretAccessKey: string;
  readonly region = S3_REGION;
  /** The directory versitygw serves (buckets are its subdirectories). */
  readonly dir: string;
  readonly #child: Deno.ChildProcess;
  readonly #output: { text: string };
  readonly #drained: Promise<unknown>;

  private constructor(
    fields: { endpoint: URL; bucket: string; accessKeyId: string; secretAccessKey: string },
    dir: string,
    child: Deno.ChildProcess,
    output: { text: string },
    drained: Promise<unknown>,
  ) {
    this.endpoint = fields.endpoint;
    this.bucket = fields.bucket;
    this.accessKeyId = fields.accessKeyId;
    this.secretAccessKey = fields.secretAccessKey;
    this.dir = dir;
    this.#child = child;
    this.#output = output;
    this.#drained = drained;
  }

  /** Starts versitygw (building it first if needed) and creates the bucket. */
  static async start(options: { bucket?: string } = {}): Promise<S3Server> {
    const bin = await versitygwBinary();
    const dir = await Deno.makeTempDir({ prefix: "zfs-csi-s3-" });
    const accessKeyId = `test${crypto.randomUUID().slice(0, 8)}`;
    const secretAccessKey = crypto.randomUUID();
    const bucket = options.bucket ?? "zfs-csi-test";
    for (let attempt = 1;; attempt++) {
      const port = freePort();
      const child = new Deno.Command(bin, {
        args: [
          "--access",
          accessKeyId,
          "--secret",
          secretAccessKey,
          "--port",
          `127.0.0.1:${port}`,
          "posix",
          dir,
        ],
        stdin: "null",
        stdout: "piped",
        stderr: "piped",
      }).spawn();
      const output = { text: "" };
      const drained = Promise.all([tail(child.stdout, output), tail(child.stderr, output)]);
      const endpoint = new URL(`http://127.0.0.1:${port}`);
      const server = new S3Server(
        { endpoint, bucket, accessKeyId, secretAccessKey },
        dir,
        child,
        output,
        drained,
      );
      try {
        await server.#waitUntilAnswering();
        await server.#createBucket();
        return server;
      } catch (e) {
        await server.#kill();
        // Another process may have taken the port between our check and versitygw's bind.
        if (attempt >= 3) {
          await Deno.remove(dir, { recursive: true }).catch(() => {});
          throw e;
        }
      }
    }
  }

  async #waitUntilAnswering(): Promise<void> {
    let exited = false;
    this.#child.status.then(() => exited = true);
    const deadline = Date.now() + START_MS;
    while (Date.now() < deadline && !exited) {
      try {
        // Any answer (403 without a signature) means it listens.
        const r = await fetch(this.endpoint, { signal: AbortSignal.timeout(1000) });
        await r.body?.cancel();
        return;
      } catch {
        await new Promise((r) => setTimeout(r, 100));
      }
    }
    throw new Error(
      `versitygw did not answer on ${this.endpoint} (${exited ? "it exited" : "timed out"}):\n` +
        this.#output.text,
    );
  }

  async #createBucket(): Promise<void> {
    const r = await signedFetch(this, "PUT", new URL(`/${this.bucket}`, this.endpoint));
    const body = await r.text();
    if (!r.ok) throw new Error(`Creating bucket ${this.bucket} answered ${r.status}: ${body}`);
  }

  /** What versitygw printed last (its request log and errors). */
  get output(): string {
    return this.#output.text;
  }

  async #kill(): Promise<void> {
    try {
      this.#child.kill("SIGTERM");
    } catch {
      // Already gone.
    }
    await this.#child.status;
    await this.#drained;
  }

  /** Stops versitygw and removes its directory. */
  async stop(): Promise<void> {
    await this.#kill();
    await Deno.remove(this.dir, { recursive: true }).catch(() => {});
  }

  async [Symbol.asyncDispose](): Promise<void> {
    await this.stop();
  }
}
