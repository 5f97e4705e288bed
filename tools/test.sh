#!/usr/bin/env bash
# Runs every test: unit tests (no --allow-run, which proves they start no program), then the
# integration tests on a real ZFS pool (zfs-fuse is installed and started if zfs is missing),
# then the CSI conformance suite (tests/conformance/csi_sanity.sh) and the end-to-end run under
# a real Nomad agent (tests/e2e/nomad_e2e.sh, and tests/e2e/host_volume_e2e.sh for host volumes).
# Ends with csi-sanity's counts, the e2e's checks and one line "tests: N passed, N failed" over
# the deno runs.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
deno=./tools/deno
export NO_COLOR=1
# ZFS_CSI_TEST_PARTS picks parts (default all): unit integration conformance e2e, e.g. in a VM
# that has no Go toolchain: ZFS_CSI_TEST_PARTS="unit integration".
parts=" ${ZFS_CSI_TEST_PARTS:-unit integration conformance e2e} "
want() { [[ "$parts" == *" $1 "* ]]; }
log=$(mktemp)
trap 'rm -f "$log"' EXIT
status=0

if want unit; then
  echo "== unit tests (no subprocesses allowed)"
  $deno test --frozen --allow-read --allow-write=/tmp --allow-env src/ tools/ bench/ 2>&1 |
    tee -a "$log" || status=1
fi

if tools/zfs-env.sh ensure; then
  if want integration; then
    echo "== integration tests (real ZFS pool, plugin run with its production permission flags)"
    # Network only to loopback: the S3 server the store tests start (versitygw) and its proxy.
    $deno test --frozen --allow-run --allow-read --allow-write --allow-env --allow-sys \
      --allow-net=127.0.0.1 tests/ 2>&1 | tee -a "$log" || status=1
  fi
  if want conformance; then
    echo "== conformance (csi-sanity against the plugin as it ships)"
    tests/conformance/csi_sanity.sh 2>&1 | tee -a "$log" || status=1
  fi
  if want e2e; then
    echo "== end to end under a real Nomad agent (tests/e2e)"
    tests/e2e/nomad_e2e.sh 2>&1 | tee -a "$log" || status=1
    # zfs-csi as a dynamic host volume plugin; Nomad agents on one machine take turns (ports).
    # -o: the lock's descriptor is not passed on, so Nomad's executors, which can outlive a run
    # that was killed, never keep holding it.
    cache="${ZFS_CSI_CACHE:-/var/cache/zfs-csi}"
    mkdir -p "$cache"
    flock -o "$cache/nomad-run.lock" tests/e2e/host_volume_e2e.sh 2>&1 | tee -a "$log" || status=1
    # One server and two clients: a volume that follows its job between them.
    flock -o "$cache/nomad-run.lock" tests/e2e/nomad_cluster.sh 2>&1 | tee -a "$log" || status=1
  fi
else
  echo "integration tests cannot run: no ZFS on this machine (see above)"
  status=1
fi

grep -E '^csi-sanity: ([0-9]|not run)' "$log" | tail -n 1
grep -E '^nomad-e2e: ' "$log" | tail -n 1
grep -E '^host-volume-e2e: ' "$log" | tail -n 1
grep -E '^nomad-cluster: ' "$log" | tail -n 1
# deno test ends each run with "ok | N passed (S steps) | M failed (...)"; add both runs up.
awk '/^(ok|FAILED) \| [0-9]+ passed/ {
  for (i = 1; i <= NF; i++) { if ($i == "passed") p += $(i-1); if ($i == "failed") f += $(i-1) }
} END { printf "tests: %d passed, %d failed\n", p, f }' "$log"
exit $status
