#!/usr/bin/env bash
# Prints the path of a Nomad binary, building it first if this machine has no copy yet.
# Nomad comes from the Go module proxy (the only place our machines can get it) and is built
# once per machine and version into $ZFS_CSI_CACHE (default /var/cache/zfs-csi), so later runs
# and other clones reuse it. Two runs for one version at once: the second waits for the first.
#
#   tests/e2e/nomad_install.sh                               # -> .../nomad-1.11.3/nomad
#   ZFS_CSI_NOMAD_VERSION=1.10.5 tests/e2e/nomad_install.sh  # -> .../nomad-1.10.5/nomad
#
# The versions: 1.11.3 (the default, the newest the proxy serves) and 1.10.5 (before 1.11.0,
# whose client overlaps node calls for one volume: what the plugin's waiting lock is for).
set -euo pipefail

NOMAD_VERSION=${ZFS_CSI_NOMAD_VERSION:-1.11.3}

# nomad's go.mod replaces its api module with ./api, which module zips leave out, and requires
# an older api version that is only a placeholder for the replace. So each version needs the
# api module pinned here; `go mod download -json github.com/hashicorp/nomad@v<version>` prints
# the tag's commit (Origin.Hash).
case "$NOMAD_VERSION" in
  1.10.5)
    # The api module at the tag's own commit (a3b86c697f38, 2025-09-09 14:36:45 UTC).
    NOMAD_API_VERSION=v0.0.0-20250909143645-a3b86c697f38
    ;;
  1.11.3)
    # The tag is commit 173ab08a0210 (2026-03-11 09:10:27 UTC), but the proxy serves no api
    # module at it (v0.0.0-20260311091027-173ab08a0210: "not available"); the only api it serves
    # after the tag is this one from main (2026-10-16; its @v/list and @latest name it). It
    # carries the tag's api package and more, which the agent only uses to decode HTTP requests
    # and the CLI to send them; the e2e passes with it.
    NOMAD_API_VERSION=v0.0.0-20261016150620-df630b26e78a
    ;;
  *)
    echo "nomad_install: no api module pin for Nomad $NOMAD_VERSION (known: 1.11.3, 1.10.5);" \
      "add one to $0" >&2
    exit 1
    ;;
esac

cache="${ZFS_CSI_CACHE:-/var/cache/zfs-csi}/nomad-$NOMAD_VERSION"
bin="$cache/nomad"

built() { [ -x "$bin" ] && "$bin" version 2>/dev/null | grep -q "^Nomad v$NOMAD_VERSION\$"; }
if built; then
  echo "$bin"
  exit 0
fi

mkdir -p "$cache"
# One build per version at a time: a second run waits here, then finds the binary.
exec 9>"$cache/.build.lock"
if ! flock -n 9; then
  echo "nomad_install: waiting for another build of Nomad $NOMAD_VERSION into $cache" >&2
  flock 9
fi
if built; then
  echo "$bin"
  exit 0
fi

# A Go of 1.25 or later (PATH, /usr/local/go, or fetched from the Go module proxy by tools/go.sh);
# its directory goes first on PATH, so every `go` below is that one.
go=$("$(dirname "${BASH_SOURCE[0]}")/../../tools/go.sh") ||
  { echo "nomad_install: Go 1.25+ is needed to build Nomad (tools/go.sh said why)" >&2; exit 1; }
PATH="$(dirname "$go"):$PATH"

echo "nomad_install: building Nomad $NOMAD_VERSION into $cache (several minutes the first time)" >&2
started=$(date +%s)
work=$(mktemp -d "$cache/build.XXXXXX")
trap 'chmod -R u+w "$work" 2>/dev/null; rm -rf "$work"' EXIT

# Outside any module, "go mod download" fetches exactly the named versions and prints their dirs.
module_dir() { GOFLAGS=-mod=mod go mod download -json "$1" | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p'; }
src=$(cd "$work" && module_dir "github.com/hashicorp/nomad@v$NOMAD_VERSION")
api=$(cd "$work" && module_dir "github.com/hashicorp/nomad/api@$NOMAD_API_VERSION")
[ -n "$src" ] && [ -n "$api" ] || { echo "nomad_install: module download failed" >&2; exit 1; }

cp -r "$src" "$work/nomad"
chmod -R u+w "$work/nomad"
rm -rf "$work/nomad/api"
cp -r "$api" "$work/nomad/api"
chmod -R u+w "$work/nomad/api"

# No build tags: the web UI (tag "ui") is not needed; the version string is in version/version.go.
# -mod=mod: an api module newer than the tag may require newer versions of a few modules (1.11.3:
# shoenig/test, a test helper); go then raises them in this copy's go.mod. For 1.10.5 it changes
# nothing.
(cd "$work/nomad" && CGO_ENABLED=1 GOFLAGS=-mod=mod go build -trimpath -o "$work/nomad-bin" .)
"$work/nomad-bin" version | grep -q "^Nomad v$NOMAD_VERSION\$" || {
  echo "nomad_install: the built binary does not report v$NOMAD_VERSION" >&2
  exit 1
}
mv "$work/nomad-bin" "$bin"
echo "nomad_install: built in $(( $(date +%s) - started ))s" >&2
echo "$bin"
