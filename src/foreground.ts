/**
 * The volume calls being served (NodeStageVolume, NodePublishVolume and the rest). Background
 * work that holds the CPU in slices, a backup's or a restore's SHA-256, steps aside while any
 * runs: on a small node the hash otherwise takes the core the call's own mount and zfs commands
 * need, and a stage+publish during a 1 GiB backup took twice its time during a plain zfs send.
 */

/** A count of calls in flight. */
export class CallsInFlight {
  #count = 0;

  /** Counts a call until the returned function is called (later calls of it change nothing). */
  begin(): () => void {
    this.#count++;
    let ended = false;
    return () => {
      if (ended) return;
      ended = true;
      this.#count--;
    };
  }

  /** Whether any call is in flight. */
  get busy(): boolean {
    return this.#count > 0;
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
