/**
 * Restores a volume from the store: the chain of stored streams is received into a hidden
 * temporary dataset below the parent, checked stream by stream (size, SHA-256, guid: see
 * receive.ts), given the volume's properties, and only then renamed to the volume's name. A
 * failed restore leaves no volume; its temporary dataset is destroyed, after checking that it
 * holds exactly what this restore received.
 */

import { createHash } from "node:crypto";
import { Code, CsiError } from "../errors.ts";
import type { SnapshotManifest } from "../store/layout.ts";
import { MANAGED_PROPERTY, MANAGED_VALUE } from "../zfs/names.ts";
import type { PropertyList } from "../zfs/args.ts";
import { type ReceiveDeps, restoreChain } from "./receive.ts";

/** Prefix of the temporary datasets restores receive into. */
export const RESTORE_PREFIX = ".restore-";

/** One restore. */
export interface RestoreVolumeSpec {
  readonly parentDataset: string;
  /** The chain, full stream first (chain.ts chainTo). */
  readonly chain: readonly SnapshotManifest[];
  /** The volume's dataset, a direct child of the parent; it must not exist. */
  readonly target: string;
  /** Set on the received dataset before it takes the volume's name (the marker is added). */
  readonly properties: PropertyList;
  readonly signal?: AbortSignal;
}

/** The temporary dataset of a restore into `target`: one name per target, so a retry finds it. */
export function restoreTempDataset(parentDataset: string, target: string): string {
  const hash = createHash("sha256").update(target).digest("hex").slice(0, 16);
  return `${parentDataset}/${RESTORE_PREFIX}${hash}`;
}

/**
 * Receives the chain into the temporary dataset, sets the properties and renames it to
 * `target`. A temporary dataset left by an earlier attempt is destroyed first, if it holds
 * only snapshots of this chain.
 * @throws whatever restoreChain throws (ReplicateError, ZfsError, StoreError), after cleaning up
 * @throws {ZfsError} exists when `target` appeared meanwhile; CsiError FAILED_PRECONDITION when
 *   the temporary dataset holds something this restore did not receive
 */
export async function restoreVolume(deps: ReceiveDeps, spec: RestoreVolumeSpec): Promise<void> {
  const temp = restoreTempDataset(spec.parentDataset, spec.target);
  const log = deps.log.child({ target: spec.target, temp });
  await removeLeftover(deps, temp, spec.chain);
  try {
    await restoreChain(deps, {
      chain: spec.chain,
      target: temp,
      ...(spec.signal ? { signal: spec.signal } : {}),
    });
    const props = spec.properties.filter(([name]) => name !== MANAGED_PROPERTY);
    await deps.zfs.setProperties(temp, [[MANAGED_PROPERTY, MANAGED_VALUE], ...props]);
    await deps.zfs.rename(temp, spec.target);
  } catch (err) {
    try {
      await removeLeftover(deps, temp, spec.chain);
    } catch (cleanup) {
      log.warn("could not remove a failed restore's temporary dataset", { error: cleanup });
    }
    throw err;
  }
  log.info("volume restored from the store", {
    snapshots: spec.chain.length,
    bytes: spec.chain.reduce((n, m) => n + m.size, 0),
  });
}

/**
 * Destroys the temporary dataset if it exists and holds nothing but snapshots whose guids are
 * in `chain` (what a restore of this chain receives): never anything else under that name.
 * @throws {CsiError} FAILED_PRECONDITION when it holds something else, naming it
 */
async function removeLeftover(
  deps: ReceiveDeps,
  temp: string,
  chain: readonly SnapshotManifest[],
): Promise<void> {
  const tree = await deps.zfs.getTree(temp, 1, ["type", "guid"]);
  if (!tree) return;
  const guids = new Set(chain.map((m) => m.guid));
  const foreign = [...tree.entries()].filter(([name, props]) =>
    name !== temp && !(name.startsWith(`${temp}@`) && guids.has(props.get("guid")?.value ?? ""))
  ).map(([name]) => name);
  if (tree.get(temp)?.get("type")?.value !== "filesystem" || foreign.length > 0) {
    throw new CsiError(
      Code.FAILED_PRECONDITION,
      `"${temp}" is in the way of a restore and holds what the restore did not receive ` +
        `(${foreign.join(", ") || "not a filesystem"}): rename or destroy it by hand`,
    );
  }
  // The whole subtree was just read: only the chain's snapshots are below it.
  await deps.zfs.destroy(temp, { recursive: true });
}
