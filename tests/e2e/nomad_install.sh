#!/usr/bin/env bash
# Prints the path of the pinned Nomad binary, building it first if this machine has no copy yet.
# Nomad comes from the Go module proxy (the only place our machines can get it) and is built
# once per machine into $ZFS_CSI_CACHE (default /var/cache/zfs-csi), so later runs and other
# clones reuse it. The version is set here and nowhere else.
#
#   tests/e2e/nomad_install.sh            # -> /var/cache/zfs-csi/nomad-1.10.5/nomad
set -euo pipefail

NOMAD_VERSION=1.10.5
# nomad's go.mod replaces its api module with ./api, which module zips leave out. This is the
# api module at the same commit as the tag (a3b86c697f38, 2025-09-09 14:36:45 UTC): the version
# nomad's go.mod requires is older and only a placeholder for the replace.
NOMAD_API_VERSION=v0.0.0-20250909143645-a3b86c697f38

cache="${ZFS_CSI_CACHE:-/var/cache/zfs-csi}/nomad-$NOMAD_VERSION"
bin="$cache/nomad"

if [ -x "$bin" ] && "$bin" version 2>/dev/null | grep -q "^Nomad v$NOMAD_VERSION\$"; then
  echo "$bin"
  exit 0
fi

command -v go >/dev/null 2>&1 || PATH="$PATH:/usr/local/go/bin"
command -v go >/dev/null 2>&1 || { echo "nomad_install: go is needed to build Nomad" >&2; exit 1; }

echo "nomad_install: building Nomad $NOMAD_VERSION into $cache (several minutes the first time)" >&2
started=$(date +%s)
mkdir -p "$cache"
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
(cd "$work/nomad" && CGO_ENABLED=1 go build -trimpath -o "$work/nomad-bin" .)
"$work/nomad-bin" version | grep -q "^Nomad v$NOMAD_VERSION\$" || {
  echo "nomad_install: the built binary does not report v$NOMAD_VERSION" >&2
  exit 1
}
mv "$work/nomad-bin" "$bin"
echo "nomad_install: built in $(( $(date +%s) - started ))s" >&2
echo "$bin"
