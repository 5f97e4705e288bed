#!/usr/bin/env bash
# Makes sure this machine can run ZFS commands, for the dev task and the integration tests.
# - If zfs already works (OpenZFS kernel module, or a running zfs-fuse), nothing is changed.
# - Otherwise Debian's zfs-fuse is installed (apt-get, needs root) and its daemon started.
# - recover: ends a deadlocked or dead zfs-fuse daemon (tools/fuse_watchdog.ts calls it): aborts
#   its FUSE connections, so every process waiting on them gets an error instead of sleeping for
#   ever, kills it, drops its mounts, starts it again (it imports its pools itself) and mounts
#   their datasets.
# Usage: tools/zfs-env.sh ensure|recover
set -euo pipefail

zfs_works() {
  command -v zfs >/dev/null 2>&1 && command -v zpool >/dev/null 2>&1 && zpool list -H >/dev/null 2>&1
}

ensure() {
  if [ "$(id -u)" != "0" ]; then
    echo "zfs-env: ZFS tests and the dev pool need root (mount, zpool create)" >&2
    exit 1
  fi
  if zfs_works; then return 0; fi
  if ! command -v zfs-fuse >/dev/null 2>&1; then
    if [ -e /sys/module/zfs ]; then
      echo "zfs-env: the zfs kernel module is loaded but zfs does not answer; install zfsutils-linux" >&2
      exit 1
    fi
    echo "zfs-env: installing zfs-fuse (Debian package) ..." >&2
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq >&2
    apt-get install -y -qq --no-install-recommends zfs-fuse >&2
  fi
  if [ ! -e /dev/fuse ]; then
    echo "zfs-env: /dev/fuse is missing; zfs-fuse cannot run here" >&2
    exit 1
  fi
  # Start the daemon if none runs; a daemon that is still shutting down is waited for first.
  for _ in $(seq 1 150); do
    if zfs_works; then return 0; fi
    if ! pgrep -x zfs-fuse >/dev/null 2>&1; then
      echo "zfs-env: starting the zfs-fuse daemon" >&2
      mkdir -p /run /var/lock/zfs
      rm -f /run/zfs-fuse.pid
      zfs-fuse --pidfile /run/zfs-fuse.pid
    fi
    sleep 0.2
  done
  echo "zfs-env: zfs-fuse started but zpool does not answer" >&2
  exit 1
}

# zfs-fuse's mounts: its datasets ("fuse.zfs") and its kstat filesystem (plain "fuse", source
# "kstat"); prints "device mountpoint" lines, deepest first.
zfs_fuse_mounts() {
  awk '{
    for (i = 7; i <= NF; i++) if ($i == "-") {
      if ($(i + 1) == "fuse.zfs" || ($(i + 1) == "fuse" && $(i + 2) == "kstat")) print $3, $5
      break
    }
  }' /proc/self/mountinfo | sort -k2 -r
}

recover() {
  mountpoint -q /sys/fs/fuse/connections || mount -t fusectl none /sys/fs/fuse/connections
  local dev mnt
  while read -r dev mnt; do
    # The connection's number is the minor device number of its mounts.
    echo 1 >"/sys/fs/fuse/connections/${dev#*:}/abort" 2>/dev/null || true
  done < <(zfs_fuse_mounts)
  pkill -9 -x zfs-fuse || true
  for _ in $(seq 1 50); do pgrep -x zfs-fuse >/dev/null || break; sleep 0.1; done
  while read -r dev mnt; do
    umount -l "$(printf '%b' "$mnt")" 2>/dev/null || true # mountinfo escapes spaces as \040
  done < <(zfs_fuse_mounts)
  rm -f /run/zfs-fuse.pid
  echo "zfs-env: restarting zfs-fuse after its deadlock or death" >&2
  ensure
  # It imports its pools again but mounts nothing its dead self had mounted.
  zfs mount -a || true
}

case "${1:-}" in
  ensure) ensure ;;
  recover) recover ;;
  *) echo "usage: $0 ensure|recover" >&2; exit 2 ;;
esac
