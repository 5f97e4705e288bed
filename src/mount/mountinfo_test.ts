import assert from "node:assert/strict";
import { isMountOf, isZfsMount, type MountEntry, mountsAt, parseMountList } from "./mountinfo.ts";

function fixture(name: string): Promise<string> {
  return Deno.readTextFile(new URL(`../../tests/fixtures/${name}`, import.meta.url));
}

const ZFS_FUSE_OPTIONS = [
  "rw",
  "relatime",
  "user_id=0",
  "group_id=0",
  "default_permissions",
  "allow_other",
];

Deno.test("parseMountList reads captured mount output", async () => {
  const text = await fixture("mount_list.txt");
  const table = parseMountList(text);
  assert.equal(table.length, text.trim().split("\n").length);
  assert.deepEqual(table[0], {
    source: "proc",
    mountPoint: "/proc",
    fsType: "proc",
    options: ["rw", "relatime"],
  });
  assert.deepEqual(table.find((e) => e.mountPoint === "/tmp/zp/mnt/nomad/db:5b0:5d"), {
    source: "tpool/nomad/db:5b0:5d",
    mountPoint: "/tmp/zp/mnt/nomad/db:5b0:5d",
    fsType: "fuse.zfs",
    options: ZFS_FUSE_OPTIONS,
  });
  assert.deepEqual(
    table.filter(isZfsMount).map((e) => e.source),
    ["tpool", "tpool/nomad", "tpool/nomad/v1", "tpool/nomad/db:5b0:5d"],
  );
});

Deno.test("parseMountList keeps brackets and spaces in mount points", async () => {
  const table = parseMountList(await fixture("mount_list_binds.txt"));
  assert.deepEqual(table[3], {
    source: "tpool/nomad/db:5b0:5d",
    mountPoint: "/local/csi/staging/db[0]/rw-file-system-single-node-writer",
    fsType: "fuse.zfs",
    options: ZFS_FUSE_OPTIONS,
  });
  assert.equal(table[4]?.mountPoint, "/local/csi/per-alloc/a1/db[0]/rw");
  assert.deepEqual(table[5], {
    source: "tpool/nomad/db:5b0:5d",
    mountPoint: "/local/csi/per-alloc/a2/my vol/rw",
    fsType: "fuse.zfs",
    options: ["ro", ...ZFS_FUSE_OPTIONS.slice(1)],
  });
});

Deno.test("parseMountList reads a path that contains the word type", () => {
  const [entry] = parseMountList("tank/v on /x/a type b/rw type zfs (rw,xattr)\n");
  assert.deepEqual(entry, {
    source: "tank/v",
    mountPoint: "/x/a type b/rw",
    fsType: "zfs",
    options: ["rw", "xattr"],
  });
});

Deno.test("parseMountList returns nothing for empty output", () => {
  assert.deepEqual(parseMountList(""), []);
});

Deno.test("parseMountList throws a SyntaxError for a line in another format", () => {
  for (const line of ["tank/v /x zfs rw 0 0", "tank/v on /x type zfs", "garbage"]) {
    assert.throws(() => parseMountList(`proc on /proc type proc (rw)\n${line}\n`), {
      name: "SyntaxError",
      message: `Cannot parse mount line ${JSON.stringify(line)}`,
    });
  }
});

function entry(source: string, mountPoint: string, fsType = "fuse.zfs"): MountEntry {
  return { source, mountPoint, fsType, options: ["rw"] };
}

Deno.test("isMountOf matches ZFS mounts of the dataset only", () => {
  assert.equal(isMountOf(entry("tank/v", "/a", "zfs"), "tank/v"), true);
  assert.equal(isMountOf(entry("tank/v", "/a", "fuse.zfs"), "tank/v"), true);
  assert.equal(isMountOf(entry("tank/v", "/a", "tmpfs"), "tank/v"), false);
  assert.equal(isMountOf(entry("tank/v", "/a", "fuse"), "tank/v"), false);
  assert.equal(isMountOf(entry("tank/v2", "/a"), "tank/v"), false);
  assert.equal(isMountOf(entry("tank/v/child", "/a"), "tank/v"), false);
});

Deno.test("mountsAt returns the mounts at exactly that path, oldest first", async () => {
  const table = parseMountList(await fixture("mount_list_binds.txt"));
  const at = mountsAt(table, "/local/csi/per-alloc/a1/db[0]/rw");
  assert.deepEqual(at.map((e) => [e.source, e.fsType]), [
    ["tpool/nomad/db:5b0:5d", "fuse.zfs"],
    ["tmpfs", "tmpfs"],
  ]);
  assert.deepEqual(mountsAt(table, "/local/csi/per-alloc/a1/db[0]"), []);
  assert.deepEqual(mountsAt(table, "/local/csi/per-alloc/a1/db[0]/rw/"), []);
});

// zfs-fuse lists datasets as fuse.zfs; OpenZFS 2.x as zfs with its own options. The integration
// tests run on zfs-fuse, so the OpenZFS form is pinned here with lines as OpenZFS 2.x prints them.
Deno.test("parseMountList and isMountOf read OpenZFS lines, which zfs-fuse cannot produce", () => {
  const table = parseMountList(
    "tank/nomad on /tank/nomad type zfs (rw,relatime,xattr,noacl,casesensitive)\n" +
      "tank/nomad/db:5b0:5d on /tank/nomad/db:5b0:5d type zfs (rw,relatime,xattr,noacl,casesensitive)\n" +
      "tank/nomad/db:5b0:5d on /local/csi/staging/default/db[0]/rw-file-system-single-node-writer type zfs (rw,relatime,xattr,noacl,casesensitive)\n" +
      "tank/nomad/db:5b0:5d on /local/csi/per-alloc/a1/db[0]/rw-file-system-single-node-writer type zfs (ro,relatime,xattr,noacl,casesensitive)\n",
  );
  const staged = mountsAt(
    table,
    "/local/csi/staging/default/db[0]/rw-file-system-single-node-writer",
  );
  assert.equal(staged.length, 1);
  assert.equal(isMountOf(staged[0]!, "tank/nomad/db:5b0:5d"), true);
  assert.equal(isMountOf(staged[0]!, "tank/nomad"), false);
  const published = mountsAt(
    table,
    "/local/csi/per-alloc/a1/db[0]/rw-file-system-single-node-writer",
  );
  assert.equal(published[0]!.options[0], "ro");
});

Deno.test("parseMountList reads bind mounts captured on OpenZFS 2.1", async () => {
  const table = parseMountList(await fixture("openzfs/mount_list_binds.txt"));
  const staged = mountsAt(table, "/tmp/t/base/staging/v1/rw");
  assert.equal(staged.length, 1);
  assert.equal(isMountOf(staged[0]!, "tpool/nomad/v1"), true);
  assert.equal(staged[0]!.fsType, "zfs");
  const spaced = mountsAt(table, "/tmp/t/base/per-alloc/a 2/v1/rw");
  assert.equal(isMountOf(spaced[0]!, "tpool/nomad/v1"), true);
  const ro = mountsAt(table, "/tmp/t/base/per-alloc/a1/db[0]/rw");
  assert.equal(isMountOf(ro[0]!, "tpool/nomad/db:5b0:5d"), true);
  assert.deepEqual(ro[0]!.options, ["ro", "xattr", "noacl"]);
});
