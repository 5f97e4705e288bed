#!/usr/bin/env bash
# The project's tests on real OpenZFS (Debian bookworm, zfs-dkms) in a QEMU VM. See README.md.
# ZFS_CSI_VM_OPENZFS picks the OpenZFS line: 2.1 (default, bookworm) or 2.3 (bookworm-backports).
#
#   openzfs-vm.sh build               build the VM image (~20 min)
#   openzfs-vm.sh test [PROJECT_DIR]  copy the project in, boot, run `./tools/deno task test`
#   openzfs-vm.sh shell               boot to a root console, no tests (Ctrl-a x quits QEMU)
#
# Needs root (debootstrap, chroot, loop mounts) on a Debian host. All state lives in
# $ZFS_CSI_VM_DIR (default /var/tmp/zfs-csi-openzfs-vm for 2.1, /var/tmp/zfs-csi-openzfs-vm-2.3
# for 2.3), never in the repository.
# Tunables: ZFS_CSI_VM_MEM (6G), ZFS_CSI_VM_CPUS (all), ZFS_CSI_VM_TIMEOUT (seconds, 10800),
# ZFS_CSI_VM_DISK_SIZE (8G), ZFS_CSI_VM_MIRROR and ZFS_CSI_VM_SECURITY_MIRROR (Debian mirror URIs;
# by default read from this host's apt sources), ZFS_CSI_VM_ACCEL (auto, kvm or tcg),
# ZFS_CSI_VM_TEST_FILES (test files to run instead of the whole suite), ZFS_CSI_VM_TEST_ENV
# (NAME=VALUE words for the tests, e.g. ZFS_CSI_CRASH_TRIALS=10), ZFS_CSI_VM_SANITY (mount and/or
# block: csi-sanity in the VM with that access type; alone, without ZFS_CSI_VM_TEST_FILES, only it),
# ZFS_CSI_VM_SCRIPT (a script of the project run in the VM after them; ZFS_CSI_VM_NOMAD=1 puts the
# host's Nomad binary in for it, ZFS_CSI_VM_DOCKER=1 Debian's docker).
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
SUITE=bookworm
OPENZFS="${ZFS_CSI_VM_OPENZFS:-2.1}"
# Where the line's packages come from; each line has its own directory, so both images can be kept.
case "$OPENZFS" in
  2.1) ZFS_SUITE=$SUITE W="${ZFS_CSI_VM_DIR:-/var/tmp/zfs-csi-openzfs-vm}" ;;
  2.3) ZFS_SUITE=$SUITE-backports W="${ZFS_CSI_VM_DIR:-/var/tmp/zfs-csi-openzfs-vm-2.3}" ;;
  *)
    echo "openzfs-vm: ZFS_CSI_VM_OPENZFS must be 2.1 or 2.3, not '$OPENZFS'" >&2
    exit 2
    ;;
esac
MEM="${ZFS_CSI_VM_MEM:-6G}"
CPUS="${ZFS_CSI_VM_CPUS:-$(nproc)}"
# The whole suite takes over an hour under TCG (80 min on 2 busy cores in 2026-11).
TIMEOUT="${ZFS_CSI_VM_TIMEOUT:-10800}"
if ! [[ "$TIMEOUT" =~ ^[1-9][0-9]*$ ]]; then
  echo "openzfs-vm: ZFS_CSI_VM_TIMEOUT must be a number of seconds, not '$TIMEOUT'" >&2
  exit 2
fi
DISK_SIZE="${ZFS_CSI_VM_DISK_SIZE:-8G}"
# Inside the image; in-vm.sh and the unit use the same paths.
VM_HOME=/opt/zfs-csi-vm
UNIT=zfs-csi-vm-test.service

say() { printf 'openzfs-vm: %s\n' "$*"; }
die() {
  printf 'openzfs-vm: %s\n' "$*" >&2
  exit 1
}

usage() {
  echo "usage:" >&2
  sed -n '4,6s/^#//p' "${BASH_SOURCE[0]}" >&2
  exit 2
}

# --- host side helpers --------------------------------------------------------------------------

qemu_pid=""
chroot_dir=""
DEBS_DIR=""
DEBS_WANTED=""
SANITY_BIN=""

cleanup() {
  # Never leave a VM running on the image, nor a loop mount or chroot mount behind.
  if [ -n "$qemu_pid" ] && kill -0 "$qemu_pid" 2>/dev/null; then
    kill "$qemu_pid" 2>/dev/null || true
    wait "$qemu_pid" 2>/dev/null || true
  fi
  umount_image
  if [ -n "$chroot_dir" ]; then unmount_chroot "$chroot_dir"; fi
}

# Installs the Debian packages that provide the missing commands (pairs: command package).
need_commands() {
  local missing=()
  while [ "$#" -ge 2 ]; do
    command -v "$1" >/dev/null 2>&1 || missing+=("$2")
    shift 2
  done
  [ "${#missing[@]}" -eq 0 ] && return 0
  say "installing ${missing[*]} (apt-get)"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq "${missing[@]}" >/dev/null
}

# Every enabled `deb` source of this host's apt as lines "SUITE URI", from both the one-line
# format (sources.list, *.list) and the deb822 format (*.sources).
apt_sources() {
  local f
  for f in /etc/apt/sources.list /etc/apt/sources.list.d/*.list; do
    [ -f "$f" ] || continue
    # deb [options] URI SUITE COMPONENT...
    sed -e 's/#.*//' -e 's/\[[^]]*\]//' "$f" | awk '$1 == "deb" && NF >= 3 { print $3, $2 }'
  done
  for f in /etc/apt/sources.list.d/*.sources; do
    [ -f "$f" ] || continue
    awk '
      function flush(  t, i, j, ns, nu, s, u) {
        t = " " f["types"] " "
        gsub(/[ \t]+/, " ", t)
        if (t ~ / deb / && tolower(f["enabled"]) !~ /no/) {
          ns = split(f["suites"], s)
          nu = split(f["uris"], u)
          for (i = 1; i <= ns; i++) for (j = 1; j <= nu; j++) print s[i], u[j]
        }
        split("", f)
        key = ""
      }
      /^#/ { next }
      /^[ \t]*$/ { flush(); next }
      /^[ \t]/ { if (key != "") f[key] = f[key] " " $0; next }
      { i = index($0, ":"); key = tolower(substr($0, 1, i - 1)); f[key] = substr($0, i + 1) }
      END { flush() }
    ' "$f"
  done
}

# Sets MIRROR and SECURITY_MIRROR: the URIs this host's apt uses for the target suite (or, on a
# Debian host of another release, for its own suite: the same archive serves every release).
find_mirrors() {
  local sources codename="" id=""
  sources="$(apt_sources)"
  if [ -r /etc/os-release ]; then
    id="$(. /etc/os-release && echo "${ID:-}")"
    codename="$(. /etc/os-release && echo "${VERSION_CODENAME:-}")"
  fi
  [ "$id" = debian ] || codename=""
  pick() {
    local want
    for want in "$@"; do
      awk -v s="$want" '$1 == s && $2 ~ /^(https?|file):/ { sub(/\/+$/, "", $2); print $2; exit }' \
        <<<"$sources" | grep . && return 0
    done
    return 0
  }
  MIRROR="${ZFS_CSI_VM_MIRROR:-$(pick "$SUITE" ${codename:+"$codename"})}"
  SECURITY_MIRROR="${ZFS_CSI_VM_SECURITY_MIRROR:-$(pick "$SUITE-security" ${codename:+"$codename-security"})}"
  [ -n "$MIRROR" ] || die "no Debian mirror for '$SUITE' in this host's apt sources
  (/etc/apt/sources.list.d/*.sources URIs:, /etc/apt/sources.list deb lines); set ZFS_CSI_VM_MIRROR"
  [ -n "$SECURITY_MIRROR" ] || die "no Debian security mirror for '$SUITE-security' in this host's apt
  sources; set ZFS_CSI_VM_SECURITY_MIRROR"
}

have_image() { [ -s "$W/disk.img" ] && [ -s "$W/vmlinuz" ] && [ -s "$W/initrd.img" ]; }

# The OpenZFS line of the mounted image, from the image.txt its build wrote; an image without one
# predates the choice of lines and has 2.1.
image_line() { # image root
  if [ -f "$1$VM_HOME/image.txt" ]; then
    sed -n 's/^openzfs-line: \([^ ]*\).*/\1/p' "$1$VM_HOME/image.txt"
  else
    echo 2.1
  fi
}

mount_image() { # rw | ro
  mkdir -p "$W/mnt"
  if mountpoint -q "$W/mnt"; then die "$W/mnt is mounted already (a crashed run?): umount it first"; fi
  # -t ext4: the image is always the ext4 the build made, and a pool the tests created inside the
  # VM can leave a ZFS label that blkid also sees ("ambivalent result"), after which a mount that
  # probes the type refuses.
  mount -t ext4 -o "loop,$1" "$W/disk.img" "$W/mnt"
}

umount_image() {
  if mountpoint -q "$W/mnt" 2>/dev/null; then umount "$W/mnt"; fi
}

unmount_chroot() {
  local m
  for m in dev/pts dev sys proc; do
    if mountpoint -q "$1/$m" 2>/dev/null; then umount "$1/$m"; fi
  done
}

# The boot script and the unit, (re)installed on every test run so an older image gets the
# current ones.
install_vm_files() { # image root
  install -D -m 0755 "$here/in-vm.sh" "$1$VM_HOME/in-vm.sh"
  install -D -m 0644 "$here/$UNIT" "$1/etc/systemd/system/$UNIT"
  mkdir -p "$1/etc/systemd/system/multi-user.target.wants"
  ln -sfn "/etc/systemd/system/$UNIT" "$1/etc/systemd/system/multi-user.target.wants/$UNIT"
  # The unit gives up before QEMU's timeout (10 min before; a tenth for short ones), so a hung
  # run still powers off cleanly and leaves its results.
  mkdir -p "$1/etc/systemd/system/$UNIT.d"
  printf '[Service]\nTimeoutStartSec=%s\n' "$((TIMEOUT > 6000 ? TIMEOUT - 600 : TIMEOUT * 9 / 10))" \
    >"$1/etc/systemd/system/$UNIT.d/timeout.conf"
}

# --- build ----------------------------------------------------------------------------------------

# Runs a step with its output in build.log; on failure shows the end of it.
logged() {
  if ! "$@" >>"$W/build.log" 2>&1; then
    tail -n 40 "$W/build.log" >&2
    die "failed: $* (full log: $W/build.log)"
  fi
}

in_root() {
  chroot "$chroot_dir" /usr/bin/env -i DEBIAN_FRONTEND=noninteractive LC_ALL=C HOME=/root \
    PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin "$@"
}

cmd_build() {
  local start=$SECONDS b="$W/build" kver="" k zfs_version
  need_commands debootstrap debootstrap qemu-system-x86_64 qemu-system-x86 mkfs.ext4 e2fsprogs
  find_mirrors
  say "building the OpenZFS $OPENZFS image in $b (~20 min; log: $W/build.log)"
  say "Debian $SUITE from $MIRROR, security from $SECURITY_MIRROR, OpenZFS from $ZFS_SUITE"
  # A previous build that failed half way leaves its chroot: start clean.
  unmount_chroot "$b/root"
  if grep -qF " $b/" /proc/mounts; then die "something is still mounted below $b: umount it first"; fi
  rm -rf --one-file-system "$b"
  mkdir -p "$b"
  : >"$W/build.log"
  chroot_dir="$b/root"

  say "debootstrap (main, contrib)"
  logged debootstrap --variant=minbase --components=main,contrib \
    --include=systemd-sysv,udev,kmod,iproute2,ca-certificates,util-linux \
    "$SUITE" "$chroot_dir" "$MIRROR"
  cat >"$chroot_dir/etc/apt/sources.list" <<EOF
deb $MIRROR $SUITE main contrib
deb $MIRROR $SUITE-updates main contrib
deb $SECURITY_MIRROR $SUITE-security main contrib
EOF
  if [ "$ZFS_SUITE" != "$SUITE" ]; then
    # Only OpenZFS's own packages (source zfs-linux) from there; the rest, kernel included, stays
    # on the release.
    echo "deb $MIRROR $ZFS_SUITE main contrib" >>"$chroot_dir/etc/apt/sources.list"
    cat >"$chroot_dir/etc/apt/preferences.d/zfs-csi-openzfs" <<EOF
Package: src:zfs-linux
Pin: release n=$ZFS_SUITE
Pin-Priority: 990
EOF
  fi
  # Packages must not start their services inside the chroot.
  printf '#!/bin/sh\nexit 101\n' >"$chroot_dir/usr/sbin/policy-rc.d"
  chmod +x "$chroot_dir/usr/sbin/policy-rc.d"
  mount -t proc proc "$chroot_dir/proc"
  mount -t sysfs sys "$chroot_dir/sys"
  mount --bind /dev "$chroot_dir/dev"
  mount --bind /dev/pts "$chroot_dir/dev/pts"
  cp /etc/resolv.conf "$chroot_dir/etc/resolv.conf"

  say "kernel and headers"
  logged in_root apt-get update
  logged in_root apt-get install -y linux-image-amd64 linux-headers-amd64 initramfs-tools
  for k in "$chroot_dir"/lib/modules/*; do
    if [ -e "$chroot_dir/boot/vmlinuz-${k##*/}" ]; then kver=${k##*/}; fi
  done
  [ -n "$kver" ] || die "no kernel installed in the chroot"
  say "zfs-dkms and zfsutils-linux (dkms builds the module for $kver: ~8 min)"
  logged in_root apt-get install -y zfs-dkms zfsutils-linux
  zfs_version="$(in_root dpkg-query -W -f '${Version}' zfs-dkms)"
  case "$zfs_version" in
    "$OPENZFS".*) ;;
    *) die "zfs-dkms $zfs_version was installed, not OpenZFS $OPENZFS (see $W/build.log)" ;;
  esac
  # dkms builds for the kernels whose headers it finds; make sure the VM's kernel is one of them.
  if [ -z "$(find "$chroot_dir/lib/modules/$kver" -name 'zfs.ko*' -print -quit)" ]; then
    logged in_root dkms autoinstall -k "$kver"
  fi
  [ -n "$(find "$chroot_dir/lib/modules/$kver" -name 'zfs.ko*' -print -quit)" ] ||
    die "zfs.ko was not built for $kver (see $W/build.log)"
  say "nodejs, npm, git, the filesystems' tools (block volumes: ext4, xfs)"
  logged in_root apt-get install -y nodejs npm git procps psmisc less e2fsprogs xfsprogs
  logged in_root apt-get clean

  say "configuring"
  echo zfs-csi-vm >"$chroot_dir/etc/hostname"
  printf '127.0.0.1 localhost\n127.0.1.1 zfs-csi-vm\n' >"$chroot_dir/etc/hosts"
  echo '/dev/vda / ext4 rw,errors=remount-ro 0 1' >"$chroot_dir/etc/fstab"
  in_root passwd -d root >/dev/null
  # `shell` logs in as root on the serial console without a prompt.
  mkdir -p "$chroot_dir/etc/systemd/system/serial-getty@ttyS0.service.d"
  cat >"$chroot_dir/etc/systemd/system/serial-getty@ttyS0.service.d/autologin.conf" <<'EOF'
[Service]
ExecStart=
ExecStart=-/sbin/agetty --autologin root --noclear --keep-baud 115200,57600,38400,9600 %I $TERM
EOF
  # Loaded at boot, before zfs.target and the test unit.
  echo zfs >"$chroot_dir/etc/modules-load.d/zfs.conf"
  install_vm_files "$chroot_dir"
  # What this image is: read by `test` (image_line) and printed in the VM's versions.txt.
  printf 'openzfs-line: %s (zfs-dkms %s from %s), kernel %s, built %s\n' "$OPENZFS" \
    "$zfs_version" "$ZFS_SUITE" "$kver" "$(date -u +%Y-%m-%dT%H:%MZ)" >"$chroot_dir$VM_HOME/image.txt"
  rm -f "$chroot_dir/usr/sbin/policy-rc.d"
  : >"$chroot_dir/etc/resolv.conf"
  unmount_chroot "$chroot_dir"

  say "making the disk image ($DISK_SIZE, sparse)"
  truncate -s "$DISK_SIZE" "$b/disk.img"
  logged mkfs.ext4 -q -F -L zfs-csi-vm -d "$chroot_dir" "$b/disk.img"
  cp "$chroot_dir/boot/vmlinuz-$kver" "$b/vmlinuz"
  cp "$chroot_dir/boot/initrd.img-$kver" "$b/initrd.img"
  # Replace the old image only now, so a failed build leaves the previous one usable.
  cp "$chroot_dir$VM_HOME/image.txt" "$b/image.txt"
  mv -f "$b/disk.img" "$b/vmlinuz" "$b/initrd.img" "$b/image.txt" "$W/"
  chroot_dir=""
  rm -rf --one-file-system "$b"
  say "image built in $(((SECONDS - start) / 60)) min: $W/disk.img (OpenZFS $zfs_version, kernel $kver)"
}

# --- test -----------------------------------------------------------------------------------------

# NUL-separated paths of the working tree: tracked (as they are now, uncommitted changes included)
# and untracked-but-not-ignored files; .cache/ and build outputs stay out.
project_files() { # project dir
  if git -C "$1" rev-parse --is-inside-work-tree >/dev/null 2>&1; then
    git -C "$1" ls-files -z --cached --others --exclude-standard |
      while IFS= read -r -d '' p; do
        # Tracked files deleted in the working tree are not copied.
        if [ -e "$1/$p" ] || [ -L "$1/$p" ]; then printf '%s\0' "$p"; fi
      done
  else
    (cd "$1" && find . \( -path ./.cache -o -path ./.git \) -prune -o \( -type f -o -type l \) -print0)
  fi
}

# The VM has no network: Deno and every module the tests load must be cached on the host first.
warm_deno() { # project dir
  local deno_version
  deno_version="$(sed -n 's/^DENO_VERSION=//p' "$1/tools/deno")"
  [ -n "$deno_version" ] || die "no DENO_VERSION in $1/tools/deno"
  DENO_PREFIX="$1/.cache/deno-$deno_version"
  DENO_CACHE="${DENO_DIR:-${XDG_CACHE_HOME:-${HOME:-/root}/.cache}/deno}"
  say "caching Deno $deno_version and the project's modules on the host"
  # Type checking loads the whole module graph, as `deno test` will in the VM.
  if ! (cd "$1" && ./tools/deno check --frozen main.ts src/ tests/ tools/) >"$W/host-deno-check.log" 2>&1; then
    say "warning: deno check failed on the host (see $W/host-deno-check.log); the VM run may fail too"
  fi
  [ -x "$DENO_PREFIX/node_modules/.bin/deno" ] || die "Deno $deno_version is not in $DENO_PREFIX"
}

# Builds tests/go_client on the host into $W/go (module cache + build cache for the VM), so the
# grpc-go churn test runs offline in the VM. Sets GOROOT_HOST when that worked.
stage_go() { # project dir
  local go="" proxy
  GOROOT_HOST=""
  rm -rf "$W/go"
  go="$(command -v go || true)"
  if [ -z "$go" ] && [ -x /usr/local/go/bin/go ]; then go=/usr/local/go/bin/go; fi
  if [ -z "$go" ] || [ ! -f "$1/tests/go_client/go.mod" ]; then
    say "no Go toolchain here: the grpc-go churn test will be skipped in the VM"
    return 0
  fi
  mkdir -p "$W/go"
  cp -a "$1/tests/go_client" "$W/go/src"
  # The host's module cache first (offline), then the host's own Go proxy setting.
  proxy="file://$("$go" env GOMODCACHE)/cache/download,$("$go" env GOPROXY)"
  if (cd "$W/go/src" && GOMODCACHE="$W/go/mod" GOCACHE="$W/go/build" GOPROXY="$proxy" \
    GOSUMDB=off GOTOOLCHAIN=local GOFLAGS="-buildvcs=false -trimpath" "$go" build -o /dev/null .) \
    >"$W/go.log" 2>&1; then
    GOROOT_HOST="$("$go" env GOROOT)"
    say "Go $("$go" env GOVERSION) and the go_client modules go in"
  else
    say "warning: could not build tests/go_client on the host (see $W/go.log): grpc-go test skipped"
    rm -rf "$W/go"
  fi
}

# ZFS_CSI_VM_TEST_FILES and ZFS_CSI_VM_TEST_ENV for in-vm.sh, one item a line (empty files when
# unset, so a previous run's choice does not stick).
write_test_settings() { # project dir, $VM_HOME in the mounted image
  local f kv files=() env=()
  read -r -a files <<<"${ZFS_CSI_VM_TEST_FILES:-}"
  read -r -a env <<<"${ZFS_CSI_VM_TEST_ENV:-}"
  for f in "${files[@]}"; do
    [ -f "$1/$f" ] || die "ZFS_CSI_VM_TEST_FILES: no file $f in $1"
  done
  for kv in "${env[@]}"; do
    [[ "$kv" =~ ^[A-Za-z_][A-Za-z0-9_]*= ]] || die "ZFS_CSI_VM_TEST_ENV: '$kv' is not NAME=VALUE"
  done
  mkdir -p "$2"
  printf '%s\n' ${files[@]+"${files[@]}"} | sed '/^$/d' >"$2/test-files.txt"
  printf '%s\n' ${env[@]+"${env[@]}"} | sed '/^$/d' >"$2/test.env"
  printf '%s\n' ${ZFS_CSI_VM_SANITY:-} | sed '/^$/d' >"$2/sanity.txt"
  if [ -n "${ZFS_CSI_VM_SCRIPT:-}" ]; then
    [ -f "$1/$ZFS_CSI_VM_SCRIPT" ] || die "ZFS_CSI_VM_SCRIPT: no file $ZFS_CSI_VM_SCRIPT in $1"
    say "then in the VM: $ZFS_CSI_VM_SCRIPT"
  fi
  printf '%s\n' "${ZFS_CSI_VM_SCRIPT:-}" | sed '/^$/d' >"$2/script.txt"
  if [ "${#files[@]}" -gt 0 ]; then say "tests: ${files[*]}"; fi
  if [ "${#env[@]}" -gt 0 ]; then say "test environment: ${env[*]}"; fi
}

# Debian packages the tests need that images built before they were in the build's list lack
# (block volumes: xfsprogs; jq for ZFS_CSI_VM_SCRIPT's Nomad transcript). The VM has no network:
# they are fetched on the host with
# `apt-get download` once, into the host's cache, and in-vm.sh installs those missing with dpkg.
# Only from a bookworm host, whose packages are the image's; elsewhere the tests needing them fail
# saying what is missing.
VM_DEBS="xfsprogs libinih1 liburcu8 jq libjq1 libonig5"
# ZFS_CSI_VM_DOCKER=1: Debian's docker (dockerd, containerd, runc) and what an image lacks of its
# dependencies (found with `apt-get -s -o Dir::State::status=<the image's dpkg status>`), for the
# Nomad docker driver in the VM, for tasks that need more than the exec driver gives
# (tests/e2e/block_nomad_vm.sh: a raw block device). Not started at boot (in-vm.sh).
VM_DOCKER_DEBS="docker.io containerd runc tini iptables libip6tc2 libnetfilter-conntrack3 libnfnetlink0 libnftnl11"
stage_debs() {
  local cache="${ZFS_CSI_CACHE:-/var/cache/zfs-csi}/debs-$SUITE" codename="" p missing=()
  DEBS_DIR="" DEBS_WANTED="$VM_DEBS"
  case "${ZFS_CSI_VM_DOCKER:-}" in
    "" | 0) ;;
    1) DEBS_WANTED="$VM_DEBS $VM_DOCKER_DEBS" ;;
    *) die "ZFS_CSI_VM_DOCKER must be 1 or empty, not '$ZFS_CSI_VM_DOCKER'" ;;
  esac
  if [ -r /etc/os-release ]; then codename="$(. /etc/os-release && echo "${VERSION_CODENAME:-}")"; fi
  mkdir -p "$cache"
  for p in $DEBS_WANTED; do
    compgen -G "$cache/${p}_*.deb" >/dev/null || missing+=("$p")
  done
  if [ "${#missing[@]}" -gt 0 ]; then
    if [ "$codename" != "$SUITE" ]; then
      say "warning: this host is not Debian $SUITE: no ${missing[*]} for the VM (xfs tests will fail)"
      return 0
    fi
    say "fetching ${missing[*]} for the VM (apt-get download, into $cache)"
    # -o APT::Sandbox::User=root: the cache is root's, _apt may not write there.
    if ! (cd "$cache" && apt-get download -o APT::Sandbox::User=root "${missing[@]}") \
      >"$W/debs.log" 2>&1; then
      say "warning: apt-get download failed (see $W/debs.log): xfs tests will fail in the VM"
      return 0
    fi
  fi
  DEBS_DIR=$cache
}

# csi-sanity for ZFS_CSI_VM_SANITY (access types, one run each): the binary
# tests/conformance/csi_sanity.sh built on the host (the VM has no Go nor network to build it).
check_sanity_settings() {
  local t
  for t in ${ZFS_CSI_VM_SANITY:-}; do
    case "$t" in
      mount | block) ;;
      *) die "ZFS_CSI_VM_SANITY: '$t' is not mount or block" ;;
    esac
  done
  if [ -n "${ZFS_CSI_VM_SANITY:-}" ]; then
    local v
    v="$(sed -n 's/^CSI_SANITY_VERSION=//p' "$1/tests/conformance/csi_sanity.sh")"
    SANITY_BIN="${ZFS_CSI_CACHE:-/var/cache/zfs-csi}/csi-sanity-$v/csi-sanity"
    [ -x "$SANITY_BIN" ] || die "ZFS_CSI_VM_SANITY: no $SANITY_BIN; run tests/conformance/csi_sanity.sh on the host once to build it"
    say "csi-sanity in the VM: ${ZFS_CSI_VM_SANITY}"
  fi
}

# Puts the project, Deno, its module cache, Go, the boot script and the unit into the image.
fill_image() { # project dir
  local src=$1 m="$W/mnt" rev dirty line
  mount_image rw
  line="$(image_line "$m")"
  if [ "$line" != "$OPENZFS" ]; then
    umount_image
    die "the image in $W has OpenZFS $line, not $OPENZFS: set ZFS_CSI_VM_OPENZFS=$line, or another ZFS_CSI_VM_DIR"
  fi
  install_vm_files "$m"
  write_test_settings "$src" "$m$VM_HOME"
  rm -rf "$m$VM_HOME/project" "$m$VM_HOME/results" "$m$VM_HOME/go" "$m/root/.cache/deno"
  mkdir -p "$m$VM_HOME/project/.cache" "$m/root/.cache"
  project_files "$src" | tar -C "$src" --null -T - -cf - | tar -C "$m$VM_HOME/project" -xf -
  cp -a "$DENO_PREFIX" "$m$VM_HOME/project/.cache/"
  if [ -d "$DENO_CACHE" ]; then cp -a "$DENO_CACHE" "$m/root/.cache/deno"; fi
  if [ -n "$GOROOT_HOST" ]; then
    # The toolchain is large: copy it only when the image holds another version.
    if ! cmp -s "$GOROOT_HOST/VERSION" "$m/usr/local/go/VERSION"; then
      rm -rf "$m/usr/local/go"
      cp -a "$GOROOT_HOST" "$m/usr/local/go"
    fi
    mkdir -p "$m$VM_HOME/go"
    cp -a "$W/go/mod" "$W/go/build" "$m$VM_HOME/go/"
  else
    # Without its modules the churn test would try the network; without go it is skipped.
    rm -rf "$m/usr/local/go"
  fi
  # The S3 tests' server (versitygw), built on the host from the Go module proxy: the VM has no
  # network to build it. Without it those tests fail in the VM, saying Go is needed.
  rm -rf "$m/var/cache/zfs-csi"
  local vgw
  for vgw in "${ZFS_CSI_CACHE:-/var/cache/zfs-csi}"/versitygw-*/versitygw; do
    [ -x "$vgw" ] || continue
    mkdir -p "$m/var/cache/zfs-csi/$(basename "$(dirname "$vgw")")"
    cp -a "$vgw" "$m/var/cache/zfs-csi/$(basename "$(dirname "$vgw")")/"
  done
  rm -rf "$m$VM_HOME/debs"
  if [ -n "$DEBS_DIR" ]; then
    # Only the packages this run wants: the cache may hold docker's for another run.
    local p
    mkdir -p "$m$VM_HOME/debs"
    for p in $DEBS_WANTED; do cp -a "$DEBS_DIR/${p}"_*.deb "$m$VM_HOME/debs/"; done
  fi
  if [ -n "$SANITY_BIN" ]; then
    # Where csi_sanity.sh looks for it (CSI_SANITY_CACHE's default).
    mkdir -p "$m/var/cache/zfs-csi/$(basename "$(dirname "$SANITY_BIN")")"
    cp -a "$SANITY_BIN" "$m/var/cache/zfs-csi/$(basename "$(dirname "$SANITY_BIN")")/"
  fi
  rm -f "$m/usr/local/bin/nomad"
  if [ "${ZFS_CSI_VM_NOMAD:-}" = 1 ]; then
    local nomad_bin
    nomad_bin="$(ls -d "${ZFS_CSI_CACHE:-/var/cache/zfs-csi}"/nomad-*/nomad 2>/dev/null | sort -V | tail -n 1)"
    [ -x "$nomad_bin" ] || die "ZFS_CSI_VM_NOMAD=1: no Nomad in ${ZFS_CSI_CACHE:-/var/cache/zfs-csi}/nomad-*/ (tests/e2e/nomad_install.sh builds it)"
    install -m 0755 "$nomad_bin" "$m/usr/local/bin/nomad"
    say "Nomad in the VM: $nomad_bin"
  fi
  rev="$(git -C "$src" rev-parse --short HEAD 2>/dev/null || echo "not a git checkout")"
  dirty="$(git -C "$src" status --porcelain 2>/dev/null | wc -l)"
  echo "project: $src at $rev ($dirty uncommitted paths), copied $(date -u)" >"$m$VM_HOME/source.txt"
  sed 's/^/openzfs-vm: /' "$m$VM_HOME/source.txt"
  umount_image
}

# Boots the VM. test: console to console.log, in the background under a timeout (so Ctrl-C and
# the EXIT trap can stop it). shell: on this terminal, no timeout.
boot() { # test | shell
  local accel want="${ZFS_CSI_VM_ACCEL:-auto}"
  # KVM needs read-write access to /dev/kvm; otherwise software emulation on every host core.
  # KVM by PVM (kvm_pvm, nested without hardware support) runs only kernels built as PVM guests:
  # Debian's kernel stops after the BIOS there, and `-cpu host` makes QEMU abort at once.
  if [ "$want" = auto ]; then
    want=tcg
    if [ -c /dev/kvm ] && (exec 3<>/dev/kvm) 2>/dev/null; then
      if [ -d /sys/module/kvm_pvm ]; then
        say "/dev/kvm is KVM by PVM (kvm_pvm), which cannot run Debian's kernel: using TCG"
      else
        want=kvm
      fi
    fi
  fi
  case "$want" in
    kvm) accel=(-accel kvm -cpu host) ;;
    tcg) accel=(-accel "tcg,thread=multi,tb-size=512" -cpu max) ;;
    *) die "ZFS_CSI_VM_ACCEL must be auto, kvm or tcg, not '$want'" ;;
  esac
  local cmd=(qemu-system-x86_64 "${accel[@]}" -m "$MEM" -smp "$CPUS" -nographic -no-reboot
    -kernel "$W/vmlinuz" -initrd "$W/initrd.img"
    # The image is scratch: cache=unsafe skips host flushes (QEMU still writes all out on exit).
    -drive "file=$W/disk.img,format=raw,if=virtio,cache=unsafe" -nic none)
  local append="root=/dev/vda rw console=ttyS0 panic=10"
  say "booting ($MEM, $CPUS CPUs, ${accel[1]%%,*})"
  if [ "$1" = shell ]; then
    say "root console; 'poweroff' to leave, or Ctrl-a x to quit QEMU"
    "${cmd[@]}" -append "$append zfs_csi_vm=shell"
    return 0
  fi
  say "console: $W/console.log; timeout ${TIMEOUT}s"
  timeout --kill-after=30 "$TIMEOUT" "${cmd[@]}" -append "$append" </dev/null >"$W/console.log" 2>&1 &
  qemu_pid=$!
  local rc=0
  wait "$qemu_pid" || rc=$?
  qemu_pid=""
  if [ "$rc" = 124 ] || [ "$rc" = 137 ]; then
    say "the VM did not power off within ${TIMEOUT}s: stopped"
  elif [ "$rc" != 0 ]; then
    say "qemu exited with $rc"
  fi
}

# Copies the VM's results out (disk mounted read-only), leaves them read-only, prints the summary.
collect() {
  local m="$W/mnt"
  rm -rf "$W/results"
  mount_image ro
  if [ -d "$m$VM_HOME/results" ]; then cp -a "$m$VM_HOME/results" "$W/results"; fi
  umount_image
  if [ ! -f "$W/results/test.rc" ]; then
    tail -n 30 "$W/console.log" >&2 || true
    die "the VM did not finish the tests; see $W/console.log"
  fi
  chmod -R a-w "$W/results"
  sed 's/^/  /' "$W/results/versions.txt"
  grep -E '^(ok|FAILED) \| ' "$W/results/test.log" 2>/dev/null || true
  if [ -f "$W/results/test.log" ]; then
    grep -E '^tests: ' "$W/results/test.log" || say "no summary line in results/test.log"
  fi
  local t type
  if [ -f "$W/results/script.log" ]; then
    tail -n 3 "$W/results/script.log" | sed 's/^/  script: /'
  fi
  for t in "$W"/results/sanity-*.log; do
    [ -f "$t" ] || continue
    type=${t##*/sanity-}
    grep -E '^csi-sanity: [0-9]' "$t" | tail -n 1 | sed "s/^/access type ${type%.log}: /" |
      grep . || say "no csi-sanity summary in $t"
  done
  say "results: $W/results/ (test.log, run.log, versions.txt, fixtures-openzfs/); console: $W/console.log"
  return "$(cat "$W/results/test.rc")"
}

cmd_test() { # [project dir]
  local src="${1:-$here/../..}" start=$SECONDS rc=0
  src="$(cd "$src" && pwd)" || die "no such directory: ${1:-}"
  [ -x "$src/tools/deno" ] || die "$src is not a zfs-csi checkout (no tools/deno)"
  say "OpenZFS $OPENZFS, in $W"
  if ! have_image; then
    say "no image in $W yet: building it first"
    cmd_build
  fi
  need_commands qemu-system-x86_64 qemu-system-x86
  check_sanity_settings "$src"
  warm_deno "$src"
  stage_go "$src"
  stage_debs
  fill_image "$src"
  boot test
  collect || rc=$?
  say "OpenZFS $OPENZFS: took $(((SECONDS - start) / 60)) min $(((SECONDS - start) % 60)) s; exit code $rc"
  return "$rc"
}

cmd_shell() {
  have_image || cmd_build
  need_commands qemu-system-x86_64 qemu-system-x86
  # The current unit knows zfs_csi_vm=shell; an older image's might not.
  mount_image rw
  install_vm_files "$W/mnt"
  umount_image
  boot shell
}

main() {
  [ "$#" -ge 1 ] || usage
  local sub=$1
  shift
  case "$sub" in
    build | shell) [ "$#" -eq 0 ] || usage ;;
    test) [ "$#" -le 1 ] || usage ;;
    *) usage ;;
  esac
  [ "$(id -u)" = 0 ] || die "needs root (debootstrap, chroot, loop mounts)"
  mkdir -p "$W"
  # One run at a time per work dir: they share the disk image.
  exec 9>"$W/.lock"
  flock -n 9 || die "another openzfs-vm.sh run is using $W"
  trap cleanup EXIT
  trap 'exit 130' INT
  trap 'exit 143' TERM
  case "$sub" in
    build) cmd_build ;;
    test) cmd_test "$@" ;;
    shell) cmd_shell ;;
  esac
}

main "$@"
