# zfs-csi as a monolith plugin (node and controller on one socket) on ONE node, run with the
# raw_exec driver: the binary runs directly on the host, as the Nomad agent's user (root), in the
# host's mount namespace. No image, no propagation settings; the host's zfs, zpool, mount and
# umount are used. Run it once per ZFS node; each run gets its own job and its own plugin id:
#
#   nomad job run -var node=node-a -var nomad_data_dir=/opt/nomad/data \
#     zfs-csi-monolith-raw-exec.nomad.hcl                              # plugin id zfs-node-a
#
# Why one plugin id per node: Nomad sends every controller call (volume create and delete,
# snapshots, expansion) for a plugin id to one controller, the healthy one with the lowest Nomad
# node id, whichever node holds the data. A ZFS dataset lives on one node, so each node needs a
# plugin id of its own. Volumes then name it (plugin_id = "zfs-node-a") and Nomad schedules their
# jobs only on that node. csi_plugin.id cannot use node attributes (Nomad GH-11116), hence the
# variable.
#
# Client requirements (see README.md):
#   - raw_exec enabled: plugin "raw_exec" { config { enabled = true } }; agent runs as root
#   - the zfs-csi binary at binary_path on the node
#   - nomad_data_dir equal to the client's data_dir. The binary may only write below
#     /opt/nomad/data/client/csi and /var/lib/nomad/client/csi (and /csi, /local/csi); for any
#     other data_dir, rebuild it with ZFS_CSI_EXTRA_DIRS=<data_dir>/client/csi.
#
# Application tasks that use the volumes cannot be raw_exec (Nomad: "no task supports CSI");
# use docker, exec, podman, ... for them. Only the plugin itself can be raw_exec.
#
# Pick one layout per node and parent dataset: do not also run the node-only job there with the
# same parent dataset (two plugin processes on one parent dataset do not share their locks).

variable "node" {
  type        = string
  description = <<-EOT
    Name of the Nomad node to run on, exactly as "nomad node status" shows it (column Name).
    Also the plugin's node id, so it appears in every volume id (<name>@<node>). At most 63
    letters, digits and "-_.".
  EOT

  validation {
    condition     = var.node != "" && regex_replace(var.node, "^[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$", "") == ""
    error_message = "The node must be a Nomad node name of 1 to 63 letters, digits and \"-_.\", starting and ending with a letter or digit."
  }
}

variable "plugin_id" {
  type        = string
  default     = ""
  description = "Nomad plugin id; empty: zfs-<node>. Volumes name it in plugin_id."
}

variable "deleted_retention" {
  type        = string
  default     = "7d"
  description = <<-EOT
    How long deleted volumes and snapshots are kept, set aside, before they are destroyed:
    0 (destroy at once), or a whole number with s, m, h or d, e.g. 90s, 24h, 7d.
  EOT

  validation {
    condition     = regex_replace(var.deleted_retention, "^(0|[0-9]{1,6}[smhd])$", "") == ""
    error_message = "The deleted_retention must be 0 or a whole number with s, m, h or d, e.g. 24h or 7d."
  }
}

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

variable "topology" {
  type        = map(string)
  default     = {}
  description = <<-EOT
    Extra topology segments of the node, e.g. -var 'topology={zone="eu1"}'. The segment
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
  description = "Datacenters to run the plugin in (the node must be in one of them)."
}

locals {
  # A literal by the time the job is submitted: variables are resolved by "nomad job run".
  plugin_id = var.plugin_id != "" ? var.plugin_id : "zfs-${var.node}"
  # One job per plugin id, so running the job for node-b does not replace node-a's.
  job_id = var.plugin_id != "" ? "zfs-csi-${var.plugin_id}" : "zfs-csi-${var.node}"

  # raw_exec has no filesystem isolation: Nomad sends staging and target paths with this
  # prefix, and the plugin must find them at the same place on the host, so it is the host
  # directory Nomad uses for monolith plugins: <data_dir>/client/csi/monolith/<plugin id>
  # ("node" in the path is for node plugins only). The default /local/csi would be wrong here
  # (apps would get an empty directory, GH-11885).
  stage_publish_base_dir = "${var.nomad_data_dir}/client/csi/monolith/${local.plugin_id}"

  args = concat(
    [
      "--mode", "monolith",
      "--parent-dataset", var.parent_dataset,
      # The node name (the constraint below makes it equal var.node). It is the value of the
      # org.zfs-csi/node topology segment and the suffix of every volume and snapshot id.
      "--node-id", "${node.unique.name}",
      "--deleted-retention", var.deleted_retention,
      # Must equal csi_plugin.stage_publish_base_dir: the plugin refuses paths outside it.
      "--stage-publish-base-dir", local.stage_publish_base_dir,
      "--log-level", var.log_level,
    ],
    flatten([for k, v in var.topology : ["--topology", "${k}=${v}"]]),
  )
}

job "zfs-csi-monolith" {
  id   = local.job_id
  name = local.job_id

  # system rather than service with count = 1: the job belongs to one node and never moves.
  # A system job places nothing while that node is down and comes back with it, with no
  # blocked evaluation or rescheduling in between; the system scheduler may preempt other
  # work to make room for it; and node and monolith CSI plugins are meant to run as system
  # jobs (Nomad stops them last when the node drains).
  type        = "system"
  datacenters = var.datacenters

  constraint {
    attribute = "${node.unique.name}"
    value     = var.node
  }

  constraint {
    attribute = "${attr.kernel.name}"
    value     = "linux"
  }

  group "plugin" {
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
        id   = local.plugin_id
        type = "monolith"
        # Ignored by raw_exec apart from validation (the socket lives in the host path above).
        mount_dir              = "/csi"
        stage_publish_base_dir = local.stage_publish_base_dir
      }

      resources {
        cpu = 100
        # The plugin's RSS is about 100 MiB (README, "Measured"); the rest is room for the
        # controller's zfs listings.
        memory = 192
      }
    }
  }
}
