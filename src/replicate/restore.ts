/**
 * Restores a volume from the store: the chain of stored streams is received into a hidden
 * temporary dataset below the parent, checked stream by stream (size, SHA-256, guid, and that
 * the stream decided no property: see receive.ts and stream_properties.ts), given the volume's
 * properties, and only then renamed to the volume's name. A failed restore leaves no volume.
 *
 * Its temporary dataset is destroyed when it is this restore's own, which is read from zfs, never
 * from its name: zfs creates it with this restore's token (`org.zfs-csi:restore-token`, new for
 * each restore: `-o` on OpenZFS, set right after the receive's exit where receive has no `-o`),
 * and a restore that keeps what an earlier receive completed sets its token once it checked it.
 * A dataset carrying the token locally (a stream cannot make a property local), with a snapshot
 * (its receive completed) and nothing else below it is destroyed whatever that snapshot is: a
 * stream whose snapshot is not the manifest's (guid) or that decided properties leaves nothing,
 * and the same restore works once the store is repaired. Any other temporary dataset is
 * destroyed only when it holds exactly the chain's first snapshots. A failed check of the full
 * stream's file leaves zfs receive to end by itself (receive.ts), so what it made is known when
 * it exits; when it had to be killed, zfs-fuse's daemon may still be receiving: the restore waits
 * for it to complete (then destroys it) or to remove the dataset before it answers.
 *
 * From a directory store zfs receive reads the full stream from the file itself while the plugin
 * checks that file (receive.ts `readFile`): the check costs no time of its own, but zfs may
 * complete the snapshot before the check ends, so nothing is renamed or handed out before it
 * passed. Such a receive outlives a plugin killed during it and
 * runs to its end on its own (zfs-fuse's daemon does the receive; OpenZFS's `zfs receive` is
 * not tied to the plugin). A later restore of the same target (the plugin restarted, the
 * CreateVolume repeated) therefore reads what the temporary dataset holds before it acts:
 * - nothing there: it receives the chain;
 * - the dataset without any snapshot: a receive is writing into it (zfs makes the snapshot only
 *   at the stream's end, and removes a failed receive's dataset itself, also at the next pool
 *   import). It is never destroyed: the restore waits until the snapshot appears or the dataset
 *   goes, and gives up (FAILED_PRECONDITION, naming it) only when its space used stops changing
 *   for {@linkcode RestoreDeps.stallMs};
 * - the dataset with the first snapshots of the chain (guids as in the manifests): the full
 *   stream's file is checked again (an orphaned receive completed it unchecked), and only when
 *   it matches its manifest are they kept and the rest of the chain received on top; otherwise
 *   the temporary dataset is destroyed and the restore fails as a bad stream does.
 *   Incrementals go through a pipe and are checked before zfs sees their last bytes (they die
 *   with the plugin), so only the first stream can have an orphaned receive.
 */

import { createHash } from "node:crypto";
import { Code, CsiError, ZfsError } from "../errors.ts";
import type { SnapshotManifest } from "../store/layout.ts";
import { MANAGED_PROPERTY, MANAGED_VALUE } from "../zfs/names.ts";
import { reasonText } from "../zfs/zfs.ts";
import type { PropertyList } from "../zfs/args.ts";
import type { PropertyMap } from "../zfs/parse.ts";
import { ReplicateError } from "../replicate_errors.ts";
import { checkReceivable } from "./receivable.ts";
import { checkChain, checkStoredFile, type ReceiveDeps, receiveFromStore } from "./receive.ts";
import { RESTORE_TOKEN_PROPERTY } from "./stream_properties.ts";

/** Prefix of the temporary datasets restores receive into. */
export const RESTORE_PREFIX = ".restore-";

/** What {@linkcode restoreVolume} works with. */
export interface RestoreDeps extends ReceiveDeps {
  /** How often a receive of another process is looked at while waiting for it (1 s). */
  readonly pollMs?: number;
  /**
   * How long another process's receive may go without its space used changing before the
   * restore gives up on it (default {@linkcode STALL_MS}).
   */
  readonly stallMs?: number;
}

/** Default of {@linkcode RestoreDeps.stallMs}. */
export const STALL_MS = 10 * 60_000;

/** Attempts to start the chain's receive when another receive keeps taking the name first. */
const START_ATTEMPTS = 5;

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

/** What the temporary dataset holds, looked at with zfs. */
type TempState =
  | { readonly kind: "missing" }
  /** A receive is writing into it: no snapshot yet. */
  | { readonly kind: "receiving"; readonly used: string }
  /** The first `count` streams of the chain, received whole. */
  | { readonly kind: "received"; readonly count: number };

/**
 * Receives the chain into the temporary dataset, sets the properties and renames it to
 * `target`; see the module doc for what it does with a temporary dataset already there. A
 * failed restore destroys the temporary dataset when it is this restore's own (it carries this
 * restore's token, set as zfs created it, or set when this restore took over what an earlier
 * receive completed and checked it), whatever it holds; else only when it holds nothing but the
 * chain's first snapshots.
 * @throws whatever receiveFromStore throws (ReplicateError, ZfsError, StoreError), after cleaning up
 * @throws {ZfsError} exists when `target` appeared meanwhile; CsiError FAILED_PRECONDITION when
 *   the temporary dataset holds something this restore did not receive, or a receive into it
 *   stalled
 */
export async function restoreVolume(deps: RestoreDeps, spec: RestoreVolumeSpec): Promise<void> {
  checkChain(spec.chain);
  const type = restoredType(spec.chain);
  // The whole chain's form, before anything is received (receivable.ts).
  await checkReceivable(deps.zfs, spec.parentDataset, spec.chain);
  const temp = restoreTempDataset(spec.parentDataset, spec.target);
  const log = deps.log.child({ target: spec.target, temp });
  const { chain, signal } = spec;
  // New for each restore: a temporary dataset carrying it is this restore's and nobody else's.
  const token = randomToken();
  const props = spec.properties.filter(([name]) => name !== MANAGED_PROPERTY);
  // The restore sets these itself before anything uses the dataset: a stream's value loses.
  const settles = new Set([MANAGED_PROPERTY, ...props.map(([name]) => name)]);
  for (let attempt = 1;; attempt++) {
    signal?.throwIfAborted();
    let state = judge(await readTemp(deps, temp), temp, chain, type);
    if (state.kind === "receiving") {
      log.info("waiting for a receive into the temporary dataset that this restore did not start");
      state = await waitForReceive(deps, temp, chain, state, signal);
      if (state.kind === "missing") continue; // that receive failed: start again
    }
    const have = state.kind === "received" ? state.count : 0;
    try {
      if (have > 0) {
        // Received by a process that may have died before its check ended: check it again.
        if (deps.store.openFile) await checkStoredFile(deps, chain[0]!, signal);
        // Checked to hold only the chain's first streams: this restore's from now on.
        await deps.zfs.set(temp, RESTORE_TOKEN_PROPERTY, token);
        log.info("keeping the streams already received", { streams: have });
      }
      for (let i = have; i < chain.length; i++) {
        await receiveFromStore(deps, {
          manifest: chain[i]!,
          target: temp,
          // Only the full stream: see the module doc.
          readFile: i === 0,
          ...(i === 0 ? { createdWith: { [RESTORE_TOKEN_PROPERTY]: token } } : {}),
          settles,
          // A refused stream's dataset is destroyed: nothing of it to undo.
          undoesRefusal: false,
          ...(signal ? { signal } : {}),
        });
      }
      // The temporary dataset is nobody's until renamed: the order of its properties is free.
      await deps.zfs.setProperties(temp, [[MANAGED_PROPERTY, MANAGED_VALUE], ...props], {
        inAnyOrder: true,
      });
      await deps.zfs.rename(temp, spec.target);
      break;
    } catch (err) {
      try {
        const tree = await readTemp(deps, temp);
        if (isOwn(tree, temp, token)) {
          await destroyTemp(deps, temp);
          log.info("removed the failed restore's temporary dataset", { error: err });
          throw err;
        }
        let after = judge(tree, temp, chain, type);
        if (after.kind === "receiving" && have === 0 && stoppedByCheck(err)) {
          // The check killed this restore's zfs receive of the file, but on zfs-fuse that only
          // ends the zfs process: its daemon reads the file itself and goes on, then completes
          // the snapshot or removes the dataset. Left, it would be there after the answer.
          log.info("waiting for zfs to finish with the receive the failed check stopped");
          after = await waitForReceive(deps, temp, chain, after, signal, STOPPED_STALL_MS);
        }
        // zfs refused because another process's receive took the name first (its plugin was
        // killed just after starting it): wait for that one, or keep what it received. Never
        // destroyed here: what it holds is that receive's, not this one's.
        if (
          have === 0 && tookTheName(err) && after.kind !== "missing" &&
          attempt < START_ATTEMPTS && !signal?.aborted
        ) {
          log.info("another receive took the temporary dataset first", { error: err.message });
          continue;
        }
        if (after.kind === "received") await destroyTemp(deps, temp);
      } catch (cleanup) {
        if (cleanup === err) throw err;
        log.warn("could not remove a failed restore's temporary dataset", { error: cleanup });
      }
      throw err;
    }
  }
  log.info("volume restored from the store", {
    snapshots: chain.length,
    bytes: chain.reduce((n, m) => n + m.size, 0),
  });
}

/**
 * What the chain makes: a zvol when its manifests say so, else a filesystem.
 * @throws {CsiError} FAILED_PRECONDITION for a chain whose manifests disagree (written by
 *   someone else: the plugin never bases a zvol's stream on a dataset's or the reverse)
 */
export function restoredType(chain: readonly SnapshotManifest[]): "filesystem" | "volume" {
  const zvols = chain.filter((m) => m.zvol !== undefined).length;
  if (zvols !== 0 && zvols !== chain.length) {
    throw new CsiError(
      Code.FAILED_PRECONDITION,
      `The stored chain of "${chain.at(-1)?.snapshot}" of volume "${chain.at(-1)?.volume}" ` +
        `mixes streams of a zvol and of a dataset: it cannot be restored`,
    );
  }
  return zvols > 0 ? "volume" : "filesystem";
}

/** What {@linkcode readTemp} reads of the temporary dataset and its snapshots. */
const TEMP_PROPERTIES = ["type", "guid", "used", RESTORE_TOKEN_PROPERTY];

/** The temporary dataset and what is below it, or undefined when it does not exist. */
function readTemp(deps: RestoreDeps, temp: string): Promise<Map<string, PropertyMap> | undefined> {
  return deps.zfs.getTree(temp, 1, TEMP_PROPERTIES);
}

/**
 * Whether the temporary dataset is this restore's own, from what zfs says of it: it carries
 * this restore's token, set locally (a stream cannot make a property local), it holds at least
 * one snapshot (so the receive that made it completed; a dataset without one may still be
 * written by zfs, which removes it itself when that receive fails) and no dataset below it.
 */
function isOwn(
  tree: ReadonlyMap<string, PropertyMap> | undefined,
  temp: string,
  token: string,
): boolean {
  const mark = tree?.get(temp)?.get(RESTORE_TOKEN_PROPERTY);
  if (!tree || mark?.value !== token || mark.source !== "local") return false;
  const below = [...tree.keys()].filter((name) => name !== temp);
  return below.length > 0 && below.every((name) => name.startsWith(`${temp}@`));
}

/** 32 random hex digits. */
function randomToken(): string {
  return [...crypto.getRandomValues(new Uint8Array(16))]
    .map((b) => b.toString(16).padStart(2, "0")).join("");
}

/**
 * What the temporary dataset holds, as {@linkcode readTemp} read it. Received streams must be
 * the chain's first ones (the guids of its snapshots), nothing else may be below it.
 * @throws {CsiError} FAILED_PRECONDITION when it holds something else, naming it
 */
function judge(
  tree: ReadonlyMap<string, PropertyMap> | undefined,
  temp: string,
  chain: readonly SnapshotManifest[],
  type: "filesystem" | "volume",
): TempState {
  if (!tree) return { kind: "missing" };
  const snapshots = [...tree.keys()].filter((name) => name.startsWith(`${temp}@`));
  const guids = new Set(snapshots.map((name) => tree.get(name)?.get("guid")?.value ?? ""));
  const count = chain.findIndex((m) => !guids.has(m.guid));
  const prefix = count < 0 ? chain.length : count;
  const foreign = [...tree.entries()].filter(([name, props]) =>
    name !== temp && !(name.startsWith(`${temp}@`) && inPrefix(props, chain, prefix))
  ).map(([name]) => name);
  if (tree.get(temp)?.get("type")?.value !== type || foreign.length > 0) {
    throw new CsiError(
      Code.FAILED_PRECONDITION,
      `"${temp}" is in the way of a restore and holds what the restore did not receive ` +
        `(${foreign.join(", ") || `not a ${type}`}): rename or destroy it by hand`,
    );
  }
  if (snapshots.length === 0) {
    return { kind: "receiving", used: tree.get(temp)?.get("used")?.value ?? "" };
  }
  return { kind: "received", count: prefix };
}

/** Whether a snapshot is one of the chain's first `count` streams. */
function inPrefix(props: PropertyMap, chain: readonly SnapshotManifest[], count: number): boolean {
  const guid = props.get("guid")?.value;
  return chain.slice(0, count).some((m) => m.guid === guid);
}

/**
 * Waits while another receive writes into the temporary dataset, until its first snapshot
 * appears or the dataset goes.
 * @throws {CsiError} FAILED_PRECONDITION when its space used has not changed for stallMs
 */
async function waitForReceive(
  deps: RestoreDeps,
  temp: string,
  chain: readonly SnapshotManifest[],
  first: TempState & { kind: "receiving" },
  signal: AbortSignal | undefined,
  maxStallMs = Infinity,
): Promise<TempState> {
  const stallMs = Math.min(deps.stallMs ?? STALL_MS, maxStallMs);
  let used = first.used;
  let changed = performance.now();
  for (;;) {
    await sleep(deps.pollMs ?? 1000, signal);
    const state = judge(await readTemp(deps, temp), temp, chain, restoredType(chain));
    if (state.kind !== "receiving") return state;
    if (state.used !== used) {
      used = state.used;
      changed = performance.now();
    } else if (performance.now() - changed >= stallMs) {
      throw new CsiError(
        Code.FAILED_PRECONDITION,
        `"${temp}" holds a receive that has made no progress for ${Math.round(stallMs / 1000)} ` +
          `s and has no snapshot yet; the restore never destroys it while a receive may be ` +
          `writing into it: if no zfs receive into it runs on this node, destroy it by hand`,
      );
    }
  }
}

/**
 * How long a receive this restore's failed check stopped may go without its space used changing
 * before the restore answers and leaves it (at most {@linkcode RestoreDeps.stallMs}): the next
 * restore into the same name waits for it and removes it.
 */
const STOPPED_STALL_MS = 60_000;

/** Whether the failure is the check of a download, which kills the zfs receive reading it. */
function stoppedByCheck(err: unknown): boolean {
  return err instanceof ReplicateError && err.kind === "checksum";
}

/** Whether zfs receive refused because its target was there (made by another receive). */
function tookTheName(err: unknown): err is ZfsError {
  return err instanceof ZfsError && /\bexists\b|\bbusy\b/.test(reasonText(err.stderr));
}

/**
 * Destroys the temporary dataset, just read to be this restore's own or to hold only the
 * chain's snapshots (never `-R`: a clone of one of its snapshots stops it).
 */
async function destroyTemp(deps: RestoreDeps, temp: string): Promise<void> {
  // zfs-fuse may call a dataset it just received into (or set a property on) busy for a moment.
  for (let attempt = 1;; attempt++) {
    try {
      await deps.zfs.destroy(temp, { recursive: true });
      return;
    } catch (err) {
      if (!(err instanceof ZfsError && err.kind === "busy") || attempt >= DESTROY_ATTEMPTS) {
        throw err;
      }
      deps.log.info("the temporary dataset is busy; destroying it again", { temp, attempt });
      await sleep(200 * attempt, undefined);
    }
  }
}

/** Attempts of {@linkcode destroyTemp} while zfs says busy. */
const DESTROY_ATTEMPTS = 5;

function sleep(ms: number, signal: AbortSignal | undefined): Promise<void> {
  return new Promise((resolve, reject) => {
    const timer = setTimeout(() => {
      signal?.removeEventListener("abort", onAbort);
      resolve();
    }, ms);
    const onAbort = () => {
      clearTimeout(timer);
      reject(signal?.reason);
    };
    signal?.addEventListener("abort", onAbort, { once: true });
  });
}
