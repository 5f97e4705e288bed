/**
 * The command line as an operator meets it: the plugin run with its production permission
 * flags; bad flags give one clear line and a non-zero exit; the socket is handled safely.
 */

import assert from "node:assert/strict";
import { PluginProcess, runZfsCsi } from "../support/plugin_process.ts";

Deno.test("cli: help, version and one-line errors", async (t) => {
  const dir = await Deno.makeTempDir({ prefix: "zfs-csi-cli-" });
  const ok = ["--parent-dataset", "tank/nomad", "--node-id", "n1"];
  const sock = [
    "--endpoint",
    `unix://${dir}/s/csi.sock`,
    "--stage-publish-base-dir",
    `${dir}/base`,
  ];
  try {
    await t.step("--help prints usage and the operator subcommands, and exits 0", async () => {
      const r = await runZfsCsi(dir, ["--help"]);
      assert.equal(r.code, 0);
      assert.match(r.stdout, /--parent-dataset/);
      assert.match(r.stdout, /--topology KEY=VALUE/);
      assert.match(r.stdout, /\nOperator subcommands \(zfs-csi <subcommand> --help shows one/);
      for (const name of ["list", "backup", "snapshots", "restore", "verify", "takeover"]) {
        assert.match(r.stdout, new RegExp(`\\n  ${name} +\\S`), name);
      }
    });
    await t.step("a subcommand's flag typo: exit 2, one line naming the flag meant", async () => {
      const r = await runZfsCsi(dir, ["list", ...ok, "--jsn"]);
      assert.equal(r.code, 2);
      assert.equal(
        r.stderr,
        "zfs-csi list: unknown flag --jsn; did you mean --json? (see --help)\n",
      );
    });
    await t.step("the demo without a running plugin names the socket, no gRPC text", async () => {
      await Deno.mkdir(`${dir}/base`, { recursive: true });
      const r = await runZfsCsi(dir, [
        "demo",
        "--endpoint",
        `unix://${dir}/nothing/csi.sock`,
        "--stage-publish-base-dir",
        `${dir}/base`,
      ]);
      assert.equal(r.code, 1);
      assert.equal(
        r.stderr,
        `zfs-csi demo: cannot reach the plugin at ${dir}/nothing/csi.sock: there is no socket ` +
          `there: the plugin is not running; start it (deno task dev), or give --endpoint as ` +
          `the plugin has it\n`,
      );
    });
    await t.step("--version prints name and version", async () => {
      const r = await runZfsCsi(dir, ["--version"]);
      assert.equal(r.code, 0);
      assert.match(r.stdout, /^org\.zfs-csi \d+\.\d+\.\d+\n$/);
    });
    const bad: Array<[string, string[], RegExp]> = [
      ["unknown flag", [...ok, "--nodeid", "x"], /nodeid/],
      ["missing parent dataset", ["--node-id", "n1"], /--parent-dataset/],
      ["missing node id", ["--parent-dataset", "tank/nomad"], /--node-id/],
      ["malformed topology", [...ok, "--topology", "zone"], /key=value/],
      ["parent dataset with @", ["--parent-dataset", "tank/x@s", "--node-id", "n1"], /not valid/],
      ["tcp endpoint", [...ok, "--endpoint", "tcp://0.0.0.0:1"], /unix:/],
      ["bad log level", [...ok, "--log-level", "loud"], /log-level/],
      ["stray argument", [...ok, "extra"], /argument/i],
    ];
    for (const [name, args, re] of bad) {
      await t.step(`${name}: exit 2 with one line`, async () => {
        const r = await runZfsCsi(dir, args);
        assert.equal(r.code, 2);
        const lines = r.stderr.trimEnd().split("\n");
        assert.equal(lines.length, 1, r.stderr);
        assert.match(lines[0]!, /^zfs-csi: /);
        assert.match(lines[0]!, re);
      });
    }
    await t.step("an unknown subcommand: exit 2 with one line naming the subcommands", async () => {
      const r = await runZfsCsi(dir, ["lsit", ...ok]);
      assert.equal(r.code, 2);
      const lines = r.stderr.trimEnd().split("\n");
      assert.equal(lines.length, 1, r.stderr);
      assert.match(lines[0]!, /^zfs-csi: unknown subcommand "lsit"; subcommands: list, /);
      assert.equal(r.stdout, "");
    });
    await t.step("help lists the operator subcommands", async () => {
      const r = await runZfsCsi(dir, ["help"]);
      assert.equal(r.code, 0, r.stderr);
      for (const name of ["list", "undelete", "purge", "verify", "demo"]) {
        assert.match(r.stdout, new RegExp(`\\n  ${name} `));
      }
    });
    await t.step("a socket outside the build's directories: exit 1 naming the fix", async () => {
      const r = await runZfsCsi(dir, [...ok, "--endpoint", "unix:///run/elsewhere/csi.sock"]);
      assert.equal(r.code, 1);
      assert.match(r.stderr, /ZFS_CSI_EXTRA_DIRS/);
    });
    await t.step("a non-socket file at the socket path is not deleted", async () => {
      await Deno.mkdir(`${dir}/s`, { recursive: true });
      await Deno.writeTextFile(`${dir}/s/csi.sock`, "not a socket");
      const r = await runZfsCsi(dir, [...ok, ...sock]);
      assert.equal(r.code, 1);
      assert.match(r.stderr, /not a socket/);
      assert.equal(await Deno.readTextFile(`${dir}/s/csi.sock`), "not a socket");
      await Deno.remove(`${dir}/s/csi.sock`);
    });
    await t.step("a socket another plugin serves is not stolen", async () => {
      await using first = await PluginProcess.start({
        parentDataset: "tank/nomad",
        dir,
        waitReady: false,
      });
      for (let i = 0; i < 200; i++) {
        try {
          await first.client.identity("GetPluginInfo", {}, 1000);
          break;
        } catch {
          await new Promise((r) => setTimeout(r, 25));
        }
      }
      const r = await runZfsCsi(dir, [
        ...ok,
        "--endpoint",
        `unix://${first.socketPath}`,
        "--stage-publish-base-dir",
        first.baseDir,
      ]);
      assert.equal(r.code, 1);
      assert.match(r.stderr, /another process is serving/);
      assert.equal((await first.client.identity("GetPluginInfo")).name, "org.zfs-csi");
    });
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
});
