import assert from "node:assert/strict";
import {
  ALLOWED_ENV,
  ALLOWED_PROGRAMS,
  permissionFlags,
  PRODUCTION_DIRS,
  runtimeFlags,
  V8_FLAGS,
} from "./permissions.ts";

Deno.test("permissionFlags allows exactly zfs, zpool, mount and umount to run", () => {
  const flags = permissionFlags({ dirs: ["/csi"] });
  assert.deepEqual(flags.filter((f) => f.startsWith("--allow-run")), [
    "--allow-run=zfs,zpool,mount,umount",
  ]);
  assert.deepEqual([...ALLOWED_PROGRAMS], ["zfs", "zpool", "mount", "umount"]);
});

Deno.test("permissionFlags never grants all permissions or unscoped access", () => {
  const flags = permissionFlags({ dirs: [...PRODUCTION_DIRS] });
  for (const f of flags) {
    assert.notEqual(f, "-A");
    assert.notEqual(f, "--allow-all");
    assert.equal(f.startsWith("--allow-all"), false, f);
    if (f.startsWith("--allow-")) assert.ok(f.includes("="), `${f} is not scoped`);
  }
  assert.equal(
    flags.some((f) => f.startsWith("--allow-net") || f.startsWith("--allow-ffi")),
    false,
  );
  assert.ok(flags.includes("--no-prompt"));
});

Deno.test("permissionFlags lists the directories for reading and writing, once each", () => {
  const flags = permissionFlags({ dirs: ["/csi", "/local/csi", "/csi"] });
  assert.deepEqual(flags, [
    "--allow-run=zfs,zpool,mount,umount",
    "--allow-read=/csi,/local/csi",
    "--allow-write=/csi,/local/csi",
    `--allow-env=${ALLOWED_ENV.join(",")}`,
    "--allow-sys=statfs",
    "--no-prompt",
  ]);
  assert.ok(ALLOWED_ENV.includes("CSI_ENDPOINT"));
});

Deno.test("permissionFlags refuses relative directories and directories with a comma", () => {
  assert.throws(() => permissionFlags({ dirs: ["csi"] }), {
    name: "TypeError",
    message: 'Permission directory "csi" must be an absolute path without ","',
  });
  assert.throws(() => permissionFlags({ dirs: ["/a,/etc"] }), TypeError);
});

Deno.test("runtimeFlags adds the V8 heap settings to the permission flags and nothing else", () => {
  const scope = { dirs: ["/csi", "/local/csi"] };
  assert.deepEqual(runtimeFlags(scope), [...permissionFlags(scope), V8_FLAGS]);
  assert.match(V8_FLAGS, /^--v8-flags=--max-semi-space-size=\d+,--max-old-space-size=\d+$/);
});
