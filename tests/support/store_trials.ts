/**
 * Helpers of the store's crash and fault trials (tests/integration/store_crash_test.ts and
 * store_faults_test.ts): a store for the plugin under test (a directory, or versitygw directly
 * or through a proxy) with the test's own view of it, an audit of everything the store shows,
 * seeded incompressible data, the pool's datasets, and waits.
 */

import assert from "node:assert/strict";
import { Buffer } from "node:buffer";
import { createCipheriv, createHash } from "node:crypto";
import { FileStore } from "../../src/store/file_store.ts";
import { S3Store } from "../../src/store/s3_store.ts";
import { childrenNamed, childText, parseXml } from "../../src/store/s3_xml.ts";
import { type Store, StoreError } from "../../src/store/store.ts";
import type { PluginOptions } from "./plugin_process.ts";
import { type S3Server, signedFetch } from "./s3_server.ts";
import { sh, tryRun } from "./zfs_pool.ts";

export const MiB = 1024 * 1024;
/** The bucket prefix the S3 stores of the trials use. */
export const S3_PREFIX = "zfs-csi";

/** Writes a line to stderr at once (the trials' seeds and figures). */
export function print(text: string): void {
  Deno.stderr.writeSync(new TextEncoder().encode(text + "\n"));
}

export function sleep(ms: number): Promise<void> {
  return new Promise((r) => setTimeout(r, ms));
}

/** Polls `fn` until it returns a value other than undefined, or fails naming `what`. */
export async function waitFor<T>(
  what: string,
  fn: () => Promise<T | undefined>,
  timeoutMs: number,
  everyMs = 200,
): Promise<T> {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const got = await fn();
    if (got !== undefined) return got;
    if (Date.now() > deadline) {
      throw new Error(`Timed out after ${timeoutMs} ms waiting for ${what}`);
    }
    await sleep(everyMs);
  }
}

/** A store the plugin under test is started with, and the test's own view of it. */
export interface StoreUnderTest {
  readonly kind: "file" | "s3";
  /** The test's own client of the store (never through a proxy): for audits. */
  readonly store: Store;
  /** What the plugin's messages name the store by (e.g. `file:///…`, `s3://bucket`). */
  readonly names: string;
  /** The plugin's flags, permission scope and environment for this store. */
  readonly plugin: Pick<PluginOptions, "extraArgs" | "scope" | "env">;
  /** What an interrupted write may leave outside the keys: temporary files, open uploads. */
  leftovers(): Promise<string[]>;
}

/** A directory store at `dir` (made if missing). */
export async function fileStoreUnderTest(dir: string): Promise<StoreUnderTest> {
  await Deno.mkdir(dir, { recursive: true });
  return {
    kind: "file",
    store: new FileStore(dir),
    names: `file://${dir}`,
    plugin: { extraArgs: ["--store", `file://${dir}`], scope: { extraDirs: [dir] } },
    async leftovers() {
      const names: string[] = [];
      try {
        for await (const e of Deno.readDir(`${dir}/.tmp`)) names.push(`.tmp/${e.name}`);
      } catch (err) {
        if (!(err instanceof Deno.errors.NotFound)) throw err;
      }
      return names;
    },
  };
}

/**
 * The bucket of a versitygw server as a store; the plugin reaches it at `via` (a proxy in front
 * of the server) or directly.
 */
export function s3StoreUnderTest(server: S3Server, via: URL = server.endpoint): StoreUnderTest {
  const host = `${via.hostname}:${via.port}`;
  return {
    kind: "s3",
    store: new S3Store({
      endpoint: server.endpoint,
      region: server.region,
      bucket: server.bucket,
      prefix: S3_PREFIX,
      pathStyle: true,
      credentials: { accessKeyId: server.accessKeyId, secretAccessKey: server.secretAccessKey },
      retry: { baseDelayMs: 20, maxDelayMs: 100 },
    }),
    names: `s3://${server.bucket}/${S3_PREFIX}`,
    plugin: {
      extraArgs: [
        "--store",
        `s3://${server.bucket}/${S3_PREFIX}`,
        "--store-endpoint",
        `http://${host}`,
        "--store-path-style",
        "--store-region",
        server.region,
      ],
      scope: { netHosts: [host] },
      env: {
        AWS_ACCESS_KEY_ID: server.accessKeyId,
        AWS_SECRET_ACCESS_KEY: server.secretAccessKey,
      },
    },
    leftovers: () => pendingUploads(server),
  };
}

/** The server's unfinished multipart uploads (ListMultipartUploads), as keys. */
export async function pendingUploads(server: S3Server): Promise<string[]> {
  const url = new URL(`/${server.bucket}?uploads`, server.endpoint);
  const r = await signedFetch(server, "GET", url);
  const xml = await r.text();
  assert.equal(r.status, 200, xml);
  return childrenNamed(parseXml(xml), "Upload").map((u) => `upload of ${childText(u, "Key")}`);
}

/** One manifest as the audit read it (independently of the plugin's parser). */
export interface AuditedManifest {
  readonly key: string;
  /** The volume's directory in the store (`v1/volumes/<volkey>`). */
  readonly dir: string;
  readonly volume: string;
  readonly guid: string;
  readonly baseGuid: string | null;
  readonly snapshot: string;
  readonly kind: string;
  readonly csiName?: string;
  readonly stream: string;
  readonly size: number;
  readonly sha256: string;
  /** Whether a tombstone (`<guid>.deleted`) lies beside it. */
  readonly deleted: boolean;
}

/** What the store shows. */
export interface StoreAudit {
  readonly manifests: AuditedManifest[];
  /** Streams no manifest names: unfinished uploads, invisible as snapshots. */
  readonly orphanStreams: string[];
  /** Stream bytes hashed by this audit (the others were checked before, unchanged). */
  readonly hashedBytes: number;
}

/** 16 lowercase hex digits of a decimal guid, as keys carry it. */
export function guidHex(guid: string): string {
  return BigInt(guid).toString(16).padStart(16, "0");
}

/**
 * Reads everything below `v1/volumes/` and asserts the store's promise: every manifest is whole
 * JSON at its own key, its stream exists with the manifest's size, and the stream's bytes hash to
 * the manifest's SHA-256 (read back in full, unless `checked` knows the same stream at the same
 * etag); every incremental's base has a manifest. `checked` (stream key -> etag) is updated.
 */
export async function auditStore(
  store: Store,
  checked: Map<string, string> = new Map(),
): Promise<StoreAudit> {
  const objects = await store.list("v1/volumes/");
  const byKey = new Map(objects.map((o) => [o.key, o]));
  const manifests: AuditedManifest[] = [];
  let hashedBytes = 0;
  for (const obj of objects) {
    const m = /^(v1\/volumes\/[^/]+)\/snapshots\/([0-9a-f]{16})\.json$/.exec(obj.key);
    if (!m) continue;
    const [, dir, hex] = m as unknown as [string, string, string];
    const got = await store.getBytes(obj.key);
    // Removed since it was listed (a running plugin prunes): not shown any more.
    if (!got) continue;
    const text = new TextDecoder().decode(got.bytes);
    let j: Record<string, unknown>;
    try {
      j = JSON.parse(text);
    } catch (err) {
      assert.fail(`manifest ${obj.key} is not whole JSON (${err}): ${text.slice(0, 200)}`);
    }
    const guid = String(j.guid);
    assert.match(guid, /^\d+$/, `${obj.key}: guid`);
    assert.equal(guidHex(guid), hex, `${obj.key}: its key is not its guid ${guid}`);
    const stream = String(j.stream);
    assert.ok(
      stream.startsWith(`${dir}/streams/${hex}-`) && stream.endsWith(".zfs"),
      `${obj.key}: stream "${stream}" is not one of this snapshot's stream keys`,
    );
    const size = Number(j.size);
    const sha256 = String(j.sha256);
    assert.ok(Number.isSafeInteger(size) && size > 0, `${obj.key}: size ${j.size}`);
    assert.match(sha256, /^[0-9a-f]{64}$/, `${obj.key}: sha256`);
    // Pruning removes the manifest before its stream: a stream gone while its manifest is
    // still there is a broken promise, one gone with its manifest is not.
    const stillShown = async () => (await store.getBytes(obj.key)) !== undefined;
    const listed = byKey.get(stream);
    if (!listed && !(await stillShown())) continue;
    assert.ok(listed, `manifest ${obj.key} names stream ${stream}, which the store does not hold`);
    assert.equal(listed.size, size, `${stream}: ${listed.size} bytes, manifest says ${size}`);
    if (checked.get(stream) !== listed.etag) {
      const hash = createHash("sha256");
      let n = 0;
      let body;
      try {
        body = await store.getStream(stream);
      } catch (err) {
        if (err instanceof StoreError && err.kind === "not_found" && !(await stillShown())) {
          continue;
        }
        throw err;
      }
      for await (const chunk of body) {
        hash.update(chunk);
        n += chunk.length;
      }
      assert.equal(n, size, `${stream}: read back ${n} bytes, manifest says ${size}`);
      assert.equal(hash.digest("hex"), sha256, `${stream}: SHA-256 differs from its manifest's`);
      checked.set(stream, listed.etag);
      hashedBytes += n;
    }
    manifests.push({
      key: obj.key,
      dir,
      volume: String(j.volume),
      guid,
      baseGuid: j.baseGuid === null ? null : String(j.baseGuid),
      snapshot: String(j.snapshot),
      kind: String(j.kind),
      ...(typeof j.csiName === "string" ? { csiName: j.csiName } : {}),
      stream,
      size,
      sha256,
      deleted: byKey.has(`${dir}/snapshots/${hex}.deleted`),
    });
  }
  for (const m of manifests) {
    if (m.baseGuid === null || !(await store.getBytes(m.key))) continue;
    assert.ok(
      manifests.some((b) => b.dir === m.dir && b.guid === m.baseGuid),
      `${m.key} is incremental from guid ${m.baseGuid}, which has no manifest: a broken chain`,
    );
  }
  const named = new Set(manifests.map((m) => m.stream));
  const orphanStreams = objects.map((o) => o.key)
    .filter((k) => /\/streams\/[^/]+\.zfs$/.test(k) && !named.has(k));
  return { manifests, orphanStreams, hashedBytes };
}

/**
 * Writes `bytes` of seeded incompressible bytes (AES-256-CTR of zeros, keyed by `seed`) to
 * `path`, 1 MiB at a time, and syncs the file.
 */
export async function writeRandomFile(path: string, bytes: number, seed: number): Promise<void> {
  const key = createHash("sha256").update(`zfs-csi trial data ${seed}`).digest();
  const cipher = createCipheriv("aes-256-ctr", key, Buffer.alloc(16));
  const zeros = new Uint8Array(MiB);
  using file = await Deno.open(path, { write: true, create: true, truncate: true });
  for (let left = bytes; left > 0;) {
    const n = Math.min(left, MiB);
    const chunk = new Uint8Array(cipher.update(zeros.subarray(0, n)));
    for (let off = 0; off < chunk.length;) off += await file.write(chunk.subarray(off));
    left -= n;
  }
  await file.sync();
}

/** Every dataset and snapshot below `root`, with its type. */
export async function datasetsBelow(root: string): Promise<Map<string, string>> {
  const out = await sh("zfs", "list", "-H", "-r", "-t", "all", "-o", "name,type", root);
  return new Map(
    out.split("\n").filter((l) => l !== "").map((l) => l.split("\t") as [string, string]),
  );
}

/** One property value of a dataset, or undefined when it does not exist. */
export async function zfsGet(dataset: string, property: string): Promise<string | undefined> {
  const r = await tryRun("zfs", "get", "-Hp", "-o", "value", property, dataset);
  return r.code === 0 ? r.stdout.trim() : undefined;
}

/** `zfs destroy -r`, retried while zfs-fuse calls the dataset busy; a missing one is fine. */
export async function destroyTree(name: string): Promise<void> {
  for (let attempt = 0;; attempt++) {
    const r = await tryRun("zfs", "destroy", "-r", name);
    if (r.code === 0 || /does not exist/.test(r.stderr)) return;
    if (attempt >= 40 || !/busy/.test(r.stderr)) {
      throw new Error(`zfs destroy -r ${name}: ${r.stderr}`);
    }
    await sleep(250);
  }
}

/**
 * The processes (`<pid> <args>` lines) whose line holds one of `marks` (e.g. a pool's name, for
 * a killed plugin's zfs receive; `"<pid> "` for one process).
 */
export async function orphansOf(...marks: string[]): Promise<string[]> {
  // Deno reads nothing below /proc without --allow-all; ps can.
  return (await sh("ps", "-e", "-o", "pid=", "-o", "args="))
    .split("\n")
    .map((l) => l.trimStart())
    .filter((l) => l !== "" && marks.some((m) => l.includes(m)) && !l.includes(" ps -e "));
}

/**
 * Waits until no process whose command line holds one of `marks` runs (the subprocesses a
 * killed plugin left); returns how many polls it took.
 */
export async function waitForOrphans(marks: readonly string[], timeoutMs = 30_000) {
  const started = Date.now();
  let polls = 0;
  for (;;) {
    const pending = await orphansOf(...marks);
    if (pending.length === 0) return polls;
    if (Date.now() - started > timeoutMs) {
      throw new Error(`Subprocesses of the killed plugin still run:\n${pending.join("\n")}`);
    }
    polls++;
    await sleep(10);
  }
}

/** Log records of a plugin (parsed JSON lines) from index `from` on. */
export function recordsOf(lines: readonly string[], from = 0): Record<string, unknown>[] {
  return lines.slice(from).flatMap((l) => {
    try {
      return [JSON.parse(l) as Record<string, unknown>];
    } catch {
      return [];
    }
  });
}
