import assert from "node:assert/strict";
import { Code, CsiError, type GrpcCode } from "../errors.ts";
import { Logger } from "../log.ts";
import { FakeRunner, mountLine } from "../../tests/support/fake_runner.ts";
import { bindArgs, Mounter, remountArgs, umountArgs } from "./mounter.ts";
import { parseMountList } from "./mountinfo.ts";

function setup(): { runner: FakeRunner; mounter: Mounter; lines: string[] } {
  const runner = new FakeRunner();
  const lines: string[] = [];
  const mounter = new Mounter(runner, {
    mountPath: "/bin/mount",
    umountPath: "/bin/umount",
    timeoutMs: 3000,
    log: new Logger("debug", {}, (line) => lines.push(line)),
  });
  return { runner, mounter, lines };
}

async function rejectsWithCode(p: Promise<unknown>, code: GrpcCode, message: RegExp) {
  await assert.rejects(p, (err: unknown) => {
    assert.ok(err instanceof CsiError, `expected a CsiError, got ${String(err)}`);
    assert.equal(err.code, code);
    assert.match(err.message, message);
    return true;
  });
}

Deno.test("mount argv builders return the exact arguments, never canonicalizing paths", () => {
  // -c: mount and umount hand the checked path to the kernel as it is, without resolving
  // symlinks in it first.
  assert.deepEqual(bindArgs("/src dir", "/dst[0]"), ["-c", "--bind", "/src dir", "/dst[0]"]);
  assert.deepEqual(remountArgs("/dst", ["ro"]), ["-c", "-o", "remount,bind,ro", "/dst"]);
  assert.deepEqual(remountArgs("/dst", ["ro", "nosuid", "nodev"]), [
    "-c",
    "-o",
    "remount,bind,ro,nosuid,nodev",
    "/dst",
  ]);
  assert.deepEqual(umountArgs("/dst"), ["-c", "/dst"]);
});

Deno.test("Mounter.bind without flags runs one mount --bind", async () => {
  const { runner, mounter } = setup();
  runner.on(["/bin/mount", "-c", "--bind"], {});
  await mounter.bind("/tmp/zp/mnt/nomad/v1", "/local/csi/staging/v1/rw");
  assert.deepEqual(runner.argvs, [
    ["/bin/mount", "-c", "--bind", "/tmp/zp/mnt/nomad/v1", "/local/csi/staging/v1/rw"],
  ]);
  assert.deepEqual(runner.calls[0]?.options, { timeoutMs: 3000 });
});

Deno.test("Mounter.bind with flags binds, then remounts with remount,bind,flags", async () => {
  const { runner, mounter } = setup();
  runner.on(["/bin/mount"], {});
  await mounter.bind("/s", "/t", ["ro", "nosuid"]);
  assert.deepEqual(runner.argvs, [
    ["/bin/mount", "-c", "--bind", "/s", "/t"],
    ["/bin/mount", "-c", "-o", "remount,bind,ro,nosuid", "/t"],
  ]);
});

Deno.test("Mounter.bind undoes the bind mount when the remount fails", async () => {
  const { runner, mounter } = setup();
  runner
    .on(["/bin/mount", "-c", "--bind"], {})
    .on(["/bin/mount", "-c", "-o"], { code: 32, stderr: "mount: /t: permission denied.\n" })
    .on(["/bin/umount"], {});
  await rejectsWithCode(
    mounter.bind("/s", "/t", ["ro"]),
    Code.INTERNAL,
    /^Cannot apply mount flags "ro" to "\/t": mount: \/t: permission denied\.$/,
  );
  assert.deepEqual(runner.argvs, [
    ["/bin/mount", "-c", "--bind", "/s", "/t"],
    ["/bin/mount", "-c", "-o", "remount,bind,ro", "/t"],
    ["/bin/umount", "-c", "/t"],
  ]);
});

Deno.test("Mounter.applyFlags remounts an existing bind, runs nothing without flags, undoes on failure", async () => {
  const { runner, mounter } = setup();
  await mounter.applyFlags("/t", []);
  assert.deepEqual(runner.argvs, []);
  runner.on(["/bin/mount", "-c", "-o"], {});
  await mounter.applyFlags("/t", ["ro", "noexec"]);
  assert.deepEqual(runner.argvs, [["/bin/mount", "-c", "-o", "remount,bind,ro,noexec", "/t"]]);

  const failing = setup();
  failing.runner
    .on(["/bin/mount", "-c", "-o"], { code: 32, stderr: "mount: /t: permission denied.\n" })
    .on(["/bin/umount"], {});
  await rejectsWithCode(failing.mounter.applyFlags("/t", ["ro"]), Code.INTERNAL, /^Cannot apply/);
  assert.deepEqual(failing.runner.argvs, [
    ["/bin/mount", "-c", "-o", "remount,bind,ro", "/t"],
    ["/bin/umount", "-c", "/t"],
  ]);
});

Deno.test("Mounter.bind reports the remount failure when undoing also fails", async () => {
  const { runner, mounter, lines } = setup();
  runner
    .on(["/bin/mount", "-c", "--bind"], {})
    .on(["/bin/mount", "-c", "-o"], { code: 32, stderr: "mount: /t: bad option\n" })
    .on(["/bin/umount"], { code: 32, stderr: "umount: /t: target is busy.\n" });
  await rejectsWithCode(mounter.bind("/s", "/t", ["ro"]), Code.INTERNAL, /apply mount flags/);
  const logged = lines.map((l) => JSON.parse(l)).find((r) => r.msg === "cannot undo bind mount");
  assert.equal(logged?.level, "error");
  assert.equal(logged?.target, "/t");
  assert.equal(logged?.error?.message, 'Cannot unmount "/t": umount: /t: target is busy.');
});

Deno.test("Mounter.bind does not remount when the bind fails", async () => {
  const { runner, mounter } = setup();
  runner.on(["/bin/mount", "-c", "--bind"], {
    code: 32,
    stderr: "mount: /t: special device /s does not exist.\n",
  });
  await rejectsWithCode(
    mounter.bind("/s", "/t", ["ro"]),
    Code.INTERNAL,
    /^Cannot bind-mount "\/t"/,
  );
  assert.equal(runner.calls.length, 1);
});

Deno.test("Mounter.unmount runs umount without -l or -f", async () => {
  const { runner, mounter } = setup();
  runner.on(["/bin/umount"], {});
  await mounter.unmount("/local/csi/per-alloc/a1/v1/rw");
  assert.deepEqual(runner.argvs, [["/bin/umount", "-c", "/local/csi/per-alloc/a1/v1/rw"]]);
});

Deno.test("Mounter.unmount of a busy target is FAILED_PRECONDITION", async () => {
  const { runner, mounter } = setup();
  const stderr = await Deno.readTextFile(
    new URL("../../tests/fixtures/stderr_umount_busy.txt", import.meta.url),
  );
  runner.on(["/bin/umount"], { code: 32, stderr });
  await rejectsWithCode(
    mounter.unmount("/local/csi/per-alloc/a1/v1/rw"),
    Code.FAILED_PRECONDITION,
    /^Cannot unmount "\/local\/csi\/per-alloc\/a1\/v1\/rw": umount: .*target is busy\.$/,
  );
});

Deno.test("Mounter.unmount reports a time-out with the time limit", async () => {
  const { runner, mounter } = setup();
  runner.on(["/bin/umount"], { code: 137, timedOut: true });
  await rejectsWithCode(
    mounter.unmount("/t"),
    Code.INTERNAL,
    /^Cannot unmount "\/t": timed out after 3000ms$/,
  );
});

Deno.test("Mounter.unmount says why when the runner gave up on an umount that could not die", async () => {
  const { runner, mounter } = setup();
  const stuck = "umount (pid 9) did not end within 5000 ms of SIGKILL";
  runner.on(["/bin/umount"], { code: -1, timedOut: true, stderr: stuck });
  await rejectsWithCode(
    mounter.unmount("/t"),
    Code.INTERNAL,
    /^Cannot unmount "\/t": timed out after 3000ms; umount \(pid 9\) did not end/,
  );
});

Deno.test("Mounter.unmount names the exit code when umount prints nothing", async () => {
  const { runner, mounter } = setup();
  runner.on(["/bin/umount"], { code: 1 });
  await rejectsWithCode(
    mounter.unmount("/t"),
    Code.INTERNAL,
    /^Cannot unmount "\/t": exit code 1$/,
  );
});

Deno.test("Mounter.table runs mount without arguments and parses its output", async () => {
  const { runner, mounter } = setup();
  runner.onExact(["/bin/mount"], {
    stdout: [mountLine("tank/v", "/mnt/v"), mountLine("tmpfs", "/run", "tmpfs", "rw")].join("\n") +
      "\n",
  });
  const table = await mounter.table();
  assert.deepEqual(runner.argvs, [["/bin/mount"]]);
  assert.deepEqual(table.map((e) => [e.source, e.mountPoint, e.fsType]), [
    ["tank/v", "/mnt/v", "fuse.zfs"],
    ["tmpfs", "/run", "tmpfs"],
  ]);
});

Deno.test("Mounter.table failing is INTERNAL", async () => {
  const { runner, mounter } = setup();
  runner.onExact(["/bin/mount"], { code: 1, stderr: "mount: failed to read mtab\n" });
  await rejectsWithCode(mounter.table(), Code.INTERNAL, /^Cannot list mounts: mount: failed/);
});

Deno.test("Mounter.judge before learning takes kernel ZFS mounts and root's fuse.zfs ones", () => {
  const { mounter } = setup();
  const judge = mounter.judge();
  assert.equal(judge.fsType, undefined);
  const kernel = parseMountList("tank/v on /mnt/v type zfs (rw,xattr)\n")[0]!;
  const daemon = parseMountList(mountLine("tank/v", "/mnt/v") + "\n")[0]!;
  const user = parseMountList(
    "tank/v on /home/u/x type fuse.zfs (rw,nosuid,nodev,relatime,user_id=1000,group_id=1000)\n",
  )[0]!;
  assert.equal(judge.isMountOf(kernel, "tank/v"), true);
  assert.equal(judge.isMountOf(daemon, "tank/v"), true);
  assert.equal(judge.isMountOf(user, "tank/v"), false);
});

Deno.test("Mounter.learnZfsType fixes the type from a dataset's own mount, once, and logs it", () => {
  const { mounter, lines } = setup();
  const openzfs = parseMountList(
    "tank/nomad on /tank/nomad type zfs (rw,xattr,noacl)\n" +
      // Mounted later by root on top, with the parent's name: not what zfs mounted.
      "tank/nomad on /tank/nomad type fuse.zfs (rw,user_id=0,group_id=0)\n",
  );
  mounter.learnZfsType(openzfs, "tank/nomad", "/tank/nomad");
  assert.equal(mounter.judge().fsType, "zfs");
  // Now even root's fuse.zfs mount with the dataset's name is not a ZFS mount.
  assert.equal(mounter.judge().isMountOf(openzfs[1]!, "tank/nomad"), false);
  assert.equal(mounter.judge().isMountOf(openzfs[0]!, "tank/nomad"), true);
  // It stays: a later table cannot change it.
  mounter.learnZfsType(
    parseMountList(mountLine("tank/nomad", "/tank/nomad") + "\n"),
    "tank/nomad",
    "/tank/nomad",
  );
  assert.equal(mounter.judge().fsType, "zfs");
  const learned = lines.map((l) => JSON.parse(l)).filter((r) =>
    r.msg === "ZFS mounts datasets with this filesystem type"
  );
  assert.deepEqual(learned.map((r) => [r.level, r.fsType, r.dataset, r.mountpoint]), [
    ["info", "zfs", "tank/nomad", "/tank/nomad"],
  ]);
});

Deno.test("Mounter.learnZfsType learns fuse.zfs from the zfs-fuse daemon's mount, never a user's", () => {
  const { mounter } = setup();
  const user = parseMountList(
    "tank/nomad on /tank/nomad type fuse.zfs (rw,nosuid,nodev,user_id=1000,group_id=1000)\n",
  );
  mounter.learnZfsType(user, "tank/nomad", "/tank/nomad");
  assert.equal(mounter.judge().fsType, undefined, "a user's FUSE mount teaches nothing");
  mounter.learnZfsType([], "tank/nomad", "/tank/nomad");
  assert.equal(mounter.judge().fsType, undefined, "nor does a mount that is not visible");
  const fuse = parseMountList(mountLine("tank/nomad", "/tank/nomad") + "\n");
  mounter.learnZfsType(fuse, "tank/nomad", "/tank/nomad");
  assert.equal(mounter.judge().fsType, "fuse.zfs");
  assert.equal(
    mounter.judge().isMountOf(parseMountList("tank/nomad on /x type zfs (rw)\n")[0]!, "tank/nomad"),
    false,
  );
});
