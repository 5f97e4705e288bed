/**
 * Turns an async CSI handler into a grpc-js unary handler: one log line per call with the
 * method, volume id, paths, duration and status code, and the single error-to-status mapping.
 */

import type * as grpc from "@grpc/grpc-js";
import { Code, codeName, CsiError, toGrpcStatus, ZfsError } from "../errors.ts";
import type { Logger } from "../log.ts";

/** An async handler of one RPC. */
export type AsyncHandler = (request: never) => Promise<unknown>;

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

/** Wraps `fn` as the grpc-js handler of `method`. */
export function unary(
  method: string,
  fn: AsyncHandler,
  log: Logger,
): grpc.handleUnaryCall<Record<string, unknown>, unknown> {
  return (call, callback) => {
    const started = performance.now();
    const req = call.request ?? {};
    const fields = { method, ...requestFields(req) };
    let result: Promise<unknown>;
    try {
      result = (fn as (r: unknown) => Promise<unknown>)(req);
    } catch (err) {
      result = Promise.reject(err);
    }
    result.then(
      (response) => {
        const durationMs = Math.round((performance.now() - started) * 10) / 10;
        const line = { ...fields, durationMs, code: "OK" };
        if (CHATTY.has(method)) log.debug("rpc", line);
        else log.info("rpc", line);
        callback(null, response);
      },
      (err: unknown) => {
        const status = toGrpcStatus(err);
        const durationMs = Math.round((performance.now() - started) * 10) / 10;
        const line = { ...fields, durationMs, code: codeName(status.code), error: status.details };
        if (status.code === Code.INTERNAL && !(err instanceof CsiError)) {
          log.error("rpc", { ...line, cause: describe(err) });
        } else {
          log.warn("rpc", err instanceof ZfsError ? { ...line, argv: err.argv } : line);
        }
        callback({ code: status.code, details: status.details }, null);
      },
    );
  };
}

function describe(err: unknown): unknown {
  if (err instanceof Error) return { name: err.name, message: err.message, stack: err.stack };
  return String(err);
}
