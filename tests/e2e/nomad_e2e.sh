#!/usr/bin/env bash
# End-to-end proof under a real Nomad agent: the plugin runs as a Nomad job from the files in
# nomad/, and Nomad itself creates, registers, mounts, snapshots, grows and deletes volumes on a
# throw-away zfs pool. Every check prints one line; the last line is
#   nomad-e2e: N checks passed, N failed
# and the exit code is non-zero if any check failed.
#
#   tests/e2e/nomad_e2e.sh          # as root; builds Nomad once per machine (tests/e2e/nomad_install.sh)
#
# What runs where (raw_exec and exec need nothing but Nomad; why not docker or podman on our CI
# machines: the README's "Running under Nomad" section):
#   - a Nomad dev agent on 127.0.0.1, free non-default ports, data_dir in a temporary directory;
#   - the plugin with nomad/zfs-csi-raw-exec.nomad.hcl, as a monolith (plugin id zfs-e2e) and as
#     the node-only layout (plugin id zfs, on a second parent dataset); the job's binary_path is a
#     small wrapper that runs main.ts with the production permission flags (src/permissions.ts)
#     scoped to the agent's <data_dir>/client/csi, since "deno compile" cannot run here;
#   - the application job (tests/e2e/app.nomad.hcl) with the exec driver.
# Environment: ZFS_CSI_CACHE (Nomad build cache, default /var/cache/zfs-csi), E2E_KEEP=1 keeps
# the temporary directory's logs (the pool is destroyed either way).
set -uo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
here="$root/tests/e2e"
started_at=$(date +%s)
passed=0
failed=0

say() { printf '%s\n' "$*"; }
step() { say ""; say "== $*"; }
pass() { passed=$((passed + 1)); say "ok   $*"; }
fail() { failed=$((failed + 1)); say "FAIL $*"; }

# check "what" command...: one check, passed if the command succeeds.
check() {
  local what=$1
  shift
  if "$@"; then pass "$what"; else fail "$what"; fi
}

# same a b: equal and not empty (an empty output on both sides proves nothing).
same() { [ -n "$1" ] && [ "$1" = "$2" ]; }

# wait_until seconds command...: polls every second until the command succeeds.
wait_until() {
  local deadline=$(($(date +%s) + $1))
  shift
  until "$@" >/dev/null 2>&1; do
    [ "$(date +%s)" -ge "$deadline" ] && return 1
    sleep 1
  done
}

# A failure that makes the rest meaningless: count it, clean up, stop.
abort() {
  fail "$*"
  exit 1
}

if [ "$(id -u)" != 0 ]; then
  say "nomad-e2e: needs root (zpool create, mounts, the Nomad client)" >&2
  exit 1
fi

# ---------------------------------------------------------------------------------------------
step "setup"

"$root/tools/zfs-env.sh" ensure || abort "zfs answers (tools/zfs-env.sh ensure)"
nomad_bin=$("$here/nomad_install.sh") || abort "Nomad built or found in the cache"
say "nomad: $nomad_bin ($("$nomad_bin" version | head -1))"

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
our_pids() {
  local p
  for p in /proc/[0-9]*; do
    [ "${p#/proc/}" = "$$" ] && continue
    if { tr '\0' ' ' <"$p/cmdline"; } 2>/dev/null | grep -qF "$tmp/"; then
      echo "${p#/proc/}"
    elif find "$p/fd" -maxdepth 1 -lname "$data_dir/*" 2>/dev/null | grep -q .; then
      echo "${p#/proc/}"
    fi
  done
}

cleanup() {
  local code=$?
  trap - EXIT INT TERM
  step "cleanup"
  if [ -n "$agent_pid" ] && kill -0 "$agent_pid" 2>/dev/null; then
    # Jobs first, so the plugins unmount what they mounted; then the agent (a dev agent also
    # destroys what is left when it stops).
    for job in $(nomad job status -short 2>/dev/null | awk 'NR > 1 && $1 !~ /^zfs-csi-/ {print $1}'); do
      nomad job stop -purge "$job" >/dev/null 2>&1
    done
    for job in $(nomad job status -short 2>/dev/null | awk 'NR > 1 {print $1}'); do
      nomad job stop -purge "$job" >/dev/null 2>&1
    done
    kill -INT "$agent_pid" 2>/dev/null
    for _ in $(seq 1 30); do kill -0 "$agent_pid" 2>/dev/null || break; sleep 1; done
    kill -KILL "$agent_pid" 2>/dev/null
  fi
  for pid in $(our_pids); do kill -KILL "$pid" 2>/dev/null; done
  # Leftover mounts below the temporary directory (not the pool's own, zpool destroy does those).
  findmnt -rn -o TARGET | grep -F "$tmp/" | grep -vF "$tmp/zfs" | sort -r | while read -r m; do
    umount "$m" 2>/dev/null || umount -l "$m" 2>/dev/null
  done
  for _ in $(seq 1 20); do
    zpool destroy -f "$pool" 2>/dev/null && break
    zpool list -H "$pool" >/dev/null 2>&1 || break
    sleep 0.5
  done
  zpool list -H "$pool" >/dev/null 2>&1 && say "could not destroy pool $pool: zpool destroy -f $pool"
  if [ "${E2E_KEEP:-}" = 1 ]; then say "kept $tmp"; else rm -rf "$tmp"; fi
  say ""
  say "took $(($(date +%s) - started_at))s"
  say "nomad-e2e: $passed checks passed, $failed failed"
  if [ "$failed" -gt 0 ] || [ "$code" -ne 0 ]; then exit 1; fi
  exit 0
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# -- the pool: parent datasets for the monolith and for the node-only layout
truncate -s 1G "$tmp/pool.img"
zpool create -m "$tmp/zfs" "$pool" "$tmp/pool.img" || abort "pool $pool created"
zfs create "$pool/nomad" && zfs create "$pool/nodeonly" || abort "parent datasets created"
say "pool: $pool on $tmp/pool.img, parents $pool/nomad (monolith) and $pool/nodeonly (node only)"

# -- the plugin "binary" for raw_exec: main.ts under the pinned Deno, with the production
# permission flags scoped to this agent's CSI directory.
mkdir -p "$tmp/bin"
flags=$(cd "$root" && E2E_CSI_DIR="$csi_dir" ./tools/deno eval --quiet '
  const { runtimeFlags } = await import(`${Deno.cwd()}/src/permissions.ts`);
  const dirs = [Deno.env.get("E2E_CSI_DIR")!];
  await Deno.stdout.write(new TextEncoder().encode(runtimeFlags({ dirs }).join(" ")));
') || abort "permission flags read from src/permissions.ts"
cat >"$tmp/bin/zfs-csi" <<EOF
#!/bin/sh
# Runs zfs-csi from source as the compiled binary would run (its flags from src/permissions.ts).
cd '$root' || exit 1
export DENO_DIR='${DENO_DIR:-$HOME/.cache/deno}'
exec ./tools/deno run --quiet --frozen --config deno.json $flags main.ts "\$@"
EOF
chmod +x "$tmp/bin/zfs-csi"
check "plugin wrapper runs main.ts (--version)" "$tmp/bin/zfs-csi" --version

# -- the agent: loopback, free ports outside Nomad's dynamic range (20000-32000)
port_free() { ! (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }
for _ in $(seq 1 50); do
  base=$((34000 + (RANDOM % 2000) * 3))
  if port_free "$base" && port_free $((base + 1)) && port_free $((base + 2)); then break; fi
done
export NOMAD_ADDR="http://127.0.0.1:$base"
port_free 4646 || say "note: port 4646 is in use by something else; this agent uses $base-$((base + 2))"

# The exec driver copies chroot_env into every task: only what tests/e2e/app.nomad.hcl runs.
chroot_entries=""
for prog in sh head sha256sum sleep cat ls; do
  path=$(readlink -f "$(command -v "$prog")")
  chroot_entries+="    \"$path\" = \"/bin/$prog\""$'\n'
  for lib in $(ldd "$path" | grep -o '/[^ ]*'); do
    chroot_entries+="    \"$(readlink -f "$lib")\" = \"$lib\""$'\n'
  done
done
# The job runs as nobody (Nomad's default for exec; a task running as "root" gets every
# capability the kernel knows, and this machine's bounding set lacks CAP_SYS_RESOURCE, so it
# fails with "unable to apply caps"): the user must resolve inside the task.
chroot_entries+='    "/etc/passwd" = "/etc/passwd"'$'\n''    "/etc/group" = "/etc/group"'
chroot_entries=$(printf '%s\n' "$chroot_entries" | sort -u)

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
wait_until 60 node_ready || abort "dev agent up on $NOMAD_ADDR with raw_exec and exec healthy (log: $tmp/agent.log)"
pass "dev agent up on $NOMAD_ADDR, node \"$node_name\", raw_exec and exec drivers healthy"

# ---------------------------------------------------------------------------------------------
step "plugin jobs from nomad/zfs-csi-raw-exec.nomad.hcl"

plugin_vars=(-var "nomad_data_dir=$data_dir" -var "binary_path=$tmp/bin/zfs-csi" -var log_level=debug)
nomad job run -detach -var "node=$node_name" -var "parent_dataset=$pool/nomad" "${plugin_vars[@]}" \
  "$root/nomad/zfs-csi-raw-exec.nomad.hcl" >/dev/null || abort "monolith plugin job submitted"
nomad job run -detach -var "parent_dataset=$pool/nodeonly" "${plugin_vars[@]}" \
  "$root/nomad/zfs-csi-raw-exec.nomad.hcl" >/dev/null || abort "node-only plugin job submitted"

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

# ---------------------------------------------------------------------------------------------
step "volume specs from nomad/, edited as an operator would (node name, sizes)"

# spec_from source target sed-expression...: the shipped file with the edits, each of which must
# have changed something (a shipped file that drifted should fail here, not later).
spec_from() {
  local src="$root/nomad/$1" dst="$tmp/$2" e
  shift 2
  cp "$src" "$dst"
  for e in "$@"; do
    local before
    before=$(cat "$dst")
    sed -i "$e" "$dst"
    [ "$before" != "$(cat "$dst")" ] || { say "  edit '$e' changed nothing in $src"; return 1; }
  done
}
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

out=$(nomad volume snapshot create pg-data snap1 2>&1)
say "  $(tail -1 <<<"$out")"
check "nomad volume snapshot create pg-data snap1" grep -q "pg-data@snap1@$node_name" <<<"$out"
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
