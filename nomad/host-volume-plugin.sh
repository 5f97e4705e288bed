#!/bin/sh
# zfs-csi as a Nomad dynamic host volume plugin. Install it once per client, in the client's
# host_volume_plugin_dir (default <data_dir>/host_volume_plugins) under the plugin id volumes name
# (plugin_id = "zfs"):
#
#   install -m 0755 host-volume-plugin.sh /opt/nomad/data/host_volume_plugins/zfs
#   install -m 0644 host-volume-zfs-csi.conf /opt/nomad/data/host_volume_plugins/zfs-csi.conf
#
# Nomad runs the plugin with an empty environment (only DHV_* variables, no PATH). The zfs-csi
# binary's baked-in permission (--allow-run=zfs,zpool,mount,umount) names its programs, which
# Deno looks up on PATH when the binary starts; with no PATH at all it refuses to start. This
# script gives it the root-owned system PATH, and hands on the operation and Nomad's variables.
# Flags given after "$@" here would replace zfs-csi.conf (e.g. for a second plugin id on another
# parent dataset: a copy of this script named "zfs-fast" with --parent-dataset fast/nomad).
PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
export PATH
exec /usr/local/bin/zfs-csi "$@"
