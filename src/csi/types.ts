/**
 * The shapes of the CSI messages the handlers use, as @grpc/proto-loader decodes them with
 * keepCase, enums as strings, int64 as strings, defaults and oneofs (see grpc/proto.ts).
 * Kept in step with proto/csi.proto; a test decodes real requests through the proto to check.
 */

/** Map fields arrive as plain objects (empty when unset). */
export type StringMap = Record<string, string>;

export interface MountVolume {
  fs_type: string;
  mount_flags: string[];
  volume_mount_group: string;
}

export interface AccessMode {
  mode: string;
}

export interface VolumeCapability {
  block?: Record<string, never> | null;
  mount?: MountVolume | null;
  access_mode?: AccessMode | null;
  access_type?: "block" | "mount";
}

export interface NodeStageVolumeRequest {
  volume_id: string;
  publish_context: StringMap;
  staging_target_path: string;
  volume_capability: VolumeCapability | null;
  secrets: StringMap;
  volume_context: StringMap;
}

export interface NodeUnstageVolumeRequest {
  volume_id: string;
  staging_target_path: string;
}

export interface NodePublishVolumeRequest {
  volume_id: string;
  publish_context: StringMap;
  staging_target_path: string;
  target_path: string;
  volume_capability: VolumeCapability | null;
  readonly: boolean;
  secrets: StringMap;
  volume_context: StringMap;
}

export interface NodeUnpublishVolumeRequest {
  volume_id: string;
  target_path: string;
}

export interface NodeGetVolumeStatsRequest {
  volume_id: string;
  volume_path: string;
  staging_target_path: string;
}

export interface CapacityRange {
  required_bytes: string;
  limit_bytes: string;
}

export interface NodeExpandVolumeRequest {
  volume_id: string;
  volume_path: string;
  capacity_range: CapacityRange | null;
  staging_target_path: string;
  volume_capability: VolumeCapability | null;
  secrets: StringMap;
}

/** Any request: handlers read the fields they know. */
export type AnyRequest = Record<string, unknown>;
