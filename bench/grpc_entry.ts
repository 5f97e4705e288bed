/**
 * The plugin's Probe and NodeGetInfo handlers (with the real health checker and the real unary
 * wrapper) on a grpc-js server, in code that runs on Deno and, bundled, on Node: the bench
 * compares the two runtimes serving the very same handlers. Apart from starting programs (each
 * runtime's own way), only node: APIs are used, so nothing else differs but the runtime.
 *
 *   <runtime> grpc_entry SOCKET PARENT_DATASET
 */

import * as grpc from "@grpc/grpc-js";
import { execFile } from "node:child_process";
import process from "node:process";
import { parseConfig } from "../src/config.ts";
import { HealthChecker } from "../src/csi/health.ts";
import { IdentityService } from "../src/csi/identity.ts";
import { NodeService } from "../src/csi/node.ts";
import { unary } from "../src/grpc/handler.ts";
import { loadCsiServices } from "../src/grpc/proto.ts";
import { KeyedLock } from "../src/lock.ts";
import { Logger } from "../src/log.ts";
import { Mounter } from "../src/mount/mounter.ts";
import { type CommandResult, type CommandRunner, DenoCommandRunner } from "../src/run.ts";
import { Zfs } from "../src/zfs/zfs.ts";
import { Datasets } from "../src/volume/datasets.ts";

/** A command runner on node:child_process, for Node. */
const nodeRunner: CommandRunner = {
  run(argv, options = {}): Promise<CommandResult> {
    const [program, ...args] = argv;
    return new Promise((resolve) => {
      execFile(
        program!,
        args,
        { timeout: options.timeoutMs ?? 60_000, env: { ...process.env, LC_ALL: "C", LANG: "C" } },
        (err, stdout, stderr) => {
          const e = err as (Error & { code?: unknown; killed?: boolean }) | null;
          resolve({
            code: e ? (typeof e.code === "number" ? e.code : 1) : 0,
            stdout: String(stdout),
            stderr: String(stderr),
            timedOut: e?.killed === true,
          });
        },
      );
    });
  },
};

// Each runtime starts programs its own way, as the plugin does on Deno (node:child_process on
// Deno would need to read the whole environment, which the plugin's permissions deny).
const runner: CommandRunner = "Deno" in globalThis ? new DenoCommandRunner() : nodeRunner;

const [socket, parent] = process.argv.slice(2);
const parsed = parseConfig([
  "--parent-dataset",
  parent!,
  "--node-id",
  "node-a",
  "--endpoint",
  `unix://${socket}`,
  // Named, so no default is looked up: that asks Deno's permissions, which Node has not.
  ...["--zfs", "zfs", "--zpool", "zpool", "--mount", "mount", "--umount", "umount"],
], {});
if (parsed.kind !== "run") throw new Error("unexpected config");
const config = parsed.config;
// At info, as the plugin runs: Probe and NodeGetInfo log at debug. The sink works on both.
const log = new Logger("info", {}, (line) => process.stderr.write(line + "\n"));
const zfs = new Zfs(runner, {
  zfsPath: "zfs",
  zpoolPath: "zpool",
  timeoutMs: 60_000,
  log,
});
const mounter = new Mounter(runner, {
  mountPath: "mount",
  umountPath: "umount",
  timeoutMs: 60_000,
  log,
});
const health = new HealthChecker({ zfs, mounter, parentDataset: parent!, log });
const identity = new IdentityService(health, { controller: false });
const node = new NodeService({
  config,
  zfs,
  mounter,
  datasets: new Datasets(zfs, mounter),
  health,
  locks: new KeyedLock(),
  log,
});
const services = loadCsiServices();
const server = new grpc.Server();
server.addService(services.Identity.service, {
  Probe: unary("Probe", () => identity.Probe(), log),
});
server.addService(services.Node.service, {
  NodeGetInfo: unary("NodeGetInfo", () => node.NodeGetInfo(), log),
});
health.startPeriodic();
server.bindAsync(`unix://${socket}`, grpc.ServerCredentials.createInsecure(), (err) => {
  if (err) throw err;
  process.stdout.write("serving\n");
});
