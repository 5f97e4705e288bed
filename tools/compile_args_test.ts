import assert from "node:assert/strict";
import {
  ALLOWED_PROGRAMS,
  binaryFlags,
  needsFromVariables,
  permissionFlags,
  PRODUCTION_DIRS,
  PRODUCTION_READ_FILES,
  V8_FLAGS,
} from "../src/permissions.ts";
import { CHECK_ARGS, compileArgs, compilePipeline } from "./compile_args.ts";

Deno.test("compilePipeline type-checks under the compiler's own heap, then compiles unchecked with the binary's V8 flags", () => {
  const steps = compilePipeline({ output: "zfs-csi" });
  assert.equal(steps.length, 2);
  const [check, compile] = steps;
  // The binary's 128 MiB old-generation cap must not reach the type checker: with it, a check
  // without cache (a fresh clone) dies "Fatal JavaScript out of memory".
  assert.deepEqual(check, ["check", "--frozen", "main.ts"]);
  assert.deepEqual(check, [...CHECK_ARGS]);
  assert.ok(!check!.some((a) => a.startsWith("--v8-flags")), "no V8 flags on the check");
  assert.deepEqual(compile, compileArgs({ output: "zfs-csi" }));
  assert.deepEqual(compile!.slice(0, 3), ["compile", "--frozen", "--no-check"]);
  // Baked in: the V8 flags once, exactly the runtime's.
  assert.deepEqual(compile!.filter((a) => a.startsWith("--v8-flags")), [V8_FLAGS]);
  assert.deepEqual(compile!.at(-1), check!.at(-1), "the same entry point is checked and compiled");
});

Deno.test("compileArgs bakes binaryFlags of the build variables' needs, the function the dev task uses", () => {
  const vars = {
    ZFS_CSI_EXTRA_DIRS: "/mnt/backup",
    ZFS_CSI_STORE_HOSTS: "127.0.0.1:7070",
    ZFS_CSI_EXTRA_READ_FILES: "/secrets/s3.ini",
    ZFS_CSI_METRICS_LISTEN: "127.0.0.1:9474",
  };
  const needs = needsFromVariables(vars);
  const args = compileArgs({ ...needs, output: "x" });
  assert.deepEqual(args.slice(3, -3), binaryFlags(needs));
});

Deno.test("compileArgs bakes exactly the production permission flags", () => {
  const args = compileArgs({ extraDirs: [], output: "zfs-csi" });
  assert.equal(args[0], "compile");
  assert.deepEqual(args.slice(3, -3), [
    ...permissionFlags({ dirs: [...PRODUCTION_DIRS], readFiles: [...PRODUCTION_READ_FILES] }),
    V8_FLAGS,
  ]);
  assert.deepEqual(args.slice(-3), ["--output", "zfs-csi", "main.ts"]);
  for (const forbidden of ["-A", "--allow-all", "--allow-net", "--allow-ffi"]) {
    assert.ok(!args.some((a) => a === forbidden || a.startsWith(`${forbidden}=`)), forbidden);
  }
  // The programs by absolute path, so the binary starts without PATH (Nomad's host volume
  // plugins run so), and nothing a test may add (extraPrograms).
  assert.deepEqual(args.filter((a) => a.startsWith("--allow-run")), [
    `--allow-run=${ALLOWED_PROGRAMS.join(",")}`,
  ]);
  assert.ok(args.includes(
    "--allow-run=" + [
      ...["zfs", "zpool", "mount", "umount"].flatMap((name) =>
        ["/usr/local/sbin", "/usr/local/bin", "/usr/sbin", "/usr/bin", "/sbin", "/bin"].map((dir) =>
          `${dir}/${name}`
        )
      ),
    ].join(","),
  ));
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
  assert.deepEqual(args.slice(3, -3), [
    ...permissionFlags({
      dirs: [...PRODUCTION_DIRS, "/mnt/backup"],
      netHosts: ["s3.example.com", "127.0.0.1:7070"],
      readFiles: [...PRODUCTION_READ_FILES, "/secrets/s3.ini"],
    }),
    V8_FLAGS,
  ]);
  assert.ok(args.includes("--allow-net=s3.example.com:443,127.0.0.1:7070"));
  assert.ok(
    args.includes(
      `--allow-read=${[
        ...PRODUCTION_DIRS,
        "/mnt/backup",
        ...PRODUCTION_READ_FILES,
        "/secrets/s3.ini",
        ...ALLOWED_PROGRAMS,
      ]}`,
    ),
  );
  assert.ok(args.includes(`--allow-write=${[...PRODUCTION_DIRS, "/mnt/backup"]}`));
});

Deno.test("compileArgs bakes the metrics listen address into the one --allow-net", () => {
  const plain = compileArgs({ extraDirs: [], output: "x" });
  assert.ok(!plain.some((a) => a.startsWith("--allow-net")), "no network without the variable");
  const metrics = compileArgs({ extraDirs: [], metricsListen: ["0.0.0.0:9474"], output: "x" });
  assert.deepEqual(metrics.filter((a) => a.startsWith("--allow-net")), [
    "--allow-net=0.0.0.0:9474",
  ]);
  const both = compileArgs({
    extraDirs: [],
    storeHosts: ["s3.example.com"],
    metricsListen: ["127.0.0.1:9474"],
    output: "x",
  });
  assert.deepEqual(both.filter((a) => a.startsWith("--allow-net")), [
    "--allow-net=s3.example.com:443,127.0.0.1:9474",
  ]);
  // A listen address needs its port: a bare host would not name what to listen on.
  assert.throws(
    () => compileArgs({ extraDirs: [], metricsListen: ["0.0.0.0"], output: "x" }),
    /Metrics listen address "0\.0\.0\.0" is not host:port/,
  );
});
