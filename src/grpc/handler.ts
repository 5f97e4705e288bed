/**
 * Turns an async CSI handler into a grpc-js unary handler: one log line per call with the
 * method, volume id, paths, duration and status code, and the single error-to-status mapping.
 */

import type * as grpc from "@grpc/grpc-js";
import { runInCall } from "../call_context.ts";
import { Code, codeName, CsiError, toGrpcStatus, ZfsError } from "../errors.ts";
import { VOLUME_CALL_METHODS, volumeCalls } from "../foreground.ts";
import type { Logger } from "../log.ts";

/** An async handler of one RPC. */
export type AsyncHandler = (request: never) => Promise<unknown>;

/** Told about every answered call (the metrics): method, status name ("OK"...), seconds. */
export type CallObserver = (method: string, code: string, seconds: number) => void;

/** Calls that fingerprinting repeats every few seconds: logged at debug unless they fail. */
const CHATTY = new Set([
  "Probe",
  "GetPluginInfo",
  "GetPluginCapabilities",
  "NodeGetInfo",
  "NodeGetCapabilities",
  "ControllerGetCapabilities",
]);

/** Request fields that identify what a call is about; secrets are never among them. */
function requestFields(req: Record<string, unknown>): Record<string, unknown> {
  const out: Record<string, unknown> = {};
  const pick: Record<string, string> = {
    volume_id: "volumeId",
    staging_target_path: "stagingTargetPath",
    target_path: "targetPath",
    volume_path: "volumePath",
    name: "name",
    snapshot_id: "snapshotId",
    source_volume_id: "sourceVolumeId",
  };
  for (const [field, key] of Object.entries(pick)) {
    const v = req[field];
    if (typeof v === "string" && v !== "") out[key] = v;
  }
  return out;
}

/** How a call names itself to calls that wait for it: the method and what it is about. */
function operation(method: string, fields: Record<string, unknown>): string {
  const about = fields.volumeId ?? fields.name ?? fields.sourceVolumeId ?? fields.snapshotId;
  return typeof about === "string" ? `${method} "${about}"` : method;
}

/**
 * Wraps `fn` as the grpc-js handler of `method`. `fn` runs inside a call context
 * (src/call_context.ts) whose signal aborts when the client cancels the call or goes away, so a
 * call still waiting for a volume's lock stops waiting. `observe` hears of every answer.
 */
export function unary(
  method: string,
  fn: AsyncHandler,
  log: Logger,
  observe?: CallObserver,
): grpc.handleUnaryCall<Record<string, unknown>, unknown> {
  return (call, callback) => {
    const started = performance.now();
    const req = call.request ?? {};
    const fields = { method, ...requestFields(req) };
    const cancelled = new AbortController();
    // grpc-js emits "cancelled" when the client cancels, its deadline passes or it disconnects.
    if (typeof call.on === "function") {
      call.on("cancelled", () => cancelled.abort(new Error(`${method} cancelled by the client`)));
    }
    let lockWaitMs = 0;
    const ctx = {
      operation: operation(method, fields),
      signal: cancelled.signal,
      waited: (ms: number) => void (lockWaitMs += ms),
    };
    // Logged only for calls that had to wait for another call on the same volume.
    const waitField = () => lockWaitMs > 0 ? { lockWaitMs: Math.round(lockWaitMs * 10) / 10 } : {};
    // Backups and restores hash more slowly while it runs (src/foreground.ts).
    const ended = VOLUME_CALL_METHODS.has(method) ? volumeCalls.begin(ctx) : () => {};
    let result: Promise<unknown>;
    try {
      result = runInCall(ctx, () => (fn as (r: unknown) => Promise<unknown>)(req));
    } catch (err) {
      result = Promise.reject(err);
    }
    result.finally(ended).catch(() => {});
    result.then(
      (response) => {
        const durationMs = Math.round((performance.now() - started) * 10) / 10;
        const line = { ...fields, durationMs, ...waitField(), code: "OK" };
        if (CHATTY.has(method)) log.debug("rpc", line);
        else log.info("rpc", line);
        observe?.(method, "OK", durationMs / 1000);
        callback(null, response);
      },
      (err: unknown) => {
        const status = toGrpcStatus(err);
        const durationMs = Math.round((performance.now() - started) * 10) / 10;
        const line = {
          ...fields,
          durationMs,
          ...waitField(),
          code: codeName(status.code),
          error: status.details,
        };
        if (status.code === Code.INTERNAL && !(err instanceof CsiError)) {
          log.error("rpc", { ...line, cause: describe(err) });
        } else {
          log.warn("rpc", err instanceof ZfsError ? { ...line, argv: err.argv } : line);
        }
        observe?.(method, line.code, durationMs / 1000);
        callback({ code: status.code, details: status.details }, null);
      },
    );
  };
}

function describe(err: unknown): unknown {
  if (err instanceof Error) return { name: err.name, message: err.message, stack: err.stack };
  return String(err);
}
