/**
 * Where does a node lifecycle's time go inside the plugin? Runs the plugin as it ships (its
 * permission and V8 flags) with Deno's `--cpu-prof`, drives one volume through N lifecycles
 * (stage, publish, unpublish, unstage; each in a new allocation's directories, as Nomad does),
 * stops it so the profile is written, and prints the per-call medians and the main thread's
 * busy time per lifecycle by where it was spent (self time, grouped by op, module or package).
 * The timed lifecycles are bracketed by a second of idleness, and only the profile between
 * those two idle stretches is counted (not start-up, not the clean-up).
 *
 *   deno run --frozen --allow-all bench/lifecycle_profile.ts [--lifecycles 200] [--top 20]
 *     [--keep DIR]   (keep the .cpuprofile in DIR)
 */

import { parseArgs } from "node:util";
import { claimPaths, mountCapability } from "../tests/support/nomad.ts";
import { PluginProcess } from "../tests/support/plugin_process.ts";
import { TestPool } from "../tests/support/zfs_pool.ts";

const { values } = parseArgs({
  args: Deno.args,
  options: {
    lifecycles: { type: "string", default: "200" },
    top: { type: "string", default: "20" },
    keep: { type: "string" },
  },
});
const lifecycles = Number(values.lifecycles);
const top = Number(values.top);
if (!(lifecycles > 0) || !(top > 0)) throw new RangeError("--lifecycles and --top must be > 0");

/** The parts of a V8 .cpuprofile this reads. */
interface CpuProfile {
  readonly nodes: readonly {
    readonly id: number;
    readonly callFrame: { readonly functionName: string; readonly url: string };
  }[];
  readonly samples: readonly number[];
  readonly timeDeltas: readonly number[];
}

/** Where a profile node's self time is counted: a Deno op, a package, a module, or V8 itself. */
function groupOf(frame: { functionName: string; url: string }): string {
  const { functionName: fn, url } = frame;
  if (url === "") return fn.startsWith("op_") ? `op ${fn}` : fn || "(native)";
  const pkg = /\/registry\.npmjs\.org\/((?:@[^/]+\/)?[^/]+)\//.exec(url);
  if (pkg) return `npm ${pkg[1]}`;
  if (url.startsWith("ext:")) return `deno ${url.slice(4).split("/")[0]}`;
  const local = url.indexOf("/src/");
  return local >= 0 ? url.slice(local + 1) : url;
}

const encoder = new TextEncoder();
function out(line: string): void {
  Deno.stdout.writeSync(encoder.encode(line + "\n"));
}

/** The sample indexes between the first and the last idle stretch of at least `gapMs`. */
function timedWindow(p: CpuProfile, idleIds: Set<number>, gapMs: number): [number, number] {
  const stretches: [number, number][] = [];
  let from = -1;
  let ms = 0;
  p.samples.forEach((id, k) => {
    if (idleIds.has(id)) {
      if (from < 0) [from, ms] = [k, 0];
      ms += (p.timeDeltas[k] ?? 0) / 1000;
      if (ms >= gapMs && stretches.at(-1)?.[0] !== from) stretches.push([from, k]);
      if (ms >= gapMs) stretches[stretches.length - 1] = [from, k];
    } else from = -1;
  });
  if (stretches.length < 2) throw new Error("the profile shows no idle stretch around the run");
  return [stretches[0]![1] + 1, stretches.at(-1)![0]];
}

const CAP = mountCapability();
/** The plugin's idleness around the timed lifecycles, marking them in the profile. */
const IDLE_MS = 1500;
const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));
const profileDir = values.keep ?? await Deno.makeTempDir({ prefix: "zfs-csi-profile-" });
const perCall: number[][] = [[], [], [], []];
let profile: CpuProfile;
{
  await using pool = await TestPool.create(256);
  const dir = `${pool.dir}/profile`;
  await Deno.mkdir(dir, { recursive: true });
  const plugin = await PluginProcess.start({
    parentDataset: pool.parent,
    dir,
    logLevel: "info",
    denoFlags: ["--cpu-prof", `--cpu-prof-dir=${profileDir}`],
  });
  const c = plugin.client;
  const created = await c.controller("CreateVolume", {
    name: "profiled",
    capacity_range: { required_bytes: String(64 * 1024 * 1024) },
    volume_capabilities: [CAP],
    parameters: {},
  });
  const v = created.volume as { volume_id: string; volume_context: Record<string, string> };
  const common = {
    volume_id: v.volume_id,
    volume_capability: CAP,
    volume_context: v.volume_context,
  };
  // One lifecycle before timing: a volume's first stage also records that it was staged.
  for (let i = -1; i < lifecycles; i++) {
    if (i === 0) await sleep(IDLE_MS);
    const p = await claimPaths(plugin.baseDir, { volumeId: "profiled", allocId: `a-${i + 1}` });
    const calls: (() => Promise<unknown>)[] = [
      () => c.node("NodeStageVolume", { ...common, staging_target_path: p.staging }),
      () =>
        c.node("NodePublishVolume", {
          ...common,
          staging_target_path: p.staging,
          target_path: p.target,
          readonly: false,
        }),
      () => c.node("NodeUnpublishVolume", { volume_id: v.volume_id, target_path: p.target }),
      () => c.node("NodeUnstageVolume", { volume_id: v.volume_id, staging_target_path: p.staging }),
    ];
    for (const [k, call] of calls.entries()) {
      const t = performance.now();
      await call();
      if (i >= 0) perCall[k]!.push(performance.now() - t);
    }
  }
  await sleep(IDLE_MS);
  await c.controller("DeleteVolume", { volume_id: v.volume_id });
  const status = await plugin.stop("SIGTERM");
  if (!status.success) throw new Error(`the plugin exited with ${status.code}`);
  const file = [...Deno.readDirSync(profileDir)].find((e) => e.name.endsWith(".cpuprofile"));
  if (!file) throw new Error(`no .cpuprofile in ${profileDir}`);
  profile = JSON.parse(await Deno.readTextFile(`${profileDir}/${file.name}`)) as CpuProfile;
  if (values.keep === undefined) await Deno.remove(profileDir, { recursive: true });
}

const median = (xs: number[]) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)]!;
const names = ["stage", "publish", "unpublish", "unstage"];
const medians = perCall.map(median);
const wall = medians.reduce((a, b) => a + b, 0);
out(
  `${lifecycles} lifecycles; per call (median): ` +
    names.map((n, k) => `${n} ${medians[k]!.toFixed(1)} ms`).join(", ") +
    `; lifecycle ${wall.toFixed(1)} ms`,
);

const frames = new Map(profile.nodes.map((n) => [n.id, n.callFrame]));
const idleIds = new Set(
  profile.nodes.filter((n) => n.callFrame.functionName === "(idle)").map((n) => n.id),
);
// The idle gaps themselves are cut off, at most a sample's worth of them stays.
const [first, last] = timedWindow(profile, idleIds, IDLE_MS * 0.8);
const byGroup = new Map<string, number>();
for (let k = first; k < last; k++) {
  const id = profile.samples[k]!;
  const group = groupOf(frames.get(id) ?? { functionName: "(unknown)", url: "" });
  byGroup.set(group, (byGroup.get(group) ?? 0) + (profile.timeDeltas[k] ?? 0) / 1000);
}
const idle = byGroup.get("(idle)") ?? 0;
byGroup.delete("(idle)");
const busy = [...byGroup.values()].reduce((a, b) => a + b, 0);
out(
  `main thread busy ${(busy / lifecycles).toFixed(2)} ms per lifecycle ` +
    `(idle ${(idle / lifecycles).toFixed(2)} ms); where, per lifecycle:`,
);
for (const [group, ms] of [...byGroup].sort((a, b) => b[1] - a[1]).slice(0, top)) {
  out(`  ${(ms / lifecycles).toFixed(3).padStart(7)} ms  ${group}`);
}
