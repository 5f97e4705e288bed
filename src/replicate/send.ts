/**
 * `zfs send` straight into the store: the stream is counted and hashed on its way and never
 * held whole in memory; each side waits for the other (backpressure), so memory stays bounded
 * by a few chunks whatever the volume's size.
 */

import { createHash } from "node:crypto";
import type { ZfsError } from "../errors.ts";
import type { Logger } from "../log.ts";
import type { StreamRunner } from "../run.ts";
import { type Store, StoreError } from "../store/store.ts";
import { sendArgs } from "../zfs/args.ts";
import { streamedZfsError } from "./zfs_stream.ts";

/** What {@linkcode sendToStore} works with. */
export interface SendDeps {
  readonly streams: StreamRunner;
  readonly zfsPath: string;
  readonly store: Store;
  readonly log: Logger;
}

/** One stream to send and where it goes. */
export interface SendToStoreSpec {
  /** The snapshot to send, `<dataset>@<name>`. */
  readonly snapshot: string;
  /** The snapshot it is incremental from (full name); a full stream without. */
  readonly base?: string;
  /** `zfs send -w` (an encrypted dataset, OpenZFS). */
  readonly raw: boolean;
  /** The stream's store key (layout.ts streamKey: unique to this upload). */
  readonly key: string;
  /** Stops zfs send and the upload; nothing becomes visible in the store. */
  readonly signal?: AbortSignal;
}

/** The stored stream's size and SHA-256 (lowercase hex), as the manifest records them. */
export interface SentStream {
  readonly size: number;
  readonly sha256: string;
}

/**
 * Sends a snapshot (or the changes since `base`) to the store at `spec.key`. If zfs send fails,
 * the upload fails with it and leaves no object; if the store fails, zfs send is killed.
 * @throws {ZfsError} classified from zfs's stderr when zfs send fails
 * @throws {StoreError} when the store fails
 * @throws the signal's reason when aborted
 */
export async function sendToStore(deps: SendDeps, spec: SendToStoreSpec): Promise<SentStream> {
  const { signal } = spec;
  signal?.throwIfAborted();
  const argv = [
    deps.zfsPath,
    ...sendArgs({ snapshot: spec.snapshot, raw: spec.raw, ...(spec.base && { base: spec.base }) }),
  ];
  const log = deps.log.child({ snapshot: spec.snapshot, key: spec.key });
  const started = performance.now();
  log.debug("send started", { argv });
  const child = deps.streams.spawn(argv, { stdout: "piped", ...(signal && { signal }) });
  const hash = createHash("sha256");
  let size = 0;
  let zfsFailure: ZfsError | undefined;
  const counted = child.stdout!.pipeThrough(
    new TransformStream<Uint8Array, Uint8Array>({
      transform(chunk, controller) {
        hash.update(chunk);
        size += chunk.length;
        controller.enqueue(chunk);
      },
      // Only a zfs send that exited 0 sent a whole stream: otherwise the body errors, so the
      // store drops the upload instead of keeping a truncated object.
      async flush() {
        const exit = await child.exit;
        if (exit.code !== 0) throw zfsFailure = streamedZfsError(argv, exit);
      },
    }),
  );
  let put;
  try {
    put = await deps.store.putStream(spec.key, counted, signal ? { signal } : {});
  } catch (err) {
    child.kill();
    // A store that failed before reading the body left zfs's stdout open.
    await counted.cancel().catch(() => {});
    await child.exit;
    signal?.throwIfAborted();
    throw zfsFailure ?? err;
  }
  const exit = await child.exit;
  if (exit.code !== 0 || put.size !== size) {
    // A store that kept a body it did not read to its end: take the object back.
    await deps.store.delete(spec.key);
    throw exit.code !== 0 ? streamedZfsError(argv, exit) : new StoreError(
      "invalid",
      `${deps.store.description} stored ${put.size} bytes at "${spec.key}" of the ${size} sent`,
    );
  }
  const sha256 = hash.digest("hex");
  log.info("send stored", { size, sha256, ms: Math.round(performance.now() - started) });
  return { size, sha256 };
}
