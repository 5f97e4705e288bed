/**
 * The volume calls being served (NodeStageVolume, NodePublishVolume and the rest). Background
 * work steps aside while any runs: the hashing of a backup or a restore holds the CPU in slices
 * (src/store/hash_slices.ts), and a transfer through a pipe and a socket (an upload to S3, a
 * download into zfs receive) slows to {@linkcode STEP_ASIDE_BYTES_PER_SECOND}. On a small node
 * a transfer at full speed takes the cores the call's own mount and zfs commands need (zfs-fuse's
 * daemon sending, the store's server receiving): a stage+publish during a 1 GiB backup to S3
 * took 1.5 times its time during a plain zfs send.
 */

import { currentCall } from "./call_context.ts";

/** The calls in flight, each known by its call context (src/call_context.ts). */
export class CallsInFlight {
  readonly #calls = new Set<object>();

  /** Counts `call` until the returned function is called. */
  begin(call: object): () => void {
    this.#calls.add(call);
    return () => void this.#calls.delete(call);
  }

  /**
   * Whether a call other than `own` is in flight: work a call does for itself (a follow
   * volume's stage receiving its data) does not step aside for that same call.
   */
  busyBesides(own: object | undefined): boolean {
    return this.#calls.size > (own !== undefined && this.#calls.has(own) ? 1 : 0);
  }
}

/** The plugin's volume calls: counted by the gRPC layer, read by the hashing. */
export const volumeCalls = new CallsInFlight();

/** Methods that count as volume calls: what Nomad waits on to start or stop an allocation. */
export const VOLUME_CALL_METHODS: ReadonlySet<string> = new Set([
  "NodeStageVolume",
  "NodePublishVolume",
  "NodeUnpublishVolume",
  "NodeUnstageVolume",
  "NodeExpandVolume",
]);

/**
 * How fast a transfer moves while a volume call other than its own is served: about a tenth of
 * what one backup to S3 moves here at full speed, so the call gets the cores, and a transfer
 * under calls that never stop still goes on.
 */
export const STEP_ASIDE_BYTES_PER_SECOND = 16 * 1024 * 1024;

/** Whether a volume call other than the one the current code runs for is in flight. */
export function servingOthers(calls: Pick<CallsInFlight, "busyBesides"> = volumeCalls): boolean {
  return calls.busyBesides(currentCall());
}

/** The longest single pause: a call that ends meanwhile is noticed this soon after. */
const MAX_PAUSE_MS = 50;

/**
 * After a transfer moved `bytes` (read them from zfs send, a download; or before it writes them
 * to a socket): a pause as long as those bytes take at {@linkcode STEP_ASIDE_BYTES_PER_SECOND}
 * while `calls` has a call in flight other than the one the transfer runs for, in steps of at
 * most {@linkcode MAX_PAUSE_MS}, ending early when the calls end. No pause (and no timer)
 * otherwise.
 * @returns whether it paused
 */
export async function stepAside(
  bytes: number,
  calls: Pick<CallsInFlight, "busyBesides"> = volumeCalls,
): Promise<boolean> {
  const own = currentCall();
  if (!calls.busyBesides(own)) return false;
  let left = (bytes / STEP_ASIDE_BYTES_PER_SECOND) * 1000;
  while (left > 0 && calls.busyBesides(own)) {
    const ms = Math.min(left, MAX_PAUSE_MS);
    await new Promise((resolve) => setTimeout(resolve, ms));
    left -= ms;
  }
  return true;
}
