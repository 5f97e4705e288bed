# zfs-csi node plugin (--mode node), one per client node (system job), run with the docker
# driver. All nodes share one plugin id. This is the node-only layout: there is no controller,
# so volumes are added with "nomad volume register" (volume-register.hcl) and each dataset is
# created on its node when a job first uses it; no "nomad volume create", snapshots or
# "nomad volume delete". For those, run zfs-csi-monolith.nomad.hcl once per node instead
# (see README.md, "Which layout").
#
#   nomad job run -var parent_dataset=tank/nomad -var parent_mountpoint=/tank/nomad \
#     zfs-csi-node.nomad.hcl
#
# Client requirements (see README.md):
#   - docker plugin config: allow_privileged = true, volumes { enabled = true }
#   - the parent dataset exists and is mounted on the host at parent_mountpoint
#     (zfs get -H -o value mountpoint tank/nomad), on a shared mount
#     (findmnt -o TARGET,PROPAGATION /tank/nomad shows "shared")
#   - the image has zfs/zpool matching the host's ZFS kernel module (see ../Containerfile)

variable "image" {
  type        = string
  default     = "zfs-csi:0.1.0"
  description = <<-EOT
    Image with zfs, zpool, mount and umount on PATH and glibc. The default is built from
    ../Containerfile and also holds the plugin at /usr/local/bin/zfs-csi. A plain image such as
    debian:bookworm-slim works too: bind-mount the plugin with binary_path and the host's ZFS
    userland (programs and libraries) with host_paths.
  EOT
}

variable "binary_path" {
  type        = string
  default     = ""
  description = <<-EOT
    Host path of the zfs-csi binary to bind-mount over /usr/local/bin/zfs-csi in the container,
    e.g. "/usr/local/bin/zfs-csi". Empty: use the binary inside the image.
  EOT
}

variable "host_paths" {
  type        = list(string)
  default     = []
  description = <<-EOT
    Host files or directories bind-mounted read-only at the same path, to use the host's ZFS
    userland in a plain image instead of the image's: the programs and the libraries they link,
    e.g. ["/usr/sbin/zfs", "/usr/sbin/zpool", "/usr/lib/x86_64-linux-gnu/libzfs.so.4", ...]
    (see "ldd /usr/sbin/zfs" on the host). They must end up on PATH in the container.
  EOT
}

variable "parent_dataset" {
  type        = string
  default     = "tank/nomad"
  description = "Dataset under which every volume is a child dataset (POOL/DATASET, not a whole pool)."
}

variable "parent_mountpoint" {
  type        = string
  default     = "/tank/nomad"
  description = "Where parent_dataset is mounted on the host (its zfs mountpoint property)."
}

variable "plugin_id" {
  type        = string
  default     = "zfs"
  description = "Nomad plugin id; volumes name it in plugin_id. Must not contain interpolations."
}

variable "topology" {
  type        = map(string)
  default     = {}
  description = <<-EOT
    Extra topology segments of every node, e.g. -var 'topology={zone="eu1"}'. The segment
    org.zfs-csi/node=<node name> is always added by the plugin.
  EOT
}

variable "log_level" {
  type        = string
  default     = "info"
  description = "debug, info, warn or error."
}

variable "datacenters" {
  type        = list(string)
  default     = ["*"]
  description = "Datacenters to run the plugin in."
}

locals {
  # In-task directory of the staging and target paths Nomad sends. The plugin may only write
  # below /csi and /local/csi inside a container (src/permissions.ts), so keep Nomad's default.
  stage_publish_base_dir = "/local/csi"

  args = concat(
    [
      # Node service only: no controller, so no volume create, delete or snapshots.
      "--mode", "node",
      "--parent-dataset", var.parent_dataset,
      # Also the value of the org.zfs-csi/node topology segment; volumes pin themselves to it.
      "--node-id", "${node.unique.name}",
      "--stage-publish-base-dir", local.stage_publish_base_dir,
      "--log-level", var.log_level,
    ],
    flatten([for k, v in var.topology : ["--topology", "${k}=${v}"]]),
  )
}

job "zfs-csi-node" {
  type        = "system"
  datacenters = var.datacenters

  constraint {
    attribute = "${attr.kernel.name}"
    value     = "linux"
  }

  # Place only where the docker driver allows what the task needs, rather than failing at start.
  constraint {
    attribute = "${attr.driver.docker.privileged.enabled}"
    value     = "true"
  }

  constraint {
    attribute = "${attr.driver.docker.volumes.enabled}"
    value     = "true"
  }

  group "node" {
    restart {
      attempts = 10
      interval = "10m"
      delay    = "15s"
      mode     = "delay"
    }

    task "plugin" {
      driver = "docker"

      config {
        image = var.image
        # Explicit, so a plain image without our ENTRYPOINT works too.
        entrypoint = ["/usr/local/bin/zfs-csi"]
        args       = local.args

        # mount(2) and /dev/zfs need CAP_SYS_ADMIN and the host's devices.
        privileged = true

        # Bind mounts, as a list because some are optional (dynamic blocks are not expanded
        # inside a driver's config and would fail when the task starts).
        mount = concat(
          [
            # The parent dataset's mountpoint at the same path as on the host. zfs mounts each
            # volume dataset below it and the plugin bind-mounts it from there; rshared makes
            # those mounts reach the host (and host mounts reach the plugin).
            {
              type         = "bind"
              source       = var.parent_mountpoint
              target       = var.parent_mountpoint
              readonly     = false
              bind_options = { propagation = "rshared" }
            },
          ],
          # Optional: the plugin binary from the host.
          [for p in compact([var.binary_path]) : {
            type     = "bind"
            source   = p
            target   = "/usr/local/bin/zfs-csi"
            readonly = true
          }],
          # Optional: the host's ZFS userland, for plain images.
          [for p in var.host_paths : {
            type     = "bind"
            source   = p
            target   = p
            readonly = true
          }],
        )

        # No mount for /dev: Nomad already bind-mounts the host's /dev into every CSI plugin
        # task (with /dev/zfs in it), and a second mount at /dev fails with "Duplicate mount
        # point". Nomad likewise adds mount_dir and stage_publish_base_dir (bidirectional).
      }

      csi_plugin {
        id                     = var.plugin_id
        type                   = "node"
        mount_dir              = "/csi" # CSI_ENDPOINT = unix:///csi/csi.sock
        stage_publish_base_dir = local.stage_publish_base_dir
      }

      resources {
        cpu    = 100
        memory = 128
      }
    }
  }
}
