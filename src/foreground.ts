/**
 * The volume calls being served (NodeStageVolume, NodePublishVolume and the rest). Background
 * work that holds the CPU in slices, a backup's or a restore's SHA-256, steps aside while any
 * runs: on a small node the hash otherwise takes the core the call's own mount and zfs commands
 * need, and a stage+publish during a 1 GiB backup took twice its time during a plain zfs send.
 */

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
