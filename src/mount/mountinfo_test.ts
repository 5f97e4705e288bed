import assert from "node:assert/strict";
import {
  describeMount,
  isMountOf,
  isZfsMount,
  type MountEntry,
  MountJudge,
  mountsAt,
  parseMountList,
  zfsTypeAt,
} from "./mountinfo.ts";

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

function entry(
  source: string,
  mountPoint: string,
  fsType = "fuse.zfs",
  options: readonly string[] = ZFS_FUSE_OPTIONS,
): MountEntry {
  return { source, mountPoint, fsType, options };
}

/** What `fusermount` lists for a FUSE filesystem a user (uid 1000) mounts as `-o fsname=...`. */
const USER_FUSE_OPTIONS = ["rw", "nosuid", "nodev", "relatime", "user_id=1000", "group_id=1000"];

Deno.test("isMountOf matches ZFS mounts of the dataset only", () => {
  assert.equal(isMountOf(entry("tank/v", "/a", "zfs", ["rw"]), "tank/v"), true);
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

// Any user who can run fusermount can mount a FUSE filesystem with `-o fsname=tank/v,subtype=zfs`:
// it lists as "tank/v on ... type fuse.zfs", but fusermount always writes the user's own user_id.
Deno.test("isMountOf and isZfsMount never take a user's FUSE mount named like a dataset", () => {
  const fake = entry("tank/nomad/web", "/home/u/fake", "fuse.zfs", USER_FUSE_OPTIONS);
  assert.equal(isZfsMount(fake), false);
  assert.equal(isMountOf(fake, "tank/nomad/web"), false);
  for (const fsType of [undefined, "zfs", "fuse.zfs"] as const) {
    assert.equal(new MountJudge(fsType).isMountOf(fake, "tank/nomad/web"), false, String(fsType));
  }
  // A FUSE mount that does not say who mounted it is not taken either.
  assert.equal(
    isMountOf(entry("tank/nomad/web", "/x", "fuse.zfs", ["rw"]), "tank/nomad/web"),
    false,
  );
});

Deno.test("MountJudge of a known type takes only that type", () => {
  const kernel = entry("tank/v", "/a", "zfs", ["rw", "xattr"]);
  const daemon = entry("tank/v", "/a", "fuse.zfs");
  const openzfs = new MountJudge("zfs");
  assert.equal(openzfs.isMountOf(kernel, "tank/v"), true);
  // On OpenZFS, a fuse.zfs mount is never ZFS's, whoever made it.
  assert.equal(openzfs.isMountOf(daemon, "tank/v"), false);
  const zfsFuse = new MountJudge("fuse.zfs");
  assert.equal(zfsFuse.isMountOf(daemon, "tank/v"), true);
  assert.equal(zfsFuse.isMountOf(kernel, "tank/v"), false);
  for (const judge of [openzfs, zfsFuse, new MountJudge()]) {
    assert.equal(judge.isMountOf(entry("tank/v", "/a", "tmpfs", ["rw"]), "tank/v"), false);
    assert.equal(judge.isMountOf(entry("tank/v", "/a", "fuse", ["user_id=0"]), "tank/v"), false);
  }
});

// DeleteVolume counts the mounts of a volume's dataset anywhere but at its own mountpoint as uses.
Deno.test("an in-use check on an OpenZFS host ignores a fuse.zfs mount named like the volume", () => {
  const table = parseMountList(
    "tank/nomad/web on /tank/nomad/web type zfs (rw,relatime,xattr,noacl)\n" +
      "tank/nomad/web on /home/u/fake type fuse.zfs (rw,nosuid,nodev,relatime,user_id=1000,group_id=1000)\n" +
      "tank/nomad/web on /srv/fake type fuse.zfs (rw,relatime,user_id=0,group_id=0,allow_other)\n",
  );
  const uses = (judge: MountJudge) =>
    table.filter((e) => judge.isMountOf(e, "tank/nomad/web") && e.mountPoint !== "/tank/nomad/web")
      .map((e) => e.mountPoint);
  // The user's fake never counts; once the type is known, not even root's does.
  assert.deepEqual(uses(new MountJudge()), ["/srv/fake"]);
  assert.deepEqual(uses(new MountJudge(zfsTypeAt(table, "tank/nomad/web", "/tank/nomad/web"))), []);
  assert.equal(table.filter((e) => isMountOf(e, "tank/nomad/web")).length, 2);
});

Deno.test("zfsTypeAt reads the type from the oldest mount of the dataset at its mountpoint", () => {
  const stacked = parseMountList(
    "tank/v on /tank/v type zfs (rw,xattr)\n" +
      "tank/v on /tank/v type fuse.zfs (rw,nosuid,nodev,user_id=1000,group_id=1000)\n",
  );
  assert.equal(zfsTypeAt(stacked, "tank/v", "/tank/v"), "zfs");
  const zfsFuse = parseMountList(
    mountLineOf("tank/v", "/tank/v") + "\n" + "tank/v on /tank/v type zfs (rw)\n",
  );
  assert.equal(zfsTypeAt(zfsFuse, "tank/v", "/tank/v"), "fuse.zfs");
  // Only a user's FUSE mount there, another dataset, another path, or nothing: unknown.
  assert.equal(zfsTypeAt(stacked.slice(1), "tank/v", "/tank/v"), undefined);
  assert.equal(zfsTypeAt(stacked, "tank/w", "/tank/v"), undefined);
  assert.equal(zfsTypeAt(stacked, "tank/v", "/elsewhere"), undefined);
  assert.equal(zfsTypeAt([], "tank/v", "/tank/v"), undefined);
  assert.equal(
    zfsTypeAt(parseMountList("/dev/sda1 on /tank/v type ext4 (rw)\n"), "/dev/sda1", "/tank/v"),
    undefined,
  );
});

Deno.test("describeMount names the source, the type and who mounted a FUSE filesystem", () => {
  assert.equal(
    describeMount(entry("tank/x", "/a", "fuse.zfs", USER_FUSE_OPTIONS)),
    '"tank/x" (fuse.zfs, user_id=1000)',
  );
  assert.equal(describeMount(entry("/dev/vda", "/a", "ext4", ["rw"])), '"/dev/vda" (ext4)');
  assert.equal(describeMount(entry("tank/x", "/a", "zfs", ["rw"])), '"tank/x" (zfs)');
});

function mountLineOf(source: string, mountPoint: string): string {
  return `${source} on ${mountPoint} type fuse.zfs (${ZFS_FUSE_OPTIONS.join(",")})`;
}
