/**
 * Hashing large reads on the main thread without holding it. A SHA-256 of a 4 MiB read takes
 * about 3 ms here, and every call of every other volume (a NodeStage, a Probe) waits behind it
 * at each of its own steps; so backups and restores hash their reads in small slices and let
 * the event loop run between them. The reads stay large: a read costs far more per byte when
 * small (1 GiB in 128 KiB reads took about 25% longer to hash than in 4 MiB reads, while
 * slicing the 4 MiB reads cost nothing measurable).
 */

import type { Hash } from "node:crypto";
import { setImmediate } from "node:timers";
import { currentCall } from "../call_context.ts";
import { type CallsInFlight, volumeCalls } from "../foreground.ts";

/** Bytes hashed between two turns of the event loop: about 0.1 ms of SHA-256 here. */
export const HASH_SLICE_BYTES = 128 * 1024;

/**
 * The pause between two slices while a volume call is served: the hash then takes a slice a
 * millisecond or so (about a tenth of a core) and leaves the rest to the call.
 */
const STEP_ASIDE_MS = 1;

/** Resolves after the event loop had a turn (timers, sockets, child processes). */
function nextTurn(): Promise<void> {
  return new Promise((resolve) => setImmediate(resolve));
}

/**
 * Adds `bytes` to `hash` slice by slice, letting the event loop run between slices, and pausing
 * between them while `calls` has a call in flight other than the one this runs for
 * (src/foreground.ts).
 */
export async function updateInSlices(
  hash: Hash,
  bytes: Uint8Array,
  calls: Pick<CallsInFlight, "busyBesides"> = volumeCalls,
): Promise<void> {
  const own = currentCall();
  for (let offset = 0; offset < bytes.length; offset += HASH_SLICE_BYTES) {
    if (calls.busyBesides(own)) await new Promise((r) => setTimeout(r, STEP_ASIDE_MS));
    else if (offset > 0) await nextTurn();
    hash.update(bytes.subarray(offset, Math.min(bytes.length, offset + HASH_SLICE_BYTES)));
  }
}
