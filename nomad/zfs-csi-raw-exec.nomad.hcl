# zfs-csi plugin job with the raw_exec driver, for either layout (nomad/README.md, "Which layout"). The
# binary runs directly on the host, as the Nomad agent's user (root), in the host's mount
# namespace: no image, no propagation settings; the host's zfs, zpool, mount and umount are used.
#
#   nomad job run -var node=node-a zfs-csi-raw-exec.nomad.hcl   # monolith: plugin zfs-node-a
#   nomad job run zfs-csi-raw-exec.nomad.hcl                    # node only: plugin zfs
#
# Add -var nomad_data_dir=<the client's data_dir> if it is not /opt/nomad/data.
#
# Monolith (node set, recommended): node and controller on one socket, on that one node; run it
# once per ZFS node, each run its own job (zfs-csi-<node>) and plugin id, since Nomad sends all
# controller calls for a plugin id to one node, whichever holds the data (csi_plugin.id cannot use
# node attributes, Nomad GH-11116). Node only (node empty): one job, zfs-csi-node, --mode node on
# every node, one shared plugin id, no controller; volumes are registered and created at first
# use. Details in zfs-csi.nomad.hcl and nomad/README.md. Pick one layout per node and parent dataset.
#
# Client requirements (see nomad/README.md):
#   - raw_exec enabled: plugin "raw_exec" { config { enabled = true } }; agent runs as root
#   - the zfs-csi binary at binary_path on the node(s)
#   - nomad_data_dir equal to the client's data_dir. The binary may only write below
#     /opt/nomad/data/client/csi and /var/lib/nomad/client/csi (and /csi, /local/csi); for any
#     other data_dir, rebuild it with ZFS_CSI_EXTRA_DIRS=<data_dir>/client/csi.
#
# Application tasks that use the volumes cannot be raw_exec (Nomad: "no task supports CSI");
# use docker, exec, podman, ... for them. Only the plugin itself can be raw_exec.

variable "node" {
  type        = string
  default     = ""
  description = <<-EOT
    Empty: the node-only layout, on every node. Otherwise the monolith layout on this node only:
    the Nomad node name, exactly as "nomad node status" shows it (column Name). It is also the
    plugin's node id, so it appears in every volume id (<name>@<node>). At most 63 letters,
    digits and "-_.".
  EOT

  validation {
    condition     = var.node == "" || regex_replace(var.node, "^[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$", "") == ""
    error_message = "The node must be empty (node-only layout) or a Nomad node name of 1 to 63 letters, digits and \"-_.\", starting and ending with a letter or digit."
  }
}

variable "plugin_id" {
  type        = string
  default     = ""
  description = "Nomad plugin id; volumes name it in plugin_id. Empty: zfs-<node> (monolith) or zfs (node only)."
}

variable "deleted_retention" {
  type        = string
  default     = "7d"
  description = <<-EOT
    Monolith only: how long deleted volumes and snapshots are kept, set aside, before they are
    destroyed: 0 (destroy at once), or a whole number with s, m, h or d, e.g. 90s, 24h, 7d.
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
    Extra topology segments of the node(s), e.g. -var 'topology={zone="eu1"}'. The segment
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
  description = "Datacenters to run the plugin in (for a monolith, the node must be in one of them)."
}

variable "metrics_port" {
  type        = number
  default     = 0
  description = <<-EOT
    0 (default): no metrics endpoint. Otherwise the plugin serves Prometheus metrics at
    http://<metrics_address>:<port>/metrics (a static port: the binary's permission names it).
    The binary must be built for that address and port: ZFS_CSI_METRICS_LISTEN=
    <metrics_address>:<port> deno task compile, or it refuses to start, naming that variable.
  EOT

  validation {
    condition     = var.metrics_port >= 0 && var.metrics_port <= 65535
    error_message = "The metrics_port must be 0 (off) or a port from 1 to 65535."
  }
}

variable "metrics_address" {
  type        = string
  default     = "127.0.0.1"
  description = <<-EOT
    The address the plugin listens on for metrics. raw_exec shares the host's network, where
    0.0.0.0 would be every interface, public ones included, and the endpoint has no
    authentication and shows every namespace's volume names: loopback by default, scraped by a
    collector on the node (Prometheus in agent mode, Grafana Alloy, vmagent) that forwards to
    your Prometheus (docs/metrics.md). For a Prometheus elsewhere, give the node's private
    address (and build the binary for it), and the job registers the service "zfs-csi-metrics"
    at that address; a loopback address registers none.
  EOT

  validation {
    condition     = regex_replace(var.metrics_address, "^([0-9]{1,3}(\\.[0-9]{1,3}){3}|\\[[0-9a-fA-F:.]+\\]|[a-z0-9][-a-z0-9.]*)$", "") == ""
    error_message = "The metrics_address must be an IPv4 address, a bracketed IPv6 address or a host name."
  }
}

variable "metrics_service_provider" {
  type        = string
  default     = "nomad"
  description = "Who registers the metrics service: nomad (Nomad's own service discovery) or consul."
}

variable "store" {
  type        = string
  default     = ""
  description = <<-EOT
    Where backups go (docs/backups.md): file:///absolute/dir or s3://bucket[/prefix]; empty, no
    store. The binary must be built allowed to reach it (ZFS_CSI_EXTRA_DIRS=<dir>, or
    ZFS_CSI_STORE_HOSTS=<host:port>, at "deno task compile"), or it refuses to start, naming the
    variable.
  EOT

  validation {
    condition     = regex_replace(var.store, "^(file:///.+|s3://[a-z0-9][a-z0-9.-]+[a-z0-9](/.*)?)?$", "") == ""
    error_message = "The store must be empty, file:///absolute/dir or s3://bucket[/prefix]."
  }
}

variable "store_endpoint" {
  type        = string
  default     = ""
  description = "S3 only: the endpoint, https://host[:port]; empty, AWS's for the region."
}

variable "store_region" {
  type        = string
  default     = ""
  description = "S3 only: the region; empty, us-east-1."
}

variable "store_path_style" {
  type        = bool
  default     = false
  description = "S3 only: address the bucket as endpoint/bucket (MinIO, Garage, versitygw, IPs)."
}

variable "store_keys_from_variable" {
  type        = bool
  default     = false
  description = <<-EOT
    S3 only: read the keys from the Nomad Variable nomad/jobs/<job id> (the job may read it with
    no policy), items aws_access_key_id and aws_secret_access_key, into the task's environment.
    Put them there first, e.g. nomad var put nomad/jobs/zfs-csi-node-a aws_access_key_id=...
    aws_secret_access_key=... (the job id is zfs-csi-<node>, or zfs-csi-node for node only).
  EOT
}

variable "backup_interval" {
  type        = string
  default     = ""
  description = <<-EOT
    How often volumes that set no backup_interval parameter are backed up: e.g. 15m, 1h30m;
    empty, only volumes that set one.
  EOT
}

variable "block_volumes" {
  type        = bool
  default     = false
  description = <<-EOT
    Also serve zvols: raw block devices and ext4/xfs volumes (--block-volumes, OpenZFS only; see
    docs/block-volumes.md). The binary must be a block build (ZFS_CSI_BLOCK_VOLUMES=on deno task
    compile), or the plugin refuses to start, saying so.
  EOT
}

locals {
  # The layout: also the plugin's --mode and the csi_plugin type.
  mode = var.node != "" ? "monolith" : "node"

  # A loopback metrics address: only a collector on the node can scrape it.
  metrics_loopback = regex_replace(var.metrics_address, "^(127\\.[0-9.]+|localhost|\\[::1\\])$", "") == ""

  # Literals by the time the job is submitted: variables are resolved by "nomad job run".
  plugin_id = var.plugin_id != "" ? var.plugin_id : (var.node != "" ? "zfs-${var.node}" : "zfs")
  # A monolith has one job per plugin id, so running the job for node-b does not replace node-a's.
  job_id = var.node == "" ? "zfs-csi-node" : (var.plugin_id != "" ? "zfs-csi-${var.plugin_id}" : "zfs-csi-${var.node}")

  # raw_exec has no filesystem isolation: Nomad sends staging and target paths with this
  # prefix, and the plugin must find them at the same place on the host, so it is the host
  # directory Nomad uses for the plugin: <data_dir>/client/csi/<node|monolith>/<plugin id>, by
  # the csi_plugin type. The default /local/csi would be wrong here (apps would get an empty
  # directory, GH-11885).
  stage_publish_base_dir = "${var.nomad_data_dir}/client/csi/${local.mode}/${local.plugin_id}"

  args = concat(
    [
      "--mode", local.mode,
      "--parent-dataset", var.parent_dataset,
      # The node name (for a monolith the constraint below makes it equal var.node). It is the
      # value of the org.zfs-csi/node topology segment, which volumes pin themselves to, and the
      # suffix of every volume and snapshot id.
      "--node-id", "${node.unique.name}",
    ],
    # Only a controller deletes volumes and snapshots. A monolith's plugin id belongs to one job on
    # one node, so an id without "@<node>" can only mean this node (docs/volumes.md, "Volume ids and dataset names").
    local.mode == "monolith" ? ["--deleted-retention", var.deleted_retention, "--node-local-plugin-id"] : [],
    [
      # Must equal csi_plugin.stage_publish_base_dir: the plugin refuses paths outside it.
      "--stage-publish-base-dir", local.stage_publish_base_dir,
      "--log-level", var.log_level,
    ],
    flatten([for k, v in var.topology : ["--topology", "${k}=${v}"]]),
    # Off unless metrics_port is set; on metrics_address only (loopback by default), as the
    # build's permission names it.
    var.metrics_port > 0 ? ["--metrics-listen", "${var.metrics_address}:${var.metrics_port}"] : [],
    # The store, when there is one; its keys come through the environment (template below).
    var.store != "" ? ["--store", var.store] : [],
    var.store_endpoint != "" ? ["--store-endpoint", var.store_endpoint] : [],
    var.store_region != "" ? ["--store-region", var.store_region] : [],
    var.store_path_style ? ["--store-path-style"] : [],
    var.backup_interval != "" ? ["--backup-interval", var.backup_interval] : [],
    var.block_volumes ? ["--block-volumes"] : [],
  )
}

job "zfs-csi" {
  id   = local.job_id
  name = local.job_id

  # A system job in both layouts; see zfs-csi.nomad.hcl for why a monolith is one too.
  type        = "system"
  datacenters = var.datacenters

  # Monolith only: run on that node.
  dynamic "constraint" {
    for_each = var.node != "" ? [var.node] : []
    content {
      attribute = "${node.unique.name}"
      value     = constraint.value
    }
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

    # Metrics (metrics_port > 0): a static port, since the binary may listen on that one only,
    # and a service Prometheus finds with nomad_sd_configs (or consul_sd_configs) by its tag.
    dynamic "network" {
      for_each = var.metrics_port > 0 ? [var.metrics_port] : []
      content {
        port "metrics" {
          static = network.value
        }
      }
    }

    # Registered only for an address another machine can reach: a loopback endpoint is scraped
    # by a collector on the node.
    dynamic "service" {
      for_each = var.metrics_port > 0 && !local.metrics_loopback ? [1] : []
      content {
        name     = "zfs-csi-metrics"
        provider = var.metrics_service_provider
        port     = "metrics"
        # The address it listens on, unless that is every address (then the node's).
        address = var.metrics_address == "0.0.0.0" ? null : var.metrics_address
        tags    = ["metrics", "prometheus", local.plugin_id]
        meta {
          metrics_path = "/metrics"
          plugin_id    = local.plugin_id
        }

        # A scrape answers from a cache a few seconds old: checking it costs no extra zfs work.
        check {
          type     = "http"
          path     = "/metrics"
          interval = "30s"
          timeout  = "5s"
        }
      }
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

      # S3 keys from the job's own Nomad Variable, never in the job: secrets/ holds the file, and
      # the plugin reads AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY once, at start.
      dynamic "template" {
        for_each = var.store_keys_from_variable ? [1] : []
        content {
          destination = "secrets/store.env"
          env         = true
          change_mode = "restart"
          data        = <<-EOT
            {{ with nomadVar "nomad/jobs/${local.job_id}" -}}
            AWS_ACCESS_KEY_ID={{ .aws_access_key_id }}
            AWS_SECRET_ACCESS_KEY={{ .aws_secret_access_key }}
            {{- end }}
          EOT
        }
      }

      csi_plugin {
        id   = local.plugin_id
        type = local.mode
        # Ignored by raw_exec apart from validation (the socket lives in the host path above).
        mount_dir              = "/csi"
        stage_publish_base_dir = local.stage_publish_base_dir
      }

      resources {
        cpu = 100
        # The plugin's RSS is about 100 MiB (docs/benchmarks.md, "Memory soak"); a monolith gets room for the
        # controller's zfs listings.
        memory = local.mode == "monolith" ? 192 : 128
      }
    }
  }
}
