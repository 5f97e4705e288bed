/**
 * Copies left behind by a DeleteVolume of a volume that follows its job: the warm copies of the
 * nodes that held it before and the standby copies. DeleteVolume runs on one controller and sets
 * aside only that node's copy; every other node finds its own copies here, by a periodic sweep
 * of its local follow copies against their owner objects, and sets each one aside with the trash
 * (the same `.deleted-` rename, retention and undo recipe as any deleted volume).
 *
 * Cost: one `zfs get` of the parent's children, then one store read (the owner object) per
 * local follow copy that is not held here; nothing for the volumes of the cluster this node has
 * no copy of.
 *
 * Fail closed: a copy is set aside only when its owner object says `deleted` and names the uid
 * the copy was made from; an owner object that is missing, unreadable or otherwise, or a store
 * that cannot be read, changes nothing. Never a copy this node holds (release marker "none":
 * its lease renewal finds out first), never one that is mounted (staged, or a fenced copy a job
 * still uses; a zvol's copy: while a stage here marks it attached), never while a stage or
 * release of it runs here, and never a dataset that is not the plugin's (checked under the
 * dataset's lock right before the rename). Copies of follow zvols are swept as datasets are.
 */

import type { KeyedLock } from "../lock.ts";
import type { Logger } from "../log.ts";
import { checkOwnedVolume } from "../volume/datasets.ts";
import { ATTACHED_PROPERTY } from "../volume/zvol.ts";
import { attachedTo, kindOfCopy } from "./copy_kind.ts";
import { STORE_UID_PROPERTY } from "../replicate/backup.ts";
import type { Store } from "../store/store.ts";
import { encodeComponent, MANAGED_PROPERTY, volumeForDataset } from "../zfs/names.ts";
import type { Zfs } from "../zfs/zfs.ts";
import { FOLLOW_GENERATION_PROPERTY, FOLLOW_RELEASED_PROPERTY } from "./copy.ts";
import type { CopyGate } from "./gate.ts";
import type { SetAside } from "./mover.ts";
import { readOwner } from "./owner.ts";

/** Time between two sweeps when `--standby-interval` is off. */
export const DEFAULT_SWEEP_INTERVAL_SECONDS = 300;

/** The release marker of a copy this node holds (mover.ts writes it). */
const HELD = "none";

/** What the sweep works with. */
export interface SweepDeps {
  readonly zfs: Zfs;
  readonly store: Store;
  readonly locks: KeyedLock;
  readonly trash: SetAside;
  readonly log: Logger;
  readonly parentDataset: string;
  /** Stages and releases of this node, which the sweep keeps out of the way of. */
  readonly gate: CopyGate;
  /** Whether anything on this node has the dataset mounted (its own mount or a bind). */
  readonly inUse: (dataset: string) => Promise<boolean>;
  /** Time between sweeps. */
  readonly intervalSeconds: number;
}

/** One copy the sweep left alone, and why. */
export interface KeptCopy {
  readonly name: string;
  readonly why: string;
}

/** What one sweep did. */
export interface SweepReport {
  /** Names of the local follow copies whose owner object was read. */
  readonly checked: string[];
  /** Names of the copies set aside. */
  readonly setAside: string[];
  /** Copies of deleted volumes (or unreadable owners) that were left alone. */
  readonly kept: KeptCopy[];
}

/** What became of one copy: set aside, left as its volume lives on, or kept for a reason. */
type Verdict = { kind: "set aside" } | { kind: "live" } | { kind: "kept"; why: string };

const PROPS = [
  "type",
  MANAGED_PROPERTY,
  FOLLOW_GENERATION_PROPERTY,
  FOLLOW_RELEASED_PROPERTY,
  STORE_UID_PROPERTY,
] as const;

/** See the module doc. */
export class DeletedCopySweep {
  readonly #d: SweepDeps;
  #running: Promise<SweepReport> | undefined;
  #timer: ReturnType<typeof setInterval> | undefined;

  constructor(deps: SweepDeps) {
    this.#d = deps;
  }

  /** One sweep; a call while one runs joins it. Never throws: failures are logged. */
  sweep(): Promise<SweepReport> {
    this.#running ??= this.#sweep().finally(() => this.#running = undefined);
    return this.#running;
  }

  /** Sweeps every interval, without keeping the process alive. */
  start(): void {
    if (this.#timer !== undefined) return;
    this.#timer = setInterval(() => void this.sweep(), this.#d.intervalSeconds * 1000);
    Deno.unrefTimer(this.#timer);
  }

  /** Stops sweeping (a sweep in progress ends on its own). */
  stop(): void {
    if (this.#timer !== undefined) clearInterval(this.#timer);
    this.#timer = undefined;
  }

  async #sweep(): Promise<SweepReport> {
    const report: SweepReport = { checked: [], setAside: [], kept: [] };
    const parent = this.#d.parentDataset;
    let tree;
    try {
      tree = await this.#d.zfs.getTree(parent, 1, PROPS);
    } catch (err) {
      this.#d.log.warn("sweep of deleted follow volumes could not list this node's copies", {
        error: err,
      });
      return report;
    }
    for (const [dataset, props] of tree ?? []) {
      const name = volumeForDataset(parent, dataset);
      // Hidden datasets (set aside, being restored) are not volumes.
      if (name === undefined || dataset.slice(parent.length + 1).startsWith(".")) continue;
      if (kindOfCopy(props) === undefined) continue;
      if (props.get(MANAGED_PROPERTY)?.source !== "local") continue;
      if (props.get(FOLLOW_GENERATION_PROPERTY)?.source !== "local") continue;
      if (props.get(FOLLOW_RELEASED_PROPERTY)?.value === HELD) continue;
      report.checked.push(name);
      const uid = props.get(STORE_UID_PROPERTY);
      const verdict = await this.#one(
        name,
        dataset,
        uid?.source === "local" ? uid.value : undefined,
      );
      if (verdict.kind === "set aside") report.setAside.push(name);
      else if (verdict.kind === "kept") report.kept.push({ name, why: verdict.why });
    }
    return report;
  }

  /** Judges one copy and sets it aside if its volume was deleted. */
  async #one(name: string, dataset: string, uid: string | undefined): Promise<Verdict> {
    const log = this.#d.log.child({ volume: name, dataset });
    let owner;
    try {
      owner = await readOwner(this.#d.store, encodeComponent("Volume name", name));
    } catch (err) {
      log.warn("sweep could not read the follow volume's owner object: its copy stays", {
        error: err,
      });
      return { kind: "kept", why: "its owner object could not be read" };
    }
    const r = owner?.record;
    if (!r || r.state !== "deleted") return { kind: "live" };
    if (uid !== r.uid) {
      const why = `the copy was made from volume uid ${uid ?? "(none)"}, the deleted volume ` +
        `has uid ${r.uid}`;
      log.warn("copy of a deleted follow volume of another uid: left alone", { why });
      return { kind: "kept", why };
    }
    try {
      const run = await this.#d.gate.background(dataset, () => this.#setAside(dataset));
      const why = !run.ran ? "a stage or release of it runs on this node" : run.value;
      if (why !== undefined) {
        log.info("copy of a deleted follow volume left alone for now", { why });
        return { kind: "kept", why };
      }
    } catch (err) {
      log.warn("copy of a deleted follow volume could not be set aside", { error: err });
      return { kind: "kept", why: err instanceof Error ? err.message : String(err) };
    }
    log.info("copy of a deleted follow volume set aside", { deletedAt: r.renewedAt });
    return { kind: "set aside" };
  }

  /** Under the dataset's lock: checks it is the plugin's and unused, then sets it aside. */
  async #setAside(dataset: string): Promise<string | undefined> {
    const held = await this.#d.locks.acquire([dataset], {
      label: "a deleted follow volume's copy",
    });
    try {
      const found = await this.#d.trash.inspect(dataset);
      if (!found) return "it is gone";
      checkOwnedVolume(dataset, found.props);
      if (kindOfCopy(found.props) === "volume") {
        // A zvol's filesystem or bound device shows in no mount table as the dataset.
        const props = await this.#d.zfs.getProperties(dataset, [ATTACHED_PROPERTY]);
        const node = attachedTo(props);
        if (node !== undefined) return `it is staged on this node (attached to "${node}")`;
      } else if (await this.#d.inUse(dataset)) return "it is mounted on this node";
      await this.#d.trash.removeVolume(dataset, found);
      return undefined;
    } finally {
      held.release();
    }
  }
}
