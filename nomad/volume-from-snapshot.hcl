# A new volume made from a snapshot of pg-data (volume-create.hcl), with:
#
#   nomad volume snapshot create pg-data nightly      # prints the snapshot id
#   nomad volume create volume-from-snapshot.hcl
#
# The plugin makes the dataset tank/nomad/pg-data-restore as a ZFS clone of the snapshot
# tank/nomad/pg-data@nightly: instant, and sharing the snapshot's blocks until either side
# changes them. The clone is a volume like any other (snapshots, growth, delete).
#
# While the clone lives, ZFS cannot destroy the snapshot. "nomad volume snapshot delete" still
# succeeds: the snapshot is set aside and goes away with the last clone made from it.

type = "csi"
id   = "pg-data-restore"
name = "pg-data-restore"

# The same plugin (and so the same node) as the snapshot: a clone lives in the same pool. Another
# node's plugin refuses with FAILED_PRECONDITION naming both nodes.
plugin_id = "zfs-node-a"

# The snapshot id as the plugin gave it: <volume name>@<snapshot name>@<node id>.
# "nomad volume snapshot list -plugin zfs-node-a" shows it.
snapshot_id = "pg-data@nightly@node-a"

# Or clone the volume as it is now, without a snapshot of your own: give the source volume's
# External ID ("nomad volume status pg-data" shows it), not its Nomad id. The plugin takes a
# hidden snapshot for the clone, which ZFS destroys when the clone goes.
# Only one of snapshot_id and clone_id.
# clone_id = "pg-data@node-a"

# Optional. Without it the clone gets the source's refquota. With it, it must hold the data the
# snapshot already has (else OUT_OF_RANGE).
capacity_min = "10GiB"

capability {
  access_mode     = "single-node-writer"
  attachment_mode = "file-system"
}

mount_options {
  fs_type = "zfs"
}

# Parameters work as in volume-create.hcl. Properties such as compression and recordsize
# apply to data written from now on; the clone starts with the snapshot's blocks as they are.
parameters {
  quota = "capacity"
}
