# A zfs-csi volume made by the plugin, with:
#
#   nomad volume create volume-create.hcl
#
# It needs the monolith plugin of the node that should hold the data, running and healthy:
#   nomad job run -var node=node-a zfs-csi.nomad.hcl
#   nomad plugin status zfs-node-a          # Controllers Healthy 1, Nodes Healthy 1
#
# The plugin creates the dataset <parent_dataset>/pg-data (e.g. tank/nomad/pg-data) on node-a at
# once, with refquota = capacity_min and the ZFS properties from "parameters" below. Nomad records
# the id the plugin answers, "pg-data@node-a", as the volume's External ID, and schedules every
# job that uses the volume on node-a (the only node that runs plugin zfs-node-a).
#
# To grow the volume later, raise capacity_min (and capacity_max, if set) here, leave everything
# else as it is, and run "nomad volume create volume-create.hcl" again. The refquota follows at
# once, even while jobs use the volume. Volumes never shrink.

type = "csi"

# Nomad's id for the volume: jobs name it in their volume block (source = "pg-data").
id = "pg-data"

# Sent to the plugin as the CreateVolume name. It becomes the dataset name below the parent
# dataset (characters other than letters, digits and "_.-" are encoded) and the volume id
# "pg-data@node-a". Must be unique per plugin; "/", "@" and "%" are refused.
name = "pg-data"

# The plugin id of the node that will hold the data (zfs-<node> from the monolith job).
plugin_id = "zfs-node-a"

# capacity_min becomes the dataset's refquota: the most live data it may hold (snapshots are not
# counted unless quota is set below). Without capacity_min, capacity_max is used; without both,
# the volume is unlimited (within the parent dataset's own quota). At least 1 MiB.
# GiB, MiB, ... are powers of 1024; GB, MB, ... powers of 1000.
capacity_min = "10GiB"

# Optional: the most the volume may ever be given. Growing past it needs a higher capacity_max
# in the same run.
capacity_max = "50GiB"

# At least one capability. This makes a ZFS dataset ("file-system"); every access mode is
# accepted, but the data lives on one node, so multi-node modes still mean that node. A zvol, as a
# raw "block-device" or with fs_type "ext4"/"xfs", needs a plugin with --block-volumes:
# volume-block.hcl and docs/block-volumes.md.
capability {
  access_mode     = "single-node-writer"
  attachment_mode = "file-system"
}

capability {
  access_mode     = "single-node-reader-only"
  attachment_mode = "file-system"
}

mount_options {
  # "zfs" or leave it out; "ext4" and "xfs" make a zvol (--block-volumes), any other is refused.
  fs_type = "zfs"

  # Optional flags for the bind mount into the job: ro, nosuid, nodev, noexec, noatime,
  # nodiratime, relatime, strictatime. Others are refused.
  # mount_flags = ["nosuid", "nodev"]
}

# ZFS properties set when the dataset is created. Only an allowlist is accepted:
#   aclinherit, acltype*, atime, casesensitivity, checksum, compression, copies, dedup, devices,
#   dnodesize*, encryption*, exec, keyformat*, keylocation*, logbias, normalization,
#   pbkdf2iters*, primarycache, recordsize, redundant_metadata*, relatime*, secondarycache,
#   setuid, snapdir, special_small_blocks*, sync, utf8only, xattr
#   (* OpenZFS only: refused on a ZFS without them; keylocation must be file:// or https://)
# plus user properties "module:name" (not org.zfs-csi:...), plus quota and refreservation.
# Anything else (mountpoint, sharenfs, canmount, a typo) fails the create and nothing is made.
# The operator's policy narrows this further (docs/parameters.md, "Who may set what: the operator's policy"): by default setuid,
# devices and exec only "off", dedup only "off", no keylocation without --key-dir, and a few
# more; the plugin's --allow-parameter and --deny-parameter flags change it.
# Parameters cannot be changed later through Nomad; use "zfs set" on the node for that.
# (Written as an attribute with a map value, "parameters = {", so that the quoted user property
# name below is valid HCL everywhere, e.g. for "nomad fmt". "parameters {" works too without it.)
parameters = {
  compression = "lz4"
  recordsize  = "16K" # e.g. for PostgreSQL's 8K pages; the default is 128K
  atime       = "off"

  # quota bounds the live data plus its snapshots. A size (at least the capacity), or
  # "capacity": data and snapshots then share the capacity, so snapshots can fill the volume.
  # When the volume grows, quota keeps its headroom above the capacity. Leave it out to let
  # snapshots use space beyond the capacity.
  quota = "capacity"

  # refreservation: space set aside in the pool for the volume. A size (at most the capacity),
  # or "capacity" for thick provisioning (it follows the volume when it grows).
  # refreservation = "capacity"

  # User properties are stored on the dataset as they are, e.g. for your own tools.
  "com.example:owner" = "team-db"
}

# Optional guard. Nomad sends it to the plugin, which refuses the create (RESOURCE_EXHAUSTED)
# if its node is not the one named here, e.g. after a copy-paste with the wrong plugin_id. It
# cannot move the volume elsewhere: the plugin id decides the node. Nomad keeps it, so a
# re-run to grow the volume must carry the same block.
# topology_request {
#   required {
#     topology {
#       segments = {
#         "org.zfs-csi/node" = "node-a"
#       }
#     }
#   }
# }
