import assert from "node:assert/strict";
import { Code, CsiError } from "../errors.ts";
import { checkRequisite, nodeIsIn, type Topology } from "./topology.ts";

const NODE_TOPOLOGY = { "zfs-csi/node": "node-a", "topology.kubernetes.io/zone": "z1" };

function assertExhausted(fn: () => unknown): void {
  assert.throws(fn, (err: unknown) => {
    assert.ok(err instanceof CsiError, `expected a CsiError, got ${String(err)}`);
    assert.equal(err.code, Code.RESOURCE_EXHAUSTED);
    assert.match(err.message, /^The requested topology excludes node "node-a", /);
    return true;
  });
}

Deno.test("nodeIsIn is true when every segment of the topology matches the node's", () => {
  const table: ReadonlyArray<readonly [Topology, boolean]> = [
    [{ segments: { "zfs-csi/node": "node-a" } }, true],
    [{ segments: { "topology.kubernetes.io/zone": "z1" } }, true],
    [{ segments: { "zfs-csi/node": "node-a", "topology.kubernetes.io/zone": "z1" } }, true],
    [{ segments: {} }, true],
    [{ segments: null }, true],
    [{}, true],
    [{ segments: { "zfs-csi/node": "node-b" } }, false],
    [{ segments: { "zfs-csi/node": "node-a", "topology.kubernetes.io/zone": "z2" } }, false],
    [{ segments: { "zfs-csi/node": "Node-A" } }, false],
    [{ segments: { "zfs-csi/node": "" } }, false],
    [{ segments: { "other/key": "node-a" } }, false],
  ];
  for (const [topology, expected] of table) {
    assert.equal(nodeIsIn(topology, NODE_TOPOLOGY), expected, JSON.stringify(topology));
  }
});

Deno.test("checkRequisite accepts a request without requisite topologies", () => {
  for (const req of [undefined, null, {}, { requisite: [] }, { requisite: null }]) {
    assert.doesNotThrow(() => checkRequisite(req, NODE_TOPOLOGY, "node-a"), JSON.stringify(req));
  }
});

Deno.test("checkRequisite ignores preferred topologies", () => {
  assert.doesNotThrow(() =>
    checkRequisite(
      { preferred: [{ segments: { "zfs-csi/node": "node-b" } }] },
      NODE_TOPOLOGY,
      "node-a",
    )
  );
  assertExhausted(() =>
    checkRequisite(
      {
        requisite: [{ segments: { "zfs-csi/node": "node-b" } }],
        preferred: [{ segments: { "zfs-csi/node": "node-a" } }],
      },
      NODE_TOPOLOGY,
      "node-a",
    )
  );
});

Deno.test("checkRequisite accepts when one requisite topology among several holds this node", () => {
  assert.doesNotThrow(() =>
    checkRequisite(
      {
        requisite: [
          { segments: { "zfs-csi/node": "node-b" } },
          { segments: { "zfs-csi/node": "node-a" } },
          { segments: { "zfs-csi/node": "node-c" } },
        ],
      },
      NODE_TOPOLOGY,
      "node-a",
    )
  );
});

Deno.test("checkRequisite refuses with RESOURCE_EXHAUSTED naming the node when none holds it", () => {
  assertExhausted(() =>
    checkRequisite(
      {
        requisite: [
          { segments: { "zfs-csi/node": "node-b" } },
          { segments: { "zfs-csi/node": "node-a", "topology.kubernetes.io/zone": "z2" } },
        ],
      },
      NODE_TOPOLOGY,
      "node-a",
    )
  );
  assertExhausted(() =>
    checkRequisite({ requisite: [{ segments: { "zfs-csi/node": "x" } }] }, {}, "node-a")
  );
});
