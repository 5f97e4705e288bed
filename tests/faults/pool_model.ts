/**
 * One simulated node's ZFS pool and mounts, behind a {@linkcode FakeRunner} (zfs and mount
 * commands) and a {@linkcode FakeStreamRunner} (zfs send and receive), so the plugin's real Zfs,
 * Mounter and send/receive code run on it. It models what the follow protocol depends on:
 * datasets and snapshots with guids, createtxg and creation times, properties with their
 * sources (user properties inherit as in ZFS), `readonly`, `canmount`, mounts, and send and
 * receive with ZFS's own rules: a full stream only into a new dataset; an increment only onto
 * a target whose newest snapshot is its base, that has not been written since, and that has no
 * snapshot of that name yet ("destination already exists"). Data is what "the job" wrote: a
 * list of write ids per dataset, copied by snapshots and carried by streams.
 *
 * Two flavours: "openzfs" (`readonly=on` takes effect on mounted filesystems at once; knows
 * `written`, `clones`, `encryption`; sets several properties per `zfs set`) and "zfs-fuse"
 * (a filesystem mounted writable stays writable until unmounted; none of those properties; one
 * property per `zfs set`), as the README describes the two.
 *
 * Every command takes some virtual time (`latency`), as the calling actor: a paused node's
 * commands wait, a killed node's never answer. Effects land when the command answers.
 */

import { fails, type FakeResponse, FakeRunner, mountLine } from "../support/fake_runner.ts";
import { FakeStreamRunner, type StreamScript } from "../support/fake_stream_runner.ts";
import { HostFs, type Mount } from "./host_fs.ts";
import { decodeStream, encodeStream, type SimStream } from "./stream_codec.ts";

/** Which ZFS the pool behaves as. */
export type Flavour = "openzfs" | "zfs-fuse";

/** A property value and where it comes from, as `zfs get` shows the source. */
export interface Prop {
  readonly value: string;
  readonly source: string;
}

/** A dataset or snapshot. */
export interface ZObject {
  /** Stable across renames (mounts refer to it). */
  readonly oid: number;
  readonly kind: "filesystem" | "snapshot";
  readonly guid: string;
  readonly createtxg: number;
  /** Unix seconds, by the clock of the node that took it. */
  readonly creation: number;
  /** Values set on the object itself (local); the rest is inherited or default. */
  readonly props: Map<string, Prop>;
  /** The writes it holds. */
  data: readonly string[];
}

/** What a pool is made with. */
export interface PoolOptions {
  readonly flavour: Flavour;
  /** The plugin's parent dataset: nothing outside it may be changed. */
  readonly parent: string;
  /** The node's wall clock in unix seconds (snapshots' creation). */
  readonly wallSeconds: () => number;
  /** A new guid, unique across every pool of the world. */
  readonly nextGuid: () => string;
  /** Virtual ms a command takes. */
  readonly latency: () => number;
  /** The clock's sleep, as the calling actor. */
  readonly sleep: (ms: number) => Promise<void>;
  /** Called after every change (the invariant checks). */
  readonly onChange?: () => void;
  /**
   * Called when a command makes `name` writable: sets `readonly=off` on it, creates it, or
   * renames a dataset to it (before onChange).
   */
  readonly onWritable?: (name: string) => void;
  /** Called when a command sets `readonly=on` on `name` (before onChange). */
  readonly onReadOnly?: (name: string) => void;
  /** Called when a command changes something outside the parent dataset. */
  readonly onTouch?: (name: string, argv: readonly string[]) => void;
}

/** Defaults of the native properties the plugin may read, and whether they inherit. */
const NATIVE: Readonly<Record<string, readonly [string, boolean]>> = {
  readonly: ["off", true],
  canmount: ["on", false],
  refquota: ["0", false],
  quota: ["0", false],
  refreservation: ["0", false],
  reservation: ["0", false],
  compression: ["off", true],
  atime: ["on", true],
  recordsize: ["131072", true],
  setuid: ["on", true],
  devices: ["on", true],
  exec: ["on", true],
  xattr: ["on", true],
  sync: ["standard", true],
  snapdir: ["hidden", true],
  copies: ["1", false],
  dedup: ["off", true],
  checksum: ["on", true],
  logbias: ["latency", true],
  primarycache: ["all", true],
  secondarycache: ["all", true],
  casesensitivity: ["sensitive", false],
  normalization: ["none", false],
  utf8only: ["off", false],
};

/** Properties only OpenZFS knows (zfs-fuse refuses them by name). */
const OPENZFS_ONLY = new Set([
  "written",
  "clones",
  "encryption",
  "keystatus",
  "keylocation",
  "keyformat",
]);

const COMPUTED = new Set([
  "type",
  "guid",
  "createtxg",
  "creation",
  "used",
  "referenced",
  "logicalused",
  "available",
  "mounted",
  "mountpoint",
  "origin",
  "userrefs",
  "defer_destroy",
  ...OPENZFS_ONLY,
]);

function notFound(name: string): FakeResponse {
  return fails(`cannot open '${name}': dataset does not exist\n`);
}

/** A node's pool; see the module doc. */
export class PoolModel {
  readonly objects = new Map<string, ZObject>();
  readonly fs = new HostFs();
  readonly runner = new FakeRunner();
  readonly streams: FakeStreamRunner;
  readonly #o: PoolOptions;
  #txg = 10;
  #oid = 1;

  constructor(opts: PoolOptions) {
    this.#o = opts;
    const answer =
      (f: (argv: readonly string[]) => FakeResponse) => async (argv: readonly string[]) => {
        await opts.sleep(opts.latency());
        return f(argv);
      };
    this.runner
      .on(["zfs", "get"], answer((a) => this.#get(a)))
      .on(["zfs", "set"], answer((a) => this.#set(a)))
      .on(["zfs", "inherit"], answer((a) => this.#inherit(a)))
      .on(["zfs", "create"], answer((a) => this.#create(a)))
      .on(["zfs", "snapshot"], answer((a) => this.#snapshot(a)))
      .on(["zfs", "destroy"], answer((a) => this.#destroy(a)))
      .on(["zfs", "rename"], answer((a) => this.#rename(a)))
      .on(["zfs", "mount"], answer((a) => this.#zfsMount(a)))
      .on(["zfs", "unmount"], answer((a) => this.#zfsUnmount(a)))
      .onExact(["mount"], answer(() => ({ stdout: this.mountTable() })))
      .on(["mount", "-c", "--bind"], answer((a) => this.#bind(a)))
      .on(["mount", "-c", "-o"], answer((a) => this.#remount(a)))
      .on(["umount", "-c"], answer((a) => this.#umount(a)))
      .on(["zpool", "list"], answer((a) => ({ stdout: `${a.at(-1)}\tONLINE\n` })));
    this.streams = new FakeStreamRunner((argv) => this.#stream(argv));
  }

  get flavour(): Flavour {
    return this.#o.flavour;
  }

  /** Adds a filesystem as if made earlier (set-up only; mounted unless told). */
  addFilesystem(name: string, props: Record<string, string> = {}, mounted = true): ZObject {
    const obj = this.#newObject("filesystem", this.#o.nextGuid(), this.#o.wallSeconds(), []);
    for (const [k, v] of Object.entries(props)) obj.props.set(k, { value: v, source: "local" });
    this.objects.set(name, obj);
    if (mounted) this.#mountOwn(name, obj);
    return obj;
  }

  /** The name an object has now. */
  nameOf(oid: number): string | undefined {
    for (const [name, o] of this.objects) if (o.oid === oid) return name;
    return undefined;
  }

  /** The object of a mount, if it still exists. */
  objectOf(m: Mount): ZObject | undefined {
    const name = this.nameOf(m.oid);
    return name === undefined ? undefined : this.objects.get(name);
  }

  /** The effective value of a property (inherited and default included). */
  value(name: string, prop: string): string | undefined {
    return this.#prop(name, prop)?.value;
  }

  /** Whether a job writing through mount `m` would succeed now. */
  acceptsWrites(m: Mount): boolean {
    const name = this.nameOf(m.oid);
    if (name === undefined || m.ro) return false;
    // OpenZFS applies readonly=on to every mount at once; zfs-fuse only at the next mount.
    return this.#o.flavour === "zfs-fuse" || this.value(name, "readonly") === "off";
  }

  /** The datasets that some mount lets a job write to, by name. */
  writableDatasets(): Set<string> {
    const out = new Set<string>();
    for (const m of this.fs.mounts) {
      if (!this.acceptsWrites(m)) continue;
      const name = this.nameOf(m.oid);
      if (name !== undefined) out.add(name);
    }
    return out;
  }

  /**
   * A job's write through the mount at `path` (its target): the write id is added to the
   * dataset's data when a writable mount of it is there.
   * @returns the dataset written, or why nothing was
   */
  write(path: string, id: string): { ok: true; dataset: string; object: ZObject } | {
    ok: false;
    why: string;
  } {
    const m = this.fs.top(path);
    if (!m) return { ok: false, why: "nothing mounted" };
    const name = this.nameOf(m.oid);
    const obj = name === undefined ? undefined : this.objects.get(name);
    if (name === undefined || !obj) return { ok: false, why: "dataset gone" };
    if (!this.acceptsWrites(m)) return { ok: false, why: "read-only file system" };
    obj.data = [...obj.data, id];
    this.#o.onChange?.();
    return { ok: true, dataset: name, object: obj };
  }

  /** `mount` output. */
  mountTable(): string {
    const fuse = this.#o.flavour === "zfs-fuse";
    return this.fs.mounts.map((m) => {
      const opts = fuse
        ? `${m.ro ? "ro" : "rw"},nosuid,nodev,relatime,user_id=0,group_id=0,allow_other`
        : `${
          m.ro || this.value(this.nameOf(m.oid) ?? "", "readonly") === "on" ? "ro" : "rw"
        },xattr,noacl`;
      return mountLine(this.nameOf(m.oid) ?? "?", m.mountPoint, fuse ? "fuse.zfs" : "zfs", opts) +
        "\n";
    }).join("");
  }

  #newObject(
    kind: ZObject["kind"],
    guid: string,
    creation: number,
    data: readonly string[],
  ): ZObject {
    return {
      oid: this.#oid++,
      kind,
      guid,
      createtxg: ++this.#txg,
      creation,
      props: new Map(),
      data,
    };
  }

  /** Whether a change of `name` stays inside the parent; tells onTouch otherwise. */
  #inside(name: string, argv: readonly string[]): void {
    const p = this.#o.parent;
    if (!name.startsWith(`${p}/`)) this.#o.onTouch?.(name, argv);
  }

  #changed(): void {
    this.#o.onChange?.();
  }

  /** Snapshots of `dataset`, oldest first. */
  snapshotsOf(dataset: string): [string, ZObject][] {
    return [...this.objects].filter(([n]) => n.startsWith(`${dataset}@`))
      .sort(([, a], [, b]) => a.createtxg - b.createtxg);
  }

  #prop(name: string, prop: string): Prop | undefined {
    const obj = this.objects.get(name);
    if (!obj) return undefined;
    const at = name.indexOf("@");
    const dataset = at >= 0 ? name.slice(0, at) : name;
    switch (prop) {
      case "type":
        return { value: obj.kind, source: "-" };
      case "guid":
        return { value: obj.guid, source: "-" };
      case "createtxg":
        return { value: String(obj.createtxg), source: "-" };
      case "creation":
        return { value: String(obj.creation), source: "-" };
      case "used":
      case "referenced":
      case "logicalused":
        return { value: String(1024 * (obj.data.length + 1)), source: "-" };
      case "available":
        return { value: "10737418240", source: "-" };
      case "written": {
        if (obj.kind === "snapshot") return { value: "0", source: "-" };
        const newest = this.snapshotsOf(name).at(-1)?.[1];
        const diff = newest ? obj.data.length - newest.data.length : obj.data.length + 1;
        return { value: String(1024 * Math.max(0, diff)), source: "-" };
      }
      case "mounted":
        if (obj.kind === "snapshot") return { value: "-", source: "-" };
        return { value: this.#ownMount(obj) ? "yes" : "no", source: "-" };
      case "mountpoint":
        if (obj.kind === "snapshot") return { value: "-", source: "-" };
        return this.#mountpoint(name);
      case "origin":
        return { value: "-", source: "-" };
      case "clones":
        return { value: obj.kind === "snapshot" ? "" : "-", source: "-" };
      case "encryption":
        return { value: "off", source: "default" };
      case "keystatus":
      case "keylocation":
      case "keyformat":
        return { value: prop === "keylocation" ? "none" : "-", source: "-" };
      case "userrefs":
        return { value: obj.kind === "snapshot" ? "0" : "-", source: "-" };
      case "defer_destroy":
        return { value: obj.kind === "snapshot" ? "off" : "-", source: "-" };
    }
    const own = obj.props.get(prop);
    if (own) return own;
    const native = NATIVE[prop];
    const inherits = prop.includes(":") || native?.[1] === true;
    if (inherits) {
      // A snapshot takes its dataset's; a dataset its nearest ancestor's.
      for (let d = at >= 0 ? dataset : parentOf(name); d !== undefined; d = parentOf(d)) {
        const p = this.objects.get(d)?.props.get(prop);
        if (p) return { value: p.value, source: `inherited from ${d}` };
      }
    }
    if (native) return { value: native[0], source: "default" };
    return { value: "-", source: "-" };
  }

  #mountpoint(name: string): Prop {
    const own = this.objects.get(name)?.props.get("mountpoint");
    if (own) return own;
    const parent = parentOf(name);
    if (parent === undefined) return { value: `/${name}`, source: "default" };
    const up = this.#mountpoint(parent);
    return {
      value: `${up.value}/${name.slice(parent.length + 1)}`,
      source: up.source === "local" ? `inherited from ${parent}` : up.source,
    };
  }

  #knows(prop: string): boolean {
    if (prop.includes(":")) return true;
    if (OPENZFS_ONLY.has(prop)) return this.#o.flavour === "openzfs";
    return COMPUTED.has(prop) || NATIVE[prop] !== undefined;
  }

  #get(argv: readonly string[]): FakeResponse {
    const o = argv.indexOf("-o");
    const props = argv[o + 2]!.split(",");
    const roots = argv.slice(o + 3);
    const bad = props.find((p) => !this.#knows(p));
    if (bad !== undefined) {
      return fails(`bad property list: invalid property '${bad}'\nusage:\n\tget [-rHp] ...\n`, 2);
    }
    const d = argv.indexOf("-d");
    const depth = argv.includes("-r") ? (d >= 0 ? Number(argv[d + 1]) : Infinity) : 0;
    const lines: string[] = [];
    let missing: string | undefined;
    for (const root of roots) {
      if (!this.objects.has(root)) {
        missing ??= root;
        continue;
      }
      const names = [...this.objects.keys()].filter((n) => depthBelow(root, n) <= depth).sort();
      for (const name of names) {
        for (const prop of props) {
          const v = this.#prop(name, prop)!;
          lines.push(`${name}\t${prop}\t${v.value}\t${v.source}\n`);
        }
      }
    }
    if (missing !== undefined) return { ...notFound(missing), stdout: lines.join("") };
    return { stdout: lines.join("") };
  }

  #set(argv: readonly string[]): FakeResponse {
    const name = argv.at(-1)!;
    const pairs = argv.slice(2, -1);
    if (this.#o.flavour === "zfs-fuse" && pairs.length > 1) {
      return fails(`cannot open '${pairs[1]}': invalid dataset name\n`);
    }
    const obj = this.objects.get(name);
    if (!obj) return notFound(name);
    this.#inside(name, argv);
    const parsed: [string, string][] = [];
    for (const kv of pairs) {
      const eq = kv.indexOf("=");
      const [k, v] = [kv.slice(0, eq), kv.slice(eq + 1)];
      const refused = this.#refuseSet(obj, k, v);
      if (refused) return fails(`cannot set property for '${name}': ${refused}\n`);
      parsed.push([k, v]);
    }
    for (const [k, v] of parsed) obj.props.set(k, { value: v, source: "local" });
    if (parsed.some(([k, v]) => k === "readonly" && v === "off")) this.#o.onWritable?.(name);
    if (parsed.some(([k, v]) => k === "readonly" && v === "on")) this.#o.onReadOnly?.(name);
    this.#changed();
    return {};
  }

  #refuseSet(obj: ZObject, k: string, v: string): string | undefined {
    if (k.includes(":")) return undefined;
    if (obj.kind === "snapshot") return `this property can not be modified for snapshots`;
    if (!this.#knows(k) || COMPUTED.has(k)) return `invalid property '${k}'`;
    if ((k === "readonly" || k === "atime") && v !== "on" && v !== "off") {
      return `'${k}' must be one of 'on | off'`;
    }
    if (k === "canmount" && !["on", "off", "noauto"].includes(v)) {
      return `'canmount' must be one of 'on | off | noauto'`;
    }
    if (["refquota", "quota", "refreservation", "reservation"].includes(k)) {
      if (!/^(\d+|none)$/.test(v)) return `bad numeric value '${v}'`;
    }
    return undefined;
  }

  #inherit(argv: readonly string[]): FakeResponse {
    const [prop, name] = [argv[2]!, argv.at(-1)!];
    const obj = this.objects.get(name);
    if (!obj) return notFound(name);
    this.#inside(name, argv);
    obj.props.delete(prop);
    this.#changed();
    return {};
  }

  #create(argv: readonly string[]): FakeResponse {
    const name = argv.at(-1)!;
    const parent = parentOf(name);
    if (this.objects.has(name)) return fails(`cannot create '${name}': dataset already exists\n`);
    if (parent === undefined || !this.objects.has(parent)) {
      return fails(`cannot create '${name}': parent does not exist\n`);
    }
    this.#inside(name, argv);
    const obj = this.#newObject("filesystem", this.#o.nextGuid(), this.#o.wallSeconds(), []);
    for (let i = 2; i < argv.length - 1; i += 2) {
      const kv = argv[i + 1]!;
      const eq = kv.indexOf("=");
      const [k, v] = [kv.slice(0, eq), kv.slice(eq + 1)];
      const refused = this.#refuseSet(obj, k, v);
      if (refused) return fails(`cannot create '${name}': ${refused}\n`);
      obj.props.set(k, { value: v, source: "local" });
    }
    this.objects.set(name, obj);
    // zfs create mounts what it makes, as zfs mount would.
    if (this.value(name, "canmount") === "on") this.#mountOwn(name, obj);
    this.#o.onWritable?.(name);
    this.#changed();
    return {};
  }

  #snapshot(argv: readonly string[]): FakeResponse {
    const name = argv.at(-1)!;
    const dataset = name.slice(0, name.indexOf("@"));
    const ds = this.objects.get(dataset);
    if (!ds) return notFound(dataset);
    if (this.objects.has(name)) {
      return fails(`cannot create snapshot '${name}': dataset already exists\n`);
    }
    this.#inside(name, argv);
    const snap = this.#newObject("snapshot", this.#o.nextGuid(), this.#o.wallSeconds(), ds.data);
    this.objects.set(name, snap);
    this.#changed();
    return {};
  }

  #destroy(argv: readonly string[]): FakeResponse {
    const name = argv.at(-1)!;
    const recursive = argv.includes("-r");
    const obj = this.objects.get(name);
    if (!obj) {
      return name.includes("@")
        ? fails("could not find any snapshots to destroy; check snapshot names.\n")
        : notFound(name);
    }
    this.#inside(name, argv);
    if (obj.kind === "snapshot") {
      this.objects.delete(name);
      this.#changed();
      return {};
    }
    const below = [...this.objects.keys()].filter((n) =>
      n.startsWith(`${name}/`) || n.startsWith(`${name}@`)
    );
    if (below.length > 0 && !recursive) {
      return fails(
        `cannot destroy '${name}': filesystem has children\n` +
          `use '-r' to destroy the following datasets:\n${below.join("\n")}\n`,
      );
    }
    const gone = [name, ...below].map((n) => this.objects.get(n)!.oid);
    if (this.fs.mounts.some((m) => gone.includes(m.oid) && !m.own)) {
      return fails(`cannot destroy '${name}': dataset is busy\n`);
    }
    for (const m of [...this.fs.mounts]) if (gone.includes(m.oid)) this.fs.unmount(m.mountPoint);
    for (const n of [name, ...below]) this.objects.delete(n);
    this.#changed();
    return {};
  }

  #rename(argv: readonly string[]): FakeResponse {
    const [from, to] = [argv[2]!, argv[3]!];
    const obj = this.objects.get(from);
    if (!obj) return notFound(from);
    if (this.objects.has(to)) {
      return fails(`cannot rename to '${to}': dataset already exists\n`);
    }
    this.#inside(from, argv);
    this.#inside(to, argv);
    const moves = (n: string) => n === from || n.startsWith(`${from}/`) || n.startsWith(`${from}@`);
    const own = obj.kind === "filesystem" ? this.#ownMount(obj) : undefined;
    for (const [n, o] of [...this.objects]) {
      if (!moves(n)) continue;
      this.objects.delete(n);
      this.objects.set(to + n.slice(from.length), o);
    }
    // A mounted filesystem is mounted again at its new mountpoint.
    if (own) {
      this.fs.unmount(own.mountPoint);
      this.#mountOwn(to, obj);
    }
    this.#o.onWritable?.(to);
    this.#changed();
    return {};
  }

  #ownMount(obj: ZObject): Mount | undefined {
    return this.fs.mounts.find((m) => m.oid === obj.oid && m.own);
  }

  #mountOwn(name: string, obj: ZObject): void {
    if (!this.#mountpoint(name).value.startsWith("/")) return;
    this.fs.mount({
      oid: obj.oid,
      mountPoint: this.#mountpoint(name).value,
      own: true,
      ro: this.#o.flavour === "zfs-fuse" && this.value(name, "readonly") === "on",
    });
  }

  #zfsMount(argv: readonly string[]): FakeResponse {
    const name = argv.at(-1)!;
    const obj = this.objects.get(name);
    if (!obj) return notFound(name);
    this.#inside(name, argv);
    if (this.#ownMount(obj)) return fails(`cannot mount '${name}': filesystem already mounted\n`);
    if (this.value(name, "canmount") === "off") {
      return fails(`cannot mount '${name}': 'canmount' property is set to 'off'\n`);
    }
    if (!this.#mountpoint(name).value.startsWith("/")) {
      return fails(`cannot mount '${name}': no mountpoint set\n`);
    }
    this.#mountOwn(name, obj);
    this.#changed();
    return {};
  }

  #zfsUnmount(argv: readonly string[]): FakeResponse {
    const name = argv.at(-1)!;
    const obj = this.objects.get(name);
    if (!obj) return notFound(name);
    this.#inside(name, argv);
    const own = this.#ownMount(obj);
    if (!own) return fails(`cannot unmount '${name}': not currently mounted\n`);
    this.fs.mounts.splice(this.fs.mounts.indexOf(own), 1);
    this.#changed();
    return {};
  }

  #bind(argv: readonly string[]): FakeResponse {
    const [source, target] = [argv[3]!, argv[4]!];
    this.#insideCsi(target, argv);
    const from = this.fs.top(source);
    if (!this.fs.exists(target)) {
      return fails(`mount: ${target}: mount point does not exist.\n`, 32);
    }
    if (!from) return fails(`mount: ${target}: special device ${source} does not exist.\n`, 32);
    this.fs.mount({ oid: from.oid, mountPoint: target, own: false, ro: from.ro });
    this.#changed();
    return {};
  }

  #remount(argv: readonly string[]): FakeResponse {
    const target = argv.at(-1)!;
    const flags = argv[3]!.split(",");
    const m = this.fs.top(target);
    if (!m) return fails(`mount: ${target}: mount point not mounted or bad option.\n`, 32);
    this.#insideCsi(target, argv);
    if (flags.includes("ro")) m.ro = true;
    this.#changed();
    return {};
  }

  #umount(argv: readonly string[]): FakeResponse {
    const target = argv.at(-1)!;
    this.#insideCsi(target, argv);
    if (!this.fs.unmount(target)) return fails(`umount: ${target}: not mounted.\n`, 32);
    this.#changed();
    return {};
  }

  #insideCsi(path: string, argv: readonly string[]): void {
    if (!path.startsWith("/csi/")) this.#o.onTouch?.(path, argv);
  }

  #stream(argv: readonly string[]): StreamScript {
    if (argv[1] === "send") return this.#send(argv);
    if (argv[1] === "receive") return this.#receive(argv);
    return { code: 2, stderr: `unexpected command ${argv.join(" ")}\n` };
  }

  #send(argv: readonly string[]): StreamScript {
    const snapshot = argv.at(-1)!;
    const i = argv.indexOf("-i");
    const snap = this.objects.get(snapshot);
    if (!snap || snap.kind !== "snapshot") {
      return { code: 1, stderr: `cannot open '${snapshot}': dataset does not exist\n` };
    }
    let from: ZObject | undefined;
    if (i >= 0) {
      const base = argv[i + 1]!;
      from = this.objects.get(base);
      if (!from || from.kind !== "snapshot") {
        return { code: 1, stderr: `cannot open '${base}': dataset does not exist\n` };
      }
      if (from.createtxg >= snap.createtxg) {
        return {
          code: 1,
          stderr: `warning: cannot send '${snapshot}': not an earlier snapshot from the same fs\n`,
        };
      }
    }
    const bytes = encodeStream({
      from: from?.guid ?? null,
      guid: snap.guid,
      name: snapshot.slice(snapshot.indexOf("@") + 1),
      creation: snap.creation,
      data: snap.data.slice(from?.data.length ?? 0),
    });
    const stdout: Uint8Array[] = [];
    for (let at = 0; at < bytes.length; at += 8192) stdout.push(bytes.slice(at, at + 8192));
    return { stdout };
  }

  #receive(argv: readonly string[]): StreamScript {
    const target = argv.at(-1)!;
    // `-o name=value` sets a property on what is received, as zfs does (`-x` excludes one the
    // stream carries: these streams carry none).
    const set: [string, string][] = [];
    for (let i = 2; i < argv.length - 1; i++) {
      if (argv[i] !== "-o") continue;
      const kv = argv[++i]!;
      set.push([kv.slice(0, kv.indexOf("=")), kv.slice(kv.indexOf("=") + 1)]);
    }
    return {
      onStdinEnd: (bytes) => {
        let stream: SimStream;
        try {
          stream = decodeStream(bytes);
        } catch {
          return { code: 1, stderr: "cannot receive: invalid backup stream\n" };
        }
        this.#inside(target, argv);
        const refused = receiveInto(this, target, stream);
        if (refused) return { code: 1, stderr: refused };
        const ds = this.objects.get(target)!;
        for (const [k, v] of set) ds.props.set(k, { value: v, source: "local" });
        this.#changed();
        return { code: 0, stderr: "" };
      },
    };
  }

  /** A new object for a received snapshot or dataset (receiveInto). */
  newReceived(kind: ZObject["kind"], s: SimStream, data: readonly string[]): ZObject {
    return this.#newObject(
      kind,
      kind === "snapshot" ? s.guid : this.#o.nextGuid(),
      s.creation,
      data,
    );
  }
}

/**
 * Receives `s` into `target` of `pool` (`zfs receive -u target`) by ZFS's rules (module doc).
 * @returns zfs's stderr when it refuses, else undefined
 */
export function receiveInto(pool: PoolModel, target: string, s: SimStream): string | undefined {
  const snapName = `${target}@${s.name}`;
  const ds = pool.objects.get(target);
  if (s.from === null) {
    if (ds) {
      return `cannot receive new filesystem stream: destination '${target}' exists\n` +
        `must specify -F to overwrite it\n`;
    }
    const parent = parentOf(target);
    if (parent === undefined || !pool.objects.has(parent)) {
      return `cannot receive new filesystem stream: parent of '${target}' does not exist\n`;
    }
    pool.objects.set(target, pool.newReceived("filesystem", s, s.data));
    pool.objects.set(snapName, pool.newReceived("snapshot", s, s.data));
    return undefined;
  }
  if (!ds) return `cannot receive incremental stream: destination '${target}' does not exist\n`;
  const newest = pool.snapshotsOf(target).at(-1)?.[1];
  if (!newest || newest.guid !== s.from) {
    return `cannot receive incremental stream: most recent snapshot of '${target}' does not\n` +
      `match incremental source\n`;
  }
  if (ds.data.length !== newest.data.length) {
    return `cannot receive incremental stream: destination '${target}' has been modified\n` +
      `since most recent snapshot\n`;
  }
  if (pool.objects.has(snapName)) {
    return `cannot restore to '${snapName}': destination already exists\n`;
  }
  const data = [...newest.data, ...s.data];
  ds.data = data;
  pool.objects.set(snapName, pool.newReceived("snapshot", s, data));
  return undefined;
}

/** The parent dataset of a dataset name (undefined for a pool). */
export function parentOf(name: string): string | undefined {
  const at = name.lastIndexOf("/");
  return at < 0 ? undefined : name.slice(0, at);
}

/** How far below `root` a dataset or snapshot is, as `zfs get -r -d` counts; Infinity if not. */
function depthBelow(root: string, name: string): number {
  if (name === root) return 0;
  if (!name.startsWith(`${root}/`) && !name.startsWith(`${root}@`)) return Infinity;
  const rest = name.slice(root.length);
  const at = rest.indexOf("@");
  const path = at >= 0 ? rest.slice(0, at) : rest;
  return path.split("/").length - 1 + (at >= 0 ? 1 : 0);
}
