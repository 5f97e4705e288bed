/**
 * Helpers of the zvol tests (block_volumes_test.ts, block_store_test.ts): CSI capabilities for
 * block and ext4/xfs volumes, and what a test reads of a zvol's device (through programs: Deno
 * asks for all permissions for any path below /dev).
 */

import assert from "node:assert/strict";
import { claimPaths } from "./nomad.ts";
import type { PluginProcess } from "./plugin_process.ts";
import { sh, tryRun } from "./zfs_pool.ts";

const MiB = 1024 * 1024;

/** A volume capability: block, or a filesystem (with an fs_type or not). */
export type Capability =
  | { readonly block: Record<string, never>; readonly access_mode: { readonly mode: string } }
  | {
    readonly mount: {
      readonly fs_type: string;
      readonly mount_flags: string[];
      readonly volume_mount_group: string;
    };
    readonly access_mode: { readonly mode: string };
  };

/** A raw block capability. */
export function blockCapability(mode = "SINGLE_NODE_WRITER"): Capability {
  return { block: {}, access_mode: { mode } };
}

/** A filesystem capability with an fs_type. */
export function fsCapability(fsType: string, mode = "SINGLE_NODE_WRITER"): Capability {
  return {
    mount: { fs_type: fsType, mount_flags: [], volume_mount_group: "" },
    access_mode: { mode },
  };
}

/** Reads `bytes` of `device` at `offsetMiB` (direct I/O), through a file in `dir`. */
export async function ddRead(
  device: string,
  offsetMiB: number,
  bytes: number,
  dir: string,
): Promise<Uint8Array> {
  const out = `${dir}/readback.bin`;
  await sh(
    "dd",
    `if=${device}`,
    `of=${out}`,
    "bs=1M",
    `skip=${offsetMiB}`,
    `count=${bytes / MiB}`,
    "iflag=direct",
    "status=none",
  );
  const data = await Deno.readFile(out);
  await Deno.remove(out);
  return data;
}

/** blkid's probe of a device: TYPE, UUID, ... (nothing when it finds no signature). */
export async function probe(device: string): Promise<Record<string, string>> {
  const r = await tryRun("blkid", "-p", "-o", "export", device);
  if (r.code === 2) return {};
  assert.equal(r.code, 0, `blkid -p ${device}: ${r.stderr}`);
  return Object.fromEntries(
    r.stdout.split("\n").filter((l) => l.includes("=")).map((l) => {
      const i = l.indexOf("=");
      return [l.slice(0, i), l.slice(i + 1)];
    }),
  );
}

/**
 * The device node of a zvol, waiting for udev to make its link. Asked of readlink: Deno wants
 * --allow-all for any path below /dev.
 */
export async function zvolDevice(dataset: string): Promise<string> {
  const link = `/dev/zvol/${dataset}`;
  for (let i = 0;; i++) {
    const r = await tryRun("readlink", "-e", link);
    if (r.code === 0) return r.stdout.trim();
    if (i >= 240) throw new Error(`${link} did not appear: ${r.stderr}`);
    await new Promise((r) => setTimeout(r, 250));
  }
}

/** A claim of a volume on one plugin: staged and published as Nomad does for one alloc. */
export interface ZvolClaim {
  readonly staging: string;
  readonly target: string;
  /** NodeUnpublish, then NodeUnstage. */
  release(): Promise<void>;
}

/**
 * NodeStage and NodePublish (read-write) of `volume` on `plugin` with `capability`, at the
 * paths Nomad gives alloc `allocId` for `usage` (below the Nomad volume id, default the volume
 * id); stage and unstage wait up to `deadlineMs`.
 */
export async function claimZvol(
  plugin: PluginProcess,
  volume: { readonly volume_id: string; readonly volume_context: object },
  capability: Capability,
  opts: {
    readonly allocId: string;
    readonly usage: string;
    readonly deadlineMs: number;
    readonly nomadVolumeId?: string;
  },
): Promise<ZvolClaim> {
  const c = plugin.client;
  const p = await claimPaths(plugin.baseDir, {
    volumeId: opts.nomadVolumeId ?? volume.volume_id,
    allocId: opts.allocId,
    usage: opts.usage,
  });
  const base = {
    volume_id: volume.volume_id,
    volume_capability: capability,
    volume_context: volume.volume_context,
    staging_target_path: p.staging,
  };
  await c.node("NodeStageVolume", base, opts.deadlineMs);
  await c.node("NodePublishVolume", { ...base, target_path: p.target, readonly: false });
  return {
    ...p,
    release: async () => {
      await c.node("NodeUnpublishVolume", { volume_id: volume.volume_id, target_path: p.target });
      await c.node(
        "NodeUnstageVolume",
        { volume_id: volume.volume_id, staging_target_path: p.staging },
        opts.deadlineMs,
      );
    },
  };
}
