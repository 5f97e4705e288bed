# zfs-csi plugin job with the docker driver, for either layout (nomad/README.md, "Which layout"):
#
#   nomad job run -var node=node-a zfs-csi.nomad.hcl  # monolith on node-a, plugin id zfs-node-a
#   nomad job run -var node=node-b zfs-csi.nomad.hcl  # monolith on node-b, plugin id zfs-node-b
#   nomad job run zfs-csi.nomad.hcl                   # node only, on every node, plugin id zfs
#
# Monolith (node set, recommended): node and controller on one socket, on that one node; run it
# once per ZFS node, each run its own job, zfs-csi-<node>. Each node needs a plugin id of its own:
# Nomad sends every controller call (volume create and delete, snapshots, expansion) for a plugin
# id to one controller, the healthy one with the lowest Nomad node id, whichever node holds the
# data, and a ZFS dataset lives on one node. Volumes name it (plugin_id = "zfs-node-a") and Nomad
# runs their jobs only on that node. csi_plugin.id cannot use node attributes (Nomad GH-11116),
# hence the variable.
#
# Node only (node empty): one job, zfs-csi-node, with --mode node on every node, one shared plugin
# id and no controller. Volumes are added with "nomad volume register" (volume-register.hcl) and
# each dataset is created on its node when a job first uses it; no "nomad volume create",
# snapshots or "nomad volume delete".
#
# Pick one layout per node and parent dataset: two plugin processes on one parent dataset do not
# share their locks.
#
# Client requirements (see nomad/README.md):
#   - docker plugin config: allow_privileged = true, volumes { enabled = true }
#   - the parent dataset exists and is mounted on the host at parent_mountpoint
#     (zfs get -H -o value mountpoint tank/nomad), on a shared mount
#     (findmnt -o TARGET,PROPAGATION /tank/nomad shows "shared")
#   - the image has zfs/zpool matching the host's ZFS kernel module (see ../Containerfile)

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
    http://<address>:<port>/metrics, the address being the node's on metrics_host_network (a
    static port: the binary's permission names it), and the job registers the service
    "zfs-csi-metrics" for Prometheus (docs/metrics.md). The image's binary must be built for
    it: ZFS_CSI_METRICS_LISTEN=0.0.0.0:<port> (every address of the container's own network),
    or it refuses to start, naming that variable.
  EOT

  validation {
    condition     = var.metrics_port >= 0 && var.metrics_port <= 65535
    error_message = "The metrics_port must be 0 (off) or a port from 1 to 65535."
  }
}

variable "metrics_host_network" {
  type        = string
  default     = "default"
  description = <<-EOT
    The Nomad host network (client config, host_network blocks) the metrics port is published on;
    the plugin listens inside its container's own network, and Nomad forwards only that host
    address to it, never every interface. "default" is the address Nomad fingerprints for the
    node (client network_interface, else the interface of the default route): make sure it is
    a private one, or define host_network "private" { cidr = "10.0.0.0/8" } (or interface = "lo"
    for loopback only) in the client config and name it here. The endpoint has no
    authentication and shows every namespace's volume names (docs/metrics.md).
  EOT
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
    docs/block-volumes.md). The image must be a block build (docker build --build-arg
    ZFS_CSI_BLOCK_VOLUMES=on, ../Containerfile), or the plugin refuses to start, saying so.
  EOT
}

locals {
  # The layout: also the plugin's --mode and the csi_plugin type.
  mode = var.node != "" ? "monolith" : "node"

  # Literals by the time the job is submitted: variables are resolved by "nomad job run".
  plugin_id = var.plugin_id != "" ? var.plugin_id : (var.node != "" ? "zfs-${var.node}" : "zfs")
  # A monolith has one job per plugin id, so running the job for node-b does not replace node-a's.
  job_id = var.node == "" ? "zfs-csi-node" : (var.plugin_id != "" ? "zfs-csi-${var.plugin_id}" : "zfs-csi-${var.node}")

  # In-task directory of the staging and target paths Nomad sends. The plugin may only write
  # below /csi and /local/csi inside a container (src/permissions.ts), so keep Nomad's default.
  # On the host it is <data_dir>/client/csi/<mode>/<plugin id>.
  stage_publish_base_dir = "/local/csi"

  # A directory store, which the container jobs bind-mount at the same path.
  store_dir = substr(var.store, 0, 7) == "file://" ? substr(var.store, 7, -1) : ""

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
      "--stage-publish-base-dir", local.stage_publish_base_dir,
      "--log-level", var.log_level,
    ],
    flatten([for k, v in var.topology : ["--topology", "${k}=${v}"]]),
    # Off unless metrics_port is set. Every address of the container's own network namespace,
    # as the build's permission names it; Nomad publishes the port on the metrics_host_network
    # address of the node only.
    var.metrics_port > 0 ? ["--metrics-listen", "0.0.0.0:${var.metrics_port}"] : [],
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

  # Node and monolith CSI plugins are meant to run as system jobs (Nomad stops them last when
  # the node drains). A monolith belongs to one node and never moves, and a system job, rather
  # than a service with count = 1, places nothing while that node is down and comes back with
  # it, with no blocked evaluation or rescheduling in between; the system scheduler may also
  # preempt other work to make room for it.
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

  # Place only where the docker driver allows what the task needs, rather than failing at start.
  constraint {
    attribute = "${attr.driver.docker.privileged.enabled}"
    value     = "true"
  }

  constraint {
    attribute = "${attr.driver.docker.volumes.enabled}"
    value     = "true"
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
          static       = network.value
          host_network = var.metrics_host_network
        }
      }
    }

    dynamic "service" {
      for_each = var.metrics_port > 0 ? [1] : []
      content {
        name     = "zfs-csi-metrics"
        provider = var.metrics_service_provider
        port     = "metrics"
        tags     = ["metrics", "prometheus", local.plugin_id]
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
      driver = "docker"

      config {
        image = var.image
        # Explicit, so a plain image without our ENTRYPOINT works too.
        entrypoint = ["/usr/local/bin/zfs-csi"]
        args       = local.args

        # mount(2) and /dev/zfs need CAP_SYS_ADMIN and the host's devices.
        privileged = true

        # The metrics port, when there is one (the container's port equals the static host port).
        ports = var.metrics_port > 0 ? ["metrics"] : []

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
          # Optional: a directory store, read and written at the same path as on the host.
          [for d in compact([local.store_dir]) : {
            type     = "bind"
            source   = d
            target   = d
            readonly = false
          }],
        )

        # No mount for /dev: Nomad already bind-mounts the host's /dev into every CSI plugin
        # task (with /dev/zfs in it), and a second mount at /dev fails with "Duplicate mount
        # point". Nomad likewise adds mount_dir and stage_publish_base_dir (bidirectional).
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
        id                     = local.plugin_id
        type                   = local.mode
        mount_dir              = "/csi" # CSI_ENDPOINT = unix:///csi/csi.sock
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
