/**
 * Expansion of a volume that follows its job. Its size lives in the store, in the owner object's
 * settings (the properties every node makes its copy with), so ControllerExpandVolume grows it
 * there, with the same conditional write (If-Match on the etag read) as every other change of
 * the owner object: a holder's lease renewal that meets it reads the object again and renews on
 * top of it (owner.ts), so neither write is lost. The sizes are planned as for any volume
 * (src/volume/sizing.ts: never smaller, an unlimited volume stays unlimited, a fixed quota bounds
 * it).
 *
 * The copies follow: the holder's by NodeExpandVolume (Nomad calls it on the claiming node when
 * the answer says so), and every copy, wherever it is, at its next stage, by
 * {@linkcode SizedFollowVolumes}: an existing copy gets the recorded sizes before increments are
 * received on top of it (they may need the room), a full receive makes the copy with them, and
 * the copy as staged gets them once more. A standby copy gets them before each background
 * receive of increments (standby.ts).
 *
 * A follow zvol's size is its volsize: the record's capacity grows by the rule of any zvol
 * (volume/zvol.ts planZvolGrowth: in whole steps, never shrunk), and a copy gets `volsize` set,
 * never a size property of a dataset (copy_kind.ts), and only once it is writable: zfs refuses
 * to set the volsize of a read-only zvol, and an increment needs no room made before it (the
 * volsize is part of the zvol's data, which the increment brings as its sender had it).
 */

import { Code, CsiError } from "../errors.ts";
import {
  type Capacity,
  currentSizes,
  orderedChanges,
  planSize,
  SIZE_PROPERTIES,
} from "../volume/sizing.ts";
import { ownerKey } from "../store/layout.ts";
import { type Store, StoreError } from "../store/store.ts";
import type { PropertyList } from "../zfs/args.ts";
import { encodeComponent, MANAGED_PROPERTY } from "../zfs/names.ts";
import { FOLLOW_GENERATION_PROPERTY } from "./copy.ts";
import { kindOf, kindOfCopy, sizeProperties } from "./copy_kind.ts";
import { planZvolGrowth } from "../volume/zvol.ts";
import { parseBytes, type PropertyMap } from "../zfs/parse.ts";
import { type FollowDeps, FollowVolumes, type StageSpec } from "./mover.ts";
import { encodeOwner, type FollowSettings, readOwner } from "./owner.ts";

/** Lost races in a row before an expansion gives up (each loser reads again). */
const ATTEMPTS = 5;

/** What an expansion did. */
export interface Resized {
  /** The volume's capacity now (0: unlimited). */
  readonly capacityBytes: number;
  /** Whether a node holds the volume: its copy needs NodeExpandVolume. */
  readonly held: boolean;
  /** Whether the store's settings changed (false for a repeat). */
  readonly changed: boolean;
}

/** The settings' properties as a property map, as sizing.ts reads a dataset's. */
function asProps(properties: Readonly<Record<string, string>>): PropertyMap {
  return new Map(Object.entries(properties).map(([k, v]) => [k, { value: v, source: "local" }]));
}

/**
 * The settings after growing to `capacity` (see the module doc), or the same object when
 * nothing changes.
 * @throws {CsiError} OUT_OF_RANGE for a shrink or growth past a fixed quota
 */
export function resizedSettings(
  id: string,
  settings: FollowSettings,
  capacity: Capacity,
): FollowSettings {
  if (settings.zvol) {
    const volsize = planZvolGrowth(id, settings.capacityBytes, capacity);
    return volsize === settings.capacityBytes ? settings : { ...settings, capacityBytes: volsize };
  }
  // The settings always say "filesystem" and ours: sizing.ts reads only the sizes and parameters.
  const plan = planSize(id, asProps(settings.properties), capacity);
  if (plan.changes.length === 0 && plan.refquota === settings.capacityBytes) return settings;
  const properties: Record<string, string> = { ...settings.properties };
  for (const [name, value] of plan.changes) {
    if (value === "none") delete properties[name];
    else properties[name] = value;
  }
  return { capacityBytes: plan.refquota, properties };
}

/**
 * Grows a follow volume in the store (its owner object's settings).
 * @throws {CsiError} NOT_FOUND when the store has no such volume or it was deleted;
 *   OUT_OF_RANGE for a shrink
 * @throws {StoreError} when the store fails
 */
export async function resizeFollowVolume(
  store: Store,
  volumeKey: string,
  id: string,
  capacity: Capacity,
): Promise<Resized> {
  for (let attempt = 1;; attempt++) {
    const current = await readOwner(store, volumeKey);
    const r = current?.record;
    if (!current || !r || r.state === "deleted") {
      throw new CsiError(
        Code.NOT_FOUND,
        `Volume "${id}" not found in ${store.description}${r ? " (it was deleted)" : ""}`,
      );
    }
    const settings = resizedSettings(id, r.settings, capacity);
    const held = r.state === "held";
    if (settings === r.settings) {
      return { capacityBytes: settings.capacityBytes, held, changed: false };
    }
    try {
      await store.putBytes(ownerKey(volumeKey), encodeOwner({ ...r, settings }), {
        ifMatch: current.etag,
      });
      return { capacityBytes: settings.capacityBytes, held, changed: true };
    } catch (err) {
      if (!(err instanceof StoreError && err.kind === "precondition_failed")) throw err;
      if (attempt >= ATTEMPTS) {
        throw new StoreError(
          "unavailable",
          `"${ownerKey(volumeKey)}" in ${store.description} kept changing; try again`,
          { cause: err },
        );
      }
    }
  }
}

/**
 * The `zfs set` that brings a copy's size properties (as read) to the recorded settings: only
 * the ones the settings name and that differ, never a shrink below what the copy has, in an
 * order zfs accepts one at a time.
 */
export function recordedSizeChanges(copy: PropertyMap, settings: FollowSettings): PropertyList {
  if (settings.zvol) {
    // A zvol's size is its volsize; a copy grown further by hand keeps its size.
    const volsize = parseBytes(copy.get("volsize")?.value ?? "0");
    return volsize > 0 && volsize < settings.capacityBytes
      ? [["volsize", String(settings.capacityBytes)]]
      : [];
  }
  const current = currentSizes(copy);
  const target: Partial<Record<typeof SIZE_PROPERTIES[number], number>> = {};
  for (const name of SIZE_PROPERTIES) {
    const value = settings.properties[name];
    if (value === undefined) continue;
    const bytes = parseBytes(value);
    // Grown here by a NodeExpandVolume the store has not recorded: never taken back.
    if (bytes > 0 && current[name] > bytes) continue;
    target[name] = bytes;
  }
  return orderedChanges(current, target);
}

/**
 * The node side of follow volumes, with the recorded size applied at every stage: before the
 * stage receives onto this node's copy, and once the copy is ready, its size properties are set
 * to what the owner object records, so a copy that was made before an expansion (a warm one, a
 * standby one) has the volume's size wherever it is staged, and room for what it receives.
 */
export class SizedFollowVolumes extends FollowVolumes {
  readonly #deps: Pick<FollowDeps, "zfs" | "store" | "log">;

  constructor(deps: FollowDeps) {
    super(deps);
    this.#deps = deps;
  }

  /**
   * See {@linkcode FollowVolumes.prepareStage}: the recorded size is set on this node's copy
   * before (increments received on top of it need the room the volume has now) and after (a copy
   * made or replaced by the stage, an expansion meanwhile).
   */
  override async prepareStage(spec: StageSpec): Promise<void> {
    await this.#applyRecorded(spec, true);
    await super.prepareStage(spec);
    await this.#applyRecorded(spec, false);
  }

  /**
   * Grows the copy's size properties to what the owner object records. Before the stage, only a
   * copy that is a follow copy of the plugin's (marker and generation set here) is touched.
   */
  async #applyRecorded(spec: StageSpec, before: boolean): Promise<void> {
    const { zfs, store, log } = this.#deps;
    const owner = await readOwner(store, encodeComponent("Volume name", spec.name));
    if (!owner) return;
    const settings = owner.record.settings;
    const kind = kindOf(settings);
    const props = await zfs.getProperties(spec.dataset, [
      "type",
      MANAGED_PROPERTY,
      FOLLOW_GENERATION_PROPERTY,
      ...sizeProperties(kind),
    ]);
    if (!props) return;
    // A copy of the other kind is the stage's to judge (it sets it aside), never sized here.
    if (kindOfCopy(props) !== kind) return;
    // A zvol's volsize is in its data: each increment received brings its sender's, and zfs
    // refuses to set it on a read-only zvol (EROFS). Set once the copy is writable.
    if (before && kind === "volume") return;
    const ours = props.get(MANAGED_PROPERTY)?.source === "local" &&
      props.get(FOLLOW_GENERATION_PROPERTY)?.source === "local";
    // After a stage the copy is this volume's (the stage checked it); before, it must say so.
    if (before && !ours) return;
    const changes = recordedSizeChanges(props, settings);
    if (changes.length === 0) return;
    await zfs.setProperties(spec.dataset, changes);
    log.info("follow volume's copy sized as the store records it", {
      dataset: spec.dataset,
      set: Object.fromEntries(changes),
      when: before ? "before the stage receives" : "after the stage",
    });
  }
}
