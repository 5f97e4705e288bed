/**
 * The store flags (--store and its companions) resolved into a {@linkcode StoreConfig}, and the
 * store's {@linkcode Credentials}, which never reach a log line or an error message. Pure: the
 * credentials file's text comes through a reader main.ts supplies.
 */

import { pathToFileURL } from "node:url";
import { absolutePath, ConfigError, parseDuration } from "./config_values.ts";
import type { KeepPolicy } from "./store/layout.ts";
import { parseInterval, parseKeepPolicy } from "./store/policy.ts";
import { checkKey } from "./store/store.ts";

/** Region when --store-region is not given (also AWS's default). */
export const DEFAULT_STORE_REGION = "us-east-1";
/** How long a deleted volume's backups stay in the store by default. */
export const DEFAULT_STORE_DELETED_RETENTION = "30d";
/** The keep policy of volumes that set none, when --backup-keep is not given. */
export const DEFAULT_BACKUP_KEEP = "last=4,hourly=24,daily=14,weekly=8";
/** How long one CSI call may wait for the store, when --store-wait is not given. */
export const DEFAULT_STORE_WAIT = "30s";
/** The bounds of --store-wait, in seconds. */
const STORE_WAIT_RANGE = [1, 3600] as const;

const REDACTED = "[redacted]";

/**
 * An S3 access key pair and optional session token. The values are private fields read
 * through getters, so JSON.stringify, String(), Deno.inspect, node's inspect and the logger's
 * field copy (own enumerable fields only) never show them.
 */
export class Credentials {
  readonly #accessKeyId: string;
  readonly #secretAccessKey: string;
  readonly #sessionToken: string | undefined;
  /** Where they came from, for messages: "the environment" or the file's path. */
  readonly source: string;

  constructor(
    accessKeyId: string,
    secretAccessKey: string,
    sessionToken: string | undefined,
    source: string,
  ) {
    this.#accessKeyId = accessKeyId;
    this.#secretAccessKey = secretAccessKey;
    this.#sessionToken = sessionToken;
    this.source = source;
    Object.freeze(this);
  }

  get accessKeyId(): string {
    return this.#accessKeyId;
  }
  get secretAccessKey(): string {
    return this.#secretAccessKey;
  }
  get sessionToken(): string | undefined {
    return this.#sessionToken;
  }

  toJSON(): string {
    return REDACTED;
  }
  toString(): string {
    return `Credentials from ${this.source} ${REDACTED}`;
  }
  [Symbol.for("Deno.customInspect")](): string {
    return this.toString();
  }
  [Symbol.for("nodejs.util.inspect.custom")](): string {
    return this.toString();
  }
}

/** What every store has: the backup defaults of the volumes it holds. */
interface StoreDefaults {
  /** The store as the operator would write it, never with credentials: for logs. */
  readonly url: string;
  /** Seconds between backups of volumes that set no interval; 0: only volumes that set one. */
  readonly defaultBackupIntervalSeconds: number;
  /** The keep policy of volumes that set none. */
  readonly defaultBackupKeep: KeepPolicy;
  /** How long a deleted volume's backups stay in the store; 0: removed at the next prune. */
  readonly deletedRetentionSeconds: number;
  /**
   * How long one CSI call may wait for the store in all (`--store-wait`), and how long a
   * transfer may move no byte (src/store/wait.ts).
   */
  readonly waitSeconds: number;
}

/** A directory store: `file:///mnt/backup/zfs-csi`. */
export interface FileStoreConfig extends StoreDefaults {
  readonly kind: "file";
  /** Absolute, normalised; the build must read and write it (ZFS_CSI_EXTRA_DIRS). */
  readonly dir: string;
}

/** An S3-compatible bucket: `s3://bucket/prefix`. */
export interface S3StoreConfig extends StoreDefaults {
  readonly kind: "s3";
  readonly bucket: string;
  /** Key prefix inside the bucket without leading or trailing "/", or "" for the whole bucket. */
  readonly prefix: string;
  /** scheme://host[:port] without a path, e.g. "https://s3.us-east-1.amazonaws.com". */
  readonly endpoint: string;
  readonly region: string;
  /** Path-style requests (endpoint/bucket/key) instead of virtual-hosted (bucket.endpoint/key). */
  readonly pathStyle: boolean;
  /** The host:port requests go to (the bucket's host when virtual-hosted): --allow-net. */
  readonly netHost: string;
  readonly credentials: Credentials;
  /** The file the credentials came from, or undefined when from the environment. */
  readonly credentialsFile: string | undefined;
}

/** Where volumes' backups go. */
export type StoreConfig = FileStoreConfig | S3StoreConfig;

/** The store flags as given (undefined: not given). */
export interface StoreFlags {
  readonly store: string | undefined;
  readonly endpoint: string | undefined;
  readonly region: string | undefined;
  readonly pathStyle: boolean;
  readonly insecureHttp: boolean;
  readonly credentialsFile: string | undefined;
  readonly backupInterval: string | undefined;
  readonly backupKeep: string | undefined;
  readonly deletedRetention: string | undefined;
  readonly wait: string | undefined;
}

/** Reads a whole text file; main.ts passes one that checks the build may read it. */
export type ReadTextFile = (path: string) => string;

/** The environment variables the store reads; src/permissions.ts allows exactly these. */
export const STORE_ENV = [
  "AWS_ACCESS_KEY_ID",
  "AWS_SECRET_ACCESS_KEY",
  "AWS_SESSION_TOKEN",
] as const;

type Env = Readonly<Record<string, string | undefined>>;

/** A value as it may be shown in a message: any user:password@ is hidden. */
function shown(value: string): string {
  return value.replace(/\/\/[^/?#]*@/, `//${REDACTED}@`);
}

/**
 * The store of the command line, or undefined without --store (backups off).
 * @throws {ConfigError} one line naming the flag; never a credential
 */
export function resolveStore(
  flags: StoreFlags,
  env: Env,
  readTextFile: ReadTextFile,
): StoreConfig | undefined {
  const s3Only: [string, boolean][] = [
    ["--store-endpoint", flags.endpoint !== undefined],
    ["--store-region", flags.region !== undefined],
    ["--store-path-style", flags.pathStyle],
    ["--store-insecure-http", flags.insecureHttp],
    ["--store-credentials-file", flags.credentialsFile !== undefined],
  ];
  if (flags.store === undefined) {
    const given = [
      ...s3Only,
      ["--backup-interval", flags.backupInterval !== undefined] as const,
      ["--backup-keep", flags.backupKeep !== undefined] as const,
      ["--store-deleted-retention", flags.deletedRetention !== undefined] as const,
      ["--store-wait", flags.wait !== undefined] as const,
    ].find(([, set]) => set);
    if (given) throw new ConfigError(`${given[0]} needs --store (backups are off without one)`);
    return undefined;
  }
  const defaults = {
    // The same syntax as the volumes' own parameters.
    defaultBackupIntervalSeconds: parsed(
      "--backup-interval",
      parseInterval,
      flags.backupInterval ?? "0",
    ),
    defaultBackupKeep: Object.freeze(
      parsed("--backup-keep", parseKeepPolicy, flags.backupKeep ?? DEFAULT_BACKUP_KEEP),
    ),
    deletedRetentionSeconds: parseDuration(
      "--store-deleted-retention",
      flags.deletedRetention ?? DEFAULT_STORE_DELETED_RETENTION,
    ),
    waitSeconds: storeWait(flags.wait ?? DEFAULT_STORE_WAIT),
  };
  const url = flags.store;
  if (url.startsWith("file:")) {
    const wrong = s3Only.find(([, set]) => set);
    if (wrong) throw new ConfigError(`${wrong[0]} is only for s3:// stores`);
    const dir = fileStoreDir(url);
    return Object.freeze({ kind: "file", url: pathToFileURL(dir).href, dir, ...defaults });
  }
  if (url.startsWith("s3:")) return s3Store(flags, url, defaults, env, readTextFile);
  throw new ConfigError(
    `--store "${shown(url)}" is not a store: use file:///absolute/dir or s3://bucket[/prefix]`,
  );
}

function fileStoreDir(url: string): string {
  const m = /^file:\/\/(\/[^?#]*)$/.exec(url);
  let path: string | undefined;
  try {
    path = m ? decodeURIComponent(m[1]!) : undefined;
  } catch {
    // Malformed %-escapes: refused below.
  }
  if (path === undefined) {
    throw new ConfigError(`--store "${shown(url)}" is not a file:///absolute/dir URL`);
  }
  return absolutePath("--store", path);
}

const BUCKET = /^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$/;
const REGION = /^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$/;
const IP_LITERAL = /^(\d+\.\d+\.\d+\.\d+|\[.*\])$/;
/** Longest prefix: keys (src/store/store.ts) take up to 512 of S3's 1024 bytes. */
const MAX_PREFIX_BYTES = 256;

function s3Store(
  flags: StoreFlags,
  url: string,
  defaults: Omit<StoreDefaults, "url">,
  env: Env,
  readTextFile: ReadTextFile,
): S3StoreConfig {
  const m = /^s3:\/\/([^/?#]*)(\/[^?#]*)?$/.exec(url);
  if (!m) throw new ConfigError(`--store "${shown(url)}" is not an s3://bucket[/prefix] URL`);
  const bucket = m[1]!;
  if (bucket.includes("@")) {
    throw new ConfigError(
      "--store must not carry credentials: use AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY " +
        "or --store-credentials-file",
    );
  }
  if (!BUCKET.test(bucket) || bucket.includes("..")) {
    throw new ConfigError(
      `--store bucket "${bucket}" is not a valid bucket name: 3-63 lowercase letters, digits, "." and "-"`,
    );
  }
  const prefix = (m[2] ?? "").replace(/^\/+|\/+$/g, "");
  if (prefix !== "") {
    try {
      checkKey(prefix);
      if (new TextEncoder().encode(prefix).length > MAX_PREFIX_BYTES) throw new RangeError();
    } catch {
      throw new ConfigError(
        `--store prefix "${prefix}" is not valid: at most ${MAX_PREFIX_BYTES} bytes of ` +
          `"/"-separated segments of letters, digits and "._:-"`,
      );
    }
  }
  const region = flags.region ?? DEFAULT_STORE_REGION;
  if (!REGION.test(region)) {
    throw new ConfigError(`--store-region "${region}" is not valid: letters, digits and "._-"`);
  }
  const ep = endpointOf(
    flags.endpoint ?? `https://s3.${region}.amazonaws.com`,
    flags.insecureHttp,
  );
  if (!flags.pathStyle && IP_LITERAL.test(ep.hostname)) {
    throw new ConfigError(
      `--store-endpoint "${ep.origin}" is an IP address: add --store-path-style (a bucket ` +
        `cannot be a subdomain of an address)`,
    );
  }
  if (!flags.pathStyle && ep.origin.startsWith("https:") && bucket.includes(".")) {
    throw new ConfigError(
      `--store bucket "${bucket}" has a "." and needs --store-path-style over https: the ` +
        `endpoint's certificate does not cover ${bucket}.${ep.hostname}`,
    );
  }
  const host = flags.pathStyle ? ep.hostname : `${bucket}.${ep.hostname}`;
  const credentialsFile = flags.credentialsFile === undefined
    ? undefined
    : absolutePath("--store-credentials-file", flags.credentialsFile);
  const where = `s3://${bucket}${prefix === "" ? "" : `/${prefix}`}`;
  return Object.freeze({
    kind: "s3",
    url: where,
    bucket,
    prefix,
    endpoint: ep.origin,
    region,
    pathStyle: flags.pathStyle,
    netHost: `${host}:${ep.port}`,
    credentials: credentialsFile === undefined
      ? credentialsFromEnv(env, where)
      : credentialsFromFile(credentialsFile, readTextFile),
    credentialsFile,
    ...defaults,
  });
}

function endpointOf(
  text: string,
  insecureHttp: boolean,
): { origin: string; hostname: string; port: string } {
  let url: URL | undefined;
  try {
    url = new URL(text);
  } catch {
    // Refused below.
  }
  if (url && (url.username !== "" || url.password !== "")) {
    throw new ConfigError(
      "--store-endpoint must not carry credentials: use AWS_ACCESS_KEY_ID and " +
        "AWS_SECRET_ACCESS_KEY or --store-credentials-file",
    );
  }
  if (
    !url || (url.protocol !== "https:" && url.protocol !== "http:") || url.pathname !== "/" ||
    /[?#]/.test(text)
  ) {
    throw new ConfigError(
      `--store-endpoint "${shown(text)}" must be https://host[:port] (or http://), without a path`,
    );
  }
  const loopback = url.hostname === "localhost" || /^127\.\d+\.\d+\.\d+$/.test(url.hostname) ||
    url.hostname === "[::1]";
  if (url.protocol === "http:" && !loopback && !insecureHttp) {
    throw new ConfigError(
      `--store-endpoint "${url.origin}" is plain http to another host: volume data would cross ` +
        `the network unencrypted and unauthenticated; use https, or add --store-insecure-http`,
    );
  }
  if (insecureHttp && url.protocol !== "http:") {
    throw new ConfigError("--store-insecure-http is only for an http:// --store-endpoint");
  }
  const port = url.port !== "" ? url.port : url.protocol === "https:" ? "443" : "80";
  return { origin: url.origin, hostname: url.hostname, port };
}

/** Printable ASCII without spaces: what keys and tokens are, and safe in an HTTP header. */
const CREDENTIAL_VALUE = /^[\x21-\x7e]+$/;

function credentialsFromEnv(env: Env, where: string): Credentials {
  const [id, secret, token] = STORE_ENV.map((n) => env[n] === "" ? undefined : env[n]);
  if (id === undefined && secret === undefined) {
    throw new ConfigError(
      `--store ${where} needs credentials: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY ` +
        `(and AWS_SESSION_TOKEN for temporary ones), or give --store-credentials-file`,
    );
  }
  for (const [name, value] of [[STORE_ENV[0], id], [STORE_ENV[1], secret]] as const) {
    if (value === undefined) {
      throw new ConfigError(`${name} is not set, though ${STORE_ENV[0]} or ${STORE_ENV[1]} is`);
    }
  }
  for (const [name, value] of STORE_ENV.map((n, i) => [n, [id, secret, token][i]] as const)) {
    if (value !== undefined && !CREDENTIAL_VALUE.test(value)) {
      throw new ConfigError(`${name} is not valid: printable ASCII without spaces`);
    }
  }
  return new Credentials(id!, secret!, token, "the environment");
}

function credentialsFromFile(path: string, readTextFile: ReadTextFile): Credentials {
  let text: string;
  try {
    text = readTextFile(path);
  } catch (err) {
    const why = err instanceof Error ? err.message : String(err);
    throw new ConfigError(`--store-credentials-file "${path}" cannot be read: ${why}`);
  }
  return parseCredentialsText(text, path);
}

const FILE_KEYS = ["aws_access_key_id", "aws_secret_access_key", "aws_session_token"] as const;

/**
 * Credentials from the text of a file in the AWS shared credentials format: the
 * `aws_access_key_id`, `aws_secret_access_key` and optional `aws_session_token` of the
 * `[default]` section (lines before any section count as `[default]`). Other sections and keys
 * are ignored; lines starting with "#" or ";" are comments.
 * @throws {ConfigError} naming the file and the line or key, never a value
 */
export function parseCredentialsText(text: string, path: string): Credentials {
  const flag = `--store-credentials-file "${path}"`;
  const found = new Map<string, string>();
  let section = "default";
  for (const [i, raw] of text.split(/\r?\n/).entries()) {
    const line = raw.trim();
    if (line === "" || line.startsWith("#") || line.startsWith(";")) continue;
    const header = /^\[([^\]]*)\]$/.exec(line);
    const eq = line.indexOf("=");
    if (header) {
      section = header[1]!.trim();
      continue;
    }
    if (eq <= 0) {
      throw new ConfigError(`${flag}: line ${i + 1} is not "key = value" or "[section]"`);
    }
    const key = line.slice(0, eq).trim().toLowerCase();
    if (section !== "default" || !(FILE_KEYS as readonly string[]).includes(key)) continue;
    const value = line.slice(eq + 1).trim();
    if (found.has(key)) throw new ConfigError(`${flag} sets ${key} twice in [default]`);
    if (!CREDENTIAL_VALUE.test(value)) {
      throw new ConfigError(`${flag}: ${key} is not valid: printable ASCII without spaces`);
    }
    found.set(key, value);
  }
  const [id, secret, token] = FILE_KEYS.map((k) => found.get(k));
  for (const [key, value] of [[FILE_KEYS[0], id], [FILE_KEYS[1], secret]] as const) {
    if (value === undefined) throw new ConfigError(`${flag} has no ${key} in [default]`);
  }
  return new Credentials(id!, secret!, token, path);
}

/**
 * The seconds of --store-wait: 1s to 1h. Not 0 or off: a call that may wait for ever is the
 * fault this bounds (Nomad gives node calls no deadline).
 * @throws {ConfigError} naming the flag and the range
 */
function storeWait(text: string): number {
  let seconds = NaN;
  try {
    seconds = parseDuration("--store-wait", text);
  } catch {
    // Refused below, with the range.
  }
  const [min, max] = STORE_WAIT_RANGE;
  if (!(seconds >= min && seconds <= max)) {
    throw new ConfigError(`--store-wait "${text}" must be a time from 1s to 1h, such as 30s or 2m`);
  }
  return seconds;
}

/** A value read by one of src/store/policy.ts's parsers, its SyntaxError as a ConfigError. */
function parsed<T>(flag: string, parse: (text: string) => T, text: string): T {
  try {
    return parse(text);
  } catch (err) {
    throw new ConfigError(`${flag}: ${err instanceof Error ? err.message : String(err)}`);
  }
}
