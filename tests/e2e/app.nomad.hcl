# The application side of tests/e2e/nomad_e2e.sh: a batch job that mounts one CSI volume at
# /data with the exec driver (raw_exec cannot take CSI volumes), as the user nobody: the test
# hands it the dataset's root directory first, as an operator would for a non-root app.
#
#   mode = "write"  writes 1 MiB of random bytes to /data/payload, prints its checksum, exits
#   mode = "read"   prints the checksum of /data/payload, exits
#   mode = "hold"   writes like "write", then keeps the volume mounted until the job is stopped
#   mode = "look"   lists /data (the first use of a node-only volume creates the dataset), exits

variable "job_id" {
  type = string
}

variable "volume" {
  type = string
}

variable "mode" {
  type = string

  validation {
    condition     = contains(["write", "read", "hold", "look"], var.mode)
    error_message = "The mode must be write, read, hold or look."
  }
}

locals {
  write = "head -c 1048576 /dev/urandom > /data/payload && sha256sum /data/payload"
  script = {
    write = local.write
    read  = "sha256sum /data/payload"
    hold  = "${local.write} && exec sleep 3600"
    look  = "ls -ldn /data"
  }
}

job "app" {
  id          = var.job_id
  name        = var.job_id
  type        = "batch"
  datacenters = ["*"]

  group "app" {
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
      access_mode     = "single-node-writer"
      attachment_mode = "file-system"
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
      }

      resources {
        cpu    = 50
        memory = 32
      }
    }
  }
}
