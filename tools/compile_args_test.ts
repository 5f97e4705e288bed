import assert from "node:assert/strict";
import { permissionFlags, PRODUCTION_DIRS, V8_FLAGS } from "../src/permissions.ts";
import { compileArgs, fromBuildVariables } from "./compile_args.ts";

Deno.test("compileArgs bakes exactly the production permission flags", () => {
  const args = compileArgs({ extraDirs: [], output: "zfs-csi" });
  assert.equal(args[0], "compile");
  assert.deepEqual(args.slice(2, -3), [
    ...permissionFlags({ dirs: [...PRODUCTION_DIRS] }),
    V8_FLAGS,
  ]);
  assert.deepEqual(args.slice(-3), ["--output", "zfs-csi", "main.ts"]);
  for (const forbidden of ["-A", "--allow-all", "--allow-net", "--allow-ffi"]) {
    assert.ok(!args.some((a) => a === forbidden || a.startsWith(`${forbidden}=`)), forbidden);
  }
  assert.ok(args.includes("--allow-run=zfs,zpool,mount,umount"));
});

Deno.test("compileArgs adds extra directories to the read and write lists", () => {
  const args = compileArgs({ extraDirs: ["/srv/nomad/client/csi"], output: "x", target: "t" });
  const write = args.find((a) => a.startsWith("--allow-write="));
  assert.equal(write, `--allow-write=${[...PRODUCTION_DIRS, "/srv/nomad/client/csi"].join(",")}`);
  assert.deepEqual(args.slice(-5), ["--target", "t", "--output", "x", "main.ts"]);
});

Deno.test("compileArgs bakes the store's hosts as --allow-net and credentials files as read-only", () => {
  const args = compileArgs({
    extraDirs: ["/mnt/backup"],
    storeHosts: ["s3.example.com", "127.0.0.1:7070"],
    extraReadFiles: ["/secrets/s3.ini"],
    output: "x",
  });
  assert.deepEqual(args.slice(2, -3), [
    ...permissionFlags({
      dirs: [...PRODUCTION_DIRS, "/mnt/backup"],
      netHosts: ["s3.example.com", "127.0.0.1:7070"],
      readFiles: ["/secrets/s3.ini"],
    }),
    V8_FLAGS,
  ]);
  assert.ok(args.includes("--allow-net=s3.example.com:443,127.0.0.1:7070"));
  assert.ok(
    args.includes(`--allow-read=${[...PRODUCTION_DIRS, "/mnt/backup", "/secrets/s3.ini"]}`),
  );
  assert.ok(args.includes(`--allow-write=${[...PRODUCTION_DIRS, "/mnt/backup"]}`));
});

Deno.test("fromBuildVariables splits paths on ':' and hosts on ','", () => {
  assert.deepEqual(fromBuildVariables({}), { extraDirs: [], storeHosts: [], extraReadFiles: [] });
  assert.deepEqual(
    fromBuildVariables({
      ZFS_CSI_EXTRA_DIRS: "/srv/csi::/mnt/backup",
      ZFS_CSI_STORE_HOSTS: "s3.example.com, [::1]:9000,",
      ZFS_CSI_EXTRA_READ_FILES: "/secrets/s3.ini",
    }),
    {
      extraDirs: ["/srv/csi", "/mnt/backup"],
      storeHosts: ["s3.example.com", "[::1]:9000"],
      extraReadFiles: ["/secrets/s3.ini"],
    },
  );
});
