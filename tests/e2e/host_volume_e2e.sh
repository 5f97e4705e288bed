#!/usr/bin/env bash
# End-to-end proof of zfs-csi as a Nomad dynamic host volume plugin, under real Nomad agents:
# the client fingerprints the plugin, `nomad volume create` of a `type = "host"` volume (from
# nomad/host-volume-create.hcl) makes its dataset, a job writes and a second job reads the same
# bytes, re-running create grows it, a shrink is refused, the same volume name in a second
# namespace gets its own dataset, and `nomad volume delete` sets the datasets aside. Every check
# prints one line; the last line is
#   host-volume-e2e: N checks passed, N failed (Nomad vX.Y.Z)
# and the exit code is non-zero if any check failed.
#
#   flock /var/cache/zfs-csi/nomad-run.lock tests/e2e/host_volume_e2e.sh     # as root
#   ZFS_CSI_NOMAD_VERSION=1.10.5 flock /var/cache/zfs-csi/nomad-run.lock tests/e2e/host_volume_e2e.sh
#
# What runs where:
#   - a Nomad dev agent (server and client "hv-a") and a second client agent ("hv-b") on
#     127.0.0.1, free non-default ports, data dirs in a temporary directory: Nomad allows one
#     volume of a name per node, whatever the namespace, so the second namespace's volume of the
#     same name goes to the second node; both nodes use the same parent dataset;
#   - the plugin: installed as docs/host-volumes.md says, in one step: a symlink named "zfs" in each
#     client's host_volume_plugin_dir to the binary, with no wrapper and no PATH (Nomad runs
#     plugins with only DHV_* set). "deno compile" cannot run here, so the binary is stood in
#     for by the script tests/e2e/lib.sh plugin_wrapper writes: it execs main.ts under the
#     pinned Deno with the production permission flags (src/permissions.ts) and sets no PATH;
#     the plugin's flags come from zfs-csi.conf next to it;
#   - the application jobs with the exec driver, as the user nobody (the test hands the volume's
#     root directory to nobody, as an operator would).
# Environment: ZFS_CSI_NOMAD_VERSION (default 1.11.3; also 1.10.5), ZFS_CSI_CACHE (Nomad build
# cache, default /var/cache/zfs-csi), E2E_KEEP=1 keeps the temporary directory's logs.
set -uo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
here="$root/tests/e2e"
started_at=$(date +%s)
passed=0
failed=0

# say, step, pass, fail, check, same, wait_until, free_ports, plugin_wrapper,
# chroot_env_entries, pids_of: shared with nomad_e2e.sh.
# shellcheck source=tests/e2e/lib.sh
. "$here/lib.sh"

if [ "$(id -u)" != 0 ]; then
  say "host-volume-e2e: needs root (zpool create, mounts, the Nomad client)" >&2
  exit 1
fi

step "setup"
"$root/tools/zfs-env.sh" ensure || abort "zfs answers (tools/zfs-env.sh ensure)"
nomad_bin=$("$here/nomad_install.sh") || abort "Nomad built or found in the cache"
nomad_version=$("$nomad_bin" version | head -1)
say "nomad: $nomad_bin ($nomad_version)"

tmp=$(mktemp -d /tmp/zfs-csi-hv-e2e.XXXXXX)
pool="zcsihv$$"
parent="$pool/hv"
agent_pid=""
client_pid=""
nomad() { "$nomad_bin" "$@"; }
our_pids() { pids_of "$tmp/" "$tmp/a" "$tmp/b"; }

cleanup() {
  local code=$?
  trap - EXIT INT TERM
  step "cleanup"
  if [ -n "$agent_pid" ] && kill -0 "$agent_pid" 2>/dev/null; then
    local ns job vol
    for ns in default prod; do
      for job in $(NOMAD_NAMESPACE=$ns nomad job status -short 2>/dev/null | awk 'NR > 1 {print $1}'); do
        NOMAD_NAMESPACE=$ns nomad job stop -purge "$job" >/dev/null 2>&1
      done
      for vol in $(NOMAD_NAMESPACE=$ns nomad volume status -type host -json 2>/dev/null | jq -r '.[]?.ID'); do
        say "  host volume $vol (namespace $ns) was left: nomad volume delete"
        NOMAD_NAMESPACE=$ns wait_until 30 nomad volume delete -type host "$vol"
      done
    done
  fi
  for pid in $client_pid $agent_pid; do kill -INT "$pid" 2>/dev/null; done
  for _ in $(seq 1 30); do
    kill -0 "$agent_pid" 2>/dev/null || kill -0 "$client_pid" 2>/dev/null || break
    sleep 1
  done
  for pid in $client_pid $agent_pid $(our_pids); do kill -KILL "$pid" 2>/dev/null; done
  finish_run host-volume-e2e "$pool"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

truncate -s 512M "$tmp/pool.img"
zpool create -m "$tmp/zfs" "$pool" "$tmp/pool.img" || abort "pool $pool created"
zfs create "$parent" || abort "parent dataset $parent created"
say "pool: $pool on $tmp/pool.img, parent dataset $parent"

zget() { zfs get -Hp -o value "$1" "$2" 2>/dev/null; }
zexists() { zfs list -H -o name "$1" >/dev/null 2>&1; }

# -- the plugin: the binary (main.ts with the production flags) symlinked into each plugin dir
plugin_wrapper "$tmp/bin/zfs-csi" "$root" "$tmp/a/plugins:$tmp/b/plugins" "" "" ||
  abort "permission flags read from src/permissions.ts"
for node in a b; do
  mkdir -p "$tmp/$node/plugins" "$tmp/$node/volumes"
  ln -s "$tmp/bin/zfs-csi" "$tmp/$node/plugins/zfs"
  sed "s|^--parent-dataset tank/nomad$|--parent-dataset $parent|; s|^--log-level info$|--log-level debug|" \
    "$root/nomad/host-volume-zfs-csi.conf" >"$tmp/$node/plugins/zfs-csi.conf"
done
check "the plugin file is a symlink to the binary's stand-in, which sets no PATH" \
  test "$(readlink "$tmp/a/plugins/zfs")" = "$tmp/bin/zfs-csi" -a \
  -z "$(grep -E '(^|[^_])PATH=|export PATH' "$tmp/bin/zfs-csi")"
check "the stand-in runs main.ts with --allow-run of absolute paths only" \
  grep -qE -- "--allow-run=/[^ ,]+(,/[^ ,]+)* " "$tmp/bin/zfs-csi"
check "zfs-csi.conf from nomad/host-volume-zfs-csi.conf names the parent dataset" \
  grep -qx -- "--parent-dataset $parent" "$tmp/a/plugins/zfs-csi.conf"
fp=$(env -i DHV_OPERATION=fingerprint "$tmp/a/plugins/zfs" fingerprint)
check "fingerprint by hand, with Nomad's empty environment (env -i): {\"version\":\"0.1.0\"}" \
  same "$fp" '{"version":"0.1.0"}'
# create and delete by hand with only Nomad's variables: zfs runs with no PATH to find it by.
by_hand_id=00000000-0000-4000-8000-00000000e2e0
by_hand() { # operation
  env -i DHV_OPERATION="$1" DHV_VOLUMES_DIR="$tmp/a/volumes" DHV_PLUGIN_DIR="$tmp/a/plugins" \
    DHV_NODE_POOL=default DHV_NAMESPACE=default DHV_VOLUME_NAME=by-hand DHV_VOLUME_ID="$by_hand_id" \
    DHV_NODE_ID=by-hand DHV_CAPACITY_MIN_BYTES=16777216 DHV_CAPACITY_MAX_BYTES=0 DHV_PARAMETERS='{}' \
    DHV_CREATED_PATH="$tmp/a/volumes/$by_hand_id" "$tmp/a/plugins/zfs" "$1" 2>"$tmp/by-hand-$1.log"
}
by_hand_created() {
  same "$(by_hand create)" "{\"path\":\"$tmp/a/volumes/$by_hand_id\",\"bytes\":16777216}" &&
    [ "$(zget mounted "$parent/.host-default_by-hand")" = yes ]
}
check "create by hand, env -i: the dataset is made and mounted (zfs found without PATH)" \
  by_hand_created
by_hand_deleted() {
  local out
  out=$(by_hand delete) && [ -z "$out" ] && ! zexists "$parent/.host-default_by-hand" &&
    zfs list -H -o name -r -d 1 "$parent" | grep -qF -- "-.host-default_by-hand"
}
check "delete by hand, env -i: the dataset is set aside" by_hand_deleted

# -- the agents
base=$(free_ports 6) || abort "six free ports"
export NOMAD_ADDR="http://127.0.0.1:$base"
export NOMAD_CLI_SHOW_HINTS=false
chroot_entries=$(chroot_env_entries sh head sha256sum cat)
client_block() { # node-dir
  cat <<EOF
  host_volume_plugin_dir = "$tmp/$1/plugins"
  host_volumes_dir       = "$tmp/$1/volumes"
  options {
    "driver.allowlist"     = "exec"
    "fingerprint.denylist" = "env_aws,env_gce,env_azure,env_digitalocean,consul,vault"
  }
  chroot_env {
$chroot_entries
  }
EOF
}
cat >"$tmp/a.hcl" <<EOF
name      = "hv-a"
data_dir  = "$tmp/a/data"
bind_addr = "127.0.0.1"
ports {
  http = $base
  rpc  = $((base + 1))
  serf = $((base + 2))
}
client {
$(client_block a)
}
EOF
# A second agent on this machine: its own ports and cgroup parent, loopback advertised.
cat >"$tmp/b.hcl" <<EOF
name      = "hv-b"
data_dir  = "$tmp/b/data"
bind_addr = "127.0.0.1"
advertise {
  http = "127.0.0.1"
  rpc  = "127.0.0.1"
  serf = "127.0.0.1"
}
ports {
  http = $((base + 3))
  rpc  = $((base + 4))
  serf = $((base + 5))
}
disable_update_check = true
client {
  enabled       = true
  servers       = ["127.0.0.1:$((base + 1))"]
  cgroup_parent = "nomad-hv-b.slice"
$(client_block b)
}
EOF
env -u AWS_CA_BUNDLE "$nomad_bin" agent -dev -config "$tmp/a.hcl" >"$tmp/agent-a.log" 2>&1 &
agent_pid=$!
# node_attr node attribute: the node's attribute, as the servers have it.
node_id_of() { nomad node status -json 2>/dev/null | jq -r --arg n "$1" '.[] | select(.Name == $n and .Status == "ready") | .ID'; }
node_attr() { nomad node status -json "$(node_id_of "$1")" 2>/dev/null | jq -r --arg a "$2" '.Attributes[$a] // empty'; }
a_ready() { [ -n "$(node_id_of hv-a)" ]; }
wait_until 90 a_ready || abort "dev agent hv-a up on $NOMAD_ADDR (log: $tmp/agent-a.log)"
env -u AWS_CA_BUNDLE "$nomad_bin" agent -config "$tmp/b.hcl" >"$tmp/agent-b.log" 2>&1 &
client_pid=$!
b_ready() { [ -n "$(node_id_of hv-b)" ]; }
wait_until 90 b_ready || abort "client hv-b up (log: $tmp/agent-b.log)"
pass "agents up: server and client hv-a on $NOMAD_ADDR, client hv-b"
for node in hv-a hv-b; do
  check "$node fingerprinted the plugin: plugins.host_volume.zfs.version = 0.1.0" \
    same "$(node_attr "$node" plugins.host_volume.zfs.version)" "0.1.0"
done

# ---------------------------------------------------------------------------------------------
step "nomad volume create (type host) from nomad/host-volume-create.hcl"

spec() { # out name namespace capacity_min [id]
  sed -e "s/^name      = \"app-data\"/name      = \"$2\"/" \
    -e "s/^namespace = \"default\"/namespace = \"$3\"/" \
    -e "s/^capacity_min = \"10GiB\"/capacity_min = \"$4\"/" \
    -e 's/^capacity_max = "50GiB"/capacity_max = "1GiB"/' \
    -e 's/compression = "lz4"/compression = "on"/' \
    ${5:+-e "s/^# id = .*/id = \"$5\"/"} \
    "$root/nomad/host-volume-create.hcl" >"$1"
}
spec "$tmp/create.hcl" app-data default 64MiB
# Pinned to hv-a: without node_id the server takes any feasible node, and the checks below (and a
# CI run in which it picked hv-b) need to know which.
echo "node_id = \"$(node_id_of hv-a)\"" >>"$tmp/create.hcl"
check "the spec is the shipped one with sizes edited (zfs-fuse has no lz4)" \
  grep -q '^capacity_min = "64MiB"' "$tmp/create.hcl"
out=$(nomad volume create -detach "$tmp/create.hcl" 2>&1)
say "  $out"
vol_json() { NOMAD_NAMESPACE=${2:-default} nomad volume status -type host -json 2>/dev/null | jq -c --arg n "$1" '[.[] | select(.Name == $n)][0] // empty'; }
vol_id=$(vol_json app-data | jq -r '.ID // empty')
check "nomad volume create succeeded and Nomad lists the volume (id $vol_id)" test -n "$vol_id"
vol_ready() { [ "$(vol_json "$1" "${2:-default}" | jq -r .State)" = ready ]; }
check "the volume becomes ready" wait_until 60 vol_ready app-data
vol_full() { NOMAD_NAMESPACE=${2:-default} nomad volume status -type host -json "$1" 2>/dev/null; }
ds="$parent/.host-default_app-data"
path="$tmp/a/volumes/$vol_id"
check "dataset $ds exists with refquota 64MiB and the managed marker" \
  test "$(zget refquota "$ds"):$(zget org.zfs-csi:managed "$ds")" = "67108864:yes"
check "it records Nomad's volume id and namespace" \
  test "$(zget org.zfs-csi:host-volume-id "$ds"):$(zget org.zfs-csi:host-namespace "$ds")" = "$vol_id:default"
check "the parameters were applied (compression=on, recordsize=16K)" \
  test "$(zget compression "$ds") $(zget recordsize "$ds")" = "on 16384"
check "it is mounted at <host_volumes_dir of hv-a>/<volume id>" \
  test "$(zget mountpoint "$ds"):$(zget mounted "$ds")" = "$path:yes"
check "Nomad recorded the host path and 64MiB" \
  test "$(vol_full "$vol_id" | jq -r '"\(.HostPath) \(.CapacityBytes)"')" = "$path 67108864"
check "Nomad placed it on hv-a" same "$(vol_full "$vol_id" | jq -r .NodeID)" "$(node_id_of hv-a)"
chown 65534:65534 "$path" # as an operator would, for an app that runs as nobody

# ---------------------------------------------------------------------------------------------
step "a job writes, a second job reads the same bytes"

app_job() { # file job-id mode
  local script
  if [ "$3" = write ]; then
    script='head -c 1048576 /dev/urandom > /data/payload && sha256sum /data/payload'
  else
    script='sha256sum /data/payload'
  fi
  cat >"$1" <<EOF
job "$2" {
  type = "batch"
  group "app" {
    volume "data" {
      type            = "host"
      source          = "app-data"
      access_mode     = "single-node-writer"
      attachment_mode = "file-system"
      sticky          = true
    }
    restart {
      attempts = 0
      mode     = "fail"
    }
    reschedule {
      attempts  = 0
      unlimited = false
    }
    task "app" {
      driver = "exec"
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
        memory = 32
      }
    }
  }
}
EOF
}
alloc_of() { nomad job allocs -json "$1" 2>/dev/null | jq -r '.[0].ID // empty'; }
alloc_is() { [ "$(nomad alloc status -json "$(alloc_of "$1")" 2>/dev/null | jq -r .ClientStatus)" = "$2" ]; }
job_sum() { nomad alloc logs "$(alloc_of "$1")" app 2>/dev/null | awk '/\/data\/payload$/ {print $1}'; }
run_job() { # job-id mode
  app_job "$tmp/$1.nomad.hcl" "$1" "$2"
  nomad job run -detach "$tmp/$1.nomad.hcl" >/dev/null || return 1
  wait_until 180 eval "alloc_is $1 complete || alloc_is $1 failed" && alloc_is "$1" complete
}
check "job hv-write ran to completion on the host volume" run_job hv-write write
written=$(job_sum hv-write)
check "job hv-read ran to completion on the same volume" run_job hv-read read
check "hv-read read the bytes hv-write wrote ($written)" same "$(job_sum hv-read)" "$written"
check "the bytes are in the dataset on the host" \
  same "$(sha256sum "$path/payload" 2>/dev/null | awk '{print $1}')" "$written"
check "both ran on hv-a" \
  test "$(nomad alloc status -json "$(alloc_of hv-read)" | jq -r .NodeID)" = "$(node_id_of hv-a)"
for job in hv-write hv-read; do nomad job stop -purge "$job" >/dev/null 2>&1; done
no_claims() { [ "$(vol_full "$vol_id" | jq '.Allocations | length')" = 0 ]; }
wait_until 60 no_claims || say "  note: the volume still lists allocations"

# ---------------------------------------------------------------------------------------------
step "growing by re-running create; a shrink is refused"

spec "$tmp/grow.hcl" app-data default 96MiB "$vol_id"
out=$(nomad volume create -detach "$tmp/grow.hcl" 2>&1)
check "nomad volume create with id $vol_id and capacity_min 96MiB succeeds" test $? -eq 0
say "  $out"
check "refquota is 96MiB" same "$(zget refquota "$ds")" 100663296
check "Nomad recorded 96MiB" same "$(vol_full "$vol_id" | jq -r .CapacityBytes)" 100663296
check "the data is still there" same "$(sha256sum "$path/payload" 2>/dev/null | awk '{print $1}')" "$written"
spec "$tmp/shrink.hcl" app-data default 32MiB "$vol_id"
sed -i 's/^capacity_max = "1GiB"/capacity_max = "48MiB"/' "$tmp/shrink.hcl"
out=$(nomad volume create -detach "$tmp/shrink.hcl" 2>&1)
code=$?
say "  $(head -c 600 <<<"$out")"
# Nomad refuses it itself ("cannot be less than existing provisioned capacity"); the plugin's own
# refusal of a shrink is in tests/integration/dhv_plugin_test.ts.
check "a create with capacity_max 48MiB is refused" test "$code" -ne 0
check "refquota stays 96MiB" same "$(zget refquota "$ds")" 100663296

spec "$tmp/bad.hcl" bad-params default 64MiB
sed -i 's/^  recordsize  = "16K"/  sharenfs    = "on"/' "$tmp/bad.hcl"
out=$(nomad volume create -detach "$tmp/bad.hcl" 2>&1)
code=$?
say "  $(head -c 600 <<<"$out")"
check "a volume with a parameter outside the allowlist is refused, with the plugin's message" \
  eval '[ "$code" -ne 0 ] && grep -qF "exit status 2: Parameter \"sharenfs\" is not supported" <<<"$out"'
check "and leaves no dataset" eval '! zexists "$parent/.host-default_bad-params"'

# ---------------------------------------------------------------------------------------------
step "the same volume name in namespace prod"

nomad namespace apply -description "host volume e2e" prod >/dev/null || fail "namespace prod created"
spec "$tmp/prod.hcl" app-data prod 32MiB
out=$(nomad volume create -detach "$tmp/prod.hcl" 2>&1)
say "  $out"
prod_id=$(vol_json app-data prod | jq -r '.ID // empty')
check "nomad volume create app-data in namespace prod (id $prod_id)" test -n "$prod_id"
check "it becomes ready" wait_until 60 vol_ready app-data prod
prod_ds="$parent/.host-prod_app-data"
check "a second dataset $prod_ds, recording namespace prod and its own id" \
  test "$(zget org.zfs-csi:host-namespace "$prod_ds"):$(zget org.zfs-csi:host-volume-id "$prod_ds")" = "prod:$prod_id"
check "Nomad placed it on hv-b (one volume of a name per node)" \
  same "$(vol_full "$prod_id" prod | jq -r .NodeID)" "$(node_id_of hv-b)"
check "the default namespace's dataset is unchanged" same "$(zget org.zfs-csi:host-volume-id "$ds")" "$vol_id"
check "the prod volume is empty (no payload)" test ! -e "$tmp/b/volumes/$prod_id/payload"

# ---------------------------------------------------------------------------------------------
step "a client restart after a reboot: Nomad runs create again, which mounts the volume"

zfs unmount "$prod_ds" || fail "unmount $prod_ds (as after a reboot with canmount off)"
check "the prod dataset is not mounted before the restart" same "$(zget mounted "$prod_ds")" no
kill -INT "$client_pid" 2>/dev/null
for _ in $(seq 1 30); do kill -0 "$client_pid" 2>/dev/null || break; sleep 1; done
env -u AWS_CA_BUNDLE "$nomad_bin" agent -config "$tmp/b.hcl" >>"$tmp/agent-b.log" 2>&1 &
client_pid=$!
prod_mounted() { [ "$(zget mounted "$prod_ds")" = yes ]; }
check "after hv-b restarts, the prod dataset is mounted at its path again" wait_until 90 prod_mounted
check "at <host_volumes_dir of hv-b>/<volume id>" same "$(zget mountpoint "$prod_ds")" "$tmp/b/volumes/$prod_id"
check "the volume is ready again" wait_until 60 vol_ready app-data prod

# ---------------------------------------------------------------------------------------------
step "nomad volume delete sets the datasets aside"

aside_of() { zfs list -H -o name -r -d 1 "$parent" | grep -F "/.deleted-" | grep -F -- "-.host-$1_app-data" | head -1; }
check "nomad volume delete $vol_id" nomad volume delete -type host "$vol_id"
check "dataset $ds is gone from its name" eval '! zexists "$ds"'
aside=$(aside_of default)
check "it is set aside as $aside, with its old name recorded" \
  same "$(zget org.zfs-csi:deleted-name "$aside")" "$ds"
check "the set-aside dataset is unmounted and not mounted at boot" \
  test "$(zget mounted "$aside"):$(zget canmount "$aside")" = "no:noauto"
check "the data is still in it (undo: zfs rename back)" \
  same "$(zfs get -Hp -o value used "$aside" 2>/dev/null | awk '$1 > 1000000 {print "data"}')" data
check "Nomad no longer lists it" test -z "$(vol_json app-data)"
check "nomad volume delete (namespace prod)" env NOMAD_NAMESPACE=prod "$nomad_bin" volume delete -type host "$prod_id"
check "the prod dataset is set aside too" test -n "$(aside_of prod)"
check "nothing else below $parent" \
  test -z "$(zfs list -H -o name -r -d 1 "$parent" | grep -v -e "^$parent\$" -e '/\.deleted-')"
