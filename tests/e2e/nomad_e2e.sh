#!/usr/bin/env bash
# End-to-end proof under a real Nomad agent: the plugin runs as a Nomad job from the files in
# nomad/, and Nomad itself creates, registers, mounts, snapshots, grows and deletes volumes on a
# throw-away zfs pool, retries a create, is refused a volume name that another namespace
# already uses, and puts a snapshot in the plugin's store (a directory), deletes the volume and
# restores it from the store with the same bytes. Every check prints one line; the last line is
#   nomad-e2e: N checks passed, N failed (Nomad vX.Y.Z)
# and the exit code is non-zero if any check failed.
#
#   tests/e2e/nomad_e2e.sh          # as root; builds Nomad once per machine (tests/e2e/nomad_install.sh)
#   ZFS_CSI_NOMAD_VERSION=1.10.5 tests/e2e/nomad_e2e.sh   # the same under Nomad 1.10.5
#
# What runs where (raw_exec and exec need nothing but Nomad; why not docker or podman on our CI
# machines: docs/testing.md, "What these machines cannot run"):
#   - a Nomad dev agent on 127.0.0.1, free non-default ports, data_dir in a temporary directory;
#   - the plugin with nomad/zfs-csi-raw-exec.nomad.hcl, as a monolith (plugin id zfs-e2e, with
#     -var store=file://<temp dir>/store) and as the node-only layout (plugin id zfs, on a second
#     parent dataset, no store, S3 keys from its Nomad Variable); the job's
#     binary_path is a small wrapper that runs main.ts with the production permission flags
#     (src/permissions.ts) scoped to the agent's <data_dir>/client/csi, plus the store directory
#     given as a production build gets it (ZFS_CSI_EXTRA_DIRS, read by src/permissions.ts),
#     since "deno compile" cannot run here;
#   - the application job (tests/e2e/app.nomad.hcl) with the exec driver.
# Environment: ZFS_CSI_NOMAD_VERSION (default 1.11.3, the newest the Go module proxy serves; also
# 1.10.5, whose client overlaps node calls for one volume), ZFS_CSI_CACHE (Nomad build cache,
# default /var/cache/zfs-csi), E2E_KEEP=1 keeps the temporary directory's logs and the store
# (the pool is destroyed either way), E2E_PLUGIN_ROOT=<dir> runs the plugin (its main.ts and, for
# the flags that main.ts knows, its nomad/zfs-csi-raw-exec.nomad.hcl) from another checkout of
# zfs-csi (e.g. `git archive <commit> | tar -x -C <dir>`) to show that a check fails without a
# fix; a checkout whose plugin has no --store runs without the store and its checks.
set -uo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
here="$root/tests/e2e"
plugin_root="$(cd "${E2E_PLUGIN_ROOT:-$root}" && pwd)"
started_at=$(date +%s)
passed=0
failed=0

# say, step, pass, fail, check, same, wait_until, port_free, plugin_wrapper, chroot_env_entries,
# pids_of, spec_from: shared with tests/e2e/nomad_cluster.sh and block_nomad_vm.sh.
# shellcheck source=tests/e2e/lib.sh
. "$here/lib.sh"

# A failure that makes the rest meaningless: count it, clean up, stop.
# How many times the job whose two allocations share one volume is stopped and run again.
shared_restarts=${E2E_SHARED_RESTARTS:-10}

if [ "$(id -u)" != 0 ]; then
  say "nomad-e2e: needs root (zpool create, mounts, the Nomad client)" >&2
  exit 1
fi

# ---------------------------------------------------------------------------------------------
step "setup"

"$root/tools/zfs-env.sh" ensure || abort "zfs answers (tools/zfs-env.sh ensure)"
nomad_bin=$("$here/nomad_install.sh") || abort "Nomad built or found in the cache"
nomad_version=$("$nomad_bin" version | head -1)
say "nomad: $nomad_bin ($nomad_version)"
[ "$plugin_root" = "$root" ] ||
  say "plugin: main.ts and nomad/zfs-csi-raw-exec.nomad.hcl of $plugin_root (E2E_PLUGIN_ROOT)"

tmp=$(mktemp -d /tmp/zfs-csi-e2e.XXXXXX)
pool="zcsie2e$$"
data_dir="$tmp/nomad"
csi_dir="$data_dir/client/csi"
node_name="e2e"
monolith_plugin="zfs-$node_name"
agent_pid=""

nomad() { "$nomad_bin" "$@"; }

# Processes whose command line names our temporary directory (the plugins and Nomad's
# executors) or that hold a file open in the agent's data directory (Nomad's logmon, which
# outlives a dev agent). Not the pool image: zfs-fuse's daemon holds that one.
our_pids() { pids_of "$tmp/" "$data_dir"; }

cleanup() {
  local code=$?
  trap - EXIT INT TERM
  step "cleanup"
  if [ -n "$agent_pid" ] && kill -0 "$agent_pid" 2>/dev/null; then
    # Jobs first, so the plugins unmount what they mounted; then the agent (a dev agent also
    # destroys what is left when it stops). Application jobs may run in other namespaces.
    local namespaces ns job vol
    namespaces=$(nomad namespace list -json 2>/dev/null | jq -r '.[].Name')
    for ns in $namespaces; do
      for job in $(NOMAD_NAMESPACE=$ns nomad job status -short 2>/dev/null |
        awk 'NR > 1 && $1 !~ /^zfs-csi-/ {print $1}'); do
        NOMAD_NAMESPACE=$ns nomad job stop -purge "$job" >/dev/null 2>&1
      done
    done
    # Volumes a failed check left (a passing run leaves none), while the plugins still run:
    # deleted (retried while their claims go), else deregistered.
    for ns in $namespaces; do
      for vol in $(NOMAD_NAMESPACE=$ns nomad volume status -type csi -json 2>/dev/null |
        jq -r '.[]?.ID'); do
        say "  volume $vol (namespace $ns) was left: nomad volume delete"
        NOMAD_NAMESPACE=$ns wait_until 30 nomad volume delete "$vol" ||
          NOMAD_NAMESPACE=$ns nomad volume deregister -force "$vol" >/dev/null 2>&1
      done
    done
    for job in $(nomad job status -short 2>/dev/null | awk 'NR > 1 {print $1}'); do
      nomad job stop -purge "$job" >/dev/null 2>&1
    done
    kill -INT "$agent_pid" 2>/dev/null
    for _ in $(seq 1 30); do kill -0 "$agent_pid" 2>/dev/null || break; sleep 1; done
    kill -KILL "$agent_pid" 2>/dev/null
  fi
  for pid in $(our_pids); do kill -KILL "$pid" 2>/dev/null; done
  # The store directory (store_dir, below $tmp) goes with it.
  finish_run nomad-e2e "$pool"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# -- the pool: parent datasets for the monolith and for the node-only layout
truncate -s 1G "$tmp/pool.img"
zpool create -m "$tmp/zfs" "$pool" "$tmp/pool.img" || abort "pool $pool created"
zfs create "$pool/nomad" && zfs create "$pool/nodeonly" || abort "parent datasets created"
say "pool: $pool on $tmp/pool.img, parents $pool/nomad (monolith) and $pool/nodeonly (node only)"

# -- the plugin "binary" for raw_exec: main.ts under the pinned Deno, with the production
# permission flags scoped to this agent's CSI directory, and the store's directory granted as a
# production build grants it: ZFS_CSI_EXTRA_DIRS, read by src/permissions.ts.
mkdir -p "$tmp/bin"
# write_wrapper extra-dirs: (re)writes the wrapper; extra-dirs is ZFS_CSI_EXTRA_DIRS ("" for none).
write_wrapper() { plugin_wrapper "$tmp/bin/zfs-csi" "$plugin_root" "$csi_dir" "$1" ""; }
write_wrapper "" || abort "permission flags read from src/permissions.ts"
check "plugin wrapper runs main.ts (--version)" "$tmp/bin/zfs-csi" --version

# -- the store: a directory (file://), as on an NFS mount or a second disk. The plugin never
# creates its root. A plugin without --store (an older E2E_PLUGIN_ROOT) runs without it.
store_dir="$tmp/store"
store_on=""
# The whole help first: grep -q stops reading at the match, and under pipefail the plugin's
# SIGPIPE from writing the rest would count as "not listed".
plugin_help=$("$tmp/bin/zfs-csi" --help 2>&1)
if grep -qE '^ *--store URL' <<<"$plugin_help"; then
  store_on=1
  mkdir -m 0700 "$store_dir" || abort "store directory $store_dir created"
  write_wrapper "$store_dir" || abort "permission flags with ZFS_CSI_EXTRA_DIRS=$store_dir"
  check "the wrapper grants the store directory as ZFS_CSI_EXTRA_DIRS=$store_dir would" \
    grep -qF -- "--allow-write=$csi_dir,$store_dir " "$tmp/bin/zfs-csi"
elif [ "$plugin_root" = "$root" ]; then
  fail "the plugin's --help lists --store"
else
  say "plugin: no --store in its --help: the store's checks are left out"
fi

# -- the agent: loopback, free ports outside Nomad's dynamic range (20000-32000)
for _ in $(seq 1 50); do
  base=$((34000 + (RANDOM % 2000) * 3))
  if port_free "$base" && port_free $((base + 1)) && port_free $((base + 2)); then break; fi
done
export NOMAD_ADDR="http://127.0.0.1:$base"
# Nomad 1.11's CLI prints a web UI link after most commands; not in this test's output.
export NOMAD_CLI_SHOW_HINTS=false
port_free 4646 || say "note: port 4646 is in use by something else; this agent uses $base-$((base + 2))"

# The exec driver copies chroot_env into every task: only what tests/e2e/app.nomad.hcl runs.
# The job runs as nobody (Nomad's default for exec; a task running as "root" gets every
# capability the kernel knows, and this machine's bounding set lacks CAP_SYS_RESOURCE, so it
# fails with "unable to apply caps"): the user must resolve inside the task (/etc/passwd).
chroot_entries=$(chroot_env_entries sh head sha256sum sleep cat ls mkdir find sort)

cat >"$tmp/agent.hcl" <<EOF
name      = "$node_name"
data_dir  = "$data_dir"
bind_addr = "127.0.0.1"

ports {
  http = $base
  rpc  = $((base + 1))
  serf = $((base + 2))
}

client {
  options {
    "driver.allowlist"     = "raw_exec,exec"
    # Cloud and Consul/Vault fingerprints only slow the start (and env_aws fails with
    # AWS_CA_BUNDLE set).
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
env -u AWS_CA_BUNDLE "$nomad_bin" agent -dev -config "$tmp/agent.hcl" >"$tmp/agent.log" 2>&1 &
agent_pid=$!

node_ready() {
  nomad node status -self -json 2>/dev/null | jq -e '.Status == "ready"
    and .Drivers.raw_exec.Healthy and .Drivers.exec.Healthy' >/dev/null
}
if ! wait_until 120 node_ready; then
  # The log goes with the temporary directory: show why here (once in CI the agent did not come
  # up in 60 s, and the next run passed; it now has 120 s).
  say "the agent's node, then the end of its log:"
  nomad node status -self -json 2>&1 |
    jq -c '{Status, Drivers: (.Drivers // {} | map_values(.HealthDescription))}' 2>&1 | sed 's/^/  /'
  tail -n 40 "$tmp/agent.log" | sed 's/^/  /'
  abort "dev agent up on $NOMAD_ADDR with raw_exec and exec healthy"
fi
pass "dev agent up on $NOMAD_ADDR, node \"$node_name\", raw_exec and exec drivers healthy"

# ---------------------------------------------------------------------------------------------
step "plugin jobs from nomad/zfs-csi-raw-exec.nomad.hcl"

# job_json_has file [--arg name value] jq-filter [-var ...]: what "nomad job run -output" makes of
# the job file with those variables passes the jq filter (nothing is submitted).
job_json_has() {
  local f=$1 jqargs=()
  shift
  if [ "$1" = --arg ]; then
    jqargs=(--arg "$2" "$3")
    shift 3
  fi
  local filter=$1
  shift
  nomad job run -output "$@" "$f" 2>/dev/null | jq -e "${jqargs[@]}" "$filter" >/dev/null
}
not() { ! "$@" >/dev/null 2>&1; }
# plugin_env_has pattern VAR=value: the plugin process whose command line has the pattern has
# exactly that line in its environment.
plugin_env_has() {
  local pid
  pid=$(pgrep -f -- "$1" | head -n 1)
  [ -n "$pid" ] && tr '\0' '\n' <"/proc/$pid/environ" | grep -qxF -- "$2"
}

# The job file that goes with the plugin's main.ts: its flags are the ones that main.ts knows.
plugin_job="$plugin_root/nomad/zfs-csi-raw-exec.nomad.hcl"
plugin_vars=(-var "nomad_data_dir=$data_dir" -var "binary_path=$tmp/bin/zfs-csi" -var log_level=debug)
# The monolith gets the store through the job's store variable. A plugin job file without that
# variable (an older E2E_PLUGIN_ROOT) gets the flag added to its args, as an operator would.
monolith_job="$plugin_job"
monolith_vars=()
if [ -n "$store_on" ] && grep -q '^variable "store"' "$plugin_job"; then
  monolith_vars=(-var "store=file://$store_dir")
  check "the job's store variable puts --store file://$store_dir in its args" \
    job_json_has "$plugin_job" --arg d "file://$store_dir" \
    '.Job.TaskGroups[0].Tasks[0].Config.args | index("--store") as $i | .[$i + 1] == $d' \
    -var "node=$node_name" "${monolith_vars[@]}" "${plugin_vars[@]}"
elif [ -n "$store_on" ]; then
  monolith_job="$tmp/zfs-csi-raw-exec-store.nomad.hcl"
  sed 's|^\( *\)"--log-level", var.log_level,$|&\n\1"--store", "file://'"$store_dir"'",|' \
    "$plugin_job" >"$monolith_job"
  check "the monolith's job passes --store file://$store_dir (added to its args)" \
    grep -qF "\"--store\", \"file://$store_dir\"," "$monolith_job"
fi
nomad job run -detach -var "node=$node_name" -var "parent_dataset=$pool/nomad" "${plugin_vars[@]}" \
  "${monolith_vars[@]}" "$monolith_job" >/dev/null || abort "monolith plugin job submitted"
# The node-only job takes S3 keys from its own Nomad Variable, as an operator gives them to a
# plugin with an S3 store (store_keys_from_variable); it has no store, so the keys only have to
# reach its environment, checked below.
nodeonly_vars=()
if grep -q '^variable "store_keys_from_variable"' "$plugin_job"; then
  nomad var put -force nomad/jobs/zfs-csi-node aws_access_key_id=E2EKEYID \
    aws_secret_access_key=e2e-secret-never-used >/dev/null || abort "nomad var put of the keys"
  nodeonly_vars=(-var store_keys_from_variable=true)
fi
nomad job run -detach -var "parent_dataset=$pool/nodeonly" "${plugin_vars[@]}" \
  "${nodeonly_vars[@]}" "$plugin_job" >/dev/null || abort "node-only plugin job submitted"

# plugin_healthy id controllers nodes
plugin_healthy() {
  nomad plugin status -json "$1" 2>/dev/null |
    jq -e --argjson c "$2" --argjson n "$3" '.ControllersHealthy == $c and .NodesHealthy == $n' >/dev/null
}
wait_until 120 plugin_healthy "$monolith_plugin" 1 1 ||
  abort "monolith plugin $monolith_plugin healthy (nomad alloc logs -stderr in $tmp)"
pass "plugin $monolith_plugin (job zfs-csi-$node_name, monolith): Controllers Healthy 1, Nodes Healthy 1"
wait_until 120 plugin_healthy zfs 0 1 || abort "node-only plugin zfs healthy"
pass "plugin zfs (job zfs-csi-node, node only): Nodes Healthy 1, no controller"
if [ ${#nodeonly_vars[@]} -gt 0 ]; then
  check "the keys in the Nomad Variable nomad/jobs/zfs-csi-node reach the plugin's environment" \
    plugin_env_has "--parent-dataset $pool/nodeonly" AWS_ACCESS_KEY_ID=E2EKEYID
fi

# The container jobs cannot run here (docs/testing.md, "What these machines cannot run"); what Nomad
# makes of their store variables can be read without running them.
for job in zfs-csi.nomad.hcl zfs-csi-podman.nomad.hcl; do
  f="$plugin_root/nomad/$job"
  grep -q '^variable "store"' "$f" || continue
  check "$job with a directory store: --store in its args, the directory mounted read-write" \
    job_json_has "$f" '.Job.TaskGroups[0].Tasks[0] |
      (.Config.args | index("--store")) as $i | .Config.args[$i + 1] == "file:///srv/backups" and
      ([(.Config.mount // [])[] | select(.source == "/srv/backups" and .readonly == false)] +
       [(.Config.volumes // [])[] | select(. == "/srv/backups:/srv/backups:rw")] | length == 1)' \
    -var node=n1 -var store=file:///srv/backups
  check "$job with an S3 store: its flags, keys from nomad/jobs/zfs-csi-n1, no directory mounted" \
    job_json_has "$f" '.Job.TaskGroups[0].Tasks[0] |
      (.Config.args | join(" ") |
        contains("--store s3://backups/nomad --store-endpoint https://s3.lan:9000 --store-path-style")) and
      (.Templates[0].EmbeddedTmpl | contains("nomadVar \"nomad/jobs/zfs-csi-n1\"")) and
      .Templates[0].Envvars and ((.Config.mount // .Config.volumes) | length == 1)' \
    -var node=n1 -var store=s3://backups/nomad -var store_endpoint=https://s3.lan:9000 \
    -var store_path_style=true -var store_keys_from_variable=true
  check "$job refuses a relative directory store" \
    not nomad job run -output -var node=n1 -var store=file://backups "$f"
done

# ---------------------------------------------------------------------------------------------
step "volume specs from nomad/, edited as an operator would (node name, sizes)"

# spec_from (lib.sh): a file of nomad/ in $tmp with an operator's edits, each of which must
# change something.
check "volume-create.hcl -> pg-data on $monolith_plugin, 64MiB" spec_from volume-create.hcl create.hcl \
  "s/zfs-node-a/$monolith_plugin/" 's/capacity_min = "10GiB"/capacity_min = "64MiB"/' \
  's/capacity_max = "50GiB"/capacity_max = "1GiB"/' \
  's/compression = "lz4"/compression = "on"/' # zfs-fuse (pool v23) has no lz4
check "the same, grown to 96MiB" spec_from volume-create.hcl grow.hcl \
  "s/zfs-node-a/$monolith_plugin/" 's/capacity_min = "10GiB"/capacity_min = "96MiB"/' \
  's/capacity_max = "50GiB"/capacity_max = "1GiB"/' 's/compression = "lz4"/compression = "on"/'
check "volume-register.hcl -> reg-data on plugin zfs, node $node_name, 32MiB" \
  spec_from volume-register.hcl register.hcl 's/pg-data/reg-data/g' "s/node-1/$node_name/g" \
  's/size = "10GiB"/size = "32MiB"/'
check "volume-from-snapshot.hcl -> pg-data-restore from pg-data@snap1" \
  spec_from volume-from-snapshot.hcl restore.hcl "s/zfs-node-a/$monolith_plugin/" \
  "s/node-a/$node_name/g" 's/nightly/snap1/g' 's/capacity_min = "10GiB"/capacity_min = "64MiB"/'

zexists() { zfs list -H -o name "$1" >/dev/null 2>&1; }
zgone() { ! zexists "$1"; }
zget() { zfs get -Hp -o value "$1" "$2" 2>/dev/null; }
# Mounts the plugins made for Nomad (staging and per-alloc targets), as "path" lines.
csi_mounts() { findmnt -rn -o TARGET | grep -F "$csi_dir/" || true; }
no_csi_mounts() { [ -z "$(csi_mounts)" ]; }
# parent_state: every dataset and snapshot in the pool with the properties that matter.
pool_state() {
  zfs get -Hp -r -o name,property,value \
    type,refquota,quota,mountpoint,mounted,origin,org.zfs-csi:managed "$pool"
}

# ---------------------------------------------------------------------------------------------
step "nomad volume create (monolith) and nomad volume register (node only)"

out=$(nomad volume create "$tmp/create.hcl" 2>&1)
say "  $out"
check "nomad volume create: Nomad records External ID pg-data@$node_name" \
  grep -q "Created external volume pg-data@$node_name with ID pg-data" <<<"$out"
check "dataset $pool/nomad/pg-data exists with refquota 64MiB and the managed marker" \
  test "$(zget refquota "$pool/nomad/pg-data"):$(zget org.zfs-csi:managed "$pool/nomad/pg-data")" = "67108864:yes"
check "its parameters were applied (compression=on, recordsize=16K, quota=capacity)" \
  test "$(zget compression "$pool/nomad/pg-data") $(zget recordsize "$pool/nomad/pg-data") $(zget quota "$pool/nomad/pg-data")" = "on 16384 67108864"

out=$(nomad volume register "$tmp/register.hcl" 2>&1)
check "nomad volume register reg-data (plugin zfs)" test $? -eq 0
vol_ok() { nomad volume status -json "$1" 2>/dev/null | jq -e '.Schedulable == true' >/dev/null; }
check "nomad volume status: both volumes schedulable" eval 'vol_ok pg-data && vol_ok reg-data'
check "node only: no dataset yet for reg-data (made at first use)" \
  zgone "$pool/nodeonly/reg-data"

# ---------------------------------------------------------------------------------------------
# run_app job volume mode: runs tests/e2e/app.nomad.hcl and waits until its alloc is done.
run_app() {
  nomad job run -detach -var "job_id=$1" -var "volume=$2" -var "mode=$3" "$here/app.nomad.hcl" >/dev/null
}
alloc_of() { nomad job allocs -json "$1" 2>/dev/null | jq -r '.[0].ID // empty'; }
alloc_status() { nomad alloc status -json "$(alloc_of "$1")" 2>/dev/null | jq -r .ClientStatus; }
alloc_is() { [ "$(alloc_status "$1")" = "$2" ]; }
# The checksum the job printed ("<sha256>  /data/payload").
job_sum() { nomad alloc logs "$(alloc_of "$1")" app 2>/dev/null | awk '/\/data\/payload$/ {print $1}'; }
host_sum() { sha256sum "$1" 2>/dev/null | awk '{print $1}'; }
job_done() {
  local job=$1
  if ! wait_until 180 eval "alloc_is $job complete || alloc_is $job failed"; then return 1; fi
  alloc_is "$job" complete || {
    nomad alloc status "$(alloc_of "$job")" | tail -8
    nomad alloc logs -stderr "$(alloc_of "$job")" app 2>&1 | tail -5
    return 1
  }
}

declare -A written # volume -> sha256 of the payload a job wrote

# write_read volume dataset mountpoint: a job writes, the mounts go, a new job reads the same bytes.
write_read() {
  local vol=$1 ds=$2 mp=$3 sum
  if zgone "$ds"; then
    # Node only: the first job that uses the volume makes the dataset.
    run_app "$vol-first" "$vol" look || return 1
    check "$vol: a first job (exec driver) mounted the volume and finished" job_done "$vol-first"
    say "  job saw: $(nomad alloc logs "$(alloc_of "$vol-first")" app 2>/dev/null)"
    check "$vol: the plugin made dataset $ds at first use" zexists "$ds"
    check "$vol: no staging or target mount is left on the host" wait_until 60 no_csi_mounts
    nomad job stop -purge "$vol-first" >/dev/null 2>&1
  fi
  # As for any job that runs as a non-root user: hand it the new dataset's root directory.
  chown 65534:65534 "$mp" || return 1
  run_app "$vol-write" "$vol" write || return 1
  check "$vol: a job (exec driver) wrote /data/payload and finished" job_done "$vol-write"
  sum=$(job_sum "$vol-write")
  written[$vol]=$sum
  say "  job printed sha256 ${sum:-<none>}"
  check "$vol: the bytes are in dataset $ds on the host (same sha256)" \
    same "$sum" "$(host_sum "$mp/payload")"
  check "$vol: the job is done and no staging or target mount is left on the host" \
    wait_until 60 no_csi_mounts
  nomad job stop -purge "$vol-write" >/dev/null 2>&1
  run_app "$vol-read" "$vol" read || return 1
  check "$vol: a second job mounted the volume again and finished" job_done "$vol-read"
  check "$vol: it read the same bytes (sha256 $sum)" same "$sum" "$(job_sum "$vol-read")"
  check "$vol: no staging or target mount is left after the second job" wait_until 60 no_csi_mounts
  nomad job stop -purge "$vol-read" >/dev/null 2>&1
}

step "a job writes, stops, and a new job reads the same bytes (monolith volume pg-data)"
write_read pg-data "$pool/nomad/pg-data" "$tmp/zfs/nomad/pg-data"

step "the same on the registered node-only volume reg-data"
write_read reg-data "$pool/nodeonly/reg-data" "$tmp/zfs/nodeonly/reg-data"
check "reg-data: its dataset has refquota 32MiB (context.size) and the managed marker" \
  same "33554432 yes" "$(zget refquota "$pool/nodeonly/reg-data") $(zget org.zfs-csi:managed "$pool/nodeonly/reg-data")"

# ---------------------------------------------------------------------------------------------
step "snapshots: create, list, a volume from one, delete"

# With a store, a snapshot goes there unless the parameter store=false asks for a local one.
local_snapshot=()
[ -n "$store_on" ] && local_snapshot=(-parameter store=false)
out=$(nomad volume snapshot create "${local_snapshot[@]}" pg-data snap1 2>&1)
say "  $(tail -1 <<<"$out")"
check "nomad volume snapshot create ${local_snapshot[*]}${local_snapshot[*]:+ }pg-data snap1" \
  grep -q "pg-data@snap1@$node_name" <<<"$out"
check "ZFS has the snapshot $pool/nomad/pg-data@snap1" zexists "$pool/nomad/pg-data@snap1"
check "nomad volume snapshot list -plugin $monolith_plugin shows it" \
  grep -q "pg-data@snap1@$node_name" <<<"$(nomad volume snapshot list -plugin "$monolith_plugin" 2>&1)"

out=$(nomad volume create "$tmp/restore.hcl" 2>&1)
say "  $out"
check "nomad volume create from the snapshot (volume-from-snapshot.hcl)" \
  grep -q "Created external volume pg-data-restore@$node_name" <<<"$out"
check "pg-data-restore is a ZFS clone of pg-data@snap1 holding the same bytes" \
  same "$(zget origin "$pool/nomad/pg-data-restore") $(host_sum "$tmp/zfs/nomad/pg-data-restore/payload")" \
  "$pool/nomad/pg-data@snap1 $(host_sum "$tmp/zfs/nomad/pg-data/payload")"
check "nomad volume delete pg-data-restore" nomad volume delete pg-data-restore

out=$(nomad volume snapshot delete "$monolith_plugin" "pg-data@snap1@$node_name" 2>&1)
check "nomad volume snapshot delete $monolith_plugin pg-data@snap1@$node_name" test $? -eq 0
check "the snapshot is no longer listed" \
  bash -c "! grep -q 'pg-data@snap1' <<<\"\$('$nomad_bin' volume snapshot list -plugin '$monolith_plugin' 2>&1)\""
check "ZFS no longer has pg-data@snap1 under its name (set aside for deleted_retention)" \
  zgone "$pool/nomad/pg-data@snap1"

# ---------------------------------------------------------------------------------------------
step "growing a volume: nomad volume create again with a larger capacity_min"

out=$(nomad volume create "$tmp/grow.hcl" 2>&1)
check "nomad volume create grow.hcl (same volume, capacity_min 96MiB)" test $? -eq 0
[ -n "$out" ] && say "  $out"
check "refquota of $pool/nomad/pg-data is now 96MiB (quota follows)" \
  test "$(zget refquota "$pool/nomad/pg-data") $(zget quota "$pool/nomad/pg-data")" = "100663296 100663296"
check "nomad volume status pg-data shows the new capacity" \
  test "$(nomad volume status -json pg-data | jq -r .Capacity)" = "100663296"

# ---------------------------------------------------------------------------------------------
step "restarting the plugin while a job holds the volume"

plugin_alloc=$(alloc_of "zfs-csi-$node_name")
plugin_restarts() { nomad alloc status -json "$plugin_alloc" | jq -r '.TaskStates.plugin.Restarts'; }
# Nomad's view lags the task: wait for the task's own "healthy" event after the restart, then
# for the servers to report the plugin healthy for 10 s in a row.
healthy_events() {
  nomad alloc status -json "$plugin_alloc" |
    jq '[.TaskStates.plugin.Events[] | select(.Type == "Plugin became healthy")] | length'
}
# shellcheck disable=SC2034 # "since" is read by the eval'd condition
healthy_for() {
  local since
  since=$(date +%s)
  wait_until "$1" eval '
    if plugin_healthy "$monolith_plugin" 1 1; then [ $(($(date +%s) - since)) -ge 10 ];
    else since=$(date +%s); false; fi'
}
run_app pg-data-hold pg-data hold
holding() { [ "$(alloc_status pg-data-hold)" = running ] && [ -n "$(job_sum pg-data-hold)" ]; }
check "a job holds pg-data (running, wrote /data/payload)" wait_until 120 holding
held_sum=$(job_sum pg-data-hold)
mounts_before=$(csi_mounts)
say "$(sed 's/^/  mount: /' <<<"$mounts_before")"
check "its staging and target mounts are on the host" test "$(wc -l <<<"$mounts_before")" -ge 2 -a -n "$mounts_before"

restarts=$(plugin_restarts)
healthy_before=$(healthy_events)
check "nomad alloc restart of the plugin allocation (task plugin)" \
  nomad alloc restart "$plugin_alloc" plugin
check "the plugin task restarted (restart count $restarts -> $((restarts + 1)))" \
  wait_until 60 eval '[ "$(plugin_restarts)" -gt '"$restarts"' ]'
check "the plugin task reported healthy again" \
  wait_until 120 eval '[ "$(healthy_events)" -gt '"$healthy_before"' ]'
check "Nomad reports the plugin healthy (10 s without a change)" healthy_for 120
check "the job still runs and every mount is still in place" \
  same "running $mounts_before" "$(alloc_status pg-data-hold) $(csi_mounts)"
hold_alloc=$(alloc_of pg-data-hold)
check "the job still reads its bytes through its mount (nomad alloc exec sha256sum)" same "$held_sum" \
  "$(nomad alloc exec -task app "$hold_alloc" sha256sum /data/payload 2>/dev/null | awk '{print $1}')"
check "and can write: a file written by the job appears in the dataset" bash -c \
  "'$nomad_bin' alloc exec -task app '$hold_alloc' /bin/sh -c 'echo after-restart > /data/after' &&
   grep -qx after-restart '$tmp/zfs/nomad/pg-data/after'"
nomad job stop -purge pg-data-hold >/dev/null 2>&1
check "stopping the job: the restarted plugin unmounts everything" wait_until 60 no_csi_mounts

# ---------------------------------------------------------------------------------------------
step "two allocations on one node share a multi-node-reader-only volume, restarted $shared_restarts times"
# Each restart stops the job and runs it again at once: both new allocations stage and publish
# the volume at the same moment, while the old ones unpublish it. Nomad before 1.11 sends those
# node calls side by side and fails an allocation on any error, so the plugin must make each call
# wait for the volume instead of answering ABORTED. (1.11 serializes them itself, GH-26832.)

shared_started=$(date +%s)
cat >"$tmp/shared.hcl" <<EOF
id           = "shared"
name         = "shared"
type         = "csi"
plugin_id    = "$monolith_plugin"
capacity_min = "16MiB"
capability {
  access_mode     = "multi-node-reader-only"
  attachment_mode = "file-system"
}
EOF
check "nomad volume create shared (multi-node-reader-only)" \
  bash -c "'$nomad_bin' volume create '$tmp/shared.hcl' >/dev/null"
shared_mp="$tmp/zfs/nomad/shared"
head -c 1048576 /dev/urandom >"$shared_mp/payload" && chmod 0644 "$shared_mp/payload"
shared_sum=$(host_sum "$shared_mp/payload")
say "  payload written on the host, sha256 ${shared_sum:-<none>}"

# run_shared: runs the job again and sets shared_version to the job version this run placed.
run_shared() {
  nomad job run -detach -var job_id=shared -var volume=shared -var mode=share -var count=2 \
    -var access_mode=multi-node-reader-only "$here/app.nomad.hcl" >/dev/null || return 1
  shared_version=$(nomad operator api /v1/job/shared | jq -r .Version)
}
# The allocations of the current run, as "id client-status" lines (a failed allocation of an
# earlier run stays listed with the job: it has an older job version).
shared_allocs() {
  nomad job allocs -json shared 2>/dev/null | jq -r --argjson v "$shared_version" \
    '.[] | select(.JobVersion == $v) | "\(.ID) \(.ClientStatus)"'
}
# Both allocations placed and running, or one failed for good (restarts and reschedules are off).
shared_settled() {
  local a
  a=$(shared_allocs)
  grep -q " failed$" <<<"$a" || [ "$(grep -c " running$" <<<"$a")" -eq 2 ]
}
# The checksum an allocation printed.
alloc_sum() { nomad alloc logs "$1" app 2>/dev/null | awk '/\/data\/payload$/ {print $1}'; }
# check_shared what: both allocations of the current run are running and printed the payload's
# checksum.
check_shared() {
  local a id sums="" why=""
  wait_until 120 shared_settled || why="; not settled within 120 s"
  a=$(shared_allocs)
  for id in $(awk '$2 == "running" {print $1}' <<<"$a"); do
    wait_until 30 eval '[ -n "$(alloc_sum '"$id"')" ]'
    sums+="$(alloc_sum "$id") "
  done
  if [ "$(grep -c " running$" <<<"$a")" -eq 2 ] && [ "$sums" = "$shared_sum $shared_sum " ]; then
    pass "$1: both allocations running, both read sha256 ${shared_sum:0:12}..."
    return
  fi
  fail "$1: both allocations running and reading the payload$why"
  say "$(sed 's/^/  alloc: /' <<<"$a")"
  say "  sums read: ${sums:-none}"
  for id in $(awk '$2 != "running" {print $1}' <<<"$a"); do
    nomad alloc status "$id" 2>&1 | grep -E "Setup Failure|csi_hook" | head -2 | sed 's/^/  /'
  done
  # The plugin's node calls on the volume that led there (its "rpc" log lines), oldest first.
  say "  the plugin's last node calls on volume shared (paths below $csi_dir/monolith/...):"
  nomad alloc logs -stderr "$plugin_alloc" plugin 2>/dev/null | grep -F '"volumeId":"shared@' |
    jq -r --arg base "$csi_dir/monolith/$monolith_plugin/" 'select(.msg == "rpc") |
      [.ts, .method, .code, "wait=\(.lockWaitMs // 0)ms",
        ((.targetPath // .stagingTargetPath // "") | ltrimstr($base))] | join(" ")' 2>/dev/null |
    tail -16 | sed 's/^/    /'
}

run_shared || abort "job shared submitted"
check_shared "first run"
for i in $(seq 1 "$shared_restarts"); do
  # Stop without waiting for the allocations to finish, then run again: the new allocations'
  # stage and publish overlap the old ones' unpublish.
  nomad job stop shared >/dev/null 2>&1 || say "  nomad job stop shared failed"
  run_shared || abort "job shared submitted again"
  check_shared "restart $i of $shared_restarts"
done
nomad job stop -purge shared >/dev/null 2>&1
if wait_until 60 no_csi_mounts; then
  pass "stopping the job: no staging or target mount is left"
else
  fail "stopping the job: no staging or target mount is left"
  say "$(csi_mounts | sed 's/^/  left: /')"
  say "$(nomad volume status shared 2>&1 | tail -6 | sed 's/^/  nomad: /')"
  nomad alloc logs -stderr "$plugin_alloc" plugin 2>/dev/null | grep -F '"volumeId":"shared@' |
    grep -E 'NodeUnpublishVolume|NodeUnstageVolume' | tail -4 | cut -c1-300 | sed 's/^/  plugin: /'
fi
# How often a node call on the volume waited for another one (the plugin logs lockWaitMs then):
# Nomad 1.10 overlaps them; 1.11 serializes them itself, so 0 is expected there.
waits=$(nomad alloc logs -stderr "$plugin_alloc" plugin 2>/dev/null |
  grep -F '"volumeId":"shared@' | grep -c '"lockWaitMs"')
say "  node calls on volume shared that waited for another call on it: $waits ($nomad_version);" \
  "$(($(date +%s) - shared_started))s for this part"
# zfs-fuse may call the dataset busy for a moment after the last unmount: the plugin answers
# FAILED_PRECONDITION, which an operator would retry, and so does this check.
check "nomad volume delete shared (retried while zfs-fuse calls it busy)" \
  wait_until 30 nomad volume delete shared

# ---------------------------------------------------------------------------------------------
# Nomad sends CreateVolume only a volume's name, never its id or namespace (docs/volumes.md,
# "Volume names: one per volume, across namespaces"). A repeat of a name is answered with the volume only while
# it can be a retry: the dataset records that name, was never staged, and is less than 10 minutes
# old. Otherwise the answer is ALREADY_EXISTS, telling the operator to choose another name.

# volume_spec file id name: a 32MiB single-node-writer volume of the monolith plugin.
volume_spec() {
  cat >"$tmp/$1" <<EOF
id           = "$2"
name         = "$3"
type         = "csi"
plugin_id    = "$monolith_plugin"
capacity_min = "32MiB"
capability {
  access_mode     = "single-node-writer"
  attachment_mode = "file-system"
}
parameters {
  compression = "on"
}
EOF
}
# datasets_named word: the datasets in the pool whose name contains the word (set-aside ones too).
datasets_named() { zfs list -H -o name -r "$pool" | grep -F "$1" | sort; }
plugin_log() { nomad alloc logs -stderr "$plugin_alloc" plugin 2>/dev/null; }
# created_as out id external-id: nomad volume create's output says it created the volume.
created_as() { grep -q "Created external volume $3 with ID $2\$" <<<"$1"; }

step "a retried nomad volume create (same name, never staged, within 10 minutes): the same volume"
names_started=$(date +%s)

volume_spec retry.hcl retry-data retry-data
out=$(nomad volume create "$tmp/retry.hcl" 2>&1)
say "  $out"
check "nomad volume create retry-data: External ID retry-data@$node_name" \
  created_as "$out" retry-data "retry-data@$node_name"
# Nomad forgets the volume and the dataset stays: what a create whose answer was lost leaves.
check "nomad volume deregister retry-data: Nomad forgets it, the dataset stays (a lost answer)" \
  eval 'nomad volume deregister retry-data >/dev/null && zexists "$pool/nomad/retry-data"'
out=$(nomad volume create "$tmp/retry.hcl" 2>&1)
code=$?
say "  $out"
check "nomad volume create retry-data again: exit 0, the same External ID retry-data@$node_name" \
  eval '[ "$code" -eq 0 ] && created_as "$out" retry-data "retry-data@$node_name"'
retry_ds="$pool/nomad/retry-data"
check "one dataset for it ($retry_ds), recording its name, never staged" \
  same "$retry_ds retry-data -" "$(datasets_named retry-data | tr '\n' ' ')$(
    zget org.zfs-csi:name "$retry_ds") $(zget org.zfs-csi:staged-at "$retry_ds")"
# Nomad's log collector copies the plugin's stderr to its log file a moment later.
logged_repeat() {
  plugin_log | grep -F "\"retry-data@$node_name\"" | grep -F "CreateVolume repeated" >/dev/null
}
check "the plugin logged the repeat (\"CreateVolume repeated\", volumeId retry-data@$node_name)" \
  wait_until 10 logged_repeat
check "nomad volume delete retry-data" wait_until 30 nomad volume delete retry-data

# ---------------------------------------------------------------------------------------------
step "one volume name in two namespaces: the second create is refused; a name of its own works"

check "nomad namespace apply staging; nomad namespace apply prod" \
  eval 'nomad namespace apply staging >/dev/null && nomad namespace apply prod >/dev/null'
volume_spec pg.hcl postgres postgres
pg_ds="$pool/nomad/postgres"
pg_payload="$tmp/zfs/nomad/postgres/payload"
out=$(nomad volume create -namespace staging "$tmp/pg.hcl" 2>&1)
say "  $out"
check "staging: nomad volume create postgres (name \"postgres\"): External ID postgres@$node_name" \
  created_as "$out" postgres "postgres@$node_name"
chown 65534:65534 "$tmp/zfs/nomad/postgres"
NOMAD_NAMESPACE=staging run_app postgres-write postgres write
NOMAD_NAMESPACE=staging check "staging: a job (exec driver) wrote /data/payload and finished" \
  job_done postgres-write
pg_sum=$(NOMAD_NAMESPACE=staging job_sum postgres-write)
say "  job printed sha256 ${pg_sum:-<none>}"
check "the bytes are in $pg_ds (same sha256)" same "$pg_sum" "$(host_sum "$pg_payload")"
pg_staged=$(zget org.zfs-csi:staged-at "$pg_ds")
check "the first stage marked it: org.zfs-csi:staged-at=${pg_staged:-<unset>} (unix seconds)" \
  eval '[[ "$pg_staged" =~ ^[0-9]+$ ]]'
NOMAD_NAMESPACE=staging nomad job stop -purge postgres-write >/dev/null 2>&1

out=$(nomad volume create -namespace prod "$tmp/pg.hcl" 2>&1)
code=$?
say "$(fold -s -w 96 <<<"$out" | sed 's/^/  /')"
check "prod: nomad volume create of the same spec fails (exit $code)" test "$code" -ne 0
check "the error says AlreadyExists, \"staged since\", \"give each volume a name of its own ...\"" \
  eval 'grep -qF AlreadyExists <<<"$out" && grep -qF "staged since" <<<"$out" &&
    grep -qF "give each volume a name of its own across all namespaces" <<<"$out"'
check "prod: nomad volume status postgres fails (Nomad has no such volume there)" \
  eval '! nomad volume status -namespace prod postgres >/dev/null 2>&1'
check "still one dataset named postgres, its bytes unchanged (sha256 ${pg_sum:0:12}...)" \
  same "$pg_ds $pg_sum" "$(datasets_named postgres | tr '\n' ' ')$(host_sum "$pg_payload")"

volume_spec pg-prod.hcl postgres postgres-prod
out=$(nomad volume create -namespace prod "$tmp/pg-prod.hcl" 2>&1)
say "  $out"
check "prod: the same spec with name \"postgres-prod\": External ID postgres-prod@$node_name" \
  created_as "$out" postgres "postgres-prod@$node_name"
check "two datasets now: $pool/nomad/postgres and $pool/nomad/postgres-prod" \
  same "$pg_ds $pg_ds-prod " "$(datasets_named postgres | tr '\n' ' ')"
check "nomad volume delete -namespace prod postgres: $pg_ds-prod is set aside" \
  eval 'wait_until 30 nomad volume delete -namespace prod postgres && zgone "$pg_ds-prod"'
check "staging's postgres still holds its bytes (sha256 ${pg_sum:0:12}...)" \
  same "$pg_sum" "$(host_sum "$pg_payload")"
check "nomad volume delete -namespace staging postgres; nomad namespace delete prod, staging" eval '
  wait_until 30 nomad volume delete -namespace staging postgres && zgone "$pg_ds" &&
  nomad namespace delete prod >/dev/null && nomad namespace delete staging >/dev/null'
say "  $(($(date +%s) - names_started))s for the retry and the two namespaces"

# ---------------------------------------------------------------------------------------------
# The store (issue 12): with --store, `nomad volume snapshot create` puts the snapshot in the
# store and answers with its id, store:<volume>:<guid>; `nomad volume create` with that id as
# snapshot_id receives it back, checked against the sizes and sha256s recorded at backup time,
# also after the volume was deleted.

# tree_sum dir: one sha256 over every file below dir: the sorted "sha256  ./path" lines, as
# tests/e2e/app.nomad.hcl's modes fill and tree print it for /data.
tree_sum() {
  (cd "$1" && find . -type f -exec sha256sum {} + | LC_ALL=C sort -k 2 | sha256sum | awk '{print $1}')
}
# The tree checksum a job printed ("tree <sha256>  -").
job_tree() { nomad alloc logs "$(alloc_of "$1")" app 2>/dev/null | awk '$1 == "tree" {print $2}'; }
# The Ready? column of a snapshot in nomad volume snapshot list (empty: not listed).
snapshot_ready() {
  nomad volume snapshot list -plugin "$monolith_plugin" 2>/dev/null |
    awk -v id="$1" '$1 == id {print $NF}'
}

if [ -n "$store_on" ]; then
  step "the store: a snapshot to the store, the volume deleted, restored from the store"
  store_started=$(date +%s)

  backed_ds="$pool/nomad/backed"
  backed_mp="$tmp/zfs/nomad/backed"
  volume_spec backed.hcl backed backed
  out=$(nomad volume create "$tmp/backed.hcl" 2>&1)
  say "  $out"
  check "nomad volume create backed: External ID backed@$node_name" \
    created_as "$out" backed "backed@$node_name"
  chown 65534:65534 "$backed_mp"
  run_app backed-fill backed fill
  check "a job (exec driver) wrote a tree of files to backed and finished" job_done backed-fill
  backed_sum=$(job_tree backed-fill)
  say "  job printed tree sha256 ${backed_sum:-<none>}" \
    "($(find "$backed_mp" -type f 2>/dev/null | wc -l) files on the host)"
  check "the host reads the same tree in $backed_ds (tree sha256)" \
    same "$backed_sum" "$(tree_sum "$backed_mp")"
  nomad job stop -purge backed-fill >/dev/null 2>&1
  check "the job is done and no staging or target mount is left" wait_until 60 no_csi_mounts

  out=$(nomad volume snapshot create backed nightly 2>&1)
  say "$(sed 's/^/  /' <<<"$out")"
  store_id=$(awk '$1 ~ /^store:/ {print $1; exit}' <<<"$out")
  check "nomad volume snapshot create backed nightly: snapshot id ${store_id:-<none>} (store:...)" \
    eval '[[ "$store_id" =~ ^store:backed:[0-9a-f]{16}$ ]]'
  check "nomad volume snapshot list -plugin $monolith_plugin lists it with Ready? true" \
    wait_until 120 eval '[ "$(snapshot_ready "$store_id")" = true ]'
  say "  $(nomad volume snapshot list -plugin "$monolith_plugin" 2>&1 | grep -F "$store_id")"
  # What an operator finds in the store directory (docs/backups.md, "The store's layout").
  manifest="$store_dir/v1/volumes/backed/snapshots/${store_id##*:}.json"
  local_snap="$backed_ds@$(jq -r .snapshot "$manifest" 2>/dev/null)"
  check "the store holds its manifest: kind requested, csiName nightly, the guid of $local_snap" \
    same "requested nightly $(zget guid "$local_snap")" \
    "$(jq -r '"\(.kind) \(.csiName) \(.guid)"' "$manifest" 2>/dev/null)"
  stream="$store_dir/$(jq -r .stream "$manifest" 2>/dev/null)"
  check "and its stream ${stream#"$store_dir/"}, with the manifest's size and sha256" \
    same "$(jq -r '"\(.size) \(.sha256)"' "$manifest" 2>/dev/null)" \
    "$(stat -c %s "$stream" 2>/dev/null) $(host_sum "$stream")"

  check "nomad volume delete backed (retried while zfs-fuse calls it busy)" \
    wait_until 30 nomad volume delete backed
  check "dataset $backed_ds is gone under its name" zgone "$backed_ds"
  check "the store keeps the snapshot: its manifest stays, the volume's record has deletedAt" \
    eval '[ -f "$manifest" ] &&
      jq -e ".deletedAt | strings" "$store_dir/v1/volumes/backed/volume.json" >/dev/null'
  check "nomad volume snapshot list still lists $store_id" \
    eval '[ "$(snapshot_ready "$store_id")" = true ]'

  check "volume-from-snapshot.hcl -> backed from snapshot_id $store_id, 32MiB" \
    spec_from volume-from-snapshot.hcl restore-store.hcl 's/pg-data-restore/backed/g' \
    "s/zfs-node-a/$monolith_plugin/" \
    "s/snapshot_id = \"pg-data@nightly@node-a\"/snapshot_id = \"$store_id\"/" \
    's/capacity_min = "10GiB"/capacity_min = "32MiB"/'
  restore_started=$(date +%s)
  out=$(nomad volume create "$tmp/restore-store.hcl" 2>&1)
  say "$(fold -s -w 96 <<<"$out" | sed 's/^/  /')"
  check "nomad volume create restore-store.hcl: External ID backed@$node_name" \
    created_as "$out" backed "backed@$node_name"
  say "  restored in $(($(date +%s) - restore_started))s"
  check "$backed_ds is back: not a clone, refquota 32MiB, managed, no .restore- dataset left" \
    same "- 33554432 yes 0" "$(zget origin "$backed_ds") $(zget refquota "$backed_ds") $(
      zget org.zfs-csi:managed "$backed_ds") $(datasets_named /.restore- | wc -l)"
  run_app backed-tree backed tree
  check "a job mounted the restored volume and finished" job_done backed-tree
  check "it read the same tree (sha256 ${backed_sum:0:12}...)" \
    same "$backed_sum" "$(job_tree backed-tree)"
  nomad job stop -purge backed-tree >/dev/null 2>&1
  check "the job is done and no staging or target mount is left" wait_until 60 no_csi_mounts

  check "nomad volume delete backed (the restored volume)" wait_until 30 nomad volume delete backed
  out=$(nomad volume snapshot delete "$monolith_plugin" "$store_id" 2>&1)
  check "nomad volume snapshot delete $monolith_plugin $store_id" test $? -eq 0
  [ -n "$out" ] && say "  $out"
  check "it is no longer listed" eval '[ -z "$(snapshot_ready "$store_id")" ]'
  say "  $(($(date +%s) - store_started))s for the store"
fi

# ---------------------------------------------------------------------------------------------
step "nomad volume delete (monolith) and nomad volume deregister (node only)"

others_before=$(pool_state | grep -v "^$pool/nomad/pg-data[@/	]" | grep -v '\.deleted-')
check "nomad volume delete pg-data" nomad volume delete pg-data
check "dataset $pool/nomad/pg-data is gone under its name" \
  zgone "$pool/nomad/pg-data"
set_aside=$(zfs list -H -o name -d 1 "$pool/nomad" | grep -E "/\.deleted-[0-9]+-pg-data$" || true)
check "it is set aside as ${set_aside:-<nothing>} (deleted_retention 7d), unmounted" \
  test -n "$set_aside" -a "$(zget mounted "$set_aside")" = "no"
check "nomad volume status no longer knows pg-data" bash -c "! '$nomad_bin' volume status pg-data >/dev/null 2>&1"
check "nomad volume deregister reg-data" nomad volume deregister reg-data
check "deregister left $pool/nodeonly/reg-data and its data alone" \
  same "${written[reg-data]:-}${written[reg-data]:+ yes}" \
  "$(host_sum "$tmp/zfs/nodeonly/reg-data/payload") $(zget org.zfs-csi:managed "$pool/nodeonly/reg-data")"
others_after=$(pool_state | grep -v "^$pool/nomad/pg-data[@/	]" | grep -v '\.deleted-')
check "nothing else in the pool changed ($(wc -l <<<"$others_before") dataset properties compared)" \
  same "$others_before" "$others_after"
check "no staging or target mount is left" no_csi_mounts
