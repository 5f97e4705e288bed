#!/usr/bin/env bash
# Runs the CSI conformance suite (csi-sanity, pinned below) against the plugin, started exactly as
# it ships: main.ts under `deno run` with the production permission flags, in monolith mode, on a
# throw-away zfs pool on a sparse file. Then checks what the run left behind: nothing mounted
# below the plugin's directory and, below the parent dataset, only what deletes set aside.
# Ends with "csi-sanity: N passed, N failed, N skipped, N pending"; exits non-zero on any failure.
# Needs root and ZFS (tools/zfs-env.sh ensure), and Go to build csi-sanity once (tools/go.sh
# finds or fetches it): where no Go can be had it prints "csi-sanity: not run: ..." and exits 0.
# Environment: CSI_SANITY_CACHE (where built csi-sanity binaries are kept, default
# /var/cache/zfs-csi), CSI_SANITY_ARGS (extra csi-sanity/ginkgo flags, e.g. -ginkgo.v, or
# -csi.testvolumeaccesstype block), CSI_SANITY_PLUGIN_ARGS (extra plugin flags, e.g.
# --block-volumes), CSI_SANITY_POOL_MIB (the pool's size, 512; zvols reserve their whole size).
set -euo pipefail

# The one place the suite's version is pinned.
CSI_SANITY_MODULE=github.com/kubernetes-csi/csi-test/v5
CSI_SANITY_VERSION=v5.6.0
CSI_SANITY_GO_MIN=1.25 # the go line of its go.mod

# Volumes are small: the pool is a sparse file, and up to 8 volumes live at once.
VOLUME_SIZE=$((64 * 1024 * 1024))
EXPAND_SIZE=$((128 * 1024 * 1024))
POOL_SIZE_MIB=${CSI_SANITY_POOL_MIB:-512}

cd "$(dirname "${BASH_SOURCE[0]}")/../.."
root=$PWD
deno="$root/tools/deno"

say() { echo "csi-sanity: $*" >&2; }

# Builds csi-sanity into a cache outside the repo once per version; later runs reuse it.
ensure_csi_sanity() {
  local cache="${CSI_SANITY_CACHE:-/var/cache/zfs-csi}/csi-sanity-$CSI_SANITY_VERSION"
  CSI_SANITY_BIN="$cache/csi-sanity"
  [ -x "$CSI_SANITY_BIN" ] && return 0
  local go
  # A recent enough Go, bootstrapped from the Go module proxy where there is none (tools/go.sh).
  # Where even that fails (no network, no apt-get), it says so and runs nothing.
  if ! go=$(ZFS_CSI_GO_MIN="$CSI_SANITY_GO_MIN" "$root/tools/go.sh"); then
    echo "csi-sanity: not run: building csi-sanity $CSI_SANITY_VERSION needs Go" \
      "$CSI_SANITY_GO_MIN+, and tools/go.sh could not find or fetch one (see above)"
    exit 0
  fi
  say "building csi-sanity $CSI_SANITY_VERSION into $cache (once)"
  mkdir -p "$cache"
  local build
  build=$(mktemp -d "$cache/build.XXXXXX")
  # go install pkg@version builds with the module's own go.mod and go.sum, ignoring ours.
  if ! GOBIN="$build" GOTOOLCHAIN=local GOFLAGS=-buildvcs=false \
    "$go" install "$CSI_SANITY_MODULE/cmd/csi-sanity@$CSI_SANITY_VERSION" >&2; then
    rm -rf "$build"
    return 1
  fi
  mv "$build/csi-sanity" "$CSI_SANITY_BIN"
  rm -rf "$build"
}

# Mount points below $1, deepest first (the mount table via `mount`, like the plugin reads it).
mounts_below() {
  mount | sed -n 's/^.* on \(.*\) type [^ ]* (.*)$/\1/p' | awk -v p="$1/" 'index($0, p) == 1' |
    sort -r
}

ensure_csi_sanity

pool="zcsisan$$x$RANDOM"
parent="$pool/nomad"
dir=$(mktemp -d "${TMPDIR:-/tmp}/zfs-csi-sanity.XXXXXX")
csi="$dir/csi"       # the only directory the plugin may read and write
base="$csi/base"     # its --stage-publish-base-dir; csi-sanity's mount and staging dirs go here
plugin_log="$dir/plugin.log"
plugin_pid=""
sanity_pid=""
pool_created=""

cleanup() {
  local status=$?
  set +e
  if [ -n "$sanity_pid" ]; then
    kill -TERM "$sanity_pid" 2>/dev/null
    wait "$sanity_pid" 2>/dev/null
  fi
  if [ -n "$plugin_pid" ]; then
    kill -TERM "$plugin_pid" 2>/dev/null
    wait "$plugin_pid" 2>/dev/null
  fi
  if [ "$status" -ne 0 ] && [ -s "$plugin_log" ]; then
    local kept="${TMPDIR:-/tmp}/zfs-csi-sanity-plugin.$$.log"
    cp "$plugin_log" "$kept" && say "plugin log kept in $kept"
  fi
  # What a failed run left mounted in the plugin's directory; the pool's own mounts go with it.
  for m in $(mounts_below "$csi"); do umount "$m"; done
  if [ -n "$pool_created" ]; then
    for _ in $(seq 1 20); do
      out=$(zpool destroy -f "$pool" 2>&1) && break
      grep -q "no such pool" <<<"$out" && break
      sleep 0.25
    done
  fi
  if [ -n "$(mounts_below "$dir")" ]; then
    say "still mounted below $dir, not removing it:"
    mounts_below "$dir" >&2
  else
    rm -rf "$dir"
  fi
  exit "$status"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

SECONDS=0
truncate -s "${POOL_SIZE_MIB}M" "$dir/pool.img"
zpool create -m "$dir/zfs" "$pool" "$dir/pool.img"
pool_created=yes
zfs create "$parent"
mkdir -p "$base"

# A plugin started with --block-volumes needs a block build's flags (it refuses to start without).
block_build=()
case " ${CSI_SANITY_PLUGIN_ARGS:-} " in *" --block-volumes "*) block_build=(--block-volumes) ;; esac
mapfile -t flags < <("$deno" run --frozen --quiet tests/conformance/plugin_flags.ts "$csi" \
  ${block_build[@]+"${block_build[@]}"})
# --node-local-plugin-id as the shipped monolith jobs run it: csi-sanity talks to one plugin and
# sends ids without "@<node>" (reallyfakevolumeid) to DeleteVolume and CreateSnapshot.
# shellcheck disable=SC2086 # CSI_SANITY_PLUGIN_ARGS is a list of flags
"$deno" run --quiet --frozen "${flags[@]}" main.ts \
  --parent-dataset "$parent" \
  --node-id sanity-node \
  --node-local-plugin-id \
  --endpoint "unix://$csi/csi.sock" \
  --stage-publish-base-dir "$base" \
  --log-level info \
  ${CSI_SANITY_PLUGIN_ARGS:-} \
  2>"$plugin_log" &
plugin_pid=$!

# Serving once the socket exists (csi-sanity's own connect then waits for it to answer).
for _ in $(seq 1 200); do
  [ -S "$csi/csi.sock" ] && break
  if ! kill -0 "$plugin_pid" 2>/dev/null; then
    say "plugin exited at start:"
    cat "$plugin_log" >&2
    exit 1
  fi
  sleep 0.1
done
[ -S "$csi/csi.sock" ] || { say "plugin did not create its socket"; exit 1; }

# csi-sanity runs as a direct child in the background, so a signal to this script stops it too
# (the trap runs during `wait`, not only after the suite ends); tail shows its output live.
sanity_out="$dir/sanity.out"
: >"$sanity_out"
# shellcheck disable=SC2086 # CSI_SANITY_ARGS is a list of flags
"$CSI_SANITY_BIN" \
  -csi.endpoint "unix://$csi/csi.sock" \
  -csi.mountdir "$base/mount" \
  -csi.stagingdir "$base/staging" \
  -csi.testvolumesize "$VOLUME_SIZE" \
  -csi.testvolumeexpandsize "$EXPAND_SIZE" \
  -ginkgo.no-color \
  -ginkgo.timeout 15m \
  ${CSI_SANITY_ARGS:-} >"$sanity_out" 2>&1 &
sanity_pid=$!
tail -n +1 -f --pid="$sanity_pid" "$sanity_out" &
tail_pid=$!
sanity_status=0
wait "$sanity_pid" || sanity_status=$?
sanity_pid=""
wait "$tail_pid" || true

# Ginkgo's summary: "Ran N of M Specs in S seconds" and "SUCCESS! -- P Passed | F Failed | ...".
ran=$(grep -E '^Ran [0-9]+ of [0-9]+ Specs' "$sanity_out" | tail -n 1 || true)
summary=$(grep -E '[0-9]+ Passed \| [0-9]+ Failed \| [0-9]+ Pending \| [0-9]+ Skipped' \
  "$sanity_out" | tail -n 1 || true)
count() { sed -n "s/.*\b\([0-9]\+\) $1.*/\1/p" <<<"$summary"; }
passed=$(count Passed)
failed=$(count Failed)
pending=$(count Pending)
skipped=$(count Skipped)

# Leftovers. Deleted volumes and snapshots are set aside as .deleted-* (kept for the retention);
# anything else below the parent, or any mount in the plugin's directory, was leaked.
problems=0
leaked_mounts=$(mounts_below "$csi")
if [ -n "$leaked_mounts" ]; then
  say "left mounted after the run:"
  echo "$leaked_mounts" >&2
  problems=1
fi
leaked_paths=$(find "$base" -mindepth 1 2>/dev/null || true)
if [ -n "$leaked_paths" ]; then
  say "left in the staging/publish base directory:"
  echo "$leaked_paths" >&2
  problems=1
fi
all=$(zfs list -H -r -t all -o name "$parent" | tail -n +2)
set_aside=$(grep -E "^$parent/\.deleted-|@\.deleted-" <<<"$all" || true)
live=$(grep -vE "^$parent/\.deleted-|@\.deleted-" <<<"$all" || true)
if [ -n "$live" ]; then
  say "datasets or snapshots left below $parent (not deleted):"
  echo "$live" >&2
  problems=1
fi
# What is set aside is unmounted (and canmount=noauto): a deleted volume holds no mount.
mounted_aside=$(zfs get -H -r -o name,value mounted "$parent" |
  awk -v p="$parent/.deleted-" 'index($1, p) == 1 && $2 == "yes" { print $1 }')
if [ -n "$mounted_aside" ]; then
  say "deleted volumes still mounted:"
  echo "$mounted_aside" >&2
  problems=1
fi
say "left behind: $(grep -c . <<<"$set_aside" || true) set-aside datasets and snapshots" \
  "(.deleted-*, purged after --deleted-retention), $(grep -c . <<<"$live" || true) live," \
  "$(grep -c . <<<"$leaked_mounts" || true) mounts"

echo "${ran:-csi-sanity printed no summary} (with pool, plugin and checks: ${SECONDS} s)"
[ -n "$summary" ] && echo "$summary"
if [ -z "$summary" ]; then
  echo "csi-sanity: no result (exit code $sanity_status)"
  exit 1
fi
leftovers=""
[ "$problems" -ne 0 ] && leftovers=", and the run left things behind (see above)"
echo "csi-sanity: $passed passed, $failed failed, $skipped skipped, $pending pending$leftovers"
[ "$sanity_status" -eq 0 ] && [ "$failed" -eq 0 ] && [ "$problems" -eq 0 ]
