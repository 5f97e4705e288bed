/**
 * A small model of a ZFS pool behind a {@linkcode FakeRunner}, for the delete and purge tests:
 * datasets and snapshots with properties and their sources, answering `zfs get` (with `-r -d`),
 * `destroy` (`-r`, `-d`; refusing children, dependent clones and holds as zfs does), `rename`,
 * `set`, `unmount` and `mount` like zfs. `clones` is computed from origins as OpenZFS does, or
 * refused as an unknown property as zfs-fuse does. `zfs get -s <source> all` lists the values
 * given with that source ("received", "local"); the probe `zfs receive -n` (zfs.ts receiveOverrides) answers as
 * zfs-fuse does (no `-x`) unless {@linkcode FakePool.receiveOverrides} says otherwise. A zvol
 * (type "volume") refuses what OpenZFS refuses on one: a filesystem-only property set or made
 * with it ({@linkcode FILESYSTEM_ONLY}), `zfs unmount`, and a volsize while it is read-only. Everything else is unexpected.
 */

import type { PropertyValue } from "../../src/zfs/parse.ts";
import { type FakeResponse, FakeRunner, mountLine } from "./fake_runner.ts";

/** A value set on the object itself, or `[value, source]`. */
export type FakeValue = string | readonly [string, string];

/** Properties zfs computes (their source is "-"). */
const COMPUTED = new Set([
  "type",
  "creation",
  "origin",
  "userrefs",
  "defer_destroy",
  "mounted",
  "clones",
]);

/**
 * Properties that apply to filesystems only: OpenZFS refuses to set them on a zvol, or make one
 * with them ("'canmount' does not apply to datasets of this type").
 */
export const FILESYSTEM_ONLY: ReadonlySet<string> = new Set([
  "mountpoint",
  "canmount",
  "quota",
  "refquota",
  "recordsize",
  "atime",
  "relatime",
  "exec",
  "setuid",
  "devices",
  "xattr",
  "acltype",
  "snapdir",
  "sharenfs",
  "sharesmb",
  "overlay",
  "zoned",
  "casesensitivity",
  "normalization",
  "utf8only",
]);

/** OpenZFS's refusal of a filesystem-only property on a zvol. */
function notApplicable(what: string, name: string, prop: string): FakeResponse {
  return {
    code: 1,
    stderr: `cannot ${what} '${name}': '${prop}' does not apply to datasets of this type\n`,
  };
}

function notFound(name: string): FakeResponse {
  return { code: 1, stderr: `cannot open '${name}': dataset does not exist\n` };
}

/** How far below `root` a dataset or snapshot is, as `zfs get -r -d` counts; Infinity if not. */
function depthBelow(root: string, name: string): number {
  if (name === root) return 0;
  if (!name.startsWith(root + "/") && !name.startsWith(root + "@")) return Infinity;
  const rest = name.slice(root.length);
  const at = rest.indexOf("@");
  const path = at >= 0 ? rest.slice(0, at) : rest;
  return path.split("/").length - 1 + (at >= 0 ? 1 : 0);
}

/** A model pool answering a FakeRunner. */
export class FakePool {
  readonly objects = new Map<string, Map<string, PropertyValue>>();
  /** Whether `zfs get` knows `clones` (OpenZFS) or refuses it (zfs-fuse). */
  clonesProperty = true;
  /** Whether `zfs receive` takes `-x`/`-o` (OpenZFS) or not (zfs-fuse, the default). */
  receiveOverrides = false;
  /** What `mount` lists, as [dataset, mountpoint]. */
  mounts: [string, string][] = [];
  /**
   * Called before each command: it may change the pool (something appearing meanwhile), or
   * answer in the pool's place by returning a response.
   */
  hook:
    | ((argv: readonly string[]) => FakeResponse | undefined | Promise<FakeResponse | undefined>)
    | undefined;

  constructor(runner: FakeRunner) {
    const answer =
      (f: (argv: readonly string[]) => FakeResponse) => async (argv: readonly string[]) =>
        (await this.hook?.(argv)) ?? f(argv);
    runner
      .on(["zfs", "get"], answer((argv) => this.#get(argv)))
      .on(["zfs", "destroy"], answer((argv) => this.#destroy(argv)))
      .on(["zfs", "rename"], answer((argv) => this.#rename(argv)))
      .on(["zfs", "set"], answer((argv) => this.#set(argv)))
      .on(
        ["zfs", "unmount"],
        answer((argv) =>
          this.value(argv.at(-1)!, "type") === "volume"
            ? {
              code: 1,
              stderr: `cannot unmount '${argv.at(-1)}': operation not applicable to datasets ` +
                `of this type\n`,
            }
            : {}
        ),
      )
      .when(
        (argv) => argv[1] === "receive" && argv.includes("-n"),
        answer(() =>
          this.receiveOverrides
            ? { code: 1, stderr: "cannot receive: failed to read from stream\n" }
            : { code: 2, stderr: "invalid option 'x'\nusage:\n\treceive [-vnF] <filesystem>\n" }
        ),
      )
      .onExact(
        ["mount"],
        answer(() => ({
          stdout: this.mounts.map(([d, m]) => mountLine(d, m, "zfs") + "\n").join(""),
        })),
      );
  }

  /**
   * Adds a filesystem (or a snapshot, for names with "@"). Values without a source are set
   * locally, except computed ones.
   */
  add(name: string, values: Readonly<Record<string, FakeValue>> = {}): this {
    const snapshot = name.includes("@");
    const p = new Map<string, PropertyValue>([
      ["type", { value: snapshot ? "snapshot" : "filesystem", source: "-" }],
      ["creation", { value: "1600000000", source: "-" }],
      ["mountpoint", {
        value: snapshot ? "-" : `/mnt/${name}`,
        source: snapshot ? "-" : "default",
      }],
    ]);
    if (snapshot) {
      p.set("userrefs", { value: "0", source: "-" });
      p.set("defer_destroy", { value: "off", source: "-" });
    }
    for (const [k, v] of Object.entries(values)) this.setValue(name, k, v, p);
    this.objects.set(name, p);
    return this;
  }

  /** Sets one property of `name` (or of `into`, an object not added yet). */
  setValue(name: string, prop: string, v: FakeValue, into?: Map<string, PropertyValue>): void {
    const p = into ?? this.objects.get(name);
    if (!p) throw new Error(`no ${name}`);
    p.set(
      prop,
      typeof v === "string" ? { value: v, source: COMPUTED.has(prop) ? "-" : "local" } : {
        value: v[0],
        source: v[1],
      },
    );
  }

  has(name: string): boolean {
    return this.objects.has(name);
  }

  value(name: string, prop: string): string | undefined {
    return this.objects.get(name)?.get(prop)?.value;
  }

  /** Every name, sorted. */
  names(): string[] {
    return [...this.objects.keys()].sort();
  }

  clonesOf(snapshot: string): string[] {
    return [...this.objects].filter(([, p]) => p.get("origin")?.value === snapshot)
      .map(([n]) => n).sort();
  }

  #get(argv: readonly string[]): FakeResponse {
    const o = argv.indexOf("-o");
    const props = argv[o + 2]!.split(",");
    const roots = argv.slice(o + 3);
    if (props.includes("clones") && !this.clonesProperty) {
      return {
        code: 2,
        stderr: "bad property list: invalid property 'clones'\nusage:\n\tget [-rHp] ...\n",
      };
    }
    const d = argv.indexOf("-d");
    const depth = argv.includes("-r") ? (d >= 0 ? Number(argv[d + 1]) : Infinity) : 0;
    const s = argv.indexOf("-s");
    const lines: string[] = [];
    for (const root of roots) {
      if (!this.objects.has(root)) return notFound(root);
      for (const name of this.names().filter((n) => depthBelow(root, n) <= depth)) {
        const p = this.objects.get(name)!;
        if (s >= 0 && props[0] === "all") {
          for (const [prop, v] of p) {
            if (argv[s + 1]!.split(",").includes(v.source)) {
              lines.push(`${name}\t${prop}\t${v.value}\t${v.source}\n`);
            }
          }
          continue;
        }
        for (const prop of props) {
          let v = p.get(prop);
          if (prop === "clones" && p.get("type")?.value === "snapshot") {
            v = { value: this.clonesOf(name).join(","), source: "-" };
          }
          lines.push(`${name}\t${prop}\t${v?.value ?? "-"}\t${v?.source ?? "-"}\n`);
        }
      }
    }
    return { stdout: lines.join("") };
  }

  #destroy(argv: readonly string[]): FakeResponse {
    const name = argv.at(-1)!;
    const recursive = argv.includes("-r");
    const deferred = argv.includes("-d");
    if (!this.objects.has(name)) {
      return name.includes("@")
        ? { code: 1, stderr: "could not find any snapshots to destroy; check snapshot names.\n" }
        : notFound(name);
    }
    if (name.includes("@")) {
      const clones = this.clonesOf(name);
      const held = Number(this.value(name, "userrefs") ?? "0") > 0;
      if (deferred && (clones.length > 0 || held)) {
        this.setValue(name, "defer_destroy", "on");
        return {};
      }
      if (held) {
        return { code: 1, stderr: `cannot destroy snapshot ${name}: dataset is busy\n` };
      }
      if (clones.length > 0) {
        return {
          code: 1,
          stderr: `cannot destroy '${name}': snapshot has dependent clones\n` +
            `use '-R' to destroy the following datasets:\n${clones.join("\n")}\n`,
        };
      }
      this.objects.delete(name);
      return {};
    }
    const below = this.names().filter((n) => n.startsWith(name + "/") || n.startsWith(name + "@"));
    if (below.length > 0 && !recursive) {
      return {
        code: 1,
        stderr: `cannot destroy '${name}': filesystem has children\n` +
          `use '-r' to destroy the following datasets:\n${below.join("\n")}\n`,
      };
    }
    const heldBelow = below.find((n) => Number(this.value(n, "userrefs") ?? "0") > 0);
    if (heldBelow) {
      return { code: 1, stderr: `cannot destroy snapshot ${heldBelow}: dataset is busy\n` };
    }
    const dependents = below.filter((n) => n.includes("@")).flatMap((s) => this.clonesOf(s))
      .filter((c) => !below.includes(c));
    if (dependents.length > 0) {
      return {
        code: 1,
        stderr: `cannot destroy '${name}': filesystem has dependent clones\n` +
          `use '-R' to destroy the following datasets:\n${dependents.join("\n")}\n`,
      };
    }
    const origin = this.value(name, "origin");
    for (const n of [name, ...below]) this.objects.delete(n);
    // A snapshot marked for deferred destroy goes with its last clone.
    if (
      origin && this.value(origin, "defer_destroy") === "on" && this.clonesOf(origin).length === 0
    ) {
      this.objects.delete(origin);
    }
    return {};
  }

  #rename(argv: readonly string[]): FakeResponse {
    const [from, to] = [argv[2]!, argv[3]!];
    if (!this.objects.has(from)) return notFound(from);
    if (this.objects.has(to)) {
      return { code: 1, stderr: `cannot rename to '${to}': dataset already exists\n` };
    }
    const moves = (n: string) => n === from || n.startsWith(from + "/") || n.startsWith(from + "@");
    for (const [n, p] of [...this.objects]) {
      if (!moves(n)) continue;
      this.objects.delete(n);
      this.objects.set(to + n.slice(from.length), p);
    }
    for (const p of this.objects.values()) {
      const origin = p.get("origin")?.value;
      if (origin && moves(origin)) {
        p.set("origin", { value: to + origin.slice(from.length), source: "-" });
      }
    }
    return {};
  }

  /**
   * Also answers `zfs create` (filesystems, and zvols with `-V <bytes> [-s]`), `zfs clone`,
   * `zfs snapshot`, `zfs inherit` and `zfs version` (`version` as OpenZFS prints it, or
   * undefined for a zfs without the command, as zfs-fuse). Opt-in, so tests that expect none
   * of these see them as unexpected.
   */
  serveCreates(runner: FakeRunner, opts: { version?: string } = {}): this {
    runner
      .on(["zfs", "create"], (argv) => this.#create(argv))
      .on(["zfs", "clone"], (argv) => this.#clone(argv))
      .on(["zfs", "snapshot"], (argv) => this.#snapshot(argv))
      .on(["zfs", "inherit"], (argv) => {
        const name = argv.at(-1)!;
        if (!this.objects.has(name)) return notFound(name);
        this.objects.get(name)!.delete(argv[2]!);
        return {};
      })
      .on(
        ["zfs", "version"],
        () =>
          opts.version === undefined
            ? { code: 2, stderr: "unrecognized command 'version'\nusage: zfs command args ...\n" }
            : { stdout: `${opts.version}\nzfs-kmod-${opts.version.replace(/^zfs-/, "")}\n` },
      );
    return this;
  }

  /** `-o name=value` pairs of a create or clone argv, and the index after them. */
  #options(argv: readonly string[], from: number): [Record<string, string>, number] {
    const props: Record<string, string> = {};
    let i = from;
    while (argv[i] === "-o") {
      const kv = argv[i + 1]!;
      props[kv.slice(0, kv.indexOf("="))] = kv.slice(kv.indexOf("=") + 1);
      i += 2;
    }
    return [props, i];
  }

  #create(argv: readonly string[]): FakeResponse {
    let i = 2;
    let volsize: string | undefined;
    let sparse = false;
    if (argv[i] === "-V") {
      volsize = argv[i + 1]!;
      i += 2;
    }
    if (argv[i] === "-s") {
      sparse = true;
      i++;
    }
    const [props] = this.#options(argv, i);
    const name = argv.at(-1)!;
    if (this.objects.has(name)) {
      return { code: 1, stderr: `cannot create '${name}': dataset already exists\n` };
    }
    const misfit = volsize === undefined
      ? undefined
      : Object.keys(props).find((p) => FILESYSTEM_ONLY.has(p));
    if (misfit !== undefined) return notApplicable("create", name, misfit);
    this.add(name, props);
    if (volsize !== undefined) {
      this.setValue(name, "type", "volume");
      this.setValue(name, "mountpoint", ["-", "-"]);
      this.setValue(name, "volsize", [volsize, "local"]);
      this.setValue(name, "volblocksize", [props.volblocksize ?? "16384", "default"]);
      this.setValue(name, "refreservation", sparse ? ["none", "default"] : [volsize, "local"]);
    }
    return {};
  }

  #clone(argv: readonly string[]): FakeResponse {
    const [props, i] = this.#options(argv, 2);
    const [snapshot, name] = [argv[i]!, argv[i + 1]!];
    if (!this.objects.has(snapshot)) return notFound(snapshot);
    if (this.objects.has(name)) {
      return { code: 1, stderr: `cannot create '${name}': dataset already exists\n` };
    }
    const origin = this.objects.get(snapshot.slice(0, snapshot.indexOf("@")))!;
    this.add(name, props);
    this.setValue(name, "origin", snapshot);
    for (const prop of ["type", "volsize", "volblocksize"]) {
      const v = origin.get(prop);
      if (v && prop !== "type") this.setValue(name, prop, [v.value, "local"]);
      if (v && prop === "type") this.setValue(name, prop, v.value);
    }
    return {};
  }

  #snapshot(argv: readonly string[]): FakeResponse {
    const name = argv.at(-1)!;
    if (this.objects.has(name)) {
      return { code: 1, stderr: `cannot create snapshot '${name}': dataset already exists\n` };
    }
    if (!this.objects.has(name.slice(0, name.indexOf("@")))) return notFound(name);
    this.add(name);
    return {};
  }

  #set(argv: readonly string[]): FakeResponse {
    // `zfs set a=1 [b=2 ...] <name>`
    const name = argv.at(-1)!;
    if (!this.objects.has(name)) return notFound(name);
    if (this.value(name, "type") === "volume") {
      const misfit = argv.slice(2, -1).map((kv) => kv.slice(0, kv.indexOf("="))).find((p) =>
        FILESYSTEM_ONLY.has(p)
      );
      if (misfit !== undefined) return notApplicable("set property for", name, misfit);
      // zvol_set_volsize refuses a read-only zvol (EROFS), whatever else the command sets.
      if (
        this.value(name, "readonly") === "on" && argv.some((kv) => kv.startsWith("volsize=")) &&
        !argv.includes("readonly=off")
      ) {
        return { code: 1, stderr: `cannot set property for '${name}': dataset is read-only\n` };
      }
    }
    for (const kv of argv.slice(2, -1)) {
      const eq = kv.indexOf("=");
      this.setValue(name, kv.slice(0, eq), [kv.slice(eq + 1), "local"]);
    }
    return {};
  }
}
