/**
 * The variables Nomad sets for a dynamic host volume plugin (src/dhv/contract.ts reads them):
 * here, below the front ends, because the build's permission list names them too
 * (src/permissions.ts).
 */

/** Every variable Nomad sets for a host volume plugin (all of them, for the permission list). */
export const DHV_ENV = [
  "DHV_OPERATION",
  "DHV_VOLUMES_DIR",
  "DHV_PLUGIN_DIR",
  "DHV_CREATED_PATH",
  "DHV_NAMESPACE",
  "DHV_VOLUME_NAME",
  "DHV_VOLUME_ID",
  "DHV_NODE_ID",
  "DHV_NODE_POOL",
  "DHV_CAPACITY_MIN_BYTES",
  "DHV_CAPACITY_MAX_BYTES",
  "DHV_PARAMETERS",
] as const;
