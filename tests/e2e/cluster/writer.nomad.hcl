# The job whose volume follows it (tests/e2e/nomad_cluster.sh): a service job (a drain migrates
# service allocations at once; batch ones only at the drain's deadline) with the exec driver
# (raw_exec cannot take CSI volumes), as the user nobody, holding the volume until stopped.
# Each allocation, once it can write to /data (the test hands the new dataset's root to nobody,
# as an operator would for a non-root app):
#   - prints "before <sha256> <path>" for every file already in /data;
#   - on an empty volume writes 64 MiB of random bytes in 16 files below /data/base; on a
#     volume that has them, writes var.more_bytes more to /data/more/<alloc id>;
#   - prints "after <sha256> <path>" for every file, then "ready", and holds the volume.

variable "volume" {
  type    = string
  default = "follow-data"
}

variable "more_bytes" {
  type    = number
  default = 8388608
}

locals {
  list = "(cd /data && find . -type f -exec sha256sum {} + | sort -k 2) | while read -r sum path; do echo \"$1 $sum $path\"; done"
  script = join("\n", [
    # A real write, not "test -w": on zfs-fuse, access(2) and the write itself may disagree.
    "until mkdir /data/.probe 2>/dev/null; do sleep 1; done",
    "rmdir /data/.probe",
    "list() { ${local.list}; }",
    "echo \"alloc $NOMAD_ALLOC_ID\"",
    "list before",
    "if [ -f /data/base/complete ]; then",
    "  mkdir -p /data/more && head -c ${var.more_bytes} /dev/urandom > /data/more/$NOMAD_ALLOC_ID || exit 1",
    "else",
    "  mkdir -p /data/base || exit 1",
    "  i=0",
    "  while [ $i -lt 16 ]; do head -c 4194304 /dev/urandom > /data/base/part-$i || exit 1; i=$((i + 1)); done",
    "  echo 64MiB > /data/base/complete",
    "fi",
    "list after",
    "echo ready",
    "exec sleep 86400",
  ])
}

job "writer" {
  type        = "service"
  datacenters = ["*"]

  group "writer" {
    count = 1

    volume "data" {
      type            = "csi"
      source          = var.volume
      access_mode     = "single-node-writer"
      attachment_mode = "file-system"
    }

    # A failed start is visible as a failed allocation (e.g. a stage refused while another node
    # holds the volume); the scheduler places a new one every 5 s.
    restart {
      attempts = 0
      mode     = "fail"
    }

    reschedule {
      delay          = "5s"
      delay_function = "constant"
      unlimited      = true
    }

    migrate {
      max_parallel     = 1
      health_check     = "task_states"
      min_healthy_time = "1s"
      healthy_deadline = "10m"
    }

    task "app" {
      driver       = "exec"
      user         = "nobody"
      kill_timeout = "2s"

      config {
        command = "/bin/sh"
        args    = ["-c", local.script]
      }

      env {
        LC_ALL = "C"
      }

      volume_mount {
        volume      = "data"
        destination = "/data"
      }

      resources {
        cpu    = 50
        memory = 64
      }
    }
  }
}
