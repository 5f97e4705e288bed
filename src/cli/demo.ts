/**
 * `zfs-csi demo`: drives a running plugin over its socket through one volume's life, the calls
 * Nomad makes, printing each step: create, stage, publish, write a file, see it in the list,
 * unpublish, unstage, delete. For a newcomer after `deno task dev` (see `deno task demo`), so the
 * plugin can be seen working without Nomad. What it made is undone if a step fails.
 */

import { parseArgs } from "node:util";
import { ConfigError, DEFAULT_ENDPOINT, DEFAULT_STAGE_PUBLISH_DIR } from "../config.ts";
import { CsiCallError, CsiSocketClient, listField, objectField, textField } from "./csi_client.ts";
import { type CliIo, formatTable, humanBytes, printJson } from "./io.ts";
import { flagError, requireGrant } from "./setup.ts";

/** The capability the demo asks for: a filesystem, one node writing (as Nomad's default). */
const CAPABILITY = {
  mount: { fs_type: "", mount_flags: [], volume_mount_group: "" },
  access_mode: { mode: "SINGLE_NODE_WRITER" },
};
const USAGE_DIR = "rw-file-system-single-node-writer";

/** One step done, as printed and as `--json` gives it. */
export interface DemoStep {
  readonly step: string;
  readonly ms: number;
  readonly detail: string;
}

/** What the demo works with. */
export interface DemoOptions {
  readonly socketPath: string;
  /** The plugin's --stage-publish-base-dir: Nomad's staging and target paths go below it. */
  readonly baseDir: string;
  readonly name: string;
  readonly sizeBytes: number;
  /** Leave the volume staged and published at the end (no unpublish, unstage, delete). */
  readonly keep: boolean;
  /** Called as each step ends. */
  readonly onStep: (step: DemoStep) => void;
}

function socketOf(endpoint: string): string {
  const m = /^unix:\/\/(\/.+)$/.exec(endpoint) ?? /^unix:(\/[^/].*)$/.exec(endpoint);
  if (!m?.[1]) throw new ConfigError(`--endpoint "${endpoint}" is not unix:///absolute/path`);
  return m[1];
}

/** gRPC's UNAVAILABLE and DEADLINE_EXCEEDED: the plugin could not be reached, or did not answer. */
const UNREACHABLE = new Set([14, 4]);

/**
 * The error for a plugin that cannot be reached at `socketPath`, in words: whether there is a
 * socket at all, and what to do; never gRPC's own text.
 */
export function unreachable(socketPath: string, err: CsiCallError): Error {
  let there: "none" | "socket" | "other" = "none";
  try {
    there = Deno.lstatSync(socketPath).isSocket ? "socket" : "other";
  } catch {
    there = "none";
  }
  const why = err.code === 4
    ? "a plugin took the connection but did not answer in time (busy, or stopping)"
    : there === "none"
    ? "there is no socket there: the plugin is not running"
    : there === "socket"
    ? "nothing answers on that socket: the plugin is not running (it left its socket behind)"
    : "that path is not a socket";
  return new Error(
    `cannot reach the plugin at ${socketPath}: ${why}; start it (deno task dev), or give ` +
      `--endpoint as the plugin has it`,
    { cause: err },
  );
}

/**
 * Runs the volume's life against the plugin at `opts.socketPath`.
 * @throws {CsiCallError} for the first call the plugin refused, after undoing what was done
 */
export async function runDemo(opts: DemoOptions): Promise<DemoStep[]> {
  const client = new CsiSocketClient(opts.socketPath);
  const steps: DemoStep[] = [];
  const undo: Array<() => Promise<unknown>> = [];
  const step = async <T>(name: string, fn: () => Promise<T>, say: (r: T) => string) => {
    const started = performance.now();
    const result = await fn();
    const done = { step: name, ms: Math.round(performance.now() - started), detail: say(result) };
    steps.push(done);
    opts.onStep(done);
    return result;
  };
  // Nomad's paths below stage_publish_base_dir: one staging dir per volume and usage, one
  // target per allocation.
  const staging = `${opts.baseDir}/staging/default/${opts.name}/${USAGE_DIR}`;
  const alloc = crypto.randomUUID();
  const target = `${opts.baseDir}/per-alloc/${alloc}/${opts.name}/${USAGE_DIR}`;
  try {
    await step(
      "Probe",
      async () => {
        const info = await client.call("Identity", "GetPluginInfo", {}, 10_000).catch((err) => {
          throw err instanceof CsiCallError && UNREACHABLE.has(err.code)
            ? unreachable(opts.socketPath, err)
            : err;
        });
        const probe = await client.call("Identity", "Probe", {});
        return { info, ready: textField(objectField(probe, "ready"), "value") };
      },
      (r) =>
        `${textField(r.info, "name")} ${textField(r.info, "vendor_version")}, ready: ${
          r.ready || "false"
        }`,
    );
    const created = await step("CreateVolume", () =>
      client.call("Controller", "CreateVolume", {
        name: opts.name,
        capacity_range: { required_bytes: String(opts.sizeBytes), limit_bytes: "0" },
        volume_capabilities: [CAPABILITY],
        parameters: {},
      }), (r) => {
      const v = objectField(r, "volume");
      return `id "${textField(v, "volume_id")}", ${
        humanBytes(Number(textField(v, "capacity_bytes")))
      }, ` +
        `dataset ${textField(objectField(v, "volume_context"), "dataset")}`;
    });
    const volume = objectField(created, "volume");
    const volumeId = textField(volume, "volume_id");
    const context = objectField(volume, "volume_context");
    const deleteVolume = () => client.call("Controller", "DeleteVolume", { volume_id: volumeId });
    undo.push(deleteVolume);
    // Nomad makes the whole staging path (0700) and the target's parent; the plugin the target.
    await Deno.mkdir(staging, { recursive: true, mode: 0o700 });
    await Deno.mkdir(target.slice(0, target.lastIndexOf("/")), { recursive: true });
    const unstage = () =>
      client.call("Node", "NodeUnstageVolume", {
        volume_id: volumeId,
        staging_target_path: staging,
      });
    await step("NodeStageVolume", () =>
      client.call("Node", "NodeStageVolume", {
        volume_id: volumeId,
        staging_target_path: staging,
        volume_capability: CAPABILITY,
        volume_context: context,
      }), () => `bind-mounted at ${staging}`);
    undo.push(unstage);
    const unpublish = () =>
      client.call("Node", "NodeUnpublishVolume", { volume_id: volumeId, target_path: target });
    await step("NodePublishVolume", () =>
      client.call("Node", "NodePublishVolume", {
        volume_id: volumeId,
        staging_target_path: staging,
        target_path: target,
        volume_capability: CAPABILITY,
        volume_context: context,
        readonly: false,
      }), () => `bind-mounted at ${target}`);
    undo.push(unpublish);
    const file = `${target}/hello.txt`;
    const text = `written by zfs-csi demo at ${new Date().toISOString()}\n`;
    await step("write a file", async () => {
      await Deno.writeTextFile(file, text);
      return await Deno.readTextFile(file);
    }, (back) => `${file}: ${back === text ? "read back the same" : "READ BACK DIFFERENT"}`);
    await step(
      "NodeGetVolumeStats",
      () => client.call("Node", "NodeGetVolumeStats", { volume_id: volumeId, volume_path: target }),
      (r) => {
        const bytes = listField(r, "usage").find((u) => textField(u, "unit") === "BYTES");
        return `used ${humanBytes(Number(textField(bytes, "used")))} of ` +
          humanBytes(Number(textField(bytes, "total")));
      },
    );
    await step("ListVolumes", () => client.call("Controller", "ListVolumes", {}), (r) => {
      const rows = listField(r, "entries").map((e) => {
        const v = objectField(e, "volume");
        const nodes = listField(objectField(e, "status"), "published_node_ids").map(String);
        return [
          textField(v, "volume_id"),
          humanBytes(Number(textField(v, "capacity_bytes"))),
          nodes.join(",") || "-",
        ];
      });
      const mine = rows.some((row) => row[0] === volumeId);
      return `${rows.length} volume(s), ours ${mine ? "among them" : "MISSING"}\n` +
        formatTable(["VOLUME ID", "SIZE", "PUBLISHED ON"], rows).map((l) => `    ${l}`).join("\n");
    });
    if (opts.keep) return steps;
    undo.pop();
    await step("NodeUnpublishVolume", unpublish, () => `${target} unmounted`);
    undo.pop();
    await step("NodeUnstageVolume", unstage, () => `${staging} unmounted`);
    undo.pop();
    await step(
      "DeleteVolume",
      deleteVolume,
      () =>
        `set aside for the plugin's --deleted-retention (zfs-csi undelete brings it back), or ` +
        `destroyed with retention 0`,
    );
    return steps;
  } catch (err) {
    for (const fn of undo.reverse()) await fn().catch(() => {});
    throw err;
  } finally {
    client.close();
  }
}

/** Usage of `demo`. */
export const usage = `Usage: zfs-csi demo [--endpoint unix:///PATH] [--stage-publish-base-dir DIR]
                    [--name NAME] [--size MIB] [--keep] [--json]

Drives a running plugin over its socket through one volume's life, as Nomad would: Probe,
CreateVolume, NodeStageVolume, NodePublishVolume, a file written into the volume,
NodeGetVolumeStats, ListVolumes, NodeUnpublishVolume, NodeUnstageVolume, DeleteVolume, printing
each step. --endpoint and --stage-publish-base-dir are the plugin's own (defaults:
$CSI_ENDPOINT or ${DEFAULT_ENDPOINT}, and ${DEFAULT_STAGE_PUBLISH_DIR}). --name (default
zfs-csi-demo) and --size (MiB, default 64) choose the volume; --keep stops after ListVolumes,
leaving it published. After \`deno task dev\`, \`deno task demo\` runs it against the dev plugin.`;

/** Runs `demo`. */
export async function run(args: readonly string[], io: CliIo): Promise<number> {
  const options = {
    endpoint: { type: "string" },
    "stage-publish-base-dir": { type: "string" },
    name: { type: "string" },
    size: { type: "string" },
    keep: { type: "boolean" },
    json: { type: "boolean" },
  } as const;
  let values;
  try {
    ({ values } = parseArgs({ args: [...args], strict: true, allowPositionals: false, options }));
  } catch (err) {
    throw new ConfigError(flagError(err, Object.keys(options)));
  }
  const envEndpoint = Deno.permissions.querySync({ name: "env", variable: "CSI_ENDPOINT" })
      .state === "granted"
    ? Deno.env.get("CSI_ENDPOINT")
    : undefined;
  const socketPath = socketOf(values.endpoint ?? envEndpoint ?? DEFAULT_ENDPOINT);
  const baseDir = (values["stage-publish-base-dir"] ?? DEFAULT_STAGE_PUBLISH_DIR).replace(
    /\/+$/,
    "",
  );
  if (!baseDir.startsWith("/")) throw new ConfigError("--stage-publish-base-dir must be absolute");
  const sizeMiB = Number(values.size ?? "64");
  if (!Number.isInteger(sizeMiB) || sizeMiB < 1) {
    throw new ConfigError(`--size "${values.size}" is not a whole number of MiB`);
  }
  // The socket is read and written like a file; the base dir is where the demo makes Nomad's
  // directories and writes its file.
  for (const path of [socketPath, baseDir]) {
    requireGrant({
      descriptors: [{ name: "read", path }, { name: "write", path }],
      what: `read and write "${path}"`,
      fix: `ZFS_CSI_EXTRA_DIRS=${path.slice(0, path.lastIndexOf("/")) || "/"}`,
    });
  }
  const json = values.json === true;
  let n = 0;
  const steps = await runDemo({
    socketPath,
    baseDir,
    name: values.name ?? "zfs-csi-demo",
    sizeBytes: sizeMiB * 1024 * 1024,
    keep: values.keep === true,
    onStep: (s) => {
      if (!json) io.out(`${String(++n).padStart(2)}. ${s.step} (${s.ms} ms): ${s.detail}`);
    },
  });
  if (json) printJson(io, steps);
  else io.out(`Done: ${steps.length} steps over ${socketPath}.`);
  return 0;
}
