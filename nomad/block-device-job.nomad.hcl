# Uses the raw block volume "pg-block" (volume-block.hcl) as a device at /dev/pg-block: prints
# what it is, its size and a checksum of its first 4 KiB, read with O_DIRECT. Replace the command
# with your application (a database on a raw device, a qemu disk, a filesystem of your own).
#
#   nomad job run block-device-job.nomad.hcl
#   nomad alloc logs <alloc id>
#
# The task driver must be able to open a device. Nomad hands a CSI volume to the driver as a
# bind mount of the device node the plugin published, never as a device
# (client/allocrunner/taskrunner/volume_hook.go, prepareCSIVolumes, Nomad 1.11.3):
#   - docker (and podman) bind it into the container; without privileged = true the container's
#     device cgroup refuses to open it (EPERM). The client must allow it:
#       plugin "docker" { config { allow_privileged = true } }
#   - exec (and java) bind it too, but allow only their own list of devices (/dev/null, zero,
#     random, tty, ...: drivers/shared/executor/executor_linux_cgo.go, configureIsolation): open()
#     fails with "Operation not permitted", as root too.
#   - raw_exec and qemu take no volume mounts at all ("does not support CSI").
# An ext4/xfs volume (fs_type) is a mounted filesystem and works with exec as any CSI volume.

variable "volume" {
  type        = string
  default     = "pg-block"
  description = "The Nomad id of a raw block volume (attachment_mode block-device)."
}

variable "image" {
  type        = string
  default     = "busybox:1.37"
  description = "Any image with sh, ls, blockdev, dd and sha256sum."
}

job "zfs-csi-block-example" {
  type        = "batch"
  datacenters = ["*"]

  group "app" {
    volume "disk" {
      type            = "csi"
      source          = var.volume
      access_mode     = "single-node-writer"
      attachment_mode = "block-device"
      # A raw block volume cannot be claimed read-only: a read-only bind of a device node does
      # not stop writes, so the plugin refuses it (use fs_type ext4 or xfs for that).
      read_only = false
    }

    task "probe" {
      driver = "docker"

      config {
        image = var.image
        # The device cgroup: only a privileged container may open the volume's device.
        privileged = true
        # The example needs no network.
        network_mode = "none"
        command      = "sh"
        args = [
          "-c",
          # The sleep: Nomad can lose the output of a container that exits at once
          # (hashicorp/nomad#6931), and then "nomad alloc logs" shows nothing.
          "ls -lL /dev/pg-block && blockdev --getsize64 /dev/pg-block && dd if=/dev/pg-block bs=4096 count=1 iflag=direct status=none | sha256sum && sleep 5",
        ]
      }

      volume_mount {
        volume      = "disk"
        destination = "/dev/pg-block"
      }

      resources {
        cpu    = 50
        memory = 32
      }
    }
  }
}
