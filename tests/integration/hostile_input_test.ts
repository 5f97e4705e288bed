/**
 * Hostile input, end to end: the plugin in its own process with its production permission
 * flags, on a real pool, fed requests a careless or malicious client could send. Each case
 * asserts the exact gRPC code, and after each one a guard proves that nothing outside the
 * parent dataset or the base directory changed:
 *
 * - every dataset and snapshot of the pool with its properties (poolState, plus every locally
 *   set property, so an injected `mountpoint` or `sharenfs` would show) and the host mount table;
 * - a sentinel directory tree beside the base directory (inside the plugin's write permission,
 *   so only the plugin's own checks protect it), reachable through a symlink and a bind mount
 *   below the base directory;
 * - a sentinel dataset `<pool>/other`, a sibling of the parent, with a file and a snapshot;
 * - the plugin's log (it runs at debug, so every argv is logged) never holds a secret.
 *
 * A few requests are accepted on purpose (a name with `#`, a trash-like name, a user property
 * whose value looks like an option): for those the guard allows exactly the named datasets or
 * snapshots below the parent to appear, and nothing else to change.
 */

import assert from "node:assert/strict";
import { Code, codeName } from "../../src/errors.ts";
import type { CsiClient } from "../support/csi_client.ts";
import { claimPaths, mountCapability, mountsAt } from "../support/nomad.ts";
import { PluginProcess } from "../support/plugin_process.ts";
import { poolState, sh, TestPool } from "../support/zfs_pool.ts";

const MiB = 1024 * 1024;
const OK = 0;

/** One hostile request and what it must get. */
interface HostileCase {
  readonly name: string;
  readonly call: (c: CsiClient) => Promise<unknown>;
  /** The exact gRPC code (0 for success). */
  readonly code: number;
  /**
   * For requests that are accepted on purpose: the datasets or snapshots (full names below the
   * parent, or patterns a full name must match) that must appear. Nothing else may change.
   */
  readonly adds?: readonly (string | RegExp)[];
  /** Extra assertions after the call. */
  readonly check?: () => Promise<void>;
}

function print(text: string): void {
  Deno.stdout.writeSync(new TextEncoder().encode(text + "\n"));
}

async function sha256(data: Uint8Array<ArrayBuffer>): Promise<string> {
  const digest = await crypto.subtle.digest("SHA-256", data);
  return [...new Uint8Array(digest)].map((b) => b.toString(16).padStart(2, "0")).join("");
}

/**
 * A listing of a directory tree that changes when anything in it does: every entry (never
 * following symlinks) with its type, mode, size, modification time and file content hash.
 */
async function treeDigest(root: string): Promise<string> {
  const lines: string[] = [];
  const walk = async (dir: string): Promise<void> => {
    const info = await Deno.lstat(dir);
    lines.push(`${dir} dir ${info.mode} ${info.mtime?.getTime()}`);
    const names = [];
    for await (const e of Deno.readDir(dir)) names.push(e.name);
    for (const name of names.sort()) {
      const path = `${dir}/${name}`;
      const st = await Deno.lstat(path);
      if (st.isDirectory) await walk(path);
      else if (st.isSymlink) lines.push(`${path} link ${await Deno.readLink(path)}`);
      else {
        const sum = await sha256(await Deno.readFile(path));
        lines.push(`${path} file ${st.mode} ${st.size} ${st.mtime?.getTime()} ${sum}`);
      }
    }
  };
  await walk(root);
  return lines.join("\n");
}

/** Every property set locally anywhere in the pool: an injected property shows up here. */
async function localProperties(pool: TestPool): Promise<string> {
  return await sh(
    "zfs",
    "get",
    "-Hp",
    "-r",
    "-s",
    "local",
    "-o",
    "name,property,value",
    "all",
    pool.pool,
  );
}

function lines(text: string): string[] {
  return text.split("\n").filter((l) => l !== "");
}

function escapeRegExp(s: string): string {
  return s.replace(/[.*+?^${}()|[\]\\]/g, "\\$&");
}

Deno.test("hostile input: exact codes, and nothing outside the parent or base dir changes", async (t) => {
  await using pool = await TestPool.create();
  await using plugin = await PluginProcess.start({ parentDataset: pool.parent, dir: pool.dir });
  const c = plugin.client;
  const base = plugin.baseDir;
  const parent = pool.parent;

  // --- Sentinels outside the base dir, inside the plugin's write permission -------------------
  const outside = `${pool.dir}/sentinel`;
  await Deno.mkdir(`${outside}/sub`, { recursive: true });
  await Deno.mkdir(`${outside}/empty`);
  await Deno.writeTextFile(`${outside}/keep.txt`, "outside the base dir");
  await Deno.writeTextFile(`${outside}/sub/data.bin`, "x".repeat(4096));
  const other = `${pool.pool}/other`;
  await sh("zfs", "create", other);
  const otherDir = `${pool.mountRoot}/other`;
  await Deno.writeTextFile(`${otherDir}/precious.txt`, "sibling of the parent");
  await sh("zfs", "snapshot", `${other}@keep`);

  // --- Things below the base dir that point or lead elsewhere ----------------------------------
  const alloc = `${base}/per-alloc`;
  await Deno.mkdir(alloc, { recursive: true });
  await Deno.symlink(outside, `${alloc}/evil`);
  await Deno.symlink(`${outside}/nothing-here`, `${alloc}/dangling`);
  await Deno.writeTextFile(`${alloc}/plain-file`, "a file, not a directory");
  const tmpfs = `${alloc}/tmpfs`;
  await Deno.mkdir(tmpfs);
  await sh("mount", "-t", "tmpfs", "-o", "size=1m", "zfs-csi-hostile", tmpfs);
  await Deno.writeTextFile(`${tmpfs}/foreign.txt`, "someone else's mount");
  await Deno.mkdir(`${tmpfs}/empty`);
  const bind = `${alloc}/bind`;
  await Deno.mkdir(bind);
  await sh("mount", "--bind", outside, bind);

  // --- Volumes, a snapshot, a clone and trash the cases aim at ---------------------------------
  const create = (name: string, over: Record<string, unknown> = {}) => ({
    name,
    capacity_range: { required_bytes: String(64 * MiB), limit_bytes: "0" },
    volume_capabilities: [mountCapability()],
    parameters: {},
    ...over,
  });
  const live = (await c.controller("CreateVolume", create("live"))).volume;
  const livePaths = await claimPaths(base, { volumeId: live.volume_id, allocId: "a1" });
  const stageLive = {
    volume_id: live.volume_id,
    staging_target_path: livePaths.staging,
    volume_capability: mountCapability(),
    volume_context: live.volume_context,
  };
  await c.node("NodeStageVolume", stageLive);
  const publishLive = {
    ...stageLive,
    target_path: livePaths.target,
    readonly: false,
  };
  await c.node("NodePublishVolume", publishLive);
  await Deno.writeTextFile(`${livePaths.target}/live.txt`, "live data");
  await c.controller("CreateSnapshot", { source_volume_id: live.volume_id, name: "snap1" });
  await c.controller(
    "CreateVolume",
    create("copy", { volume_content_source: { volume: { volume_id: live.volume_id } } }),
  );
  await c.controller("CreateSnapshot", { source_volume_id: "copy@node-a", name: "copysnap" });
  await c.controller("CreateVolume", create("gone"));
  await c.controller("DeleteVolume", { volume_id: "gone@node-a" });
  const foreign = `${parent}/foreign`;
  await sh("zfs", "create", foreign);
  await sh("zfs", "snapshot", `${foreign}@keep`);
  const all = lines(await sh("zfs", "list", "-H", "-r", "-t", "all", "-o", "name", pool.pool));
  const trash = all.find((n) => n.startsWith(`${parent}/.deleted-`));
  const cloneSnap = all.find((n) => n.startsWith(`${parent}/live@.clone-`));
  assert.ok(trash && cloneSnap, `trash and a clone snapshot in ${all.join(", ")}`);
  const trashComponent = trash.slice(parent.length + 1);
  const cloneComponent = cloneSnap.slice(cloneSnap.indexOf("@") + 1);

  // Secrets sent in the cases; none may ever reach the log.
  const secrets: string[] = [];
  const secret = (label: string) => {
    const s = `S3CRET-${label}-${crypto.randomUUID()}`;
    secrets.push(s);
    return s;
  };

  const cap = mountCapability();
  const stage = (over: Record<string, unknown>) => (cl: CsiClient) =>
    cl.node("NodeStageVolume", { ...stageLive, ...over });
  const publish = (over: Record<string, unknown>) => (cl: CsiClient) =>
    cl.node("NodePublishVolume", { ...publishLive, ...over });
  const unpublish = (over: Record<string, unknown>) => (cl: CsiClient) =>
    cl.node("NodeUnpublishVolume", { volume_id: live.volume_id, ...over });
  const deleteVolume = (volume_id: string) => (cl: CsiClient) =>
    cl.controller("DeleteVolume", { volume_id });
  const getVolume = (volume_id: string) => (cl: CsiClient) =>
    cl.controller("ControllerGetVolume", { volume_id });
  const createVolume = (name: string, over: Record<string, unknown> = {}) => (cl: CsiClient) =>
    cl.controller("CreateVolume", create(name, over));
  const withParams = (parameters: Record<string, string>) => createVolume("px", { parameters });
  const withRange = (required_bytes: string, limit_bytes: string) =>
    createVolume("px", { capacity_range: { required_bytes, limit_bytes } });
  const snapshot =
    (name: string, source = live.volume_id, over: Record<string, unknown> = {}) =>
    (cl: CsiClient) => cl.controller("CreateSnapshot", { source_volume_id: source, name, ...over });
  const deleteSnapshot = (snapshot_id: string) => (cl: CsiClient) =>
    cl.controller("DeleteSnapshot", { snapshot_id });
  const stillThere = (name: string) => async () => {
    const type = await pool.get(name, "type").catch(() => undefined);
    assert.notEqual(type, undefined, `${name} still exists`);
  };

  const stillMounted = (path: string, fsType?: string) => async () => {
    const m = await mountsAt(path);
    assert.equal(m.length, 1, `one mount still at ${path}`);
    if (fsType) assert.equal(m[0]!.fsType, fsType);
  };
  const emoji = "\u{1F4A9}";

  const cases: HostileCase[] = [
    // --- Volume ids ---------------------------------------------------------------------------
    { name: "id: empty, on DeleteVolume", call: deleteVolume(""), code: Code.INVALID_ARGUMENT },
    {
      name: 'id: "..", on NodeStageVolume with a size',
      call: stage({ volume_id: "..", volume_context: { size: "16MiB" } }),
      code: Code.INVALID_ARGUMENT,
    },
    { name: 'id: "../other"', call: deleteVolume("../other"), code: Code.INVALID_ARGUMENT },
    {
      name: 'id: "a/b", on ControllerExpandVolume',
      call: (cl) =>
        cl.controller("ControllerExpandVolume", {
          volume_id: "a/b",
          capacity_range: { required_bytes: String(128 * MiB) },
        }),
      code: Code.INVALID_ARGUMENT,
    },
    {
      name: 'id: absolute path "/etc", on NodeUnstageVolume',
      call: (cl) =>
        cl.node("NodeUnstageVolume", { volume_id: "/etc", staging_target_path: livePaths.staging }),
      code: Code.INVALID_ARGUMENT,
      check: stillMounted(livePaths.staging),
    },
    {
      name: "id: the sibling dataset's full name, on DeleteVolume",
      call: deleteVolume(other),
      code: Code.INVALID_ARGUMENT,
      check: stillThere(other),
    },
    {
      name: "id: the parent dataset itself, on DeleteVolume",
      call: deleteVolume(parent),
      code: Code.INVALID_ARGUMENT,
    },
    {
      name: "id: the parent with a trailing slash",
      call: deleteVolume(`${parent}/`),
      code: Code.INVALID_ARGUMENT,
    },
    {
      name: "id: a grandchild of the parent",
      call: deleteVolume(`${parent}/live/x`),
      code: Code.INVALID_ARGUMENT,
    },
    {
      name: "id: the pool's name maps inside the parent, so it is not found",
      call: getVolume(pool.pool),
      code: Code.NOT_FOUND,
    },
    {
      name: "id: the full name of a .deleted-* trash dataset, on DeleteVolume",
      call: deleteVolume(trash),
      code: Code.INVALID_ARGUMENT,
      check: stillThere(trash),
    },
    {
      name: "id: a .deleted-* trash name maps to another dataset; deleting it is a no-op",
      // With its node: an id without one is refused before anything is looked up (tenancy).
      call: deleteVolume(`${trashComponent}@node-a`),
      code: OK,
      check: stillThere(trash),
    },
    {
      name: 'id: the escaped form ":2edeleted-..." of trash is a different, missing volume',
      call: getVolume(`:2e${trashComponent.slice(1)}`),
      code: Code.NOT_FOUND,
    },
    {
      name: "id: the full name of an unmanaged child, on DeleteVolume",
      call: deleteVolume(foreign),
      code: Code.FAILED_PRECONDITION,
      check: stillThere(foreign),
    },
    {
      name: "id: another node's volume, on NodeUnpublishVolume of a live mount",
      call: unpublish({ volume_id: "live@node-b", target_path: livePaths.target }),
      code: Code.FAILED_PRECONDITION,
      check: stillMounted(livePaths.target),
    },
    {
      name: 'id: an empty node name "live@"',
      call: stage({ volume_id: "live@" }),
      code: Code.INVALID_ARGUMENT,
    },
    {
      name: 'id: a node name with a path "live@../x"',
      call: deleteVolume("live@../x"),
      code: Code.INVALID_ARGUMENT,
    },
    {
      name: "id: NUL inside, on NodeUnstageVolume of a live staging mount",
      call: (cl) =>
        cl.node("NodeUnstageVolume", {
          volume_id: "li\u0000ve",
          staging_target_path: livePaths.staging,
        }),
      code: Code.INVALID_ARGUMENT,
      check: stillMounted(livePaths.staging),
    },
    {
      name: "id: NUL at the end (a C string would read it as a live volume)",
      call: deleteVolume("live\u0000"),
      code: Code.INVALID_ARGUMENT,
      check: stillThere(`${parent}/live`),
    },
    { name: "id: 129 bytes", call: deleteVolume("v".repeat(129)), code: Code.INVALID_ARGUMENT },
    {
      name: "id: exactly 128 bytes is accepted (and not found)",
      call: getVolume("v".repeat(128)),
      code: Code.NOT_FOUND,
    },
    {
      name: "id: 65 two-byte characters (130 bytes, 65 characters)",
      call: getVolume("\u00e9".repeat(65)),
      code: Code.INVALID_ARGUMENT,
    },
    {
      name: "id: 32 four-byte characters whose escaped dataset name exceeds 255 bytes",
      call: stage({ volume_id: emoji.repeat(32), volume_context: { size: "16MiB" } }),
      code: Code.INVALID_ARGUMENT,
    },
    {
      name: "id: unicode look-alikes of .. and / map inside the parent",
      call: getVolume("\u2025\uff0fetc"),
      code: Code.NOT_FOUND,
    },
    {
      name: 'id: percent-encoded "%2e%2e"',
      call: deleteVolume("%2e%2e"),
      code: Code.INVALID_ARGUMENT,
    },
    {
      name: "id: a trailing space names another volume",
      call: getVolume("live "),
      code: Code.NOT_FOUND,
    },
    {
      name: "snapshot id: the hidden .clone-* snapshot is never a CSI snapshot",
      call: deleteSnapshot(`live@${cloneComponent}@node-a`),
      code: OK,
      check: stillThere(cloneSnap),
    },
    {
      name: "snapshot id: the sibling dataset's snapshot by full name is a no-op",
      call: deleteSnapshot(`${other}@keep`),
      code: OK,
      check: stillThere(`${other}@keep`),
    },
    {
      name: "snapshot id: an unmanaged child's snapshot by full name",
      call: deleteSnapshot(`${foreign}@keep`),
      code: Code.FAILED_PRECONDITION,
      check: stillThere(`${foreign}@keep`),
    },
    {
      name: 'snapshot id: a snapshot name with "../" is a no-op',
      call: deleteSnapshot("live@../../snap1@node-a"),
      code: OK,
      check: stillThere(`${parent}/live@snap1`),
    },

    // --- CreateVolume names ------------------------------------------------------------------
    { name: "name: NUL", call: createVolume("a\u0000b"), code: Code.INVALID_ARGUMENT },
    { name: "name: newline", call: createVolume("a\nb"), code: Code.INVALID_ARGUMENT },
    { name: "name: 129 bytes", call: createVolume("n".repeat(129)), code: Code.INVALID_ARGUMENT },
    {
      name: "name: 125 bytes, whose id with @node-a would exceed 128 bytes, is shortened in place",
      call: createVolume("n".repeat(125)),
      code: OK,
      adds: [new RegExp(`^${escapeRegExp(parent)}/n+\\.\\.[0-9a-f]{16}$`)],
    },
    {
      name: "name: the parent's full name",
      call: createVolume(parent),
      code: Code.INVALID_ARGUMENT,
    },
    { name: 'name: "%2f"', call: createVolume("%2f"), code: Code.INVALID_ARGUMENT },
    {
      name: "name: a .deleted-* trash name makes a new escaped dataset, never the trash",
      call: createVolume(trashComponent),
      code: OK,
      adds: [`${parent}/:2e${trashComponent.slice(1)}`],
      check: stillThere(trash),
    },
    {
      name: 'name: "." makes the escaped dataset ":2e"',
      call: createVolume("."),
      code: OK,
      adds: [`${parent}/:2e`],
    },

    // --- Snapshot names ----------------------------------------------------------------------
    { name: 'snapshot: name with "@"', call: snapshot("a@b"), code: Code.INVALID_ARGUMENT },
    { name: 'snapshot: name with "/"', call: snapshot("a/b"), code: Code.INVALID_ARGUMENT },
    {
      name: 'snapshot: name with "#" (a bookmark in zfs) is escaped',
      call: snapshot("a#b"),
      code: OK,
      adds: [`${parent}/live@a:23b`],
    },
    {
      name: "snapshot: name with a space is escaped",
      call: snapshot("with space"),
      code: OK,
      adds: [`${parent}/live@with:20space`],
    },
    {
      name: 'snapshot: name starting with a dash "-r" stays one argument',
      call: snapshot("-r"),
      code: OK,
      adds: [`${parent}/live@-r`],
    },
    {
      name: "snapshot: name of 129 bytes",
      call: snapshot("s".repeat(129)),
      code: Code.INVALID_ARGUMENT,
    },
    {
      name: "snapshot: name of 117 bytes, whose id would exceed 128 bytes, is shortened in place",
      call: snapshot("s".repeat(117)),
      code: OK,
      adds: [new RegExp(`^${escapeRegExp(parent)}/live@s+\\.\\.[0-9a-f]{16}$`)],
    },
    {
      name: "snapshot: a name another volume's snapshot holds",
      call: snapshot("copysnap"),
      code: Code.ALREADY_EXISTS,
    },
    {
      name: "snapshot: of an unmanaged child",
      call: snapshot("s1", "foreign"),
      code: Code.FAILED_PRECONDITION,
    },
    {
      name: "snapshot: of the parent by full name",
      call: snapshot("s1", parent),
      code: Code.INVALID_ARGUMENT,
    },
    {
      name: "snapshot: with parameters",
      call: snapshot("s1", live.volume_id, { parameters: { "com.example:x": "y" } }),
      code: Code.INVALID_ARGUMENT,
    },

    // --- Staging and target paths ------------------------------------------------------------
    {
      name: "path: relative target",
      call: publish({ target_path: "per-alloc/a2/live/x" }),
      code: Code.INVALID_ARGUMENT,
    },
    {
      name: "path: the base dir itself as target",
      call: publish({ target_path: base }),
      code: Code.INVALID_ARGUMENT,
    },
    {
      name: "path: a sibling of the base dir sharing its prefix",
      call: publish({ target_path: `${base}-evil/x` }),
      code: Code.INVALID_ARGUMENT,
    },
    {
      name: "path: /etc as target",
      call: publish({ target_path: "/etc/zfs-csi" }),
      code: Code.INVALID_ARGUMENT,
    },
    {
      name: 'path: ".." escaping the base dir',
      call: publish({ target_path: `${alloc}/../../sentinel/x` }),
      code: Code.INVALID_ARGUMENT,
    },
    {
      name: 'path: "." inside the path',
      call: publish({ target_path: `${base}/./per-alloc/a2/x` }),
      code: Code.INVALID_ARGUMENT,
    },
    {
      name: "path: target through a symlink pointing outside",
      call: publish({ target_path: `${alloc}/evil/x` }),
      code: Code.INVALID_ARGUMENT,
    },
    {
      name: "path: unpublish through a symlink onto an empty directory outside",
      call: unpublish({ target_path: `${alloc}/evil/empty` }),
      code: Code.INVALID_ARGUMENT,
    },
    {
      name: "path: target is a dangling symlink",
      call: publish({ target_path: `${alloc}/dangling` }),
      code: Code.INVALID_ARGUMENT,
    },
    {
      name: "path: staging through a symlink pointing outside",
      call: stage({ staging_target_path: `${alloc}/evil/sub` }),
      code: Code.INVALID_ARGUMENT,
    },
    {
      name: "path: target is a tmpfs mounted by someone else",
      call: publish({ target_path: tmpfs }),
      code: Code.ALREADY_EXISTS,
      check: stillMounted(tmpfs, "tmpfs"),
    },
    {
      name: "path: unpublish of someone else's tmpfs",
      call: unpublish({ target_path: tmpfs }),
      code: Code.FAILED_PRECONDITION,
      check: stillMounted(tmpfs, "tmpfs"),
    },
    {
      name: "path: unstage of a foreign bind mount",
      call: (cl) =>
        cl.node("NodeUnstageVolume", { volume_id: live.volume_id, staging_target_path: bind }),
      code: Code.FAILED_PRECONDITION,
      check: stillMounted(bind),
    },
    {
      name: "path: target below a foreign bind mount (it leads outside the base dir)",
      call: publish({ target_path: `${bind}/x` }),
      code: Code.INVALID_ARGUMENT,
    },
    {
      name: "path: unpublish below a foreign bind mount onto an empty directory outside",
      call: unpublish({ target_path: `${bind}/empty` }),
      code: Code.INVALID_ARGUMENT,
    },
    {
      name: "path: staging below someone else's tmpfs",
      call: stage({ staging_target_path: `${tmpfs}/s` }),
      code: Code.INVALID_ARGUMENT,
    },
    {
      name: "path: unpublish below someone else's tmpfs onto its empty directory",
      call: unpublish({ target_path: `${tmpfs}/empty` }),
      code: Code.INVALID_ARGUMENT,
    },
    {
      name: "path: target inside the volume's own staging mount (its data)",
      call: publish({ target_path: `${livePaths.staging}/x` }),
      code: Code.INVALID_ARGUMENT,
    },
    {
      name: "path: target is a regular file",
      call: publish({ target_path: `${alloc}/plain-file` }),
      code: Code.INVALID_ARGUMENT,
    },
    {
      name: "path: staging path with NUL",
      call: stage({ staging_target_path: `${livePaths.staging}\u0000/x` }),
      code: Code.INVALID_ARGUMENT,
    },
    {
      name: "path: target path with a newline",
      call: publish({ target_path: `${alloc}/a2/x\n/y` }),
      code: Code.INVALID_ARGUMENT,
    },
    {
      name: "path: target equal to the staging path",
      call: publish({ target_path: livePaths.staging }),
      code: Code.INVALID_ARGUMENT,
    },
    {
      name: "path: target holding another volume's mount",
      call: (cl) =>
        cl.node("NodePublishVolume", {
          ...publishLive,
          volume_id: "copy@node-a",
          volume_context: {},
          staging_target_path: "",
        }),
      code: Code.ALREADY_EXISTS,
      check: stillMounted(livePaths.target),
    },
    {
      name: "path: unpublish of another volume's target",
      call: unpublish({ volume_id: "copy@node-a", target_path: livePaths.target }),
      code: Code.FAILED_PRECONDITION,
      check: stillMounted(livePaths.target),
    },
    {
      name:
        'path: a target named like a mount line (" on x type zfs (rw)", a backslash) round-trips',
      call: async (cl) => {
        const target = `${alloc}/a3/x on /etc type zfs (rw)\\040`;
        await cl.node("NodePublishVolume", { ...publishLive, target_path: target });
        assert.equal((await mountsAt(target)).length, 1, "published at the odd path");
        await cl.node("NodePublishVolume", { ...publishLive, target_path: target });
        assert.equal((await mountsAt(target)).length, 1, "a repeat stacks nothing");
        await cl.node("NodeUnpublishVolume", { volume_id: live.volume_id, target_path: target });
      },
      code: OK,
    },
    {
      name: 'path: a mount flag smuggling "rbind" after a comma',
      call: publish({
        target_path: `${alloc}/a4/x`,
        volume_capability: mountCapability("SINGLE_NODE_WRITER", ["nosuid,rbind"]),
      }),
      code: Code.INVALID_ARGUMENT,
    },

    // --- Volume context ----------------------------------------------------------------------
    {
      name: "context: a dataset naming the sibling of the parent",
      call: stage({ volume_context: { dataset: other } }),
      code: Code.INVALID_ARGUMENT,
    },
    {
      name: "context: a dataset naming the parent",
      call: stage({ volume_context: { dataset: parent } }),
      code: Code.INVALID_ARGUMENT,
    },
    {
      name: "context: a size of 1 byte, below the smallest volume",
      call: stage({
        volume_id: "tiny",
        staging_target_path: `${base}/staging/default/tiny/x`,
        volume_context: { size: "1" },
      }),
      code: Code.OUT_OF_RANGE,
    },
    {
      name: "context: a size beyond 2^53 bytes",
      call: stage({
        volume_id: "huge",
        staging_target_path: `${base}/staging/default/huge/x`,
        volume_context: { size: "9999999999999999999999" },
      }),
      code: Code.INVALID_ARGUMENT,
    },

    // --- Parameters --------------------------------------------------------------------------
    {
      name: "param: canmount=off",
      call: withParams({ canmount: "off" }),
      code: Code.INVALID_ARGUMENT,
    },
    {
      name: 'param: a key "-o mountpoint"',
      call: withParams({ "-o mountpoint": "/etc" }),
      code: Code.INVALID_ARGUMENT,
    },
    {
      name: "param: a key holding a whole assignment mountpoint=/etc",
      call: withParams({ "mountpoint=/etc": "on" }),
      code: Code.INVALID_ARGUMENT,
    },
    {
      name: 'param: a value with a comma "lz4,mountpoint=/etc"',
      call: withParams({ compression: "lz4,mountpoint=/etc" }),
      code: Code.INVALID_ARGUMENT,
    },
    {
      name: "param: a value with a trailing newline",
      call: withParams({ recordsize: "16K\n" }),
      code: Code.INVALID_ARGUMENT,
    },
    {
      name: "param: a value with NUL",
      call: withParams({ atime: "on\u0000mountpoint=/etc" }),
      code: Code.INVALID_ARGUMENT,
    },
    {
      name: "param: a user property key with =",
      call: withParams({ "com.example:x=y": "z" }),
      code: Code.INVALID_ARGUMENT,
    },
    {
      name: "param: our own org.zfs-csi:parameters",
      call: withParams({ "org.zfs-csi:parameters": "{}" }),
      code: Code.INVALID_ARGUMENT,
    },
    {
      name: "param: our own marker in capitals",
      call: withParams({ "ORG.ZFS-CSI:managed": "yes" }),
      code: Code.INVALID_ARGUMENT,
    },
    {
      name: "param: __proto__",
      call: withParams(JSON.parse('{"__proto__": "x"}')),
      code: Code.INVALID_ARGUMENT,
    },
    {
      name: "param: the context key size",
      call: withParams({ size: "1G" }),
      code: Code.INVALID_ARGUMENT,
    },
    {
      name: "param: sharenfs in a user-property disguise (no module)",
      call: withParams({ ":sharenfs": "on" }),
      code: Code.INVALID_ARGUMENT,
    },
    {
      name: "param: keylocation=prompt (no terminal)",
      call: withParams({ keylocation: "prompt" }),
      code: Code.INVALID_ARGUMENT,
    },
    {
      name: "param: a value longer than 1024 bytes",
      call: withParams({ "com.example:x": "v".repeat(1025) }),
      code: Code.INVALID_ARGUMENT,
    },
    {
      name: "param: a user property name zfs refuses (300 bytes)",
      call: withParams({ ["com.example:" + "p".repeat(300)]: "x" }),
      code: Code.INVALID_ARGUMENT,
    },
    { name: "param: quota=-1", call: withParams({ quota: "-1" }), code: Code.INVALID_ARGUMENT },
    {
      name: "param: refreservation=capacity without a capacity",
      call: createVolume("px", {
        parameters: { refreservation: "capacity" },
        capacity_range: null,
      }),
      code: Code.INVALID_ARGUMENT,
    },
    {
      name: 'param: a user property whose value is "-o mountpoint=/etc" stays a value',
      call: createVolume("pv", { parameters: { "com.example:x": "-o mountpoint=/etc" } }),
      code: OK,
      adds: [`${parent}/pv`],
      check: async () => {
        assert.equal(await pool.get(`${parent}/pv`, "mountpoint"), `${pool.mountRoot}/nomad/pv`);
        assert.equal(await pool.get(`${parent}/pv`, "com.example:x"), "-o mountpoint=/etc");
      },
    },
    {
      name: "param: mountpoint on GetCapacity",
      call: (cl) => cl.controller("GetCapacity", { parameters: { mountpoint: "/etc" } }),
      code: Code.INVALID_ARGUMENT,
    },
    {
      name: "param: a content source that is the sibling's snapshot",
      call: createVolume("px", {
        volume_content_source: { snapshot: { snapshot_id: `${other}@keep` } },
      }),
      code: Code.NOT_FOUND,
    },
    {
      name: "param: a content source that is an unmanaged child",
      call: createVolume("px", { volume_content_source: { volume: { volume_id: "foreign" } } }),
      code: Code.FAILED_PRECONDITION,
    },

    // --- Capacity ----------------------------------------------------------------------------
    { name: "capacity: negative limit", call: withRange("0", "-5"), code: Code.INVALID_ARGUMENT },
    {
      name: "capacity: required above limit, on ControllerExpandVolume",
      call: (cl) =>
        cl.controller("ControllerExpandVolume", {
          volume_id: live.volume_id,
          capacity_range: { required_bytes: String(128 * MiB), limit_bytes: String(96 * MiB) },
        }),
      code: Code.INVALID_ARGUMENT,
    },
    {
      // grpc-js (protobufjs) wraps a decimal string beyond int64 into the int64 range.
      name: "capacity: beyond int64 as a string (wraps to 7766279631452241919)",
      call: withRange("99999999999999999999", "0"),
      code: Code.OUT_OF_RANGE,
    },
    {
      name: "capacity: 2^64-1 as a string (wraps to -1)",
      call: withRange("18446744073709551615", "0"),
      code: Code.INVALID_ARGUMENT,
    },
    {
      name: "capacity: int64 max",
      call: withRange("9223372036854775807", "0"),
      code: Code.OUT_OF_RANGE,
    },
    {
      name: "capacity: 2^53+1, just past what a double holds exactly",
      call: withRange("9007199254740993", "0"),
      code: Code.OUT_OF_RANGE,
    },
    {
      name: "capacity: required and limit 1 byte below the minimum",
      call: withRange(String(MiB - 1), String(MiB - 1)),
      code: Code.OUT_OF_RANGE,
    },
    {
      name: "capacity: only a limit, 1 byte below the minimum",
      call: withRange("0", String(MiB - 1)),
      code: Code.OUT_OF_RANGE,
    },
    {
      name: "capacity: zero and zero on ControllerExpandVolume changes nothing",
      call: (cl) =>
        cl.controller("ControllerExpandVolume", {
          volume_id: live.volume_id,
          capacity_range: { required_bytes: "0", limit_bytes: "0" },
        }),
      code: OK,
    },
    {
      name: "capacity: negative required on NodeExpandVolume",
      call: (cl) =>
        cl.node("NodeExpandVolume", {
          volume_id: live.volume_id,
          volume_path: livePaths.target,
          capacity_range: { required_bytes: "-1", limit_bytes: "0" },
        }),
      code: Code.INVALID_ARGUMENT,
    },

    // --- Secrets -----------------------------------------------------------------------------
    {
      // "live" was staged: a CreateVolume of its name is no retry any more (tenancy).
      name: "secret: on a repeated CreateVolume of a staged volume (refused, nothing changes)",
      call: (cl) =>
        cl.controller("CreateVolume", { ...create("live"), secrets: { password: secret("cv") } }),
      code: Code.ALREADY_EXISTS,
    },
    {
      name: "secret: on a repeated NodeStageVolume",
      call: stage({ secrets: { token: secret("stage"), other: secret("stage2") } }),
      code: OK,
    },
    {
      name: "secret: on a refused CreateVolume",
      call: createVolume("px", {
        parameters: { mountpoint: "/etc" },
        secrets: { key: secret("refused") },
      }),
      code: Code.INVALID_ARGUMENT,
    },
    {
      name: "secret: as a map key rather than a value",
      call: (cl) =>
        cl.controller("ValidateVolumeCapabilities", {
          volume_id: live.volume_id,
          volume_capabilities: [cap],
          secrets: { [secret("as-key")]: "v" },
        }),
      code: OK,
    },
    {
      name: "secret: a huge map (2,000 entries, about 1 MiB)",
      call: (cl) => {
        const s = secret("huge");
        const map = Object.fromEntries(
          Array.from({ length: 2000 }, (_, i) => [`k${i}`, `${s}-${"x".repeat(400)}`]),
        );
        return cl.controller("DeleteSnapshot", { snapshot_id: "live@none@node-a", secrets: map });
      },
      code: OK,
    },
    {
      name: "secret: a map beyond gRPC's 4 MiB message limit",
      call: (cl) => {
        const s = secret("toobig");
        const map = Object.fromEntries(
          Array.from({ length: 5000 }, (_, i) => [`k${i}`, `${s}-${"x".repeat(1000)}`]),
        );
        return cl.controller("DeleteVolume", { volume_id: "nothing", secrets: map });
      },
      code: Code.RESOURCE_EXHAUSTED,
    },
    {
      name: "secret: on NodeUnpublishVolume, which has no secrets field",
      call: unpublish({ target_path: `${alloc}/a5/never`, secrets: { pw: secret("unpub") } }),
      code: OK,
    },
  ];

  // --- The guard ---------------------------------------------------------------------------------
  const snapshotState = async () => {
    // Independent reads, so taken at once.
    const [state, local, outsideTree, otherTree, tmpfsTree] = await Promise.all([
      poolState(pool),
      localProperties(pool),
      treeDigest(outside),
      treeDigest(otherDir),
      treeDigest(tmpfs),
    ]);
    return {
      pool: lines(state + "\n" + local).filter((l) => !othersScratchMount(l)),
      outside: outsideTree,
      other: otherTree,
      tmpfs: tmpfsTree,
    };
  };
  const assertUnchanged = (
    before: Awaited<ReturnType<typeof snapshotState>>,
    after: Awaited<ReturnType<typeof snapshotState>>,
    adds: readonly (string | RegExp)[],
  ) => {
    assert.equal(after.outside, before.outside, "the sentinel tree outside the base dir");
    assert.equal(after.other, before.other, "the files of the parent's sibling dataset");
    assert.equal(after.tmpfs, before.tmpfs, "the foreign tmpfs below the base dir");
    const patterns = adds.map((a) =>
      typeof a === "string" ? new RegExp(`^${escapeRegExp(a)}$`) : a
    );
    // The dataset or snapshot a pool line or a mount line is about.
    const subject = (line: string) => line.split(/[\t ]/)[0]!;
    const allowed = patterns.map((r) => ({ test: (l: string) => r.test(subject(l)) }));
    const was = new Set(before.pool);
    const now = new Set(after.pool);
    const gone = before.pool.filter((l) => !now.has(l));
    const added = after.pool.filter((l) => !was.has(l) && !allowed.some((r) => r.test(l)));
    assert.deepEqual({ gone, added }, { gone: [], added: [] }, "pool and mount table");
    for (const r of patterns) {
      assert.ok(after.pool.some((l) => l.includes("\t") && r.test(subject(l))), `${r} was made`);
    }
  };

  assert.ok(cases.length >= 40, `at least 40 hostile cases (have ${cases.length})`);
  const names = new Set(cases.map((x) => x.name));
  assert.equal(names.size, cases.length, "case names are distinct");
  // Other test runs on this machine mount and unmount below their own /tmp directories
  // meanwhile; every other mount on the host is compared.
  const othersScratchMount = (line: string) =>
    !line.includes("\t") && line.includes(" /tmp/") && !line.includes(pool.dir);
  let n = 0;
  let last: Awaited<ReturnType<typeof snapshotState>> | undefined;
  for (const hc of cases) {
    n++;
    const label = `#${String(n).padStart(3, "0")}/${cases.length} ${hc.name} → ${
      codeName(hc.code)
    }`;
    await t.step(label, async () => {
      // The state after the previous case is the state before this one.
      const before = last ?? await snapshotState();
      last = undefined;
      let code = OK;
      let details = "";
      try {
        await hc.call(c);
      } catch (err) {
        const e = err as { code?: number; details?: string };
        if (typeof e.code !== "number") throw err;
        code = e.code;
        details = e.details ?? "";
      }
      assert.equal(
        codeName(code),
        codeName(hc.code),
        `${hc.name}: got ${codeName(code)} (${details})`,
      );
      await hc.check?.();
      const after = await snapshotState();
      assertUnchanged(before, after, hc.adds ?? []);
      const leaked = secrets.filter((s) => plugin.logs().some((l) => l.includes(s)));
      assert.deepEqual(leaked, [], "secrets in the plugin's log");
      last = after;
    });
  }
  await t.step(
    `${n} hostile cases ran; the plugin is still healthy and logged no secret`,
    async () => {
      assert.equal(n, cases.length);
      assert.equal((await c.identity("Probe")).ready.value, true);
      assert.equal(await Deno.readTextFile(`${livePaths.target}/live.txt`), "live data");
      const log = plugin.logs().join("\n");
      for (const s of secrets) assert.ok(!log.includes(s), `secret ${s} logged`);
      assert.ok(log.includes('"method":"CreateVolume"'), "the log has RPC lines to search");
      print(`hostile input: ${n} cases, ${secrets.length} secrets never logged`);
    },
  );
});
