/**
 * The four invariants of the fault-schedule test, checked as the world changes:
 *
 * 1. At most one node has a writable copy of a volume at any virtual instant. A copy is
 *    writable while a job could write to it: a bind of it at a staging or target path lets
 *    writes through (pool_model.ts; the dataset's own mount is no job's). Checked at every
 *    change of a pool. Not counted against the protocol, because no implementation can avoid
 *    them: the copy of a holder that the store took over legitimately (the holder had been
 *    paused or killed, or its own requests on the owner object had failed, since the object
 *    last changed; or an operator ran `zfs-csi takeover`) while that copy was writable: a holder
 *    cut off keeps writing until it learns (README "What can be lost"); and, after such a
 *    takeover, a copy mounted for a job that was made writable in good faith: while the store
 *    said the node held it, or right after the node proved it did (madeWritable). Any other
 *    copy a job can write must be one the store says this node holds, under its generation.
 * 2. The store's head and its whole chain are always restorable: the head's manifest, each base
 *    back to a full stream, each stream present with the manifest's size and SHA-256, and the
 *    streams received in order into an empty pool by ZFS's rules (pool_model.ts receiveInto).
 * 3. No write acknowledged to a job before a clean release is lost: once NodeUnstage answered
 *    and the store says this node released the volume (or the node was taken over without
 *    having earned it), every write its job had acknowledged on that copy under that
 *    generation must be in the store's head, then and after.
 * 4. Nothing outside the parent dataset (and the staging and target paths) is changed.
 *
 * The checks read the store's bucket and the pools directly, never through the plugin's code.
 */

import { createHash } from "node:crypto";
import { FOLLOW_GENERATION_PROPERTY } from "../../src/follow/copy.ts";
import { type OwnerRecord, parseOwner } from "../../src/follow/owner.ts";
import { chainTo, parseManifest } from "../../src/store/chain.ts";
import {
  manifestKey,
  manifestsPrefix,
  ownerKey,
  type SnapshotManifest,
} from "../../src/store/layout.ts";
import type { MemoryStore } from "../support/memory_store.ts";
import type { VirtualTime } from "./clock.ts";
import { PoolModel, receiveInto, type ZObject } from "./pool_model.ts";
import { CSI_BASE, PARENT, type SimNode } from "./sim_node.ts";
import { decodeStream } from "./stream_codec.ts";

/**
 * How long (of its running time) after a landed write as holder a node may still act on it
 * (make its copy writable): the few zfs commands between a proof and the act.
 */
export const PROOF_MS = 1_000;

/** Which invariant broke ("crash": the plugin would have died; "sim": the model failed). */
export type InvariantId = 1 | 2 | 3 | 4 | "crash" | "sim";

/** One broken invariant, as a failing seed reports it. */
export interface Violation {
  readonly invariant: InvariantId;
  readonly message: string;
  readonly nodes: readonly string[];
  /** Virtual ms since the run started. */
  readonly atMs: number;
  /** Index of the step during or after which it broke. */
  readonly step: number;
}

/** A writable copy, as last seen. */
interface WritableCopy {
  readonly node: string;
  readonly oid: number;
  readonly volume: string;
  readonly generation: number | undefined;
  /** Why it does not count (undefined: it counts). */
  excused: string | undefined;
}

/** An acknowledged write of a job. */
interface Ack {
  readonly id: string;
  readonly node: string;
  readonly generation: number | undefined;
  readonly atMs: number;
}

/** What restoring a head gave. */
type Restored = { ok: true; head: string | null; data: ReadonlySet<string> } | {
  ok: false;
  why: string;
};

/** The invariants of one run; see the module doc. */
export class Invariants {
  readonly #clock: VirtualTime;
  readonly #nodes: readonly SimNode[];
  readonly #bucket: MemoryStore;
  readonly #volumes: readonly string[];
  readonly #start: number;
  /** The step being run (for reports). */
  step = -1;
  readonly violations: Violation[] = [];
  /**
   * What was noticed on the way that is no violation by itself but may explain one (for the
   * report): takeovers of holders that had not stopped renewing by any fault of the world,
   * releases while a job still ran on the copy, manifests deleted by a node without the volume.
   */
  readonly hints: string[] = [];
  readonly #writable = new Map<string, WritableCopy>();
  /**
   * Whether a copy was last made writable in good faith (madeWritable), by `<node>:<oid>`.
   */
  readonly #goodFaith = new Map<string, boolean>();
  /** Who deleted each manifest, when, and whether it held the volume then. */
  readonly #deletions = new Map<
    string,
    { node: string; atMs: number; holder: boolean; head: string | null }
  >();
  /** Each node's last landed write as holder, by `<node>:<volume>`. */
  readonly #proofs = new Map<string, { at: number; generation: number }>();
  /** Which volume a dataset object is a copy of, by `<node>:<oid>`. */
  readonly #tags = new Map<string, string>();
  /** The owner record as last written, and when, by volume. */
  readonly #owners = new Map<string, { record: OwnerRecord; at: number }>();
  /** When a node's request on a volume's owner object was faulted, by `<node>:<volume>`. */
  readonly #ownerFaults = new Map<string, number[]>();
  /** Holdings ended by a takeover, by `<volume>:<node>:<generation>`: whether it was earned. */
  readonly #superseded = new Map<string, boolean>();
  readonly #acks = new Map<string, Ack[]>();
  /** Writes that must be in the head, by volume. */
  readonly #protected = new Map<string, Map<string, Ack>>();
  readonly #restoreCache = new Map<string, Restored>();
  /** Manifests as last parsed, with their bytes. */
  readonly #manifests = new Map<
    string,
    { bytes: Uint8Array; manifest: SnapshotManifest | undefined }
  >();
  /** The owner records last parsed, with the bytes they were parsed from. */
  readonly #parsed = new Map<string, { bytes: Uint8Array; record: OwnerRecord }>();

  constructor(opts: {
    clock: VirtualTime;
    nodes: readonly SimNode[];
    bucket: MemoryStore;
    volumes: readonly string[];
  }) {
    this.#clock = opts.clock;
    this.#nodes = opts.nodes;
    this.#bucket = opts.bucket;
    this.#volumes = opts.volumes;
    this.#start = opts.clock.now;
  }

  /** Records a violation (the run stops after the step). */
  fail(invariant: InvariantId, message: string, nodes: readonly string[] = []): void {
    this.violations.push({
      invariant,
      message,
      nodes,
      atMs: this.#clock.now - this.#start,
      step: this.step,
    });
  }

  /** The owner record in the bucket now. */
  owner(volume: string): OwnerRecord | undefined {
    const bytes = this.#bucket.peek(ownerKey(volume));
    if (!bytes) return undefined;
    const cached = this.#parsed.get(volume);
    if (cached?.bytes === bytes) return cached.record;
    const record = parseOwner(bytes);
    this.#parsed.set(volume, { bytes, record });
    return record;
  }

  /** Remembers a volume's owner record as created. */
  created(volume: string): void {
    const record = this.owner(volume);
    if (record) this.#owners.set(volume, { record, at: this.#clock.now });
  }

  // ---- invariant 1 ----

  /** After any change of a pool: copies made writable, new writable copies, how many count. */
  poolChanged(): void {
    const seen = new Map<string, WritableCopy>();
    for (const node of this.#nodes) {
      for (const m of node.pool.fs.mounts) {
        // What a job writes through: a bind at a staging or target path.
        if (m.own || !m.mountPoint.startsWith(`${CSI_BASE}/`) || !node.pool.acceptsWrites(m)) {
          continue;
        }
        const key = `${node.name}:${m.oid}`;
        if (seen.has(key)) continue;
        const obj = node.pool.objectOf(m);
        const volume = obj && this.#volumeOf(node, m.oid);
        if (!obj || volume === undefined) continue;
        seen.set(key, {
          node: node.name,
          oid: m.oid,
          volume,
          generation: generationOf(obj),
          excused: undefined,
        });
      }
    }
    for (const key of [...this.#writable.keys()]) if (!seen.has(key)) this.#writable.delete(key);
    for (const [key, copy] of seen) {
      if (this.#writable.has(key)) continue;
      this.#writable.set(key, copy);
      this.#becameWritable(copy);
    }
    for (const volume of this.#volumes) {
      const counted = [...this.#writable.values()].filter((c) =>
        c.volume === volume && c.excused === undefined
      );
      if (counted.length > 1) {
        this.fail(
          1,
          `${counted.length} writable copies of volume "${volume}" at once: ` +
            counted.map((c) => `${c.node} (generation ${c.generation ?? "none"})`).join(", ") +
            `; the store says ${describe(this.owner(volume))}`,
          counted.map((c) => c.node),
        );
        // Reported once: later checks count only copies that become writable after.
        for (const c of counted) c.excused = "already reported";
      }
    }
  }

  /**
   * A command of `node` made `name` writable (`zfs set readonly=off`, a create, a rename into
   * place): notes whether that was in good faith. It was when the store then said this node
   * held the volume under the copy's generation, or when the node acted right on a proof that
   * it did: its last write to the owner object as holder of that generation landed less than
   * {@linkcode PROOF_MS} of the node's running time before (time it spent paused or down does
   * not count: no implementation can check and act at the same instant, and a pause can fall
   * between the two).
   */
  madeWritable(node: SimNode, name: string): void {
    const volume = this.#volumes.find((v) => name === `${PARENT}/${v}`);
    const obj = node.pool.objects.get(name);
    if (volume === undefined || !obj || node.pool.value(name, "readonly") !== "off") return;
    const key = `${node.name}:${obj.oid}`;
    this.#tags.set(key, volume);
    const r = this.owner(volume);
    const generation = generationOf(obj);
    const holds = r?.state === "held" && r.holder === node.name && r.generation === generation;
    const proof = this.#proofs.get(`${node.name}:${volume}`);
    const now = this.#clock.now;
    const proved = proof !== undefined && proof.generation === generation &&
      now - proof.at - node.outOfActionMs(proof.at, now) <= PROOF_MS;
    this.#goodFaith.set(key, holds || proved);
  }

  /**
   * `node` set `readonly=on` on `name`: a hint when a job's mount of it was writable and not
   * excused (not a copy taken over from it): the plugin made the volume read-only under a job
   * that still runs (OpenZFS: its writes now fail; zfs-fuse: they go on, to a copy the store
   * may soon call released).
   */
  madeReadOnly(node: SimNode, name: string): void {
    const obj = node.pool.objects.get(name);
    const copy = obj && this.#writable.get(`${node.name}:${obj.oid}`);
    if (copy?.excused === undefined && copy) {
      this.#hint(
        `${node.name} made its copy of volume "${copy.volume}" read-only while a job's mount ` +
          `of it was writable`,
      );
    }
  }

  /** The volume a dataset object is a copy of: named `<parent>/<volume>` now or once. */
  #volumeOf(node: SimNode, oid: number): string | undefined {
    const key = `${node.name}:${oid}`;
    const name = node.pool.nameOf(oid);
    const volume = this.#volumes.find((v) => name === `${PARENT}/${v}`);
    if (volume !== undefined) this.#tags.set(key, volume);
    return this.#tags.get(key);
  }

  #becameWritable(copy: WritableCopy): void {
    const r = this.owner(copy.volume);
    const node = this.#nodes.find((n) => n.name === copy.node)!;
    const name = node.pool.nameOf(copy.oid);
    if (name !== undefined && node.pool.value(name, "readonly") === "on") {
      this.#hint(
        `${copy.node} mounted its copy of volume "${copy.volume}" for a job after making it ` +
          `read-only (zfs-fuse keeps the earlier mount's mode: the job can write)`,
      );
    }
    if (r?.state === "held" && r.holder === copy.node && r.generation === copy.generation) return;
    // Last made writable in good faith, and taken over since in a way the node could not
    // prevent (paused, killed, cut off): what it mounts now it mounts in good faith (a pause
    // can always fall between a check and an act).
    const key = `${copy.node}:${copy.oid}`;
    const earned = this.#superseded.get(`${copy.volume}:${copy.node}:${copy.generation}`);
    if (this.#goodFaith.get(key) === true && earned === true) {
      copy.excused = "made writable while held; taken over legitimately since";
      return;
    }
    this.fail(
      1,
      `${copy.node}'s copy of volume "${copy.volume}" (generation ` +
        `${copy.generation ?? "none"}) became writable to a job while the store says ` +
        `${describe(r)}` +
        (this.#goodFaith.get(key) === false
          ? `; it was last made writable (readonly=off) while the store did not say it held it`
          : earned === false
          ? `; the node was taken over while it kept renewing`
          : ""),
      [copy.node],
    );
    copy.excused = "already reported";
  }

  /** A request of `node` on the owner object of `volume` failed or was slowed. */
  ownerFaulted(node: string, volume: string): void {
    const key = `${node}:${volume}`;
    const list = this.#ownerFaults.get(key) ?? [];
    list.push(this.#clock.now);
    this.#ownerFaults.set(key, list);
  }

  /** A write of `writer` to the owner object of `volume` landed: a proof, or a takeover? */
  ownerWritten(writer: string, volume: string): void {
    const now = this.#clock.now;
    const cur = this.owner(volume);
    const prev = this.#owners.get(volume);
    if (!cur) return;
    this.#owners.set(volume, { record: cur, at: now });
    if (cur.state === "held" && cur.holder === writer) {
      this.#proofs.set(`${writer}:${volume}`, { at: now, generation: cur.generation });
    }
    const before = prev?.record;
    if (!before || before.state !== "held" || before.holder === null) return;
    if (cur.state === "released" && cur.holder === before.holder) {
      const running = [...this.#writable.values()].filter((c) =>
        c.volume === volume && c.node === writer && c.excused === undefined
      );
      if (running.length > 0) {
        this.#hint(
          `${writer} released volume "${volume}" in the store while a job's mount of its copy ` +
            `was writable there`,
        );
      }
    }
    const taken = cur.state === "held" && cur.holder !== before.holder;
    const forced = cur.state === "released" && cur.generation === before.generation + 1;
    if (!taken && !forced) return;
    const from = before.holder;
    const node = this.#nodes.find((n) => n.name === from);
    const faults = this.#ownerFaults.get(`${from}:${volume}`) ?? [];
    const earned = forced || node === undefined || node.outOfActionIn(prev!.at, now) ||
      faults.some((t) => t >= prev!.at && t <= now);
    this.#superseded.set(`${volume}:${from}:${before.generation}`, earned);
    if (!earned) {
      this.#hint(
        `${writer} took volume "${volume}" over from ${from}, which was running, not paused, ` +
          `and had no failed request on the owner object since it last changed (${
            (now - prev!.at) / 1000
          } s before)`,
      );
      return;
    }
    for (const c of this.#writable.values()) {
      if (c.volume === volume && c.node === from && c.excused === undefined) {
        c.excused = `${writer} took the volume over from ${from}, who had stopped renewing`;
      }
    }
  }

  /** A delete of `node` landed: a manifest deleted is remembered, for the hints. */
  deleted(node: string, key: string): void {
    const m = /^v1\/volumes\/([^/]+)\/snapshots\/([0-9a-f]+)\.json$/.exec(key);
    if (!m) return;
    const r = this.owner(m[1]!);
    this.#deletions.set(key, {
      node,
      atMs: this.#clock.now - this.#start,
      holder: r?.state === "held" && r.holder === node,
      head: r?.head ?? null,
    });
  }

  #hint(text: string): void {
    this.hints.push(`+${this.#clock.now - this.#start}ms ${text}`);
  }

  // ---- invariant 3 ----

  /** A job's write was acknowledged on `node`'s copy of `volume`. */
  acked(volume: string, node: string, id: string, obj: ZObject): void {
    const list = this.#acks.get(volume) ?? [];
    list.push({ id, node, generation: generationOf(obj), atMs: this.#clock.now - this.#start });
    this.#acks.set(volume, list);
  }

  /** NodeUnstage of `volume` answered OK on `node`: a clean release protects its writes. */
  unstaged(volume: string, node: SimNode): void {
    const obj = node.pool.objects.get(`${PARENT}/${volume}`);
    if (!obj) return;
    const generation = generationOf(obj);
    const earned = this.#superseded.get(`${volume}:${node.name}:${generation}`);
    const r = this.owner(volume);
    const released = r?.state === "released" && r.holder === node.name &&
      r.generation === generation;
    if (earned === true || (earned === undefined && !released)) return;
    const keep = this.#protected.get(volume) ?? new Map<string, Ack>();
    for (const a of this.#acks.get(volume) ?? []) {
      if (a.node === node.name && a.generation === generation) keep.set(a.id, a);
    }
    this.#protected.set(volume, keep);
  }

  // ---- invariant 4 ----

  /** A command of `node` changed `name`, outside the parent. */
  touched(node: string, name: string, argv: readonly string[]): void {
    this.fail(4, `${node} ran "${argv.join(" ")}", which changes "${name}" outside ${PARENT}`, [
      node,
    ]);
  }

  // ---- after each step ----

  /** Invariants 2 and 3, from the bucket. */
  afterStep(): void {
    for (const volume of this.#volumes) {
      const r = this.owner(volume);
      if (!r || r.state === "deleted") continue;
      const restored = this.restore(volume, r.head);
      if (!restored.ok) {
        const missing = /guid (\d+)|base (\d+)/.exec(restored.why);
        const guid = missing?.[1] ?? missing?.[2];
        const gone = guid && this.#deletions.get(manifestKey(volume, guid));
        if (gone) {
          this.#hint(
            `the manifest of ${guid} was deleted by ${gone.node} at ${gone.atMs} ms, which ` +
              `${
                gone.holder ? "held" : "did not hold"
              } volume "${volume}" then (head ${gone.head})`,
          );
        }
        this.fail(
          2,
          `the store's head of volume "${volume}" is not restorable: ${restored.why} ` +
            `(${describe(r)})`,
          r.holder === null ? [] : [r.holder],
        );
        continue;
      }
      const missing = [...(this.#protected.get(volume)?.values() ?? [])].filter((a) =>
        !restored.data.has(a.id)
      );
      if (missing.length > 0) {
        const nodes = [...new Set(missing.map((a) => a.node))];
        this.fail(
          3,
          `${missing.length} write(s) acknowledged before a clean release of volume "${volume}" ` +
            `are not in the store's head (guid ${restored.head}): ` +
            missing.slice(0, 5).map((a) => `${a.id} on ${a.node} at ${a.atMs} ms`).join(", "),
          nodes,
        );
        for (const a of missing) this.#protected.get(volume)!.delete(a.id);
      }
    }
  }

  /**
   * Restores the head's chain from the bucket into an empty model pool, as any stage without a
   * copy would, and returns what the head holds.
   */
  restore(volume: string, head: string | null): Restored {
    if (head === null) return { ok: true, head, data: new Set() };
    const manifests: SnapshotManifest[] = [];
    for (const key of this.#bucket.keys()) {
      if (!key.startsWith(manifestsPrefix(volume))) continue;
      const bytes = this.#bucket.peek(key)!;
      let parsed = this.#manifests.get(key);
      if (parsed?.bytes !== bytes) {
        try {
          parsed = { bytes, manifest: parseManifest(bytes, { key }) };
        } catch {
          // An unreadable manifest is not on any chain the plugin follows.
          parsed = { bytes, manifest: undefined };
        }
        this.#manifests.set(key, parsed);
      }
      if (parsed.manifest) manifests.push(parsed.manifest);
    }
    let chain: SnapshotManifest[];
    try {
      chain = chainTo(manifests, head);
    } catch (err) {
      return { ok: false, why: (err as Error).message };
    }
    const signature = `${volume}:${chain.map((m) => `${m.guid}/${m.stream}`).join(",")}:` +
      chain.map((m) => this.#bucket.peek(m.stream)?.length ?? -1).join(",");
    const cached = this.#restoreCache.get(signature);
    if (cached) return cached;
    const result = this.#receiveChain(chain, head);
    this.#restoreCache.set(signature, result);
    return result;
  }

  #receiveChain(chain: readonly SnapshotManifest[], head: string): Restored {
    let guid = 0;
    const scratch = new PoolModel({
      flavour: "openzfs",
      parent: "scratch",
      wallSeconds: () => 0,
      nextGuid: () => `9${String(++guid).padStart(15, "0")}`,
      latency: () => 0,
      sleep: () => Promise.resolve(),
    });
    scratch.addFilesystem("scratch", {}, false);
    const target = "scratch/restore";
    for (const m of chain) {
      const bytes = this.#bucket.peek(m.stream);
      if (!bytes) return { ok: false, why: `stream ${m.stream} of guid ${m.guid} is gone` };
      const sha = createHash("sha256").update(bytes).digest("hex");
      if (bytes.length !== m.size || sha !== m.sha256) {
        return { ok: false, why: `stream ${m.stream} is not what manifest ${m.guid} says` };
      }
      let refused: string | undefined;
      try {
        const s = decodeStream(bytes);
        if (s.guid !== m.guid || s.name !== m.snapshot) {
          return { ok: false, why: `stream ${m.stream} holds another snapshot than ${m.guid}` };
        }
        refused = receiveInto(scratch, target, s);
      } catch (err) {
        refused = (err as Error).message;
      }
      if (refused) {
        return {
          ok: false,
          why: `receiving ${m.snapshot} (guid ${m.guid}) of the chain failed: ${refused.trim()}`,
        };
      }
    }
    return { ok: true, head, data: new Set(scratch.objects.get(target)?.data ?? []) };
  }
}

/** The generation a copy was last made writable under (its own property). */
export function generationOf(obj: ZObject): number | undefined {
  const p = obj.props.get(FOLLOW_GENERATION_PROPERTY);
  return p && /^\d+$/.test(p.value) ? Number(p.value) : undefined;
}

function describe(r: OwnerRecord | undefined): string {
  if (!r) return "no owner object";
  return `${r.state} by ${r.holder ?? "nobody"}, generation ${r.generation}, head ${
    r.head ?? "none"
  }`;
}
