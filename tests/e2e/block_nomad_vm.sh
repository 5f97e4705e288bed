#!/usr/bin/env bash
# Issue 25 by hand under Nomad, in the OpenZFS VM: a Nomad dev agent on loopback runs the plugin
# (nomad/zfs-csi-raw-exec.nomad.hcl, plus --block-volumes), creates a raw block volume
# (attachment_mode = "block-device") and an ext4 volume (mount_options fs_type = "ext4"), and exec
# jobs write to them and read the data back in a second allocation. Every command is printed with
# its output: the log is the transcript. Ends with "block-nomad: N checks passed, N failed".
#
#   ZFS_CSI_VM_SCRIPT=tests/e2e/block_nomad_vm.sh ZFS_CSI_VM_NOMAD=1 ZFS_CSI_VM_OPENZFS=2.3 \
#     tools/openzfs-vm/openzfs-vm.sh test
#
# Needs root, OpenZFS (zvols), nomad and jq on PATH. Not for zfs-fuse (no zvols).
set -uo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
# shellcheck source=tests/e2e/lib.sh
. "$root/tests/e2e/lib.sh"
passed=0
failed=0
code=0
started_at=$(date +%s)
nomad_version=""

# The transcript: the command, then what it printed.
run() {
  printf '\n$ %s\n' "$*"
  "$@"
}

tmp=$(mktemp -d /tmp/zfs-csi-block-nomad.XXXXXX)
pool="zcsiblk$$"
data_dir="$tmp/nomad"
csi_dir="$data_dir/client/csi"
node_name="vm"
plugin_id="zfs-$node_name"
agent_pid=""
export NOMAD_ADDR="http://127.0.0.1:4646" NOMAD_CLI_SHOW_HINTS=false

cleanup() {
  code=$?
  trap - EXIT INT TERM
  step "cleanup"
  if [ -n "$agent_pid" ] && kill -0 "$agent_pid" 2>/dev/null; then
    for job in $(nomad job status -short 2>/dev/null | awk 'NR > 1 && $1 !~ /^zfs-csi-/ {print $1}'); do
      nomad job stop -purge "$job" >/dev/null 2>&1
    done
    # Only what a failed step left registered.
    for vol in $(nomad volume status -type csi -json 2>/dev/null | jq -r '.[]?.ID'); do
      wait_until 60 nomad volume delete "$vol" || nomad volume deregister -force "$vol" >/dev/null 2>&1
    done
    nomad job stop -purge "zfs-csi-$node_name" >/dev/null 2>&1
    kill -INT "$agent_pid" 2>/dev/null
    for _ in $(seq 1 30); do kill -0 "$agent_pid" 2>/dev/null || break; sleep 1; done
    kill -KILL "$agent_pid" 2>/dev/null
  fi
  for pid in $(pids_of "$tmp/" "$data_dir"); do kill -KILL "$pid" 2>/dev/null; done
  if [ "$failed" -gt 0 ] && [ -f "$tmp/agent.log" ]; then
    say "-- the end of the agent's log"
    tail -n 30 "$tmp/agent.log"
  fi
  finish_run block-nomad "$pool"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

step "setup: pool, plugin wrapper, dev agent"
command -v nomad >/dev/null || abort "nomad on PATH (ZFS_CSI_VM_NOMAD=1)"
command -v jq >/dev/null || abort "jq on PATH"
nomad_version=$(nomad version | head -n 1)
say "nomad: $nomad_version; $(zfs version 2>/dev/null | head -n 1)"
truncate -s 2G "$tmp/pool.img"
run zpool create -m "$tmp/zfs" "$pool" "$tmp/pool.img" || abort "pool created"
run zfs create "$pool/nomad" || abort "parent dataset created"
# main.ts as a block build (ZFS_CSI_BLOCK_VOLUMES=on) runs it: its flags from src/permissions.ts
# for the agent's CSI directory, and --block-volumes added to what the job passes.
mkdir -p "$tmp/bin"
flags=$("$root/tools/deno" run --frozen --quiet "$root/tests/conformance/plugin_flags.ts" \
  "$csi_dir" --block-volumes | tr '\n' ' ') || abort "a block build's permission flags"
cat >"$tmp/bin/zfs-csi" <<EOF
#!/bin/sh
cd '$root' || exit 1
export DENO_DIR='${DENO_DIR:-$HOME/.cache/deno}'
exec '$root/tools/deno' run --quiet --frozen --config deno.json $flags main.ts "\$@" --block-volumes
EOF
chmod +x "$tmp/bin/zfs-csi"
chroot_entries=$(chroot_env_entries sh head sha256sum dd cat ls sleep blockdev df mkdir stat)
cat >"$tmp/agent.hcl" <<EOF
name      = "$node_name"
data_dir  = "$data_dir"
bind_addr = "127.0.0.1"

client {
  options {
    "driver.allowlist"     = "raw_exec,exec"
    "fingerprint.denylist" = "env_aws,env_gce,env_azure,env_digitalocean,consul,vault"
  }
  chroot_env {
$chroot_entries
  }
}

plugin "raw_exec" {
  config {
    enabled = true
  }
}
EOF
nomad agent -dev -config "$tmp/agent.hcl" >"$tmp/agent.log" 2>&1 &
agent_pid=$!
node_ready() {
  nomad node status -self -json 2>/dev/null | jq -e '.Status == "ready"
    and .Drivers.raw_exec.Healthy and .Drivers.exec.Healthy' >/dev/null
}
wait_until 300 node_ready || abort "dev agent ready with raw_exec and exec"
pass "dev agent up, raw_exec and exec healthy"

step "the plugin (monolith, --block-volumes)"
run nomad job run -detach -var "node=$node_name" -var "parent_dataset=$pool/nomad" \
  -var "nomad_data_dir=$data_dir" -var "binary_path=$tmp/bin/zfs-csi" \
  "$root/nomad/zfs-csi-raw-exec.nomad.hcl" || abort "plugin job submitted"
plugin_healthy() {
  nomad plugin status -json "$plugin_id" 2>/dev/null |
    jq -e '.ControllersHealthy == 1 and .NodesHealthy == 1' >/dev/null
}
wait_until 300 plugin_healthy || abort "plugin $plugin_id healthy"
run nomad plugin status "$plugin_id"
pass "plugin $plugin_id healthy"

step "volumes: raw block (block-device) and ext4 (fs_type)"
cat >"$tmp/blk.hcl" <<EOF
id           = "blk"
name         = "blk"
type         = "csi"
plugin_id    = "$plugin_id"
capacity_min = "64MiB"

capability {
  access_mode     = "single-node-writer"
  attachment_mode = "block-device"
}

parameters {
  volblocksize = "16K"
}
EOF
cat >"$tmp/files.hcl" <<EOF
id           = "files"
name         = "files"
type         = "csi"
plugin_id    = "$plugin_id"
capacity_min = "64MiB"

capability {
  access_mode     = "single-node-writer"
  attachment_mode = "file-system"
}

mount_options {
  fs_type = "ext4"
}
EOF
run cat "$tmp/blk.hcl" "$tmp/files.hcl"
check "nomad volume create blk.hcl" run nomad volume create "$tmp/blk.hcl"
check "nomad volume create files.hcl" run nomad volume create "$tmp/files.hcl"
run zfs list -r -t volume -o name,volsize,volblocksize,refreservation,org.zfs-csi:managed "$pool/nomad"
run nomad volume status blk

# job volume attachment access script: a batch exec job (as root: the device belongs to root)
# that runs script with the volume at /data.
job() {
  local id=$1 vol=$2 attach=$3 script=$4
  cat >"$tmp/$id.hcl" <<EOF
job "$id" {
  type        = "batch"
  datacenters = ["*"]
  group "g" {
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
      source          = "$vol"
      access_mode     = "single-node-writer"
      attachment_mode = "$attach"
    }
    task "t" {
      driver = "exec"
      user   = "root"
      config {
        command = "/bin/sh"
        args    = ["-c", "$script"]
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
EOF
}
# run_job id: runs it to completion; prints its status and output; passes when it succeeded.
run_job() {
  local id=$1 alloc
  run cat "$tmp/$id.hcl"
  run nomad job run -detach "$tmp/$id.hcl" >/dev/null
  job_done() {
    nomad job status -json "$1" 2>/dev/null | jq -e '.[0].Allocations // [] | length > 0 and
      all(.ClientStatus == "complete" or .ClientStatus == "failed")' >/dev/null ||
      nomad job allocs -json "$1" 2>/dev/null | jq -e 'length > 0 and
      all(.ClientStatus == "complete" or .ClientStatus == "failed")' >/dev/null
  }
  wait_until 300 job_done "$id"
  alloc=$(nomad job allocs -json "$id" | jq -r '.[0].ID')
  # The whole status: its events say why a task did not start.
  run nomad alloc status "$alloc" | tail -n 25
  run nomad alloc logs "$alloc" t
  run nomad alloc logs -stderr "$alloc" t
  nomad job allocs -json "$id" | jq -e '.[0].ClientStatus == "complete"' >/dev/null
}

step "a job writes 1 MiB onto the raw device, a second job reads it back"
job blk-write blk block-device \
  "head -c 1048576 /dev/urandom > /local/p && dd if=/local/p of=/data bs=1M seek=4 oflag=direct conv=notrunc,fsync && blockdev --getsize64 /data && sha256sum < /local/p"
check "job blk-write completed" run_job blk-write
written=$(nomad alloc logs "$(nomad job allocs -json blk-write | jq -r '.[0].ID')" t 2>/dev/null | tail -n 1 | cut -d' ' -f1)
job blk-read blk block-device "dd if=/data bs=1M skip=4 count=1 iflag=direct | sha256sum"
check "job blk-read completed" run_job blk-read
read_back=$(nomad alloc logs "$(nomad job allocs -json blk-read | jq -r '.[0].ID')" t 2>/dev/null | tail -n 1 | cut -d' ' -f1)
check "the second allocation read what the first wrote ($written)" same "$written" "$read_back"

step "a job writes a file on the ext4 volume, a second job reads it back"
job files-write files file-system \
  "head -c 1048576 /dev/urandom > /data/payload && stat -f -c %T /data && df -h /data && sha256sum < /data/payload"
check "job files-write completed" run_job files-write
written=$(nomad alloc logs "$(nomad job allocs -json files-write | jq -r '.[0].ID')" t 2>/dev/null | tail -n 1 | cut -d' ' -f1)
job files-read files file-system "sha256sum < /data/payload"
check "job files-read completed" run_job files-read
read_back=$(nomad alloc logs "$(nomad job allocs -json files-read | jq -r '.[0].ID')" t 2>/dev/null | tail -n 1 | cut -d' ' -f1)
check "the second allocation read the file the first wrote ($written)" same "$written" "$read_back"
run blkid -p "/dev/zvol/$pool/nomad/files"

step "delete"
for j in blk-write blk-read files-write files-read; do nomad job stop -purge "$j" >/dev/null 2>&1; done
check "nomad volume delete blk" wait_until 120 nomad volume delete blk
check "nomad volume delete files" wait_until 120 nomad volume delete files
run zfs list -r -t volume -o name,org.zfs-csi:deleted-name "$pool/nomad"
