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

parameters {
  follow          = "true"
  backup_interval = "10s"
  # zfs-fuse (pool v23) has no lz4; the data is random anyway.
  compression = "off"
}
