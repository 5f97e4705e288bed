import assert from "node:assert/strict";
import {
  ALLOWED_PROGRAMS,
  permissionFlags,
  PRODUCTION_DIRS,
  PRODUCTION_READ_FILES,
  V8_FLAGS,
} from "../src/permissions.ts";
import { compileArgs, fromBuildVariables } from "./compile_args.ts";

Deno.test("compileArgs bakes exactly the production permission flags", () => {
  const args = compileArgs({ extraDirs: [], output: "zfs-csi" });
  assert.equal(args[0], "compile");
  assert.deepEqual(args.slice(2, -3), [
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
  assert.deepEqual(args.slice(2, -3), [
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

Deno.test("fromBuildVariables splits paths on ':' and hosts on ','", () => {
  assert.deepEqual(fromBuildVariables({}), {
    extraDirs: [],
    storeHosts: [],
    extraReadFiles: [],
    metricsListen: [],
  });
  assert.deepEqual(
    fromBuildVariables({
      ZFS_CSI_EXTRA_DIRS: "/srv/csi::/mnt/backup",
      ZFS_CSI_STORE_HOSTS: "s3.example.com, [::1]:9000,",
      ZFS_CSI_EXTRA_READ_FILES: "/secrets/s3.ini",
      ZFS_CSI_METRICS_LISTEN: "0.0.0.0:9474, [::1]:9474",
    }),
    {
      extraDirs: ["/srv/csi", "/mnt/backup"],
      storeHosts: ["s3.example.com", "[::1]:9000"],
      extraReadFiles: ["/secrets/s3.ini"],
      metricsListen: ["0.0.0.0:9474", "[::1]:9474"],
    },
  );
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
