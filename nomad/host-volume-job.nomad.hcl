# A job on the host volume of host-volume-create.hcl: Nomad places it on the node that holds the
# volume and bind-mounts <host_volumes_dir>/<volume id> (the dataset, mounted by ZFS) at /data.
# No plugin runs alongside: the dataset stays mounted on the host between allocations.
#
#   nomad job run host-volume-job.nomad.hcl
#
# The volume's root directory belongs to root (mode 0755). For a task that does not run as root,
# hand it over once on the host: chown <uid>:<gid> <host_volumes_dir>/<volume id>.

job "app" {
  group "app" {
    volume "data" {
      type            = "host"
      source          = "app-data"
      access_mode     = "single-node-writer"
      attachment_mode = "file-system"
      # A rescheduled allocation returns to the same volume (and so the same node).
      sticky = true
    }

    task "app" {
      driver = "docker"

      config {
        image   = "busybox:1.36"
        command = "sh"
        args    = ["-c", "date >> /data/started && exec sleep 3600"]
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
