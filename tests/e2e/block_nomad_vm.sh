#!/usr/bin/env bash
# Issue 25 by hand under Nomad, in the OpenZFS VM: a Nomad dev agent on loopback runs the plugin
# (nomad/zfs-csi-raw-exec.nomad.hcl, -var block_volumes=true), creates a raw block volume
# (attachment_mode = "block-device") and an ext4 volume (mount_options fs_type = "ext4"); jobs
# write to them and read the data back in a second allocation. The ext4 volume is used by exec
# tasks (root writes, nobody reads). The raw device is bound into an exec task and an unprivileged
# docker task too, but their device cgroups refuse to open it, root or not (the transcript shows
# the EPERM); privileged docker tasks (Debian's docker in the VM, ZFS_CSI_VM_DOCKER=1; a local
# image of the VM's own programs, no network) write and read it, and nomad/block-device-job.nomad.hcl
# runs on it; raw_exec is refused a CSI volume. Every command is printed with its output: the log
# is the transcript. Ends with "block-nomad: N checks passed, N failed". About 6 min under TCG.
#
#   ZFS_CSI_VM_SCRIPT=tests/e2e/block_nomad_vm.sh ZFS_CSI_VM_NOMAD=1 ZFS_CSI_VM_DOCKER=1 \
#     ZFS_CSI_VM_OPENZFS=2.3 tools/openzfs-vm/openzfs-vm.sh test
#
# Needs root, OpenZFS (zvols), nomad and jq on PATH, and dockerd for the docker part (without it
# those checks fail, saying so). Not for zfs-fuse (no zvols).
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
docker_pid=""
docker_sock="$tmp/docker.sock"
image="zfs-csi-e2e/tools:local"
export NOMAD_ADDR="http://127.0.0.1:4646" NOMAD_CLI_SHOW_HINTS=false

dk() { docker -H "unix://$docker_sock" "$@"; }

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
  if [ -n "$docker_pid" ] && kill -0 "$docker_pid" 2>/dev/null; then
    dk ps -aq 2>/dev/null | xargs -r docker -H "unix://$docker_sock" rm -f >/dev/null 2>&1
    kill -TERM "$docker_pid" 2>/dev/null
    for _ in $(seq 1 30); do kill -0 "$docker_pid" 2>/dev/null || break; sleep 1; done
    kill -KILL "$docker_pid" 2>/dev/null
  fi
  for pid in $(pids_of "$tmp/" "$data_dir"); do kill -KILL "$pid" 2>/dev/null; done
  if [ "$failed" -gt 0 ] && [ -f "$tmp/agent.log" ]; then
    say "-- the agent's log: errors and warnings"
    grep -E '\[(ERROR|WARN)\]' "$tmp/agent.log" | tail -n 40
    say "-- the end of the agent's log"
    tail -n 30 "$tmp/agent.log"
  fi
  if [ "$failed" -gt 0 ] && [ -f "$tmp/dockerd.log" ]; then
    say "-- dockerd's errors and warnings"
    grep -E 'level=(error|warning|fatal)' "$tmp/dockerd.log" | tail -n 20
  fi
  say "-- the kernel's messages about zvols and filesystems"
  dmesg | grep -E 'zd[0-9]|EXT4-fs|XFS' | tail -n 20
  finish_run block-nomad "$pool"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

step "setup: pool, plugin wrapper, docker, dev agent"
command -v nomad >/dev/null || abort "nomad on PATH (ZFS_CSI_VM_NOMAD=1)"
command -v jq >/dev/null || abort "jq on PATH"
nomad_version=$(nomad version | head -n 1)
say "nomad: $nomad_version; $(zfs version 2>/dev/null | head -n 1); kernel $(uname -r)"
truncate -s 2G "$tmp/pool.img"
run zpool create -m "$tmp/zfs" "$pool" "$tmp/pool.img" || abort "pool created"
run zfs create "$pool/nomad" || abort "parent dataset created"
# main.ts as a block build (ZFS_CSI_BLOCK_VOLUMES=on) runs it: its flags from src/permissions.ts
# for the agent's CSI directory; the job passes --block-volumes (-var block_volumes=true).
mkdir -p "$tmp/bin"
flags=$("$root/tools/deno" run --frozen --quiet "$root/tests/conformance/plugin_flags.ts" \
  "$csi_dir" --block-volumes | tr '\n' ' ') || abort "a block build's permission flags"
cat >"$tmp/bin/zfs-csi" <<EOF
#!/bin/sh
cd '$root' || exit 1
export DENO_DIR='${DENO_DIR:-$HOME/.cache/deno}'
exec '$root/tools/deno' run --quiet --frozen --config deno.json $flags main.ts "\$@"
EOF
chmod +x "$tmp/bin/zfs-csi"
# What the tasks run: the exec driver copies these into each task (chroot_env); the docker
# image holds the same files.
programs=(sh head sha256sum dd cat ls sleep blockdev df mkdir stat chown id)
chroot_entries=$(chroot_env_entries "${programs[@]}") || abort "the tasks' programs found"

# Docker, when the VM has it: a daemon of this run's own (socket, state and containers in $tmp),
# no bridge and no iptables (the VM has no network), cgroupfs (systemd's driver needs D-Bus,
# which the image has not), and one image imported from a tarball of the programs above
# (nothing to pull).
have_docker=""
if command -v dockerd >/dev/null && command -v docker >/dev/null; then
  dockerd --host "unix://$docker_sock" --data-root "$tmp/docker" --exec-root "$tmp/docker-run" \
    --pidfile "$tmp/docker.pid" --bridge none --iptables=false \
    --exec-opt native.cgroupdriver=cgroupfs --storage-driver overlay2 >"$tmp/dockerd.log" 2>&1 &
  docker_pid=$!
  if wait_until 180 dk info; then
    run dk version --format 'docker {{.Server.Version}}, API {{.Server.APIVersion}}'
    mkdir -p "$tmp/rootfs/tmp"
    printf '%s\n' "$chroot_entries" | sed -n 's/^ *"\([^"]*\)" = "\([^"]*\)"$/\1 \2/p' |
      while read -r src dst; do
        mkdir -p "$tmp/rootfs$(dirname "$dst")" && cp -L "$src" "$tmp/rootfs$dst"
      done
    if tar -C "$tmp/rootfs" -cf - . | dk import - "$image" >/dev/null; then
      run dk image ls "$image"
      have_docker=1
      pass "docker daemon up (unix://$docker_sock), image $image imported"
    else
      fail "docker image $image imported"
    fi
  else
    fail "docker daemon up (see its log below)"
    tail -n 20 "$tmp/dockerd.log"
  fi
else
  fail "dockerd in the VM (ZFS_CSI_VM_DOCKER=1): the raw device's docker jobs cannot run"
fi
drivers="raw_exec,exec${have_docker:+,docker}"
cat >"$tmp/agent.hcl" <<EOF
name      = "$node_name"
data_dir  = "$data_dir"
bind_addr = "127.0.0.1"

client {
  options {
    "driver.allowlist"     = "$drivers"
    "fingerprint.denylist" = "env_aws,env_gce,env_azure,env_digitalocean,consul,vault"
    # exec may run tasks as root: the device test must show that even root cannot open it.
    # Nomad refuses root for exec, qemu and java by default (user.denylist "root,Administrator",
    # client/config/config.go; client/allocrunner/taskrunner/validate_hook.go): a task asking
    # for it never starts ("running as user \"root\" is disallowed", "task not started yet").
    "user.denylist" = ""
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
if [ -n "$have_docker" ]; then
  cat >>"$tmp/agent.hcl" <<EOF

# A raw block device needs a privileged container (the device cgroup), see docs/block-volumes.md.
# The image was imported, not pulled: Nomad must not remove it between the jobs.
plugin "docker" {
  config {
    endpoint         = "unix://$docker_sock"
    allow_privileged = true
    gc {
      image = false
    }
  }
}
EOF
fi
run cat "$tmp/agent.hcl"
nomad agent -dev -config "$tmp/agent.hcl" >"$tmp/agent.log" 2>&1 &
agent_pid=$!
node_ready() {
  nomad node status -self -json 2>/dev/null | jq -e --arg docker "$have_docker" '.Status == "ready"
    and .Drivers.raw_exec.Healthy and .Drivers.exec.Healthy
    and ($docker == "" or .Drivers.docker.Healthy)' >/dev/null
}
wait_until 300 node_ready || abort "dev agent ready with the drivers $drivers healthy"
pass "dev agent up, drivers $drivers healthy"

step "the plugin (monolith, --block-volumes)"
run nomad job run -detach -var "node=$node_name" -var "parent_dataset=$pool/nomad" \
  -var "nomad_data_dir=$data_dir" -var "binary_path=$tmp/bin/zfs-csi" -var block_volumes=true \
  "$root/nomad/zfs-csi-raw-exec.nomad.hcl" || abort "plugin job submitted"
plugin_healthy() {
  nomad plugin status -json "$plugin_id" 2>/dev/null |
    jq -e '.ControllersHealthy == 1 and .NodesHealthy == 1' >/dev/null
}
wait_until 300 plugin_healthy || abort "plugin $plugin_id healthy"
run nomad plugin status "$plugin_id"
pass "plugin $plugin_id healthy"

step "volumes: raw block (block-device) and ext4 (fs_type)"
# The raw one is nomad/volume-block.hcl as an operator would edit it (spec_from, lib.sh).
check "nomad/volume-block.hcl -> blk on $plugin_id, 64MiB" spec_from volume-block.hcl blk.hcl \
  's/pg-block/blk/g' "s/zfs-node-a/$plugin_id/" 's/capacity_min = "10GiB"/capacity_min = "64MiB"/'
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

# job id volume attachment driver user script: a batch job, no restarts, whose one task runs
# script with the volume at /data, as user (empty: the driver's default, nobody for exec; root
# for the device: /dev/zdN is root's). The driver is exec or raw_exec, or docker (the local
# image, no network) or docker-privileged (the same, privileged = true). What the script prints
# also goes to /alloc/data/out (writable by any task user), read back with "nomad alloc fs":
# Nomad's docker log streaming lost the output of containers that exit at once under TCG ("log
# streaming ended with error: write .../.t.stdout.fifo: file already closed", first VM run;
# hashicorp/nomad#6931, open).
job() {
  local id=$1 vol=$2 attach=$3 driver=$4 user=$5 script config privileged=false
  script="{ $6; } >/alloc/data/out 2>&1; rc=\$?; cat /alloc/data/out; exit \$rc"
  if [ "$driver" = docker-privileged ]; then privileged=true driver=docker; fi
  if [ "$driver" = docker ]; then
    config="      config {
        image        = \"$image\"
        network_mode = \"none\"
        privileged   = $privileged
        command      = \"/bin/sh\"
        args         = [\"-c\", \"$script\"]
      }"
  else
    config="      config {
        command = \"/bin/sh\"
        args    = [\"-c\", \"$script\"]
      }"
  fi
  if [ -n "$user" ]; then config="      user   = \"$user\"
$config"; fi
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
      driver = "$driver"
$config
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
job_done() {
  nomad job allocs -json "$1" 2>/dev/null | jq -e 'length > 0 and
    all(.ClientStatus == "complete" or .ClientStatus == "failed")' >/dev/null
}
alloc_of() { nomad job allocs -json "$1" 2>/dev/null | jq -r '.[0].ID // empty'; }
# What the job's task printed (its /alloc/data/out); the sha256 the scripts end with.
out_of() { nomad alloc fs "$(alloc_of "$1")" alloc/data/out 2>/dev/null; }
sum_of() { out_of "$1" | grep -E '^[0-9a-f]{64}  -$' | tail -n 1 | cut -d' ' -f1; }
# run_job id: runs it until it ends (complete or failed), prints its status (the task's events
# say why a task did not start) and output, and passes when it completed.
run_job() {
  local id=$1 alloc t0=$SECONDS
  run cat "$tmp/$id.hcl"
  run nomad job run -detach "$tmp/$id.hcl" >/dev/null
  wait_until 300 job_done "$id" || say "($id did not end within 300 s)"
  say "($id: $((SECONDS - t0)) s)"
  alloc=$(alloc_of "$id")
  run nomad alloc status "$alloc" | tail -n 25
  run nomad alloc fs "$alloc" alloc/data/out
  nomad job allocs -json "$id" | jq -e '.[0].ClientStatus == "complete"' >/dev/null
}

step "the raw device in an exec task (root): bound at /data, but the device cgroup refuses open()"
# Nomad gives a CSI volume to the task driver as a bind mount (client/allocrunner/taskrunner/
# volume_hook.go prepareCSIVolumes), never as a device; the exec driver's container allows only
# its own device list (drivers/shared/executor/executor_linux_cgo.go configureIsolation).
job blk-exec blk block-device exec root \
  "stat -c '%F %t:%T %U:%G %a' /data; dd if=/data of=/dev/null bs=4096 count=1 iflag=direct"
run_job blk-exec
check "exec: /data is the zvol's block device" grep -q 'block special file' <<<"$(out_of blk-exec)"
check "exec: opening it fails with EPERM (Operation not permitted), as root" \
  grep -q "dd: failed to open '/data': Operation not permitted" <<<"$(out_of blk-exec)"

step "the raw device in a docker task that is not privileged: bound, but refused as well"
if [ -n "$have_docker" ]; then
  job blk-docker blk block-device docker "" \
    "stat -c '%F %t:%T %U:%G %a' /data; dd if=/data of=/dev/null bs=4096 count=1 iflag=direct"
  run_job blk-docker
  check "docker (not privileged): /data is the zvol's block device" \
    grep -q 'block special file' <<<"$(out_of blk-docker)"
  check "docker (not privileged): opening it fails with EPERM (Operation not permitted), as root" \
    grep -q "dd: failed to open '/data': Operation not permitted" <<<"$(out_of blk-docker)"
else
  fail "the raw device's docker jobs: no docker in the VM (ZFS_CSI_VM_DOCKER=1)"
fi

step "a privileged docker job writes 1 MiB onto the raw device, a second one reads it back"
if [ -n "$have_docker" ]; then
  job blk-write blk block-device docker-privileged "" \
    "head -c 1048576 /dev/urandom > /local/p && dd if=/local/p of=/data bs=1M seek=4 oflag=direct conv=notrunc,fsync && blockdev --getsize64 /data && sha256sum < /local/p"
  check "job blk-write completed" run_job blk-write
  written=$(sum_of blk-write)
  job blk-read blk block-device docker-privileged "" \
    "dd if=/data bs=1M skip=4 count=1 iflag=direct | sha256sum"
  check "job blk-read completed" run_job blk-read
  read_back=$(sum_of blk-read)
  check "the second allocation read what the first wrote ($written)" same "$written" "$read_back"
  on_node=$(dd if="/dev/zvol/$pool/nomad/blk" bs=1M skip=4 count=1 iflag=direct status=none |
    sha256sum | cut -d' ' -f1)
  check "the node reads the same at 4 MiB of the zvol ($on_node)" same "$written" "$on_node"
else
  fail "the raw device's docker jobs: no docker in the VM (ZFS_CSI_VM_DOCKER=1)"
fi

step "nomad/block-device-job.nomad.hcl on the raw volume (docker, privileged)"
if [ -n "$have_docker" ]; then
  example_done() { job_done zfs-csi-block-example; }
  example_complete() {
    nomad job allocs -json zfs-csi-block-example | jq -e '.[0].ClientStatus == "complete"' >/dev/null
  }
  run nomad job run -detach -var volume=blk -var "image=$image" \
    "$root/nomad/block-device-job.nomad.hcl" >/dev/null
  wait_until 300 example_done || say "(the example did not end within 300 s)"
  example=$(alloc_of zfs-csi-block-example)
  run nomad alloc status "$example" | tail -n 12
  run nomad alloc logs "$example" probe
  check "the example job completed (it opened the device: ls, blockdev and dd succeeded)" \
    example_complete
  check "its log shows the 64 MiB device (it sleeps 5 s for Nomad's log streaming)" \
    grep -qx 67108864 <<<"$(nomad alloc logs "$example" probe 2>/dev/null)"
  nomad job stop -purge zfs-csi-block-example >/dev/null 2>&1
else
  fail "nomad/block-device-job.nomad.hcl: no docker in the VM (ZFS_CSI_VM_DOCKER=1)"
fi

step "exec jobs on the ext4 volume: root writes a file and hands the root over, nobody reads it"
# A new filesystem's root directory is root's, mode 755, as a new dataset's is: a task that does
# not run as root needs it handed over once (tests/e2e/app.nomad.hcl says the same of datasets).
job files-write files file-system exec root \
  "head -c 1048576 /dev/urandom > /data/payload && chown 65534:65534 /data && stat -f -c %T /data && df -h /data && ls -ln /data && sha256sum < /data/payload"
check "job files-write (exec, root) completed" run_job files-write
written=$(sum_of files-write)
job files-read files file-system exec "" \
  "id -u 2>/dev/null || true; echo by-nobody > /data/note && ls -ln /data && sha256sum < /data/payload"
check "job files-read (exec, the driver's default user nobody) completed" run_job files-read
read_back=$(sum_of files-read)
check "the second allocation read the file the first wrote ($written)" same "$written" "$read_back"
run blkid -p "/dev/zvol/$pool/nomad/files"

step "raw_exec takes no volume mounts: the allocation fails before the volume is claimed"
job files-rawexec files file-system raw_exec "" "cat /data/payload"
run_job files-rawexec
check "raw_exec: \"no task supports CSI\" (client/allocrunner/csi_hook.go)" \
  grep -q 'no task supports CSI' <<<"$(nomad alloc status "$(alloc_of files-rawexec)" 2>/dev/null)"

step "delete"
for j in blk-exec blk-docker blk-write blk-read files-write files-read files-rawexec; do nomad job stop -purge "$j" >/dev/null 2>&1; done
check "nomad volume delete blk" wait_until 120 nomad volume delete blk
check "nomad volume delete files" wait_until 120 nomad volume delete files
run zfs list -r -t volume -o name,org.zfs-csi:deleted-name "$pool/nomad"
