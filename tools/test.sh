#!/usr/bin/env bash
# Runs every test: unit tests (no --allow-run, which proves they start no program) and the
# compile proof (tools/compile_proof.ts: deno task compile up to denort), then the integration
# tests on a real ZFS pool (zfs-fuse is installed and started if zfs is missing), then the CSI
# conformance suite (tests/conformance/csi_sanity.sh) and the end-to-end run under a real Nomad
# agent (tests/e2e/nomad_e2e.sh, and tests/e2e/host_volume_e2e.sh for host volumes).
# Ends with the compile proof's verdict, csi-sanity's counts, the e2e's checks and one line
# "tests: N passed, N failed" over the deno runs.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
deno=./tools/deno
export NO_COLOR=1
# ZFS_CSI_TEST_PARTS picks parts (default all): unit integration conformance e2e, e.g. in a VM
# that has no Go toolchain: ZFS_CSI_TEST_PARTS="unit integration".
parts=" ${ZFS_CSI_TEST_PARTS:-unit integration conformance e2e} "
want() { [[ "$parts" == *" $1 "* ]]; }
log=$(mktemp)
fuse_report=$(mktemp)
watchdog=""
trap 'rm -f "$log" "$fuse_report"; [ -z "$watchdog" ] || kill "$watchdog" 2>/dev/null' EXIT
status=0

# Each part gets a time limit, so a hang ends in a failure that says where, not in CI's timeout.
# The integration tests and the first Nomad run get the most: on a new machine they build their
# servers first (versitygw and Prometheus; Nomad, 10 to 35 minutes on 2 cores).
limit() {
  local minutes=$1
  shift
  timeout -k 60 $((minutes * 60)) "$@"
  local rc=$?
  [ "$rc" != 124 ] || echo "!! time limit: $* did not end within $minutes min" >&2
  return "$rc"
}

# zfs-fuse's daemon now and then deadlocks for good or dies (tools/fuse_watchdog.ts says how it
# is seen); the watchdog restarts it and notes it in $fuse_report. A part that failed while that
# happened runs once more; a part that failed without it does not.
start_watchdog() {
  pgrep -x zfs-fuse >/dev/null || return 0
  $deno run --frozen --quiet --allow-write="$fuse_report" \
    --allow-run=ps,cat,"$PWD/tools/zfs-env.sh" tools/fuse_watchdog.ts --report "$fuse_report" &
  watchdog=$!
}
deadlocks() { grep -c '^fuse-watchdog ' "$fuse_report" || true; }

# Runs `"$@"` (a part printing to stdout), once more if it failed and zfs-fuse deadlocked meanwhile.
part() {
  local before out rc
  before=$(deadlocks)
  out=$(mktemp)
  "$@" 2>&1 | tee "$out"
  rc=${PIPESTATUS[0]}
  if [ "$rc" != 0 ] && [ "$(deadlocks)" != "$before" ]; then
    echo "== zfs-fuse deadlocked or died during this part (see fuse-watchdog above);" \
      "running it once more"
    "$@" 2>&1 | tee "$out"
    rc=${PIPESTATUS[0]}
  fi
  cat "$out" >>"$log"
  rm -f "$out"
  return "$rc"
}

integration_flags=(--frozen --allow-run --allow-read --allow-write --allow-env --allow-sys
  --allow-net=127.0.0.1)

# The test files of a deno test run's output that have a failed test, one a line; nothing when a
# failure cannot be placed in a file. A failed test's line ("name ... FAILED", not indented: a
# step's is) follows its file's "running N tests from ./file"; the "=> location" lines name where
# the assertion was, which can be a shared helper in tests/support.
failed_files() {
  awk '
    /^running [0-9]+ tests? from / { file = $NF; next }
    /^[^ ].* \.\.\. FAILED/ { if (file == "") { lost = 1 } else { failed[file] = 1 } }
    /^error: / && file == "" { lost = 1 }
    END { if (!lost) for (f in failed) print f }
  ' "$1" | sort
}

# The integration tests; after a deadlock only the files with a failed test run again, and the
# totals count each test once (its last run).
integration() {
  local before out rc files
  before=$(deadlocks)
  out=$(mktemp)
  limit 50 $deno test "${integration_flags[@]}" tests/ 2>&1 | tee "$out"
  rc=${PIPESTATUS[0]}
  files=$(failed_files "$out")
  if [ "$rc" != 0 ] && [ "$(deadlocks)" != "$before" ] && [ -n "$files" ]; then
    echo "== zfs-fuse deadlocked or died during the integration tests (see fuse-watchdog above);" \
      "running the files with a failed test once more:" $files
    local again
    again=$(mktemp)
    # shellcheck disable=SC2086 # one argument per file
    limit 20 $deno test "${integration_flags[@]}" $files 2>&1 | tee "$again"
    rc=${PIPESTATUS[0]}
    if [ "$rc" = 0 ]; then
      # Every test of the first run now passed: its summary counts the failed ones as passed.
      awk '/^FAILED \| [0-9]+ passed/ {
        for (i = 1; i <= NF; i++) { if ($i == "passed") p = $(i-1); if ($i == "failed") f = $(i-1) }
        print "ok | " p + f " passed | 0 failed (the failed ones passed when run again)"; next
      } { print }' "$out" >>"$log"
    else
      cat "$out" >>"$log"
      grep -E '^(ok|FAILED) \|' "$again" | sed 's/^/rerun: /' >>"$log"
    fi
    rm -f "$again"
  else
    cat "$out" >>"$log"
  fi
  rm -f "$out"
  return "$rc"
}

if want unit; then
  echo "== unit tests (no subprocesses allowed)"
  limit 15 $deno test --frozen --allow-read --allow-write=/tmp --allow-env src/ tools/ bench/ 2>&1 |
    tee -a "$log" || status=1
  # `deno task compile` as on a fresh clone (no type-check cache), the pinned deno standing in for
  # denort (which cannot be downloaded here): exits 0 and writes the stand-in plus a payload with
  # the baked flags and every module (tools/compile_proof.ts says what it does not prove).
  echo "== compile pipeline (deno task compile up to denort)"
  limit 15 $deno run --frozen --quiet --allow-run --allow-read --allow-write --allow-env \
    tools/compile_proof.ts 2>&1 | tee -a "$log" || status=1
fi

if tools/zfs-env.sh ensure; then
  start_watchdog
  if want integration; then
    echo "== integration tests (real ZFS pool, plugin run with its production permission flags)"
    # Network only to loopback: the S3 server the store tests start (versitygw) and its proxy.
    integration || status=1
  fi
  if want conformance; then
    echo "== conformance (csi-sanity against the plugin as it ships)"
    part limit 15 tests/conformance/csi_sanity.sh || status=1
  fi
  if want e2e; then
    echo "== end to end under a real Nomad agent (tests/e2e)"
    part limit 50 tests/e2e/nomad_e2e.sh || status=1
    # zfs-csi as a dynamic host volume plugin; Nomad agents on one machine take turns (ports).
    # -o: the lock's descriptor is not passed on, so Nomad's executors, which can outlive a run
    # that was killed, never keep holding it.
    cache="${ZFS_CSI_CACHE:-/var/cache/zfs-csi}"
    mkdir -p "$cache"
    part flock -o "$cache/nomad-run.lock" timeout -k 60 1200 tests/e2e/host_volume_e2e.sh ||
      status=1
    # One server and two clients: a volume that follows its job between them.
    part flock -o "$cache/nomad-run.lock" timeout -k 60 1200 tests/e2e/nomad_cluster.sh ||
      status=1
  fi
else
  echo "integration tests cannot run: no ZFS on this machine (see above)"
  status=1
fi

n=$(deadlocks)
[ "$n" = 0 ] || echo "zfs-fuse: deadlocked or died $n time(s), restarted (tools/fuse_watchdog.ts)"
grep -E '^compile-proof: (ok|FAILED)' "$log" | head -n 1
grep -E '^csi-sanity: ([0-9]|not run)' "$log" | tail -n 1
grep -E '^nomad-e2e: ' "$log" | tail -n 1
grep -E '^host-volume-e2e: ' "$log" | tail -n 1
grep -E '^nomad-cluster: ' "$log" | tail -n 1
# deno test ends each run with "ok | N passed (S steps) | M failed (...)"; add both runs up.
awk '/^(ok|FAILED) \| [0-9]+ passed/ {
  for (i = 1; i <= NF; i++) { if ($i == "passed") p += $(i-1); if ($i == "failed") f += $(i-1) }
} END { printf "tests: %d passed, %d failed\n", p, f }' "$log"
exit $status
