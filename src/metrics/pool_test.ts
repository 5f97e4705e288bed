import assert from "node:assert/strict";
import { render } from "./exposition.ts";
import { parsePoolList, parseSize, poolFamilies, refusesParsable } from "./pool.ts";

Deno.test("parseSize reads exact bytes and zpool's rounded sizes", () => {
  assert.equal(parseSize("1073741824"), 1073741824);
  assert.equal(parseSize("512M"), 512 * 1024 * 1024);
  assert.equal(parseSize("1.5K"), 1536);
  assert.throws(() => parseSize("-"), SyntaxError);
  assert.throws(() => parseSize("1.2Q"), SyntaxError);
});

Deno.test("parsePoolList refuses lines it cannot read", () => {
  assert.deepEqual(parsePoolList("p\tONLINE\t10\t4\t6\n"), [
    { name: "p", health: "ONLINE", sizeBytes: 10, allocatedBytes: 4, freeBytes: 6 },
  ]);
  assert.throws(() => parsePoolList("p\tONLINE\t10\n"), /expected 5 fields/);
});

Deno.test("refusesParsable recognises zfs-fuse's answer to -p only", () => {
  assert.ok(refusesParsable("invalid option 'p'\nusage:\n"));
  assert.ok(!refusesParsable("cannot open 'tank': no such pool\n"));
});

Deno.test("poolFamilies sets 1 on the current health state, and adds a state it does not know", () => {
  const text = render(poolFamilies([
    { name: "p", health: "DEGRADED", sizeBytes: 10, allocatedBytes: 4, freeBytes: 6 },
    { name: "q", health: "WEIRD", sizeBytes: 1, allocatedBytes: 0, freeBytes: 1 },
  ]));
  assert.match(text, /^zfs_csi_pool_health\{pool="p",health="DEGRADED"\} 1$/m);
  assert.match(text, /^zfs_csi_pool_health\{pool="p",health="ONLINE"\} 0$/m);
  assert.match(text, /^zfs_csi_pool_health\{pool="q",health="WEIRD"\} 1$/m);
  assert.doesNotMatch(text, /pool="p",health="WEIRD"/);
});
