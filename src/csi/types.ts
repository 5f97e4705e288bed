/**
 * The shapes of the CSI messages the handlers use, as src/grpc/proto.ts decodes them with
 * protobufjs: field names as in the proto, enums, int64 as strings, defaults and oneofs.
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

export interface TopologyMessage {
  segments: StringMap;
}

export interface TopologyRequirementMessage {
  requisite: TopologyMessage[];
  preferred: TopologyMessage[];
}

/** VolumeContentSource: one of a snapshot or a volume (a oneof, named by `type`). */
export interface VolumeContentSource {
  snapshot?: { snapshot_id: string } | null;
  volume?: { volume_id: string } | null;
  type?: "snapshot" | "volume";
}

export interface CreateVolumeRequest {
  name: string;
  capacity_range: CapacityRange | null;
  volume_capabilities: VolumeCapability[];
  parameters: StringMap;
  secrets: StringMap;
  volume_content_source: VolumeContentSource | null;
  accessibility_requirements: TopologyRequirementMessage | null;
  mutable_parameters: StringMap;
}

export interface DeleteVolumeRequest {
  volume_id: string;
  secrets: StringMap;
}

export interface ValidateVolumeCapabilitiesRequest {
  volume_id: string;
  volume_context: StringMap;
  volume_capabilities: VolumeCapability[];
  parameters: StringMap;
  secrets: StringMap;
  mutable_parameters: StringMap;
}

export interface ListVolumesRequest {
  max_entries: number;
  starting_token: string;
}

export interface ControllerGetVolumeRequest {
  volume_id: string;
}

export interface GetCapacityRequest {
  volume_capabilities: VolumeCapability[];
  parameters: StringMap;
  accessible_topology: TopologyMessage | null;
}

export interface ControllerExpandVolumeRequest {
  volume_id: string;
  capacity_range: CapacityRange | null;
  secrets: StringMap;
  volume_capability: VolumeCapability | null;
}

export interface CreateSnapshotRequest {
  source_volume_id: string;
  name: string;
  secrets: StringMap;
  parameters: StringMap;
}

export interface DeleteSnapshotRequest {
  snapshot_id: string;
  secrets: StringMap;
}

export interface ListSnapshotsRequest {
  max_entries: number;
  starting_token: string;
  source_volume_id: string;
  snapshot_id: string;
  secrets: StringMap;
}

/** Any request: handlers read the fields they know. */
export type AnyRequest = Record<string, unknown>;
