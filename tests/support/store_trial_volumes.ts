/**
 * The volumes of the store's crash and fault trials (tests/integration/store_crash_test.ts and
 * store_faults_test.ts): what a trial knows of a volume it created, and the volume's manifests
 * in the store.
 */

import type { Store } from "../../src/store/store.ts";
import { encodeComponent } from "../../src/zfs/names.ts";
import { type AuditedManifest, auditStore } from "./store_trials.ts";

/** A volume a trial created, staged at `staging` (each test adds where it is published). */
export interface TrialVolume {
  readonly name: string;
  readonly id: string;
  readonly ctx: Record<string, string>;
  readonly dataset: string;
  readonly staging: string;
}

/**
 * The manifests the store shows for volume `name`, after an audit of every stream of the store
 * (`checked` as for `auditStore`: the streams already read back, by key and etag).
 */
export async function volumeManifests(
  store: Store,
  name: string,
  checked?: Map<string, string>,
): Promise<AuditedManifest[]> {
  const dir = `v1/volumes/${encodeComponent("Volume name", name)}`;
  return (await auditStore(store, checked)).manifests.filter((m) => m.dir === dir);
}
