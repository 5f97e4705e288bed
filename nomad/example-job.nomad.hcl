# Uses the volume "pg-data" (volume-register.hcl) at /data and writes a file into it.
#
#   nomad job run example-job.nomad.hcl
#   nomad alloc logs <alloc id>
#
# Nomad places the job on the node named in the volume's topology_request. The data survives
# the job: stop it, run it again, and the log shows every earlier line.

job "zfs-csi-example" {
  type        = "service"
  datacenters = ["*"]

  group "app" {
    count = 1

    volume "data" {
      type            = "csi"
      source          = "pg-data"
      access_mode     = "single-node-writer"
      attachment_mode = "file-system"
      read_only       = false
    }

    # A single-node-writer volume can only follow the job to the same node anyway.
    restart {
      attempts = 3
      delay    = "10s"
      mode     = "delay"
    }

    task "writer" {
      # Tasks that use CSI volumes need a driver with filesystem isolation: docker, exec,
      # podman, ... but not raw_exec.
      driver = "docker"

      config {
        image   = "busybox:1.37"
        command = "sh"
        args = [
          "-c",
          "echo \"$(date -u) written by alloc $NOMAD_ALLOC_ID\" >> /data/hello.txt && cat /data/hello.txt && df -h /data && exec sleep 3600",
        ]
      }

      volume_mount {
        volume      = "data"
        destination = "/data"
        read_only   = false
      }

      resources {
        cpu    = 50
        memory = 32
      }
    }
  }
}
