import assert from "node:assert/strict";
import { permissionFlags, PRODUCTION_DIRS, V8_FLAGS } from "../src/permissions.ts";
import { compileArgs } from "./compile_args.ts";

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
