#!/usr/bin/env bash
# Issue 13's proof under real Nomad: a volume that follows its job between two clients. One Nomad
# server and two client agents on this machine, each client with its own zfs pool and parent
# dataset as its "disk", the plugin on both (one system job, one plugin id, monoliths) with one
# S3 store (versitygw on 127.0.0.1), and a job (exec driver) that writes to the volume. Steps,
# each a printed check:
#   1. the volume is created (follow = "true"); the job writes 64 MiB of files on A;
#   2. A is drained: the job runs on B and reads the same SHA-256s; it writes more;
#   3. A is enabled again and B drained: the job runs on A with all data; bytes moved reported;
#   4. A's agent, plugin and tasks are killed (SIGKILL) while the job holds the volume: the job
#      runs with the volume on B only once the takeover rule allows it, with the last copy; A
#      comes back: its diverged copy is set aside, not destroyed and not published, and the job
#      moves back to A with the current data;
#   5. the store answers 503 to every request (a fault proxy between the plugins and versitygw)
#      while A is drained, for 45 s and until A's NodeUnstage and B's NodeStage have both failed
#      on it: once it answers again, Nomad's retried NodeUnstage releases the volume on A and the
#      job runs on B only, with every file written before the drain, without a takeover; the
#      plugins' logs show the 503s met. Then (5b) the store accepts requests and answers none
#      while B is drained, for 45 s and until B's NodeUnstage waits on it: B's NodeUnstage answers
#      OK only once the store answers again, and the job runs on A only, with every file;
#   6. the volume is grown with "nomad volume create" again (a larger capacity_min): the holder's
#      copy, Nomad's capacity and, after the next move, the other client's copy have the size;
#      the job is stopped, "nomad volume snapshot create" pins the store's last copy, an ordinary
#      volume made from it (snapshot_id) has the same files, the snapshot is deleted; "nomad
#      volume delete": the other client's copy is set aside by its sweep within bounded time;
#   7. throughout: never two nodes with the volume staged read-write (the mount table is sampled
#      every half second), and nothing outside the parent datasets changes.
# The last line is
#   nomad-cluster: N checks passed, M failed (Nomad vX.Y.Z)
# and the exit code is non-zero if any check failed.
#
#   flock /var/cache/zfs-csi/nomad-run.lock tests/e2e/nomad_cluster.sh   # as root
#
# Environment: ZFS_CSI_NOMAD_VERSION (default 1.11.3), ZFS_CSI_CACHE (build cache, default
# /var/cache/zfs-csi), CLUSTER_TAKEOVER_AFTER (the plugins' --takeover-after, default 20s),
# CLUSTER_DRAIN_FLAGS (added to every drain; default -ignore-system, the drain a follow volume needs,
# see docs/follow.md; CLUSTER_DRAIN_FLAGS= shows what a plain drain does), E2E_KEEP=1 keeps the temporary
# directory (agent, plugin and job logs, the store).
set -uo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
here="$root/tests/e2e"
cluster="$here/cluster"
started_at=$(date +%s)
passed=0
failed=0
# shellcheck source=tests/e2e/lib.sh
. "$here/lib.sh"

if [ "$(id -u)" != 0 ]; then
  say "nomad-cluster: needs root (zpool create, mounts, the Nomad clients)" >&2
  exit 1
fi

takeover_after=${CLUSTER_TAKEOVER_AFTER:-20s}
# Further flags for every "nomad node drain -enable". -ignore-system keeps the plugin on a drained
# client until the drain is lifted, so it is there for the NodeUnstage that syncs and releases: a
# plain drain stops it first (docs/testing.md, "Two clients").
read -r -a drain_flags <<<"${CLUSTER_DRAIN_FLAGS--ignore-system}"
case "$takeover_after" in
  *s) takeover_secs=${takeover_after%s} ;;
  *m) takeover_secs=$((${takeover_after%m} * 60)) ;;
  *) say "nomad-cluster: CLUSTER_TAKEOVER_AFTER must be seconds or minutes (30s, 2m)" >&2; exit 2 ;;
esac

# ---------------------------------------------------------------------------------------------
step "setup"

"$root/tools/zfs-env.sh" ensure || abort "zfs answers (tools/zfs-env.sh ensure)"
nomad_bin=$("$here/nomad_install.sh") || abort "Nomad built or found in the cache"
nomad_version=$("$nomad_bin" version | head -1)
say "nomad: $nomad_bin ($nomad_version)"

tmp=$(mktemp -d /tmp/zfs-csi-cluster.XXXXXX)
nodes=(a b)
declare -A pool data_dir csi_dir agent_pid http_port node_name node_id cgroup_parent
for n in "${nodes[@]}"; do
  pool[$n]="zcscl$n$$"
  data_dir[$n]="$tmp/$n/data"
  csi_dir[$n]="$tmp/$n/data/client/csi"
  node_name[$n]="cluster-$n"
done
plugin_id=zfs-cluster
vol=follow-data
usage=rw-file-system-single-node-writer
bucket=zfs-csi-cluster
s3_dir="$tmp/s3"
server_pid=""
s3_pid=""
proxy_pid=""
proxy_control=""
sampler_pid=""
if [ "$(stat -fc %T /sys/fs/cgroup)" = cgroup2fs ]; then
  for n in "${nodes[@]}"; do cgroup_parent[$n]="zfs-csi-cluster-$n-$$.slice"; done
else
  for n in "${nodes[@]}"; do cgroup_parent[$n]="/zfs-csi-cluster-$n-$$"; done
fi

nomad() { "$nomad_bin" "$@"; }
export NOMAD_CLI_SHOW_HINTS=false

zget() { zfs get -Hp -o value "$1" "$2" 2>/dev/null; }
# staging_dir node: where Nomad has node stage the volume on that client (host path).
staging_dir() { echo "${csi_dir[$1]}/monolith/$plugin_id/staging/default/$vol/$usage"; }
# staged_rw node: the volume is staged read-write on that client (its staging mount is rw).
staged_rw() {
  findmnt -rn -o TARGET,OPTIONS | awk -v t="$(staging_dir "$1")" '$1 == t && $2 ~ /^rw(,|$)/' |
    grep -q .
}
# files_at dir: "sha256 ./path" for every file below dir, sorted by path.
files_at() {
  (cd "$1" 2>/dev/null && find . -type f -exec sha256sum {} + | LC_ALL=C sort -k 2) |
    awk '{print $1, $2}'
}
# The datasets and snapshots of both pools outside the parent datasets, with what matters (not
# the parent's own "referenced": the mountpoint directories of its children are in it).
outside_state() {
  local n
  for n in "${nodes[@]}"; do
    zfs get -Hp -r -o name,property,value \
      type,mountpoint,mounted,origin,quota,refquota,referenced,compression,org.zfs-csi:managed \
      "${pool[$n]}" | grep -v "^${pool[$n]}/nomad/" | grep -v "^${pool[$n]}/nomad	referenced	"
    files_at "$tmp/zfs-$n/keep"
  done
}

# ---------------------------------------------------------------------------------------------
cleanup() {
  local code=$?
  trap - EXIT INT TERM
  step "cleanup"
  [ -n "$sampler_pid" ] && kill "$sampler_pid" 2>/dev/null
  # The store answers again (a check may have ended the run during step 5's window).
  [ -n "$proxy_control" ] && proxy_fault pass
  if [ -n "$server_pid" ] && kill -0 "$server_pid" 2>/dev/null; then
    if [ "${E2E_KEEP:-}" = 1 ]; then
      local id
      for n in "${nodes[@]}"; do plugin_log "$n" >"$tmp/plugin-$n.log" 2>&1; done
      for id in $(nomad job allocs -json writer 2>/dev/null | jq -r '.[].ID'); do
        nomad alloc logs "$id" app >"$tmp/writer-$id.log" 2>&1
      done
    fi
    # The job first, so the plugins unmount what they mounted; then the volume (deleted while
    # the plugins still run, else deregistered); then the plugins.
    nomad job stop -purge writer >/dev/null 2>&1
    wait_until 60 eval '! findmnt -rn -o TARGET | grep -qF "$tmp/"{a,b}"/data/client/csi/monolith/"'
    nomad volume status follow-restored >/dev/null 2>&1 &&
      wait_until 30 nomad volume delete follow-restored
    if nomad volume status "$vol" >/dev/null 2>&1; then
      wait_until 30 nomad volume delete "$vol" ||
        nomad volume deregister -force "$vol" >/dev/null 2>&1
    fi
    nomad job stop -purge zfs-csi-cluster >/dev/null 2>&1
  fi
  local n pid
  for n in "${nodes[@]}"; do
    pid=${agent_pid[$n]:-}
    [ -n "$pid" ] && kill -INT "$pid" 2>/dev/null
  done
  [ -n "$server_pid" ] && kill -INT "$server_pid" 2>/dev/null
  for _ in $(seq 1 30); do
    pid=""
    for p in "${agent_pid[@]}" "$server_pid"; do kill -0 "$p" 2>/dev/null && pid=$p; done
    [ -z "$pid" ] && break
    sleep 1
  done
  for p in "${agent_pid[@]}" "$server_pid"; do kill -KILL "$p" 2>/dev/null; done
  # Plugins, executors, logmon and tasks that outlive the agents; versitygw.
  for pid in $(pids_of "$tmp/" "${data_dir[a]}" "${data_dir[b]}"); do kill -KILL "$pid" 2>/dev/null; done
  [ -n "$proxy_pid" ] && kill -KILL "$proxy_pid" 2>/dev/null
  [ -n "$s3_pid" ] && kill -KILL "$s3_pid" 2>/dev/null
  # Mounts left below the temporary directory (not the pools' own, zpool destroy does those).
  findmnt -rn -o TARGET | grep -F "$tmp/" | grep -vE "^$tmp/zfs-[ab](/|$)" | sort -r |
    while read -r m; do umount "$m" 2>/dev/null || umount -l "$m" 2>/dev/null; done
  for n in "${nodes[@]}"; do
    for _ in $(seq 1 20); do
      zpool destroy -f "${pool[$n]}" 2>/dev/null && break
      zpool list -H "${pool[$n]}" >/dev/null 2>&1 || break
      sleep 0.5
    done
    zpool list -H "${pool[$n]}" >/dev/null 2>&1 &&
      say "could not destroy pool ${pool[$n]}: zpool destroy -f ${pool[$n]}"
    # The clients' cgroups (empty once their tasks are gone).
    find /sys/fs/cgroup -maxdepth 2 -type d -name "$(basename "${cgroup_parent[$n]}")" 2>/dev/null |
      while read -r d; do find "$d" -depth -type d -exec rmdir {} + 2>/dev/null; done
  done
  if [ "${E2E_KEEP:-}" = 1 ]; then say "kept $tmp"; else rm -rf "$tmp"; fi
  say ""
  say "took $(($(date +%s) - started_at))s under ${nomad_version:-Nomad (not started)}"
  say "nomad-cluster: $passed checks passed, $failed failed${nomad_version:+ ($nomad_version)}"
  if [ "$failed" -gt 0 ] || [ "$code" -ne 0 ]; then exit 1; fi
  exit 0
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# -- each client's "disk": a pool with the plugin's parent dataset, and a bystander dataset
# with a file and a snapshot that nothing may touch.
for n in "${nodes[@]}"; do
  mkdir -p "$tmp/$n"
  truncate -s 1G "$tmp/pool-$n.img"
  zpool create -m "$tmp/zfs-$n" "${pool[$n]}" "$tmp/pool-$n.img" || abort "pool ${pool[$n]} created"
  zfs create "${pool[$n]}/nomad" && zfs create "${pool[$n]}/keep" &&
    head -c 1048576 /dev/urandom >"$tmp/zfs-$n/keep/file" &&
    zfs snapshot "${pool[$n]}/keep@before" || abort "datasets of ${pool[$n]} created"
  say "client ${node_name[$n]}: pool ${pool[$n]} ($tmp/pool-$n.img), parent ${pool[$n]}/nomad"
done
outside_before=$(outside_state)

# -- the store: versitygw (tests/support/s3_server.ts builds and caches it) on 127.0.0.1.
versitygw=$(cd "$root" && ./tools/deno eval --quiet \
  'console.log(await (await import("./tests/support/s3_server.ts")).versitygwBinary())') ||
  abort "versitygw built or found in the cache (tests/support/s3_server.ts)"
s3_port=$(free_ports 1) || abort "a free port for versitygw"
s3_key="cluster$$"
s3_secret=$(head -c 18 /dev/urandom | base64 | tr -d '/+=')
mkdir -p "$s3_dir"
"$versitygw" --access "$s3_key" --secret "$s3_secret" --port "127.0.0.1:$s3_port" posix "$s3_dir" \
  >"$tmp/s3.log" 2>&1 &
s3_pid=$!
disown "$s3_pid" # killed at the end, without bash reporting it
wait_until 30 eval '! port_free "$s3_port"' || abort "versitygw answers on 127.0.0.1:$s3_port"
(cd "$root" && S3_PORT=$s3_port S3_KEY=$s3_key S3_SECRET=$s3_secret S3_BUCKET=$bucket \
  ./tools/deno eval --quiet '
  const { signedFetch } = await import("./tests/support/s3_server.ts");
  const env = (k: string) => Deno.env.get(k)!;
  const url = new URL(`http://127.0.0.1:${env("S3_PORT")}/${env("S3_BUCKET")}`);
  const r = await signedFetch({ accessKeyId: env("S3_KEY"), secretAccessKey: env("S3_SECRET") },
    "PUT", url);
  if (!r.ok) throw new Error(`PUT bucket: ${r.status} ${await r.text()}`);
  await r.body?.cancel();
') || abort "bucket $bucket created"
store_vol="$s3_dir/$bucket/v1/volumes/$vol"
pass "store: versitygw on 127.0.0.1:$s3_port, bucket $bucket"

# -- the plugins reach it through a fault proxy (tests/e2e/cluster/store_proxy.ts) that step 5
# switches to answering 503 for a while; it passes every request through until then.
(cd "$root" && exec ./tools/deno run --quiet --frozen --allow-net=127.0.0.1 \
  tests/e2e/cluster/store_proxy.ts "http://127.0.0.1:$s3_port") >"$tmp/proxy.out" 2>"$tmp/proxy.log" &
proxy_pid=$!
disown "$proxy_pid"
# (jq 1.6 exits 0 on an empty file: the line is looked for as text first)
wait_until 60 grep -q '"control"' "$tmp/proxy.out" || abort "the store proxy listens ($tmp/proxy.log)"
proxy_endpoint=$(jq -r .endpoint "$tmp/proxy.out")
proxy_control=$(jq -r .control "$tmp/proxy.out")
proxy_port=${proxy_endpoint##*:}
# proxy_fault pass|503|hold: what the proxy does with the plugins' requests from now on.
proxy_fault() { curl -sf -X PUT "$proxy_control/fault/$1" >/dev/null; }
# proxy_seen outcome: how many requests the proxy has treated so (forwarded, error, hold).
proxy_seen() { curl -sf "$proxy_control/seen" | jq -r --arg o "$1" '.[$o] // 0'; }
check "store proxy on $proxy_endpoint in front of it (both plugins use it), passing requests" \
  eval 'proxy_fault pass && [ "$(proxy_seen error)" = 0 ]'

# -- the plugin "binary" for raw_exec: main.ts with the production permission flags for both
# clients' CSI directories and the store's host:port, as ZFS_CSI_EXTRA_DIRS and
# ZFS_CSI_STORE_HOSTS widen a production build.
plugin_wrapper "$tmp/bin/zfs-csi" "$root" "${csi_dir[a]}:${csi_dir[b]}" "" "127.0.0.1:$proxy_port" ||
  abort "permission flags read from src/permissions.ts"
check "plugin wrapper runs main.ts (--version) with --allow-net=127.0.0.1:$proxy_port (the proxy) only" eval '
  "$tmp/bin/zfs-csi" --version >/dev/null &&
  grep -qF -- "--allow-net=127.0.0.1:$proxy_port " "$tmp/bin/zfs-csi"'
plugin_args=(--store "s3://$bucket" --store-endpoint "$proxy_endpoint" --store-path-style)
# The whole help first: grep -q stops at the match, and under pipefail the plugin's SIGPIPE
# from writing the rest would count as "not listed".
plugin_help=$("$tmp/bin/zfs-csi" --help 2>&1)
if grep -qF -- "--takeover-after" <<<"$plugin_help"; then
  plugin_args+=(--takeover-after "$takeover_after")
  say "plugin: --takeover-after $takeover_after"
else
  say "plugin: its --help has no --takeover-after yet: started without it"
fi
# Step 6: the sweep of copies left behind by a DeleteVolume runs every --standby-interval
# (default 30s).
sweep_secs=10
plugin_args+=(--standby-interval "${sweep_secs}s")
args_hcl=$(printf '%s\n' "${plugin_args[@]}" | jq -R . | jq -sc .)

# -- the agents: one server, two clients; loopback, free ports, their own data_dir and cgroups.
base=$(free_ports 9) || abort "9 free ports for the agents"
export NOMAD_ADDR="http://127.0.0.1:$base"
mkdir -p "$tmp/server"
cat >"$tmp/server/agent.hcl" <<EOF
name     = "cluster-server"
data_dir = "$tmp/server/data"
ports {
  http = $base
  rpc  = $((base + 1))
  serf = $((base + 2))
}
EOF
env -u AWS_CA_BUNDLE "$nomad_bin" agent -config "$cluster/server.hcl" -config "$tmp/server/agent.hcl" \
  >"$tmp/server/agent.log" 2>&1 &
server_pid=$!
disown "$server_pid"

chroot_entries=$(chroot_env_entries sh head sha256sum sleep find sort mkdir rmdir)
# start_client node: starts (or restarts, with its state) that client's agent.
start_client() {
  local n=$1 p=$((base + 3))
  [ "$n" = b ] && p=$((base + 6))
  http_port[$n]=$p
  cat >"$tmp/$n/agent.hcl" <<EOF
name     = "${node_name[$n]}"
data_dir = "${data_dir[$n]}"
ports {
  http = $p
  rpc  = $((p + 1))
  serf = $((p + 2))
}
client {
  servers       = ["127.0.0.1:$((base + 1))"]
  cgroup_parent = "${cgroup_parent[$n]}"
  meta {
    zfs_parent = "${pool[$n]}/nomad"
  }
  chroot_env {
$chroot_entries
  }
}
EOF
  env -u AWS_CA_BUNDLE "$nomad_bin" agent -config "$cluster/client.hcl" -config "$tmp/$n/agent.hcl" \
    >>"$tmp/$n/agent.log" 2>&1 &
  agent_pid[$n]=$!
  disown "${agent_pid[$n]}" # step 4 kills it
}
for n in "${nodes[@]}"; do start_client "$n"; done

# node_ready name: the node is ready with raw_exec and exec healthy.
node_ready() {
  nomad operator api /v1/nodes 2>/dev/null | jq -e --arg n "$1" '.[] | select(.Name == $n) |
    .Status == "ready" and .Drivers.raw_exec.Healthy and .Drivers.exec.Healthy' >/dev/null
}
# 180 s: three agents fingerprinting at once on a loaded 2-core machine can take over 90 s.
if ! wait_until 180 eval 'node_ready cluster-a && node_ready cluster-b'; then
  # The logs go with the cleanup: their ends here, so a failed run says why.
  for n in server a b; do
    echo "-- $n: last lines of $tmp/$n/agent.log"
    tail -n 20 "$tmp/$n/agent.log" 2>/dev/null
  done
  nomad operator api /v1/nodes 2>/dev/null |
    jq -c '.[] | {Name, Status, raw_exec: .Drivers.raw_exec.Healthy, exec: .Drivers.exec.Healthy}'
  abort "server and both clients up, raw_exec and exec healthy"
fi
for n in "${nodes[@]}"; do
  node_id[$n]=$(nomad operator api /v1/nodes | jq -r --arg n "${node_name[$n]}" '.[] | select(.Name == $n) | .ID')
done
pass "server on $NOMAD_ADDR; clients cluster-a (${node_id[a]:0:8}) and cluster-b (${node_id[b]:0:8}) ready"

# ---------------------------------------------------------------------------------------------
step "the plugin on both clients: one system job, one plugin id ($plugin_id), one store"

nomad job run -detach -var "binary_path=$tmp/bin/zfs-csi" \
  -var "clients={\"cluster-a\"=\"${data_dir[a]}\",\"cluster-b\"=\"${data_dir[b]}\"}" \
  -var "plugin_args=$args_hcl" -var "s3_access_key=$s3_key" -var "s3_secret_key=$s3_secret" \
  "$cluster/plugin.nomad.hcl" >/dev/null || abort "plugin job submitted"
# plugin_healthy controllers nodes
plugin_healthy() {
  nomad plugin status -json "$plugin_id" 2>/dev/null |
    jq -e --argjson c "$1" --argjson n "$2" '.ControllersHealthy == $c and .NodesHealthy == $n' >/dev/null
}
# plugin_log node: the plugin's log lines on that client, over all its allocations (a drain
# stops it; it comes back as a new allocation), oldest first.
plugin_log() {
  local a
  for a in $(nomad job allocs -json zfs-csi-cluster 2>/dev/null | jq -r --arg n "${node_name[$1]}" \
    '[.[] | select(.NodeName == $n)] | sort_by(.CreateIndex) | .[].ID'); do
    nomad alloc logs -stderr "$a" plugin 2>/dev/null
  done
}
# What the plugin logs (src/follow/mover.ts) when a move happens.
msg_released="follow volume released"
msg_received="follow volume received"
msg_taken="follow volume taken over from a holder that stopped renewing"
msg_swept="copy of a deleted follow volume set aside"
msg_diverged="this node's copy diverged from the store's head: set aside, never published"
# logged node message: how many lines the plugin logged on that client with exactly that message.
logged() { plugin_log "$1" | jq -c --arg m "$2" 'select(.msg == $m)' 2>/dev/null | grep -c .; }
# last_logged node message fields: the fields of the last such line, as "k=v ...".
last_logged() {
  plugin_log "$1" | jq -r --arg m "$2" --argjson f "$3" 'select(.msg == $m) |
    [$f[] as $k | select(has($k)) | "\($k)=\(.[$k] | tostring)"] | join(" ")' 2>/dev/null | tail -1
}
wait_until 180 plugin_healthy 2 2 ||
  abort "plugin $plugin_id healthy on both clients (nomad alloc logs -stderr <alloc> plugin)"
pass "plugin $plugin_id: Controllers Healthy 2, Nodes Healthy 2"

# The mount table, every half second until the end: which clients have the volume staged rw.
(
  while :; do
    line="$(date +%s.%N | cut -c1-14)"
    for n in "${nodes[@]}"; do staged_rw "$n" && line+=" $n"; done
    echo "$line" >>"$tmp/staged.log"
    sleep 0.5
  done
) &
sampler_pid=$!
# never_both: no sample so far had the volume staged rw on both clients.
never_both() { ! awk 'NF >= 3' "$tmp/staged.log" | grep -q .; }
samples() { wc -l <"$tmp/staged.log"; }
# check_mounts what on off: staged rw on client `on`, not on `off`, and never on both so far.
check_mounts() {
  local on=$2 off=$3
  check "$1: mount table: staged rw on ${node_name[$on]} only; never on both so far ($(samples) samples)" \
    eval 'never_both && staged_rw "$on" && ! staged_rw "$off"'
}

# ---------------------------------------------------------------------------------------------
# The writer job's allocation that runs and has printed "ready", as "alloc-id node-name".
writer_ready() {
  local a id
  for a in $(nomad job allocs -json writer 2>/dev/null | jq -r \
    '.[] | select(.ClientStatus == "running" and .DesiredStatus == "run") | "\(.ID),\(.NodeName)"'); do
    id=${a%,*}
    nomad alloc logs "$id" app 2>/dev/null | grep -qx ready && { echo "${a/,/ }"; return 0; }
  done
  return 1
}
# listed alloc before|after: the files the allocation listed, as "sha256 ./path" lines.
listed() { nomad alloc logs "$1" app 2>/dev/null | awk -v k="$2" '$1 == k {print $2, $3}'; }
# wait_writer_on node seconds: waits until the writer is ready on that client; sets alloc.
wait_writer_on() {
  local deadline=$(($(date +%s) + $2)) r
  while [ "$(date +%s)" -lt "$deadline" ]; do
    r=$(writer_ready) && [ "${r#* }" = "${node_name[$1]}" ] && { alloc=${r%% *}; return 0; }
    sleep 1
  done
  return 1
}
# drain_to from to what: drains client <from> right after <what> and checks that the writer then
# runs on client <to> within 300 s (sets alloc, as wait_writer_on does).
drain_to() {
  local t0
  t0=$(date +%s)
  check "nomad node drain -enable cluster-$1, $3" \
    nomad node drain -enable -yes -detach "${drain_flags[@]}" "${node_id[$1]}"
  if wait_writer_on "$2" 300; then
    pass "the writer runs on cluster-$2 (alloc ${alloc:0:8}), $(($(date +%s) - t0))s after the drain"
  else
    fail "the writer runs on cluster-$2 after the drain"
    writer_failures
  fi
}
# last_write tag: through the running allocation, the job writes 1 MiB to /data/last-<tag> (what
# no periodic copy can have yet, just before a move); prints its "sha256 ./last-<tag>".
last_write() {
  nomad alloc exec -task app "$alloc" /bin/sh -c \
    "head -c 1048576 /dev/urandom > /data/last-$1 && cd /data && sha256sum ./last-$1" |
    awk '{print $1, $2}'
}
# with list line: the list with one more line, sorted by path as the job sorts.
with() { printf '%s\n' "$1" "$2" | LC_ALL=C sort -k 2; }
# Why the writer's latest allocations failed (their last events), for a failed check.
writer_failures() {
  local id
  nomad job allocs -json writer 2>/dev/null | jq -r 'sort_by(.CreateIndex) | .[] |
    select(.ClientStatus == "failed") |
    "\(.NodeName) \(.ID[0:8]): \([.TaskStates[]?.Events[]? | .DisplayMessage] | last)"' |
    tail -3 | cut -c1-400 | sed 's/^/  failed: /'
  for id in $(nomad job allocs -json writer 2>/dev/null | jq -r 'sort_by(.CreateIndex) | .[] |
    select(.ClientStatus == "failed" and (.TaskStates.app.StartedAt // "") != "") | .ID' | tail -1); do
    nomad alloc logs "$id" app 2>&1 | tail -3 | sed "s/^/  ${id:0:8} stdout: /"
    nomad alloc logs -stderr "$id" app 2>&1 | tail -3 | sed "s/^/  ${id:0:8} stderr: /"
  done
}
# refusals_on node [since]: stage refusals Nomad showed for the writer's allocations on a
# client (their task events), of allocations created since that unix time.
refusals_on() {
  nomad job allocs -json writer 2>/dev/null | jq -r --arg n "${node_name[$1]}" \
    --argjson since "${2:-0}" '.[] | select(.NodeName == $n and .CreateTime >= $since * 1e9) |
    .TaskStates[]?.Events[]? | .DisplayMessage | select(test("is held by node"))' |
    sed 's/.*desc = //'
}
# A move between clients was clean: the old holder released the volume (its plugin logged it
# after `since` releases) and the new one took it without the takeover rule.
clean_move() {
  [ "$(logged "$1" "$msg_released")" -gt "$3" ] &&
    [ "$(logged "$2" "$msg_taken")" -eq "$4" ]
}
owner_field() { jq -r "$1" "$store_vol/owner.json" 2>/dev/null; }
# moved_cleanly step from to released taken: the checks that end a drain from client `from` to
# `to` (steps 5 and 5b): one running allocation, on `to`; mounts only there; a clean move (the
# counts `released` and `taken` from before it, see clean_move); `to` holds the volume in the
# store and `from`'s copy is read-only; then `from` is taken out of drain.
moved_cleanly() {
  local step=$1 from=$2 to=$3 released=$4 taken=$5
  check "the job runs on one node only: one running allocation, on ${node_name[$to]} ($(running_writers))" \
    same "${node_name[$to]}" "$(running_writers)"
  check_mounts "$step" "$to" "$from"
  check "a clean move: ${node_name[$from]} released the volume, ${node_name[$to]} needed no takeover" \
    clean_move "$from" "$to" "$released" "$taken"
  check "the store names ${node_name[$to]} the holder, ${node_name[$from]}'s copy is read-only" eval '
    [ "$(owner_field .holder)/$(owner_field .state)" = "${node_name[$to]}/held" ] &&
    [ "$(zget readonly "${pool[$from]}/nomad/$vol")" = on ]'
  check "nomad node drain -disable ${node_name[$from]}" nomad node drain -disable -yes "${node_id[$from]}"
}
# head_after time: the store's head (its last copy) was taken after that unix time.
head_after() { [ "$(date -d "$(owner_field .headAt)" +%s 2>/dev/null || echo 0)" -gt "$1" ]; }
# Store objects of the volume (key size), to tell what moved.
store_objects() {
  (cd "$store_vol" 2>/dev/null && find . -type f -printf '%P %s\n' | LC_ALL=C sort)
}
bytes_of() { awk '{s += $2} END {print s + 0}'; }
mib() { awk -v b="$1" 'BEGIN {printf "%.1f MiB", b / 1048576}'; }

# ---------------------------------------------------------------------------------------------
step "1. create the volume; the job writes 64 MiB of files on cluster-a"

check "cluster-b ineligible for now, so the job starts on cluster-a" \
  nomad node eligibility -disable "${node_id[b]}"
volume_spec="$cluster/volume.hcl"
out=$(nomad volume create "$volume_spec" 2>&1)
code=$?
say "$(sed 's/^/  /' <<<"$out")"
[ "$code" -eq 0 ] || abort "nomad volume create cluster/volume.hcl (follow = \"true\")"
pass "nomad volume create cluster/volume.hcl (follow = \"true\", backup_interval 10s)"
check "nomad volume status: schedulable, no topology pinning it to a node" eval '
  nomad volume status -json "$vol" | jq -e ".Schedulable == true and
    ((.Topologies // []) | map(.Segments // {} | length) | add // 0) == 0" >/dev/null'
check "the store holds the volume's owner record (v1/volumes/$vol/owner.json)" \
  test -f "$store_vol/owner.json"

nomad job run -detach "$cluster/writer.nomad.hcl" >/dev/null || abort "writer job submitted"
# As for any job that runs as a non-root user: hand it the new dataset's root directory.
wait_until 180 staged_rw a && chown 65534:65534 "$(staging_dir a)"
t0=$(date +%s)
wait_writer_on a 300 || { writer_failures; abort "the writer runs on cluster-a and wrote its files"; }
pass "the writer runs on cluster-a (alloc ${alloc:0:8}) and wrote its files"
after1=$(listed "$alloc" after)
check "it found an empty volume and wrote 16 files of 4 MiB (64 MiB) below /data/base" eval '
  [ -z "$(listed "$alloc" before)" ] && [ "$(grep -c "^[0-9a-f]\{64\} ./base/part-" <<<"$after1")" = 16 ]'
say "  $(wc -l <<<"$after1") files, sha256 of the list $(sha256sum <<<"$after1" | cut -c1-16)..."
check "cluster-a's host sees the same SHA-256s in its staged copy" \
  same "$after1" "$(files_at "$(staging_dir a)")"
check_mounts "step 1" a b
check "the store names cluster-a the holder" eval '[ "$(owner_field .holder)/$(owner_field .state)" = cluster-a/held ]'
t1=$(date +%s)
check "within the interval the store has a copy of the 64 MiB (the owner record's head is newer)" \
  wait_until 60 head_after "$t1"

# ---------------------------------------------------------------------------------------------
step "2. nomad node drain -enable cluster-a: the job runs on cluster-b with the same data"

nomad node eligibility -enable "${node_id[b]}" >/dev/null
released_a=$(logged a "$msg_released")
taken_b=$(logged b "$msg_taken")
last2=$(last_write 2)
expect2=$(with "$after1" "$last2")
drain_to a b "right after the job wrote /data/last-2 (${last2:0:12}...)"
check "it read the same SHA-256s as cluster-a wrote, /data/last-2 included ($(wc -l <<<"$expect2") files)" \
  same "$expect2" "$(listed "$alloc" before)"
after2=$(listed "$alloc" after)
check "and wrote more: 8 MiB in /data/more/<alloc>" \
  eval '[ "$(grep -vxFf <(echo "$expect2") <<<"$after2" | grep -c " ./more/")" = 1 ]'
check "cluster-b's host sees the same SHA-256s in its staged copy" \
  same "$after2" "$(files_at "$(staging_dir b)")"
check_mounts "step 2" b a
check "the store names cluster-b the holder (generation $(owner_field .generation))" \
  eval '[ "$(owner_field .holder)/$(owner_field .state)" = cluster-b/held ]'
say "  cluster-a released: $(last_logged a "$msg_released" '["head","bytes","base"]')"
say "  cluster-b received: $(last_logged b "$msg_received" '["streams","bytes","ms"]')"
check "a clean move: cluster-a released the volume, cluster-b needed no takeover" \
  clean_move a b "$released_a" "$taken_b"
[ -n "$(refusals_on b)" ] && say "  cluster-b was refused meanwhile: $(refusals_on b | head -1 | cut -c1-300)"
store_objects >"$tmp/store-after-step2"

# ---------------------------------------------------------------------------------------------
step "3. cluster-a enabled again, cluster-b drained: the job runs on cluster-a with all data"

check "nomad node drain -disable cluster-a" nomad node drain -disable -yes "${node_id[a]}"
check "the plugin is healthy on both clients again" wait_until 180 plugin_healthy 2 2
released_b=$(logged b "$msg_released")
taken_a=$(logged a "$msg_taken")
last3=$(last_write 3)
expect3=$(with "$after2" "$last3")
drain_to b a "right after the job wrote /data/last-3 (${last3:0:12}...)"
t3=$(date +%s)
check "it read every file cluster-b had, /data/last-3 included ($(wc -l <<<"$expect3") files)" \
  same "$expect3" "$(listed "$alloc" before)"
after3=$(listed "$alloc" after)
check "cluster-a's host sees the same SHA-256s in its staged copy" \
  same "$after3" "$(files_at "$(staging_dir a)")"
check_mounts "step 3" a b
# What moved to cluster-a: the store objects written since cluster-b took the volume (its
# increments, which a receive on top of cluster-a's copy needs), and what cluster-a's plugin says.
stored=$(comm -13 "$tmp/store-after-step2" <(store_objects) | grep -F "streams/" | bytes_of)
say "  store streams written since cluster-b took the volume: $(mib "$stored") ($stored bytes)"
say "  cluster-b released: $(last_logged b "$msg_released" '["head","bytes","base"]')"
received=$(last_logged a "$msg_received" '["streams","bytes","ms"]')
say "  cluster-a received: $received"
moved=$(sed -n 's/.*bytes=\([0-9]*\).*/\1/p' <<<"$received")
check "bytes moved to cluster-a: ${moved:-?} ($(mib "${moved:-0}")): only the increment, less than the 64 MiB it had" \
  eval '[ -n "$moved" ] && [ "$moved" -gt 0 ] && [ "$moved" -lt 67108864 ]'
check "a clean move: cluster-b released the volume, cluster-a needed no takeover" \
  clean_move b a "$released_b" "$taken_a"
check "nomad node drain -disable cluster-b" nomad node drain -disable -yes "${node_id[b]}"
check "the plugin is healthy on both clients again" wait_until 180 plugin_healthy 2 2

# ---------------------------------------------------------------------------------------------
step "4. cluster-a lost while the job holds the volume (SIGKILL), then back"

# The store's copy must hold what the job wrote on cluster-a before it is lost.
check "the store's last copy is newer than the job's writes on cluster-a" wait_until 60 head_after "$t3"
live_ds=$(findmnt -rn -o SOURCE,TARGET | awk -v t="$(staging_dir a)" '$2 == t {sub(/\[.*/, "", $1); print $1}')
live_guid=$(zget guid "$live_ds")
say "  cluster-a's copy: $live_ds (guid ${live_guid:-<none>})"
diverged=$(nomad alloc exec -task app "$alloc" /bin/sh -c \
  'head -c 1048576 /dev/urandom > /data/diverged && sha256sum /data/diverged' | awk '{print $1}')
# The machine is gone: every process of cluster-a (agent, plugin, executors, logmon, the task)
# killed at once, and its CSI mounts gone as after a crash; its pool stays, with the copy.
victims=$(
  echo "${agent_pid[a]}"
  pids_of "--node-id cluster-a " "${data_dir[a]}"
)
lost_alloc=$alloc
# shellcheck disable=SC2086 # a list of pids
kill -KILL $victims 2>/dev/null
t_kill=$(date +%s)
pass "a write the store never saw (/data/diverged ${diverged:0:12}...), then SIGKILL to $(wc -w <<<"$victims") processes of cluster-a"
findmnt -rn -o TARGET | grep -F "${csi_dir[a]}/" | sort -r | while read -r m; do umount "$m"; done
check "cluster-a's CSI mounts are gone (its copy stays in ${pool[a]})" eval '
  ! findmnt -rn -o TARGET | grep -qF "${csi_dir[a]}/" && zfs list "$live_ds" >/dev/null 2>&1'
if wait_writer_on b $((takeover_secs + 300)); then
  pass "the writer runs on cluster-b (alloc ${alloc:0:8}), $(($(date +%s) - t_kill))s after the kill"
else
  fail "the writer runs on cluster-b after cluster-a was lost"
fi
first_b=$(awk -v t="$t_kill" '$1 >= t && / b/ {print int($1); exit}' "$tmp/staged.log")
# The rule: the owner record unchanged for the holder's TTL plus --takeover-after, as seen by the
# taker; the holder's last renewal was before the kill, so never sooner than that after it.
rule_secs=$(($(owner_field .ttlSeconds) + takeover_secs))
check "not before the rule allows: first staged on cluster-b $((${first_b:-0} - t_kill))s after the kill (TTL $(owner_field .ttlSeconds)s + --takeover-after $takeover_after)" \
  eval '[ -n "$first_b" ] && [ $((first_b - t_kill)) -ge "$rule_secs" ]'
refusals=$(refusals_on b "$t_kill" | grep -F '"cluster-a"')
say "$(tail -1 <<<"$refusals" | fold -s -w 96 | sed 's/^/  refused: /')"
check "until then Nomad showed stage on cluster-b refused, naming the holder cluster-a ($(grep -c . <<<"$refusals") times)" \
  test -n "$refusals"
check "cluster-b's plugin logged the takeover" \
  eval '[ "$(logged b "$msg_taken")" -gt 0 ]'

check "it runs with the last copy: the files cluster-a had written, without /data/diverged" \
  same "$after3" "$(listed "$alloc" before)"
after4=$(listed "$alloc" after)
check_mounts "step 4, cluster-a lost" b a

start_client a
check "cluster-a's agent is back (same data_dir), its plugin healthy again" \
  wait_until 180 eval 'node_ready cluster-a && plugin_healthy 2 2'
# Nomad's client restores the allocation it ran before the kill and, its mount being gone,
# claims the volume again in its prerun hook: "volume max claims reached" (cluster-b holds it),
# retried every minute for 24 h although the server stopped that allocation, until the agent
# shuts down (client/allocrunner/csi_hook.go, claimWithRetry; the server logs GH-27324's lines).
# Pending on cluster-a, it keeps every later drain of cluster-a from completing for the job, and
# the drain of cluster-b after that one never moves the job: the drainer's job watcher still
# holds the job from the first drain, and registering it again does not wake it
# (nomad/drainer/watch_jobs.go, RegisterJobs). What an operator does about such an allocation:
# restart the agent once the stop has reached it; stopped, the restored allocation skips its
# prerun hooks and ends.
# lost_state: the allocation's client status and whether its stop reached the client.
lost_state() {
  nomad operator api "/v1/allocation/$lost_alloc" 2>/dev/null |
    jq -r '"\(.ClientStatus) \([.TaskStates[]?.Events[]?.Type] | any(. == "Killing"))"'
}
wait_until 120 eval 'case "$(lost_state)" in "pending true" | complete* | failed*) true ;; *) false ;; esac'
say "  the allocation cluster-a ran before the kill (${lost_alloc:0:8}), seen by its client again: $(lost_state)"
if [ "$(lost_state)" = "pending true" ]; then
  kill -INT "${agent_pid[a]}"
  wait_until 60 eval '! kill -0 "${agent_pid[a]}" 2>/dev/null' || kill -KILL "${agent_pid[a]}"
  start_client a
  check "cluster-a's agent restarted, as for any allocation Nomad left claiming after a crash" \
    wait_until 180 eval 'node_ready cluster-a && plugin_healthy 2 2'
fi
lost_ended() { case "$(lost_state)" in complete* | failed*) true ;; *) false ;; esac; }
wait_until 120 lost_ended
check "the allocation from before the kill has ended on cluster-a (client status: $(lost_state | cut -d' ' -f1))" \
  lost_ended
# The copy that diverged: still there (by guid), under another name, published nowhere.
by_guid() { zfs get -Hp -r -o name,value guid "${pool[a]}/nomad" | awk -v g="$1" '$2 == g {print $1}'; }
aside=$(by_guid "$live_guid")
check "cluster-a's diverged copy is not destroyed: ${aside:-<none>} (guid $live_guid)" test -n "$aside"
check "and not published: no mount on cluster-a uses it" \
  eval '! findmnt -rn -o SOURCE | sed "s/\[.*//" | grep -qxF "$aside"'

last4=$(last_write 4)
expect4=$(with "$after4" "$last4")
drain_to b a "after the job wrote /data/last-4: back to cluster-a"
check "it reads the current data (cluster-b's, /data/last-4 included), not the diverged copy" \
  same "$expect4" "$(listed "$alloc" before)"
check "cluster-a's plugin logged its copy set aside as diverged" \
  eval '[ "$(logged a "$msg_diverged")" -gt 0 ]'

aside_now=$(by_guid "$live_guid")
check "the diverged copy is set aside: ${aside_now:-<none>}, not the live copy, not mounted by CSI" eval '
  [ -n "$aside_now" ] && [ "$aside_now" != "$(findmnt -rn -o SOURCE,TARGET |
    awk -v t="$(staging_dir a)" "\$2 == t {sub(/\\[.*/, \"\", \$1); print \$1}")" ] &&
  ! findmnt -rn -o SOURCE | sed "s/\[.*//" | grep -qxF "$aside_now"'
check_mounts "step 4, cluster-a back" a b
nomad node drain -disable -yes "${node_id[b]}" >/dev/null 2>&1

# ---------------------------------------------------------------------------------------------
step "5. cluster-a drained while the store answers 503: the job ends on cluster-b only, nothing lost"

# What Nomad does meanwhile (client/allocrunner/csi_hook.go, Postrun): NodeUnstage on cluster-a
# fails (the plugin cannot store the final copy nor release), Nomad frees the claim all the same
# and retries the unstage in the background (1 s doubling to 1 min); the replacement on cluster-b
# gets the claim, its NodeStage fails, the allocation fails and is rescheduled every 5 s. What a
# correct plugin must make of it: cluster-a's copy unstaged and its lease kept (it still holds
# the volume), so that once the store answers again the retried NodeUnstage stores the last
# writes and releases, and cluster-b's next stage gets them, with no takeover.
#
# store_503s node method since: the plugin's calls of that method on that client, since that
# unix time, that failed naming the store's 503 (one JSON line each).
store_503s() {
  plugin_log "$1" | jq -c --arg m "$2" --argjson since "$3" 'select(.msg == "rpc" and
    .method == $m and .code != "OK" and ((.error // "") | test("\\b503\\b")) and
    (.ts | sub("\\.[0-9]+Z$"; "Z") | fromdate) >= $since)' 2>/dev/null
}
# calls_ok node method since: that client's calls of that method answered OK since that time.
calls_ok() {
  plugin_log "$1" | jq -c --arg m "$2" --argjson since "$3" 'select(.msg == "rpc" and
    .method == $m and .code == "OK" and (.ts | sub("\\.[0-9]+Z$"; "Z") | fromdate) >= $since)' \
    2>/dev/null
}
# met_503: cluster-a's NodeUnstage and cluster-b's NodeStage have both failed on the 503.
met_503() {
  [ -n "$(store_503s a NodeUnstageVolume "$t5")" ] && [ -n "$(store_503s b NodeStageVolume "$t5")" ]
}
running_writers() {
  nomad job allocs -json writer 2>/dev/null |
    jq -r '.[] | select(.ClientStatus == "running") | .NodeName' | sort | paste -sd ' '
}

check "the plugin is healthy on both clients" wait_until 180 plugin_healthy 2 2
released_a=$(logged a "$msg_released")
taken_b=$(logged b "$msg_taken")
last5=$(last_write 5)
expect5=$(with "$(listed "$alloc" after)" "$last5")
t5=$(date +%s)
errors_before=$(proxy_seen error)
check "the store proxy answers 503 ServiceUnavailable to every request from now on" proxy_fault 503
window_unmet=""
check "nomad node drain -enable cluster-a, right after the job wrote /data/last-5 (${last5:0:12}...)" \
  nomad node drain -enable -yes -detach "${drain_flags[@]}" "${node_id[a]}"
# The window lasts until both calls that matter met the 503 (bounded: Nomad reaches cluster-b's
# stage once cluster-a's first unstage failed and the claim was freed), and at least
# $window_min seconds, more than the lease's TTL (30 s): cluster-a cannot renew meanwhile, so
# when the store answers again the owner record's lease has run out by its holder's own stamp,
# and only cluster-b's own observation of it (the takeover rule) may decide.
window_min=45
if wait_until 240 met_503; then
  pass "within the window cluster-a's NodeUnstage and cluster-b's NodeStage failed on the 503 ($(($(date +%s) - t5))s)"
else
  fail "within 240 s cluster-a's NodeUnstage and cluster-b's NodeStage failed on the 503"
  window_unmet=1
fi
while [ $(($(date +%s) - t5)) -lt "$window_min" ]; do sleep 1; done
t5_healthy=$(date +%s)
check "the store proxy passes requests again, after $((t5_healthy - t5))s of 503 ($(($(proxy_seen error) - errors_before)) requests answered 503)" \
  proxy_fault pass
unstage_503=$(store_503s a NodeUnstageVolume "$t5")
stage_503=$(store_503s b NodeStageVolume "$t5")
say "  cluster-a: $(jq -r '"\(.method) \(.code): \(.error)"' <<<"$(head -1 <<<"$unstage_503")" | cut -c1-300)"
say "  cluster-b: $(jq -r '"\(.method) \(.code): \(.error)"' <<<"$(head -1 <<<"$stage_503")" | cut -c1-300)"
check "the plugins' logs show the 503s met: cluster-a's NodeUnstageVolume $(grep -c . <<<"$unstage_503") times, cluster-b's NodeStageVolume $(grep -c . <<<"$stage_503") times" \
  eval '[ -n "$unstage_503" ] && [ -n "$stage_503" ]'
[ -n "$window_unmet" ] && writer_failures
if wait_writer_on b 420; then
  pass "the writer runs on cluster-b (alloc ${alloc:0:8}), $(($(date +%s) - t5_healthy))s after the store answered again"
else
  fail "the writer runs on cluster-b within 420 s after the store answered again"
  writer_failures
fi
check "Nomad's retried NodeUnstage on cluster-a succeeded once the store answered ($(calls_ok a NodeUnstageVolume "$t5_healthy" | grep -c .) OK)" \
  eval '[ -n "$(calls_ok a NodeUnstageVolume "$t5_healthy")" ]'
check "it read every file cluster-a had, /data/last-5 included: nothing lost ($(wc -l <<<"$expect5") files)" \
  same "$expect5" "$(listed "$alloc" before)"
moved_cleanly "step 5" a b "$released_a" "$taken_b"

# ---------------------------------------------------------------------------------------------
step "5b. cluster-b drained while the store accepts requests and answers none: the job ends on cluster-a only, nothing lost"

# Nomad sends NodeUnstage with no deadline and frees the claim only once it answered, so the
# other client's stage waits for it. A correct plugin answers it only once the final copy is
# stored and the volume released (or fails it, and Nomad retries): never "released" while the
# store cannot have recorded it. The hang lasts until cluster-b's NodeUnstage waits on it, and at
# least $window_min s; then the held requests go on to versitygw, late.
# calls_since node method since: that client's calls of that method that ended since that time,
# as "start end code" (unix seconds, to the millisecond; the log's ts is toISOString's).
calls_since() {
  plugin_log "$1" | jq -r --arg m "$2" --argjson since "$3" 'select(.msg == "rpc" and
    .method == $m) | ((.ts[0:19] + "Z" | fromdate) + (.ts[20:23] | tonumber) / 1000) as $t |
    select($t >= $since) | "\($t - (.durationMs // 0) / 1000) \($t) \(.code)"' 2>/dev/null
}
stopped_on_b() {
  nomad operator api "/v1/allocation/$1" 2>/dev/null |
    jq -e '.ClientStatus == "complete" or .ClientStatus == "failed"' >/dev/null
}

check "the plugin is healthy on both clients" wait_until 180 plugin_healthy 2 2
released_b=$(logged b "$msg_released")
taken_a=$(logged a "$msg_taken")
last5b=$(last_write 5b)
expect5b=$(with "$(listed "$alloc" after)" "$last5b")
alloc_b=$alloc
held_before=$(proxy_seen hold)
t5b=$(date +%s)
check "the store proxy holds every request unanswered from now on" proxy_fault hold
check "nomad node drain -enable cluster-b, right after the job wrote /data/last-5b (${last5b:0:12}...)" \
  nomad node drain -enable -yes -detach "${drain_flags[@]}" "${node_id[b]}"
# hung: the job's allocation on cluster-b ended, its staging mount is gone (the plugin unmounts
# before it releases) and the proxy holds requests: the release waits on the store.
hung() {
  stopped_on_b "$alloc_b" && ! staged_rw b && [ "$(proxy_seen hold)" -gt "$held_before" ]
}
if wait_until 240 hung; then
  t_hung=$(date +%s)
  pass "cluster-b's job stopped and unstaged, its plugin's release waits on the store ($((t_hung - t5b))s)"
else
  t_hung=$(date +%s)
  fail "within 240 s cluster-b's job stopped and unstaged while the store hung"
fi
while [ $(($(date +%s) - t5b)) -lt "$window_min" ]; do sleep 1; done
held=$(($(proxy_seen hold) - held_before))
t5b_healthy=$(date +%s)
check "the store proxy forwards again, after $((t5b_healthy - t5b))s of holding requests ($held held)" \
  proxy_fault pass
if wait_writer_on a 420; then
  pass "the writer runs on cluster-a (alloc ${alloc:0:8}), $(($(date +%s) - t5b_healthy))s after the store answered again"
else
  fail "the writer runs on cluster-a within 420 s after the store answered again"
  writer_failures
fi
unstages=$(calls_since b NodeUnstageVolume "$t5b")
say "$(sed 's/^/  cluster-b NodeUnstageVolume (start end code): /' <<<"$unstages")"
# (t_hung is a whole second taken after the call began, so the call began before t_hung + 1.)
check "the plugin met the hang: cluster-b's NodeUnstage began before it ($t_hung) and answered OK only after the store answered again ($t5b_healthy)" \
  eval 'awk -v hung="$t_hung" -v h="$t5b_healthy" '\''NR == 1 && $1 < hung + 1 {began = 1}
    $3 == "OK" && $2 >= h {ok = 1} $3 == "OK" && $2 < h {early = 1}
    END {exit !(began && ok && !early)}'\'' <<<"$unstages"'
check "it read every file cluster-b had, /data/last-5b included: nothing lost ($(wc -l <<<"$expect5b") files)" \
  same "$expect5b" "$(listed "$alloc" before)"
moved_cleanly "step 5b" b a "$released_b" "$taken_a"

# ---------------------------------------------------------------------------------------------
step "6. grown with Nomad, snapshot restored from the store, deleted: copies left behind swept"

# h: the client that holds the volume now, o: the other one.
h=a
o=b

# copy_of node: that client's follow copy of the volume (the live dataset, not a set-aside one).
copy_of() { zfs list -H -o name -d 1 "${pool[$1]}/nomad" 2>/dev/null | grep -xF "${pool[$1]}/nomad/$vol"; }
# set_aside_of node guid: that client's dataset set aside as ".deleted-<time>-<vol>" with that guid.
set_aside_of() {
  zfs get -Hp -r -d 1 -o name,value guid "${pool[$1]}/nomad" 2>/dev/null |
    awk -v g="$2" -v v="$vol" '$2 == g && $1 ~ ("/\\.deleted-[0-9]+-" v "$") {print $1}'
}
capacity_of() { nomad volume status -json "$1" 2>/dev/null | jq -r .Capacity; }
grown=402653184 # 384 MiB, from 256 MiB
sed 's/^capacity_min = "256MiB"$/capacity_min = "384MiB"/' "$volume_spec" >"$tmp/volume-grown.hcl"
check "${node_name[$h]} holds the volume, its copy ${pool[$h]}/nomad/$vol at refquota 256 MiB" \
  same "$(copy_of "$h") 268435456" "${pool[$h]}/nomad/$vol $(zget refquota "$(copy_of "$h")")"
out=$(nomad volume create "$tmp/volume-grown.hcl" 2>&1)
code=$?
say "$(sed 's/^/  /' <<<"$out")"
check "nomad volume create again, capacity_min 384MiB: Nomad expands the volume (exit 0)" test "$code" -eq 0
check "NodeExpandVolume on the holder: ${node_name[$h]}'s copy has refquota $grown (384 MiB)" \
  same "$grown" "$(zget refquota "$(copy_of "$h")")"
check "nomad volume status: capacity $grown (was 256 MiB)" same "$grown" "$(capacity_of "$vol")"
check "the store's owner object records it (settings.capacityBytes)" \
  same "$grown" "$(owner_field .settings.capacityBytes)"

check "the plugin is healthy on both clients" wait_until 180 plugin_healthy 2 2
last6=$(last_write 6)
expect6=$(with "$(listed "$alloc" after)" "$last6")
drain_to "$h" "$o" "after the job wrote /data/last-6: the job moves to ${node_name[$o]}"
check "it read every file ${node_name[$h]} had, /data/last-6 included ($(wc -l <<<"$expect6") files)" \
  same "$expect6" "$(listed "$alloc" before)"
after6=$(listed "$alloc" after)
check "${node_name[$o]}'s copy got the size at NodeStage: refquota $grown" \
  same "$grown" "$(zget refquota "$(copy_of "$o")")"
check_mounts "step 6, grown" "$o" "$h"
nomad node drain -disable -yes "${node_id[$h]}" >/dev/null 2>&1

# A snapshot of a follow volume is its last copy in the store: stopping the job makes that copy
# hold the last write (the release at NodeUnstage stores a final one).
check "nomad job stop writer: ${node_name[$o]} releases the volume" \
  eval 'nomad job stop -purge writer >/dev/null'

check "no CSI mount left on either client, the store says released by ${node_name[$o]}" wait_until 60 eval '
  ! staged_rw a && ! staged_rw b &&
  [ "$(owner_field .holder)/$(owner_field .state)" = "${node_name[$o]}/released" ]'
out=$(nomad volume snapshot create "$vol" e2e-snap 2>&1)
say "$(sed 's/^/  /' <<<"$out")"
snap_id=$(awk '$1 ~ /^store:/ {print $1; exit}' <<<"$out")
check "nomad volume snapshot create $vol e2e-snap: snapshot id ${snap_id:-<none>} (store:$vol:<guid>)" \
  eval '[[ "$snap_id" =~ ^store:$vol:[0-9a-f]{16}$ ]]'
listing=$(nomad volume snapshot list -verbose -plugin "$plugin_id" 2>&1 | grep -F -- "$snap_id")
say "  ${listing:-<not listed>}"
check "nomad volume snapshot list -verbose -plugin $plugin_id lists it with the follow source $vol@*, ready" \
  eval 'awk -v id="$snap_id" -v src="$vol@*" '\''$1 == id && $2 == src && $NF == "true"'\'' <<<"$listing" | grep -q .'

restored=follow-restored
cat >"$tmp/restored.hcl" <<HCL
id           = "$restored"
name         = "$restored"
type         = "csi"
plugin_id    = "$plugin_id"
snapshot_id  = "$snap_id"
capacity_min = "512MiB"

capability {
  access_mode     = "single-node-writer"
  attachment_mode = "file-system"
}
HCL
out=$(nomad volume create "$tmp/restored.hcl" 2>&1)
code=$?
say "$(sed 's/^/  /' <<<"$out")"
check "nomad volume create $restored (an ordinary volume) from snapshot_id $snap_id" test "$code" -eq 0
restored_ds=""
for n in "${nodes[@]}"; do
  zfs list "${pool[$n]}/nomad/$restored" >/dev/null 2>&1 && restored_ds="${pool[$n]}/nomad/$restored"
done
say "  restored into ${restored_ds:-<no dataset>} (on the controller Nomad chose)"
mounted_here=""
if [ -n "$restored_ds" ] && [ "$(zget mounted "$restored_ds")" != yes ]; then
  zfs mount "$restored_ds" && mounted_here=1
fi
check "$restored_ds: an ordinary volume, refquota 536870912 (512 MiB)" \
  same "536870912" "$(zget refquota "$restored_ds")"
check "its files are the store's last copy: what the job on ${node_name[$o]} listed last ($(wc -l <<<"$after6") files)" \
  same "$after6" "$(files_at "$(zget mountpoint "$restored_ds")")"
[ -n "$mounted_here" ] && zfs unmount "$restored_ds"
check "nomad volume delete $restored (retried while zfs-fuse calls it busy)" \
  wait_until 30 nomad volume delete "$restored"
out=$(nomad volume snapshot delete "$plugin_id" "$snap_id" 2>&1)
check "nomad volume snapshot delete $plugin_id $snap_id" test $? -eq 0
[ -n "$out" ] && say "  $out"
# On the head's chain it is unpinned, not removed (the next stage receives that chain).
check "it is unpinned: its manifest in the store is kind scheduled again" \
  same scheduled "$(jq -r .kind "$store_vol/snapshots/${snap_id##*:}.json" 2>/dev/null)"

# The sweep: DeleteVolume runs on one controller and sets aside that node's copy; the other
# client finds its copy's owner object "deleted" at its next sweep (--standby-interval).
declare -A guid_before
for n in "${nodes[@]}"; do guid_before[$n]=$(zget guid "$(copy_of "$n")"); done
check "both clients keep a copy before the delete (guids ${guid_before[a]:-<none>}, ${guid_before[b]:-<none>})" \
  test -n "${guid_before[a]}" -a -n "${guid_before[b]}"
t_del=$(date +%s)
check "nomad volume delete $vol (the job stopped)" wait_until 30 nomad volume delete "$vol"
check "the store's owner object says deleted" same deleted "$(owner_field .state)"
# set_aside_both: on both clients the copy is gone under its name and there, by guid, set aside.
set_aside_both() {
  local n
  for n in "${nodes[@]}"; do
    [ -z "$(copy_of "$n")" ] && [ -n "$(set_aside_of "$n" "${guid_before[$n]}")" ] || return 1
  done
}
sweep_limit=$((sweep_secs * 2 + 15))
wait_until "$sweep_limit" set_aside_both
for n in "${nodes[@]}"; do
  aside=$(set_aside_of "$n" "${guid_before[$n]}")
  check "within ${sweep_limit}s ${node_name[$n]}'s copy is set aside (same guid), unmounted: ${aside:-<not found>}" \
    eval '[ -z "$(copy_of "$n")" ] && [ -n "$aside" ] && [ "$(zget mounted "$aside")" = no ]'
done
say "  both copies set aside $(($(date +%s) - t_del))s after the delete"
swept=$(for n in "${nodes[@]}"; do [ "$(logged "$n" "$msg_swept")" -gt 0 ] && echo "${node_name[$n]}"; done)
check "one client's copy went by the sweep: its plugin logged \"$msg_swept\" (${swept:-none})" \
  eval '[ "$(grep -c . <<<"$swept")" = 1 ]'

# ---------------------------------------------------------------------------------------------
step "7. throughout"

check "never two clients with the volume staged read-write at once ($(samples) samples of the mount table)" \
  never_both
outside_after=$(outside_state)
check "nothing outside the parent datasets changed (both pools, $(wc -l <<<"$outside_before") lines)" \
  same "$outside_before" "$outside_after" ||
  diff <(echo "$outside_before") <(echo "$outside_after") | sed "s/^/  /"
