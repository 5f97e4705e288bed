# A zfs-csi volume, added with:
#
#   nomad volume register volume-register.hcl
#
# The node plugin (plugin_id below) must already be running and healthy:
#   nomad plugin status zfs
#
# zfs-csi has no controller yet, so volumes are registered, not created: nothing happens on
# disk until the first job using the volume starts. Then, at NodeStageVolume, the plugin creates
# the dataset <parent_dataset>/pg-data (e.g. tank/nomad/pg-data) with refquota = context.size,
# on the node the volume is pinned to below.
#
# An existing dataset of that name is used only if it carries org.zfs-csi:managed=yes; to hand
# one over:   zfs set org.zfs-csi:managed=yes tank/nomad/pg-data
# (it must keep its inherited mountpoint, below the parent dataset's).

type      = "csi"
id        = "pg-data"
name      = "pg-data"
plugin_id = "zfs"

# external_id is left out, so Nomad sends the id ("pg-data") as the CSI volume id and the
# dataset is <parent_dataset>/pg-data. Ids that are not valid dataset names are encoded
# (e.g. "db[0]" -> "db:5b0:5d"). An external_id of the form "<parent_dataset>/<name>"
# (e.g. "tank/nomad/pgdata") names that child dataset directly.
# external_id = "tank/nomad/pg-data"

capability {
  access_mode     = "single-node-writer"
  attachment_mode = "file-system"
}

context {
  # Size of the dataset (its refquota) when the plugin creates it.
  size = "10GiB"
}

# The data lives on one node only. Every zfs-csi node reports the topology segment
# org.zfs-csi/node = <its --node-id>, which the plugin jobs set to the Nomad node name
# (nomad node status shows it). Requiring that segment makes Nomad place every job using this
# volume on that node; without it, the first job could land on any node with the plugin and
# create the dataset there, and a later one elsewhere would get a new, empty dataset.
topology_request {
  required {
    topology {
      # Replace node-1 with the name of the node that holds (or will hold) the dataset.
      # (An attribute with a map value, because the key must be quoted.)
      segments = {
        "org.zfs-csi/node" = "node-1"
      }
    }
  }
}
