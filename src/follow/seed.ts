/**
 * A volume that follows its job, made from a stored snapshot (CreateVolume's snapshot_id
 * `store:<volume>:<guid>`): the snapshot's chain (its full stream and the increments up to it)
 * is copied within the store to the new volume's place, as its own backups (its own uid, its
 * own stream keys, kind "scheduled"), and the new volume's owner object starts with its head on
 * the snapshot. So the new volume owes nothing to the source: deleting the source, or the
 * snapshot, leaves it whole; and its first stage anywhere receives it as any move does.
 *
 * The copy goes through the controller's node (the store has no server-side copy). Each
 * stream is written before its manifest (If-None-Match), so an interrupted copy leaves whole
 * backups only, and a retry (the same CreateVolume again, under the same lock) goes on from
 * where it stopped with the same uid; streams that lost a race to a manifest go at once, as
 * backups' do. Bytes are checked where they are used: every receive checks size and SHA-256.
 */

import { Code, CsiError } from "../errors.ts";
import type { Logger } from "../log.ts";
import { readManifests } from "../replicate/records.ts";
import { ChainError, chainTo, encodeJson } from "../store/chain.ts";
import { manifestKey, type SnapshotManifest, streamKey } from "../store/layout.ts";
import type { StoredSnapshotRef } from "../store/snapshot_ids.ts";
import { type Store, StoreError } from "../store/store.ts";
import { encodeComponent } from "../zfs/names.ts";
import { randomUid } from "./mover.ts";
import { type NewHead, readOwner } from "./owner.ts";

/** What a seeded volume starts with. */
export interface Seed {
  /** The uid of the new volume (its manifests carry it). */
  readonly uid: string;
  readonly head: NewHead;
  /** The snapshot's manifest, as the source stored it (its size when taken, its raw flag). */
  readonly source: SnapshotManifest;
  /** Bytes copied by this call (0 when a retry found everything copied). */
  readonly copiedBytes: number;
}

/** What a seed works with. */
export interface SeedSpec {
  readonly source: StoredSnapshotRef;
  /** The new volume's name. */
  readonly volume: string;
  /** This node, named in the copied manifests as their sender. */
  readonly node: string;
  readonly log: Logger;
  /** A new uid; replaceable in tests. */
  readonly newUid?: () => string;
  /**
   * Refuses a snapshot the new volume cannot be made from (a zvol's for a dataset, another
   * content, a larger zvol), before anything is copied; it throws to refuse.
   */
  readonly check?: (snapshot: SnapshotManifest) => void;
}

/**
 * Copies the snapshot's chain to the new volume (see the module doc).
 * @throws {CsiError} NOT_FOUND for a snapshot the store does not hold; FAILED_PRECONDITION for
 *   a broken chain or an encrypted (raw) one; ALREADY_EXISTS when the new name holds another
 *   volume's backups or owner object in the store
 * @throws {StoreError} when the store fails
 */
export async function seedFromSnapshot(store: Store, spec: SeedSpec): Promise<Seed> {
  const { source, log } = spec;
  const { manifests } = await readManifests(store, source.volumeKey, log);
  const snapshot = manifests.find((m) => m.guid === source.guid);
  if (!snapshot) {
    throw new CsiError(Code.NOT_FOUND, `Snapshot "${source.id}" not found in ${store.description}`);
  }
  spec.check?.(snapshot);
  let chain: SnapshotManifest[];
  try {
    chain = chainTo(manifests.filter((m) => m.volumeUid === snapshot.volumeUid), source.guid);
  } catch (err) {
    if (!(err instanceof ChainError)) throw err;
    throw new CsiError(
      Code.FAILED_PRECONDITION,
      `Snapshot "${source.id}" cannot be restored: ${err.message}`,
    );
  }
  if (chain.some((m) => m.raw)) {
    throw new CsiError(
      Code.FAILED_PRECONDITION,
      `Snapshot "${source.id}" is of an encrypted volume; a volume that follows its job cannot ` +
        `be made from it yet: restore it into a volume of one node`,
    );
  }
  const volumeKey = encodeComponent("Volume name", spec.volume);
  const head: NewHead = { guid: snapshot.guid, createdAt: snapshot.createdAt };
  const uid = await uidFor(store, spec.volume, volumeKey, chain, log) ??
    (spec.newUid ?? randomUid)();
  const { manifests: there } = await readManifests(store, volumeKey, log);
  let copiedBytes = 0;
  for (const m of chain) {
    if (there.some((t) => t.guid === m.guid && t.volumeUid === uid)) continue;
    const key = streamKey(volumeKey, m.guid, randomUid().slice(0, 16));
    await store.putStream(key, await store.getStream(m.stream));
    const { csiName: _, ...rest } = m;
    const copy: SnapshotManifest = {
      ...rest,
      volume: spec.volume,
      volumeUid: uid,
      stream: key,
      kind: "scheduled",
      node: spec.node,
    };
    try {
      await store.putBytes(manifestKey(volumeKey, m.guid), encodeJson(copy), { ifNoneMatch: "*" });
      copiedBytes += m.size;
    } catch (err) {
      // Another copy's manifest won (a concurrent retry): its stream is the one kept.
      await store.delete(key);
      if (!(err instanceof StoreError && err.kind === "precondition_failed")) throw err;
    }
  }
  log.info("stored snapshot copied to a new volume that follows its job", {
    snapshotId: source.id,
    volume: spec.volume,
    streams: chain.length,
    copiedBytes,
  });
  return { uid, head, source: snapshot, copiedBytes };
}

/**
 * The uid of a seed begun before (a retry), or undefined for a new one.
 * @throws {CsiError} ALREADY_EXISTS when the name is another volume's in the store
 */
async function uidFor(
  store: Store,
  volume: string,
  volumeKey: string,
  chain: readonly SnapshotManifest[],
  log: Logger,
): Promise<string | undefined> {
  const taken = (what: string) =>
    new CsiError(
      Code.ALREADY_EXISTS,
      `Volume "${volume}" already exists in ${store.description} (${what}); give the new ` +
        `volume a name of its own`,
    );
  const owner = (await readOwner(store, volumeKey))?.record;
  const head = chain.at(-1)!.guid;
  if (owner) {
    if (owner.state === "deleted" || owner.generation > 0 || owner.head !== head) {
      throw taken("as a volume that follows its job, with other data");
    }
    return owner.uid;
  }
  const { manifests } = await readManifests(store, volumeKey, log);
  if (manifests.length === 0) return undefined;
  // The first stream goes first: a seed begun before left it, with the uid to go on with.
  const first = manifests.find((m) => m.guid === chain[0]!.guid && m.baseGuid === null);
  if (!first || manifests.some((m) => m.volumeUid !== first.volumeUid)) {
    throw taken("its backups are there");
  }
  return first.volumeUid;
}
