/**
 * Requests shaped the way Nomad sends them (shared/guide/nomad.md, section 3): paths under
 * `<base>/staging/<namespace>/<volume>/<usage>` and `<base>/per-alloc/<alloc>/<volume>/<usage>`,
 * directories created as Nomad creates them.
 */

import type { CsiClient } from "./csi_client.ts";
import { sh } from "./zfs_pool.ts";

/** Nomad's usage segment for a read-write, single-node-writer file-system claim. */
export const RW_USAGE = "rw-file-system-single-node-writer";

/** A filesystem capability as Nomad builds it. */
export function mountCapability(mode = "SINGLE_NODE_WRITER", flags: string[] = []) {
  return {
    mount: { fs_type: "", mount_flags: flags, volume_mount_group: "" },
    access_mode: { mode },
  };
}

/**
 * A CreateVolume request as Nomad sends it for a spec with `capacity_min` of 64 MiB and one
 * file-system capability (accessibility_requirements always present); `over` replaces fields.
 */
export function createVolumeRequest(name: string, over: Record<string, unknown> = {}) {
  return {
    name,
    capacity_range: { required_bytes: String(64 * 1024 * 1024), limit_bytes: "0" },
    volume_capabilities: [mountCapability()],
    parameters: {},
    accessibility_requirements: { requisite: [], preferred: [] },
    ...over,
  };
}

/** Paths of one claim. */
export interface ClaimPaths {
  readonly staging: string;
  readonly target: string;
}

/**
 * The staging and target paths of a claim, with the directories Nomad makes before calling:
 * the whole staging path (0700) and only the target's parent.
 */
export async function claimPaths(
  baseDir: string,
  opts: { volumeId: string; allocId: string; namespace?: string; usage?: string },
): Promise<ClaimPaths> {
  const usage = opts.usage ?? RW_USAGE;
  const staging = `${baseDir}/staging/${opts.namespace ?? "default"}/${opts.volumeId}/${usage}`;
  const targetParent = `${baseDir}/per-alloc/${opts.allocId}/${opts.volumeId}`;
  await Deno.mkdir(staging, { recursive: true, mode: 0o700 });
  await Deno.mkdir(targetParent, { recursive: true });
  return { staging, target: `${targetParent}/${usage}` };
}

/** One mount as the host's `mount` lists it. */
export interface HostMount {
  readonly source: string;
  readonly path: string;
  readonly fsType: string;
  readonly options: string[];
}

/** The host mount table (read independently of the plugin's own parser). */
export async function hostMounts(): Promise<HostMount[]> {
  const out = await sh(
    "findmnt",
    "--raw",
    "--noheadings",
    "--output",
    "SOURCE,TARGET,FSTYPE,OPTIONS",
  );
  return out.split("\n").filter((l) => l !== "").map((line) => {
    const [source, path, fsType, options] = line.split(" ").map((f) =>
      f.replace(/\\x([0-9a-f]{2})/g, (_m, h: string) => String.fromCharCode(parseInt(h, 16)))
    );
    return { source: source!, path: path!, fsType: fsType!, options: (options ?? "").split(",") };
  });
}

/** The mounts at `path` on the host. */
export async function mountsAt(path: string): Promise<HostMount[]> {
  return (await hostMounts()).filter((m) => m.path === path);
}

/** What a claim needs of a running plugin: its client and its staging/publish base dir. */
export interface ClaimingPlugin {
  readonly client: CsiClient;
  readonly baseDir: string;
}

/** A claim of a volume by an alloc: its target path and how to release it. */
export interface Claim {
  readonly target: string;
  release(): Promise<void>;
}

/** Options of {@linkcode claimVolume}. */
export interface ClaimOptions {
  /** The volume's Nomad id, which Nomad's paths use (the CSI volume id by default). */
  readonly nomadVolumeId?: string;
  /** The deadline of the stage and unstage calls (the client's default otherwise). */
  readonly stageDeadlineMs?: number;
}

/**
 * Stages and publishes a volume for an alloc as Nomad does. Given a function, the release
 * unpublishes and unstages through the plugin that runs then (it may have restarted since).
 */
export async function claimVolume(
  plugin: ClaimingPlugin | (() => ClaimingPlugin),
  volume: { readonly volume_id: string; readonly volume_context: Record<string, string> },
  allocId: string,
  opts: ClaimOptions = {},
): Promise<Claim> {
  const now = typeof plugin === "function" ? plugin : () => plugin;
  const c = now().client;
  const p = await claimPaths(now().baseDir, {
    volumeId: opts.nomadVolumeId ?? volume.volume_id,
    allocId,
  });
  const base = {
    volume_id: volume.volume_id,
    volume_capability: mountCapability(),
    volume_context: volume.volume_context,
  };
  await c.node(
    "NodeStageVolume",
    { ...base, staging_target_path: p.staging },
    opts.stageDeadlineMs,
  );
  await c.node("NodePublishVolume", {
    ...base,
    staging_target_path: p.staging,
    target_path: p.target,
  });
  return stagedClaim(now, volume.volume_id, p, opts);
}

/**
 * The claim of a volume already staged and published at `paths`: its release unpublishes and
 * unstages it as Nomad does, through the plugin that runs then.
 */
export function stagedClaim(
  plugin: ClaimingPlugin | (() => ClaimingPlugin),
  volumeId: string,
  paths: ClaimPaths,
  opts: Pick<ClaimOptions, "stageDeadlineMs"> = {},
): Claim {
  const now = typeof plugin === "function" ? plugin : () => plugin;
  return {
    target: paths.target,
    release: async () => {
      await now().client.node("NodeUnpublishVolume", {
        volume_id: volumeId,
        target_path: paths.target,
      });
      await now().client.node(
        "NodeUnstageVolume",
        { volume_id: volumeId, staging_target_path: paths.staging },
        opts.stageDeadlineMs,
      );
    },
  };
}
