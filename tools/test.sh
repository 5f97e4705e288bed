#!/usr/bin/env bash
# Runs every test: unit tests (no --allow-run, which proves they start no program), then the
# integration tests on a real ZFS pool (zfs-fuse is installed and started if zfs is missing).
# Ends with one summary line "tests: N passed, N failed" over both runs.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
deno=./tools/deno
export NO_COLOR=1
log=$(mktemp)
trap 'rm -f "$log"' EXIT
status=0

echo "== unit tests (no subprocesses allowed)"
$deno test --frozen --allow-read --allow-write=/tmp --allow-env src/ tools/ 2>&1 | tee -a "$log" || status=1

echo "== integration tests (real ZFS pool, plugin run with its production permission flags)"
if tools/zfs-env.sh ensure; then
  $deno test --frozen --allow-run --allow-read --allow-write --allow-env --allow-sys \
    tests/ 2>&1 | tee -a "$log" || status=1
else
  echo "integration tests cannot run: no ZFS on this machine (see above)"
  status=1
fi

# deno test ends each run with "ok | N passed (S steps) | M failed (...)"; add both runs up.
awk '/^(ok|FAILED) \| [0-9]+ passed/ {
  for (i = 1; i <= NF; i++) { if ($i == "passed") p += $(i-1); if ($i == "failed") f += $(i-1) }
} END { printf "tests: %d passed, %d failed\n", p, f }' "$log"
exit $status
