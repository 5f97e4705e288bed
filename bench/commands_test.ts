import { PURGE_PROPERTIES } from "../src/volume/trash.ts";
import assert from "node:assert/strict";
import {
  floorScript,
  isBackground,
  isReadOnly,
  parseCommandLog,
  parseFloorTimes,
  shellQuote,
  shimScript,
} from "./commands.ts";

Deno.test("the shim log reads back as exit codes and argv", () => {
  const log = "0\tzfs\x1fget\x1f-Hp\x1ftype\x1ftank/a b\n1\tmount\x1f\n0\tumount\x1f/x\n";
  assert.deepEqual(parseCommandLog(log), [
    { code: 0, argv: ["zfs", "get", "-Hp", "type", "tank/a b"] },
    { code: 1, argv: ["mount"] },
    { code: 0, argv: ["umount", "/x"] },
  ]);
  assert.deepEqual(parseCommandLog(""), []);
  assert.throws(() => parseCommandLog("zfs get\n"), SyntaxError);
});

Deno.test("shellQuote leaves plain words and quotes everything else", () => {
  assert.equal(shellQuote("/usr/sbin/zfs"), "/usr/sbin/zfs");
  assert.equal(shellQuote("refquota=67108864"), "refquota=67108864");
  assert.equal(shellQuote("org.zfs-csi:parameters={}"), "'org.zfs-csi:parameters={}'");
  assert.equal(shellQuote("a b"), "'a b'");
  assert.equal(shellQuote("it's"), `'it'\\''s'`);
  assert.equal(shellQuote("$(reboot)"), "'$(reboot)'");
  assert.equal(shellQuote(""), "''");
});

Deno.test("read-only commands are told from the ones that change something", () => {
  assert.equal(isReadOnly(["zfs", "get", "-Hp", "type", "t/a"]), true);
  assert.equal(isReadOnly(["zfs", "list", "-H"]), true);
  assert.equal(isReadOnly(["zpool", "list", "-H"]), true);
  assert.equal(isReadOnly(["mount"]), true);
  assert.equal(isReadOnly(["mount", "--bind", "/a", "/b"]), false);
  assert.equal(isReadOnly(["umount", "/b"]), false);
  assert.equal(isReadOnly(["zfs", "create", "t/a"]), false);
  assert.equal(isReadOnly(["zfs", "rename", "t/a", "t/b"]), false);
});

Deno.test("background commands are the health check's and the purge's", () => {
  const parent = "tank/nomad";
  assert.equal(isBackground(["zpool", "list", "-H", "-o", "name,health", "tank"], parent), true);
  const get = ["zfs", "get", "-Hp", "-o", "name,property,value,source"];
  assert.equal(isBackground([...get, "type,mounted,mountpoint", parent], parent), true);
  assert.equal(
    isBackground([
      ...get.slice(0, 3),
      "-r",
      "-d",
      "2",
      ...get.slice(3),
      PURGE_PROPERTIES.join(","),
      parent,
    ], parent),
    true,
  );
  // The same properties of a volume, or other properties of the parent, belong to a call.
  assert.equal(isBackground([...get, "type,mounted,mountpoint", `${parent}/v`], parent), false);
  assert.equal(isBackground([...get, "available", parent], parent), false);
  assert.equal(isBackground(["mount"], parent), false);
});

Deno.test("the shim skips logging for programs zfs starts itself", () => {
  const text = shimScript("zfs", "/usr/sbin/zfs", "/tmp/x y/log");
  const lines = text.split("\n");
  assert.equal(lines[0], "#!/bin/bash");
  assert.match(text, /ZFS_CSI_SHIMMED:-\}" \]; then exec \/usr\/sbin\/zfs "\$@"; fi/);
  assert.match(text, />> '\/tmp\/x y\/log'/);
  assert.match(text, /^exit \$rc$/m);
});

Deno.test("the floor script runs each command, checks its exit code and times each step", () => {
  const script = floorScript([
    {
      name: "stage",
      commands: [
        { code: 0, argv: ["zfs", "get", "-Hp", "type", "t/v"] },
        { code: 0, argv: ["mount", "--bind", "/m/v", "/s dir"] },
      ],
      setup: ["mkdir -p /s"],
    },
    { name: "create", commands: [{ code: 1, argv: ["zfs", "get", "type", "t/w"] }] },
  ], { zfs: "/sbin/zfs", mount: "/bin/mount" });
  const lines = script.split("\n");
  const idx = (re: RegExp) => lines.findIndex((l) => re.test(l));
  // Setup runs before the step's clock starts; commands run in order, output discarded.
  assert.ok(idx(/^mkdir -p \/s$/) < idx(/^t0=/));
  assert.ok(idx(/^\/sbin\/zfs get -Hp type t\/v >\/dev\/null 2>&1; rc=\$\?$/) > idx(/^t0=/));
  assert.ok(
    idx(/^\/bin\/mount --bind \/m\/v '\/s dir' /) > idx(/^\/sbin\/zfs get -Hp type t\/v /),
  );
  assert.equal(lines.filter((l) => /^\[ \$rc -eq 0 \]/.test(l)).length, 2);
  assert.equal(lines.filter((l) => /^\[ \$rc -eq 1 \]/.test(l)).length, 1);
  assert.equal(lines.filter((l) => /^echo (stage|create) /.test(l)).length, 2);
  assert.throws(() => floorScript([{ name: "x", commands: [{ code: 0, argv: ["rm"] }] }], {}));
});

Deno.test("floor times are read as milliseconds by step", () => {
  const times = parseFloorTimes("stage 12345\npublish 800\nnoise\n");
  assert.deepEqual([...times], [["stage", 12.345], ["publish", 0.8]]);
});
