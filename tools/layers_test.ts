import assert from "node:assert/strict";
import {
  crossImports,
  importSpecifiers,
  importTable,
  resolveSpecifier,
  unitOf,
  violation,
} from "./layers.ts";

Deno.test("layers: every kind of relative import is found, packages are not", () => {
  const source = [
    `import { a } from "./a.ts";`,
    `import type { B } from "../csi/b.ts";`,
    `export { c } from "../store/c.ts";`,
    `import {\n  d,\n  e,\n} from "../zfs/d.ts";`,
    `const m = await import("../cli/scratch.ts");`,
    `import "./side_effect.ts";`,
    `import * as grpc from "npm:@grpc/grpc-js";`,
    `import assert from "node:assert/strict";`,
  ].join("\n");
  assert.deepEqual(importSpecifiers(source).sort(), [
    "../cli/scratch.ts",
    "../csi/b.ts",
    "../store/c.ts",
    "../zfs/d.ts",
    "./a.ts",
    "./side_effect.ts",
  ]);
});

Deno.test("layers: units are src/'s folders, its loose files, and the wiring", () => {
  assert.equal(unitOf("src/csi/node.ts"), "csi");
  assert.equal(unitOf("src/store/s3/sign.ts"), "store");
  assert.equal(unitOf("src/errors.ts"), "src");
  assert.equal(unitOf("src/plugin.ts"), "wiring");
  assert.equal(unitOf("main.ts"), "wiring");
  assert.equal(unitOf("tests/support/x.ts"), undefined);
  assert.equal(resolveSpecifier("src/follow/mover.ts", "../csi/trash.ts"), "src/csi/trash.ts");
  assert.equal(resolveSpecifier("main.ts", "./src/plugin.ts"), "src/plugin.ts");
});

Deno.test("layers: a folder may look down and across its own layer, never up or across front ends", () => {
  assert.equal(violation("csi", "follow"), undefined);
  assert.equal(violation("follow", "replicate"), undefined);
  assert.equal(violation("volume", "zfs"), undefined);
  assert.equal(violation("wiring", "csi"), undefined);
  assert.match(violation("follow", "csi") ?? "", /engine follow imports front csi, a layer above/);
  assert.match(violation("volume", "replicate") ?? "", /a layer above/);
  assert.match(violation("src", "metrics") ?? "", /ground src imports front metrics/);
  assert.match(violation("dhv", "csi") ?? "", /front end dhv imports front end csi/);
  assert.match(violation("nfs", "zfs") ?? "", /src\/nfs\/ has no layer/);
});

Deno.test("layers: the table counts imports between units, most first", () => {
  const files = new Map([
    [
      "src/follow/mover.ts",
      `import { a } from "../csi/trash.ts";\nimport { b } from "../csi/datasets.ts";`,
    ],
    ["src/csi/node.ts", `import { c } from "../follow/mover.ts";\nimport { d } from "./trash.ts";`],
    ["src/plugin.ts", `import { e } from "./csi/node.ts";`],
  ]);
  const imports = crossImports(files);
  assert.deepEqual(importTable(imports), [["follow → csi", 2], ["csi → follow", 1], [
    "wiring → csi",
    1,
  ]]);
  assert.deepEqual(
    imports.filter((i) => violation(i.from, i.to)).map((i) => i.target),
    ["src/csi/trash.ts", "src/csi/datasets.ts"],
  );
});
