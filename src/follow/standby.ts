/**
 * Warm standby copies of volumes that follow their job: a node named in a volume's
 * `standby_nodes` keeps receiving, in the background, what the holder stores, so that a move to
 * it costs only what changed since its last receive.
 *
 * Which volumes: the node lists its own markers (`v1/follow/standby/<node>/`, markers.ts) once
 * per tick, one listing request per thousand volumes, and reads the owner object of each
 * volume listed (one read each); it never lists `v1/volumes/`.
 *
 * What it receives: only the owner object's head and the chain of bases below it (never a
 * stream a fenced holder uploaded late), judged by the same rule as a stage (copy.ts planCopy:
 * increments onto a clean copy whose newest snapshot is on the chain, in full otherwise). The
 * copy stays as the core leaves a released one: read-only, not mounted, its release marker on
 * its newest snapshot (moved after every increment), so the next stage here finds it clean.
 * Before increments, the copy is grown to the size the owner object records (an expansion since
 * the copy was made: resize.ts), so what it receives has the volume's room (a zvol's increments
 * bring their volsize themselves).
 * A copy that diverged is set aside with the trash, as a stage would, unless it is mounted
 * (something still uses it; a zvol: a stage here marks it attached): then it is left alone and
 * the error shown. A follow zvol's copy is handled as a stage handles it (copy_kind.ts).
 *
 * Bounds: one tick at a time; volumes are looked at in turn, and a tick ends after the first
 * volume it received into (the next tick starts after it). Never while this node holds the
 * volume (as the owner object says, read inside the gate, or as the copy's release marker says:
 * a copy marked held here is the holder side's, which fences it first if it was taken over),
 * never while a stage or release of it runs here (gate.ts: a stage aborts a look or a receive
 * in progress, and waits for it), and no per-volume lock is held during a download. Failures
 * are logged and kept per volume for the volume's condition.
 */

import { Code, CsiError } from "../errors.ts";
import type { Logger } from "../log.ts";
import { BACKUP_INTERVAL_PROPERTY, STORE_UID_PROPERTY } from "../replicate/backup.ts";
import { type ManifestCache, readManifests } from "../replicate/records.ts";
import { receiveFromStore } from "../replicate/receive.ts";
import { restoreVolume } from "../replicate/restore.ts";
import { chainTo } from "../store/chain.ts";
import { datasetForVolume } from "../zfs/names.ts";
import {
  FOLLOW_GENERATION_PROPERTY,
  FOLLOW_RELEASED_PROPERTY,
  type LocalCopy,
  planCopy,
} from "./copy.ts";
import type { CopyGate } from "./gate.ts";
import { listMarked, type MarkedVolume, standbyPrefix } from "./markers.ts";
import { type CopyDeps, CREATE_ONLY, setAsideCopy } from "./mover.ts";
import { type OwnerRecord, readOwner } from "./owner.ts";
import { recordedSizeChanges } from "./resize.ts";
import {
  attachedTo,
  checkChainFits,
  type CopyKind,
  kindOf,
  lockDownProperties,
  receivedZvolProperties,
} from "./copy_kind.ts";
import { SIZE_PROPERTIES } from "../volume/sizing.ts";
import { ATTACHED_PROPERTY } from "../volume/zvol.ts";

/** Default time between two ticks. */
export const DEFAULT_STANDBY_INTERVAL_SECONDS = 30;

/**
 * The generation a standby copy is marked with: 0, which no holder ever has (acquiring makes
 * it 1 or more), since this node never made the copy writable.
 */
const STANDBY_GENERATION = "0";

/** The release marker of a copy this node holds (mover.ts). */
const HELD_MARKER = "none";

/** What the standby side works with. */
export interface StandbyDeps extends CopyDeps {
  /** The node's follow side (mover.ts): how it reads a copy, and the gate stages take. */
  readonly copies: {
    readCopy(dataset: string): Promise<LocalCopy | undefined>;
    readonly gate: CopyGate;
  };
  /** Time between ticks. */
  readonly intervalSeconds: number;
  /**
   * Whether this node serves zvols (--block-volumes, and a zfs that makes them): a follow zvol's
   * copy is kept only where it could be staged. Default: whether this node's zfs makes zvols.
   */
  readonly servesZvols?: () => Promise<boolean>;
  /** Wall clock (ms since the epoch), for the stamps shown; replaceable in tests. */
  readonly now?: () => number;
}

/** What this node knows of its standby copy of one volume, as of its last look. */
export interface StandbyState {
  /** When this node last looked (ms since the epoch). */
  readonly checkedAt: number;
  /** Whether the copy was at the store's head then. */
  readonly current: boolean;
  /** The guid of the copy's newest snapshot then, if it has one. */
  readonly guid?: string;
  /** Why the copy could not be brought to the head, if it could not. */
  readonly error?: string;
  /** Why this node left the volume alone (held here, being staged, no copy stored yet). */
  readonly note?: string;
}

/** What one tick did. */
export interface TickReport {
  /** Names of the volumes looked at, in order. */
  readonly checked: string[];
  /** The volume received into, if any, how, and the stored bytes that took. */
  readonly received?: { name: string; kind: "increment" | "full"; bytes: number };
}

/** See the module doc. */
export class StandbyFollower {
  readonly #d: StandbyDeps;
  readonly #now: () => number;
  readonly #states = new Map<string, StandbyState>();
  /** Manifests read before, by etag: a volume behind the head costs a listing, not every read. */
  readonly #manifests: ManifestCache = new Map();
  /** The volume the last receive was for: the next tick starts after it. */
  #last: string | undefined;
  #ticking: Promise<TickReport> | undefined;
  #timer: ReturnType<typeof setInterval> | undefined;

  constructor(deps: StandbyDeps) {
    this.#d = deps;
    this.#now = deps.now ?? Date.now;
  }

  /** This node's standby state of a volume (by name), if it stands by for it. */
  state(name: string): StandbyState | undefined {
    return this.#states.get(name);
  }

  /** One pass (see the module doc); a call while one runs joins it. Never throws. */
  tick(): Promise<TickReport> {
    this.#ticking ??= this.#tick().finally(() => this.#ticking = undefined);
    return this.#ticking;
  }

  /** Ticks every interval, without keeping the process alive. */
  start(): void {
    if (this.#timer !== undefined) return;
    this.#timer = setInterval(() => void this.tick(), this.#d.intervalSeconds * 1000);
    Deno.unrefTimer(this.#timer);
  }

  /** Stops ticking (a receive in progress ends on its own). */
  stop(): void {
    if (this.#timer !== undefined) clearInterval(this.#timer);
    this.#timer = undefined;
  }

  async #tick(): Promise<TickReport> {
    let listed: MarkedVolume[];
    try {
      listed = await listMarked(this.#d.store, standbyPrefix(this.#d.node));
    } catch (err) {
      this.#d.log.warn("standby copies: could not list this node's volumes", { error: err });
      return { checked: [] };
    }
    const names = new Set(listed.map((v) => v.name));
    for (const name of this.#states.keys()) if (!names.has(name)) this.#states.delete(name);
    // In turn: start after the volume the last receive was for.
    const start = this.#last === undefined ? 0 : listed.findIndex((v) => v.name > this.#last!);
    const order = start <= 0 ? listed : [...listed.slice(start), ...listed.slice(0, start)];
    const checked: string[] = [];
    for (const volume of order) {
      checked.push(volume.name);
      const received = await this.#one(volume);
      if (received) {
        this.#last = volume.name;
        return { checked, received: { name: volume.name, ...received } };
      }
    }
    return { checked };
  }

  /** Looks at one volume; receives if its copy is behind. Failures are kept and logged. */
  async #one(
    volume: MarkedVolume,
  ): Promise<{ kind: "increment" | "full"; bytes: number } | undefined> {
    const dataset = datasetForVolume(this.#d.parentDataset, volume.name);
    const log = this.#d.log.child({ volume: volume.name, dataset });
    const note = (text: string) =>
      this.#states.set(volume.name, { checkedAt: this.#now(), current: false, note: text });
    try {
      // The owner object is read, and everything decided, inside the gate: a stage or release
      // of the volume here waits for this run to end (it aborts a receive), and one that ended
      // before it began is seen by what it reads. Read before the gate, the object could say
      // another node holds the volume when a stage here has just taken it and made the copy
      // writable since.
      const run = await this.#d.copies.gate.background(dataset, async (signal) => {
        const owner = await readOwner(this.#d.store, volume.volumeKey);
        // A stage or release that came meanwhile goes first: it may change what was read.
        signal.throwIfAborted();
        const r = owner?.record;
        if (!r || r.state === "deleted") return void note("the volume was deleted");
        if (!(r.standbys ?? []).includes(this.#d.node)) {
          return void note("the volume does not name this node a standby any more");
        }
        if (r.state === "held" && r.holder === this.#d.node) {
          return void note("held by this node");
        }
        if (r.head === null) return void note("the store holds no copy of it yet");
        return await this.#catchUp(volume, dataset, r, signal, log, note);
      });
      if (!run.ran) return void note("being staged or released on this node");
      return run.value;
    } catch (err) {
      const message = err instanceof Error ? err.message : String(err);
      const aborted = err instanceof DOMException && err.name === "AbortError";
      if (aborted) {
        log.info("standby receive stopped: a stage of the volume on this node came first");
        note("a stage on this node stopped the standby receive");
        return undefined;
      }
      log.warn("standby copy could not be brought to the store's head", { error: err });
      this.#states.set(volume.name, {
        checkedAt: this.#now(),
        current: false,
        error: message,
      });
      return undefined;
    }
  }

  async #catchUp(
    volume: MarkedVolume,
    dataset: string,
    r: OwnerRecord,
    signal: AbortSignal,
    log: Logger,
    note: (text: string) => void,
  ): Promise<{ kind: "increment" | "full"; bytes: number } | undefined> {
    const head = r.head!;
    if (r.settings.zvol && !(await (this.#d.servesZvols ?? (() => this.#d.zfs.canMakeZvols()))())) {
      return void note("this node serves no zvols (--block-volumes, OpenZFS): no copy kept here");
    }
    const local = await this.#d.copies.readCopy(dataset);
    if (local && local.generation === undefined) {
      throw new CsiError(
        Code.FAILED_PRECONDITION,
        `Dataset "${dataset}" holds a volume of this node with the same name as volume ` +
          `"${volume.name}", which follows its job; no standby copy is kept here`,
      );
    }
    if (local && local.releasedAt === undefined && await this.#markedHeld(dataset)) {
      // This node made it writable as the holder, whatever the store says now: if another node
      // took the volume over, the lease renewal marks the copy fenced first (and a copy is set
      // aside only once it is no longer the holder side's).
      note("held by this node (its copy here is marked held; its lease renewal judges it)");
      return undefined;
    }
    const done = (guid: string) =>
      this.#states.set(volume.name, { checkedAt: this.#now(), current: true, guid });
    // A clean copy at the head (most ticks) needs no manifest at all.
    const owner = { generation: r.generation, heldBefore: false };
    if (planCopy(local, { ...owner, chain: [head] }).kind === "current") {
      done(head);
      return undefined;
    }
    const { manifests } = await readManifests(
      this.#d.store,
      volume.volumeKey,
      log,
      this.#manifests,
    );
    const chain = chainTo(manifests, head);
    checkChainFits(volume.name, r.settings, chain);
    const kind = kindOf(r.settings);
    const plan = planCopy(local, {
      generation: r.generation,
      heldBefore: false,
      chain: chain.map((m) => m.guid),
      kind,
    });
    const started = performance.now();
    const received = (kind: "increment" | "full", streams: number, bytes: number) => {
      done(head);
      log.info("standby copy received", {
        kind,
        streams,
        bytes,
        head,
        ms: Math.round(performance.now() - started),
      });
      return { kind, bytes };
    };
    switch (plan.kind) {
      case "current":
        done(head);
        return undefined;
      case "create":
        // Not reached: the head is set. Nothing to receive either way.
        return undefined;
      case "increment": {
        const after = chain.slice(chain.findIndex((m) => m.guid === plan.from) + 1);
        let bytes = 0;
        // A zvol has no mount of its own, and its increments bring their volsize (zfs refuses
        // to set one on a read-only zvol).
        if (kind === "filesystem") {
          // As a stage does: zfs receives into an unmounted filesystem (a clean copy is one).
          await this.#d.zfs.unmount(dataset);
          // The volume may have grown since the copy was made: the increments need its room.
          await this.#grow(dataset, r, log);
        }
        for (const manifest of after) {
          signal.throwIfAborted();
          await receiveFromStore(this.#d.receive, { manifest, target: dataset, signal });
          // At once: the copy stays clean (marker on its newest snapshot) between increments.
          await this.#d.zfs.set(dataset, FOLLOW_RELEASED_PROPERTY, manifest.guid);
          bytes += manifest.size;
        }
        return received("increment", after.length, bytes);
      }
      case "full": {
        if (plan.setAside) await this.#setAside(dataset, local?.kind ?? kind, plan.why, log);
        await restoreVolume(this.#d.receive, {
          parentDataset: this.#d.parentDataset,
          chain,
          target: dataset,
          properties: [
            ...Object.entries({
              ...r.settings.properties,
              ...receivedZvolProperties(r.settings, chain.at(-1)),
            }).filter(([k]) => !CREATE_ONLY.has(k) && k !== BACKUP_INTERVAL_PROPERTY),
            // A standby copy is never backed up: only the holder uploads.
            [BACKUP_INTERVAL_PROPERTY, "0"],
            [FOLLOW_GENERATION_PROPERTY, STANDBY_GENERATION],
            [FOLLOW_RELEASED_PROPERTY, head],
            [STORE_UID_PROPERTY, r.uid],
            ...lockDownProperties(kind),
          ],
          signal,
        });
        return received("full", chain.length, chain.reduce((n, m) => n + m.size, 0));
      }
    }
  }

  /** Whether the copy's release marker says this node holds it ("none": writable as holder). */
  async #markedHeld(dataset: string): Promise<boolean> {
    const props = await this.#d.zfs.getProperties(dataset, [FOLLOW_RELEASED_PROPERTY]);
    const marker = props?.get(FOLLOW_RELEASED_PROPERTY);
    return marker?.source === "local" && marker.value === HELD_MARKER;
  }

  /** Grows the copy's size properties to what the owner object records (never shrinks). */
  async #grow(dataset: string, r: OwnerRecord, log: Logger): Promise<void> {
    const props = await this.#d.zfs.getProperties(dataset, SIZE_PROPERTIES);
    const changes = props ? recordedSizeChanges(props, r.settings) : [];
    if (changes.length === 0) return;
    await this.#d.zfs.setProperties(dataset, changes);
    log.info("standby copy sized as the store records it", { set: Object.fromEntries(changes) });
  }

  /**
   * Sets a diverged copy aside with the trash, unless something still has it mounted (a zvol:
   * unless a stage on this node marks it attached, which the NodeUnstage leaving nothing using
   * it removes).
   */
  async #setAside(dataset: string, kind: CopyKind, why: string, log: Logger): Promise<void> {
    const inUse = kind === "volume"
      ? attachedTo(await this.#d.zfs.getProperties(dataset, [ATTACHED_PROPERTY])) !== undefined
      : (await this.#d.zfs.getProperties(dataset, ["mounted"]))?.get("mounted")?.value === "yes";
    if (inUse) {
      throw new CsiError(
        Code.FAILED_PRECONDITION,
        `This node's copy diverged from the store's head (${why}) and is still ` +
          `${
            kind === "volume" ? "staged here" : "mounted"
          }: it is left alone until nothing uses it`,
      );
    }
    await setAsideCopy(this.#d, dataset, "a standby copy's set-aside");
    log.warn("this node's standby copy diverged from the store's head: set aside, never used", {
      why,
    });
  }
}
