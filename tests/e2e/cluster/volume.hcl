# The volume that follows its job (tests/e2e/nomad_cluster.sh): created once for the shared
# plugin id, not tied to a node. Its increments go to the store every 10 s while it is staged.
id           = "follow-data"
name         = "follow-data"
type         = "csi"
plugin_id    = "zfs-cluster"
capacity_min = "256MiB"

capability {
  access_mode     = "single-node-writer"
  attachment_mode = "file-system"
}

# Step 6 grows the volume with "nomad volume create" while the job uses it: Nomad refuses that
# unless the spec states mount_options (it stores empty ones for a spec without the block, and a
# spec without the block then differs: "can not update mount options while volume is in use",
# nomad/structs/csi.go, CSIVolume.Merge).
mount_options {
  fs_type = "zfs"
}

parameters {
  follow          = "true"
  backup_interval = "10s"
  # zfs-fuse (pool v23) has no lz4; the data is random anyway.
  compression = "off"
}
