# The application side of tests/e2e/nomad_e2e.sh: a batch job that mounts one CSI volume at
# /data with the exec driver (raw_exec cannot take CSI volumes), as the user nobody: the test
# hands it the dataset's root directory first, as an operator would for a non-root app.
#
#   mode = "write"  writes 1 MiB of random bytes to /data/payload, prints its checksum, exits
#   mode = "read"   prints the checksum of /data/payload, exits
#   mode = "hold"   writes like "write", then keeps the volume mounted until the job is stopped
#   mode = "look"   lists /data (the first use of a node-only volume creates the dataset), exits
#   mode = "share"  prints the checksum of /data/payload, then keeps the volume mounted until
#                   the job is stopped: with count = 2 and access_mode = "multi-node-reader-only",
#                   two allocations on one node read one volume
#   mode = "fill"   writes a small tree of files (1 MiB of random bytes, a subdirectory with two
#                   more files), prints the tree's checksum ("tree <sha256>  -"), exits
#   mode = "tree"   prints the tree's checksum of /data, exits
# The tree's checksum is the sha256 of the sorted "sha256  ./path" lines of every file below
# /data: the test computes the same on the host (nomad_e2e.sh, tree_sum).

variable "job_id" {
  type = string
}

variable "volume" {
  type = string
}

variable "mode" {
  type = string

  validation {
    condition     = contains(["write", "read", "hold", "look", "share", "fill", "tree"], var.mode)
    error_message = "The mode must be write, read, hold, look, share, fill or tree."
  }
}

variable "count" {
  type    = number
  default = 1
}

variable "access_mode" {
  type    = string
  default = "single-node-writer"
}

locals {
  write = "head -c 1048576 /dev/urandom > /data/payload && sha256sum /data/payload"
  tree  = "echo \"tree $(cd /data && find . -type f -exec sha256sum {} + | LC_ALL=C sort -k 2 | sha256sum)\""
  fill = join(" && ", [
    "mkdir /data/dir",
    "head -c 1048576 /dev/urandom > /data/payload",
    "head -c 65536 /dev/urandom > /data/dir/part",
    "echo known > /data/dir/note",
    local.tree,
  ])
  script = {
    write = local.write
    read  = "sha256sum /data/payload"
    hold  = "${local.write} && exec sleep 3600"
    look  = "ls -ldn /data"
    share = "sha256sum /data/payload && exec sleep 3600"
    fill  = local.fill
    tree  = local.tree
  }
  # Nomad requires read_only for the reader-only access modes.
  read_only = contains(["single-node-reader-only", "multi-node-reader-only"], var.access_mode)
}

job "app" {
  id          = var.job_id
  name        = var.job_id
  type        = "batch"
  datacenters = ["*"]

  group "app" {
    count = var.count

    # A failed run is a failed check: no retries that could hide it.
    restart {
      attempts = 0
      mode     = "fail"
    }

    reschedule {
      attempts  = 0
      unlimited = false
    }

    volume "data" {
      type            = "csi"
      source          = var.volume
      access_mode     = var.access_mode
      attachment_mode = "file-system"
      read_only       = local.read_only
    }

    task "app" {
      driver = "exec"
      user   = "nobody"

      config {
        command = "/bin/sh"
        args    = ["-c", local.script[var.mode]]
      }

      volume_mount {
        volume      = "data"
        destination = "/data"
        read_only   = local.read_only
      }

      resources {
        cpu    = 50
        memory = 32
      }
    }
  }
}
