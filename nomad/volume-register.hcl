# A zfs-csi volume added with:
#
#   nomad volume register volume-register.hcl
#
# Registering tells Nomad about a volume; it makes nothing in Nomad's name. Use it
#   - with the node-only layout (zfs-csi.nomad.hcl run without node, plugin id "zfs", no
#     controller): the dataset does not need to exist yet. At the first NodeStageVolume, i.e.
#     when the first job using the volume starts, the plugin creates <parent_dataset>/pg-data
#     (e.g. tank/nomad/pg-data) with refquota = context.size, on the node the volume is pinned to.
#   - with a monolith plugin (zfs-csi.nomad.hcl run with -var node=<node>, plugin id
#     "zfs-<node>"): only for a dataset that already exists on that node, e.g. one handed over
#     from outside or brought back after a delete (docs/deleting.md, "Undo a delete"). Nomad asks the
#     plugin to check the volume first and the register fails with "not found" if the dataset is
#     missing. New volumes on a monolith plugin are made with "nomad volume create"
#     (volume-create.hcl).
#
# The plugin (plugin_id below) must already be running and healthy:
#   nomad plugin status zfs            # or zfs-node-1 for a monolith plugin
#
# An existing dataset is used only if it carries org.zfs-csi:managed=yes; to hand one over:
#   zfs set org.zfs-csi:managed=yes tank/nomad/pg-data
# (it must keep its inherited mountpoint, below the parent dataset's).

type = "csi"

# Nomad's id for the volume: jobs name it in their volume block (source = "pg-data").
id   = "pg-data"
name = "pg-data"

# "zfs" for the node-only layout; "zfs-node-1" for the monolith plugin of node-1.
plugin_id = "zfs"

# The id Nomad sends to the plugin. It names the dataset, and may name its node:
#   "pg-data@node-1"   recommended: the dataset <parent_dataset>/pg-data on node node-1.
#                      Every plugin can tell where the volume lives: one on another node
#                      refuses with FAILED_PRECONDITION naming both nodes, instead of using or
#                      creating a dataset of the same name there. It is also the form
#                      "nomad volume create" gives its volumes.
#   "pg-data"          the dataset <parent_dataset>/pg-data on whichever node is asked. Calls
#                      that change or delete the volume (delete, expand, snapshots) refuse it
#                      unless the plugin runs with --node-local-plugin-id (one node per
#                      plugin id, as the shipped monolith jobs do).
#   "tank/nomad/pg-data"
#                      the same dataset by its full name (a direct child of the parent
#                      dataset; "tank/nomad/pg-data@node-1" works too).
# Names other than letters, digits and "_.-" are encoded: "db[0]" is the dataset
# "<parent_dataset>/db:5b0:5d".
# Without external_id, Nomad stages with the id ("pg-data"), but "nomad volume delete" and
# "nomad volume snapshot create" (monolith plugin) send an empty id and fail: set it.
external_id = "pg-data@node-1"

capability {
  access_mode     = "single-node-writer"
  attachment_mode = "file-system"
}

context {
  # Size of the dataset (its refquota) if the plugin creates it at first stage (node-only
  # layout). 10GiB, 500M or bytes; GiB, MiB, ... are powers of 1024. Without it, a missing
  # dataset is an error (NOT_FOUND) rather than a new, unlimited one. Ignored for a dataset
  # that exists.
  size = "10GiB"
}

# The data lives on one node only. Every zfs-csi plugin reports the topology segment
# org.zfs-csi/node = <its --node-id>, which the plugin jobs set to the Nomad node name
# (nomad node status shows it). Requiring that segment makes Nomad place every job using this
# volume on that node. With the node-only layout this is essential: without it, the first job
# could land on any node with the plugin and create the dataset there. With a monolith plugin
# the plugin id already pins the node, and this block only repeats it.
topology_request {
  required {
    topology {
      # Replace node-1 with the name of the node that holds (or will hold) the dataset, the
      # same as in external_id. (An attribute with a map value, because the key must be quoted.)
      segments = {
        "org.zfs-csi/node" = "node-1"
      }
    }
  }
}
