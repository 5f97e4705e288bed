/**
 * What the RPC being served is: its name (with the volume it is about) and whether its client
 * has gone. The gRPC layer sets it around each handler; code deep below (the per-volume lock)
 * reads it without every call site passing it along.
 */

import { AsyncLocalStorage } from "node:async_hooks";

/** The RPC a piece of code runs for. */
export interface CallContext {
  /** e.g. `NodeUnpublishVolume "pg@node-a"`: shown to calls that wait for this one. */
  readonly operation: string;
  /** Aborted when the client cancels the call or goes away. */
  readonly signal: AbortSignal;
  /** Told how long the call waited for busy locks, each time it had to wait (for the log). */
  readonly waited?: (ms: number) => void;
}

const storage = new AsyncLocalStorage<CallContext>();

/** Runs `fn`, and everything it awaits, as part of the call `ctx`. */
export function runInCall<T>(ctx: CallContext, fn: () => T): T {
  return storage.run(ctx, fn);
}

/** The call the current code runs for, if any. */
export function currentCall(): CallContext | undefined {
  return storage.getStore();
}
