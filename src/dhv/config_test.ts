import assert from "node:assert/strict";
import { DhvError } from "./contract.ts";
import { parseConfigFile, resolveHostConfig } from "./config.ts";

const DIR = "/opt/nomad/data/host_volume_plugins";
const NODE = "5d1e4a2b-0000-4000-8000-000000000001";

function reader(files: Record<string, string>) {
  return (path: string) => {
    const text = files[path];
    if (text === undefined) throw new Deno.errors.NotFound(path);
    return text;
  };
}

Deno.test("parseConfigFile reads one flag per line, skipping comments and blank lines", () => {
  const text = [
    "# zfs-csi host volume plugin",
    "--parent-dataset tank/nomad",
    "",
    "  --deleted-retention=24h  ",
    "--allow-parameter com.example:owner=*",
    "--node-local-plugin-id",
    "--key-dir /etc/zfs-csi/keys with space",
  ].join("\n");
  assert.deepEqual(parseConfigFile(text, "/x.conf"), [
    "--parent-dataset",
    "tank/nomad",
    "--deleted-retention=24h",
    "--allow-parameter",
    "com.example:owner=*",
    "--node-local-plugin-id",
    "--key-dir",
    "/etc/zfs-csi/keys with space",
  ]);
});

Deno.test("parseConfigFile names a line that is not a flag", () => {
  assert.throws(
    () => parseConfigFile("--parent-dataset tank/n\nparent-dataset=x\n", "/p/zfs-csi.conf"),
    (e: unknown) =>
      e instanceof DhvError && e.exitCode === 2 &&
      e.message ===
        '/p/zfs-csi.conf:2: "parent-dataset=x" is not a flag (write one --flag [value] per line)',
  );
});

Deno.test("resolveHostConfig reads the plugin dir's file through the server's config", () => {
  const { config, source } = resolveHostConfig({
    flags: [],
    pluginDir: DIR,
    nodeId: NODE,
    readTextFile: reader({
      [`${DIR}/zfs-csi.conf`]: "--parent-dataset tank/nomad\n--deleted-retention 1h\n",
    }),
  });
  assert.equal(source, `${DIR}/zfs-csi.conf`);
  assert.equal(config.parentDataset, "tank/nomad");
  assert.equal(config.deletedRetentionSeconds, 3600);
  // Nomad's node id by default.
  assert.equal(config.nodeId, NODE);
});

Deno.test("resolveHostConfig: flags after the operation win over the file, a --node-id over Nomad's", () => {
  const { config, source } = resolveHostConfig({
    flags: ["--parent-dataset", "tank/other", "--node-id", "node-a"],
    pluginDir: DIR,
    nodeId: NODE,
    readTextFile: () => {
      throw new Error("the file is not read when flags are given");
    },
  });
  assert.equal(source, "arguments");
  assert.equal(config.parentDataset, "tank/other");
  assert.equal(config.nodeId, "node-a");
});

Deno.test("resolveHostConfig refuses bad flags, --help and a missing file with exit 2", () => {
  const refused = (flags: string[], message: string) =>
    assert.throws(
      () => resolveHostConfig({ flags, pluginDir: DIR, nodeId: NODE, readTextFile: reader({}) }),
      (e: unknown) => e instanceof DhvError && e.exitCode === 2 && e.message === message,
    );
  refused(
    ["--parent-dataset", "tank"],
    'Flags from arguments: --parent-dataset "tank" is a ' +
      "whole pool: give a dataset inside it, e.g. tank/nomad",
  );
  refused(
    ["--help"],
    "Flags from arguments: --help and --version are not host volume plugin flags",
  );
  refused(
    [],
    `Cannot read the host volume plugin's flags from "${DIR}/zfs-csi.conf": it does not exist. ` +
      "Put the server's flags there, one per line (at least --parent-dataset POOL/DATASET)",
  );
  assert.throws(
    () => resolveHostConfig({ flags: [], pluginDir: "", nodeId: NODE, readTextFile: reader({}) }),
    /DHV_PLUGIN_DIR is not set/,
  );
});
