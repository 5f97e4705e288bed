# A raw block volume: a zvol that jobs get as a block device (docs/block-volumes.md), with:
#
#   nomad volume create volume-block.hcl
#
# It needs OpenZFS (zfs-fuse cannot make zvols) and the monolith plugin of the node that should
# hold it, built and started for block volumes:
#   ZFS_CSI_BLOCK_VOLUMES=on deno task compile      # or: docker build --build-arg ZFS_CSI_BLOCK_VOLUMES=on
#   nomad job run -var node=node-a -var block_volumes=true zfs-csi.nomad.hcl
#
# The plugin creates the zvol <parent_dataset>/pg-block (zfs create -V 10G, reserved in full).
# A job uses it with attachment_mode = "block-device" and a task driver that can open a device:
# docker (or podman) with privileged = true, not exec (block-device-job.nomad.hcl says why).
#
# For ext4 or xfs on a zvol instead (an ordinary exec task can use it), write
# attachment_mode = "file-system" below and add
#   mount_options {
#     fs_type = "ext4"     # or "xfs"
#   }

type      = "csi"
id        = "pg-block"
name      = "pg-block"
plugin_id = "zfs-node-a"

# The zvol's size (volsize), rounded up to a multiple of 128 KiB. It grows with a higher
# capacity_min and "nomad volume create" again; it never shrinks.
capacity_min = "10GiB"

capability {
  access_mode     = "single-node-writer"
  attachment_mode = "block-device"
}

parameters {
  # The zvol's block size, fixed at creation: a power of two from 4K to 128K.
  volblocksize = "16K"
  # sparse = "true"   # thin (no refreservation); the plugin needs --allow-sparse-zvols
}
