# A volume restored from the store (the plugin's --store) on the node whose plugin id is given:
# any node whose plugin has the same store, also when the node that made the backup is gone.
#
#   nomad volume snapshot list -plugin zfs-node-a     # store:<volume>:<guid> ids, ready or not
#   nomad volume create volume-from-store.hcl
#
# The plugin receives the stored chain (the full stream up to this snapshot) into a hidden
# dataset, checks each stream's size and SHA-256 against the store's manifest and the received
# snapshot's guid, and only then gives it the volume's name. A restore that takes longer than 90
# seconds answers "still running": run the same command again to wait for it.

type = "csi"
id   = "pg-data-restored"
name = "pg-data-restored"

# The node to restore on: its plugin id (one per node, see nomad/README.md).
plugin_id = "zfs-node-b"

# A stored snapshot's id, as "nomad volume snapshot create" or "snapshot list" shows it.
snapshot_id = "store:pg-data:00a1b2c3d4e5f607"

# Optional: without capacity_min the volume gets the size it had when the snapshot was taken.
capacity_min = "10GiB"

capability {
  access_mode     = "single-node-writer"
  attachment_mode = "file-system"
}

# Back the restored volume up too (needs the plugin's --store).
parameters {
  backup_interval = "15m"
  backup_keep     = "last=4,hourly=24,daily=14"
}
