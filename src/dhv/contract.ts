/**
 * Nomad's dynamic host volume contract, as Nomad 1.10/1.11 runs a plugin
 * (client/hostvolumemanager/host_volume_plugin.go): argv[1] is the operation, the environment is
 * replaced by `DHV_*` variables, stdout carries one JSON object, a non-zero exit is a failure.
 * This module reads and checks the variables; nothing here runs zfs.
 */

import { Code, CsiError, ZfsError } from "../errors.ts";
import { DHV_ENV } from "../host_volume_env.ts";

/** The operations Nomad runs a plugin with. */
export const OPERATIONS = ["fingerprint", "create", "delete"] as const;
/** One of {@linkcode OPERATIONS}. */
export type Operation = typeof OPERATIONS[number];

/** The environment as the plugin may read it. */
export type DhvEnv = Readonly<Partial<Record<typeof DHV_ENV[number], string>>>;

/** Exit code of a call that succeeded. */
export const EXIT_OK = 0;
/** Exit code of an operation that failed or was refused (zfs, a conflict, a volume in use). */
export const EXIT_FAILED = 1;
/**
 * Exit code of a call that is wrong as made: a variable missing or malformed, parameters that
 * are not JSON or not allowed, a capacity that cannot be had, no usable configuration.
 */
export const EXIT_BAD_REQUEST = 2;

/** A refusal with the exit code it ends the process with. */
export class DhvError extends Error {
  readonly exitCode: number;

  constructor(exitCode: number, message: string, options?: ErrorOptions) {
    super(message, options);
    this.name = "DhvError";
    this.exitCode = exitCode;
  }
}

/** What identifies a volume in every create and delete call. */
export interface VolumeIdentity {
  /** Nomad's volume id (a UUID): the mount path's last component. */
  readonly id: string;
  /** Empty only in the delete Nomad runs after it failed to save a first create. */
  readonly name: string;
  /** Empty only in that same delete. */
  readonly namespace: string;
  readonly volumesDir: string;
  /** Where the volume is mounted: `<volumes dir>/<id>`, built here, never taken from Nomad. */
  readonly path: string;
  readonly pluginDir: string;
  readonly nodeId: string;
  /** The volume spec's parameters. */
  readonly parameters: Readonly<Record<string, string>>;
}

/** A create call. */
export interface CreateRequest extends VolumeIdentity {
  /** `capacity_min` in bytes; 0: not given. */
  readonly minBytes: number;
  /** `capacity_max` in bytes; 0: not given. */
  readonly maxBytes: number;
}

/** A delete call. */
export interface DeleteRequest extends VolumeIdentity {
  /** What Nomad says create returned; informative only (it may be the volumes dir). */
  readonly createdPath: string;
}

function bad(message: string): DhvError {
  return new DhvError(EXIT_BAD_REQUEST, message);
}

function need(env: DhvEnv, name: typeof DHV_ENV[number]): string {
  const value = env[name];
  if (value === undefined || value === "") {
    throw bad(
      `${name} is not set: this operation is meant to be run by Nomad as a dynamic host ` +
        `volume plugin, which sets it`,
    );
  }
  return value;
}

/** Nomad's rule for namespace names (nomad/structs: validNamespaceName). */
const NAMESPACE = /^[a-zA-Z0-9-]{1,128}$/;
/** A volume id as a single path component: Nomad's are UUIDs. */
const VOLUME_ID = /^[A-Za-z0-9][A-Za-z0-9_-]{0,127}$/;
// deno-lint-ignore no-control-regex
const CONTROL = /[\u0000-\u001f\u007f]/;

/**
 * An absolute, normalized directory: no "." or ".." parts, no doubled or trailing "/", no control
 * characters. Nothing is resolved; a path that needs resolving is refused.
 * @throws {DhvError} EXIT_BAD_REQUEST naming the variable
 */
export function checkDirectory(name: string, dir: string): string {
  const parts = dir.split("/").slice(1);
  if (
    !dir.startsWith("/") || CONTROL.test(dir) ||
    (dir !== "/" && parts.some((p) => p === "" || p === "." || p === ".."))
  ) {
    throw bad(`${name}="${dir}" is not an absolute, normalized directory`);
  }
  return dir;
}

/** The mount path of volume `id`: always `<volumes dir>/<id>`. */
export function volumePath(volumesDir: string, id: string): string {
  return volumesDir === "/" ? `/${id}` : `${volumesDir}/${id}`;
}

/**
 * Parses DHV_PARAMETERS: a JSON object of strings (Nomad marshals the spec's map; an empty spec
 * gives "{}" or "null").
 * @throws {DhvError} EXIT_BAD_REQUEST for anything else
 */
export function parseParametersJson(text: string | undefined): Record<string, string> {
  if (text === undefined || text === "" || text === "null") return {};
  let value: unknown;
  try {
    value = JSON.parse(text);
  } catch (err) {
    throw bad(`DHV_PARAMETERS is not valid JSON: ${(err as Error).message}`);
  }
  if (typeof value !== "object" || value === null || Array.isArray(value)) {
    throw bad(`DHV_PARAMETERS must be a JSON object of strings, not ${JSON.stringify(value)}`);
  }
  const out: Record<string, string> = {};
  for (const [k, v] of Object.entries(value)) {
    if (typeof v !== "string") {
      throw bad(`DHV_PARAMETERS: parameter "${k}" must be a string, not ${JSON.stringify(v)}`);
    }
    out[k] = v;
  }
  return out;
}

/**
 * A byte count as Nomad prints it (decimal; "0" when not given).
 * @throws {DhvError} EXIT_BAD_REQUEST for anything else
 */
export function parseBytesVariable(name: string, text: string | undefined): number {
  if (text === undefined || text === "") return 0;
  const n = Number(text);
  if (!/^\d{1,16}$/.test(text) || !Number.isSafeInteger(n)) {
    throw bad(`${name}="${text}" is not a number of bytes`);
  }
  return n;
}

/**
 * The operation from argv and DHV_OPERATION, which must agree.
 * @throws {DhvError} EXIT_BAD_REQUEST when they do not
 */
export function operationOf(args: readonly string[], env: DhvEnv): Operation {
  const op = args[0] ?? "";
  if (!(OPERATIONS as readonly string[]).includes(op)) {
    throw bad(`"${op}" is not a host volume operation (${OPERATIONS.join(", ")})`);
  }
  const declared = need(env, "DHV_OPERATION");
  if (declared !== op) {
    throw bad(`DHV_OPERATION="${declared}" does not match the operation argument "${op}"`);
  }
  return op as Operation;
}

function identity(env: DhvEnv, named: boolean): VolumeIdentity {
  const id = need(env, "DHV_VOLUME_ID");
  if (!VOLUME_ID.test(id)) {
    throw bad(`DHV_VOLUME_ID="${id}" is not a volume id (letters, digits, "-" and "_")`);
  }
  const volumesDir = checkDirectory("DHV_VOLUMES_DIR", need(env, "DHV_VOLUMES_DIR"));
  const name = named ? need(env, "DHV_VOLUME_NAME") : env.DHV_VOLUME_NAME ?? "";
  const namespace = named ? need(env, "DHV_NAMESPACE") : env.DHV_NAMESPACE ?? "";
  if (namespace !== "" && !NAMESPACE.test(namespace)) {
    throw bad(`DHV_NAMESPACE="${namespace}" is not a Nomad namespace name`);
  }
  if (CONTROL.test(name)) {
    throw bad(`DHV_VOLUME_NAME ${JSON.stringify(name)} has control characters`);
  }
  const pluginDir = env.DHV_PLUGIN_DIR ?? "";
  return {
    id,
    name,
    namespace,
    volumesDir,
    path: volumePath(volumesDir, id),
    pluginDir: pluginDir === "" ? "" : checkDirectory("DHV_PLUGIN_DIR", pluginDir),
    nodeId: env.DHV_NODE_ID ?? "",
    parameters: parseParametersJson(env.DHV_PARAMETERS),
  };
}

/**
 * A create call's variables, checked.
 * @throws {DhvError} EXIT_BAD_REQUEST naming the variable that is missing or malformed
 */
export function createRequest(env: DhvEnv): CreateRequest {
  const base = identity(env, true);
  const minBytes = parseBytesVariable("DHV_CAPACITY_MIN_BYTES", env.DHV_CAPACITY_MIN_BYTES);
  const maxBytes = parseBytesVariable("DHV_CAPACITY_MAX_BYTES", env.DHV_CAPACITY_MAX_BYTES);
  if (maxBytes > 0 && minBytes > maxBytes) {
    throw bad(
      `capacity_min (${minBytes} bytes) is above capacity_max (${maxBytes} bytes)`,
    );
  }
  return { ...base, minBytes, maxBytes };
}

/**
 * A delete call's variables, checked. Name and namespace may be empty: Nomad sends neither in
 * the delete that follows a first create it failed to save.
 * @throws {DhvError} EXIT_BAD_REQUEST naming the variable that is missing or malformed
 */
export function deleteRequest(env: DhvEnv): DeleteRequest {
  return { ...identity(env, false), createdPath: env.DHV_CREATED_PATH ?? "" };
}

/**
 * The exit code a failure ends the process with: bad input (INVALID_ARGUMENT, OUT_OF_RANGE, a
 * value zfs refuses) is {@linkcode EXIT_BAD_REQUEST}, anything else {@linkcode EXIT_FAILED}.
 */
export function exitCodeOf(err: unknown): number {
  if (err instanceof DhvError) return err.exitCode;
  if (
    err instanceof CsiError &&
    (err.code === Code.INVALID_ARGUMENT || err.code === Code.OUT_OF_RANGE)
  ) {
    return EXIT_BAD_REQUEST;
  }
  // zfs refused a value (a property this ZFS does not know or take): the request is wrong here.
  if (err instanceof ZfsError && (err.kind === "invalid" || err.kind === "unsupported")) {
    return EXIT_BAD_REQUEST;
  }
  return EXIT_FAILED;
}

/** What create prints on stdout: the path Nomad bind-mounts and the volume's size. */
export function createOutput(path: string, bytes: number): string {
  return JSON.stringify({ path, bytes });
}

/** What a failed create or delete prints on stdout; Nomad appends `error` to its message. */
export function errorOutput(message: string): string {
  return JSON.stringify({ error: message });
}
