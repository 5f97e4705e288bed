#!/usr/bin/env bash
# Prints the path of a Go toolchain of at least ZFS_CSI_GO_MIN (1.25: csi-sanity, Nomad and
# versitygw need it), looked for on PATH, in /usr/local/go/bin and in the cache. When there is
# none it bootstraps the pinned Go into ${ZFS_CSI_CACHE:-/var/cache/zfs-csi}/go-<version>/: the Go
# module proxy serves the toolchain itself as the module golang.org/toolchain, which any Go
# (Debian bookworm's golang-go is 1.19) fetches with `go mod download`. With no Go at all,
# Debian's golang-go is installed first (apt-get, as root). Progress goes to stderr; stdout holds
# only the path. Exits non-zero, saying why, when no Go can be had.
#
# Environment: ZFS_CSI_CACHE (the cache), ZFS_CSI_GO_MIN (the oldest Go accepted, default 1.25),
# ZFS_CSI_GO_VERSION (the toolchain fetched, default below), GOPROXY (default: Go's own).
set -euo pipefail

GO_MIN=${ZFS_CSI_GO_MIN:-1.25}
# 1.26.8: the newest toolchain the proxy serves that every build here accepts (Prometheus asks
# for 1.26.7, the others for 1.25).
GO_PIN=${ZFS_CSI_GO_VERSION:-1.26.8}
CACHE=${ZFS_CSI_CACHE:-/var/cache/zfs-csi}
DEST="$CACHE/go-$GO_PIN"

say() { echo "go.sh: $*" >&2; }

# The version of the go at $1 (e.g. 1.25.5), or nothing if it does not run.
version_of() {
  local v
  v=$(GOTOOLCHAIN=local "$1" env GOVERSION 2>/dev/null) || return 0
  printf '%s\n' "${v#go}"
}

# Whether version $1 is at least $2.
at_least() { printf '%s\n%s\n' "$2" "$1" | sort -V -C; }

# The first go among the candidates that is recent enough.
find_recent() {
  local go v
  for go in "$(command -v go || true)" /usr/local/go/bin/go "$DEST/bin/go"; do
    [ -n "$go" ] && [ -x "$go" ] || continue
    v=$(version_of "$go")
    if [ -n "$v" ] && at_least "$v" "$GO_MIN"; then
      printf '%s\n' "$go"
      return 0
    fi
  done
  return 1
}

if find_recent; then exit 0; fi
at_least "$GO_PIN" "$GO_MIN" ||
  { say "the Go it would fetch ($GO_PIN) is older than $GO_MIN: set ZFS_CSI_GO_VERSION"; exit 1; }

case "$(uname -m)" in
  x86_64) arch=amd64 ;;
  aarch64 | arm64) arch=arm64 ;;
  *) say "no Go toolchain is published for $(uname -m)"; exit 1 ;;
esac
module="golang.org/toolchain@v0.0.1-go$GO_PIN.linux-$arch"

mkdir -p "$CACHE"
# One bootstrap at a time: a second run waits, then finds the first one's result.
exec 9>"$CACHE/go-$GO_PIN.lock"
flock 9
if find_recent; then exit 0; fi

# Any Go can fetch the toolchain module; without one, Debian's (1.19 on bookworm).
old=$(command -v go || true)
[ -z "$old" ] && [ -x /usr/local/go/bin/go ] && old=/usr/local/go/bin/go
if [ -z "$old" ] || [ -z "$(version_of "$old")" ]; then
  if ! command -v apt-get >/dev/null 2>&1 || [ "$(id -u)" != 0 ]; then
    say "no Go found (PATH, /usr/local/go/bin, $DEST) and Debian's golang-go cannot be" \
      "installed here (needs apt-get and root): install Go $GO_MIN or later"
    exit 1
  fi
  say "no Go at all: installing Debian's golang-go to fetch Go $GO_PIN with"
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q golang-go >&2 ||
    { apt-get update -q >&2 && DEBIAN_FRONTEND=noninteractive apt-get install -y -q golang-go >&2; }
  old=$(command -v go || true)
  [ -n "$old" ] || { say "golang-go installed, but there is still no go on PATH"; exit 1; }
fi
say "fetching $module with $old ($(version_of "$old")) into $DEST"

# A private module cache and an empty working directory (outside any module), both removed
# after; the toolchain is copied out of the module cache, whose files are read-only.
work=$(mktemp -d "$CACHE/go-$GO_PIN.work.XXXXXX")
cleanup() {
  chmod -R u+w "$work" 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT
mkdir -p "$work/empty" "$work/mod" "$work/gopath"
dir=$(cd "$work/empty" && GOMODCACHE="$work/mod" GOPATH="$work/gopath" GOFLAGS=-mod=mod \
  GOTOOLCHAIN=local GO111MODULE=on "$old" mod download -json "$module" |
  sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')
[ -n "$dir" ] && [ -f "$dir/bin/go" ] ||
  { say "go mod download $module gave no toolchain (see above)"; exit 1; }
rm -rf "$work/root"
cp -R "$dir" "$work/root"
chmod -R u+w "$work/root"
# Module zips keep no file modes: the programs need theirs back (as Go's own toolchain switch does).
find "$work/root/bin" "$work/root/pkg/tool" -type f -exec chmod 0755 {} +
got=$(version_of "$work/root/bin/go")
[ "$got" = "$GO_PIN" ] || { say "the fetched toolchain says version '${got}', not $GO_PIN"; exit 1; }
rm -rf "$DEST"
mv "$work/root" "$DEST"
say "Go $GO_PIN is in $DEST"
printf '%s\n' "$DEST/bin/go"
