/** The plugin's name (reverse-DNS, as CSI asks) and version, reported by GetPluginInfo. */
export const PLUGIN_NAME = "org.zfs-csi";
/** Kept equal to "version" in deno.json by a unit test. */
export const PLUGIN_VERSION = "0.1.0";
/** The CSI specification version this plugin implements. */
export const CSI_SPEC_VERSION = "1.12.0";
/** Topology key whose value is the node id: pins node-local volumes to their node. */
export const NODE_TOPOLOGY_KEY = `${PLUGIN_NAME}/node`;
