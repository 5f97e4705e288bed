import assert from "node:assert/strict";
import { Code } from "../errors.ts";
import { assertThrowsCsi } from "../../tests/support/assert_errors.ts";
import { NODE_TOPOLOGY_KEY } from "../version.ts";
import { followTopologies, MAX_STANDBYS, splitStandbys } from "./placement.ts";

const node = (n: string, more: Record<string, string> = {}) => ({
  segments: { ...more, [NODE_TOPOLOGY_KEY]: n },
});

Deno.test("splitStandbys takes standby_nodes out: sorted, without repeats or blanks around", () => {
  assert.deepEqual(
    splitStandbys({ standby_nodes: " node-c,node-b , node-c", compression: "lz4" }),
    {
      standbys: ["node-b", "node-c"],
      rest: { compression: "lz4" },
    },
  );
  assert.deepEqual(splitStandbys({ compression: "lz4" }), {
    standbys: [],
    rest: { compression: "lz4" },
  });
});

Deno.test("splitStandbys refuses empty or invalid names and too many", () => {
  for (const bad of ["", "a,,b", "node a", "-x", "a/b"]) {
    assertThrowsCsi(() => splitStandbys({ standby_nodes: bad }), Code.INVALID_ARGUMENT, /node ids/);
  }
  const many = Array.from({ length: MAX_STANDBYS + 1 }, (_, i) => `n${i}`).join(",");
  assertThrowsCsi(() => splitStandbys({ standby_nodes: many }), Code.INVALID_ARGUMENT, /at most/);
});

Deno.test("followTopologies: none without standbys (any node), or the requisite ones as given", () => {
  assert.deepEqual(followTopologies([], { requisite: [], preferred: [] }), []);
  assert.deepEqual(followTopologies([], null), []);
  const zone = { segments: { zone: "eu1" } };
  assert.deepEqual(followTopologies([], { requisite: [zone], preferred: [] }), [zone]);
});

Deno.test("followTopologies: one per standby node, combined with the requisite ones it fits", () => {
  assert.deepEqual(followTopologies(["b", "c"], { requisite: [], preferred: [node("a")] }), [
    node("b"),
    node("c"),
  ]);
  // A zone requisite: each standby is combined with it (Nomad then needs both segments).
  assert.deepEqual(
    followTopologies(["b", "c"], {
      requisite: [{ segments: { zone: "eu1" } }, node("c", { zone: "eu2" }), node("a")],
      preferred: [],
    }),
    [node("b", { zone: "eu1" }), node("c", { zone: "eu1" }), node("c", { zone: "eu2" })],
  );
  assertThrowsCsi(
    () => followTopologies(["b", "c"], { requisite: [node("a")], preferred: [] }),
    Code.RESOURCE_EXHAUSTED,
    /excludes every standby node \(b, c\)/,
  );
});
