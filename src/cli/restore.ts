/**
 * `zfs-csi restore VOLUME[@SNAPSHOT] --to NAME`: a snapshot of a volume into a NEW volume NAME
 * below the parent, never over an existing dataset, with the plugin's own code:
 * - a stored snapshot (its id `store:<volume>:<hex>`, the 16 hex digits, or the newest stored
 *   one when no snapshot is named and there is a store) is received with its chain by
 *   src/replicate/restore.ts, as CreateVolume from a stored snapshot does: into a hidden
 *   temporary dataset, every stream checked (size, SHA-256, guid), renamed to NAME only then;
 * - a snapshot on this node (its name as `zfs-csi snapshots` shows it) is cloned, as CreateVolume
 *   from a snapshot does (the clone shares its blocks and keeps the snapshot until it goes).
 * The new volume carries the plugin's marker and the source's size (refquota); register it with
 * Nomad (external_id = "NAME@<node>").
 */

import { ConfigError } from "../config.ts";
import { Code, CsiError, ZfsError } from "../errors.ts";
import { storeGrants } from "../permissions.ts";
import { STORE_UID_PROPERTY } from "../replicate/local.ts";
import { restoreVolume } from "../replicate/restore.ts";
import { chainTo } from "../store/chain.ts";
import type { SnapshotManifest } from "../store/layout.ts";
import { openStore } from "../store/open.ts";
import { storedSnapshotId } from "../store/snapshot_ids.ts";
import type { Store } from "../store/store.ts";
import type { PropertyList } from "../zfs/args.ts";
import { qualifiedVolumeId } from "../zfs/ids.ts";
import { childDataset, MANAGED_PROPERTY, MANAGED_VALUE } from "../zfs/names.ts";
import { hasOwnMarker, parseBytes } from "../zfs/parse.ts";
import { DenoStreamRunner } from "../run.ts";
import { FORMAT, FORMAT_PROPERTY, ZVOL_CONTENT_PROPERTY } from "../volume/zvol.ts";
import { type CliIo, humanBytes, printJson, Progress } from "./io.ts";
import {
  buildTools,
  checkPrograms,
  requireGrant,
  requireParent,
  resolveConfig,
  splitArgs,
  type Tools,
} from "./setup.ts";
import { localSnapshots, type SnapshotRow } from "./snapshots.ts";
import { namedVolume } from "./target.ts";
import { countingStore, pickManifest, volumeManifests } from "./verify.ts";

/** What a restore did. */
export interface Restored {
  readonly from: string;
  /** "store": received with its chain; "local": cloned on this node. */
  readonly how: "store" | "local";
  readonly dataset: string;
  readonly volumeId: string;
  readonly bytes: number;
  readonly mounted: boolean;
}

/** `VOLUME[@SNAPSHOT]` split; a store id holds no "@", so the first "@" separates. */
export function splitTarget(arg: string): { volume: string; snapshot?: string } {
  const at = arg.indexOf("@");
  if (at < 0) return { volume: arg };
  const snapshot = arg.slice(at + 1);
  if (snapshot === "") throw new ConfigError(`"${arg}": give a snapshot after "@", or none`);
  return { volume: arg.slice(0, at), snapshot };
}

/** Whether `name` names a stored snapshot: its id, or the 16 hex digits of its guid. */
export function isStoredName(name: string): boolean {
  return name.startsWith("store:") || /^[0-9a-f]{16}$/.test(name);
}

/**
 * The local snapshot `name` names among `rows` (its name as `snapshots` shows it).
 * @throws {CsiError} NOT_FOUND naming what there is
 */
export function pickLocal(rows: readonly SnapshotRow[], volume: string, name: string): SnapshotRow {
  // Its name as listed (a CSI snapshot's decoded name), or its component as zfs shows it.
  const found = rows.find((r) => r.name === name || r.local?.endsWith(`@${name}`));
  if (!found) {
    throw new CsiError(
      Code.NOT_FOUND,
      `Volume "${volume}" has no snapshot "${name}" on this node` +
        (rows.length > 0 ? ` (it has ${rows.map((r) => r.name).join(", ")})` : "") +
        `; zfs-csi snapshots ${volume} lists them, the store's too with --store`,
    );
  }
  return found;
}

/**
 * Checks that `target` is free: restore never writes over a dataset.
 * @throws {CsiError} ALREADY_EXISTS naming it
 */
async function checkFree(tools: Tools, target: string): Promise<void> {
  if (await tools.zfs.getProperties(target, ["type"])) {
    throw new CsiError(
      Code.ALREADY_EXISTS,
      `"${target}" exists: restore makes a new volume and never writes over one; choose ` +
        `another --to NAME`,
    );
  }
}

/** Clones a local snapshot into `target`, as CreateVolume from a snapshot does. */
async function cloneLocal(
  tools: Tools,
  source: { dataset: string; snapshot: SnapshotRow },
  target: string,
): Promise<number> {
  const src = await tools.zfs.getProperties(source.dataset, ["type", "refquota", MANAGED_PROPERTY]);
  if (!src || !hasOwnMarker(src, MANAGED_PROPERTY, MANAGED_VALUE)) {
    throw new CsiError(
      Code.FAILED_PRECONDITION,
      `"${source.dataset}" is not zfs-csi's: restore clones only volumes' snapshots`,
    );
  }
  const refquota = parseBytes(src.get("refquota")?.value ?? "0");
  await tools.zfs.clone(source.snapshot.local!, target, {
    [MANAGED_PROPERTY]: MANAGED_VALUE,
    ...(refquota > 0 ? { refquota: String(refquota) } : {}),
  });
  return source.snapshot.sizeBytes;
}

/** Receives a stored snapshot's chain into `target` with the plugin's restore. */
async function receiveStored(
  tools: Tools,
  io: CliIo,
  v: { store: Store; manifests: SnapshotManifest[]; target: SnapshotManifest; dataset: string },
  name: string,
  signal: AbortSignal,
): Promise<number> {
  const chain = chainTo(
    v.manifests.filter((m) => m.volumeUid === v.target.volumeUid),
    v.target.guid,
  );
  const bytes = chain.reduce((n, m) => n + m.size, 0);
  const progress = new Progress(io, `restore ${name}`, bytes);
  io.err(
    `restore: receiving ${chain.length} stream(s), ${humanBytes(bytes)}, of ${v.target.snapshot} ` +
      `(${v.target.createdAt}) from ${v.store.description} into ${v.dataset}`,
  );
  const properties = restoredProperties(v.target, name);
  try {
    await restoreVolume({
      streams: new DenoStreamRunner(),
      zfsPath: tools.config.zfsPath,
      zfs: tools.zfs,
      store: countingStore(v.store, (n) => progress.add(n)),
      log: tools.log,
    }, {
      parentDataset: tools.config.parentDataset,
      chain,
      target: v.dataset,
      properties,
      signal,
    });
  } catch (err) {
    if (err instanceof ZfsError && err.kind === "no_space") {
      throw new CsiError(
        Code.RESOURCE_EXHAUSTED,
        `Restoring "${v.dataset}" needs room for about ${humanBytes(bytes)} (its streams), ` +
          `more than the pool has free; nothing was kept`,
        { cause: err },
      );
    }
    throw err;
  } finally {
    progress.finish();
  }
  return bytes;
}

/**
 * What a restore from the store sets on the volume `name` it makes from `m`: a dataset's size
 * (refquota); for a zvol (docs/block-volumes.md) its content record, a full reservation and its
 * format record when its snapshot surely held the whole filesystem, as CreateVolume sets them.
 */
export function restoredProperties(m: SnapshotManifest, name: string): PropertyList {
  const zvol = m.zvol;
  return [
    ...(zvol
      ? [
        [ZVOL_CONTENT_PROPERTY, zvol.content] as const,
        ["refreservation", "auto"] as const,
        ...(zvol.formatted && zvol.content !== "block"
          ? [[FORMAT_PROPERTY, FORMAT.done] as const]
          : []),
      ]
      : m.capacityBytes > 0
      ? [["refquota", String(m.capacityBytes)] as const]
      : []),
    // Restored under its own name, the volume goes on with its history in the store.
    ...(m.volume === name ? [[STORE_UID_PROPERTY, m.volumeUid] as const] : []),
  ];
}

/** Usage of `restore`. */
export const usage =
  `Usage: zfs-csi restore --parent-dataset NAME --node-id ID [--store URL] [plugin flags]
                       VOLUME[@SNAPSHOT] --to NAME [--json]

Restores a snapshot of VOLUME into a NEW volume NAME below the parent dataset; it never writes
over an existing dataset. SNAPSHOT is one zfs-csi snapshots VOLUME lists: a stored snapshot
(store:<volume>:<hex>, or the 16 hex digits) is received from the store with its chain, each
stream checked (size, SHA-256, guid) into a hidden temporary dataset that becomes NAME only
once all is received, as the plugin's CreateVolume from a stored snapshot; a snapshot on this
node (its name) is cloned, as CreateVolume from a snapshot. Without @SNAPSHOT: the newest in
the store (--store). The volume keeps the source's size; register it with Nomad
(nomad volume register, external_id = "NAME@<node>"). VOLUME may be a volume that no longer
exists on this node when the store holds it. Ctrl-C stops a receive and keeps nothing.`;

/** Runs `restore`. */
export async function run(args: readonly string[], io: CliIo): Promise<number> {
  const split = splitArgs(args, { json: { type: "boolean" }, to: { type: "string" } });
  if (split.positionals.length !== 1) {
    throw new ConfigError("restore takes one VOLUME[@SNAPSHOT] and --to NAME");
  }
  if (typeof split.own.to !== "string") {
    throw new ConfigError("restore needs --to NAME: the new volume to restore into");
  }
  const { volume: volumeArg, snapshot } = splitTarget(split.positionals[0]!);
  const config = resolveConfig(split.configArgs);
  if (config.store) { for (const grant of storeGrants(config.store)) requireGrant(grant); }
  checkPrograms([config.zfsPath]);
  const tools = buildTools(config, { level: "warn" });
  const parent = config.parentDataset;
  const source = namedVolume(parent, volumeArg);
  const toName = split.own.to;
  await requireParent(tools);
  const target = childDataset(parent, "Volume name", toName);
  await checkFree(tools, target);
  const stored = snapshot === undefined || isStoredName(snapshot);
  let how: Restored["how"];
  let from: string;
  let bytes: number;
  if (stored) {
    if (!config.store) {
      throw new ConfigError(
        snapshot === undefined
          ? `restore without @SNAPSHOT takes the newest stored one: give --store as the plugin ` +
            `has it, or name a snapshot on this node (zfs-csi snapshots ${volumeArg})`
          : `"${snapshot}" is a stored snapshot: give --store as the plugin has it`,
      );
    }
    const store = openStore(config.store);
    const manifests = await volumeManifests(store, source.name);
    const chosen = pickManifest(manifests, source.name, snapshot);
    const stop = new AbortController();
    const onSignal = () => stop.abort(new DOMException("restore was interrupted", "AbortError"));
    Deno.addSignalListener("SIGINT", onSignal);
    Deno.addSignalListener("SIGTERM", onSignal);
    try {
      bytes = await receiveStored(
        tools,
        io,
        { store, manifests, target: chosen, dataset: target },
        toName,
        stop.signal,
      );
    } catch (err) {
      if (!stop.signal.aborted) throw err;
      io.err(`restore: interrupted; nothing was kept (no "${target}")`);
      return 130;
    } finally {
      Deno.removeSignalListener("SIGINT", onSignal);
      Deno.removeSignalListener("SIGTERM", onSignal);
    }
    how = "store";
    from = `${storedSnapshotId(chosen.volume, chosen.guid)} (${chosen.createdAt}) from ` +
      store.description;
  } else {
    const rows = await localSnapshots(tools, source.dataset);
    const picked = pickLocal(rows, source.name, snapshot!);
    bytes = await cloneLocal(tools, { dataset: source.dataset, snapshot: picked }, target);
    how = "local";
    from = picked.local!;
  }
  let mounted = false;
  try {
    await tools.zfs.mount(target);
    mounted = true;
  } catch (err) {
    if (!(err instanceof ZfsError)) throw err;
  }
  const result: Restored = {
    from,
    how,
    dataset: target,
    volumeId: qualifiedVolumeId(toName, config.nodeId),
    bytes,
    mounted,
  };
  if (split.own.json === true) {
    printJson(io, result);
    return 0;
  }
  io.out(
    `Restored ${from} into "${target}" (${how === "store" ? "received" : "cloned"}, ` +
      `${humanBytes(bytes)})${mounted ? "" : "; not mounted yet, the next stage mounts it"}.`,
  );
  io.out(`Register it with Nomad: nomad volume register (external_id = "${result.volumeId}").`);
  return 0;
}
