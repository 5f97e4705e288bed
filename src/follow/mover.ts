/**
 * The node side of volumes that follow their job: NodeStage acquires the volume in the store
 * and brings this node's copy to the store's head before it is mounted; NodeUnstage (once the
 * bind is gone) makes the copy read-only, stores a final snapshot and releases the volume with
 * `head` on it; in between, every stored backup moves `head` and the lease is renewed in the
 * background. See owner.ts for the fencing and copy.ts for when a copy is used, topped up or
 * set aside.
 *
 * Per volume, everything here runs one step after the other (a queue that waits, without a
 * deadline): a stage that receives for an hour holds up the volume's release, not the node.
 * Lease renewals are the exception: each volume's lease is written on time whatever runs in
 * its queue or any other volume's (a release's final upload may take long), and only what a
 * renewal finds (a takeover) waits for the queue before it changes the copy. A copy is made
 * writable only right after a conditional write proved this node holds the volume (lease.ts),
 * and with `--takeover-after` it is made read-only again by itself when no such write has landed
 * for three quarters of the TTL (selffence.ts), before any node may take the volume over.
 * A NodeStage repeated while one is preparing the volume joins it and answers when it ends.
 * zfs-fuse cannot resume a receive: an interrupted one (a killed plugin, a failed download)
 * leaves nothing half made (a full receive goes into a hidden dataset renamed only when whole;
 * an increment either lands or not) and the next NodeStage starts it again.
 */

import { Code, CsiError, ZfsError } from "../errors.ts";
import type { Logger } from "../log.ts";
import type { KeyedLock } from "../lock.ts";
import type { Inspection } from "../volume/trash.ts";
import { checkOwnedVolume } from "../volume/datasets.ts";
import type { ZvolContent } from "../volume/zvol.ts";
import type { BackupOptions, BackupOutcome } from "../replicate/backup.ts";
import { BACKUP_INTERVAL_PROPERTY, STORE_UID_PROPERTY } from "../replicate/backup.ts";
import { readManifests } from "../replicate/records.ts";
import { type ReceiveDeps, receiveFromStore } from "../replicate/receive.ts";
import { restoreVolume } from "../replicate/restore.ts";
import { ChainError, chainTo } from "../store/chain.ts";
import type { SnapshotManifest } from "../store/layout.ts";
import type { RequestOptions, Store } from "../store/store.ts";
import { withOwnStoreWait } from "../store/wait.ts";
import { encodeComponent, MANAGED_PROPERTY, volumeForDataset } from "../zfs/names.ts";
import type { PropertyMap } from "../zfs/parse.ts";
import type { Zfs } from "../zfs/zfs.ts";
import {
  FOLLOW_GENERATION_PROPERTY,
  FOLLOW_RELEASED_PROPERTY,
  type LocalCopy,
  planCopy,
} from "./copy.ts";
import {
  acquire,
  createOwner,
  describeOwner,
  FencedError,
  type FollowSettings,
  type HolderTerms,
  type Holding,
  moveHead,
  type OwnerRecord,
  readOwner,
  release,
  renew,
} from "./owner.ts";
import {
  checkChainFits,
  type CopyKind,
  kindOf,
  kindOfCopy,
  lockDownProperties,
  openProperties,
  receivedZvolProperties,
} from "./copy_kind.ts";
import { CopyGate } from "./gate.ts";
import { movesForward } from "./head.ts";
import {
  type FollowTimers,
  type LeaseClocks,
  LeaseKeeper,
  type Proof,
  proofMarginMs,
  proveHolding,
  REAL_TIMERS,
  renewalLimitMs,
  renewEveryMs,
  withinRenewalLimit,
} from "./lease.ts";
import { writeMarkers } from "./markers.ts";
import { ProgressStore } from "./progress.ts";
import { judgeTakeover, LeaseObserver } from "./rule.ts";
import { type FenceState, FOLLOW_SUSPENDED_PROPERTY, SelfFence } from "./selffence.ts";

/** The release marker of a copy this node holds (writable). */
const HELD = "none";
/** The release marker of a copy this node held until another node took the volume over. */
const FENCED = "fenced";

/** Default lease TTL: the holder renews at least this often (every third of it). */
export const DEFAULT_LEASE_TTL_SECONDS = 30;

/** What sets a copy aside: the trash (src/volume/trash.ts), as DeleteVolume does. */
export interface SetAside {
  inspect(dataset: string): Promise<Inspection | undefined>;
  removeVolume(dataset: string, found: Inspection): Promise<void>;
}

/**
 * Sets a diverged copy aside with the trash (the same undo recipe as a deleted volume), under
 * the dataset's lock; nothing when it is gone. Refuses a dataset that is not the plugin's.
 */
export async function setAsideCopy(
  d: Pick<CopyDeps, "locks" | "trash">,
  dataset: string,
  label: string,
): Promise<void> {
  const held = await d.locks.acquire([dataset], { label });
  try {
    const found = await d.trash.inspect(dataset);
    if (!found) return;
    checkOwnedVolume(dataset, found.props);
    await d.trash.removeVolume(dataset, found);
  } finally {
    held.release();
  }
}

/** What a node's copies of follow volumes are handled with: the holder's and a standby's. */
export interface CopyDeps {
  readonly zfs: Zfs;
  readonly store: Store;
  readonly locks: KeyedLock;
  readonly trash: SetAside;
  readonly log: Logger;
  readonly parentDataset: string;
  readonly node: string;
  readonly receive: ReceiveDeps;
}

/** What the follow side of a node works with. */
export interface FollowDeps extends CopyDeps {
  /** Receives from the store (its `store` is replaced by one that logs progress). */
  readonly receive: ReceiveDeps;
  /** One backup of a volume: `(dataset, options) => backupVolume(backupDeps, dataset, options)`. */
  readonly backup: (dataset: string, options?: BackupOptions) => Promise<BackupOutcome>;
  /** The lease this node promises to renew within (default 30 s). */
  readonly ttlSeconds?: number;
  /**
   * `--takeover-after`: undefined = only an explicit takeover. With it, this node also promises
   * to fence itself (selffence.ts), and takes over by the rule only holders that promised it.
   */
  readonly takeoverAfterMs?: number;
  /** Longest gap between two progress lines of a receive (default 10 s). */
  readonly progressEveryMs?: number;
  /** Wall clock (ms since the epoch), only for stamps people read; replaceable in tests. */
  readonly now?: () => number;
  /** Monotonic ms, for the takeover rule and the lease's proofs; replaceable in tests. */
  readonly monotonic?: () => number;
  /** The timers leases are renewed on (default: unref'd setTimeout); replaceable in tests. */
  readonly timers?: FollowTimers;
  /** Shared with the standby receives (standby.ts), which a stage or release stops. */
  readonly gate?: CopyGate;
}

/** One follow volume on this node. */
export interface FollowVolume {
  /** The CSI volume name (its dataset's name below the parent, decoded). */
  readonly name: string;
  readonly dataset: string;
}

/** A NodeStage of a follow volume. */
export interface StageSpec extends FollowVolume {
  /**
   * A registered volume (context `follow = "true"`) has no owner object until its first stage,
   * which makes one with these settings.
   */
  readonly registered?: FollowSettings;
  /**
   * Present when the caller stages the volume as a zvol (its node path: device, format, mount),
   * with the content it asks for when the request says; absent: as a ZFS dataset. A volume
   * whose settings say otherwise is refused before its copy is touched.
   */
  readonly asZvol?: { readonly content?: ZvolContent };
}

/** Options of {@linkcode FollowVolumes.release}. */
export interface ReleaseOptions {
  /**
   * Whether something on this node uses the copy again (a later NodeStage's bind), asked in the
   * volume's turn right before the release: then the release is skipped. NodeUnstage passes
   * its look at the mount table, under the volume's lock.
   */
  readonly inUse?: () => Promise<boolean>;
}

/** Proofs in a row a copy may take to become writable before the stage gives up. */
const PROOF_TRIES = 3;

/** Create-only properties: a received stream brings them, zfs refuses to set them after. */
export const CREATE_ONLY = new Set([
  "casesensitivity",
  "normalization",
  "utf8only",
  "encryption",
  "keyformat",
  "pbkdf2iters",
]);

const COPY_PROPS = [
  "type",
  "guid",
  "createtxg",
  "readonly",
  MANAGED_PROPERTY,
  FOLLOW_GENERATION_PROPERTY,
  FOLLOW_RELEASED_PROPERTY,
] as const;

/** The node side of follow volumes; see the module doc. */
export class FollowVolumes {
  readonly #d: FollowDeps;
  readonly #observer: LeaseObserver;
  readonly #now: () => number;
  readonly #clocks: LeaseClocks;
  readonly #timers: FollowTimers;
  readonly #ttl: number;
  /** What every write of an owner object here promises. */
  readonly #terms: HolderTerms;
  readonly #fence: SelfFence;
  readonly #gate: CopyGate;
  /** The tail of each volume's queue of steps. */
  readonly #tails = new Map<string, Promise<void>>();
  /** The stage preparing each volume, which a repeated NodeStage joins. */
  readonly #staging = new Map<string, Promise<void>>();
  /** The volumes whose lease is being written now (renewAll does not pile them up). */
  readonly #renewing = new Set<string>();
  /** The volumes whose lease a stage's LeaseKeeper renews while it receives. */
  readonly #keeping = new Set<string>();
  /** How many NodeStage calls ({@linkcode FollowVolumes.stage}) run per volume. */
  readonly #claims = new Map<string, number>();
  /** A release that found the volume claimed by a stage, which makes it if it fails. */
  readonly #deferred = new Map<string, { volume: FollowVolume; options: ReleaseOptions }>();
  /** Whether zfs knows OpenZFS's `written` (learnt on first refusal). */
  #knowsWritten = true;
  /** Cancels the next renewal round, while {@linkcode FollowVolumes.start}ed. */
  #cancel: (() => void) | undefined;

  constructor(deps: FollowDeps) {
    this.#d = deps;
    const monotonic = deps.monotonic ?? (() => performance.now());
    this.#observer = new LeaseObserver(monotonic);
    this.#now = deps.now ?? Date.now;
    this.#clocks = { now: this.#now, monotonic };
    this.#timers = deps.timers ?? REAL_TIMERS;
    this.#ttl = deps.ttlSeconds ?? DEFAULT_LEASE_TTL_SECONDS;
    this.#terms = { ttlSeconds: this.#ttl, selfFence: deps.takeoverAfterMs !== undefined };
    this.#fence = new SelfFence({
      zfs: deps.zfs,
      log: deps.log,
      monotonic,
      timers: this.#timers,
      ttlSeconds: this.#ttl,
    });
    this.#gate = deps.gate ?? new CopyGate();
  }

  /** This node's writable copies of follow volumes and whether each is suspended (metrics). */
  fenceState(): FenceState[] {
    return this.#fence.state();
  }

  /** What keeps standby receives out of this node's stages and releases. */
  get gate(): CopyGate {
    return this.#gate;
  }

  /**
   * This node's copy of a follow volume as the move judges it (copy.ts), or undefined.
   * @throws {CsiError} FAILED_PRECONDITION when the dataset is not the plugin's
   */
  readCopy(dataset: string): Promise<LocalCopy | undefined> {
    return this.#readCopy(dataset);
  }

  /** The store the volumes follow through. */
  get store(): Store {
    return this.#d.store;
  }

  /** The lease TTL this node writes. */
  get ttlSeconds(): number {
    return this.#ttl;
  }

  /**
   * Before NodeStage mounts: acquires the volume and brings this node's copy to the store's
   * head (see the module doc). A call while one prepares the same volume joins it.
   * @throws {CsiError} FAILED_PRECONDITION naming the holder when another node holds it (see
   *   rule.ts); NOT_FOUND when the store knows no such follow volume
   * @throws {StoreError}, ZfsError, ReplicateError when the store, zfs or a stream fails
   */
  prepareStage(spec: StageSpec): Promise<void> {
    const running = this.#staging.get(spec.dataset);
    if (running) {
      this.#d.log.info("joining the stage that prepares this follow volume", {
        dataset: spec.dataset,
      });
      return running;
    }
    const run = this.#gate.exclusive(
      spec.dataset,
      () => this.#serial(spec.dataset, () => this.#prepare(spec)),
    ).finally(() => this.#staging.delete(spec.dataset));
    this.#staging.set(spec.dataset, run);
    return run;
  }

  /**
   * A NodeStage of a follow volume: {@linkcode prepareStage}, then `mount` (the bind at the
   * staging path, under the volume's lock), the whole as one claim on the volume here. Nomad
   * before 1.11 overlaps the old allocation's NodeUnstage with the new one's NodeStage on one
   * node, and the two are ordered by the volume's queue: a release whose turn comes while a
   * stage holds its claim is skipped (the volume is in use again and stays held here, its
   * copy writable); a release that came first is waited for by the stage, which then acquires
   * the volume again. A stage that fails after a release was skipped for it makes that release
   * (which looks again whether anything uses the copy), so a volume no allocation uses is not
   * left held here.
   * @returns what `mount` returns
   * @throws what prepareStage or `mount` throws
   */
  async stage<T>(spec: StageSpec, mount: () => Promise<T>): Promise<T> {
    const { dataset } = spec;
    this.#claims.set(dataset, (this.#claims.get(dataset) ?? 0) + 1);
    let mounted = false;
    try {
      await this.prepareStage(spec);
      const value = await mount();
      mounted = true;
      return value;
    } finally {
      const left = (this.#claims.get(dataset) ?? 1) - 1;
      if (left > 0) {
        this.#claims.set(dataset, left);
      } else {
        this.#claims.delete(dataset);
        const deferred = this.#deferred.get(dataset);
        this.#deferred.delete(dataset);
        if (deferred && !mounted) {
          await this.release(deferred.volume, deferred.options).catch((err) =>
            this.#d.log.warn(
              "a release left to a failed stage failed; the next NodeUnstage " +
                "releases the volume",
              { dataset, error: err },
            )
          );
        }
      }
    }
  }

  /**
   * After NodeUnstage removed the last bind: makes the copy read-only, stores a final snapshot
   * and releases the volume with `head` on it; the copy stays, unmounted and read-only, as a
   * warm copy. A copy this node no longer holds is only made read-only. Skipped when, in its
   * turn, a NodeStage of the volume runs here ({@linkcode stage}) or `options.inUse` says
   * something uses the copy again.
   * @throws {CsiError} UNAVAILABLE when the volume stayed busy; StoreError, ZfsError when the
   *   store or zfs fails (Nomad retries NodeUnstage)
   */
  release(volume: FollowVolume, options: ReleaseOptions = {}): Promise<void> {
    return this.#gate.exclusive(
      volume.dataset,
      () => this.#serial(volume.dataset, () => this.#release(volume, options)),
    );
  }

  /**
   * After a scheduled backup of `dataset` stored a snapshot: moves `head` to it, if this node
   * holds the volume and the snapshot is newer than the head (on a chain through it). A node
   * that finds it was taken over makes its copy read-only. Never throws: failures are logged.
   */
  async afterBackup(dataset: string, outcome: BackupOutcome): Promise<void> {
    if (outcome.status !== "stored") return;
    try {
      const props = await this.#d.zfs.getProperties(dataset, [FOLLOW_GENERATION_PROPERTY]);
      if (generationOf(props) === undefined) return;
      const name = volumeForDataset(this.#d.parentDataset, dataset);
      if (name === undefined) return;
      await this.#serial(dataset, () => this.#advance({ name, dataset }, outcome.manifest));
    } catch (err) {
      this.#d.log.warn("could not move the follow volume's head", { dataset, error: err });
    }
  }

  /**
   * A scheduled backup of `dataset` (the scheduler's, run by `backup`). A copy of a follow
   * volume is backed up only while this node holds it and no stage or release of it runs here
   * (gate.ts, as a standby receive): a stage or release that starts meanwhile stops its upload
   * and waits for it, so that it stores its own snapshot last. Run alongside them, a backup
   * could stamp a copy being staged with a store uid of its own (its record then refuses the
   * volume's uid), or snapshot a released copy after its final snapshot, which then no longer
   * matches the store's head (copy.ts) and costs a full receive at the next stage. The stored
   * snapshot becomes the head (afterBackup). Any other dataset is backed up as it is.
   * @returns "busy" when a stage or release of the copy runs or stopped it, when this node does
   *   not hold it (released, fenced, a standby's), or when the dataset is gone
   * @throws what `backup` throws
   */
  async scheduledBackup(
    dataset: string,
    options: BackupOptions,
    backup: (options: BackupOptions) => Promise<BackupOutcome>,
  ): Promise<BackupOutcome> {
    const props = await this.#d.zfs.getProperties(dataset, [FOLLOW_GENERATION_PROPERTY]);
    if (!props) return { status: "busy" };
    if (generationOf(props) === undefined) return await backup(options);
    // Nor while a NodeStage of it runs here, up to its mount: a zvol's filesystem is made then,
    // and a snapshot taken before its format record says done would be stored as unformatted.
    if (this.#claims.has(dataset)) return { status: "busy" };
    const run = await this.#gate.background(dataset, async (preempt): Promise<BackupOutcome> => {
      // Read in the gate: a release that marked the copy has ended, a later one waits for us.
      const released = await this.#d.zfs.getProperties(dataset, [FOLLOW_RELEASED_PROPERTY]);
      if (released?.get(FOLLOW_RELEASED_PROPERTY)?.value !== HELD) return { status: "busy" };
      const signal = options.signal ? AbortSignal.any([options.signal, preempt]) : preempt;
      try {
        return await backup({ ...options, signal });
      } catch (err) {
        // Stopped by a stage or release, which stores the copy itself.
        if (preempt.aborted && !options.signal?.aborted) return { status: "busy" };
        throw err;
      }
    });
    if (!run.ran) return { status: "busy" };
    await this.afterBackup(dataset, run.value);
    return run.value;
  }

  /**
   * Renews the lease of every volume this node holds, each on its own: no volume's renewal
   * waits for another volume, nor for its own volume's queue (a release holds it for its whole
   * final upload, and keeps its lease this way: its copy stays marked held until that upload
   * is stored). A volume whose last renewal still waits for the store is not asked again; one a
   * stage is preparing is renewed by that stage. What a renewal finds taken over is judged
   * again in the volume's turn before anything is changed on the copy. Each renewal that lands
   * keeps the copy writable (selffence.ts), or makes a suspended one writable again; a copy a
   * previous run of the plugin left writable or suspended here is adopted by its first renewal
   * (see {@linkcode start}). Never throws: failures are logged.
   */
  async renewAll(): Promise<void> {
    let tree;
    try {
      tree = await this.#d.zfs.getTree(this.#d.parentDataset, 1, [
        "type",
        "readonly",
        MANAGED_PROPERTY,
        FOLLOW_GENERATION_PROPERTY,
        FOLLOW_RELEASED_PROPERTY,
        FOLLOW_SUSPENDED_PROPERTY,
      ]);
    } catch (err) {
      this.#d.log.warn("lease renewal could not list the volumes", { error: err });
      return;
    }
    const runs: Promise<void>[] = [];
    for (const [dataset, props] of tree ?? []) {
      const name = volumeForDataset(this.#d.parentDataset, dataset);
      if (name === undefined || dataset.slice(this.#d.parentDataset.length + 1).startsWith(".")) {
        continue;
      }
      if (props.get(MANAGED_PROPERTY)?.source !== "local") continue;
      // Held copies are marked "none"; released ones name a guid, fenced ones say "fenced".
      const generation = generationOf(props);
      if (generation === undefined || props.get(FOLLOW_RELEASED_PROPERTY)?.value !== HELD) {
        continue;
      }
      if (this.#renewing.has(dataset) || this.#keeping.has(dataset)) continue;
      this.#renewing.add(dataset);
      // Suspended by the marker alone: zfs-fuse reports a mounted copy's `readonly` as the
      // mount's ("off", source temporary) even after `zfs set readonly=on`, which it enforces.
      const suspended = props.get(FOLLOW_SUSPENDED_PROPERTY)?.value === "on";
      const copy = { writable: !suspended && props.get("readonly")?.value !== "on", suspended };
      // The generation as the listing read it: no zfs process per volume, only store requests
      // (a renewal that finds a takeover reads the copy again before it acts).
      runs.push(
        this.#renewOne({ name, dataset }, generation, copy)
          .catch((err) =>
            this.#d.log.warn("lease renewal failed; retrying", { dataset, error: err })
          )
          .finally(() => this.#renewing.delete(dataset)),
      );
    }
    await Promise.all(runs);
  }

  /**
   * Renews at once, then every third of the TTL, without keeping the process alive. The first
   * round is a restarted plugin's first look at the copies it holds: a copy left writable stays
   * so only if its renewal lands within a quarter of the TTL (and is watched from then on); one
   * taken over is fenced; one whose renewal does not land in time is made read-only (suspended)
   * when its owner object promised self-fencing (the old process's last write may be as old as
   * that promise allows), else left as it is with an error logged (only an explicit takeover can
   * take it); a copy left suspended stays read-only until a renewal lands.
   */
  start(): void {
    if (this.#cancel !== undefined) return;
    const every = renewEveryMs(this.#ttl);
    const tick = () => {
      this.#cancel = this.#timers.after(tick, every);
      void this.renewAll();
    };
    this.#cancel = this.#timers.after(tick, every);
    void this.renewAll();
  }

  /** Stops renewing (a stopped plugin's leases expire; the volumes stay held by this node). */
  stop(): void {
    this.#cancel?.();
    this.#cancel = undefined;
  }

  /** Runs `fn` after every earlier step of the volume, whatever their outcome. */
  #serial<T>(dataset: string, fn: () => Promise<T>): Promise<T> {
    const before = this.#tails.get(dataset) ?? Promise.resolve();
    const run = before.then(fn);
    const tail = run.then(() => {}, () => {});
    this.#tails.set(dataset, tail);
    void tail.then(() => {
      if (this.#tails.get(dataset) === tail) this.#tails.delete(dataset);
    });
    return run;
  }

  async #prepare(spec: StageSpec): Promise<void> {
    const { store } = this.#d;
    const volumeKey = encodeComponent("Volume name", spec.name);
    const log = this.#d.log.child({ volume: spec.name, dataset: spec.dataset });
    if (spec.registered) {
      await createOwner(store, volumeKey, {
        volume: spec.name,
        uid: randomUid(),
        ttlSeconds: this.#ttl,
        settings: spec.registered,
        nowMs: this.#now(),
      });
      // Listed with the follow volumes (no standbys: a registered volume names none).
      await writeMarkers(store, volumeKey, spec.name, []);
    }
    const acquireSent = this.#clocks.monotonic();
    const { holding, acquired, previous } = await acquire(store, volumeKey, {
      node: this.#d.node,
      nowMs: this.#now(),
      ttlSeconds: this.#ttl,
      selfFence: this.#terms.selfFence,
      mayTakeOver: (current) =>
        judgeTakeover(current, {
          volumeKey,
          observer: this.#observer,
          rule: this.#d.takeoverAfterMs === undefined
            ? {}
            : { takeoverAfterMs: this.#d.takeoverAfterMs },
          nowMs: this.#now(),
        }),
    });
    this.#observer.forget(volumeKey);
    const r = holding.record;
    // A copy this node held all along (a repeated stage) stays watched: each write here counts.
    const landed = (sentAt: number) =>
      this.#fence.proved(spec.dataset, r.generation, {
        sentAt,
        promised: this.#terms.selfFence,
        resume: false,
      });
    if (!acquired) landed(acquireSent);
    // A receive may outlast the lease: renew it meanwhile, so no node takes the volume over
    // from a holder that is busy receiving it.
    const lease = new LeaseKeeper(store, volumeKey, holding, {
      ttlSeconds: this.#ttl,
      clocks: this.#clocks,
      timers: this.#timers,
      log,
      terms: this.#terms,
      onRenewed: (proof) => landed(proof.sentAt),
    });
    this.#keeping.add(spec.dataset);
    const stopLease = () => lease.stop().finally(() => this.#keeping.delete(spec.dataset));
    if (acquired && previous.state === "held") {
      log.warn("follow volume taken over from a holder that stopped renewing", {
        from: previous.holder,
        generation: r.generation,
        head: r.head,
        headAt: r.headAt,
      });
    }
    try {
      checkStagedAs(spec, r.settings);
      const kind = kindOf(r.settings);
      const chain = r.head === null ? [] : await this.#chain(volumeKey, r.head, log);
      checkChainFits(spec.name, r.settings, chain);
      const local = await this.#readCopy(spec.dataset);
      if (local && local.generation === undefined) {
        // Never a copy of a volume that follows its job: a node-local volume of the same name.
        throw new CsiError(
          Code.FAILED_PRECONDITION,
          `Dataset "${spec.dataset}" holds a volume of this node with the same name as volume ` +
            `"${spec.name}", which follows its job; it is left alone. Give one of them another ` +
            `name (this node cannot stage "${spec.name}" until then)`,
        );
      }
      // Made with its generation: a copy of a follow volume always says it is one. And made
      // read-only and (a dataset) not mounted at boot: only #makeWritable opens it, right after
      // its proof, so a stage that fails leaves nothing writable behind.
      const marks = {
        [FOLLOW_GENERATION_PROPERTY]: String(r.generation),
        [FOLLOW_RELEASED_PROPERTY]: HELD,
        ...Object.fromEntries(lockDownProperties(kind)),
      };
      const plan = planCopy(local, {
        generation: r.generation,
        heldBefore: !acquired,
        chain: chain.map((m) => m.guid),
        kind,
      });
      log.info("follow volume held here", {
        generation: r.generation,
        head: r.head,
        plan: plan.kind,
        ...("why" in plan ? { why: plan.why } : {}),
        ...(local ? { copy: local } : {}),
      });
      if ((plan.kind === "full" || plan.kind === "create") && plan.setAside) {
        await this.#setAside(spec.dataset, plan.why, log);
      }
      switch (plan.kind) {
        case "current":
          break;
        case "increment": {
          const after = chain.slice(chain.findIndex((m) => m.guid === plan.from) + 1);
          await this.#receive(spec.dataset, after, log, async (receive) => {
            // zfs receives into an unmounted filesystem; a zvol has no mount of its own.
            if (kind === "filesystem") await this.#d.zfs.unmount(spec.dataset);
            for (const manifest of after) {
              await receiveFromStore(receive, { manifest, target: spec.dataset });
            }
          });
          break;
        }
        case "full":
          await this.#receive(spec.dataset, chain, log, (receive) =>
            restoreVolume(receive, {
              parentDataset: this.#d.parentDataset,
              chain,
              target: spec.dataset,
              properties: Object.entries({
                ...r.settings.properties,
                ...receivedZvolProperties(r.settings, chain.at(-1)),
                ...marks,
              }).filter(([k]) => !CREATE_ONLY.has(k)),
            }));
          break;
        case "create":
          try {
            await this.#create(spec.dataset, r.settings, marks);
          } catch (err) {
            // A dataset without data of ours (judged by the marker below) or a repeat.
            if (!(err instanceof ZfsError && err.kind === "exists")) throw err;
          }
          break;
      }
      const held = await stopLease().catch((err) => {
        throw fencedStage(err, "while this node received it");
      });
      await this.#makeWritable(spec.dataset, kind, volumeKey, held, log, landed).catch((err) => {
        throw fencedStage(err, "before this node could make its copy writable");
      });
    } catch (err) {
      await stopLease().catch(() => {});
      // Acquired here but not made usable (the store or zfs failed): hand the volume back, head
      // unchanged, so that the next stage anywhere can take it without a takeover. With a store
      // wait of its own: the call's may be what ran out, and this write must neither fail at
      // once for that nor wait without bound.
      if (acquired) {
        await withOwnStoreWait(() =>
          release(store, volumeKey, lease.holding, undefined, this.#now())
        ).catch((e) =>
          log.warn("could not hand the volume back after a failed stage", { error: e })
        );
      }
      throw err;
    }
  }

  /** Makes an empty copy as the settings say: a dataset, or a zvol of the volume's size. */
  async #create(
    dataset: string,
    settings: FollowSettings,
    marks: Readonly<Record<string, string>>,
  ): Promise<void> {
    const props = { ...settings.properties, ...marks };
    const z = settings.zvol;
    if (!z) return await this.#d.zfs.create(dataset, props);
    await this.#d.zfs.createVolume(
      dataset,
      { sizeBytes: settings.capacityBytes, sparse: z.sparse },
      { ...props, ...(z.volblocksize ? { volblocksize: String(z.volblocksize) } : {}) },
    );
  }

  /** The head's chain, full stream first. */
  async #chain(volumeKey: string, head: string, log: Logger): Promise<SnapshotManifest[]> {
    const { manifests } = await readManifests(this.#d.store, volumeKey, log);
    try {
      return chainTo(manifests, head);
    } catch (err) {
      if (!(err instanceof ChainError)) throw err;
      throw new CsiError(
        Code.DATA_LOSS,
        `The store's copy of volume "${volumeKey}" cannot be received: ${err.message}`,
        { cause: err },
      );
    }
  }

  /** Receives through a store that logs progress at least every 10 s. */
  async #receive(
    dataset: string,
    manifests: readonly SnapshotManifest[],
    log: Logger,
    fn: (receive: ReceiveDeps) => Promise<void>,
  ): Promise<void> {
    const totalBytes = manifests.reduce((n, m) => n + m.size, 0);
    const progress = new ProgressStore(this.#d.store, log, {
      totalBytes,
      ...(this.#d.progressEveryMs === undefined ? {} : { everyMs: this.#d.progressEveryMs }),
    });
    const started = performance.now();
    progress.start();
    try {
      await fn({ ...this.#d.receive, store: progress });
    } finally {
      progress.stop();
    }
    log.info("follow volume received", {
      dataset,
      streams: manifests.length,
      bytes: progress.bytes,
      ms: Math.round(performance.now() - started),
    });
  }

  /** This node's copy, or undefined; refuses a dataset that is not the plugin's. */
  async #readCopy(dataset: string): Promise<LocalCopy | undefined> {
    const tree = await this.#d.zfs.getTree(dataset, 1, COPY_PROPS);
    const props = tree?.get(dataset);
    if (!tree || !props) return undefined;
    checkOwnedVolume(dataset, props);
    let newest: { guid: string; txg: number } | undefined;
    for (const [name, p] of tree) {
      if (!name.startsWith(`${dataset}@`) || p.get("type")?.value !== "snapshot") continue;
      const txg = Number(p.get("createtxg")?.value);
      const guid = p.get("guid")?.value;
      if (guid && Number.isSafeInteger(txg) && (!newest || txg > newest.txg)) {
        newest = { guid, txg };
      }
    }
    const generation = generationOf(props);
    const released = props.get(FOLLOW_RELEASED_PROPERTY);
    const written = await this.#written(dataset);
    const kind = kindOfCopy(props);
    return {
      ...(kind ? { kind } : {}),
      ...(generation === undefined ? {} : { generation }),
      ...(released?.source === "local" && /^\d{1,20}$/.test(released.value)
        ? { releasedAt: released.value }
        : {}),
      ...(newest ? { newestGuid: newest.guid } : {}),
      readonly: props.get("readonly")?.value === "on",
      ...(written === undefined ? {} : { written }),
    };
  }

  /** OpenZFS's `written`; undefined on a zfs without it (zfs-fuse). */
  async #written(dataset: string): Promise<number | undefined> {
    if (!this.#knowsWritten) return undefined;
    try {
      const v = (await this.#d.zfs.getProperties(dataset, ["written"]))?.get("written")?.value;
      const n = Number(v);
      return Number.isSafeInteger(n) ? n : undefined;
    } catch (err) {
      if (!(err instanceof ZfsError && err.kind === "invalid")) throw err;
      this.#knowsWritten = false;
      return undefined;
    }
  }

  /** Sets a diverged copy aside with the trash (the same undo recipe as a deleted volume). */
  async #setAside(dataset: string, why: string, log: Logger): Promise<void> {
    await setAsideCopy(this.#d, dataset, "a follow volume's move");
    log.warn("this node's copy diverged from the store's head: set aside, never published", {
      why,
    });
  }

  /**
   * The copy becomes the volume: this generation's, writable, mounted at the next stage. Only
   * right after a write that proves this node still holds the generation (whatever the renewals
   * during the receive saw: a 503 or a timeout proves nothing), and only if `readonly=off` is
   * set within the proof's margin (lease.ts proofMarginMs says why that margin holds, on the
   * taker's monotonic clock): a step that took longer is proved again, before the copy is made
   * writable, or after it when it was zfs itself that took long (then a failed proof makes the
   * copy read-only again).
   * @returns the holding as the last proof wrote it
   * @throws {FencedError} when the volume was taken over; StoreError when no proof could be
   *   made; CsiError UNAVAILABLE when each step outlasted its proof
   */
  async #makeWritable(
    dataset: string,
    kind: CopyKind,
    volumeKey: string,
    held: Holding,
    log: Logger,
    landed: (sentAt: number) => void,
  ): Promise<Holding> {
    const { zfs, store } = this.#d;
    const r = held.record;
    const interval = r.settings.properties[BACKUP_INTERVAL_PROPERTY];
    const prove = async (h: Holding) => {
      const p = await proveHolding(store, volumeKey, h, this.#clocks, this.#terms);
      landed(p.sentAt);
      return p;
    };
    let proof = await prove(held);
    // The generation first: a crash right after leaves a copy that knows whose it is.
    await zfs.setProperties(dataset, [
      [FOLLOW_GENERATION_PROPERTY, String(r.generation)],
      [FOLLOW_RELEASED_PROPERTY, HELD],
      [STORE_UID_PROPERTY, r.uid],
      ...(interval === undefined ? [] : [[BACKUP_INTERVAL_PROPERTY, interval] as const]),
    ]);
    for (let tries = 1; this.#outlasted(proof); tries++) {
      if (tries >= PROOF_TRIES) {
        throw new CsiError(
          Code.UNAVAILABLE,
          `Volume "${r.volume}": this node could not make its copy writable within ` +
            `${proofMarginMs(this.#ttl) / 1000}s of proving it holds the volume (zfs or the ` +
            `store too slow), ${PROOF_TRIES} times; the copy stays read-only`,
        );
      }
      log.warn("proving the holding again: the copy was not ready within the proof's margin");
      proof = await prove(proof.holding);
    }
    // Watched from this proof on (selffence.ts): suspended if no later write lands in time.
    await this.#fence.open(
      dataset,
      { volume: r.volume, generation: r.generation },
      { sentAt: proof.sentAt, promised: this.#terms.selfFence },
      openProperties(kind),
    );
    if (!this.#outlasted(proof)) return proof.holding;
    // zfs took longer than the margin: whether this node still held the volume when the copy
    // became writable is decided by another proof (under the same generation, no node
    // acquired it in between).
    try {
      const again = await proveHolding(store, volumeKey, proof.holding, this.#clocks, this.#terms);
      this.#fence.proved(dataset, r.generation, {
        sentAt: again.sentAt,
        promised: this.#terms.selfFence,
        resume: true,
      });
      return again.holding;
    } catch (err) {
      await this.#fence.forget(dataset);
      await zfs.setProperties(dataset, [["readonly", "on"]]).catch((e) =>
        log.error("could not make the copy read-only again", { error: e })
      );
      throw err;
    }
  }

  /** Whether the proof is too old to act on now (see lease.ts proofMarginMs). */
  #outlasted(proof: Proof): boolean {
    return this.#clocks.monotonic() - proof.sentAt > proofMarginMs(this.#ttl);
  }

  /**
   * The owner object while this node holds the volume under its copy's generation (read from
   * zfs unless the caller just read it).
   */
  async #holding(
    volume: FollowVolume,
    copyGeneration?: number,
    options?: RequestOptions,
  ): Promise<
    | { kind: "mine"; holding: Holding }
    | { kind: "released"; record: OwnerRecord }
    | { kind: "fenced"; record?: OwnerRecord }
  > {
    const generation = copyGeneration ?? generationOf(
      await this.#d.zfs.getProperties(volume.dataset, [FOLLOW_GENERATION_PROPERTY]),
    );
    const current = await readOwner(
      this.#d.store,
      encodeComponent("Volume name", volume.name),
      options,
    );
    const r = current?.record;
    if (!current || !r) return { kind: "fenced" };
    if (r.holder === this.#d.node && r.generation === generation) {
      return r.state === "held"
        ? { kind: "mine", holding: current }
        : { kind: "released", record: r };
    }
    return { kind: "fenced", record: r };
  }

  async #release(volume: FollowVolume, options: ReleaseOptions): Promise<void> {
    const { zfs, store } = this.#d;
    const log = this.#d.log.child({ volume: volume.name, dataset: volume.dataset });
    // Nomad before 1.11: the new allocation's stage may have come since NodeUnstage decided.
    if (this.#claims.has(volume.dataset)) {
      this.#deferred.set(volume.dataset, { volume, options });
      log.info("follow volume in use again: a NodeStage of it runs on this node; not released");
      return;
    }
    if (await options.inUse?.()) {
      log.info("follow volume in use again on this node: not released");
      return;
    }
    const props = await zfs.getProperties(volume.dataset, ["type", MANAGED_PROPERTY]);
    if (!props) return;
    checkOwnedVolume(volume.dataset, props);
    const kind = kindOfCopy(props) ?? "filesystem";
    const state = await this.#holding(volume);
    if (state.kind !== "mine") {
      await this.#fence.forget(volume.dataset);
      await this.#lockDown(volume.dataset, kind);
      if (state.kind === "fenced") {
        log.warn("this node no longer holds the follow volume: its copy stays read-only", {
          owner: describeOwner(state.record),
        });
      }
      return;
    }
    // No more writes, and no scheduled backup of a copy that is not the volume any more. Not
    // watched from here on: a renewal must not make it writable again (selffence.ts).
    await this.#fence.forget(volume.dataset);
    await zfs.setProperties(volume.dataset, [["readonly", "on"], [BACKUP_INTERVAL_PROPERTY, "0"]]);
    const outcome = await this.#d.backup(volume.dataset);
    if (outcome.status !== "stored") {
      throw new CsiError(
        Code.UNAVAILABLE,
        `Volume "${volume.name}" stayed busy; its final snapshot is stored on the next try`,
      );
    }
    const m = outcome.manifest;
    // Marked before the store says so: a copy marked at a snapshot the store never made the
    // head is off the head's chain, hence set aside; never the other way round.
    await zfs.set(volume.dataset, FOLLOW_RELEASED_PROPERTY, m.guid);
    const key = encodeComponent("Volume name", volume.name);
    try {
      await release(
        store,
        key,
        state.holding,
        { guid: m.guid, createdAt: m.createdAt },
        this.#now(),
      );
    } catch (err) {
      if (!(err instanceof FencedError)) throw err;
      log.error(
        "follow volume was taken over before its release: this copy is set aside here " +
          "at its next stage, and its last writes are not the volume's",
        { error: err },
      );
      await this.#lockDown(volume.dataset, kind);
      return;
    }
    await this.#lockDown(volume.dataset, kind);
    log.info("follow volume released", { head: m.guid, bytes: m.size, base: m.baseGuid });
  }

  /**
   * Read-only, unmounted, not mounted at boot: a warm copy nothing writes to. A zvol: read-only
   * (its device too, on OpenZFS); nothing of it is mounted by zfs.
   */
  async #lockDown(dataset: string, kind: CopyKind): Promise<void> {
    await this.#d.zfs.setProperties(dataset, lockDownProperties(kind));
    if (kind === "filesystem") await this.#d.zfs.unmount(dataset);
  }

  async #advance(volume: FollowVolume, m: SnapshotManifest): Promise<void> {
    const state = await this.#holding(volume);
    if (state.kind === "released") return;
    if (state.kind === "fenced") {
      await this.#fenced(volume, state.record);
      return;
    }
    const { record } = state.holding;
    const key = encodeComponent("Volume name", volume.name);
    if (record.head !== null && record.head !== m.guid) {
      // Only forward: after the head on its chain, or on a newer chain (head.ts).
      const { manifests } = await readManifests(this.#d.store, key, this.#d.log);
      if (!movesForward(manifests, m.guid, record.head)) {
        this.#d.log.info("stored snapshot is not after the head; the head stays", {
          dataset: volume.dataset,
          guid: m.guid,
          head: record.head,
        });
        return;
      }
    }
    // The move is its own proof: a conditional write that lands only while this node holds the
    // generation its copy was made writable under, so no node acquired the volume between this
    // node's acquire and now, and the snapshot (taken on this copy in between) holds only this
    // holding's writes. Nothing is made writable on its strength, so no margin applies
    // (lease.ts proofMarginMs): a move that lands late is as true as one that lands at once.
    try {
      const sentAt = this.#clocks.monotonic();
      await moveHead(
        this.#d.store,
        key,
        state.holding,
        {
          guid: m.guid,
          createdAt: m.createdAt,
        },
        this.#now(),
        this.#terms,
      );
      this.#fence.proved(volume.dataset, record.generation, {
        sentAt,
        promised: this.#terms.selfFence,
        resume: !this.#keeping.has(volume.dataset),
      });
    } catch (err) {
      if (!(err instanceof FencedError)) throw err;
      await this.#fenced(volume, err.current);
    }
  }

  async #renewOne(
    volume: FollowVolume,
    generation: number,
    copy: { readonly writable: boolean; readonly suspended: boolean },
  ): Promise<void> {
    const { dataset } = volume;
    const own = this.#terms.selfFence;
    // A copy a previous run of the plugin left writable or suspended here: watched from now
    // on, writable only if this renewal lands in time (selffence.ts adopt).
    const adopted = (copy.writable || copy.suspended) &&
      this.#fence.adopt(dataset, { volume: volume.name, generation }, {
        promised: own,
        suspended: copy.suspended,
      });
    try {
      const key = encodeComponent("Volume name", volume.name);
      // Given up after a quarter of the TTL (a store that never answers must not hold back
      // the next renewal), and outside any call's store wait.
      const found = await withinRenewalLimit(
        this.#timers,
        renewalLimitMs(this.#ttl),
        `Renewing the lease of "${key}"`,
        async (options) => {
          const state = await this.#holding(volume, generation, options);
          if (state.kind !== "mine") return state.kind;
          // Until this node's write lands, the promise in force is the one last written.
          if (adopted) {
            this.#fence.promised(dataset, generation, state.holding.record.selfFence === true);
          }
          const sentAt = this.#clocks.monotonic();
          await renew(this.#d.store, key, state.holding, this.#now(), this.#terms, options);
          // A renewal given up proves nothing, even if its answer comes after all.
          options.signal?.throwIfAborted();
          this.#fence.proved(dataset, generation, { sentAt, promised: own, resume: true });
          return "renewed";
        },
      );
      if (found !== "fenced") return;
    } catch (err) {
      if (!(err instanceof FencedError)) {
        if (adopted && copy.writable && !this.#fence.promises(dataset)) {
          this.#d.log.error(
            "this node holds a follow volume whose copy is writable, and cannot renew its " +
              "lease: the copy is left writable (its holder did not promise to fence itself, so " +
              "only an explicit takeover can take the volume); its lease is tried again at " +
              "every renewal",
            { dataset, error: err },
          );
        }
        throw err;
      }
    }
    // Taken over, as this look saw it. Judged again in the volume's turn, after any stage or
    // release of it here, which may have changed the copy or the owner object meanwhile.
    await this.#serial(volume.dataset, async () => {
      const now = await this.#holding(volume);
      if (now.kind === "fenced") await this.#fenced(volume, now.record);
    });
  }

  /**
   * This node's writable copy is no longer the volume (another node took it over): it is marked
   * fenced (so it is set aside at its next stage), made read-only and unmounted if nothing uses
   * it. OpenZFS remounts a mounted filesystem read-only at once; zfs-fuse refuses to open files
   * for writing from then on, but a job still running there writes on through files it had open
   * until it stops (to a copy nothing publishes).
   */
  async #fenced(volume: FollowVolume, record: OwnerRecord | undefined): Promise<void> {
    await this.#fence.forget(volume.dataset);
    this.#d.log.error(
      "follow volume was taken over by another node: this node's copy is made read-only, and " +
        "what was written here after the store's head is not the volume's",
      { dataset: volume.dataset, owner: describeOwner(record) },
    );
    const kind = kindOfCopy(await this.#d.zfs.getProperties(volume.dataset, ["type"])) ??
      "filesystem";
    await this.#d.zfs.setProperties(volume.dataset, [
      [FOLLOW_RELEASED_PROPERTY, FENCED],
      // Not the volume any more: no more uploads of it.
      [BACKUP_INTERVAL_PROPERTY, "0"],
      ...lockDownProperties(kind),
    ]);
    // A zvol's filesystem is the node's mount, which its NodeUnstage undoes.
    if (kind === "volume") return;
    try {
      await this.#d.zfs.unmount(volume.dataset);
    } catch (err) {
      this.#d.log.warn("fenced copy stays mounted: something still uses it", {
        dataset: volume.dataset,
        error: err,
      });
    }
  }
}

/**
 * Refuses a stage of the volume as what it is not: a zvol staged as a ZFS dataset or the
 * reverse, or a zvol holding one thing staged as another (the settings say what it is).
 * @throws {CsiError} INVALID_ARGUMENT saying what the volume is
 */
function checkStagedAs(spec: StageSpec, settings: FollowSettings): void {
  const z = settings.zvol;
  const asked = spec.asZvol;
  const hint = (c: ZvolContent) => c === "block" ? "a block capability" : `fs_type "${c}"`;
  let why: string | undefined;
  if (z && !asked) {
    why = `it is a zvol holding ${z.content}: stage it as one (${hint(z.content)})`;
  } else if (!z && asked) {
    why = `it is a ZFS dataset, not a zvol: stage it with a mount capability and fs_type ` +
      `"zfs" or none`;
  } else if (z && asked?.content !== undefined && asked.content !== z.content) {
    why = `it is a zvol holding ${z.content}, and the request stages it as ${asked.content}`;
  }
  if (why !== undefined) {
    throw new CsiError(Code.INVALID_ARGUMENT, `Volume "${spec.name}" follows its job, and ${why}`);
  }
}

/**
 * A stage's error for a volume taken over (FencedError) at `when`: FAILED_PRECONDITION naming
 * the new holder; any other error as it is.
 */
function fencedStage(err: unknown, when: string): unknown {
  if (!(err instanceof FencedError)) return err;
  return new CsiError(
    Code.FAILED_PRECONDITION,
    `${err.message}; it was taken over ${when}, and this node's copy stays read-only`,
    { cause: err },
  );
}

function generationOf(props: PropertyMap | undefined): number | undefined {
  const v = props?.get(FOLLOW_GENERATION_PROPERTY);
  if (!v || v.source !== "local" || !/^\d{1,15}$/.test(v.value)) return undefined;
  return Number(v.value);
}

/** A new volume uid: 32 lowercase hex digits. */
export function randomUid(): string {
  return [...crypto.getRandomValues(new Uint8Array(16))]
    .map((b) => b.toString(16).padStart(2, "0")).join("");
}
