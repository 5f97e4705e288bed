/**
 * `zfs-csi verify`: proves a stored backup restores. Its chain of streams is received (with the
 * server's restore code: size, SHA-256 and guid of each stream checked, src/replicate/receive.ts)
 * into a hidden scratch dataset below the parent, marked as verify's when it is created
 * (scratch.ts), the result is checked against the manifests (and against the volume's own
 * snapshot of the same guid when this node still has it), and the scratch dataset is destroyed
 * after checking it holds only what the restore received. SIGINT (Ctrl-C) and SIGTERM stop the
 * receive and remove it the same way; one left by a verify that was killed is found by its mark
 * (list --deleted, purge, and the plugin's sweep).
 */

import { ConfigError } from "../config.ts";
import { Code, CsiError } from "../errors.ts";
import { openStore } from "../store/open.ts";
import { storeGrants } from "../permissions.ts";
import { randomHex } from "../replicate/local.ts";
import { checkReceivable } from "../replicate/receivable.ts";
import { type ReceiveDeps, restoreChain } from "../replicate/receive.ts";
import { restoredType } from "../replicate/restore.ts";
import { DenoStreamRunner } from "../run.ts";
import { chainTo, latest, parseManifest } from "../store/chain.ts";
import { guidHex, type SnapshotManifest, volumePrefix } from "../store/layout.ts";
import { storedSnapshotId } from "../store/snapshot_ids.ts";
import type { Store } from "../store/store.ts";
import { encodeComponent } from "../zfs/names.ts";
import { parseBytes } from "../zfs/parse.ts";
import { describeForm, PLAIN_FORM } from "../zfs/stream_form.ts";
import type { Zfs } from "../zfs/zfs.ts";
import { type CliIo, humanBytes, printJson, Progress } from "./io.ts";
import {
  currentMark,
  Heartbeat,
  type KernelClock,
  SCRATCH_DATA,
  SYSTEM_CLOCK,
  VERIFY_PREFIX,
  VERIFY_PROPERTY,
} from "./scratch.ts";
import {
  buildTools,
  checkPrograms,
  requireGrant,
  requireParent,
  resolveConfig,
  splitArgs,
} from "./setup.ts";

export { VERIFY_PREFIX };

/** What a verify found. */
export interface VerifyReport {
  readonly volume: string;
  /** The stored snapshot's id and guid. */
  readonly snapshotId: string;
  readonly guid: string;
  readonly createdAt: string;
  /** Streams received, the full one first, and their bytes. */
  readonly streams: number;
  readonly bytes: number;
  /**
   * Each stream's form, the full one first ("plain stream (zfs send)", "compressed, large-block,
   * embedded-data stream (zfs send -c -L -e)"; src/zfs/stream_form.ts describeForm).
   */
  readonly forms: readonly string[];
  readonly seconds: number;
  /** Bytes the restored snapshot refers to. */
  readonly referencedBytes: number;
  /** Whether the volume's own snapshot of that guid is on this node. */
  readonly localSnapshot: "same" | "absent";
  readonly scratch: string;
}

/** A store whose downloads report their bytes as they pass. */
export function countingStore(store: Store, onBytes: (n: number) => void): Store {
  return {
    description: store.description,
    putStream: (key, body, options) => store.putStream(key, body, options),
    putBytes: (key, bytes, condition) => store.putBytes(key, bytes, condition),
    getBytes: (key) => store.getBytes(key),
    list: (prefix) => store.list(prefix),
    delete: (key) => store.delete(key),
    async getStream(key, options) {
      const stream = await store.getStream(key, options);
      return stream.pipeThrough(
        new TransformStream<Uint8Array, Uint8Array>({
          transform(chunk, controller) {
            onBytes(chunk.length);
            controller.enqueue(chunk);
          },
        }),
      );
    },
  };
}

/** Every readable manifest of one volume in the store. */
export async function volumeManifests(store: Store, volume: string): Promise<SnapshotManifest[]> {
  const prefix = `${volumePrefix(encodeComponent("Volume name", volume))}snapshots/`;
  const out: SnapshotManifest[] = [];
  for (const obj of await store.list(prefix)) {
    if (!/\/snapshots\/[0-9a-f]{16}\.json$/.test(obj.key)) continue;
    const got = await store.getBytes(obj.key);
    if (!got) continue;
    // A manifest that does not read is not this verify's to judge: the chain check names gaps.
    try {
      out.push(parseManifest(got.bytes, { key: obj.key }));
    } catch {
      continue;
    }
  }
  return out;
}

/**
 * The stored snapshot `which` names (its id, or the 16 hex digits of its guid), or the newest.
 * @throws {CsiError} NOT_FOUND when the store holds none of that volume or no such snapshot
 */
export function pickManifest(
  manifests: readonly SnapshotManifest[],
  volume: string,
  which?: string,
): SnapshotManifest {
  const found = which === undefined
    ? latest(manifests)
    : manifests.find((m) =>
      guidHex(m.guid) === which || storedSnapshotId(m.volume, m.guid) === which
    );
  if (!found) {
    throw new CsiError(
      Code.NOT_FOUND,
      which === undefined
        ? `The store holds no backup of volume "${volume}"`
        : `The store holds no snapshot "${which}" of volume "${volume}"`,
    );
  }
  return found;
}

/**
 * Creates the scratch dataset, marked as this verify's in the same `zfs create`, never mounted.
 * @returns where to receive into: its `data` below it
 */
export async function createScratch(
  zfs: Zfs,
  scratch: string,
  clock: KernelClock,
  pid: number,
): Promise<string> {
  const mark = currentMark(clock, pid);
  await zfs.create(scratch, {
    canmount: "off",
    // Without the kernel's clock it cannot be judged later: marked, but never called stale.
    [VERIFY_PROPERTY]: mark ?? `pid=${pid}`,
  });
  return `${scratch}/${SCRATCH_DATA}`;
}

/**
 * Destroys the scratch dataset, after checking that it holds nothing but `data` and the chain's
 * snapshots of it (a receive stopped half way may leave `data` without a snapshot).
 * @throws {CsiError} FAILED_PRECONDITION naming what else it holds (then it is left alone)
 */
export async function removeScratch(
  zfs: Zfs,
  scratch: string,
  chain: readonly SnapshotManifest[],
): Promise<void> {
  const tree = await zfs.getTree(scratch, 2, ["type", "guid"]);
  if (!tree) return;
  const data = `${scratch}/${SCRATCH_DATA}`;
  const guids = new Set(chain.map((m) => m.guid));
  // A zvol's chain is received as a volume (docs/block-volumes.md), a dataset's as a filesystem.
  const type = restoredType(chain);
  const foreign = [...tree.entries()].filter(([name, props]) =>
    name !== scratch &&
    !(name === data && props.get("type")?.value === type) &&
    !(name.startsWith(`${data}@`) && guids.has(props.get("guid")?.value ?? ""))
  ).map(([name]) => name);
  if (tree.get(scratch)?.get("type")?.value !== "filesystem" || foreign.length > 0) {
    throw new CsiError(
      Code.FAILED_PRECONDITION,
      `Scratch dataset "${scratch}" holds what verify did not receive ` +
        `(${foreign.join(", ") || "not a filesystem"}); it is left for you to look at`,
    );
  }
  // Read just now: below it are only the chain's snapshots.
  for (let attempt = 0;; attempt++) {
    try {
      await zfs.destroy(scratch, { recursive: true });
      return;
    } catch (err) {
      // zfs-fuse can call a dataset received a moment ago busy.
      if (attempt >= 10 || !(err instanceof Error && /busy/i.test(err.message))) throw err;
      await new Promise((r) => setTimeout(r, 200 * (attempt + 1)));
    }
  }
}

/**
 * Checks what was received into `scratch`: every snapshot of the chain by guid, and whether
 * this node has the volume's own snapshot of the last one's guid.
 * @throws {CsiError} DATA_LOSS when a snapshot is missing
 */
export async function checkRestored(
  zfs: Zfs,
  scratch: string,
  chain: readonly SnapshotManifest[],
  volumeDataset: string,
): Promise<{ referencedBytes: number; localSnapshot: VerifyReport["localSnapshot"] }> {
  const tree = await zfs.getTree(scratch, 1, ["type", "guid", "referenced"]) ?? new Map();
  const byGuid = new Map(
    [...tree.entries()].filter(([n]) => n.includes("@")).map(([n, p]) => [p.get("guid")?.value, n]),
  );
  const missing = chain.filter((m) => !byGuid.has(m.guid)).map((m) => m.snapshot);
  const last = chain.at(-1)!;
  if (missing.length > 0) {
    throw new CsiError(
      Code.DATA_LOSS,
      `Restored "${scratch}" lacks ${missing.join(", ")} after a receive that reported success`,
    );
  }
  const referencedBytes = parseBytes(
    tree.get(byGuid.get(last.guid)!)?.get("referenced")?.value ?? "0",
  );
  // The same guid is the same snapshot: its size is not compared, since `referenced` counts
  // on-disk blocks, which a receive into another pool may lay out differently (OpenZFS 2.3
  // showed 8420352 against 8421376 bytes for one snapshot); the streams' SHA-256 were checked.
  const local = await zfs.getTree(volumeDataset, 1, ["type", "guid"]);
  const own = [...(local ?? new Map()).entries()].find(([n, p]) =>
    n.includes("@") && p.get("guid")?.value === last.guid
  );
  if (!own) return { referencedBytes, localSnapshot: "absent" };
  return { referencedBytes, localSnapshot: "same" };
}

/** Usage of `verify`. */
export const usage =
  `Usage: zfs-csi verify --parent-dataset NAME --node-id ID --store URL [plugin flags] VOLUME
                      [--snapshot ID] [--json]

Restores a stored backup of VOLUME (the newest, or --snapshot: its id store:<volume>:<hex> or
the 16 hex digits) into a hidden scratch dataset below the parent (${VERIFY_PREFIX}<hex>, marked
${VERIFY_PROPERTY}), checking first that this node's pool can receive each stream's form
(compressed, large blocks, ...), then each stream's size, SHA-256 and guid as a restore does, then
checks the result (every snapshot of the chain there; and whether this node has the volume's
own snapshot of that guid) and destroys the scratch dataset. Needs room in the pool for the
restored data. Shows progress on stderr. Ctrl-C (SIGINT) or SIGTERM stops it and removes the
scratch dataset; one left by a verify that was killed shows in zfs-csi list --deleted, and
zfs-csi purge --yes (or the plugin, within 30 minutes) removes it once its process is gone.`;

/** Exit code of a verify stopped by a signal (128 + SIGINT, as a shell reports it). */
export const EXIT_INTERRUPTED = 130;

/** Where a running verify learns of SIGINT and SIGTERM; replaceable in tests. */
export interface Signals {
  add(signal: "SIGINT" | "SIGTERM", fn: () => void): void;
  remove(signal: "SIGINT" | "SIGTERM", fn: () => void): void;
}

const PROCESS_SIGNALS: Signals = {
  add: (signal, fn) => Deno.addSignalListener(signal, fn),
  remove: (signal, fn) => Deno.removeSignalListener(signal, fn),
};

/** Runs `verify`. */
export async function run(
  args: readonly string[],
  io: CliIo,
  signals: Signals = PROCESS_SIGNALS,
): Promise<number> {
  const split = splitArgs(args, { json: { type: "boolean" }, snapshot: { type: "string" } });
  if (split.positionals.length !== 1) throw new ConfigError("verify takes one VOLUME name");
  const volume = split.positionals[0]!;
  const config = resolveConfig(split.configArgs);
  if (!config.store) {
    throw new ConfigError("verify needs the store: give --store as the plugin has it");
  }
  for (const grant of storeGrants(config.store)) requireGrant(grant);
  checkPrograms([config.zfsPath]);
  const tools = buildTools(config, { level: "warn" });
  const store = openStore(config.store);
  await requireParent(tools);
  const manifests = await volumeManifests(store, volume);
  const which = typeof split.own.snapshot === "string" ? split.own.snapshot : undefined;
  const target = pickManifest(manifests, volume, which);
  const chain = chainTo(manifests.filter((m) => m.volumeUid === target.volumeUid), target.guid);
  const bytes = chain.reduce((n, m) => n + m.size, 0);
  const scratch = `${config.parentDataset}/${VERIFY_PREFIX}${randomHex(8)}`;
  // A form this node's pool cannot receive fails here, naming it, before any download.
  await checkReceivable(tools.zfs, scratch, chain);
  // Ctrl-C reaches zfs receive too (one process group); SIGTERM only this process: both abort.
  const stop = new AbortController();
  let interrupted = 0;
  const onSignal = (name: string) => () => {
    interrupted++;
    if (interrupted === 1) {
      io.err(`verify: ${name}: stopping, then removing ${scratch}`);
      stop.abort(new DOMException(`verify was interrupted (${name})`, "AbortError"));
      return;
    }
    io.err(
      `verify: ${name} again: leaving ${scratch}; zfs-csi list --deleted shows it, and ` +
        `zfs-csi purge --yes removes it once this process is gone`,
    );
    Deno.exit(EXIT_INTERRUPTED);
  };
  const onInt = onSignal("SIGINT");
  const onTerm = onSignal("SIGTERM");
  signals.add("SIGINT", onInt);
  signals.add("SIGTERM", onTerm);
  try {
    return await verifyInto(tools, {
      io,
      volume,
      store,
      chain,
      target,
      bytes,
      scratch,
      signal: stop.signal,
      json: split.own.json === true,
    });
  } catch (err) {
    if (!stop.signal.aborted) throw err;
    io.err(`verify: interrupted; scratch dataset ${scratch} removed`);
    return EXIT_INTERRUPTED;
  } finally {
    signals.remove("SIGINT", onInt);
    signals.remove("SIGTERM", onTerm);
  }
}

/** The receive, the check and the removal of one verify. */
async function verifyInto(
  tools: ReturnType<typeof buildTools>,
  v: {
    io: CliIo;
    volume: string;
    store: Store;
    chain: readonly SnapshotManifest[];
    target: SnapshotManifest;
    bytes: number;
    scratch: string;
    signal: AbortSignal;
    json: boolean;
  },
): Promise<number> {
  const { io, volume, chain, target, bytes, scratch, signal } = v;
  const config = tools.config;
  const forms = chain.map((m) => describeForm(m.form ?? PLAIN_FORM, m.raw));
  const progress = new Progress(io, `verify ${volume}`, bytes);
  io.err(
    `verify: receiving ${chain.length} stream(s), ${humanBytes(bytes)}, of ${target.snapshot} ` +
      `(${target.createdAt}) from ${v.store.description} into ${scratch}; ` +
      `${[...new Set(forms)].join(" and ")}`,
  );
  const deps: ReceiveDeps = {
    streams: new DenoStreamRunner(),
    zfsPath: config.zfsPath,
    zfs: tools.zfs,
    store: countingStore(v.store, (n) => progress.add(n)),
    log: tools.log,
    // Stopped by the operator: zfs receive gets a short time to clean up before its kill.
    stopWaitMs: 5_000,
  };
  const started = performance.now();
  let checked;
  const data = await createScratch(tools.zfs, scratch, SYSTEM_CLOCK, Deno.pid);
  const heartbeat = new Heartbeat(tools.zfs, scratch, SYSTEM_CLOCK, Deno.pid);
  try {
    try {
      await restoreChain(deps, { chain, target: data, signal });
    } finally {
      // Ends the bar's line on a terminal, also when the receive failed.
      progress.finish();
    }
    checked = await checkRestored(
      tools.zfs,
      data,
      chain,
      `${config.parentDataset}/${encodeComponent("Volume name", volume)}`,
    );
  } finally {
    await heartbeat.stop();
    await removeScratch(tools.zfs, scratch, chain);
  }
  const report: VerifyReport = {
    volume,
    snapshotId: storedSnapshotId(target.volume, target.guid),
    guid: target.guid,
    createdAt: target.createdAt,
    streams: chain.length,
    bytes,
    forms,
    seconds: Math.round((performance.now() - started) / 100) / 10,
    referencedBytes: checked.referencedBytes,
    localSnapshot: checked.localSnapshot,
    scratch,
  };
  if (v.json) {
    printJson(io, report);
    return 0;
  }
  io.out(
    `Verified ${report.snapshotId} of "${volume}" (${report.createdAt}): ${report.streams} ` +
      `stream(s), ${humanBytes(bytes)} received and checked in ${report.seconds} s; it holds ` +
      `${humanBytes(report.referencedBytes)}` +
      (report.localSnapshot === "same" ? ", the same snapshot as on this node" : "") +
      `. Scratch dataset ${scratch} removed.`,
  );
  return 0;
}
