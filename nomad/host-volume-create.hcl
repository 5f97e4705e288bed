# A zfs-csi host volume (Nomad 1.10+ dynamic host volume), with:
#
#   nomad volume create host-volume-create.hcl
#
# It needs zfs-csi installed as the host volume plugin "zfs" on the client (the binary, or a
# symlink to it, named zfs in its host_volume_plugin_dir, and host-volume-zfs-csi.conf as
# zfs-csi.conf next to it; `nomad node status -self -verbose`
# then shows plugins.host_volume.zfs.version). Nomad picks a node that has the plugin and no
# volume of this name yet (or the one named by node_id), and runs the plugin there: it creates
# the dataset <parent dataset>/.host-<namespace>_<name> (e.g. tank/nomad/.host-default_app-data)
# with refquota = capacity_min, mounted at <host_volumes_dir>/<volume id>.
#
# To grow the volume, add the id Nomad gave it (nomad volume status -type host), raise
# capacity_min here, and run "nomad volume create" again. Volumes never shrink; the parameters
# are fixed at creation.

type      = "host"
name      = "app-data"
namespace = "default"

# The file name of the plugin in the client's host_volume_plugin_dir.
plugin_id = "zfs"

# id = "<the volume id, to update an existing volume>"
# node_id = "<a node id, to choose the node yourself>"

capacity_min = "10GiB"
capacity_max = "50GiB"

capability {
  access_mode     = "single-node-writer"
  attachment_mode = "file-system"
}

# ZFS properties, as for CSI volumes (the same allowlist and the operator's --allow-parameter /
# --deny-parameter policy): compression, recordsize, atime, quota, refreservation, user
# properties (module:name), ...
parameters {
  compression = "lz4"
  recordsize  = "16K"
}
