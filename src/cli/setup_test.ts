import assert from "node:assert/strict";
import { ConfigError } from "../config.ts";
import { resolveConfig, splitArgs } from "./setup.ts";

Deno.test("splitArgs keeps a subcommand's own flags apart from the plugin's, in any order", () => {
  const split = splitArgs(
    [
      "--json",
      "--parent-dataset",
      "tank/nomad",
      "pg",
      "--as=x",
      "--node-id",
      "n1",
      "--store-path-style",
    ],
    { json: { type: "boolean" }, as: { type: "string" } },
  );
  assert.deepEqual(split.own, { json: true, as: "x" });
  assert.deepEqual(split.positionals, ["pg"]);
  assert.deepEqual(split.configArgs, [
    "--parent-dataset",
    "tank/nomad",
    "--node-id",
    "n1",
    "--store-path-style",
  ]);
  const config = resolveConfig(split.configArgs.filter((a) => a !== "--store-path-style"));
  assert.equal(config.parentDataset, "tank/nomad");
  assert.equal(config.nodeId, "n1");
});

Deno.test("splitArgs refuses unknown flags in one ConfigError, and own flags that shadow the plugin's", () => {
  assert.throws(
    () => splitArgs(["--nope"], {}),
    (e) => e instanceof ConfigError && /nope/.test(e.message),
  );
  assert.throws(() => splitArgs([], { store: { type: "string" } }), TypeError);
  assert.throws(() => resolveConfig(["--parent-dataset", "tank"]), /whole pool/);
});

Deno.test("a flag typo is one line naming the flag meant, never the argument parser's text", () => {
  const own = { json: { type: "boolean" }, snapshot: { type: "string" } } as const;
  const message = (args: string[]) => {
    try {
      splitArgs(args, own);
    } catch (err) {
      assert.ok(err instanceof ConfigError);
      return err.message;
    }
    assert.fail("no error");
  };
  assert.equal(message(["--jsn"]), "unknown flag --jsn; did you mean --json? (see --help)");
  assert.equal(
    message(["--parent-datset", "tank/nomad"]),
    "unknown flag --parent-datset; did you mean --parent-dataset? (see --help)",
  );
  assert.equal(
    message(["--snap", "x"]),
    "unknown flag --snap; did you mean --snapshot? (see --help)",
  );
  assert.equal(message(["--frobnicate"]), "unknown flag --frobnicate (see --help)");
  assert.equal(message(["--snapshot"]), "flag --snapshot needs a value (see --help)");
  for (const m of [message(["--jsn"]), message(["--snapshot"])]) {
    assert.ok(!/positional|place it at the end/.test(m), m);
    assert.equal(m.split("\n").length, 1);
  }
});
