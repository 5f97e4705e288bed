# The plugin on both clients of tests/e2e/nomad_cluster.sh: one system job, one plugin id, a
# monolith on each client, both with the same store. The per-node arguments come from the node:
# --node-id from its name, --parent-dataset from its meta zfs_parent.
#
# One group per client, only because the two clients share one machine: each has its own
# data_dir, and csi_plugin.stage_publish_base_dir (which must be the host path
# <data_dir>/client/csi/monolith/<plugin id> for raw_exec) is taken literally, never
# interpolated (Nomad 1.11.3, client/allocrunner/taskrunner/plugin_supervisor_hook.go). On a real
# cluster every client has the same data_dir and one group does.

variable "plugin_id" {
  type    = string
  default = "zfs-cluster"
}

variable "binary_path" {
  type = string
}

variable "clients" {
  type        = map(string)
  description = "Node name => that client's data_dir."
}

variable "plugin_args" {
  type        = list(string)
  default     = []
  description = "Further flags for every node: the store's, --takeover-after."
}

variable "s3_access_key" {
  type = string
}

variable "s3_secret_key" {
  type = string
}

variable "log_level" {
  type    = string
  default = "debug"
}

job "zfs-csi-cluster" {
  type        = "system"
  datacenters = ["*"]

  dynamic "group" {
    for_each = var.clients
    labels   = ["plugin-${group.key}"]

    content {
      constraint {
        attribute = "${node.unique.name}"
        value     = group.key
      }

      restart {
        attempts = 10
        interval = "10m"
        delay    = "5s"
        mode     = "delay"
      }

      task "plugin" {
        driver = "raw_exec"

        config {
          command = var.binary_path
          args = concat(
            [
              "--mode", "monolith",
              "--node-id", "${node.unique.name}",
              "--parent-dataset", "${meta.zfs_parent}",
              # The deleted and set-aside copies stay, for the checks to find them.
              "--deleted-retention", "7d",
              "--stage-publish-base-dir", "${group.value}/client/csi/monolith/${var.plugin_id}",
              "--log-level", var.log_level,
            ],
            var.plugin_args,
          )
        }

        env {
          PATH                  = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
          AWS_ACCESS_KEY_ID     = var.s3_access_key
          AWS_SECRET_ACCESS_KEY = var.s3_secret_key
        }

        csi_plugin {
          id                     = var.plugin_id
          type                   = "monolith"
          mount_dir              = "/csi"
          stage_publish_base_dir = "${group.value}/client/csi/monolith/${var.plugin_id}"
        }

        resources {
          cpu    = 100
          memory = 256
        }
      }
    }
  }
}
