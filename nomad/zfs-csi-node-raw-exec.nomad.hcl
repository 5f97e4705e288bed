# zfs-csi node plugin (--mode node), one per client node (system job), run with the raw_exec
# driver: the binary runs directly on the host, as the Nomad agent's user (root), in the host's
# mount namespace. No image, no propagation settings; the host's zfs, zpool, mount and umount
# are used. All nodes share one plugin id. This is the node-only layout: there is no controller,
# so volumes are added with "nomad volume register" (volume-register.hcl) and each dataset is
# created on its node when a job first uses it; no "nomad volume create", snapshots or
# "nomad volume delete". For those, run zfs-csi-monolith-raw-exec.nomad.hcl once per node
# instead (see README.md, "Which layout").
#
#   nomad job run -var parent_dataset=tank/nomad -var nomad_data_dir=/opt/nomad/data \
#     zfs-csi-node-raw-exec.nomad.hcl
#
# Client requirements (see README.md):
#   - raw_exec enabled: plugin "raw_exec" { config { enabled = true } }; agent runs as root
#   - the zfs-csi binary at binary_path on every node
#   - nomad_data_dir equal to the client's data_dir. The binary may only write below
#     /opt/nomad/data/client/csi and /var/lib/nomad/client/csi (and /csi, /local/csi); for any
#     other data_dir, rebuild it with ZFS_CSI_EXTRA_DIRS=<data_dir>/client/csi.
#
# Application tasks that use the volumes cannot be raw_exec (Nomad: "no task supports CSI");
# use docker, exec, podman, ... for them. Only the plugin itself can be raw_exec.

variable "binary_path" {
  type        = string
  default     = "/usr/local/bin/zfs-csi"
  description = "Host path of the zfs-csi binary."
}

variable "nomad_data_dir" {
  type        = string
  default     = "/opt/nomad/data"
  description = "The Nomad client's data_dir (no trailing slash), e.g. /opt/nomad/data or /var/lib/nomad."
}

variable "parent_dataset" {
  type        = string
  default     = "tank/nomad"
  description = "Dataset under which every volume is a child dataset (POOL/DATASET, not a whole pool)."
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
  # raw_exec has no filesystem isolation: Nomad sends staging and target paths with this
  # prefix, and the plugin must find them at the same place on the host, so it is the host
  # directory Nomad uses for node plugins: <data_dir>/client/csi/node/<plugin id>. The default
  # /local/csi would be wrong here (apps would get an empty directory, GH-11885).
  stage_publish_base_dir = "${var.nomad_data_dir}/client/csi/node/${var.plugin_id}"

  args = concat(
    [
      # Node service only: no controller, so no volume create, delete or snapshots.
      "--mode", "node",
      "--parent-dataset", var.parent_dataset,
      # Also the value of the org.zfs-csi/node topology segment; volumes pin themselves to it.
      "--node-id", "${node.unique.name}",
      # Must equal csi_plugin.stage_publish_base_dir: the plugin refuses paths outside it.
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

  group "node" {
    restart {
      attempts = 10
      interval = "10m"
      delay    = "15s"
      mode     = "delay"
    }

    task "plugin" {
      driver = "raw_exec"

      config {
        command = var.binary_path
        args    = local.args
      }

      # CSI_ENDPOINT is set by Nomad to the host socket path
      # unix://<data_dir>/client/csi/plugins/<alloc id>/csi.sock (below <data_dir>/client/csi).
      # The plugin runs zfs, zpool, mount and umount from PATH, resolved when it starts.
      env {
        PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
      }

      csi_plugin {
        id   = var.plugin_id
        type = "node"
        # Ignored by raw_exec apart from validation (the socket lives in the host path above).
        mount_dir              = "/csi"
        stage_publish_base_dir = local.stage_publish_base_dir
      }

      resources {
        cpu    = 100
        memory = 128
      }
    }
  }
}
