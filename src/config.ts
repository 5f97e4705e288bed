/**
 * Command-line flags and environment, resolved once into a frozen {@linkcode Config}. The only
 * module that interprets Deno.args and the environment (main.ts passes them in).
 */

import { parseArgs } from "node:util";
import {
  DEFAULT_BACKUP_KEEP,
  DEFAULT_STORE_DELETED_RETENTION,
  DEFAULT_STORE_REGION,
  DEFAULT_STORE_WAIT,
  type ReadTextFile,
  resolveStore,
  type StoreConfig,
} from "./config_store.ts";
import { absolutePath, ConfigError, parseDuration } from "./config_values.ts";
import { type ParameterPolicy, resolveParameterPolicy } from "./parameters.ts";
import { type ListenAddress, parseListenAddress } from "./listen_address.ts";
import { LOG_LEVELS, type LogLevel } from "./log.ts";
import { defaultProgram } from "./permissions.ts";
import { NODE_TOPOLOGY_KEY, PLUGIN_NAME, PLUGIN_VERSION } from "./version.ts";
import { checkDatasetName } from "./zfs/names.ts";

export { ConfigError };
export { Credentials } from "./config_store.ts";
export type { FileStoreConfig, ReadTextFile, S3StoreConfig, StoreConfig } from "./config_store.ts";

/** Which CSI services the plugin serves. */
export type PluginMode = "node" | "controller" | "monolith";
/** The modes, for flags and help. */
export const PLUGIN_MODES: readonly PluginMode[] = ["node", "controller", "monolith"];
/** Default mode: see USAGE and docs/volumes.md, "Modes and Nomad's controller routing", for why. */
export const DEFAULT_MODE: PluginMode = "monolith";
/** Default time a deleted volume or snapshot is kept before it is destroyed. */
export const DEFAULT_DELETED_RETENTION = "7d";

/** Everything the plugin needs to run, with every field set. */
export interface Config {
  readonly mode: PluginMode;
  /** How long deleted volumes and snapshots are kept, set aside; 0 destroys at once. */
  readonly deletedRetentionSeconds: number;
  /** The endpoint as given, e.g. "unix:///csi/csi.sock". */
  readonly endpoint: string;
  /** Filesystem path of the unix socket. */
  readonly socketPath: string;
  readonly nodeId: string;
  /** Operator topology plus our per-node segment. */
  readonly topology: Readonly<Record<string, string>>;
  readonly parentDataset: string;
  readonly logLevel: LogLevel;
  readonly zfsPath: string;
  readonly zpoolPath: string;
  readonly mountPath: string;
  readonly umountPath: string;
  /** Directories under which every staging and target path must lie. */
  readonly stagePublishDirs: readonly string[];
  /** Time limit of one zfs/mount command. */
  readonly commandTimeoutMs: number;
  /**
   * The plugin id is this node's alone, so a volume id without a node can only mean this node:
   * controller calls that change a volume accept such ids (see src/zfs/ids.ts).
   */
  readonly nodeLocalPluginId: boolean;
  /** Which CreateVolume parameters and values volume creators may use. */
  readonly parameterPolicy: ParameterPolicy;
  /**
   * `--block-volumes`: zvols may be made and served, as raw block devices or with ext4/xfs
   * on them (docs/block-volumes.md); off, every such request is refused.
   */
  readonly blockVolumes: boolean;
  /** `--allow-sparse-zvols`: the CreateVolume parameter sparse=true may make a thin zvol. */
  readonly allowSparseZvols: boolean;
  /** Where volumes are backed up; absent without --store (backups off). */
  readonly store?: StoreConfig;
  /**
   * Volumes that follow their job (src/follow/): the lease TTL a holder renews within, and how
   * long a lease must stay unchanged beyond it before another node takes the volume over
   * (undefined: only an explicit `zfs-csi takeover`); how often this node brings its standby
   * copies up to the store's head (undefined: never).
   */
  readonly follow?: {
    readonly leaseTtlSeconds: number;
    readonly takeoverAfterSeconds?: number;
    readonly standbyIntervalSeconds?: number;
  };
  /** Where Prometheus metrics are served (GET /metrics); absent without --metrics-listen. */
  readonly metricsListen?: ListenAddress;
}

/** What the command line asks for. */
export type ParsedCommand =
  | { readonly kind: "run"; readonly config: Config }
  | { readonly kind: "help"; readonly text: string }
  | { readonly kind: "version"; readonly text: string };

/** Default staging/publish base dir: Nomad's default `stage_publish_base_dir` inside a task. */
export const DEFAULT_STAGE_PUBLISH_DIR = "/local/csi";
/** Socket used when neither --endpoint nor CSI_ENDPOINT is given (Nomad's default mount_dir). */
export const DEFAULT_ENDPOINT = "unix:///csi/csi.sock";

export const USAGE = `zfs-csi ${PLUGIN_VERSION}: a CSI plugin that serves ZFS datasets to Nomad

Usage: zfs-csi --parent-dataset POOL/DATASET --node-id ID [options]

Required:
  --parent-dataset NAME       every volume is a child of this dataset (e.g. tank/nomad)
  --node-id ID                this node's id; keep it stable across restarts

Options:
  --mode MODE                 monolith (default), node or controller; see below
  --deleted-retention TIME    keep deleted volumes and snapshots, set aside, this long before
                              destroying them: 0, or e.g. 90s, 30m, 24h, 7d (default: ${DEFAULT_DELETED_RETENTION})
  --endpoint URL              unix socket to serve on (default: $CSI_ENDPOINT, else ${DEFAULT_ENDPOINT})
  --topology KEY=VALUE        topology segment of this node; repeat for more (e.g. zone=eu1)
  --stage-publish-base-dir D  staging and target paths must lie below D; repeatable
                              (default: ${DEFAULT_STAGE_PUBLISH_DIR}, Nomad's stage_publish_base_dir)
  --log-level LEVEL           debug, info, warn or error (default: info)
  --zfs PATH                  zfs program (default: zfs from PATH; with no PATH, the first of
                              /usr/local/sbin, /usr/local/bin, /usr/sbin, /usr/bin, /sbin and
                              /bin that has it; the same for the three below)
  --zpool PATH                zpool program (default: zpool from PATH)
  --mount PATH                mount program (default: mount from PATH)
  --umount PATH               umount program (default: umount from PATH)
  --command-timeout SECONDS   time limit of one zfs or mount command (default: 60)
  --node-local-plugin-id      no other node runs this plugin id (one plugin id per node): let
                              controller calls that delete, grow, snapshot or clone a volume
                              take ids without "@<node>" (refused otherwise)
  --allow-parameter N=V[|V]   volume creators may set parameter N to these values, or to any
                              with N=*; replaces N's default limit; repeatable. N may also be
                              module:* (user properties) or * (every parameter)
  --deny-parameter N          volume creators may not set parameter N (or module:*, or *);
                              repeatable
  --key-dir DIR               keylocation may name files strictly below DIR (file:///DIR/...);
                              without it, and without --allow-parameter keylocation=..., none
  --block-volumes             serve zvols too: raw block devices (attachment_mode
                              "block-device") and ext4/xfs on a zvol (fs_type); needs OpenZFS
                              (see docs/block-volumes.md)
  --allow-sparse-zvols        let volume creators make thin zvols (parameter sparse=true, no
                              refreservation; writes can then fail when the pool is full)
  --metrics-listen HOST:PORT  serve Prometheus metrics at http://HOST:PORT/metrics (off by
                              default; the build must allow it: ZFS_CSI_METRICS_LISTEN)
  -h, --help                  show this help
  --version                   show the version

Store (backups; off without --store):
  --store URL                 file:///absolute/dir or s3://bucket[/prefix]
  --backup-interval TIME      back up volumes that set no interval this often: seconds, or
                              e.g. 15m, 1h30m (default: 0, only volumes that set one)
  --backup-keep POLICY        keep policy of volumes that set none
                              (default: ${DEFAULT_BACKUP_KEEP})
  --store-deleted-retention TIME
                              keep a deleted volume's backups this long (default: ${DEFAULT_STORE_DELETED_RETENTION})
  --store-wait TIME           the longest one CSI call waits for the store in all, from 1s to
                              1h (default: ${DEFAULT_STORE_WAIT}); then it answers UNAVAILABLE saying how
                              long it waited. A transfer that moves data is not cut short: it
                              fails once no byte moved for this long
  --store-endpoint URL        S3 endpoint https://host[:port] (default: AWS's for the region)
  --store-region NAME         S3 region (default: ${DEFAULT_STORE_REGION})
  --store-path-style          address the bucket as endpoint/bucket (MinIO, Garage, versitygw
                              and IP endpoints usually need it), not bucket.endpoint
  --store-insecure-http       allow an http:// endpoint on another host than this one
                              (data and requests cross the network unencrypted)
  --store-credentials-file F  S3 keys from F, in the AWS credentials file format ([default]
                              aws_access_key_id, aws_secret_access_key, aws_session_token);
                              otherwise from AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY and
                              AWS_SESSION_TOKEN. Read once at start.
  --lease-ttl TIME            volumes that follow their job: their holder renews its lease
                              within this (default: 30s)
  --takeover-after TIME       take a volume over from a holder whose lease has stayed unchanged
                              for its TTL plus TIME, as this node sees it (default: off, only
                              "zfs-csi takeover <volume>" does)
  --standby-interval TIME     how often this node receives, in the background, what the store
                              got of the volumes naming it in standby_nodes (default: 30s;
                              off: never, its copies are brought up to date only when staged)

Modes: monolith serves the node and controller services together. Volumes live on the node
that holds their dataset, so the controller that creates, snapshots or deletes them must run
there too: run one monolith per node, each with its own Nomad plugin id. node serves only the
node service (volumes are registered, and created at first use); controller only the
controller service.

The node's topology always includes ${NODE_TOPOLOGY_KEY}=<node id>.
The build must be allowed to reach the store: see ZFS_CSI_STORE_HOSTS, ZFS_CSI_EXTRA_DIRS and
ZFS_CSI_EXTRA_READ_FILES in docs/security.md.
Logs are JSON lines on stderr.`;

/** A topology segment name or value; node ids are one too (the value of the node segment). */
export const TOPOLOGY_NAME = /^[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$/;
const DNS_SUBDOMAIN = /^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$/;

function parseTopology(items: readonly string[], nodeId: string): Record<string, string> {
  const out: Record<string, string> = {};
  for (const item of items) {
    const eq = item.indexOf("=");
    if (eq <= 0) throw new ConfigError(`--topology "${item}" is not of the form key=value`);
    const key = item.slice(0, eq);
    const value = item.slice(eq + 1);
    const slash = key.lastIndexOf("/");
    const prefix = slash >= 0 ? key.slice(0, slash) : undefined;
    const name = slash >= 0 ? key.slice(slash + 1) : key;
    if (
      !TOPOLOGY_NAME.test(name) ||
      (prefix !== undefined && (prefix.length > 253 || !DNS_SUBDOMAIN.test(prefix)))
    ) {
      throw new ConfigError(
        `--topology key "${key}" is not valid: use [dns.prefix/]name, name of letters, digits and "-_."`,
      );
    }
    if (!TOPOLOGY_NAME.test(value)) {
      throw new ConfigError(
        `--topology value "${value}" of "${key}" is not valid: 1-63 letters, digits and "-_."`,
      );
    }
    if (key === NODE_TOPOLOGY_KEY) {
      throw new ConfigError(`--topology key "${key}" is reserved: it is always the node id`);
    }
    if (key in out && out[key] !== value) {
      throw new ConfigError(`--topology key "${key}" is given twice with different values`);
    }
    out[key] = value;
  }
  out[NODE_TOPOLOGY_KEY] = nodeId;
  return out;
}

function socketPathOf(endpoint: string): string {
  const m = /^unix:\/\/(\/.*)$/.exec(endpoint) ?? /^unix:(\/[^/].*)$/.exec(endpoint);
  if (!m || m[1] === undefined || m[1].endsWith("/")) {
    throw new ConfigError(
      `Endpoint "${endpoint}" is not supported: use unix:///absolute/path/csi.sock`,
    );
  }
  return m[1];
}

function program(flag: string, value: string): string {
  // deno-lint-ignore no-control-regex
  if (value === "" || /[\u0000-\u001f]/.test(value)) {
    throw new ConfigError(`${flag} "${value}" is not a program name or path`);
  }
  return value;
}

/**
 * The plugin's flags, as node:util parseArgs takes them: the operator subcommands (src/cli/)
 * accept the same ones, beside their own.
 */
export const CONFIG_OPTIONS = {
  "mode": { type: "string" },
  "deleted-retention": { type: "string" },
  "endpoint": { type: "string" },
  "node-id": { type: "string" },
  "topology": { type: "string", multiple: true },
  "parent-dataset": { type: "string" },
  "stage-publish-base-dir": { type: "string", multiple: true },
  "log-level": { type: "string" },
  "zfs": { type: "string" },
  "zpool": { type: "string" },
  "mount": { type: "string" },
  "umount": { type: "string" },
  "command-timeout": { type: "string" },
  "node-local-plugin-id": { type: "boolean" },
  "allow-parameter": { type: "string", multiple: true },
  "deny-parameter": { type: "string", multiple: true },
  "key-dir": { type: "string" },
  "block-volumes": { type: "boolean" },
  "allow-sparse-zvols": { type: "boolean" },
  "store": { type: "string" },
  "store-endpoint": { type: "string" },
  "store-region": { type: "string" },
  "store-path-style": { type: "boolean" },
  "store-insecure-http": { type: "boolean" },
  "store-credentials-file": { type: "string" },
  "backup-interval": { type: "string" },
  "backup-keep": { type: "string" },
  "store-deleted-retention": { type: "string" },
  "store-wait": { type: "string" },
  "lease-ttl": { type: "string" },
  "takeover-after": { type: "string" },
  "standby-interval": { type: "string" },
  "metrics-listen": { type: "string" },
  "help": { type: "boolean", short: "h" },
  "version": { type: "boolean" },
} as const;

/** A reader for configs that name no file. */
function noFiles(): never {
  throw new Error("no file reader was given");
}

/**
 * Resolves the command line and environment; `readTextFile` reads the files flags name (the
 * store's credentials), so this stays pure.
 * @throws {ConfigError} for unknown flags, malformed values or missing required flags
 */
export function parseConfig(
  args: readonly string[],
  env: Readonly<Record<string, string | undefined>>,
  readTextFile: ReadTextFile = noFiles,
): ParsedCommand {
  let values;
  try {
    ({ values } = parseArgs({
      args: [...args],
      strict: true,
      allowPositionals: false,
      options: CONFIG_OPTIONS,
    }));
  } catch (err) {
    throw new ConfigError(`${err instanceof Error ? err.message : String(err)} (see --help)`);
  }
  if (values.help) return { kind: "help", text: USAGE };
  if (values.version) return { kind: "version", text: `${PLUGIN_NAME} ${PLUGIN_VERSION}` };

  const parentDataset = values["parent-dataset"];
  if (parentDataset === undefined) {
    throw new ConfigError("Missing required flag --parent-dataset (for example tank/nomad)");
  }
  try {
    checkDatasetName(parentDataset);
  } catch (err) {
    throw new ConfigError(`--parent-dataset: ${(err as Error).message}`);
  }
  if (!parentDataset.includes("/")) {
    throw new ConfigError(
      `--parent-dataset "${parentDataset}" is a whole pool: give a dataset inside it, e.g. ${parentDataset}/nomad`,
    );
  }

  const nodeId = values["node-id"] ?? "";
  if (nodeId === "") throw new ConfigError("Missing required flag --node-id (a stable node name)");
  if (!TOPOLOGY_NAME.test(nodeId)) {
    throw new ConfigError(
      `--node-id "${nodeId}" is not valid: it is used as a topology value, so use 1-63 letters, digits and "-_."`,
    );
  }

  const logLevel = values["log-level"] ?? "info";
  if (!(LOG_LEVELS as readonly string[]).includes(logLevel)) {
    throw new ConfigError(`--log-level "${logLevel}" is not one of ${LOG_LEVELS.join(", ")}`);
  }

  const endpoint = values.endpoint ?? env.CSI_ENDPOINT ?? DEFAULT_ENDPOINT;
  const socketPath = socketPathOf(endpoint);

  const timeoutText = values["command-timeout"] ?? "60";
  const timeoutSeconds = Number(timeoutText);
  if (!/^\d+(\.\d+)?$/.test(timeoutText) || timeoutSeconds <= 0 || timeoutSeconds > 3600) {
    throw new ConfigError(`--command-timeout "${timeoutText}" must be seconds between 0 and 3600`);
  }

  const mode = values.mode ?? DEFAULT_MODE;
  if (!(PLUGIN_MODES as readonly string[]).includes(mode)) {
    throw new ConfigError(`--mode "${mode}" is not one of ${PLUGIN_MODES.join(", ")}`);
  }
  const deletedRetentionSeconds = parseDuration(
    "--deleted-retention",
    values["deleted-retention"] ?? DEFAULT_DELETED_RETENTION,
  );

  const leaseTtlSeconds = parseDuration("--lease-ttl", values["lease-ttl"] ?? "30s");
  if (leaseTtlSeconds < 3) throw new ConfigError(`--lease-ttl must be at least 3s`);
  const takeoverText = values["takeover-after"];
  const takeoverAfterSeconds = takeoverText === undefined || takeoverText === "off"
    ? undefined
    : parseDuration("--takeover-after", takeoverText);
  const standbyText = values["standby-interval"] ?? "30s";
  const standbyIntervalSeconds = standbyText === "off"
    ? undefined
    : parseDuration("--standby-interval", standbyText);
  if (standbyIntervalSeconds !== undefined && standbyIntervalSeconds < 1) {
    throw new ConfigError(`--standby-interval must be at least 1s, or off`);
  }

  const dirs = (values["stage-publish-base-dir"] ?? [DEFAULT_STAGE_PUBLISH_DIR]).map((d) =>
    absolutePath("--stage-publish-base-dir", d)
  );

  const keyDir = values["key-dir"];
  let parameterPolicy: ParameterPolicy;
  try {
    parameterPolicy = resolveParameterPolicy({
      allow: values["allow-parameter"] ?? [],
      deny: values["deny-parameter"] ?? [],
      keyDir: keyDir === undefined ? undefined : absolutePath("--key-dir", keyDir),
    });
  } catch (err) {
    throw err instanceof ConfigError ? err : new ConfigError((err as Error).message);
  }

  const store = resolveStore(
    {
      store: values.store,
      endpoint: values["store-endpoint"],
      region: values["store-region"],
      pathStyle: values["store-path-style"] === true,
      insecureHttp: values["store-insecure-http"] === true,
      credentialsFile: values["store-credentials-file"],
      backupInterval: values["backup-interval"],
      backupKeep: values["backup-keep"],
      deletedRetention: values["store-deleted-retention"],
      wait: values["store-wait"],
    },
    env,
    readTextFile,
  );

  const blockVolumes = values["block-volumes"] === true;
  const allowSparseZvols = values["allow-sparse-zvols"] === true;
  if (allowSparseZvols && !blockVolumes) {
    throw new ConfigError("--allow-sparse-zvols needs --block-volumes (it is about zvols)");
  }

  const metricsText = values["metrics-listen"];
  let metricsListen: ListenAddress | undefined;
  if (metricsText !== undefined) {
    try {
      metricsListen = parseListenAddress(metricsText);
    } catch (err) {
      throw new ConfigError(`--metrics-listen ${(err as Error).message}`);
    }
  }

  const config: Config = {
    mode: mode as PluginMode,
    deletedRetentionSeconds,
    endpoint,
    socketPath,
    nodeId,
    topology: Object.freeze(parseTopology(values.topology ?? [], nodeId)),
    parentDataset,
    logLevel: logLevel as LogLevel,
    zfsPath: program("--zfs", values.zfs ?? defaultProgram("zfs")),
    zpoolPath: program("--zpool", values.zpool ?? defaultProgram("zpool")),
    mountPath: program("--mount", values.mount ?? defaultProgram("mount")),
    umountPath: program("--umount", values.umount ?? defaultProgram("umount")),
    stagePublishDirs: Object.freeze([...new Set(dirs)]),
    commandTimeoutMs: Math.round(timeoutSeconds * 1000),
    nodeLocalPluginId: values["node-local-plugin-id"] === true,
    parameterPolicy,
    blockVolumes,
    allowSparseZvols,
    ...(store ? { store } : {}),
    follow: {
      leaseTtlSeconds,
      ...(takeoverAfterSeconds === undefined ? {} : { takeoverAfterSeconds }),
      ...(standbyIntervalSeconds === undefined ? {} : { standbyIntervalSeconds }),
    },
    ...(metricsListen ? { metricsListen } : {}),
  };
  return { kind: "run", config: Object.freeze(config) };
}
