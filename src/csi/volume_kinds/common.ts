/**
 * What the controller's volume kinds (ordinary.ts, follow.ts, stored.ts) share: the deps, names
 * and ids as this node writes them, the CSI messages of a volume and a snapshot, the size
 * properties a volume is made with, and the check of properties this node's zfs may not know.
 */

import { Code, CsiError } from "../../errors.ts";
import { type IdScope, qualifiedSnapshotId, qualifiedVolumeId } from "../../zfs/ids.ts";
import { NAME_PROPERTY, STAGED_PROPERTY, volumeForDataset } from "../../zfs/names.ts";
import { CATALOG_READ, type SnapshotRecord, type VolumeRecord } from "../../volume/catalog.ts";
import { sizeOf, type VolumeParameters } from "../../parameters.ts";
import { type StoredEntry, StoredSnapshots } from "../stored_snapshots.ts";
import { CONTEXT_KEYS } from "../context.ts";
import { storageProblem } from "../health.ts";
import type { VolumeCapability } from "../types.ts";
import { checkCapability } from "../validate.ts";
import type { ControllerDeps } from "../controller.ts";
import { ZvolSupport } from "../zvol_support.ts";

/** Properties read of a volume before acting on it. */
export const VOLUME_STATE = [
  ...CATALOG_READ,
  "quota",
  "refreservation",
  "mountpoint",
  // What tells a retried CreateVolume from a second volume of the same name (tenancy.ts).
  NAME_PROPERTY,
  STAGED_PROPERTY,
] as const;

/** The part every volume kind of the controller uses; one per controller. */
export class KindCommon {
  readonly d: ControllerDeps;
  /** What a volume or snapshot id may name on this node. */
  readonly scope: IdScope;
  /** Whether zvols may be served (--block-volumes, and a zfs that makes them). */
  readonly zvols: ZvolSupport;
  /** Properties this node's zfs is known to support (asked once, then remembered). */
  readonly #supported = new Set<string>();

  constructor(deps: ControllerDeps) {
    this.d = deps;
    this.zvols = new ZvolSupport(deps.config.blockVolumes, deps.zfs);
    this.scope = {
      parentDataset: deps.config.parentDataset,
      nodeId: deps.config.nodeId,
      nodeLocal: deps.config.nodeLocalPluginId,
    };
  }

  /** The volume name of one of this node's datasets. */
  nameOf(dataset: string): string {
    return volumeForDataset(this.d.config.parentDataset, dataset) ?? dataset;
  }

  volumeIdOfName(name: string): string {
    return qualifiedVolumeId(name, this.d.config.nodeId);
  }

  volumeId(v: VolumeRecord): string {
    return this.volumeIdOfName(v.name);
  }

  snapshotId(s: SnapshotRecord): string {
    return qualifiedSnapshotId(s.volumeName, s.name, this.d.config.nodeId);
  }

  volumeMessage(id: string, v: VolumeRecord): Record<string, unknown> {
    const source = contentSourceOf(v.source);
    return {
      volume_id: id,
      capacity_bytes: String(v.refquota),
      volume_context: {
        [CONTEXT_KEYS.dataset]: v.dataset,
        ...(v.content ? { [CONTEXT_KEYS.fsType]: v.content } : {}),
      },
      ...(source ? { content_source: source } : {}),
      accessible_topology: [{ segments: this.d.config.topology }],
    };
  }

  snapshotMessage(s: SnapshotRecord): Record<string, unknown> {
    return {
      size_bytes: String(s.referenced),
      snapshot_id: this.snapshotId(s),
      source_volume_id: this.volumeIdOfName(s.volumeName),
      creation_time: { seconds: String(s.creation), nanos: 0 },
      ready_to_use: true,
    };
  }

  storedMessage(e: StoredEntry, sourceId?: string): Record<string, unknown> {
    return {
      size_bytes: String(e.sizeBytes),
      snapshot_id: e.id,
      source_volume_id: sourceId ?? StoredSnapshots.sourceVolumeId(e),
      creation_time: { seconds: String(e.creation), nanos: 0 },
      ready_to_use: e.ready,
    };
  }

  /** A volume's condition: the pool's health, then its backups'. */
  status(dataset: string): Record<string, unknown> {
    const backup = this.d.scheduler?.status(dataset);
    const problem = storageProblem(this.d.health.last) ??
      (backup?.lastError === undefined
        ? undefined
        : `Backups to ${this.d.stored?.description ?? "the store"} are failing ` +
          `(${backup.failures} in a row): ${backup.lastError}`);
    return {
      published_node_ids: [],
      volume_condition: {
        abnormal: problem !== undefined,
        message: problem ?? "Volume is healthy",
      },
    };
  }

  /** Adds quota and refreservation from the parameters for a volume of `size` bytes. */
  sizeProps(props: Record<string, string>, params: VolumeParameters, size: number): void {
    if (params.quota) props.quota = String(sizeOf(params.quota, size));
    if (params.refreservation) props.refreservation = String(sizeOf(params.refreservation, size));
  }

  /** Refuses properties this node's zfs does not know, with a message saying so. */
  async checkSupported(params: VolumeParameters): Promise<void> {
    const ask = params.openzfsOnly.filter((p) => !this.#supported.has(p));
    if (ask.length === 0) return;
    const unknown = await this.d.zfs.unknownProperties(this.d.config.parentDataset, ask);
    for (const p of ask) if (!unknown.includes(p)) this.#supported.add(p);
    if (unknown.length > 0) {
      throw new CsiError(
        Code.INVALID_ARGUMENT,
        `Parameter ${unknown.map((p) => `"${p}"`).join(", ")} is not supported by the ZFS on ` +
          `node "${this.d.config.nodeId}" (it needs OpenZFS)`,
      );
    }
  }
}

/** The capabilities of a request, which must name at least one. */
export function requiredCapabilities(
  caps: readonly VolumeCapability[] | null | undefined,
): readonly VolumeCapability[] {
  if (!caps || caps.length === 0) {
    throw new CsiError(Code.INVALID_ARGUMENT, "volume_capabilities is required");
  }
  return caps;
}

/** Checks the capabilities a volume is created with: at least one, each one we serve. */
export function checkCapabilities(caps: readonly VolumeCapability[] | null | undefined): void {
  for (const cap of requiredCapabilities(caps)) checkCapability(cap);
}

/** The content source recorded on a dataset, as a CSI message. */
function contentSourceOf(source: string): Record<string, unknown> | undefined {
  if (source.startsWith("snapshot:")) return { snapshot: { snapshot_id: source.slice(9) } };
  if (source.startsWith("volume:")) return { volume: { volume_id: source.slice(7) } };
  return undefined;
}
